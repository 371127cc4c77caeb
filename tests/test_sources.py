"""Stage `sources` (reprostack.sources.prepare) on local git repositories: fetch -> materialize -> patch series
-> submodules -> verified tree in the cache. No network: the "servers" are folders in tmp_path.

The stack built here (`make_stack`, `lock_text`, `write_project`) is also used by test_gate_micro.py and
test_cli.py: an `nccl` repo pinned without a series and a `deepep` repo pinned with a one-commit cherry-pick
series (from refs/pull/612/head) and a submodule `third-party/fmt`.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

import gitrepos as gr
from reprostack import sources
from reprostack.errors import LockError, PatchError
from reprostack.fetch import Cache
from reprostack.gitcmd import git
from reprostack.lock import GitPin, Lock, PatchEntry, Submodule, load

REPO_ROOT = Path(__file__).resolve().parents[1]
SUB = "third-party/fmt"


# --------------------------------------------------------------------------- the stack (shared helpers)


@dataclass
class Stack:
    """Server repos under `srv`: srv/fmt, srv/deepep (gitlink to fmt at SUB), srv/nccl.

    deepep: d1 -> (add submodule fmt@fmt_rev) -> rev (pinned) -> main moves on; refs/pull/612/head: rev -> pick.
    patched = tree of `pick` (the cherry-pick of `pick` onto `rev` is exactly that commit's tree).
    nccl: one commit `nccl_rev` with makefiles/version.mk (2.30.4), tagged v2.30.4-1.
    """

    srv: Path
    fmt_rev: str
    fmt_tree: str
    rev: str
    tree: str
    pick: str
    patched: str
    nccl_rev: str
    nccl_tree: str

    def url(self, name: str, base: str | None = None) -> str:
        return f"{base}/{name}" if base else str(self.srv / name)


def make_stack(srv: Path) -> Stack:
    fmt = gr.init_repo(srv / "fmt")
    fmt_rev = gr.commit_files(fmt, {"include/fmt/core.h": "// fmt v1\n"}, "fmt v1")

    deepep = gr.init_repo(srv / "deepep")
    gr.commit_files(
        deepep,
        {
            "README.md": "DeepEP\n",
            "csrc/ep.cpp": "int kMaxQps = 128;\n",
            "tests/elastic/test_ep.py": "raise SystemExit('not run on CPU')\n",
        },
        "d1",
    )
    gr.add_submodule(deepep, SUB, "https://example.invalid/fmtlib/fmt", fmt_rev)
    rev = gr.commit_files(deepep, {"csrc/gin.cpp": "int gin;\n"}, "d3: the pinned commit")
    gr.commit_files(deepep, {"csrc/later.cpp": "int later;\n"}, "d4: main moves on")
    (pick,) = gr.make_pull_ref(
        deepep, 612, rev, [({"csrc/ep.cpp": "int kMaxQps = 6;  // EP_EFA_MAX_QPS\n"}, "EFA auto-QP cap")]
    )

    nccl = gr.init_repo(srv / "nccl")
    nccl_rev = gr.commit_files(
        nccl,
        {
            "makefiles/version.mk": "NCCL_MAJOR   := 2\nNCCL_MINOR   := 30\nNCCL_PATCH   := 4\n",
            "src/nccl.h.in": "#define NCCL_MAJOR ${nccl:Major}\n",
        },
        "nccl 2.30.4-1",
    )
    gr.tag(nccl, "v2.30.4-1", nccl_rev)
    return Stack(
        srv,
        fmt_rev,
        gr.tree_of(fmt, fmt_rev),
        rev,
        gr.tree_of(deepep, rev),
        pick,
        gr.tree_of(deepep, pick),
        nccl_rev,
        gr.tree_of(nccl, nccl_rev),
    )


def lock_text(s: Stack, base: str | None = None) -> str:
    """An upstreams.lock for the stack; URLs are the server folders, or `<base>/<name>` (e.g. for --mirror)."""
    return f"""\
# test lock
lockfile-version: 1
upstreams:
  deepep:
    kind: git
    url: {s.url("deepep", base)}
    original: test release
    rev: {s.rev}
    tree: {s.tree}
    submodules:
      {SUB}:
        url: {s.url("fmt", base)}
        rev: {s.fmt_rev}
        tree: {s.fmt_tree}
    patches:
      - cherry-pick: {s.pick}
        ref: refs/pull/612/head
        upstream-status: "Submitted [PR #612]"
        description: EFA auto-QP cap
        tree: {s.patched}
    patched-tree: {s.patched}
  nccl:
    kind: git
    url: {s.url("nccl", base)}
    original: v2.30.4-1
    rev: {s.nccl_rev}
    tree: {s.nccl_tree}
    fetch-refs: [refs/tags/v2.30.4-1]
"""


def write_project(root: Path, s: Stack, base: str | None = None) -> Path:
    """A project root: upstreams.lock for the stack plus copies of the real gates/micro.yaml and kernels/*.yaml.
    Returns the lock's path."""
    (root / "gates").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "gates" / "micro.yaml", root / "gates" / "micro.yaml")
    copy_baseline_runs(root, "micro")
    shutil.copytree(REPO_ROOT / "kernels", root / "kernels")
    lock = root / "upstreams.lock"
    lock.write_text(lock_text(s, base))
    return lock


def copy_baseline_runs(root: Path, gate: str) -> None:
    """The committed reports gates/<gate>.yaml names as baseline runs, copied to the same paths under `root` (a bar's
    threshold is made from them when the spec loads)."""
    import re

    text = (REPO_ROOT / "gates" / f"{gate}.yaml").read_text()
    for rel in re.findall(r"^ +- (results/\S+\.json)$", text, flags=re.M):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / rel, root / rel)


def take_servers_away(s: Stack) -> None:
    """Rename the server folders so that any fetch from them fails (the "network is gone")."""
    s.srv.rename(s.srv.with_name(s.srv.name + "-gone"))


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def _no_env_mirrors(monkeypatch):
    monkeypatch.delenv("REPROSTACK_MIRRORS", raising=False)


@pytest.fixture
def stack(tmp_path) -> Stack:
    return make_stack(tmp_path / "srv")


def deepep_pin(s: Stack, **kw) -> GitPin:
    pin = GitPin(
        name="deepep",
        url=s.url("deepep"),
        rev=s.rev,
        tree=s.tree,
        original="test release",
        submodules=(Submodule(SUB, s.url("fmt"), s.fmt_rev, s.fmt_tree),),
        patches=(
            PatchEntry(
                "cherry-pick",
                s.pick,
                "Submitted [PR #612]",
                ref="refs/pull/612/head",
                description="EFA auto-QP cap",
                tree=s.patched,
                index=1,
            ),
        ),
        patched_tree=s.patched,
    )
    return replace(pin, **kw)


def nccl_pin(s: Stack) -> GitPin:
    return GitPin(
        name="nccl",
        url=s.url("nccl"),
        rev=s.nccl_rev,
        tree=s.nccl_tree,
        original="v2.30.4-1",
        fetch_refs=("refs/tags/v2.30.4-1",),
    )


def lock_of(tmp_path: Path, *pins: GitPin) -> Lock:
    return Lock(path=tmp_path / "upstreams.lock", sha256="0" * 64, upstreams={p.name: p for p in pins})


def opts(tmp_path: Path, **kw) -> sources.FetchOptions:
    return sources.FetchOptions(cache=Cache(tmp_path / "cache"), **kw)


def project(tmp_path: Path) -> Path:
    p = tmp_path / "project"
    p.mkdir(exist_ok=True)
    return p


def trees_dir_entries(o: sources.FetchOptions) -> list[str]:
    return sorted(os.listdir(o.cache.root / "trees"))


# --------------------------------------------------------------------------- tests


def test_prepare_patched_tree_with_submodule(stack, tmp_path):
    o = opts(tmp_path)
    st = sources.prepare(lock_of(tmp_path, deepep_pin(stack)), "deepep", o, project(tmp_path))

    assert st.reused is False and st.patched is True
    assert st.tree == stack.patched
    assert st.path == o.cache.root / "trees" / sources.tree_key(deepep_pin(stack))
    assert st.path.name.startswith(f"deepep-{stack.patched}-")
    assert git("rev-parse", "HEAD^{tree}", cwd=st.path) == stack.patched
    assert git("rev-parse", "HEAD^", cwd=st.path) == stack.rev  # the series sits on the pinned rev
    assert git("status", "--porcelain", cwd=st.path) == ""
    assert (st.path / "csrc" / "ep.cpp").read_text() == "int kMaxQps = 6;  // EP_EFA_MAX_QPS\n"
    assert not (st.path / "csrc" / "later.cpp").exists()  # main's later commit is not in the pinned tree
    # the submodule is checked out at the lock's gitlink
    assert git("rev-parse", "HEAD", cwd=st.path / SUB) == stack.fmt_rev
    assert (st.path / SUB / "include" / "fmt" / "core.h").read_text() == "// fmt v1\n"
    # nothing but the final tree is left in trees/ (the scratch is gone)
    assert trees_dir_entries(o) == [sources.tree_key(deepep_pin(stack))]


def test_prepare_plain_pin_without_series(stack, tmp_path):
    o = opts(tmp_path)
    st = sources.prepare(lock_of(tmp_path, nccl_pin(stack)), "nccl", o, project(tmp_path))
    assert st.reused is False and st.patched is False
    assert st.tree == stack.nccl_tree and st.path.name == f"nccl-{stack.nccl_tree}"
    assert git("rev-parse", "HEAD", cwd=st.path) == stack.nccl_rev
    assert "NCCL_MINOR   := 30" in (st.path / "makefiles" / "version.mk").read_text()
    assert trees_dir_entries(o) == [f"nccl-{stack.nccl_tree}"]


def test_second_prepare_is_reused_without_network(stack, tmp_path):
    lock, o = lock_of(tmp_path, deepep_pin(stack)), opts(tmp_path)
    first = sources.prepare(lock, "deepep", o, project(tmp_path))
    take_servers_away(stack)
    again = sources.prepare(lock, "deepep", o, project(tmp_path))
    assert again.reused is True
    assert again.path == first.path and again.tree == stack.patched
    assert git("rev-parse", "HEAD^{tree}", cwd=again.path) == stack.patched


@pytest.mark.parametrize("corrupt", ["commit", "move-head"])
def test_cached_tree_that_no_longer_verifies_is_rebuilt(stack, tmp_path, corrupt):
    lock, o = lock_of(tmp_path, deepep_pin(stack)), opts(tmp_path)
    first = sources.prepare(lock, "deepep", o, project(tmp_path))
    ep = first.path / "csrc" / "ep.cpp"
    if corrupt == "commit":  # a tracked file changed and committed: HEAD^{tree} is no longer the pinned one
        ep.write_text("int kMaxQps = 999;\n")
        git("commit", "-q", "-am", "local edit", cwd=first.path)
    else:  # HEAD moved back to the unpatched base
        git("checkout", "-q", "--detach", "HEAD^", cwd=first.path)
    assert git("rev-parse", "HEAD^{tree}", cwd=first.path) != stack.patched

    take_servers_away(stack)  # rebuilt from the verified cache, not from the network
    again = sources.prepare(lock, "deepep", o, project(tmp_path))
    assert again.reused is False
    assert again.path == first.path
    assert git("rev-parse", "HEAD^{tree}", cwd=again.path) == stack.patched
    assert ep.read_text() == "int kMaxQps = 6;  // EP_EFA_MAX_QPS\n"
    assert git("status", "--porcelain", cwd=again.path) == ""
    assert git("rev-parse", "HEAD", cwd=again.path / SUB) == stack.fmt_rev


def test_cached_tree_with_uncommitted_edit_is_not_reused(stack, tmp_path):
    lock, o = lock_of(tmp_path, deepep_pin(stack)), opts(tmp_path)
    first = sources.prepare(lock, "deepep", o, project(tmp_path))
    ep = first.path / "csrc" / "ep.cpp"
    ep.write_text("int kMaxQps = 999;\n")  # e.g. a build step or an operator wrote into the cached source
    again = sources.prepare(lock, "deepep", o, project(tmp_path))
    assert ep.read_text() == "int kMaxQps = 6;  // EP_EFA_MAX_QPS\n"
    assert again.reused is False


def test_tree_is_standalone_after_its_scratch_is_gone(stack, tmp_path):
    o = opts(tmp_path)
    st = sources.prepare(lock_of(tmp_path, deepep_pin(stack)), "deepep", o, project(tmp_path))
    cache_objects = (o.cache.root / "git").resolve()
    for repo in (st.path, st.path / SUB):
        alternates = (repo / ".git" / "objects" / "info" / "alternates").read_text().split()
        assert alternates, repo
        for d in map(Path, alternates):  # flattened straight onto the cache's bare repos
            assert d.is_dir() and cache_objects in d.parents, (repo, d)
            assert (o.cache.root / "trees").resolve() not in d.parents
    # the scratch (materialized src + patch scratch) was deleted; the tree's objects still resolve
    assert [p for p in (o.cache.root / "trees").iterdir() if p.name.startswith(".")] == []
    assert git("cat-file", "-p", "HEAD", cwd=st.path).startswith(f"tree {stack.patched}\nparent {stack.rev}\n")
    assert git("rev-parse", "HEAD^^{tree}", cwd=st.path) == stack.tree
    assert git("diff", "--name-only", stack.rev, "HEAD", cwd=st.path) == "csrc/ep.cpp"
    assert git("status", "--porcelain", cwd=st.path) == ""
    git("fsck", "--no-dangling", cwd=st.path / SUB)  # the submodule is a complete, walkable repo
    assert git("cat-file", "-p", "HEAD:include/fmt/core.h", cwd=st.path / SUB) == "// fmt v1"


def test_plain_tree_history_is_walkable(stack, tmp_path):
    st = sources.prepare(lock_of(tmp_path, nccl_pin(stack)), "nccl", opts(tmp_path), project(tmp_path))
    git("fsck", "--no-dangling", cwd=st.path)  # materialize copies the cache's `shallow` list
    assert git("log", "--format=%H", cwd=st.path) == stack.nccl_rev


def test_patched_tree_history_is_walkable(stack, tmp_path):
    st = sources.prepare(lock_of(tmp_path, deepep_pin(stack)), "deepep", opts(tmp_path), project(tmp_path))
    assert git("log", "--format=%H", cwd=st.path, check=False).split() == [
        git("rev-parse", "HEAD", cwd=st.path),
        stack.rev,
    ]
    git("fsck", "--no-dangling", cwd=st.path)


def test_wrong_patched_tree_leaves_nothing(stack, tmp_path):
    bogus = "f" * 40
    pin = deepep_pin(stack, patched_tree=bogus, patches=(replace(deepep_pin(stack).patches[0], tree=None),))
    o = opts(tmp_path)
    with pytest.raises(PatchError, match=f"expected tree {bogus}"):
        sources.prepare(lock_of(tmp_path, pin), "deepep", o, project(tmp_path))
    assert trees_dir_entries(o) == []


def test_unknown_pin_names_known_pins(stack, tmp_path):
    with pytest.raises(LockError, match=r"upstreams\.nope: no such pin \(known: deepep, nccl\)"):
        sources.prepare(
            lock_of(tmp_path, deepep_pin(stack), nccl_pin(stack)), "nope", opts(tmp_path), project(tmp_path)
        )


def test_a_reused_tree_must_agree_with_the_series_record(stack, tmp_path):
    """A patched tree is reused only while the series replayed into it (entries and the tree each gave,
    recorded in its .git) agrees with the lock's: a disagreeing record makes the series replay again."""
    lock, o, root = lock_of(tmp_path, deepep_pin(stack)), opts(tmp_path), project(tmp_path)
    first = sources.prepare(lock, "deepep", o, root)
    rec_path = first.path / ".git" / sources.SERIES_RECORD
    rec = json.loads(rec_path.read_text())
    assert rec == {"rev": stack.rev, "entries": [["cherry-pick", stack.pick, None, stack.patched]]}
    assert sources.prepare(lock, "deepep", o, root).reused
    rec["entries"][0][3] = "0" * 40  # as if the lock's checkpoint had been another tree when it was replayed
    rec_path.write_text(json.dumps(rec))
    again = sources.prepare(lock, "deepep", o, root)
    assert not again.reused and json.loads(rec_path.read_text())["entries"][0][3] == stack.patched


def _format_patch(stack: Stack, rev: str) -> bytes:
    """`git format-patch` of `rev` with an `Upstream-Status: Pending` line in its message body."""
    text = git("format-patch", "-1", "--stdout", rev, cwd=stack.srv / "deepep") + "\n"
    return text.replace("\n---\n", "\n\nUpstream-Status: Pending\n---\n", 1).encode()


def test_a_changed_series_is_replayed_even_when_its_target_tree_is_in_the_cache(stack, tmp_path):
    """Issue 29 item 4: a patched tree was reused under its target tree hash alone (and a series record that named a
    patch file by its path): a patch file with other bytes, its new sha256 in the lock and a `patched-tree` left as
    it was, reused the old tree and said it verified. Now the cache key holds the base rev and every entry's id and
    sha256: the changed series is replayed, and the stale patched-tree is found."""
    import hashlib

    root, o = project(tmp_path), opts(tmp_path)
    (root / "patches").mkdir()
    first = _format_patch(stack, stack.pick)
    (root / "patches" / "0001.patch").write_bytes(first)
    entry = PatchEntry(
        "mbox",
        "patches/0001.patch",
        "Pending",
        index=1,
        sha256=hashlib.sha256(first).hexdigest(),
        tree=None,
    )
    pin = deepep_pin(stack, patches=(entry,))
    st = sources.prepare(lock_of(tmp_path, pin), "deepep", o, root)
    assert st.tree == stack.patched and not st.reused
    assert sources.prepare(lock_of(tmp_path, pin), "deepep", o, root).reused  # same series: reused
    # a reviewed change of the patch (another value), the lock's sha256 moved with it, its patched-tree not
    srv = stack.srv / "deepep"
    git("checkout", "-q", "-b", "other", stack.rev, cwd=srv)
    other = gr.commit_files(srv, {"csrc/ep.cpp": "int kMaxQps = 7;\n"}, "EFA auto-QP cap, another value")
    changed = _format_patch(stack, other)
    (root / "patches" / "0001.patch").write_bytes(changed)
    moved = deepep_pin(stack, patches=(replace(entry, sha256=hashlib.sha256(changed).hexdigest()),))
    assert sources.tree_key(moved) != sources.tree_key(pin)
    with pytest.raises(PatchError, match=f"expected tree {stack.patched}"):
        sources.prepare(lock_of(tmp_path, moved), "deepep", o, root)
    # the base rev is part of the key too
    assert sources.tree_key(replace(pin, rev="0" * 40)) != sources.tree_key(pin)
    assert sources.tree_key(nccl_pin(stack)) == f"nccl-{stack.nccl_tree}"  # no series: the tree alone


# ------------------------------------------------------- untrusted cache: reuse re-hashes the files on disk


@pytest.mark.parametrize(
    "tamper",
    [
        "skip-worktree",
        "assume-unchanged",
        "untracked",
        "ignored",
        "submodule-file",
        "fsmonitor-config",
        "info-attributes",
        "submodule-gitfile",
        "commondir",
    ],
)
def test_tampered_cached_tree_is_remade_not_reused(stack, tmp_path, tamper):
    """A cached tree whose files differ from the pin while git's own index hides it (skip-worktree,
    assume-unchanged), with an untracked or ignored file added, or with config that could run a program,
    is made again from the verified cache: never reused and reported verified."""
    lock, o = lock_of(tmp_path, deepep_pin(stack)), opts(tmp_path)
    first = sources.prepare(lock, "deepep", o, project(tmp_path))
    ep = first.path / "csrc" / "ep.cpp"
    marker = tmp_path / "ran"
    if tamper in ("skip-worktree", "assume-unchanged"):
        git("update-index", f"--{tamper}", "csrc/ep.cpp", cwd=first.path)
        ep.write_text("int kMaxQps = 999;\n")
        assert git("status", "--porcelain", cwd=first.path) == ""  # git's own status sees nothing
    elif tamper == "untracked":
        (first.path / "csrc" / "evil.h").write_text("#define kMaxQps 999\n")
    elif tamper == "ignored":
        (first.path / ".git" / "info").mkdir(exist_ok=True)  # ignored by git, still a file the build sees
        (first.path / ".git" / "info" / "exclude").write_text("*.pth\n")
        (first.path / "evil.pth").write_text("import os\n")
    elif tamper == "submodule-file":
        core = first.path / SUB / "include" / "fmt" / "core.h"
        git("update-index", "--skip-worktree", "include/fmt/core.h", cwd=first.path / SUB)
        core.write_text("// not fmt\n")
    elif tamper == "fsmonitor-config":
        gr.set_config(first.path, "core.fsmonitor", f"touch {marker}; false")
    elif tamper == "submodule-gitfile":  # git follows `gitdir:` to a folder whose config runs a clean filter
        evil = tmp_path / "evil-gitdir"
        (first.path / SUB / ".git").rename(evil)
        (first.path / SUB / ".git").write_text(f"gitdir: {evil}\n")
        (evil / "config").write_text((evil / "config").read_text() + f'[filter "x"]\n\tclean = "touch {marker}; cat"\n')
        (evil / "info").mkdir(exist_ok=True)
        (evil / "info" / "attributes").write_text("* filter=x\n")
    elif tamper == "commondir":  # git reads the config of the folder `commondir` names
        common = tmp_path / "common"
        (common / "info").mkdir(parents=True)
        (common / "config").write_text(f'[filter "x"]\n\tclean = "touch {marker}; cat"\n')
        (common / "info" / "attributes").write_text("* filter=x\n")
        (first.path / ".git" / "commondir").write_text(f"{common}\n")
    else:
        (first.path / ".git" / "info").mkdir(exist_ok=True)
        (first.path / ".git" / "info" / "attributes").write_text("* -text\n")

    take_servers_away(stack)  # made again from the verified cache
    again = sources.prepare(lock, "deepep", o, project(tmp_path))
    assert again.reused is False and again.path == first.path
    assert ep.read_text() == "int kMaxQps = 6;  // EP_EFA_MAX_QPS\n"
    assert not (first.path / "csrc" / "evil.h").exists() and not (first.path / "evil.pth").exists()
    assert (first.path / SUB / "include" / "fmt" / "core.h").read_text() == "// fmt v1\n"
    assert not marker.exists()
    # and the fresh tree is reused as it is
    assert sources.prepare(lock, "deepep", o, project(tmp_path)).reused is True


def test_gitlink_the_lock_does_not_pin_stays_an_empty_folder(stack, tmp_path):
    """A gitlink whose submodule the lock does not pin (NeMo-RL's 3rdparty workspaces: the H200 all-gates run,
    results/all_gates/2026-12-02-h200-one-gpu) is never checked out: the tree still verifies and is reused, and a
    file put into that empty folder makes the tree again."""
    pin = deepep_pin(stack, submodules=(), patches=(), patched_tree=None)
    lock, o = lock_of(tmp_path, pin), opts(tmp_path)
    first = sources.prepare(lock, "deepep", o, project(tmp_path))
    assert first.tree == stack.tree and not any((first.path / SUB).iterdir())
    assert sources.prepare(lock, "deepep", o, project(tmp_path)).reused is True
    (first.path / SUB / "evil.h").write_text("#define FMT 0\n")
    again = sources.prepare(lock, "deepep", o, project(tmp_path))
    assert again.reused is False and not (first.path / SUB / "evil.h").exists()


def test_worktree_tree_hashes_files_not_the_index(stack, tmp_path):
    from reprostack.fetch.checkout import worktree_tree

    o = opts(tmp_path)
    st = sources.prepare(lock_of(tmp_path, nccl_pin(stack)), "nccl", o, project(tmp_path))
    assert worktree_tree(st.path) == stack.nccl_tree
    git("update-index", "--skip-worktree", "makefiles/version.mk", cwd=st.path)
    (st.path / "makefiles" / "version.mk").write_text("NCCL_MAJOR := 9\n")
    assert git("rev-parse", "HEAD^{tree}", cwd=st.path) == stack.nccl_tree
    assert worktree_tree(st.path) != stack.nccl_tree


# --------------------------------------------------------------------------- issue 14: patch files, interrupted work


def diff_entry_project(s: Stack, tmp_path: Path) -> tuple[GitPin, Path]:
    """A deepep pin whose series is one committed plain diff (the pick's change) vouched by its sha256."""
    import hashlib

    proj = project(tmp_path)
    f = proj / "patches" / "deepep" / "0001-qp-cap.diff"
    f.parent.mkdir(parents=True, exist_ok=True)
    body = git("diff", s.rev, s.pick, cwd=s.srv / "deepep")
    f.write_bytes(b"# EFA auto-QP cap.\n#\n# Upstream-Status: Pending\n" + body.encode() + b"\n")
    e = PatchEntry(
        "diff",
        "patches/deepep/0001-qp-cap.diff",
        "Pending",
        tree=s.patched,
        index=1,
        sha256=hashlib.sha256(f.read_bytes()).hexdigest(),
        where="upstreams.lock:42",
    )
    return deepep_pin(s, patches=(e,)), proj


def test_patch_file_changed_after_lock_is_refused_on_a_warm_cache(stack, tmp_path):
    pin, proj = diff_entry_project(stack, tmp_path)
    lock, o = lock_of(tmp_path, pin), opts(tmp_path)
    first = sources.prepare(lock, "deepep", o, proj)
    assert first.reused is False and first.tree == stack.patched
    assert sources.prepare(lock, "deepep", o, proj).reused is True
    f = proj / pin.patches[0].value
    f.write_bytes(f.read_bytes().replace(b"EFA", b"EFa", 1))  # one byte, after the lock was written
    with pytest.raises(PatchError) as ei:
        sources.prepare(lock, "deepep", o, proj)
    msg = str(ei.value)
    assert (
        msg.startswith(
            "upstreams.lock:42: deepep #1 diff patches/deepep/0001-qp-cap.diff: patch file "
            "patches/deepep/0001-qp-cap.diff has sha256 "
        )
        and "\n" not in msg
    )
    assert f"the lock pins {pin.patches[0].sha256}" in msg
    assert first.path.is_dir()  # the good tree is left alone: the lock, not the tree, is in question


def test_two_concurrent_patch_processes_on_one_cache_both_succeed(stack, tmp_path):
    """Two real `reprostack patch` processes race on one empty cache: one makes the tree, the other waits on the
    tree's flock and reuses it (before: both fetched, then the second rename crashed on a non-empty folder)."""
    import subprocess
    import sys

    lock = write_project(tmp_path / "proj", stack)
    cache = tmp_path / "cache"
    cmd = [sys.executable, "-m", "reprostack", "patch", "deepep", "nccl", "--lock", str(lock), "--cache", str(cache)]
    env = {k: v for k, v in os.environ.items() if k != "REPROSTACK_MIRRORS"}
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    key = sources.tree_key(load(lock).git("deepep"))
    for out, _ in outs:
        assert f"deepep: {cache}/trees/{key} tree {stack.patched}" in out
    assert sorted(os.listdir(cache / "trees")) == sorted([key, f"nccl-{stack.nccl_tree}"])
    assert not list((cache / "git").glob(".*"))  # no half-made repo left


def test_leftovers_of_a_killed_run_are_cleaned_and_the_fetch_succeeds(stack, tmp_path):
    """What kill -9 leaves mid-fetch and mid-patch (git's shallow.lock, tmp_pack_*/tmp_idx_*, a ref lock, a
    half-made repo folder, scratch trees, an import scratch): the next run removes it under the flock and works."""
    lock, o = lock_of(tmp_path, deepep_pin(stack)), opts(tmp_path)
    sources.fetch(deepep_pin(stack), o)  # the repos exist; now leave what a killed run leaves
    repo = o.cache.repo_dir(stack.url("deepep"))
    for rel in (
        "shallow.lock",
        "objects/pack/tmp_pack_Ab12Cd",
        "objects/pack/tmp_idx_Ab12Cd",
        "packed-refs.lock",
        "refs/reprostack/x.lock",
    ):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(b"\0" * 4096)
    (repo.parent / f".{repo.name}.k1ll3d").mkdir()
    shutil.rmtree(o.cache.root / "verified")  # a fetch killed before its marker: the next run verifies again
    trees = o.cache.root / "trees"
    trees.mkdir()
    scratch = trees / f".{sources.tree_key(deepep_pin(stack))}.x9y8z7"
    (scratch / "src" / "deep").mkdir(parents=True)
    killed_import = o.cache.scratch_dir() / "import-dead"
    killed_import.mkdir()
    (killed_import / ".owner").touch()  # its flock died with its process
    with pytest.raises(Exception):  # git itself refuses to fetch over a stale shallow.lock
        git("fetch", "--depth=1", stack.url("deepep"), stack.rev, cwd=repo)
    st = sources.prepare(lock, "deepep", o, project(tmp_path))
    assert st.tree == stack.patched and st.reused is False
    for rel in (
        "shallow.lock",
        "objects/pack/tmp_pack_Ab12Cd",
        "objects/pack/tmp_idx_Ab12Cd",
        "packed-refs.lock",
        "refs/reprostack/x.lock",
    ):
        assert not (repo / rel).exists(), rel
    assert not (repo.parent / f".{repo.name}.k1ll3d").exists()
    assert trees_dir_entries(o) == [sources.tree_key(deepep_pin(stack))]
    o.cache.clean_scratch()
    assert not killed_import.exists()


def test_live_scratch_is_not_cleaned(tmp_path):
    c = Cache(tmp_path / "cache")
    with c.scratch("import-") as live:
        assert c.clean_scratch() == [] and live.is_dir()
    assert not live.exists()


RELAY = """\
import os, subprocess, sys, time
n, sent = int(sys.argv[1]), 0
p = subprocess.Popen(["git", "upload-pack", sys.argv[2]], stdout=subprocess.PIPE)
while True:
    b = os.read(p.stdout.fileno(), 65536)
    if not b:
        break
    if sent < n <= sent + len(b):
        os.write(1, b[:n - sent])
        time.sleep(120)
    os.write(1, b)
    sent += len(b)
"""


def test_kill_9_during_a_fetch_then_the_next_fetch_succeeds(stack, tmp_path):
    """A real git fetch into the cache repo, stalled mid-pack by its server (a relay that stops after 200000 bytes
    of a 1 MB pack) and killed with SIGKILL, leaves `shallow.lock` (after which every `git fetch --depth` on that
    repo fails) and a `tmp_pack_*`; the next `reprostack fetch` (a real process) cleans both under the flock
    and fetches."""
    import signal
    import subprocess
    import sys
    import time

    lock = write_project(tmp_path / "proj", stack)
    big = gr.init_repo(tmp_path / "big")
    gr.commit_files(big, {"blob.bin": os.urandom(1 << 20)}, "a pack big enough to be cut")
    cache = Cache(tmp_path / "cache")
    with cache.lock(stack.url("deepep")):
        repo = cache.ensure_repo(stack.url("deepep"))
    relay = tmp_path / "relay.py"
    relay.write_text(RELAY)
    p = subprocess.Popen(
        [
            "git",
            "-c",
            "protocol.ext.allow=always",
            "-c",
            "fetch.unpackLimit=1",
            "fetch",
            "--depth=1",
            # past the pack's first side-band packets (32 KiB each): a cut inside the first one never reaches
            # index-pack, and no tmp_pack is made (after 20000 bytes, 1 run in 4 stalled that way)
            f"ext::{sys.executable} {relay} 200000 {big}",
            "HEAD",
        ],
        cwd=repo,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not list(repo.glob("objects/pack/tmp_pack_*")) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)  # git, its transport helper and the stalled server, as a lost node would
    p.wait()
    assert (repo / "shallow.lock").exists() and list(repo.glob("objects/pack/tmp_pack_*"))
    env = {k: v for k, v in os.environ.items() if k != "REPROSTACK_MIRRORS"}
    again = subprocess.run(
        [sys.executable, "-m", "reprostack", "fetch", "deepep", "--lock", str(lock), "--cache", str(cache.root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr
    assert f"deepep: {stack.rev} tree {stack.tree} ok" in again.stdout
    assert not (repo / "shallow.lock").exists() and not list(repo.glob("objects/pack/tmp_pack_*"))
