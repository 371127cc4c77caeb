"""The docs' figures, generated from results/ (`reprostack docs`, `nox -s docs`): the blocks of README.md and
every docs/*.md between

    <!-- generated: NAME [ARG...] (reprostack docs; from results/, never typed) -->
    ...
    <!-- end generated: NAME -->

(`from upstreams.lock` instead of `from results/` for a block the lock gives: `mirrors`). A block may sit in any of
those files: moving one to another page needs no change here.

are written by the generator NAME from the committed results, with the marker's arguments (e.g. the report folders
a table compares). `--check` writes nothing and names each block that differs from what results/ gives (a CI test
runs it): a figure in the docs is the results' figure, or the check fails.

Generators:
- `results`: one row per committed gate report (evidence.rederive.reports_under): gate, profile, stack, verdict and
  its headline figures (the checks judged on an interval: mean [95% CI] n; else the checks against a nonzero bar),
  a deliberate variation named as one;
- `bench`: every committed bench run (each gate_micro-*.json under results/bench once, duplicates by content
  dropped), its cold and warm seconds, verdicts and machine identity as recorded, then per code version (the
  project commit the bench recorded, else its one invocation) and over every run the median with min/max and n
  (evidence.bars.benchstats): never the fastest run alone;
- `history-bench`: every committed history benchmark (results/bench/history-*.json): the commit it ran, the
  reports, ingest and page seconds as median [min, max] n;
- `history` (added by the command, from the layer above: reprostack.cmd.docs): `reprostack history`'s summary of
  results/ (a fresh database in a temporary folder), in a code block;
- `images`: the image chain's record (results/images/chain.json, scripts/image_chain.py): per step its seconds, image
  id, size and build context, the total and the downloads; each `results/images/*-twice.json` in one line;
- `gates` (added by the command, from the layer above: reprostack.cmd.docs; its marker says `from the gate
  registry`): one row per gate of gates.registry, docs/architecture.md;
- `mirrors`: every git pin of upstreams.lock (and its submodules) with its URL, and a REPROSTACK_MIRRORS line naming
  a local mirror for each (the README's offline path: a list that cannot miss a pin);
- `compare ARG...`: the micro reports of the folders named, side by side: D+C, dispatch, combine, dense, the ratio
  (mean [95% CI] n), the NCCL each mapped, the verdict against its bar, the run's seconds.

Invariants: reports are untrusted input (evidence.rederive.load; a report that cannot be read is a row saying so,
never a crash); a file without its markers, or a marker naming no generator, is one line (DocsError); the output is
a pure function of the bytes under results/ (sorted paths, no clock), so `--check` is stable; writes are atomic.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..errors import ReprostackError
from ..evidence.bars.benchstats import bench_runs, spread
from ..evidence.rederive import RederiveError, load, reports_under

DOCS = ("README.md", "docs/*.md")  # README.md, then every page of docs/ (sorted)
_SOURCE = r"\(reprostack docs; from (?:results/|upstreams\.lock|the gate registry), never typed\) -->"
_BLOCK = re.compile(
    r"(?P<open><!-- generated: (?P<name>[a-z-]+)(?P<args>(?: [^ ()]+)*) " + _SOURCE + r"\n)(?P<body>.*?)"
    r"(?P<close><!-- end generated: (?P=name) -->)",
    re.S,
)
_OPEN = re.compile(r"<!-- generated: [a-z-]+(?: [^ ()]+)* " + _SOURCE)
# an absolute path of the machine a report was made on, up to the project's own folders (or the reprostack cache)
_ABS_PROJECT = re.compile(r"(?<![\w.])/(?:[^\s/:'\"]+/)+?(?=(?:gates|results|claims|containers|kernels|patches|src)/)")
_ABS_CACHE = re.compile(r"(?<![\w.])/(?:[^\s/:'\"]+/)*?(?:reprostack-cache|\.cache/reprostack)/")


def doc_files(root: Path) -> list[str]:
    """The files whose blocks are generated, relative to root: README.md, then docs/*.md, sorted."""
    out = []
    for pattern in DOCS:
        out += sorted(p.relative_to(root).as_posix() for p in Path(root).glob(pattern) if p.is_file())
    return out


def scrub(text: str) -> str:
    """A recorded text as a doc shows it: an absolute path of the machine it was recorded on is shown from the
    project's folder (`gates/x.yaml`) or the cache (`<cache>/builds/...`), never as a developer's path."""
    return _ABS_CACHE.sub("<cache>/", _ABS_PROJECT.sub("", text))


class DocsError(ReprostackError):
    """A doc's generated block cannot be made (one line naming the file and the block)."""


@dataclass(frozen=True)
class Drift:
    path: str
    block: str

    def line(self) -> str:
        return f"{self.path}: block `{self.block}` differs from what results/ gives (run `nox -s docs`)"


def _num(v) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _stat(s: dict) -> str:
    ci = s.get("ci95") or []
    rng = f" [{_num(ci[0])}, {_num(ci[1])}]" if len(ci) == 2 else ""
    return f"{_num(s.get('mean'))}{rng} n={s.get('n')}"


def headline(doc: dict) -> str:
    """A report's headline figures: its checks judged on an interval (mean [CI] n, the bar), else those against a
    nonzero numeric bar (value, the bar), at most two; the reason when there is none."""
    data = doc.get("data") if isinstance(doc.get("data"), dict) else {}
    st = data.get("statistics") if isinstance(data.get("statistics"), dict) else {}
    checks = [c for c in doc.get("checks") or [] if isinstance(c, dict)]
    out = [
        f"{c['metric']} {_stat(st[c['metric']])} {c.get('unit') or ''} ({c.get('op')} {_num(c.get('threshold'))})"
        + _other_value(c, st[c["metric"]])
        for c in checks
        if c.get("metric") in st and isinstance(st[c["metric"]], dict)
    ]
    if not out:
        out = [
            f"{c.get('metric')} {_num(c.get('value'))} ({c.get('op')} {_num(c.get('threshold'))})"
            for c in checks
            if c.get("op") in ("<=", "<", ">=", ">")
            and isinstance(c.get("threshold"), (int, float))
            and not isinstance(c.get("threshold"), bool)
            and c.get("threshold") != 0
        ]
    text = "; ".join(" ".join(x.split()) for x in out[:2]) or scrub(" ".join(str(doc.get("reason", "")).split()))[:120]
    delib = data.get("deliberate")
    if isinstance(delib, dict):
        text = f"deliberate variation ({delib.get('why', '?')}): " + text
    return text.replace("|", "\\|")


def _other_value(check: dict, stat: dict) -> str:
    """The check's own value when it is not its statistic's mean (to 1e-4): a headline made from the statistics must
    not hide a check value that says otherwise (docs --check then sees it change)."""
    v, m = check.get("value"), stat.get("mean")
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not isinstance(m, (int, float)):
        return f" [check value {v!r}]" if v is not None and not isinstance(m, (int, float)) else ""
    return "" if abs(v - m) <= 1e-4 * max(1.0, abs(m)) else f" [check value {_num(v)}, not the mean]"


def gen_results(root: Path, args: list[str]) -> str:
    rows = ["| report | gate [profile] | stack | result | headline |", "|---|---|---|---|---|"]
    for p in reports_under([root / "results"]):
        rel = p.relative_to(root).as_posix()
        try:
            doc = load(p)
        except RederiveError as e:
            rows.append(f"| `{rel}` | ? | ? | unreadable | {str(e)[:100]} |")
            continue
        stack = (doc.get("provenance") or {}).get("stack") or "campaign"
        rows.append(
            f"| `{rel}` | {doc.get('gate')} [{doc.get('profile')}] | {stack} | {str(doc.get('result')).upper()} | "
            f"{headline(doc)} |"
        )
    return "\n".join(rows) + "\n"


def _twice_scratch(t: dict, chain: dict) -> str:
    """ " from scratch" only where a record measured it: the twice record's own `second_from_scratch`, else the
    chain record of the same project commit whose `from_scratch` was measured (no build step from the layer cache);
    otherwise nothing is claimed."""
    if t.get("second_from_scratch") is True:
        return " from scratch"
    if t.get("project_commit") and t.get("project_commit") == chain.get("project_commit") and chain.get("from_scratch"):
        return " from scratch (chain.json of that commit: no step from the layer cache)"
    return ""


# a gate run's stages (its report's data.timings_s), in the order the bench tables show them
STAGES = ("sources_s", "nccl_build_s", "deepep_build_s", "jit_prewarm_s", "test_s", "total_s")


def gen_bench(root: Path, args: list[str]) -> str:
    runs = bench_runs(root / "results" / "bench")
    rows = [
        "| bench run | date | cold s | warm s | cold from nothing s | verdict cold / warm | wheels pre-seeded | "
        "machine (recorded) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        rows.append(
            f"| `{r.path}` | {r.date} | {_num(r.cold_s)} | {_num(r.warm_s)} | "
            f"{'not measured' if r.from_nothing_s is None else _num(r.from_nothing_s)} | {r.verdict} | "
            f"{'not recorded' if r.seeded is None else r.seeded} | {r.machine} |"
        )
    rows += [
        "",
        "| runs of one code | cold s: median [min, max] n | warm s: median [min, max] n | cold from nothing s |",
        "|---|---|---|---|",
    ]
    groups: dict[str, list] = {}
    for r in runs:
        groups.setdefault(r.group, []).append(r)
    for g, rs in groups.items():
        rows.append(
            f"| `{g}` | {spread([r.cold_s for r in rs])} | {spread([r.warm_s for r in rs])} | "
            f"{spread([r.from_nothing_s for r in rs])} |"
        )
    rows.append(
        f"| every committed run (code versions mixed) | {spread([r.cold_s for r in runs])} | "
        f"{spread([r.warm_s for r in runs])} | {spread([r.from_nothing_s for r in runs])} |"
    )
    rows += [
        "",
        "| where each run's seconds went (the gate report's data.timings_s) | run | "
        + " | ".join(n.removesuffix("_s") for n in STAGES)
        + " |",
        "|---|---|" + "---|" * len(STAGES),
    ]
    for r in runs:
        for kind, st in r.stages:
            rows.append(
                f"| `{r.path}` | {kind} | " + " | ".join(_num(st[n]) if n in st else "—" for n in STAGES) + " |"
            )
    return "\n".join(rows) + "\n"


def _med(s) -> str:
    if not isinstance(s, dict) or not isinstance(s.get("median"), (int, float)):
        return "—"
    return f"{_num(s['median'])} [{_num(s.get('min'))}, {_num(s.get('max'))}] n={s.get('n')}"


def gen_history_bench(root: Path, args: list[str]) -> str:
    """Every committed `reprostack history` benchmark (results/bench/history-*.json, scripts/bench_history.py): the
    code it ran (commit), the reports, ingest and page seconds as median [min, max] n."""
    rows = [
        "| history bench | code (commit) | reports | ingest s: median [min, max] n | page s: median [min, max] n |",
        "|---|---|---|---|---|",
    ]
    for p in sorted((root / "results" / "bench").glob("history-*.json")):
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise DocsError(f"block `history-bench`: {p.relative_to(root)}: not JSON ({e})") from None
        if not isinstance(doc, dict) or doc.get("bench") != "history":
            continue
        commit = str(doc.get("commit") or "?")[:8] + (" (dirty)" if doc.get("dirty") else "")
        rows.append(
            f"| `{p.relative_to(root).as_posix()}` | {commit} | {doc.get('reports')} | {_med(doc.get('ingest_s'))} | "
            f"{_med(doc.get('page_s'))} |"
        )
    return "\n".join(rows) + "\n"


KCACHE_KINDS = ("cold_miss", "warm", "cold_hit", "from_nothing_hit")


def _kcache_gpu(p: Path, doc: dict) -> str:
    """The GPU a kernel-cache bench file recorded: its host_inventory, else the `gpu.txt` lines the device script
    wrote beside its run folders (`<file stem>/gpu.txt`, `<file stem>/*/gpu.txt`) when they agree, else `?`."""
    gpus = (doc.get("host_inventory") or {}).get("gpus") or []
    if gpus and isinstance(gpus[0], dict):
        return f"{gpus[0].get('name', '?')}, driver {gpus[0].get('driver_version', '?')}"
    seen = set()
    for t in [p.with_suffix("") / "gpu.txt", *sorted(p.with_suffix("").glob("*/gpu.txt"))]:
        try:
            seen.add(t.read_text(errors="replace").strip().splitlines()[0])
        except (OSError, IndexError):
            continue
    if len(seen) != 1:
        return "?, driver ?"
    name, _, rest = seen.pop().partition(", ")
    return f"{name}, driver {rest.split(', ')[0] or '?'} (gpu.txt)"


def gen_kcache(root: Path, args: list[str]) -> str:
    """Every committed kernel-cache bench (results/bench/kcache-*.json, `reprostack bench gate_micro --runs`): per
    file and kind every run's seconds, their median, the goal it names and whether the median meets it, and where a
    run's seconds went (its first run's stages); the GPU and the commit each file recorded."""
    rows = [
        "| kernel-cache bench | GPU (recorded) | code (commit) | run | every run s | median s | goal s | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    stages = []
    for p in sorted((root / "results" / "bench").glob("kcache-*.json")):
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise DocsError(f"block `kcache`: {p.relative_to(root)}: not JSON ({e})") from None
        if not isinstance(doc, dict) or doc.get("bench") != "kcache_gate_micro":
            continue
        gpu = _kcache_gpu(p, doc)
        proj = doc.get("project") or {}
        commit = str(proj.get("commit") or "?")[:8] + (" (dirty)" if proj.get("dirty") else "")
        rel = p.relative_to(root).as_posix()
        for kind in KCACHE_KINDS:
            runs = doc.get(kind)
            if not isinstance(runs, list) or not runs:
                continue
            med = statistics.median(runs)
            goal = (doc.get("targets_s") or {}).get(kind)
            met = "—" if goal is None else ("yes" if med <= goal else "no")
            rows.append(
                f"| `{rel}` | {gpu} | {commit} | {kind} | {', '.join(_num(x) for x in runs)} | {_num(med)} | "
                f"{'—' if goal is None else _num(goal)} | {met} |"
            )
            first = ((doc.get("runs") or {}).get(kind) or [{}])[0].get("stages_s") or {}
            stages.append(
                f"| `{rel}` | {kind} | " + " | ".join(_num(first.get(n)) if n in first else "—" for n in STAGES) + " |"
            )
    rows += [
        "",
        "| where a first run's seconds went | run | sources | nccl_build | deepep_build (pull on a hit) | "
        "jit_prewarm | test | total |",
        "|---|---|---|---|---|---|---|---|",
        *stages,
    ]
    return "\n".join(rows) + "\n"


def gen_suite(root: Path, args: list[str]) -> str:
    """Every committed timing of the test suite (results/bench/suite-*.json, scripts/bench_suite.py): what was timed
    (`.ci/run` whole, `nox -s tests`, pytest alone), the code (commit), workers, every run's wall seconds with its load
    average before, tests and failures, and the median of the runs."""
    rows = [
        "| suite timing | what | code (commit) | cpus | workers | every run: wall s (load before) | every run: tests (failed) | "
        "median wall |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in sorted((root / "results" / "bench").glob("suite-*.json")):
        try:
            doc = json.loads(p.read_text())
            runs = doc["runs"]
            every = ", ".join(f"{_num(r['wall_s'])} ({_num(r['loadavg_before'][0])})" for r in runs)
            tests = ", ".join(f"{r['tests']} ({r['failed'] + r['errors']})" for r in runs)
            proj = doc.get("project") or {}
            med = doc["headline"]["median_wall_s"]
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
            raise DocsError(f"block `suite`: {p.relative_to(root)}: not a suite record ({type(e).__name__})") from None
        commit = str(proj.get("commit") or "?")[:8] + (" (dirty)" if proj.get("dirty") else "")
        rows.append(
            f"| `{p.relative_to(root).as_posix()}` | {doc.get('what', 'nox -s tests')} | {commit} | {doc.get('cpus')} "
            f"| {doc.get('test_workers') or 1} | {every} | {tests} | {_num(med)} s ({_num(med / 60)} min) |"
        )
    return "\n".join(rows) + "\n"


_COMPARE = (
    ("D+C p50 (us)", "dc_p50_us"),
    ("dispatch p50 (us)", "dispatch_p50_us"),
    ("combine p50 (us)", "combine_p50_us"),
    ("dense D+C p50 (us)", "dense_dc_p50_us"),
    ("DeepEP over dense", "deepep_over_dense_dc"),
)


def gen_compare(root: Path, args: list[str]) -> str:
    if not args:
        raise DocsError("block `compare` names no report folder")
    docs = []
    for a in args:
        p = root / a
        found = sorted(p.glob("*.json")) if p.is_dir() else []
        rep = next((q for q in found if q.name in ("micro.json",)), None)
        if rep is None:
            raise DocsError(f"block `compare`: {a}: no micro.json")
        try:
            docs.append(load(rep))
        except RederiveError as e:
            raise DocsError(f"block `compare`: {e}") from None
    stack = [(d.get("provenance") or {}).get("stack") or "campaign" for d in docs]
    rows = ["| | " + " | ".join(stack) + " |", "|---|" + "---|" * len(docs)]
    rows.append("| report | " + " | ".join(f"`{a}`" for a in args) + " |")
    for label, m in _COMPARE:
        cells = []
        for d in docs:
            s = ((d.get("data") or {}).get("statistics") or {}).get(m)
            cells.append(_stat(s) if isinstance(s, dict) else "—")
        rows.append(f"| {label}, mean [95% CI] n | " + " | ".join(cells) + " |")
    nccl = [
        next((_num(c.get("value")) for c in d.get("checks") or [] if c.get("metric") == "nccl_runtime"), "—")
        for d in docs
    ]
    rows.append("| NCCL mapped (runtime) | " + " | ".join(nccl) + " |")
    verdicts = []
    for d in docs:
        bar = next((c for c in d.get("checks") or [] if c.get("metric") == "dc_p50_us"), {})
        verdicts.append(f"{str(d.get('result')).upper()} (bar {bar.get('op', '?')} {_num(bar.get('threshold'))} us)")
    rows.append("| verdict | " + " | ".join(verdicts) + " |")
    rows.append("| gate run (s) | " + " | ".join(_num(d.get("duration_s")) for d in docs) + " |")
    return "\n".join(rows) + "\n"


def _mb(v) -> str:
    return f"{v / 1e6:,.0f} MB" if isinstance(v, (int, float)) and not isinstance(v, bool) else "?"


def gen_images(root: Path, args: list[str]) -> str:
    """results/images/chain.json (scripts/image_chain.py): per step its seconds, image size and build context, the
    total, what the chain downloads; then each committed `<image>-twice.json`: layers and files identical or not."""
    d = root / "results" / "images"
    try:
        chain = json.loads((d / "chain.json").read_text())
        steps = chain["steps"]
        total = chain["seconds_total"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        why = e.strerror if isinstance(e, OSError) else f"{type(e).__name__} {e}"
        return f"(no image chain record: results/images/chain.json: {why})\n"
    scratch = "from scratch" if chain.get("from_scratch") is True else "as recorded (layer cache as it was)"
    host = chain.get("host") if isinstance(chain.get("host"), dict) else {}
    on = f", on a {host['cpus']}-CPU machine" if isinstance(host.get("cpus"), int) else " (its machine not recorded)"
    rows = [
        f"The chain at project commit {str(chain.get('project_commit'))[:12]}, {scratch}{on}: {_num(total)} s in "
        "all (results/images/chain.json).",
        "",
        "| step | seconds | image | image size | build context |",
        "|---|---|---|---|---|",
    ]
    stopped = []
    for s in steps if isinstance(steps, list) else []:
        if not isinstance(s, dict):
            continue
        img = str(s.get("image_id") or "")[7:19]
        size = _mb(s.get("size_bytes")) if "size_bytes" in s else ""
        ctx = _mb(s.get("context_bytes")) if "context_bytes" in s else ""
        status = s.get("status")
        label = f"{s.get('step')} ({status})" if status in ("reused", "failed", "skipped") else s.get("step")
        if s.get("cached_steps"):  # a build whose steps came from the layer cache: its seconds are no build time
            label += f" ({s['cached_steps']} steps from the layer cache)"
        rows.append(f"| {label} | {_num(s.get('seconds'))} | {img} | {size} | {ctx} |")
        if status == "failed":
            stopped.append(f"- {s.get('step')}: stopped by `{str(s.get('error') or '?').replace('`', chr(39))}`")
        elif status == "skipped":
            stopped.append(f"- {s.get('step')}: not built here: {s.get('reason')}")
    if stopped:
        rows += ["", "What stops an image (the build's own error line) or kept it from being built here:", *stopped]
    dl = chain.get("downloads") or {}
    parts = []
    debs = dl.get("debs") or {}
    if debs:
        parts.append(f"{debs.get('files')} .debs of pin {debs.get('pin')} ({_mb(debs.get('bytes'))})")
    for w in dl.get("wheels") or []:
        if isinstance(w, dict):
            n = w.get("files")
            parts.append(f"{n} wheel{'' if n == 1 else 's'} of pin {w.get('pin')} ({_mb(w.get('bytes'))})")
    if parts:
        rows += ["", "Downloaded once, each file checked by sha256 against the lock: " + "; ".join(parts) + "."]
    twice = []
    for p in sorted(d.glob("*-twice.json")):
        try:
            t = json.loads(p.read_text())
            n_l = t.get("layers_identical")
            if not isinstance(n_l, str):
                same = sum(1 for x in t.get("layers", []) if isinstance(x, dict) and x.get("identical"))
                n_l = f"{same} of {len(t.get('layers', []))}"
            at = f" at project commit {str(t['project_commit'])[:12]}" if t.get("project_commit") else ""
            differ = ""
            if t.get("files_identical") is False:  # name what differs, and where in an ELF file
                secs = {k.get("path"): k.get("sections_differ") for k in t.get("key_files", []) if isinstance(k, dict)}
                differ = "; differ: " + ", ".join(
                    f"`{f}`" + (f" (sections {', '.join(secs[f])})" if secs.get(f) else "")
                    for f in list(t.get("files_differ") or [])[:5]
                )
            twice.append(
                f"- {t.get('image')}: built twice{_twice_scratch(t, chain)}{at}, layers identical {n_l}, files identical "
                f"{t.get('files_identical')} ({t.get('files')} files{differ}) ({p.relative_to(root)})"
            )
        except (OSError, ValueError, AttributeError, TypeError) as e:
            twice.append(f"- {p.relative_to(root)}: cannot be read ({type(e).__name__})")
    if twice:
        rows += [""] + twice
    return "\n".join(rows) + "\n"


def gen_mirrors(root: Path, args: list[str]) -> str:
    """Every git pin of the lock and its submodules, with its URL; then one REPROSTACK_MIRRORS line for them all."""
    from ..errors import ReprostackError as _E
    from ..lock import load as load_lock

    try:
        lock = load_lock(Path(root) / "upstreams.lock")
    except _E as e:
        raise DocsError(f"block `mirrors`: {e}") from None
    rows = ["| pin | git URL (mirror it; keep the refs that reach the pinned commit) |", "|---|---|"]
    urls = []
    for name, pin in lock.upstreams.items():
        if getattr(pin, "kind", "") != "git":
            continue
        rows.append(f"| {name} | {pin.url} |")
        urls.append(pin.url)
        for sub in getattr(pin, "submodules", ()) or ():
            rows.append(f"| {name} submodule {sub.path} | {sub.url} |")
            urls.append(sub.url)
    mirrors = ",".join(f"{u}=/srv/mirrors/{u.rstrip('/').rsplit('/', 1)[-1]}" for u in dict.fromkeys(urls))
    return "\n".join(rows) + f'\n\n```bash\nexport REPROSTACK_MIRRORS="{mirrors}"\n```\n'


GENERATORS = {
    "results": gen_results,
    "bench": gen_bench,
    "history-bench": gen_history_bench,
    "compare": gen_compare,
    "images": gen_images,
    "mirrors": gen_mirrors,
    "suite": gen_suite,
    "kcache": gen_kcache,
}


def render(root: Path, rel: str, extra: dict | None = None) -> tuple[str, str, list[str]]:
    """(the file's text, the text with every block generated, the names of the blocks that differ); `extra`: more
    generators, from the layers above (the command adds `history`)."""
    gens = {**GENERATORS, **(extra or {})}
    path = Path(root) / rel
    try:
        text = path.read_text()
    except OSError as e:
        raise DocsError(f"{rel}: {e.strerror or e}") from None
    changed = []

    def fill(m: re.Match) -> str:
        name, args = m.group("name"), m.group("args").split()
        gen = gens.get(name)
        if gen is None:
            raise DocsError(f"{rel}: block `{name}`: no such generator ({', '.join(gens)})")
        body = gen(Path(root), args)
        if body != m.group("body"):
            changed.append(" ".join([name, *args]))
        return m.group("open") + body + m.group("close")

    new = _BLOCK.sub(fill, text)
    if len(_OPEN.findall(text)) != len(_BLOCK.findall(text)):
        raise DocsError(f"{rel}: a `<!-- generated:` marker without its end marker")
    return text, new, changed


def generate(root: Path, *, check: bool, extra: dict | None = None) -> list[Drift]:
    """Every doc's blocks; written unless `check`. Returns the blocks that differed."""
    from ..atomicfile import write_text_atomic

    drift = []
    for rel in doc_files(Path(root)):
        old, new, changed = render(root, rel, extra)
        drift += [Drift(rel, b) for b in changed]
        if changed and not check:
            write_text_atomic(Path(root) / rel, new)
    return drift


def to_json(drift: list[Drift]) -> str:
    return json.dumps([d.__dict__ for d in drift])
