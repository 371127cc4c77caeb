#!/usr/bin/env python3
"""Unpack NCCL from NVIDIA's nvidia-nccl-cu13 wheel into PREFIX/{include,lib}, the layout of a source build.

Usage: unpack-nccl-wheel.py WHEEL PREFIX VERSION
The wheel's sha256 was checked against the lock before this runs (the Dockerfile's `sha256sum -c`); its content is
still untrusted, as in reprostack.kernels.ncclwheel.unpack (the host-mode twin of this script): every member name is a
relative path without `..`, NUL or backslash, and appears once; no symlinks; at most 4 GiB unpacked; only
nvidia/nccl/include/** and nvidia/nccl/lib/** are written; PREFIX/include/nccl.h must say VERSION and
PREFIX/lib/libnccl.so.2 must exist. Stdlib only (reprostack itself is not installed in the image).
Any problem: exit 1 naming it; PREFIX is written only when every member passed (into PREFIX.part, then renamed).
"""
import os
import re
import shutil
import stat
import sys
import zipfile

PREFIX = "nvidia/nccl/"
PARTS = ("include", "lib")
MAX_UNPACKED = 4 << 30


def fail(msg):
    sys.exit(f"unpack-nccl-wheel: {msg}")


def problem(info):
    name = info.filename
    if not name or "\\" in name or "\x00" in name or name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return "not a relative path"
    if ".." in name.split("/"):
        return "a path outside the prefix (..)"
    if stat.S_ISLNK(info.external_attr >> 16):
        return "a symlink"
    return None


def main(argv):
    if len(argv) != 3:
        fail("usage: unpack-nccl-wheel.py WHEEL PREFIX VERSION")
    wheel, prefix, version = argv
    if os.path.exists(prefix):
        fail(f"{prefix} exists already")
    part = prefix + ".part"
    shutil.rmtree(part, ignore_errors=True)
    try:
        with zipfile.ZipFile(wheel) as z:
            infos, seen = z.infolist(), set()
            for info in infos:
                why = problem(info)
                if why:
                    fail(f"{wheel}: member {info.filename!r} is {why}; not unpacked")
                if info.filename in seen:
                    fail(f"{wheel}: member {info.filename!r} is in the wheel twice; not unpacked")
                seen.add(info.filename)
            wanted = [i for i in infos if not i.is_dir() and any(i.filename.startswith(f"{PREFIX}{p}/") for p in PARTS)]
            if sum(i.file_size for i in wanted) > MAX_UNPACKED:
                fail(f"{wheel}: {PREFIX} would unpack to more than {MAX_UNPACKED >> 30} GiB")
            for info in wanted:
                out = os.path.join(part, info.filename[len(PREFIX):])
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with z.open(info) as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                os.chmod(out, 0o755 if info.filename.startswith(f"{PREFIX}lib/") else 0o644)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as e:
        shutil.rmtree(part, ignore_errors=True)
        fail(f"{wheel}: cannot unpack: {e}")
    for need in ("include/nccl.h", "lib/libnccl.so.2"):
        if not os.path.isfile(os.path.join(part, need)):
            shutil.rmtree(part, ignore_errors=True)
            fail(f"{wheel}: no {PREFIX}{need}; not an NCCL wheel")
    text = open(os.path.join(part, "include", "nccl.h")).read()
    got = [re.search(rf"#define\s+NCCL_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    got = ".".join(m.group(1) for m in got) if all(got) else None
    if got != version:
        shutil.rmtree(part, ignore_errors=True)
        fail(f"{wheel}: its nccl.h says {got}, the lock pins {version}")
    os.rename(part, prefix)
    print(f"unpack-nccl-wheel: NCCL {version} from {os.path.basename(wheel)} -> {prefix}/{{include,lib}} "
          f"({len(wanted)} files)")


if __name__ == "__main__":
    main(sys.argv[1:])
