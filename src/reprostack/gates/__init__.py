"""Gates: run a benchmark or workload under a watchdog, parse its output, check it, report it."""
