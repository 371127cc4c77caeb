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
from ..launch import procmaps


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


VIEW_ENV = "REPROSTACK_KERNEL_VIEW"  # the folder of the stable views (default: <tmp>/reprostack-kernels-<uid>)


def view_root() -> Path:
    """Where `stable_view` puts its links: $REPROSTACK_KERNEL_VIEW, else <tmp>/reprostack-kernels-<uid>."""
    import tempfile

    named = os.environ.get(VIEW_ENV)
    return Path(named) if named else Path(tempfile.gettempdir()) / f"reprostack-kernels-{os.getuid()}"


def stable_view(folder: Path, root: Path | None = None) -> Path:
    """A path naming build `folder` by its name alone (`<root>/<folder name>`, a symlink to it), the same in every
    cache folder and on every node, for the paths DeepEP's JIT hashes.

    DeepEP names a JIT kernel's cache folder by a hash of its name, nvcc's version, the kernel's code and the nvcc
    flags, and those hold two absolute paths: `-I <EP_NCCL_ROOT_DIR>/include` and `-I<deep_ep's folder>/include`
    (csrc/jit/compiler.hpp; deep_ep/__init__.py takes its folder with os.path.abspath, which keeps a symlink). A
    build pulled from the kernel cache into another folder then finds none of the kernels its entry's jit/ holds
    and compiles them all again in the test (results/bench/kcache-h100-2026-12-06-b: before_test 10,
    compiled_in_test 10, 10 not reproduced). Through the view, a build's paths are its name's (deepep-<key>,
    nccl-<key>: the build key), so the pusher's and the puller's hashes agree.

    Invariants: `root` is a folder of this user's alone (owned by this uid, not a symlink, no group or other
    access), else BuildError, nothing followed or written in it; the link is replaced atomically (a rename), so a
    concurrent run of the same key sees one of two folders of that key, never a missing path."""
    root = Path(root) if root is not None else view_root()
    try:
        root.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(root)
    except OSError as e:
        raise BuildError(f"kernel view folder {root}: {e.strerror or e}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise BuildError(
            f"kernel view folder {root}: not a folder of this user's alone (owner uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):o}; expected uid {os.getuid()}, 700): remove it or set ${VIEW_ENV}"
        )
    link = root / Path(folder).name
    tmp = root / f".{Path(folder).name}.{os.getpid()}.tmp"
    try:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(Path(folder).resolve(), tmp, target_is_directory=True)
        os.replace(tmp, link)
    except OSError as e:
        raise BuildError(f"kernel view {link}: {e.strerror or e}") from None
    return link


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


def runtime_env(
    deepep_out: Path, base: dict | None = None, *, cache_root: Path | None = None, nccl_root: Path | None = None
) -> dict:
    """Environment for a process that imports torch + deep_ep from the build at `deepep_out`.

    DeepEP's setup.py writes the build's own absolute EP_NCCL_ROOT_DIR and EP_JIT_CACHE_DIR into deep_ep/envs.py
    (`persistent_envs`, used only where the variable is unset). A build pulled from the kernel cache was made in
    another folder (or on another node), so those paths name a folder that is not this run's: deep_ep's import then
    asserts "No libnccl.so found in <that folder>/lib/" (seen on the H100, results/bench/kcache-h100-*). With
    `nccl_root`, both are set here to this run's NCCL (`nccl_root`, whose lib/ the overlay links) and this build's
    jit/ folder, so a moved build never reads another folder's paths.

    The gate's scripts run from the verified source trees (test_ep.py from the patched deepep tree): no __pycache__
    may be left there, or the next run's re-hash of that tree sees foreign files and remakes it. With `cache_root`,
    bytecode goes to `<cache_root>/pycache` (PYTHONPYCACHEPREFIX: Python then reads and writes .pyc only in that
    mirror tree, never beside a source), and torch.compile's Inductor cache to the build's `inductor/`, compiling in
    the process (TORCHINDUCTOR_COMPILE_THREADS=1: no 16-process compile pool to start at every import of deep_ep,
    which calls torch.compile in deep_ep/utils/math.py). The H200 profile (results/bench/warm-profile-h200-2026-12-02)
    found those two to be most of the warm test's start-up. Neither changes what is measured: bytecode and the
    Inductor cache are keyed by their sources and torch; Triton's kernel cache goes to the build's `triton/` (not
    ~/.triton, so a fresh build folder is a cold run). Both sit in the build, as DeepEP's jit/ does, so a kernel
    cache entry carries them (kernels.cache). Without `cache_root`: no bytecode is written at all."""
    env = dict(os.environ if base is None else base)
    # replaced, not extended: the test process sees the image's Python, the overlay and deep_ep, and
    # nothing of the tool's own environment (e.g. reprostack's dependencies)
    env["PYTHONPATH"] = os.pathsep.join([str(deepep_out / "overlay"), str(deepep_out / "site")])
    if nccl_root is not None:
        env["EP_NCCL_ROOT_DIR"] = str(nccl_root)
        env["EP_JIT_CACHE_DIR"] = str(deepep_out / "jit")
    if cache_root is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        return env
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(pycache_dir(cache_root))
    # the compiled-code caches of torch.compile live in the build, beside DeepEP's jit/: the kernel cache's entry
    # carries them (kernels.cache.TOP), so a node that pulls the entry does not compile deep_ep's torch.compile
    # functions again (a cold hit's test was 40 s against a warm 25.5 s without them: results/bench/kcache-h100-*-c)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(deepep_out / "inductor")
    env["TRITON_CACHE_DIR"] = str(deepep_out / "triton")
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    return env


def prebuilt_env(base: dict | None = None) -> dict:
    """Environment for a process that imports torch + deep_ep as the image installed them (see the module doc)."""
    env = dict(os.environ if base is None else base)
    env.pop("PYTHONPATH", None)  # the in-image runner's own code (/opt/reprostack/code) stays out of the test
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _check_script() -> str:
    """The check process's program: import torch, torch.distributed and deep_ep, then print the one-NCCL record of
    its own maps (launch.procmaps, loaded by its path: reprostack is not importable in the test's Python)."""
    return (
        "import importlib.util, json, os, ctypes\n"
        f"spec = importlib.util.spec_from_file_location('_rs_procmaps', {str(Path(procmaps.__file__).resolve())!r})\n"
        "procmaps = importlib.util.module_from_spec(spec); spec.loader.exec_module(procmaps)\n"
        "import torch, torch.distributed\n"
        "import deep_ep\n"
        "rec = procmaps.record()\n"
        "runtime = None\n"
        "if len(rec['mapped']) == 1 and not rec['deleted']:\n"
        "    v = ctypes.c_int()\n"
        "    if ctypes.CDLL(rec['mapped'][0]).ncclGetVersion(ctypes.byref(v)) == 0:\n"
        "        runtime = f'{v.value // 10000}.{v.value % 10000 // 100}.{v.value % 100}'\n"
        "print(json.dumps({**rec, 'runtime': runtime,\n"
        "                  'torch_built_with': '.'.join(map(str, torch.cuda.nccl.version())),\n"
        "                  'deep_ep': os.path.dirname(deep_ep.__file__)}))\n"
    )


def check_one_nccl(
    python: str,
    env: dict,
    nccl_lib: Path,
    *,
    timeout: float = 300,
    accept_sha256: str | None = None,
    pinned_version: str | None = None,
) -> dict:
    """Import torch, torch.distributed and deep_ep in `env`; exactly one libnccl must be mapped and it
    must be the pinned build in `nccl_lib`. Returns {"mapped": [path], "runtime": "2.30.4" (ncclGetVersion of
    the mapped library), "torch_built_with": "2.28.9" (torch.cuda.nccl.version() is torch's compile-time
    header version, not what is loaded), "deep_ep": path, and launch.procmaps.record's fields}.

    `accept_sha256`: also accept a mapped library with these bytes (a prebuilt image's copy of the pinned build).
    Before the process starts, `env` is checked for an NCCL its loader variables would put ahead of the pinned one
    (preflight: named with its file, version and how). Raises BuildError naming every NCCL found (or the import
    error, with what the environment loads).
    """
    preflight(env, nccl_lib, pinned_version, accept_sha256=accept_sha256)
    p = subprocess.run([python, "-c", _check_script()], env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise BuildError(
            "importing torch + deep_ep in the kernel environment failed:\n"
            + p.stderr.strip()[-2000:]
            + older_nccl_hint(p.stderr, pinned_version)
        )
    info = json.loads(p.stdout.strip().splitlines()[-1])
    return judge_one_nccl(info, nccl_lib, accept_sha256=accept_sha256, pinned_version=pinned_version)


def pinned_files(nccl_lib: Path) -> set[str]:
    """The real paths of the pinned NCCL's libnccl files in `nccl_lib`."""
    return {str(f.resolve()) for f in Path(nccl_lib).glob("libnccl.so*")}


def is_pinned_fn(nccl_lib: Path, accept_sha256: str | None = None):
    """Whether a file is the pinned NCCL: one of the libnccl files of the build in `nccl_lib`; for a prebuilt image
    (`accept_sha256`: the sha256 its manifest hashed) only a regular file with exactly those bytes, wherever it lies
    (its folder may hold other files the manifest never hashed). Hashes are remembered per path for the call."""
    pinned = pinned_files(nccl_lib) if not accept_sha256 else set()
    seen: dict[str, bool] = {}

    def is_pinned(path: str) -> bool:
        if not accept_sha256:
            return os.path.realpath(path) in pinned
        if path not in seen:
            seen[path] = _has_sha256(path, accept_sha256)
        return seen[path]

    return is_pinned


def shadows(env: dict, nccl_lib: Path, pinned_version: str | None, *, accept_sha256: str | None = None) -> list:
    """Every NCCL but the pinned one (is_pinned_fn) that `env`'s LD_PRELOAD or LD_LIBRARY_PATH would load first
    (launch.procmaps.shadows), in words."""
    return procmaps.shadows(env, is_pinned_fn(nccl_lib, accept_sha256), pinned_version)


def shadows_by_version(env: dict, pinned_version: str | None) -> list:
    """`shadows` before the pinned build exists (or where it is only known by its release: a serving engine's
    wheel): every NCCL that `env`'s loader variables would load first whose bytes do not say `pinned_version`."""
    return procmaps.shadows(
        env, lambda p: pinned_version is not None and procmaps.version_of(p) == pinned_version, pinned_version
    )


def preflight(env: dict, nccl_lib: Path, pinned_version: str | None, *, accept_sha256: str | None = None) -> None:
    """Before a process starts with `env`: no NCCL but the pinned one may come first through LD_PRELOAD or
    LD_LIBRARY_PATH (`shadows`). Raises BuildError naming each with its file, version and how."""
    found = shadows(env, nccl_lib, pinned_version, accept_sha256=accept_sha256)
    refuse(found)


def refuse(found: list) -> None:
    """BuildError for the shadows `found` (one line), nothing when there is none."""
    if found:
        raise BuildError(
            "the environment would load another NCCL than the pinned one (nothing was started): "
            + "; ".join(found[:4])
            + (f" and {len(found) - 4} more" if len(found) > 4 else "")
            + ": unset it or point it at the pinned build"
        )


def older_nccl_hint(text: str, pinned_version: str | None) -> str:
    """A line for a failure whose output shows an undefined `nccl*` symbol: an NCCL older than the pinned one was
    loaded first (e.g. LD_PRELOAD of torch's own 2.28.9: ncclCommQueryProperties is newer)."""
    import re

    m = re.search(r"undefined symbol: (nccl\w+)", text or "")
    if not m:
        return ""
    want = f" {pinned_version}" if pinned_version else ""
    return (
        f"\n(undefined symbol {m.group(1)}: an NCCL older than the pinned{want} was loaded before it; "
        f"LD_PRELOAD, LD_LIBRARY_PATH or a wheel first on the path put it there)"
    )


_SHA_SEEN: dict = {}  # (path, dev, inode, size, mtime) -> sha256: a library hashed once per process


def _has_sha256(path: str, sha: str) -> bool:
    from ..digest import sha256_file

    try:  # a regular file only: a FIFO or /dev/zero named in a forged record would never finish reading
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return False
        key = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key not in _SHA_SEEN:
            _SHA_SEEN[key] = sha256_file(Path(path))
        return _SHA_SEEN[key] == sha
    except (OSError, ValueError):
        return False


def _shown(value, limit: int = 200) -> str:
    """An untrusted string from a record, cut and with control characters escaped."""
    s = value if isinstance(value, str) else repr(value)
    s = "".join(c if c.isprintable() else repr(c)[1:-1] for c in s[: limit + 1])
    return s if len(s) <= limit else s[:limit] + "..."


def named(info: dict, path: str) -> str:
    """`PATH (NCCL X.Y.Z, how it got there)` of one library of a record (its fields untrusted)."""
    versions = info.get("versions") if isinstance(info.get("versions"), dict) else {}
    ways = info.get("how") if isinstance(info.get("how"), dict) else {}
    v = versions.get(path)
    return f"{_shown(path)} (NCCL {_shown(v, 20) if isinstance(v, str) else 'version unknown'}, " + (
        f"{_shown(ways[path], 160)})" if isinstance(ways.get(path), str) else "how unknown)"
    )


def judge_one_nccl(
    info: dict, nccl_lib: Path, *, accept_sha256: str | None = None, pinned_version: str | None = None
) -> dict:
    """`info` ({"mapped": [paths], "deleted": [paths], "versions", "how", "runtime", ...}: what a process that
    imported torch + deep_ep saw, launch.procmaps.record) against the pinned build in `nccl_lib`: exactly one libnccl
    mapped, not deleted or replaced on disk since, and it is that build (with `accept_sha256`, a prebuilt image's:
    the file with exactly those bytes, is_pinned_fn). Returns
    `info`; raises BuildError naming every NCCL found with its version and how it got there, an older one as
    shadowing the pinned `pinned_version`. Never trusts `info`'s shape: it comes from a log (fail closed: a record
    without the `deleted` list is refused)."""
    mapped = info.get("mapped") if isinstance(info, dict) else None
    if not isinstance(mapped, list) or not all(isinstance(m, str) for m in mapped):
        raise BuildError(f"one-NCCL record without a list of mapped libraries: {_shown(str(info))}")
    deleted = info.get("deleted")
    if not isinstance(deleted, list) or not all(isinstance(m, str) and m in mapped for m in deleted):
        raise BuildError(
            "one-NCCL record without the list of its deleted libraries (a driver from before every mapping "
            f"counted, or a forged record): {_shown(str(info))}"
        )
    if deleted:
        raise BuildError(
            f"the NCCL mapped from {named(info, deleted[0])} was deleted or replaced on disk after it was loaded "
            f"(its maps line says (deleted)): the bytes that ran cannot be checked"
        )
    is_pinned = is_pinned_fn(nccl_lib, accept_sha256)
    want = {m for m in mapped[:1] if len(mapped) == 1 and is_pinned(m)}
    if len(mapped) != 1 or mapped[0] not in want:
        shown = [named(info, m) for m in mapped[:4]]
        more = f" and {len(mapped) - 4} more" if len(mapped) > 4 else ""
        older = _older(info, [m for m in mapped if m not in want], pinned_version)
        raise BuildError(f"expected exactly one NCCL, the pinned build in {nccl_lib}; mapped: {shown}{more}" + older)
    return info


def _older(info: dict, others: list[str], pinned_version: str | None) -> str:
    """`; an older NCCL X (PATH) shadows the pinned Y` for the first foreign library of a lower version."""
    versions = info.get("versions") if isinstance(info.get("versions"), dict) else {}

    def key(v):
        try:
            return tuple(int(x) for x in v.split("."))
        except (AttributeError, ValueError):
            return None

    want = key(pinned_version)
    for m in others:
        got = key(versions.get(m))
        if want and got and got < want:
            return f"; the older NCCL {'.'.join(map(str, got))} ({_shown(m)}) shadows the pinned {pinned_version}"
    return ""


def merge_samples(into: dict, sample: dict) -> None:
    """Add one launch.procmaps.sample ({pid: record}) to `into`: a pid keeps every library it was ever seen mapping
    (and every deletion), so a library mapped for a while and dropped still counts."""
    for pid, rec in sample.items():
        old = into.setdefault(pid, {"mapped": [], "deleted": [], "versions": {}, "how": {}})
        if "error" in rec:
            old.setdefault("error", rec["error"])
            continue
        old["mapped"] = sorted({*old["mapped"], *rec.get("mapped", [])})
        old["deleted"] = sorted({*old["deleted"], *rec.get("deleted", [])})
        old["versions"].update(rec.get("versions", {}))
        old["how"].update(rec.get("how", {}))


def judge_processes(
    samples: dict,
    what: str,
    *,
    nccl_lib: Path | None = None,
    accept_sha256: str | None = None,
    pinned_version: str | None = None,
    need_nccl: bool = True,
) -> dict:
    """The one-NCCL check of a run's processes read from outside while they ran (`samples`: {pid: record}, merged
    launch.procmaps.sample): every process that maps a libnccl maps exactly one, not deleted or replaced since, the
    pinned build in `nccl_lib` (or, without one, a library whose bytes say `pinned_version`), and all of them the same
    file; `need_nccl`: at least one process was seen mapping it. `what` names the processes (`server of arm deepep`).
    Returns {"processes": n, "mapped": path, "version"}; raises BuildError naming the pid, the file, its version and
    how it got there."""
    files = set()
    for pid, rec in sorted(samples.items()):
        if "error" in rec:
            raise BuildError(f"{what}: process {pid}: its maps could not be read: {_shown(rec['error'], 300)}")
        try:
            if nccl_lib is not None:
                judge_one_nccl(rec, nccl_lib, accept_sha256=accept_sha256, pinned_version=pinned_version)
            else:
                _judge_by_version(rec, pinned_version)
        except BuildError as e:
            raise BuildError(f"{what}: process {pid}: {e}") from None
        files.add(rec["mapped"][0])
    if len(files) > 1:
        raise BuildError(f"{what}: the processes map different NCCL files: {sorted(_shown(f) for f in files)[:4]}")
    if need_nccl and not files:
        raise BuildError(f"{what}: no process of the run was seen mapping an NCCL (its maps were read while it ran)")
    if not files:
        return {"processes": 0, "mapped": None, "version": None}
    f = files.pop()
    v = next((r.get("versions", {}).get(f) for r in samples.values() if f in r.get("mapped", [])), None)
    return {"processes": len(samples), "mapped": f, "version": v}


def _judge_by_version(rec: dict, pinned_version: str | None) -> None:
    """One process's record when the pinned NCCL is known by its version only (a serving engine's own wheel)."""
    mapped, deleted = rec.get("mapped", []), rec.get("deleted", [])
    if deleted:
        raise BuildError(
            f"the NCCL mapped from {named(rec, deleted[0])} was deleted or replaced on disk after it was loaded "
            f"(its maps line says (deleted)): the bytes that ran cannot be checked"
        )
    versions = rec.get("versions", {})
    if len(mapped) != 1 or (pinned_version and versions.get(mapped[0]) != pinned_version):
        shown = [named(rec, m) for m in mapped[:4]]
        older = _older(rec, [m for m in mapped if versions.get(m) != pinned_version], pinned_version)
        raise BuildError(f"expected exactly one NCCL, the pinned {pinned_version or '?'}; mapped: {shown}" + older)
