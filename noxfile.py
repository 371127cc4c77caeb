"""nox sessions: thin wrappers over the `reprostack` CLI (each session parses posargs and calls one stage).

GPU sessions are not run by a bare `nox`; `all_gates` exits non-zero unless every required gate passed
(a skipped gate never passes). Offline nodes: set REPROSTACK_WHEELHOUSE to the folders of our pinned
wheels, joined by `:` (see README), and pass `-- --offline --bundle FILE`.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
# The gate sessions come from the gate registry of this checkout (src/, before any other install of reprostack), which
# needs reprostack's dependencies in nox's Python: the README installs nox and `-e .` into one venv.
sys.path.insert(0, str(ROOT / "src"))
try:
    from reprostack import runs
    from reprostack.errors import ReprostackError
    from reprostack.gates import registry
except ImportError as e:
    raise SystemExit(
        f"noxfile.py: the gate sessions come from reprostack's gate registry, which does not import here ({e}): "
        "install nox and reprostack into one venv (README: `.venv/bin/pip install nox==2026.10.20 -e .`)"
    ) from None

nox.options.sessions = ["tests"]
nox.options.reuse_venv = "yes"


# The interpreter that holds torch (the image's); kernels are built and run with it, never with nox's venv.
def torch_python() -> str:
    """The interpreter that holds torch: $REPROSTACK_TORCH_PYTHON, else the first of the Python running nox and
    the `python3` on PATH that can import torch (the README's nox lives in .venv, the GPU image's torch in its own
    Python, e.g. /opt/torch/.venv/bin/python3 on the lent H200), else the Python running nox (the gate then says
    which variable to set)."""
    if os.environ.get("REPROSTACK_TORCH_PYTHON"):
        return os.environ["REPROSTACK_TORCH_PYTHON"]
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"
    for cand in (sys.executable, shutil.which("python3")):
        try:
            if cand and subprocess.run([cand, "-c", probe], capture_output=True, timeout=60).returncode == 0:
                return cand
        except (OSError, subprocess.TimeoutExpired):
            continue
    return sys.executable


def _install_key(target: str, wheelhouse: str | None) -> str:
    """sha256 of what an install of the project depends on: pyproject.toml, every file of the package (src/reprostack,
    without __pycache__; pip's own build leftovers such as src/*.egg-info are not inputs), the target (with its
    extra) and the wheelhouse."""
    h = hashlib.sha256(f"{target}\0{wheelhouse}\0".encode())
    pkg = sorted(p for p in Path("src", "reprostack").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for f in [Path("pyproject.toml"), *pkg]:
        h.update(f"{f}\0".encode() + f.read_bytes() + b"\0")
    return h.hexdigest()


def find_links(wheelhouse: str | None) -> list[str]:
    """pip's arguments for $REPROSTACK_WHEELHOUSE: folders joined by os.pathsep (`A:B`, as the device scripts set it),
    one `--find-links` each, with `--no-index` (the rule of reprostack.fetch.wheels.pip_find_links: pip reads `A:B`
    as one folder that does not exist and ignores it, then finds no build dependency: `No matching distribution
    found for setuptools==80.9.0`). [] when unset."""
    folders = [f for f in (wheelhouse or "").split(os.pathsep) if f]
    return ["--no-index", *[a for f in folders for a in ("--find-links", f)]] if folders else []


def _install(session: nox.Session, extra: str = "") -> None:
    """Install the project (with `extra`) into the session's venv, unless that venv (reused: nox.options.reuse_venv)
    already holds this exact install: its stamp records _install_key, so an unchanged tree costs no pip run."""
    if session.venv_backend == "none":  # `nox --no-venv` (inside an image that has the project): nothing to install
        if not shutil.which("reprostack"):
            session.error("nox --no-venv: no `reprostack` on PATH; install the project first (pip install -e .)")
        session.log(f"nox --no-venv: no install, using the reprostack on PATH ({shutil.which('reprostack')})")
        return
    target = f".{extra}" if extra else "."
    wheelhouse = os.environ.get("REPROSTACK_WHEELHOUSE")
    key = _install_key(target, wheelhouse)
    session.env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    stamp = Path(session.virtualenv.location) / ".reprostack-install" if session.virtualenv.location else None
    if stamp and stamp.is_file() and stamp.read_text() == key:
        session.log(f"reprostack{extra} already installed in this reused venv (same pyproject.toml and src/reprostack)")
        return
    # quiet: pip's lines (Collecting / Downloading / Installing) only when it fails or under `nox -v`; this one line
    # says what is happening (a first run on a fresh machine spends ~40 s here)
    session.log(
        f"installing reprostack{extra} and its pinned dependencies into {session.virtualenv.location} "
        f"(once; pip's output on failure or with nox -v)"
    )
    session.install(*find_links(wheelhouse), target, silent=True)
    if stamp:
        stamp.write_text(key)


@nox.session
def tests(session: nox.Session) -> None:
    """The fast tier: the unit tests (`-m unit`, tests/tiers.py: no process, Docker engine, Slurm or git repository;
    a unit test that starts one fails), on the test workers; what to run before a small change. `nox -s tests_all`
    runs every tier (what .ci/run runs)."""
    _install(session, "[test]")
    # the fuzz tests' first 150 seeded cases per reader (tests/test_fuzz_readers.py); tests_all feeds all 1000
    env = {"REPROSTACK_FUZZ_CASES": os.environ.get("REPROSTACK_FUZZ_CASES", "150")}
    session.run("pytest", "-m", "unit", *xdist_args(session.posargs), *session.posargs, env=env)


@nox.session(tags=["ci"])
def tests_all(session: nox.Session) -> None:
    """The CPU test suite, every tier (unit, integration: docker, slurm, git; e2e), no GPU, no network: what .ci/run
    runs (the README's test command)."""
    _install(session, "[test]")
    # Install phase, like the line above: the pinned AIPerf (upstreams.lock, sha256-checked) in its own venv, which
    # the serving-gate tests drive against the test server. One venv for tests and gates: built once under the
    # reprostack cache's tools/ (where `reprostack gate vllm` looks), unless REPROSTACK_TEST_TOOLS names another root.
    tools = (
        os.environ.get("REPROSTACK_TEST_TOOLS")
        or session.run("python", "-c", "from reprostack import paths; print(paths.cache_dir())", silent=True).strip()
    )
    session.run("python", "-m", "reprostack.gates.aiperftool", tools)
    # The container-mode tests' inputs (tests/test_gate_container.py): the wheels of containers/gate-selftest
    # (sha256-checked, into the same folder's wheels/), and, where an engine answers, the Debian test base
    # (debootstrap + docker import, once per engine; needs root and debootstrap: .ci/run installs it).
    session.run("python", "-m", "reprostack.fetch.wheels", tools, "reprostack-wheels", "aiperf-wheels")
    if os.environ.get("DOCKER_HOST"):
        # exit 2 (no root or debootstrap here): the tests that need it skip, or fail under REPROSTACK_REQUIRE_DOCKER
        session.run("python", "-m", "reprostack.containers.debianbase", success_codes=[0, 2])
    session.run("pytest", *xdist_args(session.posargs), *session.posargs, env={"REPROSTACK_TEST_TOOLS": tools})


def xdist_args(posargs, environ=os.environ) -> list[str]:
    """pytest-xdist's arguments for `nox -s tests` and `nox -s tests_all`: the test files spread over $REPROSTACK_TEST_WORKERS processes
    (default 2: on the 2-core CI machine a file that waits on a server, a Slurm job or a container overlaps one that
    computes), one file per worker at a time (`--dist loadfile`: a file's tests share their module fixtures and run
    in order), the longest files first (`--no-loadscope-reorder` keeps the order tests/schedule.py gives the collection:
    by the newest suite timing record, not xdist's most-tests-first). `0` runs them in this process (no xdist); so do
    posargs that pick their own (`-n`, `-p no:xdist`)."""
    if any(a in ("-n", "--numprocesses", "no:xdist") or a.startswith(("-n", "--numprocesses=")) for a in posargs):
        return []
    n = (environ.get("REPROSTACK_TEST_WORKERS") or "2").strip()
    if not n.isdigit() or int(n) > 64:
        raise SystemExit(f"REPROSTACK_TEST_WORKERS={n!r}: not a number of test processes in 0..64")
    return [] if int(n) == 0 else ["-n", str(int(n)), "--dist", "loadfile", "--no-loadscope-reorder"]


@nox.session(tags=["ci"])
def lint(session: nox.Session) -> None:
    """ruff (pinned in the `lint` extra) over src/, tests/, gates/, scripts/, noxfile.py: the format is ruff's
    (`ruff format --check`; `nox -s lint -- --fix` is not it: run `ruff format` to reformat), then pyflakes and
    syntax checks (`ruff check`); then mypy over gates, launch, lock and cluster and vulture's dead code in src/
    (both pinned in the `lint` extra)."""
    _install(session, "[lint]")
    paths = ("src", "tests", "gates", "scripts", "noxfile.py")
    session.run("ruff", "format", "--check", *paths)
    session.run("ruff", "check", *paths, *session.posargs)
    session.run("mypy")  # the packages and the reviewed settings: pyproject.toml [tool.mypy]
    # dead code in src/: a name nothing in src/, tests/, scripts/ or noxfile.py uses, unless the reviewed whitelist
    # says where it is used (tests/vulture_whitelist.py)
    out = session.run(
        "vulture", *paths, "tests/vulture_whitelist.py", "--min-confidence", "60", silent=True, success_codes=[0, 3]
    )
    dead = [ln for ln in (out or "").splitlines() if ln.startswith("src/")]
    if dead:
        session.error("vulture: unused code in src/ (remove it, or whitelist it with why):\n" + "\n".join(dead))


@nox.session
def lock(session: nox.Session) -> None:
    """Validate upstreams.lock (`-- [check] [--lock FILE]`); `-- wheels [PIN...] [--check]` resolves each wheel
    pin with pip and fills (or, with --check, verifies) its files and sha256 in the lock; `-- images [PIN...]
    [--check]` resolves each image pin's repo:tag to the registry's manifest digest and fills (or verifies) it."""
    _install(session)
    args = list(session.posargs)
    if not args or args[0] not in ("check", "wheels", "debs", "images"):
        args = ["check", *args]
    session.run("reprostack", "lock", *args)


@nox.session(default=False)
def images(session: nox.Session) -> None:
    """The registry-free image chain on the Docker engine at $DOCKER_HOST (root and debootstrap), each step timed
    (scripts/image_chain.py): the .debs of pin debian-12-build fetched and sha256-checked, the base made from them
    alone (reprostack.containers.debsbase), then `reprostack build cuda-toolkit substrate deepep` (CUDA 13.0.88 from
    its pinned wheels; rdma-core, libfabric, gdrcopy, torch/NCCL/NVSHMEM wheels; DeepEP for sm_90 and aws-ofi-nccl),
    then the gate images vllm, sglang and megatron on it, one build each (a failure is recorded with its error line);
    results/images/chain.json. `-- --twice`: every image built twice from scratch and compared
    (results/images/base-debian-12-build.json, results/images/<image>-twice.json)."""
    _install(session)
    session.run("python", "scripts/image_chain.py", *session.posargs)


@nox.session
def fetch(session: nox.Session) -> None:
    """Fetch and verify pinned sources into the cache (`-- [PIN...] [--offline] [--bundle F] [--mirror U=P]`)."""
    _install(session)
    session.run("reprostack", "fetch", *session.posargs)


@nox.session
def patch(session: nox.Session) -> None:
    """Build and verify the patched trees (`-- [PIN...]`)."""
    _install(session)
    session.run("reprostack", "patch", *session.posargs)


@nox.session
def bundle(session: nox.Session) -> None:
    """Write fetched sources into one archive for offline nodes (`-- -o out/sources.tar [PIN...]`)."""
    _install(session)
    session.run("reprostack", "bundle", *session.posargs)


@nox.session
def build(session: nox.Session) -> None:
    """Build images from containers/ on the Docker engine at $DOCKER_HOST
    (`-- [IMAGE...] [--offline] [--test-base] [--base-override BASE=IMAGE]`); logs + images.json in out/build."""
    _install(session)
    session.run("reprostack", "build", *session.posargs)


def _gate(session: nox.Session, *command: str) -> tuple[int, list[str]] | None:
    """Run a gate command into a fresh report folder; return the exit code its summary records and one short line
    per gate (gate_lines); None for `--plan`, which runs nothing and reads no verdict.

    Without `--out` the command makes a new run folder out/<session>/<UTC time>/ and moves out/<session>/latest to
    it only once its summary is written (reprostack.runs): when `latest` names the same folder after the command as
    before, this run wrote no summary (a failed fetch, a crash) and the session says so, never reading the earlier
    run's verdict; with `--out DIR` the summary there is deleted first."""
    args = list(session.posargs)
    if "--plan" in args:  # the plan only: nothing runs, so there is no verdict to read (issue 40)
        session.run("reprostack", *command, "--python", torch_python(), *args)
        return None
    out = None
    for i, a in enumerate(args):
        if a == "--out" and i + 1 < len(args):
            out = args[i + 1]
        elif a.startswith("--out="):
            out = a.split("=", 1)[1]
    base = None
    if out is None:
        stem = command[-1].replace("-", "_")
        base = Path("out", stem if command[0] == "all-gates" else "gate_" + stem)
        out = str(base / "latest")
    before = _link(Path(out)) if base is not None else None
    summary = Path(out, "summary.json")
    if base is None:
        summary.unlink(missing_ok=True)
    session.run("reprostack", *command, "--python", torch_python(), *args, success_codes=[0, 1, 3])
    if base is not None and _link(Path(out)) == before:
        session.error(
            f"this run wrote no summary: the gate did not finish (see the output above); {out} still names "
            f"{before or 'no run'}, an earlier run, not this one's verdict"
        )
    if not summary.is_file():
        session.error(f"no {summary} was written: the gate did not finish (see the output above)")
    data = json.loads(summary.read_text())
    return data["exit_code"], gate_lines(data["gates"])


def _link(path: Path) -> str | None:
    """What a `latest` symlink names, None when there is none."""
    try:
        return os.readlink(path)
    except OSError:
        return None


def gate_lines(gates: list[dict]) -> list[str]:
    """One short line per gate of a summary.json, named as the CLI names it (the report stem's `_` is the CLI's `-`:
    nemo_rl is `gate nemo-rl`); a reason an earlier gate gave is not repeated."""
    seen: dict[str, str] = {}
    out = []
    for g in gates:
        name = g["gate"].replace("_", "-")
        why = f"same reason as {seen[g['reason']]}" if g["reason"] in seen else g["reason"]
        seen.setdefault(g["reason"], name)
        out.append(f"{name}: {g.get('label', g['result'].upper())} — {why}")
    return out


SKIP_EXIT = 3  # reprostack's exit code of a gate skipped or not run (report.exit_code): never a pass


def _one_gate(session: nox.Session, gate: str) -> None:
    """Run `reprostack gate GATE`: nox exits non-zero unless the gate passed. A SKIP (or not run: the summary's exit
    code 3) ends nox with exit 3, as `reprostack gate` does, so a script tells it from a failure (nox's exit 1); a
    session marked skipped would have made nox exit 0."""
    _install(session)
    got = _gate(session, "gate", gate)
    if got is None:  # --plan
        return
    rc, lines = got
    reason = "; ".join(lines)
    if rc == SKIP_EXIT:
        session.warn(f"not a pass (SKIP, exit {SKIP_EXIT}): {reason}")
        raise SystemExit(SKIP_EXIT)  # nox catches a session's errors as exit 1; this one keeps the gate's code
    if rc != 0:
        session.error(f"gate failed: {reason}")


def _gate_session(number: int, gate) -> None:
    """Register `gate_<G>` (runs.session) for one gate of the registry; its description is its spec's (gates/<G>.yaml
    `description:`), so `nox -l` lists every gate the registry holds and nothing else does."""
    try:
        what = gate.load(ROOT).description
    except ReprostackError:  # a broken spec still gets its session: running it prints the file:line error
        what = f"(gates/{gate.stem}.yaml does not load: `reprostack gate {gate.name}` says why)"

    def run_gate(session: nox.Session) -> None:
        _one_gate(session, gate.name)

    run_gate.__doc__ = (
        f"Gate {number}: {what}\n\n`reprostack gate {gate.name}` (`-- --plan [--json]`, `--profile P`, `--container`, "
        "...); without its hardware SKIP (nox exits 3, a failure 1), never a pass."
    )
    name = runs.session(gate.name)
    globals()[name] = nox.session(run_gate, name=name, default=False, tags=["gpu"])  # noxfile.gate_micro, as written


for _number, _g in enumerate(registry.GATES):  # gate_fabric, gate_micro, ...: the registry's order
    _gate_session(_number, _g)


@nox.session(default=False, tags=["gpu"])
def all_gates(session: nox.Session) -> None:
    """Every gate of the registry in dependency order (src/reprostack/gates/registry.py), always one combined report
    of them all (a gate no profile fits the host is SKIP, a bad spec or a crash that gate's ERROR); fails unless every
    required gate passed (a skipped required gate fails this session)."""
    _install(session)
    got = _gate(session, "all-gates")
    if got is None:  # --plan
        return
    rc, lines = got
    if rc != 0:  # the gates' lines were printed by the command just above: one short line here
        failed = [line.split(":", 1)[0] for line in lines if ": PASS —" not in line]
        session.error(f"not every required gate passed ({', '.join(failed)}): the lines above, or summary.md")


@nox.session(default=False, tags=["gpu"])
def bench(session: nox.Session) -> None:
    """issue 17's benchmark: `reprostack bench gate_micro` runs gate micro cold (fresh cache dir; the wheelhouse of
    REPROSTACK_WHEELHOUSE is pre-seeded and the output says so) then warm, and writes results/bench/gate_micro-<host>.json
    (`-- [--host H] [--repeat N] [-- GATE OPTIONS]`: N cold+warm pairs, every run recorded, the median the headline);
    `-- cpu [--host H]` times the CPU side instead (results/bench/cpu-<host>.json).
    Fails when the cold and warm verdicts differ. Not a timed test: the figures are committed, never asserted."""
    _install(session)
    args = list(session.posargs)
    what = args.pop(0) if args and args[0] in ("gate_micro", "cpu") else "gate_micro"
    if what == "gate_micro" and "--" not in args:
        args += ["--", "--python", torch_python()]
    elif what == "gate_micro":
        args += ["--python", torch_python()]
    session.run("reprostack", "bench", what, *args)


@nox.session(default=False)
def verify(session: nox.Session) -> None:
    """Recompute published claims from raw AIPerf artifacts (`-- DIR... [--claims FILE] [--out DIR]`; no DIR:
    the published exports in tests/fixtures/published-2026-07); verify.json, verify.md and verify.html (plots) in
    out/verify. Fails on a mismatch (1), an unreadable artifact or claims file (2) or a missing artifact (3)."""
    _install(session, "[plots]")
    args = list(session.posargs)
    opts_with_value = {"--claims", "--out"}
    positional = [
        a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in opts_with_value)
    ]
    if not positional:
        args = ["tests/fixtures/published-2026-07", *args]
    session.run("reprostack", "verify", *args)


@nox.session(default=False)
def verify_report(session: nox.Session) -> None:
    """Re-derive gate reports from their raw logs and trace them to commits (`-- [DIR...] [--json FILE] [-q]`; no DIR:
    results/). Fails (1) when a report does not hold, (2) on bad input."""
    _install(session)
    session.run("reprostack", "verify-report", *session.posargs)


@nox.session(default=False)
def docs(session: nox.Session) -> None:
    """The docs' figures from results/ (README result lines, docs/stacks.md tables, the bench table); `-- --check`
    writes nothing and fails when a committed block differs from what results/ gives (CI)."""
    _install(session)
    session.run("reprostack", "docs", *session.posargs)


@nox.session(default=False)
def bump(session: nox.Session) -> None:
    """Move a git pin to its policy target and replay its series (`-- UPSTREAM [--to REF] [--branch B]
    [--no-commit] [--allow-rewind] [--lock FILE] [--mirror U=P]`): writes upstreams.lock and refreshed patches,
    commits them on a new branch, PR body in out/bump/. Fails at a conflict (its report is written, nothing else)."""
    _install(session)
    session.run("reprostack", "bump", *session.posargs)


@nox.session(default=False)
def outdated(session: nox.Session) -> None:
    """Per git pin: commits and days behind its policy target (`-- [PIN...] [--json]`); out/bump/outdated.json."""
    _install(session)
    session.run("reprostack", "outdated", *session.posargs)
