"""reprostack.lock.load: the real upstreams.lock, and broken lockfiles whose errors must say `FILE:LINE: field`."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

from reprostack.errors import LockError
from reprostack.lock import GitPin, Lock, WheelPin, load

REPO_ROOT = Path(__file__).resolve().parents[1]
REAL_LOCK = REPO_ROOT / "upstreams.lock"

REV = "b306af06afd412c88e51e71802951606e40b7358"
TREE = "186344a19c36d5dceb2c386fb0b6b0a2f08e9e75"
PICK = "164c82d7207d0dba8e815626849130e595fdd063"
PATCHED = "8413dba0c3904906c4f616b8eb6f502b4be6b14b"

# A valid one-pin lock; each bad case below is one textual edit of it.
BASE = f"""\
lockfile-version: 1
upstreams:
  demo:
    kind: git
    url: https://example.invalid/org/demo
    rev: {REV}
    tree: {TREE}
    patches:
      - cherry-pick: {PICK}
        ref: refs/pull/612/head
        upstream-status: "Submitted [PR #612]"
        description: one fix
        tree: {PATCHED}
    patched-tree: {PATCHED}
"""


def write(tmp_path: Path, text: str, name: str = "upstreams.lock") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def edit(old: str, new: str, text: str = BASE) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def line_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based line of the `nth` line containing `needle`."""
    hits = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    return hits[nth - 1]


def load_error(path: Path, **kw) -> LockError:
    with pytest.raises(LockError) as ei:
        load(path, **kw)
    return ei.value


def assert_where(err: LockError, path: Path, line: int, field: str) -> str:
    """The message starts with `FILE:LINE: field: `; returns the rest."""
    prefix = f"{path}:{line}: {field}: "
    msg = str(err)
    assert msg.startswith(prefix), msg
    assert (err.path, err.line, err.field) == (str(path), line, field)
    return msg[len(prefix) :]


# --------------------------------------------------------------------------- the real lock


def test_real_lock():
    lock = load(REAL_LOCK)
    assert lock.path == REAL_LOCK
    assert lock.sha256 == hashlib.sha256(REAL_LOCK.read_bytes()).hexdigest()
    assert {
        "deepep",
        "nccl",
        "aiperf",
        "substrate-wheels",
        "vllm-wheels-cp311",
        "sglang-wheels-cp311",
        "megatron-lm",
        "nemo-rl",
    } <= set(lock.upstreams)

    dp = lock.git("deepep")
    assert isinstance(dp, GitPin) and dp.kind == "git"
    assert dp.url == "https://github.com/deepseek-ai/DeepEP"
    assert (dp.rev, dp.tree) == (REV, TREE)
    assert [(s.path, s.rev) for s in dp.submodules] == [("third-party/fmt", "a4c7e17133ee9cb6a2f45545f6e974dd3c393efa")]
    assert len(dp.patches) == 5
    assert [p.kind for p in dp.patches] == ["cherry-pick"] * 5
    assert [p.index for p in dp.patches] == [1, 2, 3, 4, 5]
    assert dp.patches[0].value == PICK and dp.patches[0].upstream_status == "Submitted [PR #612]"
    assert dp.patches[0].label == f"#1 cherry-pick {PICK[:12]}"
    assert dp.patches[3].upstream_status == "Backport [#630]"
    assert dp.patched_tree == PATCHED == dp.patches[-1].tree
    assert dp.hint_refs() == ("refs/pull/612/head", "refs/heads/main")

    nccl = lock.git("nccl")
    assert nccl.rev == "1933fdd6360a8bfccaa0166bd71bce363d32e5b6" and nccl.original == "v2.30.4-1"
    assert nccl.patches == () and nccl.patched_tree is None and nccl.submodules == ()
    assert nccl.fetch_refs == ("refs/tags/v2.30.4-1",) == nccl.hint_refs()

    mg = lock.git("megatron-lm")  # PR #4632 replayed on its own parent (it conflicts on the campaign's 23dd639c)
    assert mg.rev == "19deef67f910c96c213f33b33b30277be8b94d6d"
    assert [p.value[:8] for p in mg.patches[:4]] == ["e132d5dd", "f5ac3d48", "99b8824e", "8056d6d4"]
    assert {p.upstream_status for p in mg.patches[:4]} == {"Submitted [PR #4632]"}
    assert mg.patches[3].tree == "a581e42fc8efaef71fc87aa26a5d43616957774f"  # the PR head's own tree
    assert (mg.patches[4].kind, mg.patches[4].upstream_status) == ("mbox", "Pending")  # ours: no set_num_sms in V2
    assert mg.patched_tree == mg.patches[-1].tree == "e6183f5ca72f2aca900a801b18ad09392f21f874"
    assert all(p.tree for p in mg.patches) and mg.hint_refs() == ("refs/pull/4632/head",)
    rl = lock.git("nemo-rl")
    assert rl.rev == "81aa43dda4765b0429cf31dab44441e4e4383911" and rl.fetch_refs == ("refs/tags/v0.7.0",)

    aiperf = lock.get("aiperf")  # resolved with `reprostack lock wheels aiperf` (pip against PyPI)
    assert (aiperf.kind, aiperf.name, aiperf.version) == ("wheel", "aiperf", "0.10.0")
    assert [(f.filename, f.sha256) for f in aiperf.files] == [
        ("aiperf-0.10.0-py3-none-any.whl", "cf8c01d0fd8f45a9e29abddc9cdbd404586c17a05834044c4c3720d272d6591d")
    ]

    text = REAL_LOCK.read_text()
    assert lock.line_of(("upstreams", "deepep", "patches", 0)) == line_of(text, f"- cherry-pick: {PICK}")
    assert lock.line_of(("upstreams", "nccl", "rev")) == line_of(text, "rev: 1933fdd6")
    assert lock.line_of(("upstreams", "nccl", "no-such-key")) == line_of(text, "  nccl:")  # nearest parent


def test_valid_base_and_its_hash(tmp_path):
    p = write(tmp_path, BASE)
    lock = load(p)
    assert lock.sha256 == hashlib.sha256(BASE.encode()).hexdigest()
    assert lock.git("demo").patches[0].ref == "refs/pull/612/head"
    # comments and whitespace are part of the file's identity: another hash, same pins
    other = load(write(tmp_path, "# note\n" + BASE, "other.lock"))
    assert other.sha256 != lock.sha256 and other.upstreams == lock.upstreams


# --------------------------------------------------------------------------- bad lockfiles: FILE:LINE: field


def test_mutable_ref_as_rev(tmp_path):
    text = edit(f"rev: {REV}", "rev: refs/pull/612/head")
    p = write(tmp_path, text)
    rest = assert_where(load_error(p), p, line_of(text, "rev: refs/pull"), "upstreams.demo.rev")
    assert rest.startswith("'refs/pull/612/head' does not match")
    assert "a mutable ref or short id is not a pin" in rest
    assert "give the full 40-hex commit and put the ref in `ref`/`fetch-refs`" in rest


def test_short_sha(tmp_path):
    text = edit(f"    tree: {TREE}", f"    tree: {TREE[:12]}")
    p = write(tmp_path, text)
    rest = assert_where(load_error(p), p, line_of(text, f"tree: {TREE[:12]}"), "upstreams.demo.tree")
    assert f"'{TREE[:12]}' does not match" in rest and "short id is not a pin" in rest


@pytest.mark.parametrize(
    "anchor,added,field",
    [
        ("        description: one fix\n", "        descripton: typo\n", "upstreams.demo.patches[0].descripton"),
        ("    kind: git\n", "    branch: main\n", "upstreams.demo.branch"),
        ("lockfile-version: 1\n", "extra: 1\n", "extra"),
    ],
)
def test_unknown_key(tmp_path, anchor, added, field):
    text = edit(anchor, anchor + added)
    p = write(tmp_path, text)
    key = added.split(":")[0].strip()
    rest = assert_where(load_error(p), p, line_of(text, added.strip()), field)
    assert rest.startswith(f"unknown key ('{key}' was unexpected)")


def test_unknown_key_in_submodule(tmp_path):
    sub = f"    submodules:\n      third-party/fmt:\n        url: https://example.invalid/fmt\n        rev: {PICK}\n        branch: main\n"
    text = edit("    patches:\n", sub + "    patches:\n")
    p = write(tmp_path, text)
    assert_where(load_error(p), p, line_of(text, "branch: main"), "upstreams.demo.submodules.third-party/fmt.branch")


def test_duplicate_key(tmp_path):
    text = edit(f"    tree: {TREE}\n", f"    tree: {TREE}\n    tree: {TREE}\n")
    p = write(tmp_path, text)
    first, second = line_of(text, f"    tree: {TREE}"), line_of(text, f"    tree: {TREE}", 2)
    rest = assert_where(load_error(p), p, second, "upstreams.demo.tree")
    assert rest == f"duplicate key (first at line {first})"


def test_duplicate_pin(tmp_path):
    text = BASE + "  demo:\n    kind: git\n"
    p = write(tmp_path, text)
    assert_where(load_error(p), p, line_of(text, "  demo:", 2), "upstreams.demo")


def test_series_without_patched_tree(tmp_path):
    text = edit(f"    patched-tree: {PATCHED}\n", "")
    p = write(tmp_path, text)
    rest = assert_where(load_error(p), p, line_of(text, "  demo:"), "upstreams.demo")
    assert "'patched-tree' is a dependency of 'patches'" in rest


@pytest.mark.parametrize("version", ["2", "0", '"1"'])
def test_wrong_lockfile_version(tmp_path, version):
    text = edit("lockfile-version: 1", f"lockfile-version: {version}")
    p = write(tmp_path, text)
    rest = assert_where(load_error(p), p, 1, "lockfile-version")
    assert rest == "1 was expected"


def test_patch_entry_with_cherry_pick_and_mbox(tmp_path):
    (tmp_path / "patches" / "demo").mkdir(parents=True)
    (tmp_path / "patches" / "demo" / "0001-fix.patch").write_text("From x\n")
    text = edit("        ref: refs/pull/612/head\n", "        mbox: patches/demo/0001-fix.patch\n")
    p = write(tmp_path, text)
    rest = assert_where(load_error(p), p, line_of(text, f"- cherry-pick: {PICK}"), "upstreams.demo.patches[0]")
    assert rest == "a patch entry needs exactly one of cherry-pick / mbox / diff"


def test_patch_entry_with_none_of_them(tmp_path):
    text = edit(f"      - cherry-pick: {PICK}\n        ref: refs/pull/612/head\n", "      - ref: refs/pull/612/head\n")
    p = write(tmp_path, text)
    rest = assert_where(load_error(p), p, line_of(text, "- ref: refs/pull"), "upstreams.demo.patches[0]")
    assert "exactly one of cherry-pick / mbox / diff" in rest


FIX_SHA = hashlib.sha256(b"From x\n").hexdigest()  # of the 0001-fix.patch these tests write


def mbox_lock(sha: str = FIX_SHA, value: str = "patches/demo/0001-fix.patch") -> str:
    return edit(
        f"      - cherry-pick: {PICK}\n        ref: refs/pull/612/head\n",
        f"      - mbox: {value}\n        sha256: {sha}  # sha256 of the committed file\n",
    )


def test_mbox_file_missing_names_the_file(tmp_path):
    text = mbox_lock()
    p = write(tmp_path, text)
    rest = assert_where(load_error(p), p, line_of(text, "mbox: patches/"), "upstreams.demo.patches[0].mbox")
    assert rest == f"patch file patches/demo/0001-fix.patch not found under {tmp_path}"


def test_mbox_file_is_found_under_root(tmp_path):
    proj = tmp_path / "proj"
    (proj / "patches" / "demo").mkdir(parents=True)
    (proj / "patches" / "demo" / "0001-fix.patch").write_text("From x\n")
    p = write(tmp_path, mbox_lock())
    with pytest.raises(LockError, match=f"not found under {tmp_path}$"):
        load(p)  # default root: the lockfile's folder, which has no patches/
    pin = load(p, root=proj).git("demo")
    assert [(e.kind, e.value, e.index) for e in pin.patches] == [("mbox", "patches/demo/0001-fix.patch", 1)]
    assert pin.patches[0].label == "#1 mbox patches/demo/0001-fix.patch"


def test_patch_file_changed_by_one_byte_names_lock_line_and_file(tmp_path):
    (tmp_path / "patches" / "demo").mkdir(parents=True)
    f = tmp_path / "patches" / "demo" / "0001-fix.patch"
    f.write_text("From x\n")
    text = mbox_lock()
    p = write(tmp_path, text)
    assert load(p).git("demo").patches[0].sha256 == FIX_SHA
    f.write_text("From y\n")  # one byte changed after the lock was written
    rest = assert_where(load_error(p), p, line_of(text, "sha256: "), "upstreams.demo.patches[0].sha256")
    got = hashlib.sha256(b"From y\n").hexdigest()
    assert rest.startswith(f"patch file patches/demo/0001-fix.patch has sha256 {got}, the lock pins {FIX_SHA}")


def test_patch_file_entry_without_sha256(tmp_path):
    text = edit(
        f"      - cherry-pick: {PICK}\n        ref: refs/pull/612/head\n", "      - diff: patches/demo/fix.diff\n"
    )
    p = write(tmp_path, text)
    rest = assert_where(load_error(p), p, line_of(text, "- diff: "), "upstreams.demo.patches[0]")
    assert rest.startswith("a patch file entry needs `sha256:`")


def test_cherry_pick_with_sha256_is_refused(tmp_path):
    text = edit("        ref: refs/pull/612/head\n", f"        ref: refs/pull/612/head\n        sha256: {FIX_SHA}\n")
    p = write(tmp_path, text)
    rest = assert_where(load_error(p), p, line_of(text, "sha256: "), "upstreams.demo.patches[0].sha256")
    assert rest.startswith("only a patch file (mbox/diff) has a sha256")


@pytest.mark.parametrize("value", ["patches/../../evil.patch", "patches/demo/../../x.patch", "patches//x.patch"])
def test_patch_file_path_traversal(tmp_path, value):
    (tmp_path / "x.patch").write_text("From x\n")
    text = mbox_lock(value=value)
    p = write(tmp_path, text)
    rest = assert_where(load_error(p), p, line_of(text, "mbox: "), "upstreams.demo.patches[0].mbox")
    assert "must be a plain relative path under patches/" in rest


def test_patch_file_symlink_out_of_patches(tmp_path):
    (tmp_path / "patches" / "demo").mkdir(parents=True)
    (tmp_path / "secret.patch").write_text("From x\n")
    (tmp_path / "patches" / "demo" / "0001-fix.patch").symlink_to(tmp_path / "secret.patch")
    text = mbox_lock()
    p = write(tmp_path, text)
    rest = assert_where(load_error(p), p, line_of(text, "mbox: "), "upstreams.demo.patches[0].mbox")
    assert "outside" in rest and "symlink" in rest


@pytest.mark.parametrize("sub", ["../..", "/abs/x", "-x", "a/../../b", ".git", "third-party/.GIT/x", "a//b"])
def test_submodule_path_traversal(tmp_path, sub):
    text = edit(
        "    patches:\n",
        f"    submodules:\n      {sub!r}:\n        url: https://example.invalid/s\n        rev: {REV}\n    patches:\n",
    )
    p = write(tmp_path, text)
    rest = assert_where(load_error(p), p, line_of(text, f"{sub!r}:"), f"upstreams.demo.submodules.{sub}")
    assert "must" in rest


@pytest.mark.parametrize(
    "fn",
    [
        "../aiperf-0.10.0-py3-none-any.whl",
        "x/aiperf-0.10.0-py3-none-any.whl",
        "..\\aiperf-0.10.0-py3-none-any.whl",
        "aiperf.whl",
        ".aiperf-0.10.0-py3-none-any.whl",
    ],
)
def test_wheel_filename_traversal(tmp_path, fn):
    text = BASE + (
        f"  w:\n    kind: wheel\n    name: aiperf\n    version: '0.10.0'\n    files:\n"
        f"      - filename: {fn!r}\n        sha256: {FIX_SHA}\n"
    )
    p = write(tmp_path, text)
    rest = assert_where(load_error(p), p, line_of(text, "filename: "), "upstreams.w.files[0].filename")
    assert "not a bare file name" in rest or "not a wheel filename" in rest


def test_real_lock_vouches_for_its_patch_files():
    pin = load(REAL_LOCK).git("megatron-lm")
    files = [e for e in pin.patches if e.kind != "cherry-pick"]
    assert files and all(e.sha256 == hashlib.sha256((REPO_ROOT / e.value).read_bytes()).hexdigest() for e in files)


def test_mbox_path_outside_patches(tmp_path):
    text = edit(f"      - cherry-pick: {PICK}\n        ref: refs/pull/612/head\n", "      - mbox: ../evil.patch\n")
    p = write(tmp_path, text)
    rest = assert_where(load_error(p), p, line_of(text, "mbox: ../evil"), "upstreams.demo.patches[0].mbox")
    assert "does not match" in rest


def test_yaml_syntax_error_has_its_line(tmp_path):
    text = edit("    kind: git\n", "    kind: git\n    original: EPv2: release\n")
    p = write(tmp_path, text)
    rest = assert_where(load_error(p), p, line_of(text, "original: EPv2: release"), "(yaml)")
    assert rest in (
        "mapping values are not allowed here",
        "mapping values are not allowed in this context",
    )  # PyYAML, libyaml


def test_bad_indentation_is_a_yaml_error(tmp_path):
    text = edit("    kind: git\n", "    kind: git\n      oops: 1\n")
    p = write(tmp_path, text)
    err = load_error(p)
    assert err.field == "(yaml)" and err.line == line_of(text, "oops: 1")


def test_all_digit_sha_read_as_number(tmp_path):
    digits = "1234567890" * 4
    text = edit(f"rev: {REV}", f"rev: {digits}")
    p = write(tmp_path, text)
    rest = assert_where(load_error(p), p, line_of(text, f"rev: {digits}"), "upstreams.demo.rev")
    assert rest == f"{digits} was read as a number: quote it"
    # quoted, it is a valid pin
    assert load(write(tmp_path, edit(f"rev: {REV}", f'rev: "{digits}"'), "quoted.lock")).git("demo").rev == digits


def test_last_entry_tree_differs_from_patched_tree(tmp_path):
    text = edit(f"    patched-tree: {PATCHED}", f"    patched-tree: {'f' * 40}")
    p = write(tmp_path, text)
    rest = assert_where(load_error(p), p, line_of(text, "patched-tree: fff"), "upstreams.demo.patched-tree")
    assert rest == f"differs from the last series entry's tree {PATCHED}"


def test_unknown_status(tmp_path):
    text = edit('upstream-status: "Submitted [PR #612]"', "upstream-status: Merged")
    p = write(tmp_path, text)
    assert_where(
        load_error(p), p, line_of(text, "upstream-status: Merged"), "upstreams.demo.patches[0].upstream-status"
    )


def test_empty_and_missing_file(tmp_path):
    p = write(tmp_path, "")
    assert str(load_error(p)) == f"{p}:1: (file): empty file"
    missing = tmp_path / "nope.lock"
    err = load_error(missing)
    assert str(err) == f"{missing}: (file): No such file or directory" and err.line is None


# --------------------------------------------------------------------------- Lock.get / Lock.git


def test_get_unknown_pin_lists_known_pins():
    lock = load(REAL_LOCK)
    with pytest.raises(LockError) as ei:
        lock.get("deep-ep")
    assert str(ei.value) == f"{REAL_LOCK}: upstreams.deep-ep: no such pin (known: {', '.join(sorted(lock.upstreams))})"


def test_git_on_a_wheel_pin(tmp_path):
    text = (
        BASE
        + f"""\
  torch:
    kind: wheel
    name: torch
    version: "2.11.0"
    files:
      - filename: torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl
        sha256: {"ab" * 32}
"""
    )
    p = write(tmp_path, text)
    lock = load(p)
    wheel = lock.get("torch")
    assert isinstance(wheel, WheelPin) and wheel.version == "2.11.0" and wheel.files[0].sha256 == "ab" * 32
    with pytest.raises(LockError) as ei:
        lock.git("torch")
    assert str(ei.value) == f"{p}:{line_of(text, '  torch:')}: upstreams.torch: is kind wheel, a git pin is needed here"


# --------------------------------------------------------------------------- read-only


def _snapshot(root: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, n))
            out[os.path.relpath(os.path.join(dirpath, n), root)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_WRITE_EVENTS = {
    "os.mkdir",
    "os.rename",
    "os.replace",
    "os.remove",
    "os.rmdir",
    "os.symlink",
    "os.link",
    "os.truncate",
    "os.chmod",
    "os.utime",
    "shutil.copyfile",
    "shutil.rmtree",
    "shutil.move",
}
_audit: list | None = None


def _hook(event, args):
    if _audit is None:
        return
    if event == "open":
        path, mode, flags = args
        if (isinstance(mode, str) and set(mode) & set("wax+")) or (isinstance(flags, int) and flags & _WRITE_FLAGS):
            _audit.append((event, path, mode))
    elif event in _WRITE_EVENTS or event == "subprocess.Popen":
        _audit.append((event, args[0] if args else None))


def test_loading_writes_nothing(tmp_path, monkeypatch):
    """Loading a lock (valid or not) opens nothing for writing, makes no folder, runs no process."""
    global _audit
    sys.addaudithook(_hook)  # inert unless _audit is a list
    monkeypatch.setenv("REPROSTACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    good = write(tmp_path, BASE)
    bad = write(tmp_path, edit(f"rev: {REV}", "rev: refs/pull/612/head"), "bad.lock")
    load(good)  # warm up lazy imports (their .pyc writes are not the loader's)
    load_error(bad)
    before, before_repo = _snapshot(tmp_path), REAL_LOCK.stat()
    _audit = []
    try:
        load(REAL_LOCK)
        load(good)
        load_error(bad)
        seen = list(_audit)
    finally:
        _audit = None
    assert seen == []
    assert _snapshot(tmp_path) == before
    after = REAL_LOCK.stat()
    assert (after.st_mtime_ns, after.st_size) == (before_repo.st_mtime_ns, before_repo.st_size)
    assert not (tmp_path / "cache").exists()


def test_lock_is_immutable():
    lock = load(REAL_LOCK)
    with pytest.raises(AttributeError):
        lock.git("deepep").rev = "0" * 40  # frozen dataclass
    assert isinstance(lock, Lock)


# --------------------------------------------------------------------------- URLs and refs git could run


@pytest.mark.parametrize(
    "url, why",
    [
        ('"--upload-pack=touch /tmp/x"', "starts with '-'"),
        ("-oProxyCommand=x", "starts with '-'"),
        ("ext::sh", "transport helper"),
        ('"ext::sh -c touch% /tmp/x"', "whitespace"),
        ("fd::0", "transport helper"),
        ("http://example.invalid/x", "scheme 'http'"),
        ("ssh://-oProxyCommand=x/y", "host starting with '-'"),
        ("relative/path", "neither"),
        ('"https://x/a\\tb"', "whitespace"),
        # the hostile trial's forms (issue 14): each passed `lock check` before
        ('"ssh://[-oProxyCommand=x]/x"', "not plain"),
        ('"ssh://-oProxyCommand=x@host/x"', "starting with '-'"),
        ("ssh://-@127.0.0.1:1/x", "starting with '-'"),
        ("git@host:-x", "path starting with '-'"),
        ('"host:--upload-pack=touch${IFS}/tmp/x"', "path starting with '-'"),
        ("HTTPS://github.com/x", "lower case"),
        ("ssh://", "no host"),
        ("file://", "no repository path"),
    ],
)
def test_url_git_could_misread_is_refused(tmp_path, url, why):
    text = edit("url: https://example.invalid/org/demo", f"url: {url}")
    p = write(tmp_path, text)
    assert why in assert_where(load_error(p), p, line_of(text, "url:"), "upstreams.demo.url")


@pytest.mark.parametrize(
    "url",
    [
        "https://github.com/o/r",
        "ssh://git@github.com/o/r",
        "git://h/r",
        "file:///srv/r",
        "git@github.com:o/r.git",
        "/srv/mirrors/r",
    ],
)
def test_url_forms_git_reads_as_repositories(tmp_path, url):
    assert load(write(tmp_path, edit("url: https://example.invalid/org/demo", f"url: {url}"))).git("demo").url == url


@pytest.mark.parametrize("ref", ['"--upload-pack=x"', "refs/heads/a b", '"refs/x\\n--all"'])
def test_hint_ref_git_could_misread_is_refused(tmp_path, ref):
    text = edit("ref: refs/pull/612/head", f"ref: {ref}")
    p = write(tmp_path, text)
    assert_where(load_error(p), p, line_of(text, "ref:"), "upstreams.demo.patches[0].ref")


def test_lock_check_cli_one_line_exit_2_on_a_changed_patch_file(tmp_path, capsys):
    from reprostack import cli

    (tmp_path / "patches" / "demo").mkdir(parents=True)
    f = tmp_path / "patches" / "demo" / "0001-fix.patch"
    f.write_text("From x\n")
    p = write(tmp_path, mbox_lock())
    assert cli.main(["lock", "check", "--lock", str(p)]) == 0
    f.write_text("From x\n\n")
    assert cli.main(["lock", "check", "--lock", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(
        f"reprostack: error: {p}:{line_of(mbox_lock(), 'sha256: ')}: upstreams.demo.patches[0].sha256: "
        f"patch file patches/demo/0001-fix.patch has sha256 "
    )


@pytest.mark.parametrize(
    "ref",
    [
        "refs/heads/../../x",
        "refs/heads/a..b",
        "refs/heads/x.lock",
        "refs/heads//x",
        "refs/heads/.hidden",
        "refs/heads/x/",
    ],
)
def test_fetch_ref_git_would_refuse_is_named_with_its_line(tmp_path, ref):
    """A `fetch-refs` entry git's check-ref-format refuses passed the schema and failed at fetch time blaming the
    network (hostile trial, issue 14); now `lock check` names it."""
    from reprostack.lock import ref_problem

    assert ref_problem(ref) and ref_problem("refs/pull/612/head") is None and ref_problem("refs/tags/v2.30.4-1") is None
    root = Path(__file__).resolve().parents[1]
    text = (root / "upstreams.lock").read_text()
    assert text.count("fetch-refs: [refs/tags/v0.7.0]") == 1
    bad = tmp_path / "upstreams.lock"
    bad.write_text(text.replace("fetch-refs: [refs/tags/v0.7.0]", f"fetch-refs: [{ref}]"))
    line = next(i for i, t in enumerate(bad.read_text().splitlines(), 1) if ref in t)
    with pytest.raises(
        LockError, match=rf"upstreams.lock:{line}: upstreams.nemo-rl.fetch-refs\[0\]: .* is not a ref name"
    ):
        load(bad, root)


def test_lock_without_an_action_lists_the_actions(capsys):
    """Issue 29 item 9: `reprostack lock` alone ended in argparse's `the following arguments are required: action,
    rest`; now one line lists each action and what it does, exit 2."""
    from reprostack.cli import main

    assert main(["lock"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("reprostack: error: lock: name an action: `lock check`: validate the lockfile (offline); ")
    assert "`lock wheels`: " in err and "`lock images`: " in err


def test_a_wheel_version_moved_without_its_files_is_refused_naming_the_command(tmp_path):
    """Issue 29 item 7: a bump leaves a tied wheel pin behind and says `set upstreams.nccl-wheel.version to "2.30.5",
    then reprostack lock wheels nccl-wheel`. Half of that (the version moved, the 2.30.4 files kept) passed `lock
    check`; now every load refuses a file of another version than the pin's, naming the command that refills it,
    while `lock wheels` itself (allow_unfilled) still loads the lock to fill it. A wheelset file whose name says
    another version than its `version:` field likewise."""
    text = REAL_LOCK.read_text()
    start = text.index("  nccl-wheel:\n")
    moved = text[:start] + text[start:].replace('version: "2.30.4"', 'version: "2.30.5"', 1)
    p = write(tmp_path, moved)
    line = line_of(moved, "- filename: nvidia_nccl_cu13-2.30.4-py3-none-manylinux_2_18_x86_64.whl")
    rest = assert_where(load_error(p, root=REPO_ROOT), p, line, "upstreams.nccl-wheel.files[0].filename")
    assert rest == (
        "nvidia_nccl_cu13-2.30.4-py3-none-manylinux_2_18_x86_64.whl is nvidia-nccl-cu13 2.30.4, the pin says "
        "nvidia-nccl-cu13 2.30.5: run `reprostack lock wheels nccl-wheel` (it resolves the files of the pinned version)"
    )
    assert load(p, root=REPO_ROOT, allow_unfilled=True).get("nccl-wheel").version == "2.30.5"
    i = text.index("        filename: cuda_bindings-13.4.4-")
    forged = text[:i] + text[i:].replace("cuda_bindings-13.4.4-", "cuda_bindings-13.4.3-", 1)
    p = write(tmp_path, forged)
    err = load_error(p, root=REPO_ROOT)
    assert err.field == "upstreams.substrate-wheels.files[0].filename" and "the pin says cuda-bindings 13.4.4" in str(
        err
    )
