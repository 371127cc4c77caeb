"""nccl-tests (gate 0, fabric): the recipe's binaries (all_reduce_perf, alltoall_perf) built from the verified
nccl-tests tree against the pinned NCCL, into `<cache>/builds/nccl-tests-<key16>/bin/`.

How: upstream's own `src/Makefile`, one `make` whose targets are only `$(BUILDDIR)/<binary>` for each binary the
recipe names (upstream's `build` target makes eleven), with
- `NCCL_HOME` = a link folder made in the build's temp dir: `include` -> the NCCL build's include/, `lib/libnccl.so`
  -> its `lib/libnccl.so.2`. NVIDIA's wheel (kernels.ncclwheel) ships only `libnccl.so.2` and upstream links
  `-lnccl`; the binaries' NEEDED entry is the library's SONAME, `libnccl.so.2`, so which NCCL they load is decided
  at run time by the library path (gates.fabric puts the pinned NCCL's lib/ first and the report checks the
  version nccl-tests prints: `nccl-library=`);
- `CUDA_HOME` from the toolchain (nvcc, cuda runtime), the recipe's make vars rendered for the detected arch
  (`NVCC_GENCODE` for that arch only, `MPI=0`, `CUDARTLIB=cudart_static`);
- `BUILDDIR` = the temp dir: upstream writes objects and binaries only under BUILDDIR, so the verified source tree
  in the cache is never written.

Only nvcc, its version, cuda_home and arch of the Toolchain are used (no torch: the binaries do not load it).

Invariants: the key is sha256 of (tree hash, recipe digest, nvcc version, arch, rendered make vars, binaries, the
NCCL build's key) and names `<cache>/builds/nccl-tests-<key16>`; a dir with the same key is reused with no make
run (build.reuse_or_build: built in a temp dir, `build.json` written, then renamed, so it exists only complete); make
runs under build.run_logged (launch.watchdog: the whole process group stopped at `timeout`), its log kept in
`builds/logs/`; every binary the recipe names must come out as a regular ELF file, or BuildError names the missing
one and the log; `build.json` records each binary's sha256, the nccl-tests version (src/common.h) and the NCCL
version it was built against. A tree that is not nccl-tests fails before make.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from ..digest import sha256_file
from ..errors import BuildError
from . import preflight
from .build import Built, job_count, reuse_or_build, run_logged
from .recipe import Recipe, render
from .toolchain import Toolchain

COMPONENT = "nccl-tests"
_VERSION = re.compile(r'^#define\s+NCCL_TESTS_VERSION\s+"([0-9][0-9A-Za-z.+-]{0,40})"', re.M)
_BINARY = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def source_version(src: Path) -> str:
    """The nccl-tests release of a source tree, from `src/common.h` (`#define NCCL_TESTS_VERSION "X"`); BuildError
    when the tree has no `src/Makefile` or no such define (not an nccl-tests tree)."""
    h, mk = Path(src) / "src" / "common.h", Path(src) / "src" / "Makefile"
    try:
        text = h.read_text(errors="replace")[:200_000]
        if not mk.is_file():
            raise FileNotFoundError(f"no {mk}")
    except OSError as e:
        raise BuildError(f"{src}: not an nccl-tests tree: {e.strerror or e}") from None
    m = _VERSION.search(text)
    if not m:
        raise BuildError(f"{h}: no NCCL_TESTS_VERSION define; not an nccl-tests tree")
    return m.group(1)


def binaries(recipe: Recipe) -> tuple[str, ...]:
    """The binaries the recipe names (`make.targets`); BuildError for a name that is not a plain file name."""
    bad = [t for t in recipe.make_targets if not _BINARY.match(t)]
    if bad or not recipe.make_targets:
        raise BuildError(f"{recipe.path}: make.targets must name binaries like all_reduce_perf (got {bad or 'none'})")
    return tuple(recipe.make_targets)


def _nccl_view(nccl_root: Path, view: Path) -> None:
    """`view/include` -> the NCCL include dir, `view/lib/libnccl.so` -> its libnccl.so.2 (see the module doc)."""
    lib = nccl_root / "lib" / "libnccl.so.2"
    if not lib.is_file():
        raise BuildError(f"{lib}: no libnccl.so.2 in the NCCL build")
    (view / "lib").mkdir(parents=True)
    (view / "include").symlink_to((nccl_root / "include").resolve())
    (view / "lib" / "libnccl.so").symlink_to(lib.resolve())


def _is_elf(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return p.is_file() and not p.is_symlink() and f.read(4) == b"\x7fELF"
    except OSError:
        return False


def build_nccl_tests(
    src: Path,
    tree: str,
    recipe: Recipe,
    tc: Toolchain,
    nccl: Built,
    cache: Path,
    *,
    jobs: int | None = None,
    timeout: float = 1800,
) -> Built:
    """Build the recipe's binaries from nccl-tests tree `src` (pinned tree hash `tree`) against the NCCL build
    `nccl` (a source build or the unpacked wheel: `<out>/build/{include,lib}`); outputs in `<out>/bin/`.

    Raises BuildError: not an nccl-tests tree, an NCCL build without nccl.h or libnccl.so.2, make fails or times out
    (the message names the step and the log), a binary is missing after make."""
    version = source_version(src)
    names = binaries(recipe)
    nccl_root = Path(nccl.out) / "build"
    nccl_version = preflight.nccl_header_version(nccl_root / "include")
    make_vars = {k: render(v, tc.arch) for k, v in recipe.make_vars.items()}
    fields = {
        "component": COMPONENT,
        "tree": tree,
        "recipe": recipe.digest,
        "nvcc": tc.nvcc_version,
        "arch": tc.arch,
        "make_vars": make_vars,
        "binaries": list(names),
        "nccl": nccl.key,
    }

    def make(tmp: Path, log: Path) -> dict:
        view, out = tmp / "nccl-home", tmp / "bin"
        _nccl_view(nccl_root, view)
        env = dict(os.environ)
        env["CUDA_HOME"] = tc.cuda_home
        argv = [
            "make",
            "-C",
            str(Path(src) / "src"),
            f"-j{job_count(jobs)}",
            f"BUILDDIR={out}",
            f"CUDA_HOME={tc.cuda_home}",
            f"NCCL_HOME={view}",
            *(f"{k}={v}" for k, v in make_vars.items()),
            *(str(out / n) for n in names),
        ]
        run_logged(argv, cwd=Path(src) / "src", env=env, log=log, step="nccl-tests: make", timeout=timeout)
        missing = [n for n in names if not _is_elf(out / n)]
        if missing:
            raise BuildError(f"nccl-tests: make gave no {', '.join(missing)} in {out}; log: {log}")
        for junk in [p for p in out.iterdir() if p.name not in names]:  # objects, os/, verifiable/
            shutil.rmtree(junk) if junk.is_dir() and not junk.is_symlink() else junk.unlink()
        shutil.rmtree(view)
        return {
            "version": version,
            "nccl_version": nccl_version,
            "bin": "bin",
            "binaries": {n: {"path": f"bin/{n}", "sha256": sha256_file(out / n)} for n in names},
        }

    return reuse_or_build(cache, COMPONENT, fields, make)
