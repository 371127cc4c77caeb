#!/usr/bin/env python3
"""Record in the image's kernels manifest that NCCL came from a pinned wheel alone: /opt/reprostack/kernels.json.

Usage: record-nccl-wheel.py OUT lock_sha256=HEX64 image=NAME wheel_pin=PIN wheel=FILENAME wheel_sha256=HEX64 \
           wheel_path=PATH version=X.Y.Z include=DIR lib=PATH/libnccl.so.2
Writes OUT afresh with one component, `nccl`, of kind "wheel" (no git tree, no kernel recipe: a stack whose `nccl`
is a wheel pin, reprostack.lockstacks): the lock's wheel pin, the wheel's filename and sha256 (the copy at
wheel_path is hashed again here and must have it), the NCCL version its unpacked nccl.h says (must be `version`, the
pin's), and the sha256 of libnccl.so.2. containers/deepep/record-kernels.py then adds deepep to the same OUT (it
takes the NCCL version it was built against from this entry). The format is reprostack's
schemas/kernels-manifest.schema.json; reprostack.kernels.prebuilt.check compares it with the selected stack's pin.
Stdlib only (reprostack itself is not installed in the image). Any problem: exit 1 naming it, nothing written.
"""
import hashlib
import json
import os
import re
import sys

NEEDED = ("lock_sha256", "image", "wheel_pin", "wheel", "wheel_sha256", "wheel_path", "version", "include", "lib")


def fail(msg):
    sys.exit(f"record-nccl-wheel: {msg}")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def nccl_h_version(include):
    try:
        text = open(os.path.join(include, "nccl.h")).read()
    except OSError as e:
        fail(f"{include}/nccl.h: {e.strerror}")
    parts = [re.search(rf"#define\s+NCCL_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        fail(f"{include}/nccl.h: NCCL_MAJOR/MINOR/PATCH not found")
    return ".".join(p.group(1) for p in parts)


def main(argv):
    if not argv:
        fail("usage: record-nccl-wheel.py OUT " + " ".join(f"{k}=..." for k in NEEDED))
    out, a = argv[0], {}
    for arg in argv[1:]:
        k, eq, v = arg.partition("=")
        if not eq or not v or k not in NEEDED:
            fail(f"{arg!r}: expected one of {', '.join(NEEDED)} as KEY=VALUE with a value")
        a[k] = v
    missing = [k for k in NEEDED if k not in a]
    if missing:
        fail(f"{', '.join(missing)} required")
    for k in ("lock_sha256", "wheel_sha256"):
        if not re.fullmatch(r"[0-9a-f]{64}", a[k]):
            fail(f"{k} must be 64 hex (got {a[k]!r})")
    if os.path.basename(a["wheel_path"]) != a["wheel"] or not os.path.isfile(a["wheel_path"]):
        fail(f"wheel_path {a['wheel_path']} is not the file {a['wheel']}")
    got = sha256(a["wheel_path"])
    if got != a["wheel_sha256"]:
        fail(f"{a['wheel_path']}: sha256 {got}, the lock pins {a['wheel_sha256']}")
    version = nccl_h_version(a["include"])
    if version != a["version"]:
        fail(f"{a['include']}/nccl.h says {version}, the wheel pin {a['wheel_pin']} is {a['version']}")
    if not os.path.isfile(a["lib"]):
        fail(f"lib {a['lib']} is not a file")
    data = {"manifest_version": 1, "image": a["image"], "lock_sha256": a["lock_sha256"], "components": {"nccl": {
        "pin": "nccl", "kind": "wheel", "wheel_pin": a["wheel_pin"], "wheel": a["wheel"],
        "wheel_sha256": a["wheel_sha256"], "nccl_version": version, "lock_sha256": a["lock_sha256"],
        "paths": {"include": a["include"], "lib": os.path.dirname(a["lib"]), "wheel": a["wheel_path"]},
        "files": {a["lib"]: sha256(a["lib"])}}}}
    with open(out + ".tmp", "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
    os.replace(out + ".tmp", out)
    print(f"kernels.json: nccl wheel {a['wheel']} (pin {a['wheel_pin']}, sha256 {a['wheel_sha256']}), "
          f"NCCL {version} -> {a['lib']}")


if __name__ == "__main__":
    main(sys.argv[1:])
