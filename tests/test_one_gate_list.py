"""The gate registry (src/reprostack/gates/registry.py) is the only list of gates (issue 38 item 1).

A throwaway gate added to a copy of the project (its spec, its module and its entry in GATES: nothing else) shows up
in `nox -l` (a session `gate_<name>`), in `gate --plan` and `all-gates --plan`, in both cluster renderers (Slurm and
Kubernetes, with the committed examples' script), and in the docs' gates table (`reprostack docs`); every other file
is untouched. The code holds no second list of gate names: a literal tuple, list, set or dict naming two gates or more
outside the registry is one (its reviewed exceptions say why they are not lists of gates).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import noxmod
from reprostack import runs
from reprostack.bump.impact import Impact
from reprostack.bump.prbody import rerun_lines
from reprostack.gates import registry

REPO = Path(__file__).resolve().parents[1]
NAMES = set(registry.GATE_ORDER) | set(registry.GATE_STEMS)
# literals naming several gates' names that are not lists of gates (reviewed; each says what it lists)
NOT_GATE_LISTS = {
    ("src/reprostack/hostenv.py", "KEY_DISTRIBUTIONS"): "pip distributions a host-mode run records (vllm, sglang)",
    ("scripts/image_chain.py", "GATE_IMAGES"): "the image recipes the registry-free chain builds (containers/)",
}

THROWAWAY_MODULE = '''"""A throwaway gate of tests/test_one_gate_list.py: micro's kind under another name."""

from .micro import MicroGate


class ThrowawayGate(MicroGate):
    """Gate 7: the registry test's throwaway."""
'''


def _copy_project(dest: Path) -> Path:
    """A copy of this checkout's files a gate touches (the read-only inputs linked, what a run writes copied)."""
    dest.mkdir()
    for name in ("src", "gates", "docs", "scripts"):
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("noxfile.py", "pyproject.toml", "upstreams.lock", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    for name in ("results", "kernels", "containers", "patches", "claims"):
        (dest / name).symlink_to(REPO / name)
    return dest


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts and p.parts[-2:-1] != ("results",)
    }


def _add_throwaway(root: Path) -> None:
    """The three changes of a new gate: spec, module, one entry (and its import) in the registry."""
    spec = (root / "gates" / "micro.yaml").read_text()
    head = "\ngate: micro\ndescription: DeepEP V2 dispatch/combine micro benchmark (tests/elastic/test_ep.py)\n"
    assert spec.count(head) == 1
    spec = spec.replace(head, "\ngate: throwaway\ndescription: the registry test's throwaway gate\n")
    (root / "gates" / "throwaway.yaml").write_text(spec)
    (root / "src" / "reprostack" / "gates" / "throwaway.py").write_text(THROWAWAY_MODULE)
    reg = root / "src" / "reprostack" / "gates" / "registry.py"
    text = reg.read_text()
    anchor = '    NemoRLGate("nemo-rl", "nemo_rl", requires=("megatron",)),\n'
    assert anchor in text and "from .training import MegatronGate\n" in text
    text = text.replace(anchor, anchor + '    ThrowawayGate("throwaway"),\n')
    reg.write_text(text.replace("from .training import", "from .throwaway import ThrowawayGate\nfrom .training import"))


def _run(root: Path, *argv: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "REPROSTACK_CACHE": str(root / ".cache")}
    env.pop("DOCKER_HOST", None)  # a plan needs no engine: the image is named by recipe, never looked up
    p = subprocess.run([sys.executable, *argv], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (argv, p.stdout[-2000:], p.stderr[-2000:])
    return p.stdout + p.stderr


def test_a_throwaway_gate_reaches_every_place_that_lists_gates(tmp_path):
    root = _copy_project(tmp_path / "project")
    before = _tree(root)
    _add_throwaway(root)

    listed = _run(root, "-m", "nox", "-l")
    assert "- gate_throwaway [gpu] -> Gate 7: the registry test's throwaway gate" in listed
    assert "- gate_fabric [gpu] -> Gate 0:" in listed  # was: no gate_fabric session at all
    for g in registry.GATES:
        assert f"- {runs.session(g.name)} [gpu] -> " in listed, g.name

    plan = _run(root, "-m", "reprostack", "gate", "throwaway", "--plan")
    assert "throwaway" in plan and "p5en-efa-ep16" in plan
    assert "throwaway" in _run(root, "-m", "reprostack", "all-gates", "--plan")

    _run(root, "-m", "reprostack", "launch", "slurm", "throwaway", "--nodes", "2", "--out", "out/slurm-throwaway")
    sbatch = (root / "out" / "slurm-throwaway" / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in sbatch and "throwaway" in sbatch
    _run(root, "scripts/render_k8s_examples.py", str(root / "k8s"))
    job = (root / "k8s" / "throwaway" / "job.yaml").read_text()
    assert "rs-throwaway-p5en-efa-ep16" in job

    _run(root, "-m", "reprostack", "docs")
    table = (root / "docs" / "architecture.md").read_text()
    assert "| 7 | `throwaway` | `gate_throwaway` | `gates/throwaway.yaml` | `ThrowawayGate` |" in table

    after = _tree(root)
    changed = sorted(k for k in after if before.get(k) != after[k])
    assert changed[:2] == ["docs/architecture.md", "gates/throwaway.yaml"]  # the docs' generated gates block
    assert [c for c in changed[2:] if not c.startswith(("k8s/", "out/", ".cache/"))] == [
        "src/reprostack/gates/registry.py",
        "src/reprostack/gates/throwaway.py",
    ]
    old, new = before["docs/architecture.md"].decode(), after["docs/architecture.md"].decode()
    assert new.replace(next(ln for ln in new.splitlines(True) if "`throwaway`" in ln), "") == old


def _literal_names(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Dict):
        elts = [k for k in node.keys if k is not None]
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        elts = node.elts
    else:
        return set()
    flat = [x for e in elts for x in (e.elts if isinstance(e, (ast.Tuple, ast.List)) else [e])]  # rows of a table too
    return {e.value for e in flat if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in NAMES}


def _code_files() -> list[Path]:
    return [
        *sorted((REPO / "src").rglob("*.py")),
        *sorted((REPO / "scripts").rglob("*.py")),
        REPO / "noxfile.py",
    ]


def test_no_second_list_of_gate_names_in_the_code():
    """Literal collections naming two gates or more (`("micro", "vllm", ...)`) outside the registry; the tests are not
    read (an expectation may name the gates it checks)."""
    found = []
    for path in _code_files():
        rel = str(path.relative_to(REPO))
        if rel == "src/reprostack/gates/registry.py":
            continue
        tree = ast.parse(path.read_text())
        owner = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name) and node.value is not None:
                        for sub in ast.walk(node.value):
                            owner[id(sub)] = t.id
        for node in ast.walk(tree):
            names = _literal_names(node)
            if len(names) >= 2 and (rel, owner.get(id(node))) not in NOT_GATE_LISTS:
                found.append(f"{rel}:{node.lineno}: {sorted(names)}")
    assert found == []


def test_the_exceptions_are_still_there():
    """Each reviewed exception names a literal that exists (a stale entry would hide nothing and mislead)."""
    for rel, var in NOT_GATE_LISTS:
        tree = ast.parse((REPO / rel).read_text())
        assert any(
            isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == var for t in n.targets)
            for n in ast.walk(tree)
        ), (rel, var)


def test_a_second_list_is_found():
    """The check sees a list like the one scripts/render_k8s_examples.py held on 8bb97a9."""
    for text in (
        'EXAMPLES = [("micro", "micro", "deepep", "job"), ("vllm", "vllm", "vllm", "job")]\n',  # a table's rows
        'GATES = ("micro", "vllm", "sglang", "trtllm", "megatron", "nemo-rl")\n',  # tests/test_launch_k8s.py's
        'KIND_MODULES = {"micro": 1, "fabric": 2}\n',
    ):
        assert any(len(_literal_names(n)) >= 2 for n in ast.walk(ast.parse(text))), text
    assert not any(len(_literal_names(n)) >= 2 for n in ast.walk(ast.parse('X = ("micro", "deepep", "nccl")\n')))


@pytest.mark.parametrize("g", registry.GATES, ids=lambda g: g.name)
def test_the_pr_body_names_each_gates_real_nox_session(g):
    """The bump PR body asks reviewers to run `nox -s gate_<G>`: a session the noxfile defines for every gate (was:
    no gate_fabric session, and `gate_nemo-rl` for nemo-rl)."""
    lines = rerun_lines(Impact(kernels=(), gates=(g.name,), images=()), "deepep")
    assert lines[0] == f"- gate `{g.name}`: `nox -s {runs.session(g.name)}` (GPU)"
    assert runs.session(g.name) in noxmod.sessions()


def test_every_nox_install_installs_the_project_too():
    """noxfile.py makes its gate sessions from the registry, so the Python that runs nox imports reprostack: every
    install of nox in the project (README, .ci/run, the bump workflow, the device scripts) installs the project
    with it (`-e .` or `.`), never nox alone (`nox -l` would stop at the noxfile's first line)."""
    places = [REPO / "README.md", REPO / ".ci" / "run", *sorted((REPO / ".github" / "workflows").glob("*.yml"))]
    places += sorted((REPO / "scripts" / "device").glob("*.sh"))
    found = []
    for path in places:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split(" #", 1)[0]
            if "pip install" in code and "nox==" in code:
                words = code.replace("&&", " ").split()
                after = words[words.index("install") + 1 :]
                found.append((f"{path.relative_to(REPO)}:{n}", "." in after))
    assert found and all(ok for _, ok in found), [w for w, ok in found if not ok]
