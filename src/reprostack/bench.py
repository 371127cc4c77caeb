"""`reprostack bench`: how long the main job takes, cold and warm, written as a committed figure (never a timed test).

`bench gate_micro [--repeat N] [-- GATE ARGS]`: runs `reprostack gate micro` twice as a user would (a new process each
time): cold, with a fresh, empty cache dir ($REPROSTACK_CACHE; the wheelhouse, $REPROSTACK_WHEELHOUSE, stays as
given: it is pre-seeded and the output says so), then warm, on the cache the cold run filled; N times, each cold on
its own fresh cache. Writes `<out>/gate_micro-<host>.json`: every run (`repeats`: its cold and warm wall seconds, the
per-stage seconds of each (the gate report's data.timings_s), each verdict, the machine identity the report
recorded), the headline cold_s / warm_s = the median of the runs with `cold` / `warm` = {median, min, max, n,
samples} (never the fastest run alone), the project commit and whether its tree was dirty (the code benched), the
host label and inventory, the lock sha256, and the targets of issue 17 (cold <= 120 s, warm <= 30 s) judged on the
medians. Exit 0 when every run gave the same verdict, 1 when not, 2 when a run wrote no report.

`bench cpu`: the CPU side, so the cost of growth is visible: fetch every git pin that has a local mirror
($REPROSTACK_MIRRORS / --mirror) into a fresh cache (cold) and again (warm), `lock check`, and CLI start
(`reprostack --help`), each a new process; the short ones CPU_REPEAT times, every run recorded and the median the
headline (`lock_check_s`, with `lock_check` = {median, min, max, n, samples}). Writes `<out>/cpu-<host>.json`.

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
CPU_REPEAT = 5  # bench cpu: runs of each short command (every one recorded, the median the headline)


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


def bind_transcript(out: Path, env: dict) -> str | None:
    """The benched gate signed its folder (a key configured) but not its transcript `cli.log`, still being written
    then: sign it now (reprostack.evidence.attest.runs.add_after, every other subject checked first). None when the run is
    unsigned (no key, no attestation); else the line saying so."""
    from . import evidence
    from .evidence.attest.keys import Holder
    from .evidence.attest.runs import add_after

    signer, _ = evidence.configured_signer(env)
    if signer is None or not (out / evidence.NAME).is_file():
        return None
    ring = evidence.Keyring({signer.public_key.keyid: Holder(signer.public_key, "this operator", "(the key)")})
    if not evidence.check_folder(out, ring).uncovered:
        return None
    path, added = add_after(out, signer, ring)
    return f"attested: {path}, added {', '.join(added)}"


def _one(
    gate: str, gate_args: list[str], kind: str, out: Path, env: dict, python: str | None = None
) -> tuple[dict, dict]:
    """One benched process (`reprostack gate GATE` into `out`, by `python`: default this one): its record and its
    report."""
    out.mkdir(parents=True)
    argv = _cli("gate", gate, "--out", str(out), *gate_args)
    if python:
        argv[0] = python
    wall, rc = _timed(argv, env, out / "cli.log")
    bound = bind_transcript(out, env)
    if bound:
        print(f"bench gate_{gate}: {kind} {bound}")
    rep = _report(out, gate)
    run = {
        "wall_s": wall,
        "exit_code": rc,
        "result": rep.get("result"),
        "reason": rep.get("reason"),
        "stages_s": rep.get("data", {}).get("timings_s", {}),
        "kernels": rep.get("provenance", {}).get("kernels"),
        "kernels_from": rep.get("provenance", {}).get("kernels_from"),
        "nccl_from": rep.get("provenance", {}).get("nccl_from"),
        "report": str(out / f"{gate}.json"),
    }
    print(
        f"bench gate_{gate}: {kind} {wall:.1f} s, {rep.get('result')} ({rep.get('reason')}); stages "
        + ", ".join(f"{k} {v}" for k, v in run["stages_s"].items()),
        flush=True,
    )
    return run, rep


def install_source() -> Path:
    """What a from-nothing run installs: the project checkout if it holds pyproject.toml, else the source checkout
    this reprostack runs from. Raises ReprostackError when neither is one (an installed wheel has no source)."""
    for p in (paths.project_root(), Path(__file__).resolve().parents[2]):
        if (p / "pyproject.toml").is_file() and (p / "src" / "reprostack").is_dir():
            return p
    raise ReprostackError("--from-nothing: no source checkout of reprostack to install (no pyproject.toml)")


def _from_nothing(gate: str, gate_args: list[str], base: Path, env: dict) -> tuple[dict, dict | None]:
    """A cold run from nothing: a fresh venv, the project installed into it (`pip install` of the source checkout;
    its wheels from the wheelhouse when one is given, `--no-index`, else from pip's configured index), then the gate
    by that venv's Python on its own fresh cache dir (sources from the mirrors or the bundle the gate options
    name). Each step timed; `total_s` is what a user with nothing but the checkout and the sources waits. Returns
    (the record, the gate run's host facts)."""
    venv = base / "nothing-venv"
    cache = base / "nothing-cache"
    cache.mkdir(parents=True)
    e = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "PYTHONHOME")}  # nothing but the venv's own
    e[paths.CACHE_ENV] = str(cache)
    houses = [h for h in env.get("REPROSTACK_WHEELHOUSE", "").split(os.pathsep) if h]
    out = base / "nothing"
    out.mkdir(parents=True)
    venv_s, rc = _timed([sys.executable, "-m", "venv", str(venv)], e, out / "venv.log")
    if rc != 0:
        raise ReprostackError(f"--from-nothing: python -m venv exit {rc}; log {out}/venv.log")
    py = str(venv / "bin" / "python")
    where = [a for h in houses for a in ("--find-links", h)]
    pip = [py, "-m", "pip", "install", "--quiet", *(["--no-index", *where] if houses else []), str(install_source())]
    install_s, rc = _timed(pip, e, out / "install.log")
    if rc != 0:
        raise ReprostackError(f"--from-nothing: pip install exit {rc}; log {out}/install.log")
    run, rep = _one(gate, gate_args, "from nothing", out / "run", e, python=py)
    total = round(venv_s + install_s + run["wall_s"], 2)
    print(
        f"bench gate_{gate}: from nothing {total} s (venv {venv_s} s, install {install_s} s, gate {run['wall_s']} s)",
        flush=True,
    )
    return {
        "venv_s": venv_s,
        "install_s": install_s,
        "gate_s": run["wall_s"],
        "total_s": total,
        "wheels_from": "wheelhouse " + os.pathsep.join(houses) if houses else "pip's configured index",
        "run": run,
    }, (rep.get("provenance") or {}).get("host")


def bench_gate(
    gate: str,
    gate_args: list[str],
    *,
    lock: lockmod.Lock,
    out_dir: Path,
    work: Path,
    host: str | None = None,
    repeat: int = 1,
    from_nothing: bool = False,
) -> tuple[dict, int]:
    """Run `gate` cold then warm, `repeat` times, each cold on a fresh cache dir (see the module doc); returns
    (result dict, exit code) and writes the JSON: every run in `repeats`, the headline `cold_s` / `warm_s` the
    median, `cold` / `warm` the median, min, max and n."""
    from .project import state as project_state

    if repeat < 1:
        raise ReprostackError(f"--repeat {repeat}: at least 1")
    work = Path(work).resolve()
    if work.exists():
        shutil.rmtree(work)
    env = dict(os.environ)
    from .fetch.wheels import wheelhouses_from_env

    house = env.get("REPROSTACK_WHEELHOUSE", "")
    seeded = sorted(p.name for h in wheelhouses_from_env(env) if h.is_dir() for p in h.glob("*.whl"))
    project = project_state(paths.project_root())  # before any run writes: the code that is benched
    repeats, host_info = [], None
    for i in range(repeat):
        base = work if repeat == 1 else work / f"r{i + 1}"
        cache = base / "cache"
        cache.mkdir(parents=True)
        env[paths.CACHE_ENV] = str(cache)
        print(
            f"bench gate_{gate}: run {i + 1} of {repeat}: cold = fresh cache dir {cache}; wheelhouse pre-seeded (not "
            f"part of the cold figure): {house or '(none)'} ({len(seeded)} wheel(s))",
            flush=True,
        )
        entry, host_info = _cold_and_warm(gate, gate_args, base, env, from_nothing)
        repeats.append(entry)
    label = host_label(host)
    res = _gate_result(
        gate,
        gate_args,
        repeats,
        lock=lock,
        label=label,
        host_info=host_info,
        project=project,
        seeded=seeded,
        from_nothing=from_nothing,
    )
    cold, warm, same = res["cold"], res["warm"], res["verdict"]["same"]
    path = Path(out_dir) / f"gate_{gate}-{label}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(res, indent=1, sort_keys=True) + "\n")
    print(
        f"bench gate_{gate}: n={repeat}: cold median {cold['median']} s [min {cold['min']}, max {cold['max']}], warm "
        f"median {warm['median']} s [min {warm['min']}, max {warm['max']}], verdicts "
        + ", ".join(f"{r['verdict']['cold']}/{r['verdict']['warm']}" for r in repeats)
        + f" ({'same' if same else 'DIFFERENT'}); wrote {path}"
    )
    return res, 0 if same else 1


def _cold_and_warm(gate: str, gate_args: list[str], base: Path, env: dict, from_nothing: bool) -> tuple[dict, dict]:
    """One repeat of bench_gate in `base` (its cache already fresh in `env`): the from-nothing run when asked, then
    the cold and the warm run. (its `repeats` entry, the warm run's host inventory)."""
    runs, host_info = {}, None
    nothing = (
        _from_nothing(gate, gate_args, base, env)[0] if from_nothing else None
    )  # the warm run's host is the record's
    for kind in ("cold", "warm"):
        runs[kind], rep = _one(gate, gate_args, kind, base / kind, env)
        host_info = rep.get("provenance", {}).get("host")
    same = (runs["cold"]["result"], runs["cold"]["exit_code"]) == (
        runs["warm"]["result"],
        runs["warm"]["exit_code"],
    )
    entry = {
        "cold_s": runs["cold"]["wall_s"],
        "warm_s": runs["warm"]["wall_s"],
        "verdict": {"cold": runs["cold"]["result"], "warm": runs["warm"]["result"], "same": same},
        "host_identity": (host_info or {}).get("identity"),
        "runs": runs,
        **({"from_nothing": nothing} if nothing else {}),
    }
    return entry, host_info


def _gate_result(
    gate: str, gate_args: list[str], repeats: list[dict], *, lock, label, host_info, project, seeded, from_nothing
) -> dict:
    """bench_gate's result from its repeats: the medians (the headline), min, max and n, the samples, the targets,
    the verdicts (the same in every run, cold and warm) and where it ran."""
    from .evidence.bars.benchstats import summary

    cold, warm = summary([r["cold_s"] for r in repeats]), summary([r["warm_s"] for r in repeats])
    same = all(r["verdict"]["same"] for r in repeats) and len({r["verdict"]["cold"] for r in repeats}) == 1
    nothing_fields = {}
    if from_nothing:  # beside the seeded cold run, never instead of it
        t = [r["from_nothing"]["total_s"] for r in repeats]
        nothing_fields = {
            "cold_from_nothing_s": summary(t)["median"],
            "cold_from_nothing": {**summary(t), "samples": t},
        }
    return {
        "bench": f"gate_{gate}",
        "host": label,
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "host_inventory": host_info,
        "project": project,
        "lock_sha256": lock.sha256,
        "gate_args": gate_args,
        "wheelhouse_preseeded": seeded,
        "n": len(repeats),
        "cold_s": cold["median"],
        "warm_s": warm["median"],
        "cold": {**cold, "samples": [r["cold_s"] for r in repeats]},
        "warm": {**warm, "samples": [r["warm_s"] for r in repeats]},
        **nothing_fields,
        "headline": "the median of every run (cold_s, warm_s); min, max and n beside it",
        "verdict": {"cold": repeats[0]["verdict"]["cold"], "warm": repeats[0]["verdict"]["warm"], "same": same},
        "targets_s": TARGETS,
        "targets_met": {"cold_s": cold["median"] <= TARGETS["cold_s"], "warm_s": warm["median"] <= TARGETS["warm_s"]},
        "repeats": repeats,
        "runs": repeats[-1]["runs"],
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


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
    from .evidence.bars.benchstats import summary

    for key, argv in (("lock_check", _cli("lock", "check", "--lock", str(lock.path))), ("cli_start", _cli("--help"))):
        samples = [_timed(argv, env)[0] for _ in range(CPU_REPEAT)]
        res[key] = {**summary(samples), "samples": samples}
        res[f"{key}_s"] = res[key]["median"]  # the headline: the median of every run, never the best
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


# issue 41: the kernel cache's figures (median of 3, every run listed), judged on the medians
KCACHE_KINDS = ("cold_miss", "warm", "cold_hit", "from_nothing_hit")
KCACHE_TARGETS = {"cold_hit": 45.0, "from_nothing_hit": 75.0, "cold_miss": 120.0, "warm": 25.0}
KCACHE_EXPECT = {"cold_miss": ("build", "miss"), "cold_hit": ("cache", "hit"), "from_nothing_hit": ("cache", "hit")}


def _bench_key(store: Path) -> tuple[Path, Path, dict]:
    """The key the bench signs its entries with and its keyring: the operator's when one is configured
    ($REPROSTACK_SIGNING_KEY, keyring keys/), else a key made for this bench beside the store (said in the JSON)."""
    from . import evidence
    from .evidence.attest import keys as keysmod

    signer, _ = evidence.configured_signer()
    if signer is not None:
        return evidence.key_path(), paths.project_root() / evidence.KEYRING_DIR, {"key": "the operator's"}
    key, ring = store.parent / f"{store.name}-key.pem", store.parent / f"{store.name}-keys"
    if not key.exists():
        signer = evidence.new_key(key)
        entry = evidence.public_entry(signer, "bench key made on this machine")
        ring.mkdir(parents=True, exist_ok=True)
        write_text(ring / keysmod.entry_name(entry), json.dumps(entry, indent=1) + "\n")
    return key, ring, {"key": f"made for this bench ({key}); its keyring {ring}"}


def _kcache_check(kind: str, run: dict) -> str | None:
    """Why run `run` of `kind` is not what its kind says (its kernels from the cache on a hit, built on a miss)."""
    want = KCACHE_EXPECT.get(kind)
    kf = run.get("kernels_from") or {}
    got = (kf.get("mode"), ((kf.get("cache") or {}).get("deepep") or {}).get("result"))
    if want and got != want:
        return f"{kind}: kernels_from {got[0]}, cache {got[1]}, not {want[0]}/{want[1]}"
    return None


def _kcache_timeline(run: dict) -> dict:
    """Where a cold-hit run's seconds went: the report's stages in order, the pull inside the DeepEP stage, and
    the process's own start and end (wall minus the stages)."""
    st = dict(run.get("stages_s") or {})
    total = st.pop("total_s", None)
    pull = (((run.get("kernels_from") or {}).get("cache") or {}).get("deepep") or {}).get("seconds")
    return {
        "wall_s": run["wall_s"],
        "stages_s": st,
        "deepep_pull_and_verify_s": pull,
        "process_start_and_report_s": round(run["wall_s"] - total, 2) if isinstance(total, (int, float)) else None,
    }


def _kcache_runs(kinds, gate, gate_args, *, base: Path, env: dict, store: Path, ring: Path, key: Path) -> dict:
    """One round: each kind once, each on its own fresh cache (warm on its round's cold cache); the first cold miss
    pushes its build into `store`. Returns {kind: run record}; a step that could not run (no report, a venv or
    install that failed, a push that failed) ends the round with `error` beside the runs already done."""
    out: dict = {}
    try:
        _kcache_round(out, kinds, gate, gate_args, base=base, env=env, store=store, ring=ring, key=key)
    except ReprostackError as e:
        out["error"] = str(e)
    return out


def _kcache_round(out: dict, kinds, gate, gate_args, *, base: Path, env: dict, store: Path, ring: Path, key: Path):
    empty = base / "empty-kcache"
    empty.mkdir(parents=True)
    warm_cache = None
    for kind in ("cold_miss", "cold_hit", "warm", "from_nothing_hit"):  # warm: on this round's first cold cache
        if kind not in kinds:
            continue
        src = store if kind.endswith("_hit") else empty
        args = [*gate_args, "--kernel-cache", str(src), "--kernel-keyring", str(ring)]
        if kind == "from_nothing_hit":
            nothing, host = _from_nothing(gate, args, base / kind, env)
            out[kind] = {**nothing["run"], "wall_s": nothing["total_s"], "from_nothing": nothing}
            out["host_inventory"] = out.get("host_inventory") or host
            continue
        cache = warm_cache if kind == "warm" and warm_cache else base / kind / "cache"
        cache.mkdir(parents=True, exist_ok=True)
        e = {**env, paths.CACHE_ENV: str(cache)}
        out[kind], rep = _one(gate, args, kind, base / kind / "run", e)
        out["host_inventory"] = out.get("host_inventory") or rep.get("provenance", {}).get("host")
        warm_cache = warm_cache or cache
        # the first cold miss that built DeepEP (a SKIP builds nothing) fills the store
        if kind == "cold_miss" and not _kcache_check(kind, out[kind]) and not any(store.glob("*/envelope.json")):
            push = _cli("kernels", "push", "--to", str(store), "--key", str(key), "--cache", str(cache))
            out["push_s"], rc = _timed(push, env, base / "push.log")
            if rc != 0:
                raise ReprostackError(f"bench: kernels push exit {rc}; log {base}/push.log")


def bench_kernel_cache(
    gate: str,
    gate_args: list[str],
    *,
    lock: lockmod.Lock,
    out_dir: Path,
    work: Path,
    store: Path,
    kinds: tuple[str, ...],
    host: str | None = None,
    repeat: int = 3,
) -> tuple[dict, int]:
    """Issue 41's figures: `repeat` rounds of the `kinds` (KCACHE_KINDS), each run the whole process from a fresh
    folder: cold_miss (fresh cache, an empty kernel cache: built; the first pushes its build into the folder
    `store`), warm (again on that cache), cold_hit (fresh cache, pulled from `store`), from_nothing_hit (a fresh
    venv from the wheelhouse, the project installed, then cold_hit's run). Writes `<out_dir>/kcache-<host>.json`
    with one list of seconds per kind, merged with run lists an earlier call wrote there for the same lock, commit
    and host (so kinds may be measured in separate calls); exit 1 when a run's kernels did not come from where its
    kind says, or runs disagree on the verdict."""
    from .project import state as project_state

    bad_kinds = [k for k in kinds if k not in KCACHE_KINDS]
    if bad_kinds or not kinds or repeat < 1:
        raise ReprostackError(f"--runs {','.join(kinds)} --repeat {repeat}: kinds of {', '.join(KCACHE_KINDS)}, N >= 1")
    if "warm" in kinds and not {"cold_miss", "cold_hit"} & set(kinds):
        raise ReprostackError("--runs warm: needs cold_miss or cold_hit in the same call (warm runs on its cache)")
    store = Path(store).resolve()
    if any(k.endswith("_hit") for k in kinds) and "cold_miss" not in kinds and not any(store.glob("*/envelope.json")):
        raise ReprostackError(f"--kernel-cache {store}: no entry to hit; measure cold_miss first (it pushes one)")
    work = Path(work).resolve()
    if work.exists():
        shutil.rmtree(work)
    store.mkdir(parents=True, exist_ok=True)
    key, ring, signing = _bench_key(store)
    env = dict(os.environ)
    env.pop("REPROSTACK_KERNEL_CACHE", None)  # each run names its own
    project = project_state(paths.project_root())
    label = host_label(host)
    path = Path(out_dir) / f"kcache-{label}.json"
    res = _kcache_earlier(path, lock.sha256, project, label)
    for i in range(repeat):
        print(f"bench kcache: round {i + 1} of {repeat}: {', '.join(kinds)}", flush=True)
        got = _kcache_runs(kinds, gate, gate_args, base=work / f"r{i + 1}", env=env, store=store, ring=ring, key=key)
        for kind in [k for k in kinds if k in got]:
            run = got[kind]
            why = _kcache_check(kind, run)
            res["runs"].setdefault(kind, []).append({**run, "round": i + 1, **({"invalid": why} if why else {})})
            if why:
                print(f"bench kcache: {why}", flush=True)
        res.update({k: got[k] for k in ("push_s", "host_inventory") if got.get(k)})
        if i == 0:
            res["calls"].append({"kinds": list(kinds), "repeat": repeat, "gate_args": gate_args, "rounds_done": 0})
        res["calls"][-1]["rounds_done"] = i + (0 if got.get("error") else 1)
        if got.get("error"):
            res["calls"][-1]["error"] = got["error"]
        # written after every round: a call cut at its time limit keeps the rounds it finished
        _kcache_summarise(res)
        res.update(host=label, signing=signing, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, json.dumps(res, indent=1, sort_keys=True) + "\n")
        if got.get("error"):  # the runs done so far are written; the call says what stopped it
            raise ReprostackError(f"{got['error']} (the runs before it are in {path})")
    print(
        "bench kcache: "
        + ", ".join(f"{k} {res[f'{k}_s']} s {res[k]}" for k in KCACHE_KINDS if res.get(f"{k}_s") is not None)
        + f"; verdicts {', '.join(res['verdicts'])}; wrote {path}",
        flush=True,
    )
    return res, 1 if res["invalid"] or len(res["verdicts"]) > 1 else 0


def _kcache_summarise(res: dict) -> None:
    """Per kind: its list of seconds (the run list), the median `<kind>_s` and its summary; the median cold-hit
    run's timeline; the targets judged on the medians; every run's verdict and every invalid run."""
    from .evidence.bars.benchstats import summary

    for kind, runs in res["runs"].items():
        res[kind] = [r["wall_s"] for r in runs]
        res[f"{kind}_s"] = (summary(res[kind]) or {}).get("median")
        res[f"{kind}_summary"] = summary(res[kind])
    hits = res["runs"].get("cold_hit") or []
    if hits:  # the timeline of the median cold-hit run
        med = sorted(hits, key=lambda r: r["wall_s"])[len(hits) // 2]
        res["timeline_cold_hit"] = {"round": med["round"], **_kcache_timeline(med)}
    res.update(
        targets_s=KCACHE_TARGETS,
        targets_met={k: res[f"{k}_s"] <= t for k, t in KCACHE_TARGETS.items() if res.get(f"{k}_s") is not None},
        verdicts=sorted({str(r.get("result")) for runs in res["runs"].values() for r in runs}),
        invalid=[r["invalid"] for runs in res["runs"].values() for r in runs if r.get("invalid")],
        load_avg_after=[round(x, 2) for x in os.getloadavg()],
    )


def _kcache_earlier(path: Path, lock_sha: str, project: dict, label: str) -> dict:
    """The run lists an earlier call wrote at `path` for this lock, project commit and host, else a new record."""
    fresh = {"bench": "kcache_gate_micro", "lock_sha256": lock_sha, "project": project, "runs": {}, "calls": []}
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return fresh
    same = (
        isinstance(old, dict)
        and old.get("lock_sha256") == lock_sha
        and old.get("host") == label
        and (old.get("project") or {}).get("commit") == project.get("commit")
        and isinstance(old.get("runs"), dict)
    )
    if not same:
        return fresh
    kept = {k: old[k] for k in ("host_inventory", "push_s") if old.get(k)}  # the earlier call's, as its runs ran
    return {**fresh, **kept, "runs": old["runs"], "calls": list(old.get("calls") or [])}
