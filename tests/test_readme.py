"""The README's opening commands and `.ci/run` stay runnable on a fresh Debian/Ubuntu machine.

A stock Debian 13 / Ubuntu 24.04 refuses `pip install` into the system Python (PEP 668), so the README's two
opening commands make `.venv` and install the pinned nox and the `reprostack` CLI there; `.ci/run` runs the same
line. These tests parse the README's first fenced block and check its form against the files it names
(noxfile sessions, pyproject's pins and entry point, .ci/run), so an edit cannot silently break them. They run
nothing that needs the network; the venv's pip bootstrap failing (no python3-venv) is checked with a real
`python -m venv` that fails.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import noxmod

from reprostack.errors import BuildError, GateError
from reprostack.gates import aiperftool
from reprostack.kernels.toolchain import detect
from reprostack.lock import load

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
VENV_LINE = ["python3", "-m", "venv", ".venv"]


def _opening_commands() -> list[list[list[str]]]:
    """The README's first fenced block: one entry per line, each a list of `&&`-joined commands (argv lists)."""
    text = README.read_text()
    m = re.search(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)
    assert m, "README.md has no fenced block"
    assert m.group(1) == "bash", f"README.md's first fenced block is {m.group(1)!r}, expected bash"
    lines = [ln for ln in m.group(2).splitlines() if ln.strip()]
    out = []
    for ln in lines:
        words = shlex.split(ln, comments=True)
        cmds, cur = [], []
        for w in words:
            if w == "&&":
                cmds.append(cur)
                cur = []
            else:
                cur.append(w)
        cmds.append(cur)
        assert all(cmds), f"README.md: empty command in {ln!r}"
        out.append(cmds)
    return out


def _nox_sessions() -> set[str]:
    return noxmod.sessions()


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _nox_pin() -> str:
    pins = [r for r in _pyproject()["project"]["optional-dependencies"]["test"] if r.startswith("nox==")]
    assert len(pins) == 1
    return pins[0]


def test_readme_opens_with_the_main_job_and_the_test_suite():
    lines = _opening_commands()
    assert len(lines) == 2, f"README.md's first block has {len(lines)} commands, expected 2 (main job, tests)"
    assert [line[-1][-2:] for line in lines] == [["-s", "gate_micro"], ["-s", "tests_all"]]


def test_readme_commands_make_a_venv_and_install_only_into_it():
    sessions = _nox_sessions()
    for venv, pip, nox in _opening_commands():
        # own site-packages only: with the system's visible, a nox already there leaves no .venv/bin/nox
        assert venv == VENV_LINE, "the first step makes .venv"
        # never the system pip (PEP 668 refuses it on Debian 13 / Ubuntu 24.04): the venv's own
        assert pip[:2] == [".venv/bin/pip", "install"]
        assert _nox_pin() in pip, f"README installs {pip}, pyproject's test extra pins {_nox_pin()}"
        assert pip[pip.index("-e") + 1] == "." and (REPO / "pyproject.toml").is_file()
        assert nox[0] == ".venv/bin/nox" and nox[1] == "-s" and nox[2] in sessions


def test_readme_reprostack_cli_is_declared_and_resolves():
    scripts = _pyproject()["project"]["scripts"]
    assert set(scripts) == {"reprostack"}
    module, func = scripts["reprostack"].split(":")
    assert (REPO / "src" / Path(*module.split("."))).with_suffix(".py").is_file()
    mod = __import__(module, fromlist=[func])
    assert callable(getattr(mod, func))


def test_readme_fenced_blocks_never_pip_install_into_the_system_python():
    blocks = re.findall(r"^```\w*\n(.*?)^```", README.read_text(), re.S | re.M)
    for block in blocks:
        for ln in block.splitlines():
            if re.search(r"\bpip3? install\b", ln):
                assert re.search(r"(^|&& )\.venv/bin/pip install\b", ln), f"README.md: system pip in {ln!r}"


def test_ci_run_uses_the_readme_venv_line_and_the_files_it_names_exist():
    ci = (REPO / ".ci" / "run").read_text()
    assert " ".join(VENV_LINE) in ci
    assert f".venv/bin/pip install --quiet {_nox_pin()} -e ." in ci
    assert ci.rstrip("\n").splitlines()[-1].split(" # ")[0].strip() == ".venv/bin/nox -s tests_all"  # README's command
    assert ".venv/bin/nox -s docs -- --check" in ci and ".venv/bin/nox -s verify_report -- -q" in ci  # issue 27
    code = "\n".join(ln.split(" # ")[0] for ln in ci.splitlines() if not ln.lstrip().startswith("#"))
    assert "pip install" not in code.replace(".venv/bin/pip install", ""), "pip install outside .venv"
    for path in re.findall(r"\btests/[\w./]+\.py\b", ci):
        assert (REPO / path).is_file(), f".ci/run names {path}, which does not exist"


def test_ci_run_refuses_an_unknown_argument_in_one_line():
    r = subprocess.run(["bash", str(REPO / ".ci" / "run"), "--bogus"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert r.stderr == ".ci/run: unknown argument '--bogus' (usage: .ci/run [setup])\n"


def test_aiperf_venv_that_cannot_be_made_is_one_line(tmp_path):
    # a real `python -m venv` that fails (its target is a file), as it does without Debian's python3-venv
    target = tmp_path / "venv"
    target.write_text("not a folder\n")
    with pytest.raises(GateError) as e:
        aiperftool._make_venv(sys.executable, target)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{sys.executable} -m venv {target} failed (exit 1): ")
    assert "Unable to create directory" in msg and "python3-venv" not in msg  # the hint is for ensurepip only
    assert target.read_text() == "not a folder\n"  # what was there is not ours to delete


def test_aiperf_with_a_base_python_that_does_not_exist_is_a_gate_error(tmp_path):
    missing = tmp_path / "no-python"
    with pytest.raises(GateError, match=r"cannot make the aiperf venv with .*no-python: No such file"):
        aiperftool.ensure_aiperf(load(REPO / "upstreams.lock"), tmp_path / "cache", REPO, base_python=str(missing))
    assert not any((tmp_path / "cache" / "tools").glob("aiperf-*/bin"))


def test_a_python_without_torch_names_the_setting_that_picks_another(tmp_path):
    # the venv of the README's commands on the H200, whose torch lives in /opt/torch/.venv: no torch there
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip("this interpreter holds torch")
    with pytest.raises(BuildError) as e:
        detect(sys.executable, arch="90")
    msg = str(e.value)
    assert msg.startswith(f"{sys.executable} cannot import torch (ModuleNotFoundError: ")
    assert "--python" in msg and "REPROSTACK_TORCH_PYTHON" in msg and "\n" not in msg


def test_the_tests_session_aiperf_step_fails_in_one_line(tmp_path):
    # `nox -s tests` runs `python -m reprostack.gates.aiperftool DIR` from the clone; here from a folder with no lock
    r = subprocess.run(
        [sys.executable, "-m", "reprostack.gates.aiperftool", str(tmp_path / "tools")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == "reprostack: error: upstreams.lock: (file): No such file or directory\n"
    assert not (tmp_path / "tools").exists()
    r = subprocess.run([sys.executable, "-m", "reprostack.gates.aiperftool", "a", "b"], capture_output=True, text=True)
    assert (r.returncode, r.stderr) == (
        2,
        "usage: python -m reprostack.gates.aiperftool [CACHE_ROOT]  (default: the reprostack cache, the gates' own)\n",
    )


def test_nox_finds_the_python_that_holds_torch(tmp_path, monkeypatch):
    """The README's nox runs from .venv (no torch); the gates need the GPU image's own Python: the first of nox's
    Python and the `python3` on PATH that imports torch, unless REPROSTACK_TORCH_PYTHON names one."""
    import sys

    noxfile = noxmod.load()
    site = tmp_path / "site" / "torch"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    torchy = bindir / "python3"
    torchy.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path / "site"} exec {sys.executable} "$@"\n')
    torchy.chmod(0o755)
    monkeypatch.delenv("REPROSTACK_TORCH_PYTHON", raising=False)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert noxfile.torch_python() == str(torchy)  # this venv has no torch, python3 on PATH has
    monkeypatch.setenv("REPROSTACK_TORCH_PYTHON", "/opt/x/python3")
    assert noxfile.torch_python() == "/opt/x/python3"


# ------------------------------------------------------------ issue 29 item 12: README pointers a new user follows


def test_every_python_file_the_readme_names_exists_where_it_says():
    """Issue 29 item 12: the README named `gates/registry.py` (there is a gates/ folder of specs at the root; the
    registry is src/reprostack/gates/registry.py). Every `path/to/file.py` in backticks must exist from the root."""
    named = set(re.findall(r"`([A-Za-z0-9_./-]+/[A-Za-z0-9_.-]+\.py)`", README.read_text()))
    assert "src/reprostack/gates/registry.py" in named
    for page in sorted((REPO / "docs").glob("*.md")):  # the pages the README moved out are held to it too
        named |= set(re.findall(r"`((?:src|scripts|tests|gates/drivers)/[A-Za-z0-9_./-]*\.py)`", page.read_text()))
    upstream = ("tests/elastic/", "tests/legacy/")  # DeepEP's own test files, in its tree, not this project's
    missing = sorted(n for n in named if not n.startswith(upstream) and not (REPO / n).is_file())
    assert not missing, f"README names files that are not there: {missing}"


def test_readme_lists_everything_ci_run_installs():
    """Issue 29 item 12: the README's `.ci/run` row listed 7 of the 11 packages it installs (no jq, debootstrap,
    slurm-wlm, munge) and neither the lint session nor Slurm. Each package .ci/run may install is named there."""
    ci = (REPO / ".ci" / "run").read_text()
    pkgs = set()
    for m in re.finditer(r"(?:need|lean)\+=\(([^)]*)\)", ci):
        pkgs |= {w for w in m.group(1).split() if not w.startswith(("$", '"'))}
    pkgs |= set(re.search(r"for tool in ([^;]+); do", ci).group(1).split())
    assert {"jq", "debootstrap", "slurm-wlm", "munge", "docker-registry", "python3-venv"} <= pkgs
    row = next(line for line in README.read_text().splitlines() if line.startswith("| `.ci/run` |"))
    assert not sorted(p for p in pkgs if p not in row), row
    assert "nox -s lint" in row and "Slurm" in row


def test_readme_k8s_example_renders_once_its_placeholders_are_replaced(tmp_path):
    """Issue 29 item 12: the README's EKS command named `...@sha256:DIGEST`, which the renderer refuses: it never
    rendered as printed and said nothing of what to replace. Now its first line says what to replace; as printed it
    is refused in one line that says why, and with the parts replaced it renders."""
    from reprostack.cli import main

    text = (REPO / "docs" / "clusters.md").read_text()  # moved from the README (issue 40)
    block = re.search(r"```bash\n(IMAGE=[^\n]*\n(?:.*\n)*?)```", text).group(1)
    first, *rest = block.splitlines()
    assert first.endswith("# replace ACCOUNT, REGION, DIGEST")
    image = first.split("=", 1)[1].split()[0]
    cmd = " ".join(line.rstrip("\\").strip() for line in rest[:3])
    argv = shlex.split(cmd.replace('"$IMAGE"', image))
    assert argv[:3] == ["reprostack", "launch", "k8s"] and argv[-1] == "--apply"
    argv = [a if a != "out/k8s/micro" else str(tmp_path / "k8s") for a in argv[1:-1]]  # render, never apply
    assert main(argv) == 2
    filled = image.replace("ACCOUNT", "123456789012").replace("REGION", "us-east-1").replace("DIGEST", "a" * 64)
    assert main([a if a != image else filled for a in argv]) == 0
    assert any((tmp_path / "k8s").iterdir())


# ------------------------------------------------------------ issue 29 item 13: every row names tests that exist


def _reliability_tests(text: str) -> list[tuple[str, str, str]]:
    """(row's first cell, test file, test name) for every test a docs/reliability.md table row names in its last
    cell: `test_x.py::test_y`, `tests/test_x.py::test_y`, then `test_z` / `::test_z` of the same file."""
    out = []
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith(("| input", "|---")):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        cur = None
        for f, t in re.findall(r"(?:tests/)?(test_[A-Za-z0-9_]+\.py)?(?:::)?(test_[A-Za-z0-9_]+)(?!\.py)", cells[-1]):
            cur = f or cur
            if cur:
                out.append((cells[0][:60], cur, t))
    return out


def test_every_test_docs_reliability_names_exists():
    """Issue 29 item 13: each case gets its row in docs/reliability.md and the test it names must exist (a row named
    `test_stack_image_recipe_refuses_the_wheel_nccl_of_gin_gdaki_in_one_line`, renamed long ago). Every row of the
    issue 29 section names at least one test."""
    text = (REPO / "docs" / "reliability.md").read_text()
    named = _reliability_tests(text)
    assert len(named) > 100
    missing = []
    for row, f, t in named:
        p = REPO / "tests" / f
        if not p.is_file() or not re.search(rf"^(?:async )?def {t}\(", p.read_text(), re.M):
            missing.append(f"{f}::{t} (row: {row})")
    assert not missing, "docs/reliability.md names tests that do not exist:\n" + "\n".join(missing)
    section = text[text.index("## Second adversarial pass and a new user's run (issue 29)") :]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
    rows = [l for l in section.splitlines() if l.startswith("| ") and not l.startswith("| input")]
    assert len(rows) >= 20 and all(_reliability_tests(r) for r in rows)


def test_nox_tests_spreads_the_files_over_two_workers_unless_told():
    """Issue 29 item 11: the README's `nox -s tests` runs the test files on 2 pytest-xdist workers, one file per worker
    at a time; $REPROSTACK_TEST_WORKERS picks another count (0: in one process), and posargs that pick their own
    (`-n 4`, `-p no:xdist`) are left alone; a bad count is one line, never a pytest run."""

    noxfile = noxmod.load()
    assert noxfile.xdist_args([], {}) == ["-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"]
    assert noxfile.xdist_args(["-q", "tests/test_ui.py"], {"REPROSTACK_TEST_WORKERS": "3"})[:2] == ["-n", "3"]
    assert noxfile.xdist_args([], {"REPROSTACK_TEST_WORKERS": "0"}) == []
    for own in (["-n", "4"], ["-n4"], ["--numprocesses=4"], ["-p", "no:xdist"]):
        assert noxfile.xdist_args(own, {}) == [], own
    for bad in ("two", "-1", "999"):
        with pytest.raises(SystemExit, match=rf"REPROSTACK_TEST_WORKERS='{bad}': not a number"):
            noxfile.xdist_args([], {"REPROSTACK_TEST_WORKERS": bad})
    assert "pytest-xdist==" in (REPO / "pyproject.toml").read_text()  # in the test extra: the session installs it


# ------------------------------------------------------------ issue 40: a README that starts with what this is


def test_readme_opens_with_what_and_for_whom_then_the_commands_contents_and_the_offline_path():
    """Issue 40 items 4, 7: the README was 529 lines, no "what is this" first, no table of contents, and the mirror
    instructions 137 lines down. Now: the title, one paragraph (what it is, who it is for), the two commands, a
    Contents section, then the offline path, all under 200 lines; the rest is in docs/."""
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) < 200, len(lines)
    assert lines[0] == "# reprostack" and lines[1] == ""
    para = text.split("\n\n")[1]
    assert "```" not in para and "DeepEP" in para and "EFA" in para and " is for " in para
    heads = [ln for ln in lines if ln.startswith("## ")]
    assert heads[:2] == ["## Contents", "## A GPU node without internet"], heads
    assert text.index("```bash") < text.index("## Contents") < text.index("## A GPU node without internet")
    assert lines.index("## A GPU node without internet") < 70


def test_the_offline_path_lists_every_git_pin_of_the_lock():
    """Issue 40 item 4: the README's pin list for mirrors lacked nccl-tests. It is now generated from the lock
    (`mirrors` block): every git pin and submodule URL is there, and in the REPROSTACK_MIRRORS line."""
    from reprostack.lock import load as load_lock

    text = README.read_text()
    section = text[text.index("## A GPU node without internet") : text.index("## Where things are")]
    lock = load_lock(REPO / "upstreams.lock")
    urls = [p.url for p in lock.upstreams.values() if getattr(p, "kind", "") == "git"]
    urls += [s.url for p in lock.upstreams.values() for s in getattr(p, "submodules", ()) or ()]
    assert "https://github.com/NVIDIA/nccl-tests" in urls
    mirrors = re.search(r'REPROSTACK_MIRRORS="([^"]+)"', section).group(1)
    for u in urls:
        assert f"| {u} |" in section and f"{u}=/srv/mirrors/" in mirrors, u


def test_every_link_of_the_readme_and_docs_resolves_and_the_index_lists_every_page():
    """Issue 40 item 7: everything moved out of the README is one link away: each relative link of the README and
    of docs/*.md names a file that exists, each `#anchor` of the README a heading of it, and docs/README.md lists
    every page of docs/."""
    pages = [README, *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            if path and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
            if not path and anchor:
                slugs = {
                    re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
                    for h in re.findall(r"^#+ (.+)$", page.read_text(), re.M)
                }
                if anchor not in slugs:
                    broken.append(f"{page.relative_to(REPO)}: #{anchor}")
    assert not broken, broken
    index = (REPO / "docs" / "README.md").read_text()
    missing = [p.name for p in (REPO / "docs").glob("*.md") if p.name != "README.md" and f"]({p.name})" not in index]
    assert not missing, missing
    assert "](docs/README.md)" in README.read_text()


def test_the_readme_says_how_to_verify_the_committed_runs_with_their_claims_files():
    """Issue 40 item 5: `verify` of the committed H200 runs needs claims/h200-ep1-*.yaml (its default is the
    campaign's claims/published.yaml); nothing said so. Every claims file is named with a run folder that exists."""
    text = README.read_text()
    for claims in sorted((REPO / "claims").glob("h200-ep1-*.yaml")):
        m = re.search(rf"reprostack verify (\S+) --claims claims/{claims.name}", text)
        assert m and (REPO / m.group(1)).is_dir(), claims.name
    assert "claims/published.yaml" in text and "verify-report" in text


def test_docs_say_gdaki_on_efa_once_and_images_start_with_the_chain():
    """Issue 40 items 6, 8: docs/campaign.md said "never IBGDA/GDAKI on EFA" while the gin-gdaki stack is GDAKI on
    EFA; docs/images.md skipped the `nox -s images` step that makes the base `reprostack build` needs."""
    for page in [README, *(REPO / "docs").glob("*.md")]:
        assert "never IBGDA/GDAKI on EFA" not in page.read_text(), page
    campaign = (REPO / "docs" / "campaign.md").read_text()
    assert "`gin-gdaki`" in campaign and "never IBGDA/GDAKI" in campaign
    images = (REPO / "docs" / "images.md").read_text()
    assert "nox -s images" in images and images.index("nox -s images") < images.index("reprostack build deepep")
