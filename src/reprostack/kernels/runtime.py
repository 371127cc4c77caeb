"""The run-time environment of the built kernels: exactly one NCCL, the pinned one, in the process.

The image's torch (2.11.0+cu130 on the H200) was built with NCCL 2.28.9 and finds `libnccl.so.2` in its
own `nvidia/nccl/lib`: through an RPATH (not RUNPATH, so LD_LIBRARY_PATH cannot redirect it) and through
`torch/__init__.py:_load_global_deps`, which preloads the NVIDIA libraries it needs by searching
`sys.path` for `nvidia/<pkg>/lib` (so LD_PRELOAD of ours ended with two NCCLs mapped, docs/campaign.md).
The overlay is a folder put first on PYTHONPATH: `nvidia/<pkg>` symlinks to the image's NVIDIA wheels,
except `nvidia/nccl/lib`, which holds our NCCL, so torch's own preload picks ours and every later
`libnccl.so.2` lookup is satisfied by that soname; `torch` is a symlink to the image's torch package.
The image's site-packages are never written. Whether it worked is not assumed: `check_one_nccl` reads
/proc/self/maps of a process that imported torch and deep_ep (on the H200: one NCCL, ours).

Kernels prebuilt in an image (reprostack.kernels.prebuilt) need no overlay: the deepep image installed deep_ep into
its own Python and put the pinned libnccl.so.2 into its nvidia-nccl wheel's folder (a copy, so the one-NCCL check
accepts a mapped library whose sha256 is the manifest's); `prebuilt_env` only drops the runner's own PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

from ..errors import BuildError


def make_overlay(torch_site: Path, nccl_lib: Path, dest: Path) -> Path:
    """Create the overlay at `dest` for the torch installed in `torch_site`, with NCCL from `nccl_lib`."""
    dest = Path(dest)
    (dest / "nvidia" / "nccl" / "lib").mkdir(parents=True)
    os.symlink(Path(torch_site) / "torch", dest / "torch", target_is_directory=True)
    nvidia = Path(torch_site) / "nvidia"
    if nvidia.is_dir():
        for d in sorted(nvidia.iterdir()):
            if d.name not in ("nccl", "__pycache__", "__init__.py"):
                os.symlink(d, dest / "nvidia" / d.name)
    libs = sorted(Path(nccl_lib).glob("libnccl.so*"))
    if not libs:
        raise BuildError(f"no libnccl.so* in {nccl_lib}")
    for f in libs:
        os.symlink(f.resolve(), dest / "nvidia" / "nccl" / "lib" / f.name)
    return dest


# what runtime_env / prebuilt_env set (a report's data.env shows them: what the test ran with)
RUNTIME_KEYS = (
    "PYTHONPATH",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONPYCACHEPREFIX",
    "TORCHINDUCTOR_CACHE_DIR",
    "TORCHINDUCTOR_COMPILE_THREADS",
    "TRITON_CACHE_DIR",
    "EP_JIT_CACHE_DIR",
)


def pycache_dir(cache_root: Path) -> Path:
    """Where the test processes' bytecode lives (PYTHONPYCACHEPREFIX; kernels.bytecode fills it during the build)."""
    return Path(cache_root) / "pycache"


def runtime_env(deepep_out: Path, base: dict | None = None, *, cache_root: Path | None = None) -> dict:
    """Environment for a process that imports torch + deep_ep from the build at `deepep_out`.

    The gate's scripts run from the verified source trees (test_ep.py from the patched deepep tree): no __pycache__
    may be left there, or the next run's re-hash of that tree sees foreign files and remakes it. With `cache_root`,
    bytecode goes to `<cache_root>/pycache` (PYTHONPYCACHEPREFIX: Python then reads and writes .pyc only in that
    mirror tree, never beside a source), and torch.compile's Inductor cache to `<cache_root>/inductor`, compiling in
    the process (TORCHINDUCTOR_COMPILE_THREADS=1: no 16-process compile pool to start at every import of deep_ep,
    which calls torch.compile in deep_ep/utils/math.py). The H200 profile (results/bench/warm-profile-h200-2026-12-02)
    found those two to be most of the warm test's start-up. Neither changes what is measured: bytecode and the
    Inductor cache are keyed by their sources and torch; Triton's kernel cache goes to `<cache_root>/triton` (not
    ~/.triton, so a fresh cache dir is a cold run). Without `cache_root`: no bytecode is written at all."""
    env = dict(os.environ if base is None else base)
    # replaced, not extended: the test process sees the image's Python, the overlay and deep_ep, and
    # nothing of the tool's own environment (e.g. reprostack's dependencies)
    env["PYTHONPATH"] = os.pathsep.join([str(deepep_out / "overlay"), str(deepep_out / "site")])
    if cache_root is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        return env
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(pycache_dir(cache_root))
    env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(cache_root) / "inductor")
    env["TRITON_CACHE_DIR"] = str(Path(cache_root) / "triton")
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    return env


def prebuilt_env(base: dict | None = None) -> dict:
    """Environment for a process that imports torch + deep_ep as the image installed them (see the module doc)."""
    env = dict(os.environ if base is None else base)
    env.pop("PYTHONPATH", None)  # the in-image runner's own code (/opt/reprostack/code) stays out of the test
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


_CHECK = r"""
import ctypes, json, os
import torch, torch.distributed
import deep_ep
libs = sorted({os.path.realpath(l.split()[-1]) for l in open('/proc/self/maps')
               if len(l.split()) >= 6 and os.path.basename(l.split()[-1]).startswith('libnccl')})
runtime = None
if len(libs) == 1:
    v = ctypes.c_int()
    if ctypes.CDLL(libs[0]).ncclGetVersion(ctypes.byref(v)) == 0:
        runtime = f"{v.value // 10000}.{v.value % 10000 // 100}.{v.value % 100}"
print(json.dumps({"mapped": libs, "runtime": runtime,
                  "torch_built_with": ".".join(map(str, torch.cuda.nccl.version())),
                  "deep_ep": os.path.dirname(deep_ep.__file__)}))
"""


def check_one_nccl(
    python: str, env: dict, nccl_lib: Path, *, timeout: float = 300, accept_sha256: str | None = None
) -> dict:
    """Import torch, torch.distributed and deep_ep in `env`; exactly one libnccl must be mapped and it
    must be the pinned build in `nccl_lib`. Returns {"mapped": [path], "runtime": "2.30.4" (ncclGetVersion of
    the mapped library), "torch_built_with": "2.28.9" (torch.cuda.nccl.version() is torch's compile-time
    header version, not what is loaded), "deep_ep": path}.

    `accept_sha256`: also accept a mapped library with these bytes (a prebuilt image's copy of the pinned build).
    Raises BuildError naming every NCCL found (or the import error).
    """
    p = subprocess.run([python, "-c", _CHECK], env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise BuildError("importing torch + deep_ep in the kernel environment failed:\n" + p.stderr.strip()[-2000:])
    return judge_one_nccl(json.loads(p.stdout.strip().splitlines()[-1]), nccl_lib, accept_sha256=accept_sha256)


def judge_one_nccl(info: dict, nccl_lib: Path, *, accept_sha256: str | None = None) -> dict:
    """`info` ({"mapped": [paths], "runtime", ...}: what a process that imported torch + deep_ep saw) against the
    pinned build in `nccl_lib`: exactly one libnccl mapped, and it is that build (or has the bytes `accept_sha256`).
    Returns `info`; raises BuildError naming every NCCL found. Never trusts `info`'s shape: it comes from a log."""
    mapped = info.get("mapped") if isinstance(info, dict) else None
    if not isinstance(mapped, list) or not all(isinstance(m, str) for m in mapped):
        raise BuildError(f"one-NCCL record without a list of mapped libraries: {str(info)[:200]}")
    want = {str(f.resolve()) for f in Path(nccl_lib).glob("libnccl.so*")}
    if accept_sha256 and len(mapped) == 1 and mapped[0] not in want:
        from ..digest import sha256_file

        try:  # a regular file only: a FIFO or /dev/zero named in a forged record would never finish reading
            if stat.S_ISREG(os.stat(mapped[0]).st_mode) and sha256_file(Path(mapped[0])) == accept_sha256:
                want.add(mapped[0])
        except (OSError, ValueError):
            pass
    if len(mapped) != 1 or mapped[0] not in want:
        shown = [m if len(m) <= 200 else m[:200] + "..." for m in mapped[:4]]
        more = f" and {len(mapped) - 4} more" if len(mapped) > 4 else ""
        raise BuildError(f"expected exactly one NCCL, the pinned build in {nccl_lib}; mapped: {shown}{more}")
    return info
