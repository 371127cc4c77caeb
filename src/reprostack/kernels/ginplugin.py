"""The aws-ofi-nccl net/GIN plugin of a stack, built on a host from the stack's pins, and its export check.

Chain (each from its pin's verified tree, copied without .git into the work folder first: a build never writes
into the cache's verified trees): rdma-core (libibverbs + the efa provider, cmake, no libnl, no man pages, no
pyverbs) -> libfabric (the efa provider on that rdma-core, CUDA HMEM; every other fabric off) -> aws-ofi-nccl
(--with-libfabric, --with-cuda, gdrcopy headers from the gdrcopy pin; no tests, no -Werror). At aws-ofi-nccl
v1.21+ GDAKI is compiled in whenever libfabric has FI_EFA_GDA_OPS and the completion-counter ABI (libfabric 2.5+),
and only then does the library export `ncclGinPlugin_v14`: `check_exports` is the proof that the GDAKI plugin was
built (a proxy-only build exports no v14 GIN table).

`render_script` is pure (tested on the CPU): the exact commands and flags, in order, with the prefixes they
install to. The script fails fast (`set -euo pipefail`), names the step that failed, and writes `flags/<pin>.flags`
(the exact configure/cmake flags) and `built.json` (pin, rev, tree, prefix) next to the install.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import BuildError

CHAIN = ("rdma-core", "libfabric", "gdrcopy", "aws-ofi-nccl")  # gdrcopy: headers only (the plugin dlopens libgdrapi)
GDAKI_SYMBOL = "ncclGinPlugin_v14"

RDMA_CORE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DNO_MAN_PAGES=1",
    "-DNO_PYVERBS=1",
    "-DENABLE_STATIC=0",
    "-DENABLE_VALGRIND=0",
    "-DENABLE_RESOLVE_NEIGH=0",
    "-DIOCTL_MODE=both",
)
LIBFABRIC_OFF = (
    "verbs",
    "psm2",
    "psm3",
    "opx",
    "usnic",
    "ucx",
    "cxi",
    "lpp",
    "tcp",
    "udp",
    "rxm",
    "rxd",
    "sockets",
    "sm2",
    "monitor",
    "mrail",
    "perf",
    "hook_debug",
    "hook_hmem",
    "dmabuf_peer_mem",
    "trace",
    "profile",
    "lnx",
)


@dataclass(frozen=True)
class ChainSource:
    """One pin of the chain: its verified tree on disk, rev and tree hash (recorded in built.json)."""

    name: str
    path: Path
    rev: str
    tree: str


AUTOGEN = ("libfabric", "aws-ofi-nccl")  # built with autotools from git: `./autogen.sh` makes their configure
STAMP = ".reprostack-source"  # in a pregenerated tree: "<rev> <tree>" of the verified tree it was made from


def render_script(
    sources: dict[str, ChainSource], work: Path, prefix: Path, cuda: str, jobs: int, *, autogen_only: bool = False
) -> str:
    """The bash script that builds the chain from `sources` (every name of CHAIN) under `work` into `prefix`.

    A host without autotools (the lent H200) takes the generated build systems of AUTOGEN from a folder made on a
    host that has them: `autogen_only` renders the script that copies and runs `autogen.sh` only, stamping each tree
    with its rev and tree hash; the full script, run with $GINPLUGIN_PREGEN=<that work/src folder>, copies those
    trees instead, after checking the stamp names the same rev and tree as the lock and that every file of the
    verified tree is in the copy byte for byte (else it stops: only generated files may be extra), and runs
    `autogen.sh` only where no `configure` exists. Raises BuildError naming a missing pin."""
    missing = [n for n in CHAIN if n not in sources]
    if missing:
        raise BuildError(
            f"GIN plugin chain: no source for {', '.join(missing)} (pins of the chain: {', '.join(CHAIN)})"
        )
    if jobs < 1:
        raise BuildError(f"GIN plugin chain: jobs must be >= 1, not {jobs}")
    w, p = Path(work), Path(prefix)
    src = {n: w / "src" / n for n in CHAIN}
    lines = _preamble(w, p)
    for n in AUTOGEN if autogen_only else CHAIN:
        lines += _copy_lines(n, sources[n], src[n], w, pregen=n in AUTOGEN and not autogen_only)
    if autogen_only:
        return "\n".join(lines + ["step done: generated build systems under " + shlex.quote(str(w / "src"))]) + "\n"
    lines += _rdma_core_lines(src, w, p, jobs)
    lines += _libfabric_lines(src, w, p, cuda, jobs)
    lines += _ofi_lines(src, w, p, cuda, jobs)
    lines += _record_lines(sources, p)
    return "\n".join(lines) + "\n"


def _preamble(w: Path, p: Path) -> list[str]:
    """The script's head: strict mode, its folders, `step` and the ERR trap that names the failed step."""
    q = shlex.quote
    return [
        "#!/bin/bash",
        "# Rendered by reprostack (kernels/ginplugin.py) from the lock's pins; run with bash, no network needed.",
        "set -euo pipefail",
        f"mkdir -p {q(str(w / 'src'))} {q(str(w / 'build'))} {q(str(p))} {q(str(p / 'flags'))}",
        'step() { echo "[ginplugin] $(date +%T) $*"; }',
        f'trap \'echo "[ginplugin] FAILED at: ${{STEP:-setup}}" >&2; L=$(ls -t {q(str(w))}/*.log 2>/dev/null | head -1); '
        f'[ -n "$L" ] && {{ echo "[ginplugin] tail of $L:" >&2; tail -25 "$L" >&2; }}\' ERR',
        "PREGEN=${GINPLUGIN_PREGEN:-}",
    ]


def _copy_lines(n: str, s: ChainSource, dest: Path, w: Path, *, pregen: bool) -> list[str]:
    """Copy pin `n`'s verified tree (no .git) to `dest`; `pregen`: from $GINPLUGIN_PREGEN when set, after checking
    its stamp and that it holds the verified tree byte for byte; then `autogen.sh` for AUTOGEN's pins, stamped."""
    q = shlex.quote
    stamp = f"{s.rev} {s.tree}"
    lines = [
        f"STEP='copy {n}'; step \"$STEP ({s.rev[:12]})\"",
        f"rm -rf {q(str(dest))}",
        f"mkdir -p {q(str(dest))}",
    ]
    if pregen:
        pre = f"$PREGEN/{n}"
        lines += [
            'if [ -n "$PREGEN" ]; then',
            f'  [ "$(cat "{pre}/{STAMP}" 2>/dev/null)" = {q(stamp)} ] || '
            f'{{ echo "[ginplugin] {pre}/{STAMP} does not name {n} {stamp} (the lock\'s pin)" >&2; exit 2; }}',
            f'  tar -C "{pre}" -cf - . | tar -C {q(str(dest))} -xf -',
            # every file of the verified tree must be in it, byte for byte; only generated files are extra
            f'  D=$(diff -rq -x .git {q(str(s.path))} {q(str(dest))} | grep -v "^Only in {dest}" || true)',
            f'  [ -z "$D" ] || {{ echo "[ginplugin] $PREGEN/{n} differs from the verified tree of {n}: $D" '
            f"| head -5 >&2; exit 2; }}",
            "else",
            f"  tar -C {q(str(s.path))} --exclude=./.git -cf - . | tar -C {q(str(dest))} -xf -",
            "fi",
        ]
    else:
        lines.append(f"tar -C {q(str(s.path))} --exclude=./.git -cf - . | tar -C {q(str(dest))} -xf -")
    if n == "aws-ofi-nccl":  # without .git, its version script (autogen and configure) takes the commit from here
        lines.append(f"export BRAZIL_PACKAGE_CHANGE_ID={s.rev}")
    if n in AUTOGEN:
        lines += [
            f"STEP='{n} autogen'; step \"$STEP\"",
            f"cd {q(str(dest))}",
            f"[ -x ./configure ] || ./autogen.sh > {q(str(w / f'{n}.autogen.log'))} 2>&1",
            f"echo {q(stamp)} > {q(str(dest / STAMP))}",
        ]
    return lines


def _rdma_core_lines(src: dict[str, Path], w: Path, p: Path, jobs: int) -> list[str]:
    """rdma-core with cmake (RDMA_CORE_FLAGS, recorded in flags/rdma-core.flags), installed into `p`."""
    q = shlex.quote
    rb = w / "build" / "rdma-core"
    return [
        "STEP='rdma-core cmake'; step \"$STEP\"",
        f"printf '%s\\n' {' '.join(q(f) for f in RDMA_CORE_FLAGS)} -DCMAKE_INSTALL_PREFIX={q(str(p))} > {q(str(p / 'flags' / 'rdma-core.flags'))}",
        f"mkdir -p {q(str(rb))}",
        "GEN=; command -v ninja >/dev/null && GEN=-GNinja",
        f"cmake $GEN $(cat {q(str(p / 'flags' / 'rdma-core.flags'))}) -S {q(str(src['rdma-core']))} -B {q(str(rb))} > {q(str(w / 'rdma-core.cmake.log'))} 2>&1",
        "STEP='rdma-core build'; step \"$STEP\"",
        f"cmake --build {q(str(rb))} -j {jobs} > {q(str(w / 'rdma-core.build.log'))} 2>&1",
        f"cmake --install {q(str(rb))} > /dev/null",
        f"test -e {q(str(p / 'include' / 'infiniband' / 'efadv.h'))}",
    ]


def _libfabric_lines(src: dict[str, Path], w: Path, p: Path, cuda: str, jobs: int) -> list[str]:
    """libfabric: the efa provider on that rdma-core, every fabric of LIBFABRIC_OFF off, CUDA HMEM when `cuda` has
    nvml.h (flags recorded in flags/libfabric.flags), installed into `p`."""
    q = shlex.quote
    fab_flags = [f"--prefix={p}", f"--enable-efa={p}", "--enable-shm", *(f"--disable-{x}" for x in LIBFABRIC_OFF)]
    fab_cuda = [f"--with-cuda={cuda}", "--enable-cuda-dlopen"]
    return [
        "STEP='libfabric configure'; step \"$STEP\"",
        f"printf '%s\\n' {' '.join(q(f) for f in fab_flags)} > {q(str(p / 'flags' / 'libfabric.flags'))}",
        # libfabric's CUDA HMEM (GPU memory registration, what EFA-GDA uses on a real host) includes nvml.h; a CUDA
        # without it (a pip toolkit) gets a libfabric without HMEM, said here and in flags/libfabric.flags
        f"if [ -f {q(cuda + '/include/nvml.h')} ]; then printf '%s\\n' {' '.join(q(f) for f in fab_cuda)} "
        f'>> {q(str(p / "flags" / "libfabric.flags"))}; else echo "[ginplugin] no nvml.h under {cuda}/include: '
        f'libfabric without CUDA HMEM (the plugin still compiles GDAKI; EFA-GDA on a real host needs HMEM)"; '
        f"echo --without-cuda >> {q(str(p / 'flags' / 'libfabric.flags'))}; fi",
        f"cd {q(str(src['libfabric']))}",
        f"./configure $(cat {q(str(p / 'flags' / 'libfabric.flags'))}) > {q(str(w / 'libfabric.configure.log'))} 2>&1",
        "STEP='libfabric build'; step \"$STEP\"",
        f"make -j {jobs} > {q(str(w / 'libfabric.build.log'))} 2>&1",  # one command a line: `set -e` ignores all but the last of an && list
        "make install > /dev/null 2>&1",
        f"test -e {q(str(p / 'include' / 'rdma' / 'fi_ext_efa.h'))}",
    ]


def _ofi_lines(src: dict[str, Path], w: Path, p: Path, cuda: str, jobs: int) -> list[str]:
    """aws-ofi-nccl on that libfabric, with CUDA and the gdrcopy pin's headers (flags in flags/aws-ofi-nccl.flags);
    configure's GDAKI line is echoed."""
    q = shlex.quote
    ofi_flags = [
        f"--prefix={p}",
        f"--with-libfabric={p}",
        f"--with-cuda={cuda}",
        f"--with-gdrcopy={src['gdrcopy']}",
        "--disable-tests",
        "--disable-werror",
    ]
    return [
        "STEP='aws-ofi-nccl configure'; step \"$STEP\"",
        f"printf '%s\\n' {' '.join(q(f) for f in ofi_flags)} > {q(str(p / 'flags' / 'aws-ofi-nccl.flags'))}",
        f"cd {q(str(src['aws-ofi-nccl']))}",
        f"./configure $(cat {q(str(p / 'flags' / 'aws-ofi-nccl.flags'))}) > {q(str(w / 'aws-ofi-nccl.configure.log'))} 2>&1",
        f"grep -E 'GDAKI support (enabled|disabled)' {q(str(w / 'aws-ofi-nccl.configure.log'))} || true",
        "STEP='aws-ofi-nccl build'; step \"$STEP\"",
        f"make -j {jobs} > {q(str(w / 'aws-ofi-nccl.build.log'))} 2>&1",
        "make install > /dev/null 2>&1",
    ]


def _record_lines(sources: dict[str, ChainSource], p: Path) -> list[str]:
    """`built.json` under `p`: each pin's rev, tree, prefix and flags file."""
    built = {
        n: {
            "rev": sources[n].rev,
            "tree": sources[n].tree,
            "prefix": str(p),
            "flags": f"flags/{n}.flags" if n != "gdrcopy" else "headers only (--with-gdrcopy)",
        }
        for n in CHAIN
    }
    return [
        "STEP='record'; step \"$STEP\"",
        f"cat > {shlex.quote(str(p / 'built.json'))} <<'JSON'",
        json.dumps(built, indent=2, sort_keys=True),
        "JSON",
        "step done",
    ]


def check_exports(libdir: Path, symbol: str = GDAKI_SYMBOL) -> dict:
    """Which `libnccl-net*.so` under `libdir` exports `symbol` (defined, dynamic) next to a net plugin table.
    Returns {"library", "gin", "net"}; raises BuildError saying what is missing (no library, no nm, no symbol:
    a proxy-only build, i.e. GDAKI not compiled in)."""
    nm = shutil.which("nm")
    if not nm:
        raise BuildError("nm (binutils) is not installed: the plugin's exports cannot be checked")
    libs = sorted(p for p in Path(libdir).glob("libnccl-net*.so") if p.is_file())
    if not libs:
        raise BuildError(f"{libdir}: no libnccl-net*.so (the aws-ofi-nccl build installs libnccl-net-ofi.so)")
    seen = {}
    for lib in libs:
        r = subprocess.run([nm, "-D", "--defined-only", str(lib)], capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"{lib}: nm -D failed: {' '.join(r.stderr.split())[:200]}")
        names = {f[-1] for f in (line.split() for line in r.stdout.splitlines()) if len(f) >= 2}
        gin = sorted(n for n in names if n.startswith("ncclGinPlugin_v"))
        net = sorted(n for n in names if n.startswith("ncclNetPlugin_v"))
        seen[lib.name] = gin
        if symbol in names and net:
            return {"library": str(lib), "gin": gin, "net": net}
    got = "; ".join(f"{k}: {', '.join(v) or 'no GIN table'}" for k, v in seen.items())
    raise BuildError(
        f"{libdir}: no plugin exports {symbol} with a ncclNetPlugin_v* table ({got}); a build without "
        f"GDAKI (libfabric without FI_EFA_GDA_OPS / the completion-counter ABI, or no CUDA) exports none"
    )
