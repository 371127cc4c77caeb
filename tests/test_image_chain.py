"""scripts/image_chain.py --check: the committed image-chain record (results/images/chain.json, the README's build
times, sizes and downloads) is the current recipes' and pins' (issue 26 item 5: the CI's test on the substrate and
deepep images, whose build does not fit CI)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _mod():
    spec = importlib.util.spec_from_file_location("image_chain", REPO / "scripts" / "image_chain.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_the_committed_chain_record_is_the_current_recipes_and_pins():
    """Fails when a recipe, kernel recipe, JIT manifest or lock pin of cuda-toolkit / substrate / deepep changed
    after results/images/chain.json was made: its times, sizes and image ids would describe other images."""
    rec = json.loads((REPO / "results" / "images" / "chain.json").read_text())
    assert {"cuda-toolkit", "substrate", "deepep"} <= set(rec["images"])
    assert _mod().stale(REPO, rec) == [], "run `nox -s images` and commit results/images"


def _git(root: Path, *a: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *a],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_a_changed_recipe_file_shared_file_or_pin_is_named(tmp_path):
    """In a real git repository holding the project's recipes and lock: after the record's commit, an edit to the
    substrate's Dockerfile, to a sibling recipe's file deepep copies (`../deepep-gin-gdaki/...`) and to a pin the
    substrate builds from (libfabric) are each one line; an edit elsewhere (another recipe, another pin) is none."""
    root = tmp_path / "r"
    root.mkdir()
    shutil.copytree(REPO / "containers", root / "containers")
    shutil.copytree(REPO / "kernels", root / "kernels")
    shutil.copy(REPO / "upstreams.lock", root / "upstreams.lock")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "chain built here")
    rec = {"project_commit": _git(root, "rev-parse", "HEAD"), "images": ["cuda-toolkit", "substrate", "deepep"]}
    m = _mod()
    assert m.stale(root, rec) == []
    (root / "containers" / "vllm" / "Dockerfile").write_text("# not an input of the chain\n")
    lock = (root / "upstreams.lock").read_text()
    assert "  megatron-lm:\n" in lock and "  libfabric:\n" in lock
    assert m.stale(root, rec) == []
    with (root / "containers" / "substrate" / "Dockerfile").open("a") as f:
        f.write("# edited\n")
    with (root / "containers" / "deepep-gin-gdaki" / "unpack-nccl-wheel.py").open("a") as f:
        f.write("# edited\n")
    rev = lock.split("  libfabric:\n", 1)[1].split("rev: ", 1)[1].split("\n", 1)[0]
    (root / "upstreams.lock").write_text(lock.replace(f"rev: {rev}", f"rev: {'0' * 40}", 1))
    c = rec["project_commit"][:12]
    got = m.stale(root, rec)
    assert f"containers/substrate/Dockerfile: changed since {c}" in got
    assert f"containers/deepep-gin-gdaki/unpack-nccl-wheel.py: changed since {c}" in got
    assert f"upstreams.lock: pin libfabric changed since {c}" in got
    assert len(got) == 3, got


def test_twice_refuses_an_engine_that_keeps_the_first_build_and_counts_cached_steps(tmp_path):
    """`--twice` removes the first build's images and builds again: `docker rmi` only untags an image that another
    image is built on (a gate image of an earlier run), and the second build then comes from the layer cache, not
    from scratch (seen: substrate "built" again in 25 s). The ids still present are named (the run exits 2), and
    every step's `cached_steps` counts the build log's `---> Using cache` lines."""
    ic = _mod()
    present = {"sha256:aa", "sha256:cc"}
    assert ic.still_present(["sha256:aa", "sha256:bb", "sha256:cc"], lambda i: 0 if i in present else 1) == [
        "sha256:aa",
        "sha256:cc",
    ]
    log = tmp_path / "b.log"
    log.write_text("Step 1/3 : FROM x\n ---> Using cache\n ---> 1234\nStep 2/3 : RUN y\n ---> Running in z\n")
    assert ic.cached_steps(log) == 1 and ic.cached_steps(tmp_path / "none.log") == 0 and ic.cached_steps(None) == 0


def _fake_chain(m, monkeypatch, tmp_path, *, kept: list[str], second_log: str):
    """main()'s commands stood in: the base step and docker rmi do nothing, each `reprostack build --out D` writes
    D/images.json (the second build's log holding `second_log`), the engine keeps the image ids `kept`."""
    ran = []

    def run(argv):
        ran.append(argv)
        if argv[: len(m.REPROSTACK) + 1] == [*m.REPROSTACK, "build"]:
            out = Path(argv[argv.index("--out") + 1])
            out.mkdir(parents=True, exist_ok=True)
            log = out / "deepep.log"
            log.write_text(second_log if out.name == "2" else "Step 1/2\n")
            img = {"name": "deepep", "status": "built", "tag": "t", "image_id": "sha256:" + "a" * 64, "log": str(log)}
            (out / "images.json").write_text(json.dumps({"images": [{**img, "seconds": 1, "context_bytes": 1}]}))
        return 1.0

    monkeypatch.setattr(m, "_run", run)
    monkeypatch.setattr(m, "still_present", lambda ids, inspect=None: [i for i in ids if i in kept])
    monkeypatch.setattr(m.image_twice, "record", lambda *a, **k: {})
    monkeypatch.chdir(REPO)
    return ran


def test_twice_refuses_when_the_engine_kept_the_first_builds_layers(tmp_path, monkeypatch, capsys):
    """Issue 39 item 6: `docker rmi` left the first build's image (another image is built on it): the second build
    would come from the layer cache, so main() exits 2 naming it, before any second build, nothing recorded."""
    m = _mod()
    ran = _fake_chain(m, monkeypatch, tmp_path, kept=["sha256:" + "a" * 64], second_log="")
    rc = m.main(["--twice", "--images", "deepep", "--results", str(tmp_path / "res"), "--out", str(tmp_path / "o")])
    assert rc == 2 and "still on the engine after `docker rmi`" in capsys.readouterr().err
    assert not (tmp_path / "o" / "2").exists() and not (tmp_path / "res").exists()
    assert sum(a[: len(m.REPROSTACK) + 1] == [*m.REPROSTACK, "build"] for a in ran) == 1


def test_twice_refuses_a_second_build_from_the_layer_cache(tmp_path, monkeypatch, capsys):
    """Issue 39 item 6: a second build that took a step from the cache (`---> Using cache`) is not from scratch:
    exit 2, no record written."""
    m = _mod()
    _fake_chain(m, monkeypatch, tmp_path, kept=[], second_log="Step 1/2\n ---> Using cache\n")
    rc = m.main(["--twice", "--images", "deepep", "--results", str(tmp_path / "res"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "the second build was not from scratch" in err and "{'deepep': 1}" in err
    assert not (tmp_path / "res").exists()


def test_the_chain_needs_no_reprostack_on_path_and_a_missing_tool_is_one_line(tmp_path, capsys):
    """Noticed in session 13: run by a Python that has reprostack but with no `reprostack` on PATH, the chain ended
    in a FileNotFoundError traceback. It runs the CLI through its own interpreter (`python -m reprostack`); a tool
    that is not installed (docker) is one line naming it, exit 2, never a traceback."""
    m = _mod()
    assert m.REPROSTACK == [sys.executable, "-m", "reprostack"]
    with pytest.raises(SystemExit) as e:
        m._run([str(tmp_path / "docker"), "info"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "docker: not found (install it or put it on PATH)" in err


def test_a_python_without_the_project_is_one_line_not_a_traceback():
    """Noticed in session 15: the docstring's `python3 scripts/image_chain.py --check`, run by a system python that
    lacks the project (PEP 668: nothing installed there), ended in a ModuleNotFoundError traceback. One line naming
    the interpreter and the module, and how to run it, exit 2 (`-S`: no site-packages, so no reprostack)."""
    p = subprocess.run(
        [sys.executable, "-S", str(REPO / "scripts/image_chain.py"), "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and p.stdout == "" and p.stderr.count("\n") == 1, p.stderr
    assert "has no 'reprostack'" in p.stderr and ".venv/bin/python scripts/image_chain.py" in p.stderr
