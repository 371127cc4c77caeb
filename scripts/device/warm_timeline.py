"""Where does the warm gate_micro time go?  (issue 17 item 1: "find what the 50 s of the warm test is")

Run after a gate_micro run into --out OUT (warm: kernels built, JIT cache filled). Reads OUT/micro.json and re-runs
the exact test command the gate ran (data.command, data.env, plus the environment the gate adds: PYTHONDONTWRITEBYTECODE
and EP_JIT_CACHE_DIR next to the DeepEP build) with the timeline probe (scripts/device/timeline/sitecustomize.py) first
on PYTHONPATH, twice:
  jit-warm  EP_JIT_CACHE_DIR as the gate sets it (the warm case)
  jit-cold  EP_JIT_CACHE_DIR an empty folder (every JIT kernel compiled: the cost the JIT cache saves)
and prints, per run: wall, per-process events (interpreter up, imports, init_dist, ElasticBuffer, each bench_kineto,
exit) with seconds since launch, the JIT cache's kernel count before/after, and the test's D+C line; also the gate
report's own stage seconds (data.timings_s). Writes OUT/timeline.json. Measures only: the command, its arguments and
the test's sizes are the gate's.

    python3 scripts/device/warm_timeline.py OUT [--warm-only]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def jit_kernels(d: Path) -> int:
    return len(list((d / "cache").glob("kernel.*"))) if (d / "cache").is_dir() else 0


def run_once(cmd: list[str], env: dict, cwd: str, jit_dir: Path, label: str, out: Path) -> dict:
    log = out / f"timeline-{label}.jsonl"
    log.unlink(missing_ok=True)
    e = dict(env)
    e["PYTHONPATH"] = os.pathsep.join([str(HERE / "timeline"), e.get("PYTHONPATH", "")])
    e.update({"TL_LOG": str(log), "EP_JIT_CACHE_DIR": str(jit_dir)})
    before = jit_kernels(jit_dir)
    e["TL_T0"] = repr(time.time())
    t = time.monotonic()
    p = subprocess.run(cmd, env=e, cwd=cwd, capture_output=True, text=True, timeout=900)
    wall = round(time.monotonic() - t, 2)
    (out / f"timeline-{label}.log").write_text(p.stdout + p.stderr)
    events = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    dc = [ln.strip() for ln in (p.stdout + p.stderr).splitlines() if "| dispatch:" in ln or "| combine:" in ln]
    return {
        "label": label,
        "wall_s": wall,
        "rc": p.returncode,
        "jit_kernels_before": before,
        "jit_kernels_after": jit_kernels(jit_dir),
        "events": events,
        "phase_lines": dc,
    }


def show(r: dict) -> None:
    print(
        f"== {r['label']}: wall {r['wall_s']} s, rc {r['rc']}, JIT kernels {r['jit_kernels_before']} -> "
        f"{r['jit_kernels_after']} ({'compiled ' + str(r['jit_kernels_after'] - r['jit_kernels_before']) if r['jit_kernels_after'] > r['jit_kernels_before'] else 'none compiled'})"
    )
    for e in r["events"]:
        extra = f"  ({e['s']} s)" if "s" in e else ""
        print(f"  t={e['t']:8.3f}  pid {e['pid']:>7}  {e['ev']}{extra}")
    for ln in r["phase_lines"]:
        print("  " + ln)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", help="the --out folder of a finished gate micro run")
    ap.add_argument("--warm-only", action="store_true", help="only the jit-warm run (no jit-cold comparison)")
    args = ap.parse_args()
    out = Path(args.out).resolve()  # the probe writes $TL_LOG from the test's cwd (the deepep tree): absolute
    rep = json.loads((out / "micro.json").read_text())
    data = rep["data"]
    if "command" not in data or "PYTHONPATH" not in data.get("env", {}):
        print(f"the gate did not run test_ep ({rep['result']}: {rep['reason']}); no timeline")
        return 0
    cmd, genv = data["command"], data["env"]
    site = genv["PYTHONPATH"].split(os.pathsep)[-1]  # <deepep build>/site (kernels.runtime.runtime_env)
    # the folder the gate gave DeepEP (its report's env); else the build's jit/ beside site/ (older reports)
    jit = Path(genv["EP_JIT_CACHE_DIR"]) if genv.get("EP_JIT_CACHE_DIR") else Path(site).parent / "jit"
    env = dict(os.environ)
    env.update(genv)
    if "PYTHONPYCACHEPREFIX" not in genv:  # a report from before the bytecode cache: as that gate ran it
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    script = next(a for a in cmd if a.endswith("test_ep.py"))
    cwd = str(Path(script).parents[2])  # the patched deepep tree (the gate's cwd)
    print(f"gate report: {rep['result']} ({rep['reason']}); stages {data.get('timings_s')}")
    print(f"command: {' '.join(cmd)}\nJIT cache: {jit} ({jit_kernels(jit)} kernels); ninja: {shutil.which('ninja')}")
    runs = [run_once(cmd, env, cwd, jit, "jit-warm", out)]
    show(runs[0])
    if not args.warm_only:
        with tempfile.TemporaryDirectory(prefix="jit-cold-") as empty:
            runs.append(run_once(cmd, env, cwd, Path(empty), "jit-cold", out))
        show(runs[1])
    (out / "timeline.json").write_text(json.dumps({"gate_stages_s": data.get("timings_s"), "runs": runs}, indent=1))
    print(f"wrote {out / 'timeline.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
