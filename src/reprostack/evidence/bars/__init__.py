"""Bars and the statistics a value is judged on against them.

- stats: `summarize(samples)` -> Summary (mean, median, stdev, the 95% t interval), `interval_verdict(summary, op,
  threshold)` (a bar judged on the interval: pass, fail or inconclusive; report.evaluate_interval's rule), `t975`,
  `ratios`, `statistics_block`: the statistics every report records;
- baseline: baseline bars (accepted earlier runs x a tolerance): the runs a spec names, each held to its recorded
  bytes and its attestation, and the threshold made from their means (BaselineError names a run that cannot be used);
- ratio: the DeepEP/alternative ratio of two arms' samples and its interval (the serving gates);
- benchstats: the statistics of `reprostack bench` runs (cold/warm seconds, their spread).

Invariants: pure functions of their inputs except baseline, which reads the runs it names (untrusted input);
nothing here writes.
"""
