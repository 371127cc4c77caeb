"""A deterministic build context: the same inputs give the same tar bytes, whatever the disk says.

Invariants of `Context.tar()`:
- entries sorted by path; every parent folder has its own entry (mode 0755);
- owner 0:0 with empty user/group names, mtime = the given SOURCE_DATE_EPOCH for every entry;
- modes are fixed by kind, not taken from disk: 0755 for folders and executables, 0644 for other files
  (a git tree knows only 100644 / 100755 / 120000, so that is all an image can be told);
- a git tree contributes its tracked files only (`git ls-files --stage`, recursing into each submodule
  checked out at its gitlink): never a `.git`, never an untracked or ignored file; symlinks stay symlinks; a
  submodule the lock does not pin (the caller passes the pinned paths) is left out whole, any other submodule not
  checked out is an error;
- two entries for one path are an error (two recipe lines want the same destination).
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..gitcmd import git
from .errors import ContainerError


@dataclass(frozen=True)
class _Entry:
    kind: str  # "file" | "symlink"
    executable: bool = False
    data: bytes | None = None
    path: Path | None = None  # read lazily
    target: str = ""  # symlink target
    origin: str = ""  # for error messages
    sha256: str | None = None  # the bytes `path` must have (checked while they are written into the tar)


class Context:
    """Collects files, then writes them as one normalized tar (see module doc)."""

    def __init__(self, epoch: int = 0):
        self.epoch = int(epoch)
        self._entries: dict[str, _Entry] = {}

    def _put(self, dest: str, entry: _Entry) -> None:
        p = PurePosixPath(dest)
        if p.is_absolute() or ".." in p.parts or not p.parts or str(p) in (".", ""):
            raise ContainerError(f"context path {dest!r} ({entry.origin}): must be relative, without '..'")
        key = p.as_posix()
        if key in self._entries:
            raise ContainerError(f"context path {key!r} given twice ({self._entries[key].origin}; {entry.origin})")
        for parent in p.parents:
            if parent.as_posix() in self._entries:
                raise ContainerError(
                    f"context path {key!r} ({entry.origin}) lies under the file "
                    f"{parent.as_posix()!r} ({self._entries[parent.as_posix()].origin})"
                )
        self._entries[key] = entry

    def add_bytes(self, dest: str, data: bytes, *, executable: bool = False, origin: str = "generated") -> None:
        self._put(dest, _Entry("file", executable, data=data, origin=origin))

    def add_file(
        self,
        dest: str,
        src: Path,
        *,
        executable: bool | None = None,
        origin: str | None = None,
        sha256: str | None = None,
    ) -> None:
        """Add the file `src` at `dest`, read when the tar is written; with `sha256`, the bytes read then must
        have it (a wheel verified earlier may be changed on a shared disk before the tar is made)."""
        src = Path(src)
        exe = os.access(src, os.X_OK) if executable is None else executable
        self._put(dest, _Entry("file", exe, path=src, origin=origin or str(src), sha256=sha256))

    def add_git_tree(
        self, dest: str, tree: Path, *, origin: str | None = None, pinned_submodules: frozenset[str] | None = None
    ) -> int:
        """Add the tracked files of the work tree `tree` (and of its checked-out submodules) under `dest`.
        Returns the number of files. The tree is expected clean (sources.prepare verified it). `pinned_submodules`: when
        given, the submodule paths the lock pins (`GitPin.submodules`); a gitlink outside it is left out (the lock
        does not fetch it: nothing of it goes into the context) instead of being an error."""
        tree = Path(tree)
        out = git("ls-files", "-z", "--stage", cwd=tree)
        n = 0
        for rec in out.split("\0"):
            if not rec:
                continue
            meta, rel = rec.split("\t", 1)
            mode, obj = meta.split()[:2]
            src = tree / rel
            where = f"{origin or tree}:{rel}"
            if mode == "120000":
                self._put(f"{dest}/{rel}", _Entry("symlink", target=os.readlink(src), origin=where))
            elif mode in ("100644", "100755"):
                if not src.is_file():
                    raise ContainerError(f"{where}: tracked file missing from the work tree (not a clean tree)")
                self._put(f"{dest}/{rel}", _Entry("file", mode == "100755", path=src, origin=where))
            elif mode == "160000":
                if pinned_submodules is not None and rel not in pinned_submodules:
                    continue  # not pinned by the lock, so not fetched: not part of the build
                if not (src / ".git").exists():
                    raise ContainerError(f"{where}: submodule not checked out (its files cannot go into the context)")
                head = git("rev-parse", "HEAD", cwd=src)
                if head != obj:
                    raise ContainerError(f"{where}: submodule is at {head}, the tree's gitlink says {obj}")
                n += self.add_git_tree(f"{dest}/{rel}", src, origin=where)
                continue
            else:
                raise ContainerError(f"{where}: unexpected git mode {mode}")
            n += 1
        return n

    def paths(self) -> list[str]:
        return sorted(self._entries)

    def tar(self) -> bytes:
        """The normalized tar as bytes (small contexts, tests)."""
        buf = io.BytesIO()
        self.write(buf)
        return buf.getvalue()

    def write_tar(self, path: Path) -> tuple[str, int]:
        """Write the normalized tar to `path` (streamed: contexts with wheels are large); returns (sha256, bytes)."""
        with open(path, "wb") as f:
            return self.write(f)

    def write(self, fileobj) -> tuple[str, int]:
        """Write the normalized, uncompressed tar (PAX format) of every entry and its parent folders to
        `fileobj`; returns (sha256, size) of what was written."""
        dirs: set[str] = set()
        for k in self._entries:
            dirs.update(p.as_posix() for p in PurePosixPath(k).parents if p.as_posix() != ".")
        names = sorted(set(self._entries) | dirs, key=lambda s: s.encode())
        out = _Hashing(fileobj)
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as t:
            for name in names:
                ti = tarfile.TarInfo(name)
                ti.uid = ti.gid = 0
                ti.uname = ti.gname = ""
                ti.mtime = self.epoch
                e = self._entries.get(name)
                if e is None:
                    ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                    t.addfile(ti)
                elif e.kind == "symlink":
                    ti.type, ti.mode, ti.linkname = tarfile.SYMTYPE, 0o777, e.target
                    t.addfile(ti)
                elif e.data is not None:
                    ti.type, ti.mode, ti.size = tarfile.REGTYPE, 0o755 if e.executable else 0o644, len(e.data)
                    t.addfile(ti, io.BytesIO(e.data))
                else:
                    with open(e.path, "rb") as f:
                        ti.size = os.fstat(f.fileno()).st_size
                        ti.type, ti.mode = tarfile.REGTYPE, 0o755 if e.executable else 0o644
                        src = _HashingReader(f)
                        t.addfile(ti, src)
                        if e.sha256 and src.h.hexdigest() != e.sha256:
                            raise ContainerError(
                                f"{e.origin}: {e.path} has sha256 {src.h.hexdigest()} while it is "
                                f"put into the context, the lock pins {e.sha256} (changed on disk "
                                f"after it was verified)"
                            )
        return out.hexdigest(), out.size


class _HashingReader:
    """A read-only file object that hashes what is read through it."""

    def __init__(self, f):
        self.f, self.h = f, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        b = self.f.read(n)
        self.h.update(b)
        return b


class _Hashing:
    """A write-only file object that hashes and counts what passes through."""

    def __init__(self, f):
        self.f, self.h, self.size = f, hashlib.sha256(), 0

    def write(self, b) -> int:
        self.h.update(b)
        self.size += len(b)
        return self.f.write(b)

    def hexdigest(self) -> str:
        return self.h.hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
