#!/usr/bin/env python3
"""The libraries libfabric dlopens for FI_HMEM (CUDA) resolve in this image, through the loader's cache alone.

usage: check-hmem-dlopen.py LIBFABRIC FI_INFO RECORD --toolkit NAME... --driver NAME... [--inject-dir DIR]

libfabric built with --enable-cuda-dlopen loads the CUDA runtime and the driver at run time by name (src/hmem_cuda.c
of the pin: libcudart.so, libcuda.so.1, libnvidia-ml.so.1); a name the loader cannot find turns HMEM off with an
info-level log line and no error (no GPUDirect RDMA on efa). Run in the substrate's build (stdlib only), as root:
1. each NAME must be a string of LIBFABRIC (the list is the binary's, not a stale copy);
2. the driver's NAMEs come from the container runtime (the NVIDIA container toolkit and enroot's nvidia hook inject
   them into the image's multiarch folder DIR, default /usr/lib/x86_64-linux-gnu, then run ldconfig): a stand-in of
   each (an empty library with that soname) is put there and ldconfig run, as the runtime would;
3. each NAME is dlopened in a fresh interpreter WITHOUT LD_LIBRARY_PATH (a launcher's export may replace it): a
   toolkit NAME must resolve under /usr/local/cuda, a driver NAME to DIR's stand-in (never the toolkit's link-time
   stub, lib/stubs/libcuda.so, which has no symbols);
4. `FI_INFO -l` runs with FI_LOG_LEVEL=info: libfabric's own log must name no `Failed to dlopen` and must
   show its CUDA init past every dlopen (`Failed to find cuGetErrorName`: the stand-in driver has no symbols);
5. the stand-ins are removed and ldconfig run again (ldconfig's aux-cache removed: the base has none).
RECORD (JSON) gets each name's resolved path and libfabric's CUDA lines. Exit 1 naming the first difference.
"""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

PROBE = r"""
import ctypes, sys
ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
for line in open("/proc/self/maps"):
    p = line.split()[-1]
    if "/" in p and p.rsplit("/", 1)[1].startswith(sys.argv[1].split(".so")[0] + ".so"):
        print(p)
        break
"""


def fail(msg: str) -> None:
    print(f"check-hmem-dlopen: {msg}", file=sys.stderr)
    sys.exit(1)


def resolve(name: str) -> str:
    """The file `name` resolves to when dlopened with the image's loader config and no LD_LIBRARY_PATH."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    r = subprocess.run([sys.executable, "-c", PROBE, name], env=env, capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.strip():
        fail(f"dlopen({name}) without LD_LIBRARY_PATH fails: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return os.path.realpath(r.stdout.strip())


def log_lines(text: str) -> list[str]:
    """libfabric's log lines about CUDA, HMEM or dlopen, each as `function():line<level> message` (the pid and
    time stamp of `libfabric:PID:TIME::core:core:` left out: the record is the same on every build)."""
    out = []
    for ln in text.splitlines():
        m = re.search(r"(\w+\(\):\d+<\w+>.*)$", ln)
        if m and re.search(r"cuda|hmem|dlopen", ln, re.I):
            out.append(m.group(1).strip())
    return out


def ldconfig() -> None:
    subprocess.run(["ldconfig"], check=True)
    Path("/var/cache/ldconfig/aux-cache").unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("libfabric")
    ap.add_argument("fi_info")
    ap.add_argument("record")
    ap.add_argument("--toolkit", nargs="+", required=True)
    ap.add_argument("--driver", nargs="+", required=True)
    ap.add_argument("--inject-dir", default="/usr/lib/x86_64-linux-gnu")
    a = ap.parse_args()
    blob = Path(a.libfabric).read_bytes()
    for name in (*a.toolkit, *a.driver):
        if b"\0" + name.encode() + b"\0" not in blob:
            fail(f"{a.libfabric} names no {name}: the list of names is not this libfabric's")
    inject = Path(a.inject_dir)
    stand_ins = [inject / n for n in a.driver]
    for p in stand_ins:
        if p.exists():
            fail(f"{p} is in the image: the driver's libraries must come from the container runtime")
    try:
        for p in stand_ins:
            subprocess.run(
                ["gcc", "-shared", "-x", "c", "-", "-o", str(p), f"-Wl,-soname,{p.name}"], input=b"", check=True
            )
        ldconfig()
        cuda = os.path.realpath("/usr/local/cuda")
        got = {}
        for name in a.toolkit:
            got[name] = resolve(name)
            if not got[name].startswith(cuda + "/"):
                fail(f"dlopen({name}) resolves to {got[name]}, not the toolkit's ({cuda})")
        for name, p in zip(a.driver, stand_ins):
            got[name] = resolve(name)
            if got[name] != str(p):
                fail(f"dlopen({name}) resolves to {got[name]}, not the runtime's injected {p}")
        r = subprocess.run(
            [a.fi_info, "-l"], env={**os.environ, "FI_LOG_LEVEL": "info"}, capture_output=True, text=True
        )
        lines = log_lines(r.stdout + r.stderr)
        bad = [ln for ln in lines if "Failed to dlopen" in ln]
        if bad:
            fail(f"libfabric says: {bad[0]}")
        if not any("Failed to find cuGetErrorName" in ln for ln in lines):
            fail(f"libfabric's CUDA init did not reach the driver's symbols; its lines: {lines[:6]}")
    finally:
        for p in stand_ins:
            p.unlink(missing_ok=True)
        ldconfig()
    Path(a.record).write_text(json.dumps({"resolved": got, "libfabric_log": lines}, indent=1) + "\n")
    print(f"check-hmem-dlopen: {json.dumps(got)}; libfabric: {lines[-1] if lines else ''}")


if __name__ == "__main__":
    main()
