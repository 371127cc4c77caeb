#!/usr/bin/env python3
"""How long `reprostack history` takes on a large history: ingest and page timed apart (issue 27 item 5).

Makes REPORTS synthetic gate reports from one real committed report (default: the K=5 micro run,
results/gate_micro/2026-12-02-h200-ep1-k5/micro.json): each a copy whose trial samples are drawn around the real
ones (a slow drift plus noise of the real stdev; every `data.statistics` entry recomputed from its new samples by
reprostack.evidence.bars.stats.summarize, so it is consistent), whose n=1 figures move by up to 1%, whose date steps one
hour per report and whose lock changes every REPORTS/20 reports. Every report is validated against
report.schema.json before anything is timed. Then RUNS times, each on a fresh database and a fresh output folder:
- ingest: scan the folder and ingest every report (history.command.scan + ingest into Store.open, as
  `reprostack history` does);
- page: compare the series and write the PNGs and index.html (history.compare.analyse + render.write, matplotlib).

Writes results/bench/history-<host>.json (or --out): every run, and per phase the median (the headline) with
n, min and max. A figure for the record, never asserted in a test. The generator is seeded: the same REPORTS
and --seed give the same reports.

Usage: .venv/bin/python scripts/bench_history.py [--reports 10000] [--runs 3] [--host H] [--out FILE]
       [--base REPORT] [--work DIR] [--seed S]
(a --work folder keeps its reports for the next run with the same --reports, --seed and --base)
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "results" / "gate_micro" / "2026-12-02-h200-ep1-k5" / "micro.json"
TARGETS = {"ingest_s": 30.0, "page_s": 60.0}  # issue 27 item 5


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def make_reports(base: dict, n: int, folder: Path, seed: int) -> list[Path]:
    """Write `n` reports derived from `base` under `folder` (see the module doc); returns their paths."""
    import jsonschema

    from reprostack import schemas
    from reprostack.evidence.bars.stats import summarize

    validator = jsonschema.Draft202012Validator(schemas.load("report"))
    rng = random.Random(seed)
    start = datetime.strptime(base["started"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    took = datetime.strptime(base["ended"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc) - start
    stats0 = base["data"].get("statistics", {})
    per_lock = max(1, n // 20)
    drift = 1.0
    out = []
    for i in range(n):
        d = copy.deepcopy(base)
        drift = min(1.1, max(0.9, drift * (1 + rng.gauss(0, 0.002))))
        t = start + timedelta(hours=i)
        d["started"], d["ended"] = _iso(t), _iso(t + took)
        d["provenance"]["lock_sha256"] = hashlib.sha256(f"bench-lock-{i // per_lock}".encode()).hexdigest()
        means = {}
        for metric, s in stats0.items():
            sd = s["stdev"] or abs(s["mean"]) * 0.001
            samples = [x * drift + rng.gauss(0, sd) for x in s["samples"]]
            new = summarize(samples, s.get("unit", "")).to_dict()
            new["method"] = s.get("method", "t")
            d["data"]["statistics"][metric] = new
            means[metric] = new["mean"]
        for item in list(d["checks"]) + list(d["data"].get("metrics") or []):
            v = item.get("value")
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            item["value"] = means.get(item["metric"], v * (1 + rng.uniform(-0.01, 0.01)))
        validator.validate(d)
        p = folder / f"{i // 1000:02d}" / f"run-{i:05d}" / f"{d['gate']}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(d, indent=1))
        out.append(p)
    return out


def one_run(reports: Path, work: Path, page: bool = True) -> dict:
    """Ingest then page (unless not `page`), each timed, on a fresh database and output folder."""
    from reprostack.history import compare, render
    from reprostack.history.command import ingest, scan
    from reprostack.history.store import Store

    db, out = work / "history.sqlite3", work / "page"
    db.unlink(missing_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    with Store.open(db) as store:
        files = scan([reports])
        new, known, other, skipped = ingest(store, files)[:4]
    t1 = time.perf_counter()
    if skipped or new != len(files):
        raise SystemExit(f"bench history: {len(skipped)} skipped, {new} new of {len(files)}: {skipped[:3]}")
    res = {"ingest_s": round(t1 - t0, 2), "reports": new, "db_bytes": db.stat().st_size}
    if page:
        with Store.open(db) as store:
            series = compare.analyse(store)
            written = render.write(series, out)
        t2 = time.perf_counter()
        res.update(
            page_s=round(t2 - t1, 2),
            series=len(series),
            pngs=sum(1 for p in written if p.suffix == ".png"),
            page_bytes=(out / "index.html").stat().st_size,
        )
    return res


def summary(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 2), "n": len(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--reports", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--base", type=Path, default=BASE, help="the committed report the synthetic ones derive from")
    ap.add_argument("--host", default=None, help="host label of the output file (default: the short host name)")
    ap.add_argument("--out", type=Path, default=None, help="default: results/bench/history-<host>.json")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one, removed)")
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument(
        "--source-commit", default=None, help="the commit of the measured source when it is no git checkout"
    )
    ap.add_argument("--no-page", action="store_true", help="time the ingest only (an old version's page takes hours)")
    a = ap.parse_args(argv)
    from reprostack.bench import host_label

    host = host_label(a.host)
    out = a.out or ROOT / "results" / "bench" / f"history-{host}.json"
    base = json.loads(a.base.read_text())
    work = a.work or Path(tempfile.mkdtemp(prefix="bench-history-"))
    work.mkdir(parents=True, exist_ok=True)
    reports = work / "reports"
    stamp = work / "reports.json"  # what reports/ holds: a --work folder is reused when it is the same set
    made = {"reports": a.reports, "seed": a.seed, "base_sha256": hashlib.sha256(a.base.read_bytes()).hexdigest()}
    if not (stamp.is_file() and json.loads(stamp.read_text()) == made):
        shutil.rmtree(reports, ignore_errors=True)
        stamp.unlink(missing_ok=True)
        t = time.perf_counter()
        make_reports(base, a.reports, reports, a.seed)
        stamp.write_text(json.dumps(made))
        print(f"bench history: {a.reports} reports from {a.base} in {time.perf_counter() - t:.1f} s ({reports})")
    else:
        print(f"bench history: reusing the {a.reports} reports of {reports}")
    load = list(os.getloadavg())
    runs = []
    for k in range(a.runs):
        r = one_run(reports, work, page=not a.no_page)
        runs.append(r)
        page = f", page {r['page_s']} s ({r['series']} series, {r['pngs']} PNGs)" if "page_s" in r else ""
        print(f"bench history: run {k + 1}/{a.runs}: ingest {r['ingest_s']} s{page}", flush=True)
    import reprostack

    src = Path(reprostack.__file__).resolve().parent  # the code measured (PYTHONPATH may name another checkout)
    git = ["git", "-C", str(src)]
    commit = a.source_commit or subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    dirty = None
    if not a.source_commit:
        st = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no", "--", "."], capture_output=True, text=True
        )
        dirty = st.returncode == 0 and st.stdout.strip() != ""
    try:
        from importlib.metadata import version

        mpl = version("matplotlib")
    except Exception:  # noqa: BLE001 - the figure is recorded either way
        mpl = None
    res = {
        "bench": "history",
        "host": host,
        "date": _iso(datetime.now(timezone.utc)),
        "cpus": os.cpu_count(),
        "load_avg_before": [round(x, 2) for x in load],
        "python": platform.python_version(),
        "matplotlib": mpl,
        "reprostack_src": str(src),
        "commit": commit.strip() or None,  # of the reprostack source measured
        "dirty": dirty,  # uncommitted changes in that source (None: --source-commit given)
        "base_report": str(a.base.resolve().relative_to(ROOT))
        if a.base.resolve().is_relative_to(ROOT)
        else str(a.base),
        "reports": a.reports,
        "seed": a.seed,
        "headline": "median of n runs (min, max); each run: a fresh database and output folder",
        "ingest_s": summary([r["ingest_s"] for r in runs]),
        "page_s": None if a.no_page else summary([r["page_s"] for r in runs]),
        "targets": TARGETS,
        "runs": runs,
    }
    res["targets_met"] = {k: res[k]["median"] <= v for k, v in TARGETS.items() if res[k] is not None}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    tmp.replace(out)
    page = "" if a.no_page else f", page median {res['page_s']['median']} s"
    print(f"bench history: ingest median {res['ingest_s']['median']} s{page} (n={a.runs}); {out}")
    if a.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
