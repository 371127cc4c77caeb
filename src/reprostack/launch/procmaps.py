"""The NCCL libraries a process has mapped (/proc/<pid>/maps) and how each got there: the one reader of the one-NCCL
evidence, for the trials driver's ranks, the check process, the serving gates' servers and the training ranks.

Stdlib only and no package imports: the trials driver (gates/drivers/micro_trials.py) loads this file by its path in
the test's own Python, where reprostack is not importable; the gates import it as reprostack.launch.procmaps.

Invariants:
- every mapping counts: a maps line's pathname is its sixth field whole (a path may hold spaces); a library deleted or
  replaced on disk after it was mapped (the kernel then ends the line with " (deleted)") counts under its path and is
  listed in `deleted`: the bytes that ran can no longer be checked, so a judge refuses it (fail closed);
- a libnccl is a mapped file whose name starts with `libnccl` (NCCL itself, a copy of it under another version
  suffix, and NCCL's plugins: the old check counted the same set; a plugin next to NCCL is the judge's business);
- a version is read from the library's own bytes (`NCCL version X.Y.Z+cuda...`, the string NCCL prints at init),
  never from a file name; a file that is not a regular file is never read (a FIFO or /dev/zero named in a forged
  environment cannot block or fill memory);
- how a library got into the process is named from that process's environment and the file's place: LD_PRELOAD,
  an LD_LIBRARY_PATH entry, the Python wheel whose folder holds it (its dist-info), else its folder (RPATH, the
  loader's cache);
- `shadows` is the preflight of an environment before anything starts: every NCCL that LD_PRELOAD or LD_LIBRARY_PATH
  would put ahead of the pinned one, named with its file, version and how.
"""

from __future__ import annotations

import mmap
import os
import re
import stat

DELETED = " (deleted)"
LOADER_VARS = ("LD_PRELOAD", "LD_LIBRARY_PATH")
_VERSION = re.compile(rb"NCCL version (\d{1,3}\.\d{1,3}\.\d{1,3})\+cuda")
_CORE = re.compile(r"libnccl\.so(\.\d+)*")  # the names the loader finds NCCL itself by (not its plugins)
MAX_LIB_BYTES = 4 << 30


def parse(text: str) -> list[tuple[str, str, bool]]:
    """(address range, path, deleted) of every file-backed mapping of a maps text, in order (duplicates kept)."""
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue  # anonymous memory: no pathname
        name = parts[5].strip()
        deleted = name.endswith(DELETED)
        if deleted:
            name = name[: -len(DELETED)]
        if name.startswith("/"):
            out.append((parts[0], name, deleted))
    return out


def is_nccl(path: str) -> bool:
    return os.path.basename(path).startswith("libnccl")


def nccl_maps(text: str) -> tuple[list[str], list[str], dict[str, str]]:
    """(every libnccl path mapped, sorted; those of them deleted or replaced on disk; path -> one address range)."""
    mapped, deleted, ranges = set(), set(), {}  # type: set[str], set[str], dict[str, str]
    for rng, path, gone in parse(text):
        if is_nccl(path):
            mapped.add(path)
            ranges.setdefault(path, rng)
            if gone:
                deleted.add(path)
    return sorted(mapped), sorted(deleted), ranges


def read_text(path: str, limit: int = 64 << 20) -> str:
    """A /proc file's text (at most `limit` bytes). Raises OSError."""
    with open(path, "rb") as f:
        return f.read(limit).decode(errors="replace")


def environ_of(pid) -> dict:
    """The environment a process started with (/proc/<pid>/environ); {} when it cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read(4 << 20)
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        k, eq, v = item.partition(b"=")
        if eq:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def version_of(path: str) -> str | None:
    """The NCCL version a library's bytes say (`NCCL version X.Y.Z+cuda...`), or None (not a regular file, not
    readable, no such string)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0 or st.st_size > MAX_LIB_BYTES:
            return None
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as m:
            found = _VERSION.search(m)
            return found.group(1).decode() if found else None
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _wheel_of(path: str) -> str | None:
    """`wheel NAME VERSION` when `path` sits in a Python package folder (site-packages/<pkg>/...) whose dist-info
    lists it in its RECORD; None otherwise."""
    parts = os.path.realpath(path).split(os.sep)
    for i in range(len(parts) - 1, 0, -1):
        if parts[i] in ("site-packages", "dist-packages"):
            site, rel = os.sep.join(parts[: i + 1]), "/".join(parts[i + 1 :])
            break
    else:
        return None
    try:
        infos = [d for d in os.listdir(site) if d.endswith(".dist-info")]
    except OSError:
        return None
    for d in sorted(infos):
        try:
            record = read_text(os.path.join(site, d, "RECORD"), 8 << 20)
        except OSError:
            continue
        if any(line.split(",", 1)[0] == rel for line in record.splitlines()):
            name, _, version = d[: -len(".dist-info")].rpartition("-")
            return f"wheel {name} {version}"
    return None


def _entries(value: str, sep: str) -> list[str]:
    return [p for p in re.split(sep, value or "") if p]


def how(path: str, env: dict) -> str:
    """How `path` (a mapped or found library) got into a process with environment `env`, in words."""
    real = os.path.realpath(path)
    ways = []
    if any(os.path.realpath(p) == real for p in _entries(env.get("LD_PRELOAD", ""), r"[:\s]+")):
        ways.append("LD_PRELOAD")
    folder = os.path.dirname(real)
    if any(os.path.realpath(d) == folder for d in _entries(env.get("LD_LIBRARY_PATH", ""), ":")):
        ways.append(f"LD_LIBRARY_PATH entry {folder}")
    wheel = _wheel_of(path)
    if wheel:
        ways.append(f"the file of {wheel}")
    if not ways:
        ways.append(f"loaded from its folder {folder} (RPATH or the loader's cache)")
    return ", ".join(ways)


def describe(path: str, env: dict, version: str | None = None) -> str:
    """`PATH (NCCL X.Y.Z, how)`: one library named for a reader."""
    v = version if version is not None else version_of(path)
    return f"{path} (NCCL {v or 'version unknown'}, {how(path, env)})"


def record(pid="self", env: dict | None = None) -> dict:
    """The one-NCCL record of process `pid`: {"mapped": [paths], "deleted": [paths], "versions": {path: version or
    None}, "how": {path: words}, "loader": {LD_PRELOAD, LD_LIBRARY_PATH as set}}. `env`: the process's environment
    (default: read from /proc/<pid>/environ; ours for "self"). Raises OSError when the maps cannot be read."""
    text = read_text(f"/proc/{pid}/maps")
    if env is None:
        env = dict(os.environ) if pid == "self" else environ_of(pid)
    mapped, deleted, ranges = nccl_maps(text)
    versions = {}
    for p in mapped:
        src = f"/proc/{pid}/map_files/{ranges[p]}" if p in deleted else p  # the mapped bytes, where we may read them
        versions[p] = version_of(src)
    return {
        "mapped": mapped,
        "deleted": deleted,
        "versions": versions,
        "how": {p: how(p, env) for p in mapped},
        "loader": {k: env[k] for k in LOADER_VARS if k in env},
    }


def sample(pids) -> dict:
    """{pid: record or {"error": why}} of every pid whose maps map a libnccl (a pid gone meanwhile is left out)."""
    out = {}
    for pid in pids:
        try:
            rec = record(pid)
        except FileNotFoundError:
            continue
        except OSError as e:
            rec = {"error": f"{type(e).__name__}: {e.strerror or e}"}
        if rec.get("mapped") or "error" in rec:
            out[pid] = rec
    return out


def shadows(env: dict, is_pinned, pinned_version: str | None) -> list[str]:
    """Every NCCL that `env`'s LD_PRELOAD or LD_LIBRARY_PATH would load ahead of the pinned one (`is_pinned(path)`:
    whether a file is the pinned NCCL), named with its file, version and how; [] when there is none. LD_LIBRARY_PATH
    counts the names the loader finds NCCL itself by (libnccl.so*), not NCCL's plugins (libnccl-net*.so, found there
    on purpose)."""
    want = f"the pinned NCCL {pinned_version}" if pinned_version else "the pinned NCCL"
    out, seen = [], set()
    for p in _entries(env.get("LD_PRELOAD", ""), r"[:\s]+"):
        if is_nccl(p) and not is_pinned(p):
            out.append(f"LD_PRELOAD loads {describe(p, env)} ahead of {want}")
    for d in _entries(env.get("LD_LIBRARY_PATH", ""), ":"):
        try:
            names = sorted(n for n in os.listdir(d) if _CORE.fullmatch(n))
        except OSError:
            continue
        for n in names:
            f = os.path.join(d, n)
            if os.path.realpath(f) in seen or is_pinned(f):
                continue
            seen.add(os.path.realpath(f))
            out.append(f"LD_LIBRARY_PATH entry {d} holds {describe(f, env)}, which may shadow {want}")
    return out
