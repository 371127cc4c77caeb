"""A small upstream, its submodule and a project (git repo with upstreams.lock + patches/) for the bump tests.

Upstream `https://github.com/acme/demo` (served from a local repo through REPROSTACK_MIRRORS) at `base`:
a.txt, c.txt, d.txt, e.txt (40 lines each), b.txt, submodule `sub` -> s1. The series on `base`:

  1 cherry-pick p1 (refs/pull/1/head: a.txt line 5)          -> kept at main
  2 cherry-pick bk (on main: d.txt line 3)                    -> upstreamed: reachable
  3 cherry-pick p2 (refs/pull/2/head: b.txt), merged on main
    as p2r, rebased (other parent, other message)             -> upstreamed: same patch-id
  4 mbox  patches/demo/0001-c.patch (c.txt line 30)           -> refreshed: main put 2 lines on top of c.txt
  5 diff  patches/demo/d.diff (d.txt line 18)                 -> refreshed: main put 3 lines on top of d.txt
  6 mbox  patches/demo/0002-e.patch (e.txt line 10)           -> kept
main also moves the `sub` gitlink s1 -> s2. Branch `rival` = main + a.txt line 5 changed otherwise (a
conflict for entry 1). Dates are fixed per commit (1700000000 + n days) so "days behind" is known.
"""

from __future__ import annotations

import hashlib

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from reprostack.gitcmd import git, git_env

URL = "https://github.com/acme/demo"
SUB_URL = "https://github.com/acme/sub"
DAY = 86400


def lines(prefix: str, n: int = 40) -> list[str]:
    return [f"{prefix}{i}" for i in range(1, n + 1)]


def text(ls: list[str]) -> str:
    return "".join(l + "\n" for l in ls)


def commit(repo: Path, files: dict[str, str], message: str, day: int) -> str:
    for name, data in files.items():
        (repo / name).write_text(data)
        git("add", "--", name, cwd=repo)
    stamp = f"{1700000000 + day * DAY} +0000"
    git("commit", "-q", "-m", message, cwd=repo, env={"GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp})
    return git("rev-parse", "HEAD", cwd=repo)


def changed(ls: list[str], i: int, new: str) -> list[str]:
    out = list(ls)
    out[i - 1] = new
    return out


@dataclass
class Scenario:
    up: Path
    sub: Path
    project: Path
    c: dict[str, str] = field(default_factory=dict)

    @property
    def lock(self) -> Path:
        return self.project / "upstreams.lock"

    def mirrors(self) -> str:
        return f"{URL}={self.up},{SUB_URL}={self.sub}"

    def tree(self, rev: str) -> str:
        return git("rev-parse", f"{rev}^{{tree}}", cwd=self.up)


def _stdout(args: list[str], cwd: Path) -> str:
    return subprocess.run(args, cwd=cwd, env=git_env(), check=True, capture_output=True, text=True).stdout


def make(root: Path) -> Scenario:
    sub = root / "sub"
    sub.mkdir(parents=True)
    git("init", "-q", "-b", "main", cwd=sub)
    s = Scenario(up=root / "up", sub=sub, project=root / "project")
    s.c["s1"] = commit(sub, {"s.txt": "one\n"}, "s1", 0)
    s.c["s2"] = commit(sub, {"s.txt": "two\n"}, "s2", 1)

    up = s.up
    up.mkdir()
    git("init", "-q", "-b", "main", cwd=up)
    a, c, d, e = lines("a"), lines("c"), lines("d"), lines("e")
    (up / ".gitmodules").write_text(f'[submodule "sub"]\n\tpath = sub\n\turl = {SUB_URL}\n')
    git("add", ".gitmodules", cwd=up)
    git("update-index", "--add", "--cacheinfo", f"160000,{s.c['s1']},sub", cwd=up)
    s.c["base"] = commit(
        up, {"a.txt": text(a), "b.txt": "bravo\n", "c.txt": text(c), "d.txt": text(d), "e.txt": text(e)}, "base", 0
    )

    # PR heads (not on main)
    git("checkout", "-q", "--detach", s.c["base"], cwd=up)
    s.c["p1"] = commit(up, {"a.txt": text(changed(a, 5, "a5 by PR 1"))}, "p1: a5", 1)
    git("update-ref", "refs/pull/1/head", s.c["p1"], cwd=up)
    git("checkout", "-q", "--detach", s.c["base"], cwd=up)
    s.c["p2"] = commit(up, {"b.txt": "bravo\ncharlie\n"}, "p2: charlie", 2)
    git("update-ref", "refs/pull/2/head", s.c["p2"], cwd=up)
    # the committed patch files, made from throwaway commits on base
    git("checkout", "-q", "--detach", s.c["base"], cwd=up)
    cc = commit(up, {"c.txt": text(changed(c, 30, "c30 patched"))}, "c: patch line 30\n\nUpstream-Status: Pending", 3)
    s.c["mbox_c"] = _stdout(["git", "format-patch", "-1", "--stdout", cc], up)
    ee = commit(up, {"e.txt": text(changed(e, 10, "e10 patched"))}, "e: patch line 10\n\nUpstream-Status: Pending", 3)
    s.c["mbox_e"] = _stdout(["git", "format-patch", "-1", "--stdout", ee], up)
    git("checkout", "-q", "--detach", s.c["base"], cwd=up)
    dd = commit(up, {"d.txt": text(changed(d, 18, "d18 patched"))}, "d: patch line 18", 3)
    s.c["diff_d"] = "# d: patch line 18\n#\n# Upstream-Status: Inappropriate [test only]\n" + _stdout(
        ["git", "diff", s.c["base"], dd], up
    )

    # main moves on
    git("checkout", "-q", "main", cwd=up)
    s.c["bk"] = commit(up, {"d.txt": text(changed(d, 3, "d3 fixed upstream"))}, "bk: d3", 4)
    s.c["p2r"] = commit(up, {"b.txt": "bravo\ncharlie\n"}, "Merge PR 2 (rebased)", 5)
    d2 = ["top1", "top2", "top3"] + changed(d, 3, "d3 fixed upstream")
    s.c["shift"] = commit(up, {"c.txt": text(["new1", "new2"] + c), "d.txt": text(d2)}, "shift c and d", 6)
    git("update-index", "--cacheinfo", f"160000,{s.c['s2']},sub", cwd=up)
    s.c["main"] = commit(up, {}, "sub to s2", 10)
    git("checkout", "-q", "-b", "rival", cwd=up)
    s.c["rival"] = commit(up, {"a.txt": text(changed(a, 5, "a5 by upstream"))}, "rival: a5", 11)
    git("checkout", "-q", "main", cwd=up)

    _project(s)
    return s


def _patched_tree(s: Scenario, files: dict[str, str]) -> str:
    """The tree the old series gives on base, made with git alone (no reprostack code)."""
    w = s.project.parent / "reference"
    git("clone", "-q", "--no-checkout", str(s.up), str(w))
    git("checkout", "-q", "--detach", s.c["base"], cwd=w)
    for k in ("p1", "bk", "p2"):
        git("cherry-pick", s.c[k], cwd=w)
    git("am", "--keep-cr", str(s.project / files["c"]), cwd=w)
    git("apply", "--index", str(s.project / files["d"]), cwd=w)
    git("commit", "-q", "-m", "d", cwd=w)
    git("am", "--keep-cr", str(s.project / files["e"]), cwd=w)
    return git("rev-parse", "HEAD^{tree}", cwd=w)


LOCK = """\
# demo lock: every comment and line outside the bumped block stays byte for byte
lockfile-version: 1
upstreams:
  demo:   # the pin under test
    kind: git
    url: {URL}
    original: base
    rev: {base}
    tree: {base_tree}
    submodules:
      sub: {{url: {SUB_URL}, rev: {s1}, tree: {s1_tree}}}
    patches:
      - {{cherry-pick: {p1}, ref: refs/pull/1/head, upstream-status: "Submitted [PR #1]"}}  # flow style
      - cherry-pick: {bk}
        ref: refs/heads/main
        upstream-status: "Backport [main]"
      - cherry-pick: {p2}   # merged upstream after a rebase
        ref: refs/pull/2/head
        upstream-status: "Submitted [PR #2]"
      - mbox: patches/demo/0001-c.patch
        sha256: {sha_c}  # sha256 of the committed file
        upstream-status: Pending
      - diff: patches/demo/d.diff
        upstream-status: "Inappropriate [test only]"
        sha256: {sha_d}
      - mbox: patches/demo/0002-e.patch
        upstream-status: Pending
        sha256: {sha_e}
        tree: {patched}
    patched-tree: {patched}
    policy: {{track: branch, ref: refs/heads/main}}
  # another pin: never touched
  other:
    kind: git
    url: https://example.invalid/other
    rev: {base}
    tree: {base_tree}
"""


def _project(s: Scenario) -> None:
    p = s.project
    (p / "patches" / "demo").mkdir(parents=True)
    files = {"c": "patches/demo/0001-c.patch", "d": "patches/demo/d.diff", "e": "patches/demo/0002-e.patch"}
    (p / files["c"]).write_text(s.c["mbox_c"])
    (p / files["d"]).write_text(s.c["diff_d"])
    (p / files["e"]).write_text(s.c["mbox_e"])
    patched = _patched_tree(s, files)
    s.c["patched"] = patched
    s1_tree = git("rev-parse", f"{s.c['s1']}^{{tree}}", cwd=s.sub)
    s.lock.write_text(
        LOCK.format(
            URL=URL,
            SUB_URL=SUB_URL,
            base=s.c["base"],
            base_tree=s.tree(s.c["base"]),
            s1=s.c["s1"],
            s1_tree=s1_tree,
            patched=patched,
            **{k: s.c[k] for k in ("p1", "bk", "p2")},
            **{f"sha_{k}": hashlib.sha256((p / f).read_bytes()).hexdigest() for k, f in files.items()},
        )
    )
    (p / ".gitignore").write_text("/out/\n")
    git("init", "-q", "-b", "work", cwd=p)
    git("config", "user.name", "Bump Tester", cwd=p)
    git("config", "user.email", "bump@test.invalid", cwd=p)
    git("add", "-A", cwd=p)
    git("commit", "-q", "-m", "project", cwd=p)
