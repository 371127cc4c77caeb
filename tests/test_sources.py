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
from reprostack.lock import GitPin, Lock, PatchEntry, Submodule

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
    gr.commit_files(deepep, {"README.md": "DeepEP\n", "csrc/ep.cpp": "int kMaxQps = 128;\n",
                             "tests/elastic/test_ep.py": "raise SystemExit('not run on CPU')\n"}, "d1")
    gr.add_submodule(deepep, SUB, "https://example.invalid/fmtlib/fmt", fmt_rev)
    rev = gr.commit_files(deepep, {"csrc/gin.cpp": "int gin;\n"}, "d3: the pinned commit")
    gr.commit_files(deepep, {"csrc/later.cpp": "int later;\n"}, "d4: main moves on")
    (pick,) = gr.make_pull_ref(deepep, 612, rev, [({"csrc/ep.cpp": "int kMaxQps = 6;  // EP_EFA_MAX_QPS\n"},
                                                   "EFA auto-QP cap")])

    nccl = gr.init_repo(srv / "nccl")
    nccl_rev = gr.commit_files(nccl, {"makefiles/version.mk": "NCCL_MAJOR   := 2\nNCCL_MINOR   := 30\nNCCL_PATCH   := 4\n",
                                      "src/nccl.h.in": "#define NCCL_MAJOR ${nccl:Major}\n"}, "nccl 2.30.4-1")
    gr.tag(nccl, "v2.30.4-1", nccl_rev)
    return Stack(srv, fmt_rev, gr.tree_of(fmt, fmt_rev), rev, gr.tree_of(deepep, rev), pick,
                 gr.tree_of(deepep, pick), nccl_rev, gr.tree_of(nccl, nccl_rev))


def lock_text(s: Stack, base: str | None = None) -> str:
    """An upstreams.lock for the stack; URLs are the server folders, or `<base>/<name>` (e.g. for --mirror)."""
    return f"""\
# test lock
lockfile-version: 1
upstreams:
  deepep:
    kind: git
    url: {s.url('deepep', base)}
    original: test release
    rev: {s.rev}
    tree: {s.tree}
    submodules:
      {SUB}:
        url: {s.url('fmt', base)}
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
    url: {s.url('nccl', base)}
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
    shutil.copytree(REPO_ROOT / "kernels", root / "kernels")
    lock = root / "upstreams.lock"
    lock.write_text(lock_text(s, base))
    return lock


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
        name="deepep", url=s.url("deepep"), rev=s.rev, tree=s.tree, original="test release",
        submodules=(Submodule(SUB, s.url("fmt"), s.fmt_rev, s.fmt_tree),),
        patches=(PatchEntry("cherry-pick", s.pick, "Submitted [PR #612]", ref="refs/pull/612/head",
                            description="EFA auto-QP cap", tree=s.patched, index=1),),
        patched_tree=s.patched)
    return replace(pin, **kw)


def nccl_pin(s: Stack) -> GitPin:
    return GitPin(name="nccl", url=s.url("nccl"), rev=s.nccl_rev, tree=s.nccl_tree, original="v2.30.4-1",
                  fetch_refs=("refs/tags/v2.30.4-1",))


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
    assert st.path == o.cache.root / "trees" / f"deepep-{stack.patched}"
    assert git("rev-parse", "HEAD^{tree}", cwd=st.path) == stack.patched
    assert git("rev-parse", "HEAD^", cwd=st.path) == stack.rev  # the series sits on the pinned rev
    assert git("status", "--porcelain", cwd=st.path) == ""
    assert (st.path / "csrc" / "ep.cpp").read_text() == "int kMaxQps = 6;  // EP_EFA_MAX_QPS\n"
    assert not (st.path / "csrc" / "later.cpp").exists()  # main's later commit is not in the pinned tree
    # the submodule is checked out at the lock's gitlink
    assert git("rev-parse", "HEAD", cwd=st.path / SUB) == stack.fmt_rev
    assert (st.path / SUB / "include" / "fmt" / "core.h").read_text() == "// fmt v1\n"
    # nothing but the final tree is left in trees/ (the scratch is gone)
    assert trees_dir_entries(o) == [f"deepep-{stack.patched}"]


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
    assert git("log", "--format=%H", cwd=st.path, check=False).split() == [git("rev-parse", "HEAD", cwd=st.path),
                                                                          stack.rev]
    git("fsck", "--no-dangling", cwd=st.path)


def test_wrong_patched_tree_leaves_nothing(stack, tmp_path):
    bogus = "f" * 40
    pin = deepep_pin(stack, patched_tree=bogus,
                     patches=(replace(deepep_pin(stack).patches[0], tree=None),))
    o = opts(tmp_path)
    with pytest.raises(PatchError, match=f"expected tree {bogus}"):
        sources.prepare(lock_of(tmp_path, pin), "deepep", o, project(tmp_path))
    assert trees_dir_entries(o) == []


def test_unknown_pin_names_known_pins(stack, tmp_path):
    with pytest.raises(LockError, match=r"upstreams\.nope: no such pin \(known: deepep, nccl\)"):
        sources.prepare(lock_of(tmp_path, deepep_pin(stack), nccl_pin(stack)), "nope", opts(tmp_path),
                        project(tmp_path))


def test_a_reused_tree_must_agree_with_the_series_record(stack, tmp_path):
    """A patched tree is reused only while the series replayed into it (entries and the tree each gave,
    recorded in its .git) agrees with the lock's: a disagreeing record makes the series replay again."""
    lock, o, root = lock_of(tmp_path, deepep_pin(stack)), opts(tmp_path), project(tmp_path)
    first = sources.prepare(lock, "deepep", o, root)
    rec_path = first.path / ".git" / sources.SERIES_RECORD
    rec = json.loads(rec_path.read_text())
    assert rec == {"rev": stack.rev, "entries": [["cherry-pick", stack.pick, stack.patched]]}
    assert sources.prepare(lock, "deepep", o, root).reused
    rec["entries"][0][2] = "0" * 40  # as if the lock's checkpoint had been another tree when it was replayed
    rec_path.write_text(json.dumps(rec))
    again = sources.prepare(lock, "deepep", o, root)
    assert not again.reused and json.loads(rec_path.read_text())["entries"][0][2] == stack.patched


# ------------------------------------------------------- untrusted cache: reuse re-hashes the files on disk


@pytest.mark.parametrize("tamper", ["skip-worktree", "assume-unchanged", "untracked", "ignored", "submodule-file",
                                    "fsmonitor-config", "info-attributes"])
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
