"""reprostack.fetch against real local git repositories (no network): fetch by SHA and its fallbacks,
verification, offline use, bundles, mirrors, checkout."""

from __future__ import annotations

import io
import json
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

import gitrepos as gr
from reprostack.errors import FetchError
from reprostack.fetch import Cache, FetchedGit, fetch_git, import_bundle, materialize, mirrors_from_env, write_bundle
from reprostack.fetch import verify
from reprostack.fetch.cache import normalise_url, url_key
from reprostack.launch.torchrun import free_port
import os

from reprostack import gitcmd
from reprostack.gitcmd import GitFailed, git, git_remote, transient
from reprostack.lock import GitPin, PatchEntry, Submodule

SUB = "third-party/lib"


@dataclass
class World:
    """Two server repos: `up` (superproject, gitlink to `lib` at SUB) and `lib`.

    main: u1 -> u2 (adds the submodule at lib_v2) -> rev -> u4; refs/pull/7/head: rev -> p1 -> p2
    (p1, p2 reachable only from that ref). pin: rev + cherry-picks p1, p2 (ref refs/pull/7/head).
    """

    up: Path
    lib: Path
    lib_v1: str
    lib_v2: str
    rev: str
    u4: str
    p1: str
    p2: str
    pin: GitPin


def make_world(root: Path, *, up_url: str | None = None, lib_url: str | None = None) -> World:
    lib = gr.init_repo(root / "lib")
    lib_v1 = gr.commit_files(lib, {"lib.h": "int lib(void); // v1\n"}, "lib v1")
    lib_v2 = gr.commit_files(lib, {"lib.h": "int lib(void); // v2\n"}, "lib v2")
    up = gr.init_repo(root / "up")
    gr.commit_files(up, {"README": "up\n", "src/a.c": "int a;\n"}, "u1")
    gr.add_submodule(up, SUB, "https://example.invalid/org/lib", lib_v2)
    rev = gr.commit_files(up, {"src/b.c": "int b;\n"}, "u3: the pinned commit")
    u4 = gr.commit_files(up, {"src/c.c": "int c;\n"}, "u4: main moves on")
    p1, p2 = gr.make_pull_ref(up, 7, rev, [({"feature.txt": "one\n"}, "p1"), ({"feature.txt": "one\ntwo\n"}, "p2")])
    pin = GitPin(
        name="up",
        url=up_url or str(up),
        rev=rev,
        tree=gr.tree_of(up, rev),
        submodules=(Submodule(SUB, lib_url or str(lib), lib_v2, gr.tree_of(lib, lib_v2)),),
        patches=(
            PatchEntry("cherry-pick", p1, "Submitted [PR #7]", ref="refs/pull/7/head", index=1),
            PatchEntry("cherry-pick", p2, "Submitted [PR #7]", ref="refs/pull/7/head", index=2),
        ),
    )
    return World(up, lib, lib_v1, lib_v2, rev, u4, p1, p2, pin)


@pytest.fixture(autouse=True)
def _no_env_mirrors(monkeypatch):
    monkeypatch.delenv("REPROSTACK_MIRRORS", raising=False)


@pytest.fixture
def world(tmp_path) -> World:
    return make_world(tmp_path / "srv")


def refs_of(repo: Path) -> set[str]:
    return set(git("for-each-ref", "--format=%(refname)", cwd=repo).split())


def speak_protocol_v0(cache: Cache, *urls: str) -> None:
    """Make the cache's fetches use protocol v0, where a local server enforces uploadpack.allow*SHA1InWant
    (protocol v2 upload-pack serves any object it has)."""
    for url in urls:
        gr.set_config(cache.ensure_repo(url), "protocol.version", "0")


def assert_fetched(f: FetchedGit, w: World, cache: Cache) -> None:
    assert f.repo == cache.repo_dir(w.pin.url) and set(f.submodules) == {SUB}
    assert gr.tree_of(f.repo, w.rev) == w.pin.tree
    for c in (w.p1, w.p2):  # cherry-picks and their parents are complete
        assert gr.has_object(f.repo, f"{c}^1^{{tree}}")
    assert gr.tree_of(f.submodules[SUB], w.lib_v2) == w.pin.submodules[0].tree
    assert cache.read_marker(w.pin.url, w.rev)["tree"] == w.pin.tree
    assert cache.read_marker(w.pin.url, w.p1)["with_parent"] is True
    assert cache.read_marker(w.pin.submodules[0].url, w.lib_v2) is not None


def test_fetch_by_sha_then_materialize(world, tmp_path):
    cache = Cache(tmp_path / "cache")
    f = fetch_git(world.pin, cache=cache)
    assert_fetched(f, world, cache)
    refs = refs_of(f.repo)
    # reachability proof: the hint ref (refs/pull/7/head descends from rev) was enough, no branch was needed
    assert "refs/reprostack/hints/pull/7/head" in refs
    assert not any(r.startswith(("refs/reprostack/heads/", "refs/reprostack/tags/")) for r in refs)
    assert gr.has_object(f.repo, world.u4) is False  # shallow: only what the pin needs

    dest = materialize(f, tmp_path / "wt")
    assert git("rev-parse", "HEAD^{tree}", cwd=dest) == world.pin.tree
    assert git("rev-parse", "HEAD", cwd=dest) == world.rev
    assert git("symbolic-ref", "-q", "HEAD", cwd=dest, check=False) == ""  # detached
    assert (dest / SUB / "lib.h").read_text() == "int lib(void); // v2\n"
    assert git("status", "--porcelain", cwd=dest) == ""
    git("cherry-pick", world.p1, world.p2, cwd=dest)  # the patch stage's operation works offline
    assert git("rev-parse", "HEAD^{tree}", cwd=dest) == gr.tree_of(world.up, world.p2)

    with pytest.raises(FetchError, match="already exists"):
        materialize(f, dest)


@pytest.mark.parametrize("allow_any_sha", [True, False])
def test_sha_in_want_allowed_or_refused(world, tmp_path, allow_any_sha):
    for server in (world.up, world.lib):
        gr.set_config(server, "uploadpack.allowAnySHA1InWant", "true" if allow_any_sha else "false")
    cache = Cache(tmp_path / "cache")
    speak_protocol_v0(cache, world.pin.url, world.pin.submodules[0].url)
    f = fetch_git(world.pin, cache=cache)
    assert_fetched(f, world, cache)
    refs = refs_of(f.repo)
    # by id or not, the hint ref is fetched (to prove reachability, or to get the commits); heads/tags were
    # not needed for the superproject
    assert "refs/reprostack/hints/pull/7/head" in refs
    assert not any(r.startswith("refs/reprostack/heads/") for r in refs)
    # lib has no hint ref: its branches prove lib_v2 (lib's branch tip: even a refusing v0 server serves it by id)
    assert f"refs/reprostack/{world.lib_v2}" in refs_of(f.submodules[SUB])
    assert "refs/reprostack/heads/main" in refs_of(f.submodules[SUB])


def test_wrong_tree_is_an_error_and_not_marked(world, tmp_path):
    cache = Cache(tmp_path / "cache")
    pin = replace(world.pin, tree="0" * 40)
    with pytest.raises(FetchError, match=rf"up: tree at {world.rev[:8]} is {world.pin.tree}, lock says 0{{40}}"):
        fetch_git(pin, cache=cache)
    assert cache.read_marker(pin.url, world.rev) is None
    with pytest.raises(FetchError, match="lock says 0{40}"):  # objects are there now: still refused offline
        fetch_git(pin, cache=cache, offline=True)


def test_submodule_gitlink_must_match_the_lock(world, tmp_path):
    sub = replace(world.pin.submodules[0], rev=world.lib_v1)
    pin = replace(world.pin, submodules=(sub,))
    with pytest.raises(FetchError) as e:
        fetch_git(pin, cache=Cache(tmp_path / "cache"))
    assert world.lib_v2 in str(e.value) and world.lib_v1 in str(e.value) and SUB in str(e.value)


def test_moved_tag_does_not_matter(world, tmp_path):
    gr.tag(world.up, "v1", world.rev)
    pin = replace(world.pin, fetch_refs=("refs/tags/v1",))
    assert_fetched(fetch_git(pin, cache=Cache(tmp_path / "c1")), world, Cache(tmp_path / "c1"))
    gr.tag(world.up, "v1", world.u4, force=True)  # the tag moves on; the pin names a commit
    for cache, v0 in ((Cache(tmp_path / "c2"), False), (Cache(tmp_path / "c3"), True)):
        if v0:
            speak_protocol_v0(cache, pin.url, pin.submodules[0].url)
        assert_fetched(fetch_git(pin, cache=cache), world, cache)


@pytest.mark.parametrize("v0", [False, True])
def test_force_pushed_and_pruned_commit_is_gone(world, tmp_path, v0):
    gone = gr.commit_files(world.up, {"src/d.c": "int d;\n"}, "u5: force-pushed away later")
    pin = GitPin(
        name="up",
        url=str(world.up),
        rev=gone,
        tree=gr.tree_of(world.up, gone),
        fetch_refs=("refs/heads/main", "refs/heads/release"),
    )
    gr.force_push_away(world.up, "main", world.u4)
    assert not gr.has_object(world.up, gone)
    cache = Cache(tmp_path / "cache")
    if v0:
        speak_protocol_v0(cache, pin.url)
    with pytest.raises(FetchError) as e:
        fetch_git(pin, cache=cache)
    msg = str(e.value)
    assert f"commit {gone[:12]} is gone from the server" in msg
    assert "refs/heads/main" in msg and "not on the server: refs/heads/release" in msg


def test_typo_url_fails_fast(world, tmp_path):
    pin = replace(world.pin, url=str(tmp_path / "srv" / "upp"), submodules=(), patches=())
    with pytest.raises(
        FetchError, match=r"up: cannot fetch .* from .*/srv/upp: .*does not appear to be a git repository"
    ):
        fetch_git(pin, cache=Cache(tmp_path / "cache"), timeout=30)


def test_offline_with_empty_cache(world, tmp_path):
    with pytest.raises(FetchError, match=r"up: .* is not in the cache .*reprostack fetch.*reprostack bundle"):
        fetch_git(world.pin, cache=Cache(tmp_path / "cache"), offline=True)
    assert not (tmp_path / "cache" / "verified").exists()


def test_offline_after_fetch_needs_no_server(world, tmp_path):
    cache = Cache(tmp_path / "cache")
    fetch_git(world.pin, cache=cache)
    world.up.rename(tmp_path / "srv" / "up-gone")
    world.lib.rename(tmp_path / "srv" / "lib-gone")
    f = fetch_git(world.pin, cache=cache, offline=True)
    assert_fetched(f, world, cache)
    assert fetch_git(world.pin, cache=cache).repo == f.repo  # online but cached: no network either
    assert git("rev-parse", "HEAD^{tree}", cwd=materialize(f, tmp_path / "wt")) == world.pin.tree


def test_killed_fetch_is_not_good(world, tmp_path, monkeypatch):
    cache = Cache(tmp_path / "cache")
    real = verify.verify_commits
    lib_url = world.pin.submodules[0].url

    def killed(repo, want, *a, **k):
        if want.url == lib_url:
            raise KeyboardInterrupt("killed after the objects arrived, before verification")
        return real(repo, want, *a, **k)

    monkeypatch.setattr(verify, "verify_commits", killed)
    with pytest.raises(KeyboardInterrupt):
        fetch_git(world.pin, cache=cache)
    repo = cache.repo_dir(lib_url)
    assert cache.read_marker(world.pin.url, world.rev) is not None  # the superproject finished
    assert gr.has_object(repo, world.lib_v2)  # the submodule's objects arrived ...
    assert cache.read_marker(lib_url, world.lib_v2) is None  # ... but nothing counts as good
    assert not verify.is_good(cache, repo, verify.Wanted("lib", lib_url, world.lib_v2))

    calls = []
    monkeypatch.setattr(verify, "verify_commits", lambda r, w, *a, **k: calls.append(w.label) or real(r, w, *a, **k))
    world.up.rename(tmp_path / "srv" / "up-gone")
    world.lib.rename(tmp_path / "srv" / "lib-gone")
    f = fetch_git(world.pin, cache=cache, offline=True)  # what is there is verified again, not trusted
    assert calls == ["up:third-party/lib"]
    assert_fetched(f, world, cache)


def test_objects_without_marker_are_verified_not_trusted(world, tmp_path):
    cache = Cache(tmp_path / "cache")
    with cache.lock(world.pin.url) as repo:  # a fetch that died before its marker: objects, no marker
        cache.ensure_repo(world.pin.url)
        git("fetch", "-q", str(world.up), f"+{world.rev}:refs/x", cwd=repo)
    bad = replace(world.pin, tree="1" * 40, submodules=(), patches=())
    with pytest.raises(FetchError, match="lock says 1{40}"):
        fetch_git(bad, cache=cache, offline=True)
    assert cache.read_marker(bad.url, world.rev) is None


def test_bundle_round_trip_to_an_empty_cache_without_servers(world, tmp_path):
    src = Cache(tmp_path / "net-cache")
    f = fetch_git(world.pin, cache=src)
    out = write_bundle([f], tmp_path / "out" / "sources.tar")
    assert out.is_file() and not [p for p in out.parent.iterdir() if p.name.startswith(".")]
    with tarfile.open(out) as tar:
        names = tar.getnames()
        manifest = json.load(tar.extractfile("manifest.json"))
    assert names[0] == "manifest.json" and set(names) == {"manifest.json", "up.bundle", "up--third-party+lib.bundle"}
    up = manifest["upstreams"]["up"]
    assert manifest["schema_version"] == 1
    assert (up["url"], up["rev"], up["tree"], up["commits"]) == (
        world.pin.url,
        world.rev,
        world.pin.tree,
        [world.p1, world.p2],
    )
    assert up["shallow"] and len(up["sha256"]) == 64
    assert up["submodules"][SUB]["rev"] == world.lib_v2

    world.up.rename(tmp_path / "srv" / "up-gone")
    world.lib.rename(tmp_path / "srv" / "lib-gone")
    gpu = Cache(tmp_path / "gpu-cache")
    f2 = fetch_git(world.pin, cache=gpu, offline=True, bundles=[out])
    assert_fetched(f2, world, gpu)
    dest = materialize(f2, tmp_path / "wt")
    assert git("rev-parse", "HEAD^{tree}", cwd=dest) == world.pin.tree
    assert (dest / SUB / "lib.h").read_text() == "int lib(void); // v2\n"
    git("cherry-pick", world.p1, world.p2, cwd=dest)
    assert (dest / "feature.txt").read_text() == "one\ntwo\n"

    other = GitPin(name="other", url="https://example.invalid/org/other", rev="a" * 40, tree="b" * 40)
    with pytest.raises(FetchError, match=r"other: .*the bundles .*sources.tar do not hold it"):
        fetch_git(other, cache=gpu, offline=True, bundles=[out])


def test_corrupted_bundle(world, tmp_path):
    out = write_bundle([fetch_git(world.pin, cache=Cache(tmp_path / "c1"))], tmp_path / "s.tar")
    bad = tmp_path / "bad.tar"
    with tarfile.open(out) as src, tarfile.open(bad, "w") as dst:
        for m in src.getmembers():
            data = bytearray(src.extractfile(m).read())
            if m.name == "up.bundle":
                data[len(data) // 2] ^= 0xFF
            dst.addfile(m, io.BytesIO(bytes(data)))
    cache = Cache(tmp_path / "c2")
    with pytest.raises(FetchError, match=r"up\.bundle is corrupted: sha256 [0-9a-f]{64}, manifest says"):
        import_bundle(bad, cache)
    with pytest.raises(FetchError, match="up.bundle is corrupted"):
        fetch_git(world.pin, cache=cache, offline=True, bundles=[bad])
    assert not (cache.root / "verified").exists()
    (tmp_path / "junk.tar").write_bytes(b"not a tar")
    with pytest.raises(FetchError, match="cannot read the archive"):
        import_bundle(tmp_path / "junk.tar", cache)


def test_mirror_via_insteadof(tmp_path, monkeypatch):
    w = make_world(tmp_path / "srv", up_url="https://example.invalid/org/up", lib_url="https://example.invalid/org/lib")
    cache = Cache(tmp_path / "cache")
    f = fetch_git(w.pin, cache=cache, mirrors={"https://example.invalid/org": str(tmp_path / "srv")})
    assert_fetched(f, w, cache)
    assert f.repo.name.endswith("-up.git")  # keyed by the public URL, not the mirror

    monkeypatch.setenv(
        "REPROSTACK_MIRRORS", f"https://example.invalid/org/up={w.up},https://example.invalid/org/lib={w.lib}"
    )
    assert fetch_git(w.pin, cache=Cache(tmp_path / "cache2")).submodules[SUB].is_dir()

    monkeypatch.delenv("REPROSTACK_MIRRORS")
    with pytest.raises(FetchError, match=r"cannot fetch .* from https://example.invalid/org/up"):
        fetch_git(
            w.pin, cache=Cache(tmp_path / "cache3"), mirrors={"https://example.invalid/org": str(tmp_path / "nope")}
        )


def test_mirrors_from_env():
    assert mirrors_from_env({}) == {}
    env = {"REPROSTACK_MIRRORS": " https://a/x=/m/x , https://b/y=file:///m/y?q=1 "}
    assert mirrors_from_env(env) == {"https://a/x": "/m/x", "https://b/y": "file:///m/y?q=1"}
    with pytest.raises(FetchError, match="REPROSTACK_MIRRORS"):
        mirrors_from_env({"REPROSTACK_MIRRORS": "https://a/x"})


def test_concurrent_fetches_share_one_cache(world, tmp_path):
    cache = Cache(tmp_path / "cache")
    barrier = threading.Barrier(3)

    def one(_):
        barrier.wait()
        return fetch_git(world.pin, cache=cache)

    with ThreadPoolExecutor(3) as ex:
        results = list(ex.map(one, range(3)))
    for f in results:
        assert_fetched(f, world, cache)
    git("fsck", "--connectivity-only", "--no-dangling", cwd=results[0].repo)


def test_cache_layout_and_url_normalisation(tmp_path):
    cache = Cache(tmp_path)
    a = cache.repo_dir("https://GitHub.com/deepseek-ai/DeepEP.git/")
    assert a == cache.repo_dir("https://github.com/deepseek-ai/DeepEP")
    assert a.parent == tmp_path / "git" and a.name.endswith("-DeepEP.git") and len(a.name) == 16 + 1 + len("DeepEP.git")
    assert a != cache.repo_dir("https://github.com/deepseek-ai/deepep")
    assert normalise_url("/srv/x/") == "file:///srv/x" == normalise_url("file:///srv/x.git")
    assert Cache().root.is_absolute()
    marker = cache.write_marker("https://h/r", "c" * 40, tree="d" * 40, with_parent=True)
    assert marker == tmp_path / "verified" / url_key("https://h/r") / f"{'c' * 40}.json"
    assert cache.read_marker("https://h/r", "c" * 40) == {
        "url": "https://h/r",
        "rev": "c" * 40,
        "tree": "d" * 40,
        "with_parent": True,
    }
    cache.write_marker("https://h/r", "c" * 40, tree="d" * 40)  # with_parent is sticky
    assert cache.read_marker("https://h/r", "c" * 40)["with_parent"] is True
    assert [p.name for p in marker.parent.iterdir()] == [marker.name]  # no temp files left behind


# ------------------------------------------------------- untrusted input: URLs, cache config, reachability, network

OPTION_URLS = ["--upload-pack=touch {m}", "-u touch {m}", "ext::sh -c touch% {m}", "fd::0"]


@pytest.mark.parametrize("url", OPTION_URLS)
def test_url_git_could_read_as_an_option_runs_nothing(world, tmp_path, url):
    """A pin built without the lock's checks (fetch_git is a library call too): the URL is refused before git,
    and git would get it after `--` anyway. The marker file is never created."""
    marker = tmp_path / "ran"
    pin = replace(world.pin, url=url.format(m=marker), submodules=(), patches=())
    with pytest.raises(FetchError, match=r"up: url .*(starts with '-'|transport helper|whitespace)"):
        fetch_git(pin, cache=Cache(tmp_path / "cache"), timeout=30)
    assert not marker.exists()
    # `--` before the URL: even a direct git call reads it as a repository, not an option
    with pytest.raises(GitFailed):
        git_remote("ls-remote", "--", f"--upload-pack=touch {marker}", retries=0)
    assert not marker.exists()


def test_history_never_passes_an_option_url_to_git(world, tmp_path):
    from reprostack.bump.history import history

    marker = tmp_path / "ran"
    with history("up", f"--upload-pack=touch {marker}", Cache(tmp_path / "cache"), {}, 30) as h:
        with pytest.raises(FetchError, match="starts with '-'"):
            h.ls_remote()
        with pytest.raises(FetchError, match="starts with '-'"):
            h.fetch_ref("refs/heads/main")
    assert not marker.exists()


def test_a_mirror_of_another_repository_is_named_as_such_not_as_a_force_push(tmp_path):
    """A mirror that lacks the pinned commit (stale, or of another repository) was reported as the server having
    lost it ("gone from the server ... force-pushed and pruned?"): the operator is sent to the wrong place."""
    w = make_world(tmp_path / "srv", up_url="https://example.invalid/org/up", lib_url="https://example.invalid/org/lib")
    wrong = {"https://example.invalid/org/up": str(w.lib), "https://example.invalid/org/lib": str(w.lib)}
    with pytest.raises(FetchError) as e:
        fetch_git(w.pin, cache=Cache(tmp_path / "c"), mirrors=wrong)
    msg = str(e.value)
    assert f"the mirror {w.lib} (REPROSTACK_MIRRORS, for https://example.invalid/org/up) does not hold commit" in msg
    assert w.rev[:12] in msg and "a mirror of another repository" in msg
    assert "gone from the server" not in msg and "force-pushed" not in msg


@pytest.mark.parametrize("mirror", ["--upload-pack=touch {m}", "ext::sh -c touch% {m}", "ext::sh", "http://x/y"])
def test_mirror_that_git_could_run_is_refused(world, tmp_path, mirror):
    marker = tmp_path / "ran"
    m = mirror.format(m=marker)
    with pytest.raises(FetchError, match="REPROSTACK_MIRRORS: mirror"):
        mirrors_from_env({"REPROSTACK_MIRRORS": f"https://example.invalid/org/up={m}"})
    pin = replace(world.pin, url="https://example.invalid/org/up", submodules=(), patches=())
    with pytest.raises(FetchError, match="mirror .* for 'https://example.invalid/org/up'"):
        fetch_git(pin, cache=Cache(tmp_path / "cache"), mirrors={"https://example.invalid/org/up": m}, timeout=30)
    assert not marker.exists()


def test_only_file_git_ssh_https_transports(tmp_path):
    """Defence in depth: GIT_ALLOW_PROTOCOL, git's own allow-list, even for a URL that skipped our checks."""
    marker = tmp_path / "ran"
    for url in (f"ext::sh -c touch% {marker}", "http://127.0.0.1:9/x"):
        with pytest.raises(GitFailed, match="transport .* not allowed|unsupported"):
            git_remote("ls-remote", "--", url, retries=0, timeout=30)
    assert not marker.exists()


def test_cache_repo_config_that_could_run_a_program_is_refused(world, tmp_path):
    cache = Cache(tmp_path / "cache")
    f = fetch_git(world.pin, cache=cache)
    marker = tmp_path / "ran"
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "reference-transaction").write_text(f"#!/bin/sh\ntouch {marker}\n")
    (hooks / "reference-transaction").chmod(0o755)
    gr.set_config(f.repo, "core.hooksPath", str(hooks))
    with pytest.raises(
        FetchError, match=r"up: the cache repo .* has config core.hookspath that reprostack never writes"
    ):
        fetch_git(world.pin, cache=cache)
    assert not marker.exists()


def test_cache_repo_commondir_is_refused(world, tmp_path):
    """A cache repo with a `commondir` file makes git read another folder's config (core.alternateRefsCommand,
    url.*.insteadOf ...): refused before git runs there, even when that config looks harmless to the allow-list."""
    cache = Cache(tmp_path / "cache")
    f = fetch_git(world.pin, cache=cache)
    marker = tmp_path / "ran"
    common = tmp_path / "common"
    common.mkdir()
    (common / "config").write_text(f'[core]\n\talternateRefsCommand = "touch {marker}"\n')
    (f.repo / "commondir").write_text(f"{common}\n")
    for m in (cache.root / "verified").rglob("*.json"):
        m.unlink()
    with pytest.raises(FetchError, match=r"up: the cache repo .* has config \(commondir\)"):
        fetch_git(world.pin, cache=cache)
    assert not marker.exists()


def test_hooks_fsmonitor_and_repo_ssh_command_never_run(world, tmp_path):
    """Whatever a repository's own config says, git() runs no hook, fsmonitor or core.sshCommand."""
    marker = tmp_path / "ran"
    wt = gr.init_repo(tmp_path / "wt")
    gr.commit_files(wt, {"a": "1\n"}, "one")
    hook = wt / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch {marker}.hook\n")
    hook.chmod(0o755)
    gr.set_config(wt, "core.fsmonitor", f"touch {marker}.fsmonitor; false")
    gr.set_config(wt, "core.sshCommand", f"touch {marker}.ssh; false")
    git("checkout", "-q", "--detach", "HEAD", cwd=wt)
    git("status", "--porcelain", cwd=wt)
    with pytest.raises(GitFailed):
        git_remote("fetch", "--", "ssh://127.0.0.1:9/x", cwd=wt, retries=0, timeout=30)
    assert list(tmp_path.glob("ran*")) == []


def test_fork_only_commit_is_refused(world, tmp_path):
    """A commit the server serves by id but no ref of it reaches (GitHub serves a fork's commits from the
    upstream URL): refused, nothing marked verified. The same commit under a lock `fetch-refs` hint is fine."""
    gr.set_config(world.up, "uploadpack.allowAnySHA1InWant", "true")
    tree = gr.tree_of(world.up, world.rev)
    orphan = git("commit-tree", "-p", world.rev, "-m", "only in a fork", tree, cwd=world.up)
    pin = replace(world.pin, rev=orphan, tree=tree, submodules=(), patches=())
    cache = Cache(tmp_path / "cache")
    with pytest.raises(
        FetchError,
        match=rf"up: commit {orphan[:12]} is not reachable from any branch or tag of "
        rf".*only a fork .* or a mirror holds is refused",
    ):
        fetch_git(pin, cache=cache)
    assert cache.read_marker(pin.url, orphan) is None
    with pytest.raises(FetchError, match="not reachable"):  # objects now in the cache: still not trusted
        fetch_git(pin, cache=cache)

    git("update-ref", "refs/forks/alice/main", orphan, cwd=world.up)
    with pytest.raises(FetchError, match="not reachable"):  # a ref the lock does not name is no proof
        fetch_git(pin, cache=cache)
    ok = fetch_git(replace(pin, fetch_refs=("refs/forks/alice/main",)), cache=cache)
    assert cache.read_marker(ok.pin.url, orphan)["tree"] == tree


def test_fork_only_cherry_pick_is_refused(world, tmp_path):
    gr.set_config(world.up, "uploadpack.allowAnySHA1InWant", "true")
    evil = git("commit-tree", "-p", world.rev, "-m", "fork", gr.tree_of(world.up, world.p1), cwd=world.up)
    pin = replace(world.pin, submodules=(), patches=(PatchEntry("cherry-pick", evil, "Pending", index=1),))
    with pytest.raises(FetchError, match=rf"commit {evil[:12]} is not reachable"):
        fetch_git(pin, cache=Cache(tmp_path / "cache"))


def test_older_pin_after_newer_shallow_fetch_is_still_proven(world, tmp_path):
    """An earlier shallow fetch of a newer commit cuts the walk from main down to an older pin: --unshallow."""
    cache = Cache(tmp_path / "cache")
    newer = replace(world.pin, rev=world.u4, tree=gr.tree_of(world.up, world.u4), submodules=(), patches=())
    fetch_git(newer, cache=cache)
    older = replace(world.pin, submodules=(), patches=())
    assert fetch_git(older, cache=cache).repo == cache.repo_dir(older.url)


# --------------------------------------------------------------------------- network: timeout, ssh, retries


def test_timeout_option_and_a_server_that_never_answers(world, tmp_path, monkeypatch):
    import socket
    from reprostack import sources

    monkeypatch.setenv("REPROSTACK_GIT_TIMEOUT", "7")
    assert sources.FetchOptions.make(tmp_path / "c").timeout == 7.0
    assert sources.FetchOptions.make(tmp_path / "c", timeout=3).timeout == 3
    monkeypatch.setenv("REPROSTACK_GIT_TIMEOUT", "0")
    with pytest.raises(FetchError, match="REPROSTACK_GIT_TIMEOUT: '0' is not a number of seconds from 1 to 86400"):
        sources.FetchOptions.make(tmp_path / "c")

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)  # accepts the connection (kernel backlog), never says a word
    try:
        pin = replace(world.pin, url=f"git://127.0.0.1:{srv.getsockname()[1]}/up", submodules=(), patches=())
        monkeypatch.setattr(gitcmd, "RETRIES", 1)
        monkeypatch.setattr(gitcmd, "RETRY_BACKOFF_S", 0.01)
        with pytest.raises(FetchError, match=r"up: cannot fetch .*: git fetch timed out after 2s"):
            fetch_git(pin, cache=Cache(tmp_path / "cache"), timeout=2)
    finally:
        srv.close()


def test_ssh_runs_in_batch_mode(world, tmp_path, monkeypatch):
    """ssh never prompts (host key, password): BatchMode and a ConnectTimeout, also with the user's own
    GIT_SSH_COMMAND (kept, options appended)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "ssh-args"
    (bin_dir / "ssh").write_text(
        f'#!/bin/sh\necho "$@" >> {log}\necho "ssh: connect to host: Connection closed" >&2\nexit 255\n'
    )
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("GIT_SSH_COMMAND", raising=False)
    monkeypatch.setattr(gitcmd, "RETRIES", 0)
    pin = replace(world.pin, url="ssh://git@example.invalid/org/up", submodules=(), patches=())
    with pytest.raises(FetchError, match="up: cannot fetch"):
        fetch_git(pin, cache=Cache(tmp_path / "cache"), timeout=20)
    args = log.read_text()
    assert "-o BatchMode=yes" in args and "-o ConnectTimeout=20" in args

    monkeypatch.setenv("GIT_SSH_COMMAND", "ssh -i /dev/null")
    log.unlink()
    with pytest.raises(FetchError):
        fetch_git(pin, cache=Cache(tmp_path / "cache"), timeout=20)
    assert log.read_text().startswith("-i /dev/null -o BatchMode=yes")


def test_transient_failure_is_retried_with_backoff(world, tmp_path, monkeypatch):
    """The server is down at the first attempt (connection refused) and up after the first backoff: the fetch
    succeeds. A permanent failure (no such repository) is not retried."""
    import subprocess
    import time

    real_sleep = time.sleep
    port = free_port()
    gr.set_config(world.up, "uploadpack.allowAnySHA1InWant", "true")
    daemon: list[subprocess.Popen] = []
    waits: list[float] = []

    def sleep(s: float) -> None:
        waits.append(s)
        if not daemon:
            daemon.append(
                subprocess.Popen(
                    [
                        "git",
                        "daemon",
                        "--export-all",
                        "--reuseaddr",
                        f"--base-path={world.up.parent}",
                        "--listen=127.0.0.1",
                        f"--port={port}",
                        str(world.up.parent),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            import socket

            for _ in range(100):
                with socket.socket() as c:
                    if c.connect_ex(("127.0.0.1", port)) == 0:
                        return
                real_sleep(0.05)

    import types

    monkeypatch.setattr(gitcmd, "time", types.SimpleNamespace(sleep=sleep))  # only gitcmd's backoff waits
    pin = replace(world.pin, url=f"git://127.0.0.1:{port}/up", submodules=(), patches=())
    try:
        f = fetch_git(pin, cache=Cache(tmp_path / "cache"), timeout=30)
        assert f.repo.is_dir() and waits == [gitcmd.RETRY_BACKOFF_S]
        waits.clear()
        with pytest.raises(FetchError, match="up: cannot fetch"):
            fetch_git(replace(pin, url=f"git://127.0.0.1:{port}/nope"), cache=Cache(tmp_path / "cache"), timeout=30)
        assert waits == []  # "not found" is not transient
    finally:
        for d in daemon:
            d.terminate()
            d.wait(timeout=10)


def test_transient_classification():
    def failed(stderr: str, timed_out: bool = False) -> GitFailed:
        return GitFailed(["git", "fetch"], None if timed_out else 128, "", stderr, timed_out)

    for msg in (
        "fatal: early EOF",
        "error: RPC failed; HTTP 502 curl 22 The requested URL returned error: 502",
        "fatal: unable to connect to x: Connection refused",
        "Connection reset by peer",
    ):
        assert transient(failed(msg)), msg
    assert transient(failed("", timed_out=True))
    for msg in (
        "fatal: repository 'https://x/y/' not found",
        "fatal: Authentication failed for 'https://x/'",
        "Permission denied (publickey).",
        "fatal: remote error: upload-pack: not our ref " + "a" * 40,
        "fatal: '/x' does not appear to be a git repository",
    ):
        assert not transient(failed(msg)), msg


@pytest.mark.parametrize("field", ["rev", "commits", "shallow"])
def test_bundle_manifest_ids_must_be_commit_ids(world, tmp_path, field):
    """A bundle's manifest names commits that reach git as arguments: each must be 40 hex, never `--...`."""
    out = write_bundle([fetch_git(world.pin, cache=Cache(tmp_path / "c1"))], tmp_path / "s.tar")
    bad = tmp_path / "bad.tar"
    with tarfile.open(out) as src, tarfile.open(bad, "w") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read()
            if m.name == "manifest.json":
                man = json.loads(data)
                man["upstreams"]["up"][field] = "--output=/tmp/x" if field == "rev" else ["--all"]
                data = json.dumps(man).encode()
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data))
    cache = Cache(tmp_path / "c2")
    with pytest.raises(FetchError, match=r"malformed manifest.json: .*is not a 40-hex id"):
        import_bundle(bad, cache)
    assert not (cache.root / "verified").exists()


def test_bundle_with_an_oversized_manifest_is_one_line(world, tmp_path):
    """A 10 KiB bundle whose manifest claims gigabytes (a sparse member) read them all into memory (hostile trial,
    issue 14): the manifest is read only as a plain member of at most 4 MiB."""
    out = write_bundle([fetch_git(world.pin, cache=Cache(tmp_path / "c1"))], tmp_path / "s.tar")
    bad = tmp_path / "big.tar"
    with tarfile.open(out) as src, tarfile.open(bad, "w") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read()
            if m.name == "manifest.json":
                data = data[:-1] + b" " * (5 * 1024 * 1024) + b"}"
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data))
    with pytest.raises(FetchError, match=r"no readable manifest.json: not a plain file of at most 4194304 bytes"):
        import_bundle(bad, Cache(tmp_path / "c2"))


@pytest.mark.parametrize("marker", ["fifo", "deep", "list"])
def test_a_hostile_marker_is_not_trusted_and_never_hangs(world, tmp_path, marker):
    """A verified marker replaced by a FIFO (blocked read), deep nesting (RecursionError) or a non-object: it reads
    as absent, the commit is verified again, and the fetch ends with a good marker."""
    cache = Cache(tmp_path / "cache")
    fetch_git(world.pin, cache=cache)
    (m,) = [p for p in (cache.root / "verified").rglob(f"{world.pin.rev}.json")]
    m.unlink()
    if marker == "fifo":
        os.mkfifo(m)
    else:
        m.write_text("[" * 100000 + "]" * 100000 if marker == "deep" else "[1]")
    assert cache.read_marker(world.pin.url, world.pin.rev) is None
    take = fetch_git(world.pin, cache=cache)
    assert take.repo.is_dir()
