"""Patch stage: zero fuzz, all-or-nothing, tree verified — on real git repos in tmp_path, no network."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from patchrepos import SHA256, Upstream, diff_bytes, format_patch, make_upstream, pick, pin_of, worktree_at, write_patch
from reprostack.errors import PatchError
from reprostack.gitcmd import GitFailed, git
from reprostack.lock import PatchEntry
from reprostack.patch import PatchHeader, SeriesError, SeriesResult, apply_series, check_patch_headers, check_series


@pytest.fixture(scope="module")
def up(tmp_path_factory) -> Upstream:
    return make_upstream(tmp_path_factory.mktemp("up"))


@pytest.fixture
def ws(tmp_path, up):
    """(src work tree at base, project root, out folder where dest goes)."""
    src = worktree_at(up, up["base"], tmp_path / "src")
    project = tmp_path / "project"
    project.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    return src, project, out


def leftovers(out: Path) -> list[str]:
    return sorted(os.listdir(out))


def entry(kind: str, value: str, status: str, tree: str | None = None) -> PatchEntry:
    """A file entry vouching for the bytes `write_patch` wrote at `value` (a lock's `sha256:`)."""
    return PatchEntry(
        kind=kind,
        value=value,
        upstream_status=status,
        description=f"{kind} {value}",
        tree=tree,
        sha256=SHA256.get(value),
        where=f"upstreams.lock:{10 + len(value)}",
    )


def plain_diff(comment: str, body: bytes) -> bytes:
    return comment.encode() + b"\n" + body


# ---------------------------------------------------------------- cherry-pick


def test_clean_cherry_pick_series(up, ws):
    src, project, out = ws
    pin = pin_of(
        up, [pick(up["f1"], tree=up.tree("f1")), pick(up["f2"]), pick(up["f3"], tree=up.tree("f3"))], up.tree("f3")
    )
    res = apply_series(pin, src, out / "dest", project)
    assert isinstance(res, SeriesResult)
    assert res.tree == up.tree("f3")  # reference application: the upstream's own linear history
    assert res.base_rev == up["base"] and res.base_tree == up.tree("base")
    assert [e.tree for e in res.entries] == [up.tree("f1"), up.tree("f2"), up.tree("f3")]
    assert [e.label for e in res.entries][0] == f"#1 of 3 cherry-pick {up['f1'][:12]}"
    assert leftovers(out) == ["dest"]
    dest = out / "dest"
    assert (dest / "a.txt").read_text().splitlines()[14] == "line 15 changed by f3"
    assert git("rev-parse", "HEAD^{tree}", cwd=dest) == res.tree
    assert git("status", "--porcelain", cwd=dest) == ""
    assert git("rev-parse", "refs/reprostack/base", cwd=dest) == up["base"]
    assert "(cherry picked from commit " + up["f1"] in git("log", "--format=%B", "-n1", res.entries[0].commit, cwd=dest)
    # Reproducible: the same series gives the same commit ids.
    again = apply_series(pin, src, out / "dest2", project)
    assert again.head == res.head and [e.commit for e in again.entries] == [e.commit for e in res.entries]


def test_conflicting_cherry_pick_names_entry_file_and_bases(up, ws):
    src, project, out = ws
    pin = pin_of(up, [pick(up["f1"]), pick(up["r2"], status="Submitted [PR #9]"), pick(up["f3"])], up.tree("f3"))
    with pytest.raises(PatchError) as ei:
        apply_series(pin, src, out / "dest", project)
    msg = str(ei.value)
    assert f"#2 of 3 cherry-pick {up['r2'][:12]}" in msg
    assert "Upstream-Status: Submitted [PR #9]" in msg
    assert "demo:" in msg and "conflict" in msg
    assert "a.txt" in msg and "a.txt:3-7 (conflict)" in msg
    assert f"pinned base {up['base']}" in msg
    f1_applied = msg.split("actual base ")[1].split()[0]
    assert f1_applied != up["base"]  # the base for #2 is HEAD after #1
    assert f"the commit's own parent is {up['base']}" in msg
    assert isinstance(ei.value, SeriesError) and ei.value.position == 2 and ei.value.files == ("a.txt",)
    assert leftovers(out) == []  # dest absent, scratch cleaned
    assert git("status", "--porcelain", cwd=src) == ""  # src untouched


def test_empty_cherry_pick_is_an_error(up, ws):
    src, project, out = ws
    pin = pin_of(up, [pick(up["f1"]), pick(up["f1"])], up.tree("f1"))
    with pytest.raises(PatchError, match=r"#2 of 2 cherry-pick .*already in the base"):
        apply_series(pin, src, out / "dest", project)
    assert leftovers(out) == []


def test_missing_commit_and_merge_commit_fail_precheck_together(up, ws):
    src, project, out = ws
    pin = pin_of(up, [pick("0" * 39 + "1"), pick(up["merge"]), pick(up["f1"])], up.tree("f1"))
    with pytest.raises(SeriesError) as ei:
        apply_series(pin, src, out / "dest", project)
    msg = str(ei.value)
    assert "nothing was applied" in msg
    assert "#1 of 3 cherry-pick 000000000000" in msg and "not in the object db" in msg
    assert "#2 of 3" in msg and "merge commit" in msg
    assert len(ei.value.problems) == 2
    assert leftovers(out) == []


def test_dest_must_not_exist(up, ws):
    src, project, out = ws
    (out / "dest").mkdir()
    with pytest.raises(PatchError, match="already exists"):
        apply_series(pin_of(up, [pick(up["f1"])], up.tree("f1")), src, out / "dest", project)


# ---------------------------------------------------------------- committed patch files


def test_crlf_file_patched_through_mbox_keeps_crlf(up, ws, tmp_path):
    src, project, out = ws
    mbox = format_patch(up, up["c1"])
    assert b"TWO\r\n" in mbox
    value = write_patch(project, "0001-crlf.patch", mbox)
    pin = pin_of(up, [entry("mbox", value, "Inappropriate [test only]")], up.tree("c1"))
    res = apply_series(pin, src, out / "dest", project)
    assert res.tree == up.tree("c1")
    assert (out / "dest" / "crlf.txt").read_bytes() == b"one\r\nTWO\r\nthree\r\n"
    # The test means something: without --keep-cr git am strips the CRs and the patch does not apply.
    plain = worktree_at(up, up["base"], tmp_path / "plain")
    with pytest.raises(GitFailed):
        git("am", "--no-keep-cr", str(project / value), cwd=plain)


def test_plain_diff_and_mbox_both_apply(up, ws):
    src, project, out = ws
    d = write_patch(
        project,
        "0001-f1.diff",
        plain_diff("# Change line 3 of a.txt.\n#\n# Upstream-Status: Pending\n", diff_bytes(up, up["base"], up["f1"])),
    )
    m = write_patch(project, "0002-f2.patch", format_patch(up, up["f2"]))
    pin = pin_of(
        up, [entry("diff", d, "Pending", tree=up.tree("f1")), entry("mbox", m, "Submitted [PR #2]")], up.tree("f2")
    )
    res = apply_series(pin, src, out / "dest", project)
    assert res.tree == up.tree("f2")
    assert [e.kind for e in res.entries] == ["diff", "mbox"]
    log = git("log", "--format=%s|%an", "-n2", cwd=out / "dest").splitlines()
    assert log == ["f2: extend b|reprostack", "Change line 3 of a.txt.|reprostack"]
    assert "Upstream-Status: Pending" in git("log", "--format=%B", "-n1", res.entries[0].commit, cwd=out / "dest")


def test_unified_diff_without_git_header_applies(up, ws):
    src, project, out = ws
    body = diff_bytes(up, up["base"], up["f1"]).decode()
    body = body[body.index("--- a/") :]  # a `diff -u`-style patch: no `diff --git`/`index` lines
    d = write_patch(project, "0001-f1.diff", plain_diff("Change line 3.\n\nUpstream-Status: Pending\n", body.encode()))
    res = apply_series(pin_of(up, [entry("diff", d, "Pending")], up.tree("f1")), src, out / "dest", project)
    assert res.tree == up.tree("f1")


def test_hunk_needing_fuzz_fails(up, ws, tmp_path):
    src, project, out = ws
    body = diff_bytes(up, up["base"], up["f1"]).decode()
    assert " line 5\n" in body
    body = body.replace(" line 5\n", " line five\n")  # one context line no longer matches the base
    d = write_patch(project, "0001-fuzzy.diff", plain_diff("Fuzzy.\n\nUpstream-Status: Pending\n", body.encode()))
    pin = pin_of(up, [pick(up["f2"]), entry("diff", d, "Pending")], up.tree("f2"))
    with pytest.raises(SeriesError) as ei:
        apply_series(pin, src, out / "dest", project)
    msg = str(ei.value)
    assert "#2 of 2 diff patches/0001-fuzzy.diff" in msg and "zero fuzz" in msg
    assert "a.txt:1 (hunk @@ -1,6 +1,6 @@)" in msg
    assert "error: patch failed: a.txt:1" in msg
    assert ei.value.files == ("a.txt",)
    assert leftovers(out) == []
    # The test means something: with reduced context (fuzz) the same hunk does apply.
    other = worktree_at(up, up["base"], tmp_path / "fuzz")
    git("apply", "-C1", str(project / d), cwd=other)


def test_binary_hunk_without_full_index_fails_before_applying(up, ws):
    src, project, out = ws
    body = diff_bytes(up, up["base"], up["bin1"], "--binary").decode()
    full = body.split("\n")[1]
    assert full.startswith("index ") and len(full.split()[1]) == 82
    a, b = full.split()[1].split("..")
    short = body.replace(full, f"index {a[:7]}..{b[:7]} 100644")
    d = write_patch(project, "0001-bin.diff", plain_diff("Reverse data.\n\nUpstream-Status: Pending\n", short.encode()))
    pin = pin_of(up, [pick(up["f1"]), entry("diff", d, "Pending")], up.tree("bin1"))
    with pytest.raises(SeriesError) as ei:
        apply_series(pin, src, out / "dest", project)
    msg = str(ei.value)
    assert "nothing was applied" in msg
    assert "#2 of 2 diff patches/0001-bin.diff" in msg
    assert "binary hunk for data.bin" in msg and "without full index line" in msg and "--full-index" in msg
    assert leftovers(out) == []


def test_binary_hunk_with_full_index_applies(up, ws):
    src, project, out = ws
    d = write_patch(
        project,
        "0001-bin.diff",
        plain_diff("Reverse data.\n\nUpstream-Status: Pending\n", diff_bytes(up, up["base"], up["bin1"], "--binary")),
    )
    res = apply_series(pin_of(up, [entry("diff", d, "Pending")], up.tree("bin1")), src, out / "dest", project)
    assert res.tree == up.tree("bin1")


def test_binary_apply_failure_is_named(up, ws, monkeypatch):
    # Should an abbreviated binary hunk get past the pre-check, git's own message comes through, named.
    import reprostack.patch.precheck as precheck_mod

    src, project, out = ws
    body = diff_bytes(up, up["base"], up["bin1"], "--binary").decode()
    full = body.split("\n")[1]
    a, b = full.split()[1].split("..")
    d = write_patch(
        project,
        "0001-bin.diff",
        plain_diff(
            "Reverse data.\n\nUpstream-Status: Pending\n", body.replace(full, f"index {a[:7]}..{b[:7]} 100644").encode()
        ),
    )
    monkeypatch.setattr(precheck_mod, "_abbreviated_binary", lambda text: [])
    with pytest.raises(SeriesError) as ei:
        apply_series(pin_of(up, [entry("diff", d, "Pending")], up.tree("bin1")), src, out / "dest", project)
    assert "cannot apply binary patch to 'data.bin' without full index line" in str(ei.value)
    assert ei.value.files == ("data.bin",)
    assert leftovers(out) == []


def test_patch_file_without_upstream_status_fails_before_anything(up, ws, monkeypatch):
    import reprostack.patch.apply as apply_mod

    src, project, out = ws
    d = write_patch(project, "0002-nostatus.diff", plain_diff("Change line 15.\n", diff_bytes(up, up["f1"], up["f3"])))
    pin = pin_of(up, [pick(up["f1"]), entry("diff", d, "Pending")], up.tree("f3"))
    made = []
    monkeypatch.setattr(apply_mod.tempfile, "mkdtemp", lambda *a, **k: made.append(1) or pytest.fail("scratch made"))
    with pytest.raises(SeriesError) as ei:
        apply_series(pin, src, out / "dest", project)
    msg = str(ei.value)
    assert "nothing was applied" in msg
    assert str(project / d) in msg and "no `Upstream-Status:` header" in msg and "#2 of 2" in msg
    assert not made and leftovers(out) == []


def test_lock_status_must_equal_file_header(up, ws):
    src, project, out = ws
    m = write_patch(project, "0002-f2.patch", format_patch(up, up["f2"]))
    pin = pin_of(up, [pick(up["f1"]), entry("mbox", m, "Pending")], up.tree("f2"))
    with pytest.raises(SeriesError, match=r"says `Upstream-Status: Submitted \[PR #2\]` but the lock says 'Pending'"):
        check_series(pin, src, project)
    with pytest.raises(SeriesError):
        apply_series(pin, src, out / "dest", project)
    assert leftovers(out) == []


def test_mbox_without_status_in_body(up, ws):
    src, project, out = ws
    m = write_patch(project, "0003-f3.patch", format_patch(up, up["f3"]))
    with pytest.raises(PatchError, match=r"0003-f3.patch: no `Upstream-Status:` header in the commit message body"):
        check_patch_headers(project / m)


# ---------------------------------------------------------------- tree verification


def test_wrong_final_patched_tree(up, ws):
    src, project, out = ws
    pin = pin_of(up, [pick(up["f1"]), pick(up["f2"])], up.tree("f3"))  # f3's tree is not f1+f2's
    with pytest.raises(SeriesError) as ei:
        apply_series(pin, src, out / "dest", project)
    msg = str(ei.value)
    assert f"expected tree {up.tree('f3')}" in msg and f"actual tree {up.tree('f2')}" in msg
    assert "M\ta.txt" in msg  # what differs, since the expected tree is in the object db
    assert ei.value.expected_tree == up.tree("f3") and ei.value.actual_tree == up.tree("f2")
    assert leftovers(out) == []


def test_entry_tree_checkpoint_mismatch_is_named(up, ws):
    src, project, out = ws
    pin = pin_of(up, [pick(up["f1"]), pick(up["f2"], tree=up.tree("f1")), pick(up["f3"])], up.tree("f3"))
    with pytest.raises(SeriesError) as ei:
        apply_series(pin, src, out / "dest", project)
    msg = str(ei.value)
    assert f"#2 of 3 cherry-pick {up['f2'][:12]}" in msg and "tree checkpoint mismatch" in msg
    assert f"expected tree {up.tree('f1')}, actual tree {up.tree('f2')}" in msg
    assert ei.value.position == 2 and ei.value.actual_tree == up.tree("f2")
    assert leftovers(out) == []


def test_base_tree_must_match_pin(up, ws):
    src, project, out = ws
    pin = pin_of(up, [pick(up["f1"])], up.tree("f1"))
    pin = type(pin)(**{**pin.__dict__, "tree": up.tree("f1")})
    with pytest.raises(SeriesError, match=f"pinned base {up['base']} has tree {up.tree('base')}"):
        apply_series(pin, src, out / "dest", project)


def test_empty_series_checks_out_the_base(up, ws):
    src, project, out = ws
    res = apply_series(pin_of(up, [], None), src, out / "dest", project)
    assert res.tree == up.tree("base") and res.entries == [] and (out / "dest" / "a.txt").is_file()


# ---------------------------------------------------------------- headers


@pytest.mark.parametrize(
    "comment, status, description",
    [
        (
            "# Fix the thing\n# in two lines.\n#\n# Upstream-Status: Backport [abc123]\n",
            "Backport [abc123]",
            "Fix the thing in two lines.",
        ),
        ("Upstream-Status: Denied\n\nWhy: it was refused.\nSigned-off-by: A <a@b>\n", "Denied", "Why: it was refused."),
        (
            "Subject-less note\nUpstream-Status: Inappropriate [local config]\n",
            "Inappropriate [local config]",
            "Subject-less note",
        ),
    ],
)
def test_plain_diff_headers(tmp_path, comment, status, description):
    p = tmp_path / "x.diff"
    p.write_bytes(comment.encode() + b"--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    assert check_patch_headers(p) == PatchHeader(status, description, "diff", 1)


@pytest.mark.parametrize(
    "comment, error",
    [
        ("Just a note.\n", "no `Upstream-Status:` header"),
        ("Note.\nUpstream-Status: Submitted\n", "is not valid"),
        ("Upstream-Status: Pending\n", "no description"),
        ("A.\nUpstream-Status: Pending\nUpstream-Status: Denied\n", "conflicting"),
    ],
)
def test_plain_diff_header_errors_name_the_file(tmp_path, comment, error):
    p = tmp_path / "bad.diff"
    p.write_bytes(comment.encode() + b"diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(PatchError, match=error) as ei:
        check_patch_headers(p)
    assert str(p) in str(ei.value)


def test_mbox_header_and_kind_mismatch(up, tmp_path):
    p = tmp_path / "f2.patch"
    p.write_bytes(format_patch(up, up["f2"]))
    assert check_patch_headers(p) == PatchHeader("Submitted [PR #2]", "f2: extend b", "mbox", 1)
    with pytest.raises(PatchError, match="declare it `mbox:`"):
        check_patch_headers(p, "diff")
    q = tmp_path / "plain.patch"
    q.write_bytes(b"Note.\n\nUpstream-Status: Pending\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(PatchError, match=r"no From: / Subject: header"):
        check_patch_headers(q, "mbox")
    r = tmp_path / "nodiff.diff"
    r.write_bytes(b"Note.\n\nUpstream-Status: Pending\n")
    with pytest.raises(PatchError, match="no diff found"):
        check_patch_headers(r)


# ---------------------------------------------------------------- untrusted patch files (issue 14: items 7, 10)


def test_patch_file_changed_after_the_lock_is_refused_before_anything_applies(up, ws):
    src, project, out = ws
    m = write_patch(project, "0001-f2.patch", format_patch(up, up["f2"]))
    pin = pin_of(up, [entry("mbox", m, "Submitted [PR #2]")], up.tree("f2"))
    data = (project / m).read_bytes()
    assert data.count(b"charlie") == 1
    (project / m).write_bytes(data.replace(b"charlie", b"charliE"))  # one byte, after the lock was written
    with pytest.raises(SeriesError) as ei:
        apply_series(pin, src, out / "dest", project)
    msg = str(ei.value)
    assert f"#1 of 1 mbox {m}: upstreams.lock:" in msg and f"patch file {m} has sha256 " in msg
    assert f"the lock pins {SHA256[m]}" in msg
    assert leftovers(out) == []


def test_applied_bytes_are_the_checked_copy(up, ws):
    src, project, out = ws
    m = write_patch(project, "0001-f1.patch", format_patch(up, up["f1"]))
    res = apply_series(pin_of(up, [entry("mbox", m, "Pending")], up.tree("f1")), src, out / "dest", project)
    assert res.tree == up.tree("f1")
    assert (out / "dest" / ".git" / "reprostack-patches" / "0001-0001-f1.patch").read_bytes() == (
        project / m
    ).read_bytes()


def test_patch_file_entry_without_sha256_is_refused(up, ws):
    src, project, out = ws
    m = write_patch(project, "0001-f2.patch", format_patch(up, up["f2"]))
    e = PatchEntry(kind="mbox", value=m, upstream_status="Submitted [PR #2]")
    with pytest.raises(SeriesError, match=f"patch file {m} has no sha256 in the lock"):
        apply_series(pin_of(up, [e], up.tree("f2")), src, out / "dest", project)
    assert leftovers(out) == []


NEW_FILE = "diff --git a/{p} b/{p}\nnew file mode {mode}\n--- /dev/null\n+++ b/{p}\n@@ -0,0 +1 @@\n+{body}\n"
COMMENT = "# Escape test.\n#\n# Upstream-Status: Pending\n"


@pytest.mark.parametrize(
    "diff, why",
    [
        (NEW_FILE.format(p="../x", mode="100644", body="evil"), "touches '../x', which has a '..'"),
        ("--- /dev/null\n+++ /tmp/abs-x\n@@ -0,0 +1 @@\n+evil\n", "touches '/tmp/abs-x', which is absolute"),
        (
            NEW_FILE.format(p=".git/hooks/post-checkout", mode="100755", body="evil"),
            "touches '.git/hooks/post-checkout', which reaches into .git",
        ),
        (
            NEW_FILE.format(p="up", mode="120000", body="../../..") + "\\ No newline at end of file\n",
            "makes 'up' a symlink to '../../..', outside the work tree",
        ),
        (
            NEW_FILE.format(p="etc", mode="120000", body="/etc") + "\\ No newline at end of file\n",
            "makes 'etc' a symlink to '/etc'",
        ),
    ],
)
def test_patch_target_outside_the_tree_is_refused(up, ws, diff, why):
    src, project, out = ws
    d = write_patch(project, "0001-escape.diff", plain_diff(COMMENT, diff.encode()))
    with pytest.raises(SeriesError) as ei:
        apply_series(pin_of(up, [entry("diff", d, "Pending")], up.tree("f1")), src, out / "dest", project)
    assert f"#1 of 1 diff {d}: {d} {why}" in str(ei.value)
    assert leftovers(out) == [] and not (out.parent / "x").exists()


def test_patch_through_a_symlink_of_an_earlier_entry_is_refused(up, ws):
    src, project, out = ws
    inside = write_patch(
        project,
        "0001-link.diff",
        plain_diff(
            COMMENT, (NEW_FILE.format(p="lnk", mode="120000", body="sub") + "\\ No newline at end of file\n").encode()
        ),
    )
    through = write_patch(
        project,
        "0002-through.diff",
        plain_diff(COMMENT, NEW_FILE.format(p="lnk/x", mode="100644", body="evil").encode()),
    )
    with pytest.raises(SeriesError) as ei:
        apply_series(
            pin_of(up, [entry("diff", inside, "Pending"), entry("diff", through, "Pending")], up.tree("f1")),
            src,
            out / "dest",
            project,
        )
    msg = str(ei.value)
    assert f"#2 of 2 diff {through}: {through} touches 'lnk/x' through the symlink 'lnk'" in msg
    assert "#1 of 2" not in msg  # a symlink inside the tree is fine


def test_git_apply_itself_refuses_dotdot_but_not_an_escaping_symlink(up, ws):
    """What git does without the pre-check (why it exists): `../x` is refused, a symlink out is applied."""
    src, project, _ = ws
    p = project / "dotdot.diff"
    p.write_text(NEW_FILE.format(p="../x", mode="100644", body="evil"))
    with pytest.raises(GitFailed, match="invalid path"):
        git("apply", "--index", str(p), cwd=src)
    p.write_text(NEW_FILE.format(p="up", mode="120000", body="../../..") + "\\ No newline at end of file\n")
    git("apply", "--index", str(p), cwd=src)
    assert os.readlink(src / "up") == "../../.."
