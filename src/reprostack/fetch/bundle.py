"""Carry fetched sources to a machine without network: one .tar of `git bundle`s plus a manifest.

Archive layout (uncompressed tar: bundles are already compressed packs; fixed mtimes and owners):

    manifest.json          schema_version, and per upstream: url, rev, tree, commits (cherry-picks),
                           bundle, sha256, shallow, submodules {path: url, rev, tree, bundle, sha256, shallow}
    <name>.bundle          superproject: refs/reprostack/<sha> for rev and each cherry-pick commit
    <name>--<path>.bundle  one per submodule, `/` in the path written as `+`

Invariants:
- the archive is written to a temp name and os.replace'd: a killed write leaves no archive;
- bundles only come from FetchedGit, i.e. from verified cache entries;
- `shallow` lists the commits whose parents the bundle lacks (cache repos are shallow after exact-SHA
  fetches); the importer records them in the receiving repo's `shallow` file before fetching from the
  bundle, which git's connectivity check needs, and only for commits it does not already have;
- import checks every bundle's sha256 against the manifest before touching the cache (a mismatch is
  a FetchError naming the file), then verifies each commit and writes the markers, as a fetch does.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import tempfile
from pathlib import Path
from typing import Sequence

from ..digest import sha256_file, sha256_stream
from .. import jsonsrc
from ..errors import FetchError
from ..gitcmd import GitFailed, git
from . import verify
from .cache import Cache, check_cache_repo
from .verify import FetchedGit, Wanted, cherry_picks

MANIFEST_MAX_BYTES = 4 * 1024 * 1024
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
_SHA1 = re.compile(r"^[0-9a-f]{40}$")


def write_bundle(fetched: Sequence[FetchedGit], out: Path) -> Path:
    """Write one archive holding a git bundle per repository of `fetched` (superprojects and submodules).

    Args:
      fetched: results of fetch_git (their cache repos are read; refs/reprostack/<sha> are (re)created).
      out: the archive path (conventionally *.tar); replaced atomically if it exists.
    Returns out.
    Raises FetchError: two pins share a name; `git bundle create` fails.
    """
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    names = [f.pin.name for f in fetched]
    if len(set(names)) != len(names):
        raise FetchError(
            f"bundle {out}: pins named more than once: {sorted(n for n in set(names) if names.count(n) > 1)}"
        )
    upstreams: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix=".bundle-", dir=out.parent) as tmp:
        for f in fetched:
            pin = f.pin
            picks = cherry_picks(pin)
            entry = {
                "url": pin.url,
                "rev": pin.rev,
                "tree": pin.tree,
                "commits": list(picks),
                **_bundle_repo(f.repo, (pin.rev, *picks), Path(tmp) / f"{pin.name}.bundle", pin.name),
            }
            entry["submodules"] = {}
            for sub in pin.submodules:
                fname = f"{pin.name}--{sub.path.replace('/', '+')}.bundle"
                label = f"{pin.name}:{sub.path}"
                sub_entry = _bundle_repo(f.submodules[sub.path], (sub.rev,), Path(tmp) / fname, label)
                tree = git("rev-parse", f"{sub.rev}^{{tree}}", cwd=f.submodules[sub.path])
                entry["submodules"][sub.path] = {"url": sub.url, "rev": sub.rev, "tree": tree, **sub_entry}
            upstreams[pin.name] = entry
        manifest = {"schema_version": SCHEMA_VERSION, "upstreams": upstreams}
        fd, part = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
        os.fchmod(fd, 0o644)  # an archive to hand to other nodes, not a private temp file
        os.close(fd)
        try:
            with tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as tar:
                _add_bytes(tar, MANIFEST, json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n")
                for name in sorted(p.name for p in Path(tmp).iterdir()):
                    with open(Path(tmp) / name, "rb") as fh:
                        info = _tarinfo(name, (Path(tmp) / name).stat().st_size)
                        tar.addfile(info, fh)
            os.replace(part, out)
        except BaseException:
            Path(part).unlink(missing_ok=True)
            raise
    return out


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    tar.addfile(_tarinfo(name, len(data)), io.BytesIO(data))


def _bundle_repo(repo: Path, commits: Sequence[str], path: Path, label: str) -> dict:
    """`git bundle create` for `commits` of `repo`; returns the manifest fields bundle/sha256/shallow."""
    refs = [f"refs/reprostack/{c}" for c in commits]
    git(
        "update-ref",
        "--stdin",
        cwd=repo,
        input_bytes="".join(f"update {r} {c}\n" for r, c in zip(refs, commits)).encode(),
    )
    try:
        git("bundle", "create", "-q", str(path), *refs, cwd=repo)
    except GitFailed as e:
        raise FetchError(f"{label}: git bundle create failed in {repo}: {e.stderr.strip()[-500:]}") from None
    shallow_file = repo / "shallow"
    shallow: list[str] = []
    if shallow_file.is_file():
        boundary = set(shallow_file.read_text().split())
        shallow = sorted(boundary & set(git("rev-list", *refs, cwd=repo).split()))
    return {"bundle": path.name, "sha256": sha256_file(path), "shallow": shallow}


def import_bundle(path: Path, cache: Cache, timeout: float = 600.0) -> dict:
    """Import every repository of the archive at `path` into `cache`, verified and marked good.

    Repositories already good in the cache are skipped. Returns the archive's manifest (a dict).
    Raises FetchError: not a readable archive or manifest; a bundle missing or whose sha256 differs
    from the manifest (names the file); git cannot fetch from a bundle; a commit does not verify.
    """
    path = Path(path)
    try:
        tar = tarfile.open(path, "r:")
    except (OSError, tarfile.TarError) as e:
        raise FetchError(f"bundle {path}: cannot read the archive: {e}") from None
    with tar, cache.scratch("import-") as tmp:
        manifest = _read_manifest(tar, path)
        jobs = []  # (Wanted, bundle file, shallow list)
        for name, up in manifest["upstreams"].items():
            jobs.append(
                (
                    Wanted(name, up["url"], up["rev"], up["tree"], tuple(up.get("commits", ()))),
                    up["bundle"],
                    up.get("shallow", []),
                )
            )
            for sp, sub in (up.get("submodules") or {}).items():
                jobs.append(
                    (
                        Wanted(f"{name}:{sp}", sub["url"], sub["rev"], sub.get("tree")),
                        sub["bundle"],
                        sub.get("shallow", []),
                    )
                )
        sums = {
            **{up["bundle"]: up["sha256"] for up in manifest["upstreams"].values()},
            **{
                s["bundle"]: s["sha256"]
                for up in manifest["upstreams"].values()
                for s in (up.get("submodules") or {}).values()
            },
        }
        for fname, digest in sums.items():
            _extract_checked(tar, path, fname, digest, Path(tmp))
        for want, fname, shallow in jobs:
            _import_repo(cache, want, Path(tmp) / fname, shallow, path, timeout)
    return manifest


def check_bundle(path: Path) -> dict:
    """Read the archive at `path` and check every bundle in it against the manifest's sha256, importing
    nothing. Returns the manifest. Raises FetchError naming the archive (and member) as import_bundle does:
    a bundle named on the command line is checked even when the cache already holds every pin."""
    path = Path(path)
    try:
        tar = tarfile.open(path, "r:")
    except (OSError, tarfile.TarError) as e:
        raise FetchError(f"bundle {path}: cannot read the archive: {e}") from None
    with tar:
        manifest = _read_manifest(tar, path)
        for up in manifest["upstreams"].values():
            for entry in (up, *(up.get("submodules") or {}).values()):
                _extract_checked(tar, path, entry["bundle"], entry["sha256"])
    return manifest


def _read_manifest(tar: tarfile.TarFile, path: Path) -> dict:
    try:
        member = tar.getmember(MANIFEST)
        if not member.isreg() or member.issparse() or member.size > MANIFEST_MAX_BYTES:
            raise ValueError(f"not a plain file of at most {MANIFEST_MAX_BYTES} bytes")
        manifest = jsonsrc.loads(tar.extractfile(member).read(MANIFEST_MAX_BYTES + 1), f"{path}:{MANIFEST}", ValueError)
    except (KeyError, ValueError, tarfile.TarError, TypeError, AttributeError) as e:
        raise FetchError(f"bundle {path}: no readable {MANIFEST}: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("schema_version") != SCHEMA_VERSION:
        raise FetchError(
            f"bundle {path}: {MANIFEST} schema_version is "
            f"{manifest.get('schema_version') if isinstance(manifest, dict) else None!r}, "
            f"this reprostack reads {SCHEMA_VERSION}"
        )
    try:
        for up in manifest["upstreams"].values():
            for up_or_sub in (up, *(up.get("submodules") or {}).values()):
                for key in ("url", "rev", "bundle", "sha256"):
                    if not isinstance(up_or_sub[key], str):
                        raise TypeError(key)
                for key in ("rev", "tree"):
                    if up_or_sub.get(key) is not None and not _SHA1.match(str(up_or_sub[key])):
                        raise ValueError(f"{key} {up_or_sub[key]!r} is not a 40-hex id")
                for c in (*(up_or_sub.get("commits") or ()), *(up_or_sub.get("shallow") or ())):
                    if not _SHA1.match(str(c)):
                        raise ValueError(f"commit {c!r} is not a 40-hex id")
                name = up_or_sub["bundle"]
                if "/" in name or name.startswith(".") or name == MANIFEST:
                    raise ValueError(f"bad bundle file name {name!r}")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise FetchError(f"bundle {path}: malformed {MANIFEST}: {e!r}") from None
    return manifest


def _extract_checked(tar: tarfile.TarFile, path: Path, fname: str, digest: str, into: Path | None = None) -> None:
    """Check member `fname`'s sha256 against the manifest, copying it to into/fname when `into` is given."""
    try:
        member = tar.getmember(fname)
    except KeyError:
        raise FetchError(f"bundle {path}: {fname} is listed in {MANIFEST} but not in the archive") from None
    if not member.isreg() or member.issparse():  # `reprostack bundle` writes plain members; a sparse one can
        raise FetchError(f"bundle {path}: {fname} is not a plain regular file")  # claim gigabytes from bytes
    try:
        src = tar.extractfile(member)
        if into is None:
            got, _ = sha256_stream(src)
        else:
            with open(into / fname, "wb") as dst:
                got, _ = sha256_stream(src, dst)
    except (OSError, tarfile.TarError) as e:
        raise FetchError(f"bundle {path}: cannot read {fname}: {e}") from None
    if got != digest:
        raise FetchError(f"bundle {path}: {fname} is corrupted: sha256 {got}, manifest says {digest}")


def _import_repo(
    cache: Cache, want: Wanted, bundle_file: Path, shallow: Sequence[str], archive: Path, timeout: float = 600.0
) -> None:
    """Fetch one bundle into `want.url`'s cache repo, then verify and mark (under the repo's lock)."""
    with cache.lock(want.url) as existing:
        check_cache_repo(existing, want.label)
        repo = cache.ensure_repo(want.url)
        if verify.is_good(cache, repo, want):
            return
        shallow_file = repo / "shallow"
        before = shallow_file.read_bytes() if shallow_file.is_file() else None
        add = verify.missing_objects(repo, list(shallow))
        if add:
            lines = sorted(set((before or b"").decode().split()) | set(add))
            shallow_file.write_text("".join(f"{c}\n" for c in lines))
        try:
            git(
                "fetch",
                "--no-tags",
                "--no-write-fetch-head",
                "--quiet",
                "--",
                str(bundle_file),
                "+refs/reprostack/*:refs/reprostack/*",
                cwd=repo,
                timeout=timeout,
            )
        except GitFailed as e:
            if before is None:
                shallow_file.unlink(missing_ok=True)
            else:
                shallow_file.write_bytes(before)
            raise FetchError(
                f"bundle {archive}: {want.label}: cannot fetch from {bundle_file.name}: {e.stderr.strip()[-500:]}"
            ) from None
        trees = verify.verify_commits(repo, want)
        verify.mark_verified(cache, want, trees, repo)
