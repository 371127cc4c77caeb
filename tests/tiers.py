"""A pytest plugin (loaded by conftest.py): the test pyramid's tiers (issue 38 item 6).

Every test gets one tier marker, registered in pyproject.toml:
- `unit`: pure Python in this process: no process started, no Docker engine, no Slurm, no git repository (the fast
  tier: `nox -s tests` runs `-m unit`);
- `integration`: a real tool or service: `docker` (an engine, a registry), `slurm`, `git` (repositories made and
  read by git), or another process (make, g++, bash, pip); the kind is a marker too (`-m "not docker"`);
- `e2e`: a whole path: our CLI as a process or in-process (`cli.main([...])`), a script of scripts/ or nox as a
  process, a whole gate run (tests/gaterun.py, the runner).

Derived, not typed 95 times: a tier marker on the test (or its module's `pytestmark`) wins; else the source of the
test, of the fixtures it uses (all of them, as pytest resolved them) and of the functions of tests/ it calls (followed
by name, transitively) is read for what it touches (SIGNALS). The derivation reads text, so it can be wrong in one
direction only without a failure: a pure test read as integration runs in the slower tier. The other direction is
checked when the test runs: a test of the unit tier that starts a process or opens a Docker client fails, naming
what it started and the marker to add (`guard_unit`).

Invariants: exactly one tier per test; the unit tier starts no process (enforced, not assumed); the derivation is a
pure function of the source (no clock, no environment), so `-m unit` selects the same tests on every machine.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "e2e")
KINDS = ("docker", "slurm", "git")
DOCKER_FIXTURES = {"docker_client", "test_base", "debian_base"}  # tests/dockerd.py
# what the source of a test (and what it calls) touches -> (tier, kind)
SIGNALS: tuple[tuple[str, str | None, re.Pattern], ...] = (
    ("integration", "docker", re.compile(r"DOCKER_HOST|\bdocker\.(from_env|DockerClient|APIClient)|\bdockerd\b")),
    ("integration", "slurm", re.compile(r'"(sbatch|scontrol|srun|squeue|sacct)"')),
    ("integration", "git", re.compile(r'\bgit\(|"git"|\bgitcmd\b|\bgitrepos\b|\bbumprepos\b|\bpatchrepos\b')),
    (
        "integration",
        None,
        re.compile(
            r"\bsubprocess\.|\bos\.system\(|\bPopen\b|\bshutil\.which\(|\bsys\.executable\b|\bvenv\.create\("
            r"|\.chmod\(0o7\d\d\)"  # a fake tool written executable: something runs it
        ),
    ),
    (  # reprostack code that starts a process behind the test's back (the unit guard found each)
        "integration",
        None,
        re.compile(
            r"\b(ensure_aiperf|git_remote|fingerprint|host_execution|toolchain\.detect|hostinfo\.collect|run_logged"
            r"|project\.state|Versions\.read|stale|check_patch_headers)\(|\bpagecheck\."
        ),
    ),
    (  # the whole path: our CLI, nox, a nox session's function (noxfile._gate probes for torch's Python), a gate run
        "e2e",
        None,
        re.compile(
            r'"-m",\s*"(reprostack|nox)"|\bgaterun\b|\brun_here\b|\bcli\.main\(|\bmain\(\['
            r"|\._gate\(|\.gate_\w+\(|\.all_gates\("
        ),
    ),
)

_source_cache: dict[object, str] = {}
_reach_cache: dict[tuple, tuple[str, frozenset[str]]] = {}


_own_cache: dict[str, bool] = {}


def _own(obj) -> bool:
    """A function, class or module defined in a file under tests/ (its source is ours to read)."""
    try:
        f = inspect.getfile(obj)
    except (TypeError, OSError):
        return False
    if f not in _own_cache:
        p = Path(f).resolve()
        _own_cache[f] = p.parent == TESTS and p.name not in ("tiers.py", "conftest.py")
    return _own_cache[f]


def _source(obj) -> str:
    if obj not in _source_cache:
        try:
            _source_cache[obj] = textwrap.dedent(inspect.getsource(obj))
        except (OSError, TypeError):
            _source_cache[obj] = ""
    return _source_cache[obj]


_called_cache: dict[int, list] = {}


def _called(obj, text: str) -> list:
    """The functions and classes of tests/ that `obj`'s source names (`helper(...)`, `gitrepos.init_repo(...)`)."""
    if id(obj) not in _called_cache:
        _called_cache[id(obj)] = _names(obj, text)
    return _called_cache[id(obj)]


def _names(obj, text: str) -> list:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    scope = getattr(obj, "__globals__", None) or vars(sys.modules.get(obj.__module__) or object)
    out = []
    for node in ast.walk(tree):
        target = None
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.level == 0
            and (TESTS / f"{node.module}.py").is_file()
        ):
            mod = importlib.import_module(node.module)  # a helper of tests/ imported inside the function
            out += [getattr(mod, a.name, None) for a in node.names if _own(getattr(mod, a.name, None))]
        elif isinstance(node, ast.Name):
            target = scope.get(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            mod = scope.get(node.value.id)
            if inspect.ismodule(mod) and _own(mod):
                target = getattr(mod, node.attr, None)
        if (inspect.isfunction(target) or inspect.isclass(target)) and _own(target):
            out.append(target)
    return out


def _reach(roots: list) -> str:
    """The source of `roots` and of every function of tests/ they name, transitively."""
    seen, todo, texts = set(), list(roots), []
    while todo:
        obj = todo.pop()
        key = getattr(obj, "__wrapped__", obj)
        if id(key) in seen:
            continue
        seen.add(id(key))
        text = _source(key)
        texts.append(text)
        todo += _called(key, text)
    return "\n".join(texts)


def derive(item) -> tuple[str, set[str]]:
    """(tier, kinds) of a collected test (see the module doc)."""
    fixtures = []
    info = getattr(item, "_fixtureinfo", None)
    for name in item.fixturenames:
        defs = info.name2fixturedefs.get(name) if info is not None else None
        if defs and _own(defs[-1].func):
            fixtures.append(defs[-1].func)
    key = (item.function, *fixtures)
    if key not in _reach_cache:  # a parametrized test's cases share one reach: read once
        _reach_cache[key] = _signals(_reach(list(key)))
    tier, found = _reach_cache[key]
    kinds = set(found)
    if DOCKER_FIXTURES & set(item.fixturenames) or "registry" in item.fixturenames and _registry_fixture(item):
        kinds.add("docker")
        tier = "e2e" if tier == "e2e" else "integration"
    return tier, kinds


def _signals(text: str) -> tuple[str, frozenset[str]]:
    """(tier, kinds) that the SIGNALS find in `text` (unit when none)."""
    kinds, tier = set(), "unit"
    for t, kind, rx in SIGNALS:
        if rx.search(text):
            if kind:
                kinds.add(kind)
            tier = "e2e" if "e2e" in (tier, t) else "integration"
    return tier, frozenset(kinds)


def _registry_fixture(item) -> bool:
    defs = item._fixtureinfo.name2fixturedefs.get("registry")
    return bool(defs) and Path(inspect.getfile(defs[-1].func)).name == "registry.py"


def pytest_collection_modifyitems(config, items):
    for item in items:
        given = [t for t in TIERS if item.get_closest_marker(t)]
        if len(given) > 1:
            raise pytest.UsageError(f"{item.nodeid}: more than one tier marker ({', '.join(given)})")
        tier, kinds = derive(item)
        if given:
            tier = given[0]
        for kind in sorted(kinds - {m.name for m in item.iter_markers()}):
            item.add_marker(kind)
        if not given:
            item.add_marker(tier)


@pytest.fixture(autouse=True)
def guard_unit(request, monkeypatch):
    """A unit test that starts a process or opens a Docker client fails at its end, naming what it started (recorded,
    never raised into the code under test, which could catch it)."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    seen: list[str] = []
    where = request.node.nodeid
    hint = f"{where} is in the unit tier but {{}}: mark it @pytest.mark.integration (or e2e), or keep it pure"

    def refuse(what: str):  # recorded, not raised: code under test that catches errors cannot hide it
        seen.append(what)

    real_init = subprocess.Popen.__init__

    def popen(self, args, *a, **kw):
        refuse(f"started a process ({args if isinstance(args, str) else ' '.join(map(str, args))[:120]})")
        return real_init(self, args, *a, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
    try:
        import docker.api.client

        real_api = docker.api.client.APIClient.__init__

        def api(self, *a, **kw):
            refuse("opened a Docker client")
            return real_api(self, *a, **kw)

        monkeypatch.setattr(docker.api.client.APIClient, "__init__", api)
    except ImportError:
        pass
    yield
    if seen:
        pytest.fail(hint.format("; ".join(seen)), pytrace=False)
