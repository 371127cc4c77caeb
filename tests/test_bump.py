"""Bump: every outcome of a replay onto a new upstream revision, on real local git repos (no network)."""

from __future__ import annotations

import hashlib

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bumprepos import URL, Scenario, make
from reprostack import cli
from reprostack import lock as lockmod
from reprostack.bump import lockedit
from reprostack.errors import LockError
from reprostack.gitcmd import git
from reprostack.sources import FetchOptions, prepare


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Scenario:
    return make(tmp_path_factory.mktemp("bump"))


@pytest.fixture
def s(pristine, tmp_path, monkeypatch) -> Scenario:
    """A fresh copy of the scenario (the bump writes into the project), mirrors and cache set."""
    root = tmp_path / "s"
    shutil.copytree(pristine.up.parent, root, symlinks=True)
    sc = Scenario(up=root / "up", sub=root / "sub", project=root / "project", c=dict(pristine.c))
    monkeypatch.setenv("REPROSTACK_MIRRORS", sc.mirrors())
    monkeypatch.setenv("REPROSTACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(sc.project)
    return sc


def run(s: Scenario, *args: str) -> int:
    return cli.main(["bump", "demo", "--lock", str(s.lock), *args])


def snapshot(s: Scenario) -> dict[str, bytes]:
    return {
        str(p.relative_to(s.project)): p.read_bytes()
        for p in sorted(s.project.rglob("*"))
        if p.is_file() and ".git" not in p.parts and "out" not in p.parts
    }


def branches(s: Scenario) -> list[str]:
    return git("for-each-ref", "--format=%(refname:short)", "refs/heads", cwd=s.project).split()


def test_bump_kept_refreshed_upstreamed(s, capsys):
    old_text = s.lock.read_text()
    old_e = (s.project / "patches/demo/0002-e.patch").read_bytes()
    assert run(s) == 0
    out = capsys.readouterr().out
    assert "Roll demo" in out and "PR body:" in out

    data = json.loads((s.project / f"out/bump/demo-{s.c['main'][:8]}.json").read_text())
    outcomes = {e["position"]: e["outcome"] for e in data["entries"]}
    assert outcomes == {1: "kept", 2: "upstreamed", 3: "upstreamed", 4: "refreshed", 5: "refreshed", 6: "kept"}
    how = {e["position"]: e["detail"] for e in data["entries"]}
    assert how[2].startswith("reachable") and how[3].startswith("patch-id")
    assert data["entries"][2]["upstream_commit"] == s.c["p2r"]
    assert data["commits"] == 4 and data["status"] == "bumped"

    # the lock: new rev/tree/patched-tree, entries dropped, trees added, submodule moved; the rest kept
    lock = lockmod.load(s.lock)
    pin = lock.git("demo")
    assert (pin.rev, pin.tree) == (s.c["main"], s.tree(s.c["main"]))
    assert [e.kind for e in pin.patches] == ["cherry-pick", "mbox", "diff", "mbox"]
    assert all(e.tree for e in pin.patches) and pin.patches[-1].tree == pin.patched_tree
    assert pin.submodules[0].rev == s.c["s2"]
    assert pin.submodules[0].tree == git("rev-parse", f"{s.c['s2']}^{{tree}}", cwd=s.sub)
    assert pin.original == f"main @ 2023-11-24 ({s.c['main'][:8]})"
    new_text = s.lock.read_text()
    assert new_text.splitlines()[:4] == old_text.splitlines()[:4]  # header comment + `demo:   # ...`
    assert (
        new_text.split("  # another pin: never touched\n")[1] == old_text.split("  # another pin: never touched\n")[1]
    )
    assert "# flow style" in new_text and "# merged upstream after a rebase" not in new_text  # dropped with its entry
    assert lock.git("other").rev == s.c["base"]

    # refreshed files apply at offset 0 now; the kept file is untouched
    assert (s.project / "patches/demo/0002-e.patch").read_bytes() == old_e
    assert "@@ -29,7 +29,7 @@" in (s.project / "patches/demo/0001-c.patch").read_text()  # was -27
    # every patch file's `sha256:` is the file as written (the refreshed ones got their new sha256)
    files = [e for e in pin.patches if e.kind != "cherry-pick"]
    assert [e.sha256 for e in files] == [hashlib.sha256((s.project / e.value).read_bytes()).hexdigest() for e in files]
    assert files[-1].sha256 in old_text and files[0].sha256 not in old_text
    d = (s.project / "patches/demo/d.diff").read_text()
    assert d.startswith("# d: patch line 18\n#\n# Upstream-Status: Inappropriate [test only]\n") and "@@ -18,7" in d

    # the commit on a new branch: title, trailers, exactly the written files
    assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=s.project) == f"bump-demo-{s.c['main'][:8]}"
    msg = git("log", "-1", "--format=%B", cwd=s.project)
    assert msg.splitlines()[0] == f"Roll demo {s.c['base'][:8]}..{s.c['main'][:8]} (4 commits)"
    trailers = git("interpret-trailers", "--parse", cwd=s.project, input_bytes=msg.encode())
    assert f"Bump-Upstream: demo\nBump-Old-Rev: {s.c['base']}\nBump-New-Rev: {s.c['main']}" in trailers
    assert sorted(git("show", "--name-only", "--format=", "HEAD", cwd=s.project).split()) == [
        "patches/demo/0001-c.patch",
        "patches/demo/d.diff",
        "upstreams.lock",
    ]
    assert git("status", "--porcelain", "--untracked-files=no", cwd=s.project) == ""

    # the PR body
    body = (s.project / f"out/bump/demo-{s.c['main'][:8]}.md").read_text()
    assert f"{URL}/compare/{s.c['base']}...{s.c['main']}" in body
    for word in (
        "**kept**",
        "**refreshed**",
        "**upstreamed**",
        "```diff",
        "+    rev: " + s.c["main"],
        "nox -s bump -- demo",
        "Offset".lower(),
    ):
        assert word in body, word

    # the patch stage accepts the new lock as it is
    st = prepare(lockmod.load(s.lock), "demo", FetchOptions.make(), s.project)
    assert st.tree == pin.patched_tree
    assert (st.path / "c.txt").read_text().splitlines()[31] == "c30 patched"


def test_bump_end_to_end_reads_every_real_gate_spec(s, capsys):
    """The project holds the real gates/ (all six specs, each with its own schema) and kernels/ whose nccl recipe
    builds from `demo`: the bump's impact step loads every spec and names the gates that run those kernels."""
    root = Path(__file__).resolve().parent.parent
    shutil.copytree(root / "gates", s.project / "gates")
    shutil.copytree(root / "kernels", s.project / "kernels")
    nccl = s.project / "kernels" / "nccl.yaml"
    nccl.write_text(nccl.read_text().replace("\nsource: nccl\n", "\nsource: demo\n"))
    git("add", "-A", cwd=s.project)
    git("commit", "-q", "-m", "real gates and kernels", cwd=s.project)
    assert run(s) == 0, capsys.readouterr().err  # was exit 2: gates/megatron.yaml read with micro's schema
    new8 = s.c["main"][:8]
    body = (s.project / f"out/bump/demo-{new8}.md").read_text()
    assert "- gate `megatron`: `nox -s gate_megatron` (GPU)\n- gate `micro`: `nox -s gate_micro` (GPU)\n" in body
    assert "- kernels rebuilt by those gates: `deepep`, `nccl`" in body
    assert lockmod.load(s.lock).git("demo").rev == s.c["main"]
    assert branches(s) == [f"bump-demo-{new8}", "work"]


def test_bump_with_another_pin_holding_a_patch_file(s, capsys):
    """The bumped lock is validated whole, and the lock vouches for every pin's patch files: a bump of `demo` while
    `other` has a committed patch file must stage that file too (it failed "patch file ... not found" for every
    pin but megatron-lm on the real lock)."""
    own = s.project / "patches/other/0001-x.patch"
    own.parent.mkdir(parents=True)
    own.write_bytes((s.project / "patches/demo/0002-e.patch").read_bytes())
    sha = hashlib.sha256(own.read_bytes()).hexdigest()
    text = s.lock.read_text()
    tree = text.split("  other:", 1)[1].split("tree: ", 1)[1].split("\n", 1)[0]
    s.lock.write_text(
        text.rstrip("\n") + f"\n    patches:\n      - mbox: patches/other/0001-x.patch\n"
        f"        sha256: {sha}\n        upstream-status: Pending\n    patched-tree: {tree}\n"
    )
    git("add", "-A", cwd=s.project)
    git("commit", "-q", "-m", "other carries a patch file", cwd=s.project)
    assert run(s) == 0, capsys.readouterr().err
    assert lockmod.load(s.lock).git("demo").rev == s.c["main"]
    assert lockmod.load(s.lock).git("other").patches[0].value == "patches/other/0001-x.patch"


def test_conflict_writes_nothing_and_names_entry_files_hunks(s, capsys):
    before, heads = snapshot(s), branches(s)
    assert run(s, "--to", "rival") == 1
    err = capsys.readouterr().err
    assert f"#1 cherry-pick {s.c['p1'][:12]}" in err and "Submitted [PR #1]" in err
    assert "files: a.txt" in err and "hunks: a.txt:" in err and "nothing was written" in err
    assert snapshot(s) == before and branches(s) == heads
    assert git("status", "--porcelain", cwd=s.project) == ""
    body = (s.project / f"out/bump/demo-{s.c['rival'][:8]}.md").read_text()
    assert "**conflict**" in body and "Stopped at a conflict" in body and "rival: a5" in body
    assert "<<<<<<<" in body and "None: nothing was written." in body
    assert "**not-tried**" in body  # the entries after it


def test_conflict_in_a_patch_file_names_its_hunk(s, capsys):
    c = s.project / "patches/demo/0002-e.patch"
    # make the kept mbox collide with nothing upstream but with itself: apply it to the wrong file content
    git("checkout", "-q", "main", cwd=s.up)
    git("checkout", "-q", "-b", "etouch", cwd=s.up)
    (s.up / "e.txt").write_text("".join(f"E{i}\n" for i in range(1, 41)))
    git("commit", "-q", "-am", "rewrite e", cwd=s.up)
    before = snapshot(s)
    assert run(s, "--to", "etouch") == 1
    err = capsys.readouterr().err
    assert "#6 mbox patches/demo/0002-e.patch" in err and "files: e.txt" in err and "e.txt:7" in err
    assert snapshot(s) == before and c.exists()


def test_missing_policy_ref_is_a_lock_error(s, capsys):
    s.lock.write_text(
        s.lock.read_text().replace("{track: branch, ref: refs/heads/main}", "{track: branch, ref: refs/heads/gone}")
    )
    git("commit", "-qam", "policy gone", cwd=s.project)
    before = snapshot(s)
    assert run(s) == 2
    err = capsys.readouterr().err
    assert "upstreams.lock:31: upstreams.demo.policy: refs/heads/gone is not on https://github.com/acme/demo" in err
    assert snapshot(s) == before


def test_missing_to_ref(s, capsys):
    assert run(s, "--to", "nope") == 2
    assert "--to nope: neither refs/heads/nope nor refs/tags/nope" in capsys.readouterr().err


def test_moved_target_that_does_not_descend(s, capsys):
    # main force-pushed to a line that forked before the pinned base's successor: not a descendant
    git("checkout", "-q", "--orphan", "elsewhere", cwd=s.up)
    git("commit", "-q", "--allow-empty", "-m", "unrelated root", cwd=s.up)
    git("update-ref", "refs/heads/main", "HEAD", cwd=s.up)
    before = snapshot(s)
    assert run(s) == 2
    err = capsys.readouterr().err
    assert "does not descend from the pinned rev" in err and "force-pushed" in err
    assert snapshot(s) == before and branches(s) == ["work"]


def test_target_behind(s, capsys):
    assert run(s, "--no-commit") == 0
    git("commit", "-qam", "bumped", cwd=s.project)
    before = snapshot(s)
    assert run(s, "--to", s.c["bk"]) == 2
    assert "is behind the pinned rev" in capsys.readouterr().err
    assert snapshot(s) == before


def test_already_current(s, capsys):
    assert run(s, "--to", s.c["base"]) == 0
    assert "already at" in capsys.readouterr().out
    assert branches(s) == ["work"]


def test_dirty_lock_refused(s, capsys):
    s.lock.write_text(s.lock.read_text() + "# local edit\n")
    before = snapshot(s)
    assert run(s) == 2
    assert "uncommitted changes" in capsys.readouterr().err
    assert snapshot(s) == before and branches(s) == ["work"]


def test_no_commit_writes_files_only(s):
    assert run(s, "--no-commit") == 0
    assert branches(s) == ["work"]
    assert lockmod.load(s.lock).git("demo").rev == s.c["main"]


def test_tag_policy_takes_newest_version(s, capsys):
    for t, rev in (("v1.2", s.c["bk"]), ("v1.10", s.c["shift"]), ("v1.9", s.c["p2r"]), ("x2.0", s.c["main"])):
        git("tag", t, rev, cwd=s.up)
    s.lock.write_text(
        s.lock.read_text().replace("{track: branch, ref: refs/heads/main}", '{track: tag, pattern: "v1.*"}')
    )
    git("commit", "-qam", "track tags", cwd=s.project)
    assert run(s, "--no-commit") == 0
    pin = lockmod.load(s.lock).git("demo")
    assert pin.rev == s.c["shift"] and pin.original == "v1.10"
    assert pin.submodules[0].rev == s.c["s1"]  # gitlink not moved yet at v1.10


def test_pr_policy_tracks_the_pr_head(s):
    s.lock.write_text(s.lock.read_text().replace("{track: branch, ref: refs/heads/main}", "{track: pr, number: 1}"))
    git("commit", "-qam", "track PR 1", cwd=s.project)
    assert run(s, "--no-commit") == 0
    data = json.loads((s.project / f"out/bump/demo-{s.c['p1'][:8]}.json").read_text())
    assert data["new_rev"] == s.c["p1"] and data["target"]["ref"] == "refs/pull/1/head"
    assert [e["outcome"] for e in data["entries"]] == ["upstreamed", "kept", "kept", "kept", "kept", "kept"]


def test_outdated_table_and_json(s, capsys):
    out = s.project / "od"
    assert cli.main(["outdated", "demo", "--lock", str(s.lock), "--json", "--out", str(out)]) == 0
    rows = json.loads(capsys.readouterr().out)["pins"]
    assert rows == json.loads((out / "outdated.json").read_text())["pins"]
    (r,) = rows
    assert (r["pin"], r["commits"], r["days"], r["target"], r["target_ref"]) == (
        "demo",
        4,
        10,
        s.c["main"],
        "refs/heads/main",
    )
    assert cli.main(["outdated", "demo", "--lock", str(s.lock), "--out", str(out)]) == 0
    table = capsys.readouterr().out
    demo = next(l for l in table.splitlines() if l.startswith("demo "))
    assert demo.split()[-2:] == ["4", "10"]


def test_outdated_reports_an_unreachable_pin_in_its_row(s, capsys):
    rc = cli.main(["outdated", "--lock", str(s.lock), "--json", "--out", str(s.project / "od")])
    rows = {r["pin"]: r for r in json.loads(capsys.readouterr().out)["pins"]}
    assert rc == 2 and rows["demo"]["commits"] == 4
    assert rows["other"]["commits"] is None and "example.invalid" in rows["other"]["error"]
    # the table names the row; the whole error follows it (a table cell cut it to 12 characters)
    rc = cli.main(["outdated", "--lock", str(s.lock), "--out", str(s.project / "od")])
    out, err = capsys.readouterr()
    assert rc == 2 and "error (below)" in out
    assert f"other: error: {rows['other']['error'].removeprefix('other: ')}" in err  # the pin named once
    assert cli.main(["outdated", "--lock", str(s.lock), "--offline"]) == 2  # it would have asked the network
    assert "cannot run --offline" in capsys.readouterr().err


def test_outdated_off_a_terminal_is_plain_whole_and_names_the_pin_once(s, capsys, monkeypatch):
    """Issue 29 item 9: under `CI=1 NO_COLOR=1 reprostack outdated | cat` the rich table cut its target column (80
    columns) and drew box characters, and an error row's line said the pin twice (`other: error: other: cannot ...`).
    Now off a terminal the table is plain text with every cell whole, and the pin is named once."""
    monkeypatch.setenv("CI", "1")
    monkeypatch.setenv("NO_COLOR", "1")
    long_policy = "{track: branch, ref: refs/heads/main}"
    assert long_policy in s.lock.read_text()
    rc = cli.main(["outdated", "--lock", str(s.lock), "--out", str(s.project / "od")])
    out, err = capsys.readouterr()
    assert rc == 2
    assert not set(out) & set("│┃━─┏┓┗┛┡┩└┘╇"), out
    lines = out.splitlines()
    assert lines[0] == "upstreams behind their policy target"
    assert lines[1].split() == ["pin", "policy", "pinned", "target", "commits", "days"]
    demo = next(l for l in lines if l.startswith("demo "))
    assert f"{s.c['main'][:12]} (refs/heads/main)" in demo and demo.split()[-2:] == ["4", "10"]
    assert "branch refs/heads/main" in demo
    (line,) = err.strip().splitlines()
    assert line.startswith("other: error: cannot read HEAD of https://example.invalid/other: "), line


# ------------------------------------------------------------------------------------------ lockedit


LOCK = """\
# head
lockfile-version: 1
upstreams:
  x:
    kind: git
    url: u   # keep me
    original: "old (PR #1)"
    rev: %(a)s  # rev comment
    tree: %(b)s
    fetch-refs:
      - refs/tags/v1
    patches:
      - {cherry-pick: %(a)s, upstream-status: Pending}   # one
      - cherry-pick: %(b)s
        upstream-status: Pending
        # a comment inside the entry
      - {cherry-pick: %(c)s, upstream-status: Pending, tree: %(c)s}
    patched-tree: %(c)s
  y:
    kind: git
    url: v
    rev: %(a)s
    tree: %(b)s
""" % {"a": "a" * 40, "b": "b" * 40, "c": "c" * 40}


def test_lockedit_block_and_flow_entries_keep_comments():
    new = lockedit.edit_pin(
        LOCK,
        "x",
        lockedit.PinEdit(
            rev="1" * 39 + "f",
            tree="2" * 40,
            original="main @ 2026-01-01 (11111111)",
            fetch_refs=("refs/tags/v2",),
            series=["d" * 40, None, "e" * 40],
            patched_tree="e" * 40,
        ),
    )
    assert "    rev: " + "1" * 39 + "f  # rev comment\n" in new
    assert '    tree: "' + "2" * 40 + '"\n' in new  # all digits: quoted, still a string
    assert '    original: "main @ 2026-01-01 (11111111)"\n' in new
    assert "    fetch-refs: [refs/tags/v2]\n" in new
    assert "      - {cherry-pick: %s, upstream-status: Pending, tree: %s}   # one\n" % ("a" * 40, "d" * 40) in new
    assert "b" * 40 + "\n        upstream-status" not in new and "a comment inside the entry" not in new
    assert "tree: %s}" % ("e" * 40) in new and "    patched-tree: " + "e" * 40 in new
    assert new.endswith(LOCK[LOCK.index("  y:") :]) and new.startswith("# head\n")


def test_lockedit_all_entries_upstreamed_removes_the_series():
    new = lockedit.edit_pin(LOCK, "x", lockedit.PinEdit(rev="f" * 40, tree="e" * 40, series=[None, None, None]))
    assert "patches:" not in new and "patched-tree" not in new and "cherry-pick" not in new
    assert "  y:\n" in new


def test_lockedit_refuses_a_flow_series():
    text = LOCK.replace(
        "    patches:\n      - {cherry-pick: %s, upstream-status: Pending}   # one\n" % ("a" * 40),
        "    patches: [{cherry-pick: %s, upstream-status: Pending}]\n      # x\n" % ("a" * 40),
    )
    text = text[: text.index("      - cherry-pick")] + text[text.index("    patched-tree") :]
    with pytest.raises(LockError, match=r"upstreams\.x\.patches: a flow-style series"):
        lockedit.edit_pin(
            text, "x", lockedit.PinEdit(rev="f" * 40, tree="e" * 40, series=["1" * 40], patched_tree="1" * 40)
        )


@pytest.mark.parametrize(
    "policy,msg",
    [
        ("{track: tag}", "'pattern' is a required property"),
        ("{track: nightly}", "'nightly' is not one of"),
        ("{track: branch, ref: main}", "does not match"),
        ("{track: pr, number: 0}", "less than the minimum"),
    ],
)
def test_policy_schema_errors_name_the_line(tmp_path, policy, msg):
    p = tmp_path / "upstreams.lock"
    p.write_text(LOCK.replace("    patched-tree:", f"    policy: {policy}\n    patched-tree:"))
    with pytest.raises(LockError, match=msg) as ei:
        lockmod.load(p)
    assert ":18: upstreams.x.policy" in str(ei.value)


# ------------------------------------------------------------------------------------------ workflow


WORKFLOW = Path(__file__).resolve().parent.parent / ".github" / "workflows" / "bump.yml"


def check_workflow(path: Path) -> subprocess.CompletedProcess:
    """check-jsonschema (pinned in the `test` extra) against its vendored GitHub workflow schema; no network."""
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_bump_workflow_syntax_is_valid_and_a_broken_one_is_caught(tmp_path):
    ok = check_workflow(WORKFLOW)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = tmp_path / "bump.yml"
    bad.write_text(WORKFLOW.read_text().replace("    timeout-minutes: 45\n", "    timeout-minutes: soon\n"))
    got = check_workflow(bad)
    assert got.returncode == 1 and "'soon' is not of type 'number'" in got.stdout


def test_bump_workflow_opens_one_pr_per_outdated_pin(s, capsys):
    wf = yaml.safe_load(WORKFLOW.read_text())
    assert wf[True]["schedule"] and "workflow_dispatch" in wf[True]  # YAML 1.1 reads the key `on` as True
    outdated, bump = wf["jobs"]["outdated"], wf["jobs"]["bump"]
    step = next(st for st in outdated["steps"] if st.get("id") == "outdated")
    assert "nox -s outdated -- --json --out out/bump" in step["run"]
    assert bump["needs"] == "outdated"
    assert bump["strategy"]["matrix"]["upstream"] == "${{ fromJSON(needs.outdated.outputs.pins) }}"
    assert any('nox -s bump -- "$PIN"' in st.get("run", "") for st in bump["steps"])
    assert any('--body-file "${SUMMARY%.json}.md"' in st.get("run", "") for st in bump["steps"])
    uses = [st["uses"] for job in wf["jobs"].values() for st in job["steps"] if "uses" in st]
    assert len(uses) == 4 and all(re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", u) for u in uses), uses
    # the workflow's own jq filter on a real outdated.json: demo is 4 commits behind, `other` is unreachable
    cli.main(["outdated", "--lock", str(s.lock), "--json", "--out", str(s.project / "out/bump")])
    capsys.readouterr()
    (flt,) = re.findall(r"jq -c '([^']+)' out/bump/outdated.json", step["run"])
    jq = shutil.which("jq")
    if jq is None:
        pytest.skip("jq is not installed (GitHub's runners have it)")
    got = subprocess.run([jq, "-c", flt, str(s.project / "out/bump/outdated.json")], capture_output=True, text=True)
    assert (got.returncode, got.stdout) == (0, '["demo"]\n')


# ----------------------------------------------------- issue 29 item 7: bumps keep tied pins in step or say so


def _tie_demo_to_a_wheel(s: Scenario) -> None:
    """demo pinned at its release tag v1.2.3-1 (tagged at base, v1.2.4-1 at main), a kernel recipe built from demo
    that names the wheel pin `demo-wheel` (demo-lib 1.2.3) as its stand-in, and a wheelset that overrides demo-lib
    at 1.2.3: the shape of the real lock's nccl, nccl-wheel and substrate-wheels."""
    git("tag", "v1.2.3-1", s.c["base"], cwd=s.up)
    git("tag", "v1.2.4-1", s.c["main"], cwd=s.up)
    sha = "ab" * 32
    text = s.lock.read_text().replace(
        "    original: base\n", "    original: v1.2.3-1\n    fetch-refs: [refs/tags/v1.2.3-1]\n"
    )
    text += f"""\
  demo-wheel:
    kind: wheel
    name: demo-lib
    version: "1.2.3"
    files:
      - filename: demo_lib-1.2.3-py3-none-any.whl
        sha256: {sha}
  app-wheels:
    kind: wheelset
    python-version: "3.10"
    platform-tags: [manylinux_2_28_x86_64]
    requirements: [demo-app==1.0]
    overrides: [demo-lib==1.2.3]
    files:
      - {{name: demo-app, version: "1.0", filename: demo_app-1.0-py3-none-any.whl, sha256: {"cd" * 32}}}
      - {{name: demo-lib, version: "1.2.3", filename: demo_lib-1.2.3-py3-none-any.whl, sha256: {sha}}}
"""
    s.lock.write_text(text)
    (s.project / "kernels").mkdir()
    (s.project / "kernels" / "demo.yaml").write_text(
        "component: demo\nsource: demo\nmake:\n  targets: [all]\nwheel: demo-wheel\n"
    )
    git("add", "-A", cwd=s.project)
    git("commit", "-qm", "demo at its release, with its wheel", cwd=s.project)


def test_a_bump_names_the_tied_pins_it_leaves_behind_and_the_command_that_follows(s, capsys):
    """Issue 29 item 7: `bump nccl` moved the git pin to 2.30.5 and left `nccl-wheel` (and the wheelset's override)
    at 2.30.4 without a word, so the gates silently lost the wheel fast path. Now the bump output, its JSON and the
    PR body name each tied pin left behind, why, and the command that moves it."""
    _tie_demo_to_a_wheel(s)
    assert lockmod.load(s.lock).git("demo").original == "v1.2.3-1"
    assert run(s, "--to", "v1.2.4-1", "--no-commit") == 0
    out = capsys.readouterr().out
    wheel = (
        "left behind: demo-wheel (demo-lib 1.2.3): the wheel of demo's release 1.2.3 (kernels/demo.yaml: wheel: "
        "demo-wheel), now 1.2.4: until it moves the gates build demo from source instead of unpacking the wheel; "
        'follow with: set upstreams.demo-wheel.version to "1.2.4", then `reprostack lock wheels demo-wheel`'
    )
    wheelset = (
        "left behind: app-wheels (overrides: demo-lib==1.2.3): pins demo-lib at demo's old release 1.2.3, like "
        "demo-wheel; follow with: set demo-lib==1.2.4 in upstreams.app-wheels.overrides, then `reprostack lock wheels "
        "app-wheels`"
    )
    assert wheel in out.splitlines() and wheelset in out.splitlines()
    new = lockmod.load(s.lock)
    assert new.git("demo").original == "v1.2.4-1" and new.upstreams["demo-wheel"].version == "1.2.3"
    md = (s.project / f"out/bump/demo-{s.c['main'][:8]}.md").read_text()
    assert "### Pins left behind" in md and "`reprostack lock wheels demo-wheel`" in md
    assert "`reprostack lock wheels app-wheels`" in md
    data = json.loads((s.project / f"out/bump/demo-{s.c['main'][:8]}.json").read_text())
    assert [lb["pin"] for lb in data["left_behind"]] == ["demo-wheel", "app-wheels"]


def test_a_bump_without_a_tied_pin_says_nothing_of_one(s, capsys):
    """A pin whose release no wheel stands in for (the demo lock as it is) leaves nothing behind."""
    assert run(s, "--no-commit") == 0
    assert "left behind" not in capsys.readouterr().out
