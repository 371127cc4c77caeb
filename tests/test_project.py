"""provenance.project (reprostack.project): the commit a run ran and whether its tree was dirty, from a real git
checkout or, in a copy without .git (the lent GPU machine), from a stamp whose files are hashed and compared here;
every new gate report records it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import gitrepos as gr
from reprostack import project
from reprostack.cli import main as cli_main
from test_gate_micro import gpu_less  # noqa: F401  (fixture: PATH without nvidia-smi)
from test_gate_training import training_project


def checkout(tmp_path: Path) -> tuple[Path, str]:
    repo = gr.init_repo(tmp_path / "p")
    rev = gr.commit_files(repo, {"a.txt": "a\n", "gates/x.yaml": "x: 1\n", "link": None}, "one")
    return repo, rev


def test_a_clean_checkout_is_its_head_and_a_change_makes_it_dirty(tmp_path):
    repo, rev = checkout(tmp_path)
    assert project.state(repo) == {"commit": rev, "dirty": False, "changed": [], "changed_count": 0, "source": "git"}
    (repo / "gates" / "x.yaml").write_text("x: 2\n")
    (repo / "new.yaml").write_text("new\n")  # untracked, not ignored: part of what ran
    got = project.state(repo)
    assert (got["commit"], got["dirty"], sorted(got["changed"]), got["changed_count"]) == (
        rev,
        True,
        ["gates/x.yaml", "new.yaml"],
        2,
    )
    sub = project.state(repo / "gates", environ={})  # inside a checkout but not its top: not this project's commit
    assert sub["commit"] is None and sub["source"] == "none" and "is not a git checkout" in sub["why"]


def stamp_of(repo: Path, to: Path) -> Path:
    text = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout
    text += subprocess.run(["git", "ls-tree", "-r", "HEAD"], cwd=repo, capture_output=True, text=True).stdout
    to.write_text(text)
    return to


def test_a_copy_without_git_takes_the_stamp_and_checks_every_file(tmp_path):
    repo, rev = checkout(tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(".git"))
    stamp = stamp_of(repo, tmp_path / "stamp.txt")
    env = {project.STAMP_ENV: str(stamp)}
    got = project.state(copy, environ=env)
    assert (got["commit"], got["dirty"], got["source"]) == (rev, False, f"stamp {stamp}")
    (copy / "a.txt").write_bytes(b"A\n")  # one byte changed
    (copy / "gates" / "x.yaml").unlink()
    got = project.state(copy, environ=env)
    assert (got["commit"], got["dirty"], sorted(got["changed"])) == (rev, True, ["a.txt", "gates/x.yaml"])
    assert project.state(copy, environ={})["commit"] is None  # no stamp: never a guessed commit


def test_a_named_stamp_wins_over_a_stale_git_the_copy_carries(tmp_path):
    """Seen on the lent H100: the machine's copy of the working tree carried a `.git` at the session's first commit,
    so every run there recorded that commit, dirty, with 301 files changed, though the stamp named the real one."""
    repo, old = checkout(tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(repo, copy)  # .git and all: HEAD is `old`
    new = gr.commit_files(repo, {"a.txt": "b\n"}, "two")
    (copy / "a.txt").write_text("b\n")  # the copy's files are the new commit's
    stamp = stamp_of(repo, tmp_path / "stamp.txt")
    got = project.state(copy, environ={project.STAMP_ENV: str(stamp)})
    assert (got["commit"], got["dirty"], got["source"]) == (new, False, f"stamp {stamp}") and new != old
    assert project.state(copy, environ={})["commit"] == old  # unnamed: git's word, as before


def test_a_hostile_stamp_never_gives_a_clean_commit(tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "a.txt").write_text("a\n")
    stamp = tmp_path / "s.txt"
    for text, why in (
        ("not-a-commit\n", "its first line is not a 40-hex commit id"),
        ("", "its first line is not a 40-hex commit id"),
    ):
        stamp.write_text(text)
        got = project.state(copy, environ={project.STAMP_ENV: str(stamp)})
        assert (got["commit"], got["dirty"], got["why"]) == (None, None, why)
    blob = project.blob_id(b"a\n")
    stamp.write_text(
        "a" * 40
        + f"\n100644 blob {blob}\ta.txt\n100644 blob {blob}\t../outside\ngarbage line\n100644 blob {blob}\t/etc/x\n"
    )
    got = project.state(copy, environ={project.STAMP_ENV: str(stamp)})
    assert got["dirty"] is True and got["changed"][0] == "../outside" and got["changed"][2] == "/etc/x"
    assert got["changed"][1].startswith("(stamp line not")
    got = project.state(copy, environ={project.STAMP_ENV: str(tmp_path / "none")})
    assert got["commit"] is None and got["why"].startswith("cannot read it")


def test_a_gate_report_records_the_commit_it_ran(tmp_path, gpu_less, monkeypatch):
    root, _ = training_project(tmp_path)
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "p"], check=True
    )
    head = gr.head(root)
    monkeypatch.chdir(root)
    args = ["--lock", str(root / "upstreams.lock"), "--cache", str(tmp_path / "cache")]
    assert cli_main(["gate", "megatron", *args, "--out", str(tmp_path / "o1")]) == 3  # a SKIP: no GPU here
    prov = json.loads((tmp_path / "o1" / "megatron.json").read_text())["provenance"]
    assert prov["project"] == {"commit": head, "dirty": False, "changed": [], "changed_count": 0, "source": "git"}
    spec = root / "gates" / "megatron.yaml"
    spec.write_text(spec.read_text() + "# edited\n")
    assert cli_main(["all-gates", *args, "--out", str(tmp_path / "o2")]) == 3
    for name in ("megatron", "nemo_rl"):
        prov = json.loads((tmp_path / "o2" / f"{name}.json").read_text())["provenance"]
        assert prov["project"]["dirty"] is True and prov["project"]["changed"] == ["gates/megatron.yaml"]
