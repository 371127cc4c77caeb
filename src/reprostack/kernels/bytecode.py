"""Bytecode for the gate's test processes, compiled while DeepEP builds (issue 17 item 1).

The test processes run with PYTHONPYCACHEPREFIX=<cache>/pycache (kernels.runtime.runtime_env): Python then reads
and writes .pyc files only under that prefix, never beside a source (the verified trees and the image's
site-packages stay as they are). On a first run every module the test imports (the stdlib, site-packages, torch
through the one-NCCL overlay) is compiled there, in each process that imports it: on the H200, 31.7 s of the test
before the prefix existed (results/bench/warm-profile-h200-2026-12-02). `start()` compiles them into the prefix in
a background process while nvcc compiles DeepEP (whose critical path is one source file, so cores are idle), torch
first; when the build is done, `Prewarm.finish()` gives it a few seconds and then stops it (what it did not reach,
the import compiles as before): it never lengthens the build by much and never runs while something is measured.
(On the H200 a full prewarm of the image's Python, 20,740 files on 8 niced workers, took 92.6 s against DeepEP's
75 s build, so waiting for all of it cost more than it saved; results/bench.)

Invariants:
- Writes only under the prefix: each file through py_compile with an explicit `cfile`, the path
  `importlib.util.cache_from_source` gives under the prefix for the path the test imports it by (torch and
  `nvidia/*` by their overlay paths, see runtime.make_overlay; everything else in place). The maps travel as JSON
  (no separator syntax a folder name could hold) and only absolute; only regular files are read (no FIFO, device
  or file over 32 MiB: those are left to the import).
- The same interpreter as the test (the .pyc name carries its tag, e.g. cpython-312, and its magic number).
- What is written is what import would write: timestamp .pycs, checked against the source's mtime and size at
  every import; so nothing the test measures changes, and a stale or foreign .pyc is recompiled by import itself.
- A file that does not compile is skipped (the import reports it as it always would); an existing .pyc whose
  header matches its source is kept (a warm prefix costs a stat and 16 bytes per file). Test suites and GUI parts
  (folders named test, tests, idlelib, tkinter, ...) are not compiled ahead: what imports them compiles them.
- Best effort: a prewarm that fails or is cut at its bound loses time, never correctness; `finish()` returns
  what happened (files compiled, seconds, whether it was cut) for the build record.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

# run by the test's interpreter: python -c SCRIPT PREFIX JOBS MAPS, MAPS a JSON list of [SRC, DEST, [EXCLUDED...]]:
# compile SRC's .py files under the paths DEST/... (DEST == SRC: in place), skipping those top-level names under SRC.
# JSON, not a syntax of separators: a path may hold any character (a folder named `a=>b` must not redirect writes).
# Only absolute paths; only regular files of at most MAX_BYTES (a FIFO would block a worker, /dev/zero never end).
_SCRIPT = r"""
import importlib.util, json, multiprocessing, os, py_compile, stat, sys
from concurrent.futures import ProcessPoolExecutor

MAX_BYTES = 32 << 20
NEVER = {"__pycache__", "test", "tests", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip"}

def files(maps):
    roots = {os.path.normpath(s) for s, _, _ in maps}
    for src, dest, skip in maps:
        for d, dirs, names in os.walk(src):
            rel_d = os.path.relpath(d, src)
            if rel_d == ".":
                dirs[:] = [x for x in dirs if x not in skip]
            # another root (a site-packages inside the stdlib dir) is walked as itself, once
            dirs[:] = [x for x in dirs if x not in NEVER and os.path.normpath(os.path.join(d, x)) not in roots]
            for n in names:
                if n.endswith(".py"):
                    yield os.path.join(d, n), os.path.normpath(os.path.join(dest, rel_d, n))

def one(pair):
    src, shown = pair
    try:
        st = os.stat(src)
    except OSError:
        return 0
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
        return 0
    cfile = importlib.util.cache_from_source(shown)
    try:
        with open(cfile, "rb") as f:
            head = f.read(16)
        if (len(head) == 16 and head[:4] == importlib.util.MAGIC_NUMBER and head[4:8] == bytes(4)
                and int.from_bytes(head[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
                and int.from_bytes(head[12:16], "little") == st.st_size & 0xFFFFFFFF):
            return 0
    except OSError:
        pass
    try:
        py_compile.compile(src, cfile=cfile, dfile=shown, doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
        return 1
    except Exception:
        return 0

sys.pycache_prefix = sys.argv[1]
jobs = int(sys.argv[2])
maps = [
    (os.path.normpath(src), os.path.normpath(dest), set(skip))
    for src, dest, skip in json.loads(sys.argv[3])
    if os.path.isabs(src) and os.path.isabs(dest)
]
with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as ex:
    print(sum(ex.map(one, files(maps), chunksize=64)))
"""


def plan(torch_site: Path, overlay: Path, stdlib_dirs: list[str]) -> list[list]:
    """The maps of the script, [SRC, DEST, EXCLUDED]: the stdlib dirs and `torch_site` in place, except torch/, which
    the test imports through `overlay` (runtime.make_overlay: overlay/torch); nvidia/<pkg> under overlay/nvidia/<pkg>
    only (a map's source is a root the in-place walk of site-packages skips; where the wheels' `nvidia` has an
    __init__.py and imports them in place, import compiles those few small files itself). Absolute
    paths (a relative one would be joined to the cwd under the prefix, `..` and all)."""
    site = os.path.abspath(torch_site)
    over = os.path.abspath(overlay)
    # torch first (most of what the test imports), then the stdlib, then the rest of site-packages: a prewarm cut
    # when the build ends has done the part that matters most
    out = [
        [f"{site}/torch", f"{over}/torch", []],
        *([d, d, []] for d in stdlib_dirs if d and os.path.isabs(d) and d != site),
        [site, site, ["torch"]],
    ]
    nvidia = Path(site) / "nvidia"
    if nvidia.is_dir():
        out += [
            [str(d), f"{over}/nvidia/{d.name}", []]
            for d in sorted(nvidia.iterdir())
            if d.is_dir() and d.name not in ("nccl", "__pycache__")
        ]
    return out


@dataclass
class Prewarm:
    """A running prewarm (see the module doc); `finish()` once."""

    proc: subprocess.Popen | None
    t0: float
    note: str = ""

    def finish(self, bound_s: float = 90.0) -> dict:
        """Wait up to `bound_s` for the prewarm, then stop it (its whole process group). Returns
        {"compiled": n or None, "seconds": s, "cut": bool, "note": why it did not run, if so}."""
        if self.proc is None:
            return {"compiled": None, "seconds": 0.0, "cut": False, "note": self.note}
        cut = False
        try:
            out, _ = self.proc.communicate(timeout=bound_s)
        except subprocess.TimeoutExpired:
            from ..launch.watchdog import kill_run

            kill_run(self.proc, self.proc.pid, None, grace_s=5)
            out, _ = self.proc.communicate()
            cut = True
        last = (out or "").strip().splitlines()[-1:] or [""]
        n = int(last[0]) if last[0].isdigit() and self.proc.returncode == 0 else None
        return {
            "compiled": n,
            "seconds": round(time.monotonic() - self.t0, 1),
            "cut": cut,
            **({"note": f"exit {self.proc.returncode}"} if n is None and not cut else {}),
        }


def start(
    python: str, prefix: Path, torch_site: Path | None, overlay: Path, *, jobs: int, stdlib_dirs: list[str] | None
) -> Prewarm:
    """Start compiling into `prefix` (niced, `jobs` processes, its own process group) with the test's interpreter
    `python` (toolchain.detect probed it: its stdlib is `stdlib_dirs`); a Prewarm that did nothing, with its reason,
    when the torch site or the stdlib is unknown."""
    t0 = time.monotonic()
    if not torch_site or not Path(torch_site).is_dir():
        return Prewarm(None, t0, "no torch site-packages known")
    if not stdlib_dirs:
        return Prewarm(None, t0, "the interpreter's stdlib is not known (toolchain probe)")
    try:  # best effort: a prefix that is a file or cannot be made, an unreadable site, no interpreter: no prewarm
        Path(prefix).mkdir(parents=True, exist_ok=True)
        argv = [
            python,
            "-c",
            _SCRIPT,
            os.path.abspath(prefix),
            str(max(1, jobs)),
            json.dumps(plan(Path(torch_site), Path(overlay), list(stdlib_dirs))),
        ]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONPYCACHEPREFIX")}
        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=lambda: os.nice(10),
        )
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        return Prewarm(None, t0, f"no prewarm: {type(e).__name__}: {str(e)[:200]}")
    return Prewarm(proc, t0)
