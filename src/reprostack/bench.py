"""`reprostack bench`: how long the main job takes, cold and warm, written as a committed figure (never a timed test).

`bench gate_micro [-- GATE ARGS]`: runs `reprostack gate micro` twice as a user would (a new process each time):
cold, with a fresh, empty cache dir ($REPROSTACK_CACHE; the wheelhouse, $REPROSTACK_WHEELHOUSE, stays as given: it is
pre-seeded and the output says so), then warm, on the cache the cold run filled. Writes
`<out>/gate_micro-<host>.json`: cold_s / warm_s (wall seconds of each process), the per-stage seconds of each run (the
gate report's data.timings_s), each run's verdict (result + reason), whether they are the same, the host label and
inventory, the lock sha256, and the targets of issue 17 (cold <= 120 s, warm <= 30 s) with whether each was met.
Exit 0 when both runs gave the same verdict, 1 when not, 2 when a run wrote no report.

`bench cpu`: the CPU side, so the cost of growth is visible: fetch every git pin that has a local mirror
($REPROSTACK_MIRRORS / --mirror) into a fresh cache (cold) and again (warm), `lock check`, and CLI start
(`reprostack --help`), each a new process; best of 3 for the short ones. Writes `<out>/cpu-<host>.json`.

Invariants: the benched commands are the user's commands (`python -m reprostack ...`), nothing is skipped or faked;
a run's own report is the source of its stage times and verdict; results are written atomically.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from . import lock as lockmod
from . import paths
from .atomicfile import write_text_atomic as write_text
from .errors import ReprostackError

TARGETS = {"cold_s": 120.0, "warm_s": 30.0}  # issue 17


def host_label(given: str | None) -> str:
    """--host, else the short host name (file-name safe)."""
    name = given or socket.gethostname().split(".")[0] or "host"
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)


def _timed(argv: list[str], env: dict, log: Path | None = None, timeout: float = 3600) -> tuple[float, int]:
    t = time.monotonic()
    if log:
        with open(log, "w") as f:
            p = subprocess.run(
                argv, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=timeout
            )
    else:
        p = subprocess.run(
            argv,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
        )
    return round(time.monotonic() - t, 2), p.returncode


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "reprostack", *args]


def _report(out: Path, gate: str) -> dict:
    f = out / f"{gate}.json"
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError) as e:
        try:
            last = (out / "cli.log").read_text(errors="replace").strip().splitlines()[-1][:300]
        except (OSError, IndexError):
            last = "(no output)"
        raise ReprostackError(
            f"{f}: the benched run wrote no readable report ({type(e).__name__}); its last line: "
            f"{last} (log: {out}/cli.log)"
        ) from None


def bench_gate(
    gate: str, gate_args: list[str], *, lock: lockmod.Lock, out_dir: Path, work: Path, host: str | None = None
) -> tuple[dict, int]:
    """Run `gate` cold then warm (see the module doc); returns (result dict, exit code) and writes the JSON."""
    work = Path(work).resolve()
    if work.exists():
        shutil.rmtree(work)
    cache = work / "cache"
    cache.mkdir(parents=True)
    env = dict(os.environ)
    env[paths.CACHE_ENV] = str(cache)
    house = env.get("REPROSTACK_WHEELHOUSE", "")
    seeded = sorted(p.name for h in house.split(os.pathsep) if h and Path(h).is_dir() for p in Path(h).glob("*.whl"))
    print(
        f"bench gate_{gate}: cold = fresh cache dir {cache}; wheelhouse pre-seeded (not part of the cold figure): "
        f"{house or '(none)'} ({len(seeded)} wheel(s))",
        flush=True,
    )
    runs = {}
    for kind in ("cold", "warm"):
        out = work / kind
        out.mkdir()
        wall, rc = _timed(_cli("gate", gate, "--out", str(out), *gate_args), env, out / "cli.log")
        rep = _report(out, gate)
        runs[kind] = {
            "wall_s": wall,
            "exit_code": rc,
            "result": rep.get("result"),
            "reason": rep.get("reason"),
            "stages_s": rep.get("data", {}).get("timings_s", {}),
            "kernels": rep.get("provenance", {}).get("kernels"),
            "nccl_from": rep.get("provenance", {}).get("nccl_from"),
            "report": str(out / f"{gate}.json"),
        }
        print(
            f"bench gate_{gate}: {kind} {wall:.1f} s, {rep.get('result')} ({rep.get('reason')}); stages "
            + ", ".join(f"{k} {v}" for k, v in runs[kind]["stages_s"].items()),
            flush=True,
        )
        host_info = rep.get("provenance", {}).get("host")
    same = (runs["cold"]["result"], runs["cold"]["exit_code"]) == (runs["warm"]["result"], runs["warm"]["exit_code"])
    label = host_label(host)
    res = {
        "bench": f"gate_{gate}",
        "host": label,
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "host_inventory": host_info,
        "lock_sha256": lock.sha256,
        "gate_args": gate_args,
        "wheelhouse_preseeded": seeded,
        "cold_s": runs["cold"]["wall_s"],
        "warm_s": runs["warm"]["wall_s"],
        "verdict": {"cold": runs["cold"]["result"], "warm": runs["warm"]["result"], "same": same},
        "targets_s": TARGETS,
        "targets_met": {k: runs[k[:4]]["wall_s"] <= v for k, v in TARGETS.items()},
        "runs": runs,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = Path(out_dir) / f"gate_{gate}-{label}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(res, indent=1, sort_keys=True) + "\n")
    print(
        f"bench gate_{gate}: cold {res['cold_s']} s, warm {res['warm_s']} s, verdict {runs['cold']['result']} / "
        f"{runs['warm']['result']} ({'same' if same else 'DIFFERENT'}); wrote {path}"
    )
    return res, 0 if same else 1


def bench_cpu(*, lock: lockmod.Lock, mirrors: dict, out_dir: Path, work: Path, host: str | None = None) -> dict:
    """CPU-side figures (see the module doc); returns the result dict and writes `cpu-<host>.json`."""
    work = Path(work).resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    env = dict(os.environ)
    env[paths.CACHE_ENV] = str(work / "cache")
    if mirrors:
        env["REPROSTACK_MIRRORS"] = ",".join(f"{k}={v}" for k, v in mirrors.items())
    git = {n: p for n, p in lock.upstreams.items() if isinstance(p, lockmod.GitPin)}

    def mirrored(pin) -> bool:
        urls = [pin.url, *(s.url for s in pin.submodules)]
        return all(any(u.startswith(m) for m in mirrors) for u in urls)

    names = [n for n, p in git.items() if mirrored(p)]
    res = {
        "bench": "cpu",
        "host": host_label(host),
        "lock_sha256": lock.sha256,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_avg_before": [round(x, 2) for x in os.getloadavg()],
        "pins_fetched": names,
        "pins_without_mirror": [n for n in git if n not in names],
    }
    if names:
        for kind in ("cold", "warm"):
            wall, rc = _timed(_cli("fetch", *names), env, work / f"fetch-{kind}.log")
            if rc != 0:
                raise ReprostackError(f"bench cpu: `reprostack fetch` ({kind}) exit {rc}; log {work}/fetch-{kind}.log")
            res[f"fetch_{kind}_s"] = wall
    res["lock_check_s"] = min(_timed(_cli("lock", "check", "--lock", str(lock.path)), env)[0] for _ in range(3))
    res["cli_start_s"] = min(_timed(_cli("--help"), env)[0] for _ in range(3))
    res["lock_pins"] = len(lock.upstreams)
    path = Path(out_dir) / f"cpu-{res['host']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(res, indent=1, sort_keys=True) + "\n")
    print(
        "bench cpu: "
        + ", ".join(
            f"{k} {res[k]}" for k in ("fetch_cold_s", "fetch_warm_s", "lock_check_s", "cli_start_s") if k in res
        )
        + f"; wrote {path}"
    )
    return res
