"""Build NCCL and DeepEP into `<cache>/builds/<component>-<key>`, where key = sha256 of everything the
binary depends on (source tree, recipe content, toolchain versions, arch, flags, the keys of what it links).

Invariants: an output dir exists only complete (built in `.<component>-<key16>.partial`, `build.json` written, then
renamed); an existing dir with the same key is reused without running a compiler; one builder per key at a time
(a lock file beside it); the build folder's path is a function of the cache root and the key, never random (nvcc
puts it into the device code); logs are kept.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import BuildError
from . import preflight
from .elfcheck import check_private_libstdcxx
from .recipe import Recipe, render
from .runtime import pycache_dir
from .toolchain import Toolchain


@dataclass(frozen=True)
class Built:
    """A finished build: `out` holds the outputs and `build.json`; `reused` when no compiler ran; `origin`: "build"
    (compiled here, now or by an earlier run) or "cache" (pulled from the signed kernel cache, kernels.cache, now or by
    an earlier run: `.pulled.json` beside build.json says so)."""

    component: str
    key: str
    out: Path
    reused: bool
    seconds: float
    info: dict
    origin: str = "build"

    @property
    def log(self) -> Path:
        return self.out / "build.log"


def build_key(fields: dict) -> str:
    """sha256 over the canonical JSON of `fields` (64 hex)."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


PREWARM_GRACE_S = 5.0  # how long a finished DeepEP build waits for the bytecode prewarm before cutting it


def job_count(jobs: int | None) -> int:
    return jobs or max(1, len(os.sched_getaffinity(0)))


def run_logged(argv: list[str], *, cwd: Path, env: dict, log: Path, step: str, timeout: float) -> None:
    """Run `argv` under launch.watchdog (the whole process group stopped at `timeout`), its output appended to
    `log`, each line after its seconds since the start (`   12.3 ...`: where a build's time went, e.g. setup.py's
    torch import before the compile). Raises BuildError naming the step and the log."""
    from ..launch.watchdog import run_with_watchdog

    with open(log, "ab") as f:
        f.write(f"$ {' '.join(argv)}\n".encode())
    try:
        out = run_with_watchdog(
            argv, env=env, cwd=cwd, timeout_s=timeout, log_path=log, grace_s=5.0, echo=False, append=True, stamp=True
        )
    except OSError as e:
        raise BuildError(f"{step}: cannot run {argv[0]}: {e}") from None
    if out.timed_out:
        raise BuildError(f"{step}: timed out after {timeout:.0f} s; log: {log}")
    if out.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise BuildError(f"{step}: exit {out.returncode}; log: {log}\n" + "\n".join(tail))


MAX_NINJA_LOG_BYTES = 1 << 20


def ninja_steps(work: Path) -> list[tuple[float, str]]:
    """(seconds, output) of each step in the `.ninja_log` files under `work` (torch's cpp_extension builds with
    ninja into build/temp.*), longest first; [] when there is none. The log is ninja's own tab-separated
    `start_ms end_ms mtime output hash` (v5/v6); a line of another shape is passed over, a file over 1 MiB is not
    read (it is the build's own scratch, but it is read only for the build record)."""
    out: list[tuple[float, str]] = []
    for p in sorted(Path(work).glob("build/*/.ninja_log")):
        try:
            if not p.is_file() or p.stat().st_size > MAX_NINJA_LOG_BYTES:
                continue
            lines = p.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            f = line.split("\t")
            if len(f) >= 4 and f[0].isdigit() and f[1].isdigit():
                out.append((round((int(f[1]) - int(f[0])) / 1000, 1), os.path.basename(f[3])[:200]))
    return sorted(out, key=lambda t: -t[0])


PULLED = ".pulled.json"  # beside build.json in a build folder that came from the kernel cache (not part of an entry)


def reuse_or_build(cache: Path, component: str, fields: dict, make, substitute=None) -> Built:
    """The build of `component` keyed by build_key(fields) under `cache`/builds: reused when its build.json holds
    that key, else taken from the kernel cache by `substitute(tmp) -> info | None` (kernels.cache: a signed entry,
    checked whole before it is renamed into place), else `make(tmp, log)` builds into a temp folder that replaces the
    old one whole (os.replace)."""
    key = build_key(fields)
    out = Path(cache) / "builds" / f"{component}-{key[:16]}"
    out.parent.mkdir(parents=True, exist_ok=True)
    # one builder per key at a time (two gates on one shared cache): the second waits, then reuses the first's
    with open(out.parent / f".{component}-{key[:16]}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        return _reuse_or_build_locked(component, key, fields, out, make, substitute)


def _substituted(component: str, key: str, out: Path, substitute) -> Built | None:
    tmp = out.parent / f".{component}-{key[:16]}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    t0 = time.monotonic()
    try:
        info = substitute(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if info is None:
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    seconds = round(time.monotonic() - t0, 1)
    (tmp / PULLED).write_text(json.dumps({"seconds": seconds}, sort_keys=True))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return Built(component, key, out, False, seconds, info, origin="cache")


def _reuse_or_build_locked(component: str, key: str, fields: dict, out: Path, make, substitute=None) -> Built:
    manifest = out / "build.json"
    if manifest.is_file():
        info = json.loads(manifest.read_text())
        if info.get("key") == key:
            return Built(component, key, out, True, 0.0, info, origin="cache" if (out / PULLED).is_file() else "build")
    if substitute is not None:
        got = _substituted(component, key, out, substitute)
        if got is not None:
            return got
    logs = out.parent / "logs"
    logs.mkdir(exist_ok=True)
    # the log lives outside the temp dir, so an error message names a file that is still there
    log = logs / f"{component}-{key[:16]}.log"
    log.write_text("")
    # the build folder's name is the key's, never a random one: nvcc writes the source path into the device code
    # (device-assert file names, and a hash of it into every internal-linkage name), so two builds of one key in one
    # cache give the same bytes only from the same folder (results/images/cubins.md: a random one made every DeepEP
    # build on the H200 differ)
    tmp = out.parent / f".{component}-{key[:16]}.partial"
    shutil.rmtree(tmp, ignore_errors=True)  # a build killed before it finished: started again from nothing
    tmp.mkdir()
    t0 = time.monotonic()
    from .. import ui

    try:
        # the compiler's lines as one live line; all in the log. A wheel's unpack is its own step (its own ETA)
        with ui.step(f"unpack {component} wheel" if fields.get("from") == "wheel" else f"build {component}", log=log):
            info = make(tmp, log)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    seconds = round(time.monotonic() - t0, 1)
    info = {"component": component, "key": key, "fields": fields, "seconds": seconds, **info}
    shutil.copyfile(log, tmp / "build.log")
    (tmp / "build.json").write_text(json.dumps(info, indent=1, sort_keys=True))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return Built(component, key, out, False, seconds, info)


def build_nccl(
    src: Path, tree: str, recipe: Recipe, tc: Toolchain, cache: Path, *, jobs: int | None = None, timeout: float = 3600
) -> Built:
    """Build NCCL from source tree `src` (pinned tree hash `tree`); outputs in `<out>/build/{include,lib}`.

    Raises BuildError: the source is not an NCCL tree; make fails (message names the step and the log).
    """
    version = preflight.nccl_source_version(src)
    make_vars = {k: render(v, tc.arch) for k, v in recipe.make_vars.items()}
    fields = {
        "component": "nccl",
        "tree": tree,
        "recipe": recipe.digest,
        "nvcc": tc.nvcc_version,
        "arch": tc.arch,
        "make_vars": make_vars,
        "targets": list(recipe.make_targets),
    }

    def make(tmp: Path, log: Path) -> dict:
        env = dict(os.environ)
        env["CUDA_HOME"] = tc.cuda_home
        argv = [
            "make",
            "-C",
            str(src),
            f"-j{job_count(jobs)}",
            *recipe.make_targets,
            f"BUILDDIR={tmp / 'build'}",
            *(f"{k}={v}" for k, v in make_vars.items()),
        ]
        run_logged(argv, cwd=src, env=env, log=log, step="nccl: make src.build", timeout=timeout)
        built = preflight.nccl_header_version(tmp / "build" / "include")
        if built != version:
            raise BuildError(f"nccl: built nccl.h says {built}, source version.mk says {version}")
        return {"version": version, "lib": "build/lib/libnccl.so.2", "include": "build/include"}

    return reuse_or_build(cache, "nccl", fields, make)


def build_deepep(
    src: Path,
    tree: str,
    recipe: Recipe,
    tc: Toolchain,
    nccl: Built,
    cache: Path,
    *,
    jobs: int | None = None,
    timeout: float = 3600,
    substitute=None,
) -> Built:
    """Build DeepEP (`_C` + the Python package) into `<out>/site`, against `nccl` and tc's NVSHMEM.

    Preflight first: NCCL header >= recipe floor, NVSHMEM root complete. Also makes `<out>/overlay`
    (see runtime.make_overlay). `substitute(component, key, tmp) -> info | None` (kernels.cache.substituter): a
    signed cache entry for this key is taken instead of compiling. Raises BuildError naming the failed step and the log.
    """
    nccl_root = nccl.out / "build"
    nccl_version = preflight.nccl_header_version(nccl_root / "include")
    if recipe.nccl_floor:
        preflight.check_floor(f"{nccl_root}/include/nccl.h", nccl_version, recipe.nccl_floor)
    nvshmem = preflight.check_nvshmem_root(os.environ.get("EP_NVSHMEM_ROOT_DIR") or tc.nvshmem_root)
    env_vars = {k: render(v, tc.arch) for k, v in recipe.env.items()}
    fields = {
        "component": "deepep",
        "tree": tree,
        "recipe": recipe.digest,
        "toolchain": tc.key_fields(),
        "nccl": nccl.key,
        "nvshmem": str(nvshmem),
        "env": env_vars,
    }

    make = _deepep_maker(src, fields, env_vars, tc, cache, nccl_root, nvshmem, nccl_version, jobs, timeout)
    pulled = _deepep_puller(substitute, fields, tc, cache, nccl_root, jobs) if substitute else None
    return reuse_or_build(cache, "deepep", fields, make, pulled)


def _deepep_maker(
    src: Path,
    fields: dict,
    env_vars: dict,
    tc: Toolchain,
    cache: Path,
    nccl_root: Path,
    nvshmem: Path,
    nccl_version: str,
    jobs: int | None,
    timeout: float,
):
    """`make(tmp, log) -> info` for reuse_or_build: DeepEP's setup.py build of a copy of `src` (no .git) into
    `tmp/site`, the overlay made, the extension's private libstdc++ checked."""

    def make(tmp: Path, log: Path) -> dict:
        from .runtime import make_overlay

        work = tmp / "src"
        shutil.copytree(src, work, ignore=shutil.ignore_patterns(".git"), symlinks=True)
        final = Path(cache) / "builds" / f"deepep-{build_key(fields)[:16]}"
        env = _deepep_env(env_vars, tmp, tc, cache, final, nccl_root, nvshmem, jobs)
        ninja, prewarm = _deepep_setup_build(work, tmp, env, env_vars, tc, cache, final, jobs, log, timeout)
        shutil.rmtree(work)
        make_overlay(Path(tc.torch_site), nccl_root / "lib", tmp / "overlay")
        so = sorted((tmp / "site" / "deep_ep").glob("_C*.so"))
        if not so:
            raise BuildError(f"deepep: no deep_ep/_C*.so produced; log: {log}")
        libstdcxx = check_private_libstdcxx(so[0])
        return {
            "nccl_version": nccl_version,
            "nvshmem_root": str(nvshmem),
            "site": "site",
            "overlay": "overlay",
            "extension": str(so[0].relative_to(tmp)),
            "libstdcxx": libstdcxx,
            "ninja": ninja,
            "bytecode_prewarm": prewarm,
        }

    return make


def _deepep_env(
    env_vars: dict,
    tmp: Path,
    tc: Toolchain,
    cache: Path,
    final: Path,
    nccl_root: Path,
    nvshmem: Path,
    jobs: int | None,
) -> dict:
    """The environment of DeepEP's setup.py: this process's, the recipe's `env`, and what points it at our NCCL,
    NVSHMEM, CUDA, JIT cache and bytecode prefix."""
    env = dict(os.environ)
    env.update(env_vars)
    # DeepEP's setup.py puts `git rev-parse --short HEAD` of its cwd into the version: the copy has no .git, so
    # git would walk up into whatever repository holds the cache (reprostack's own checkout) and the built
    # package would carry that commit. The ceiling stops the walk: always `+local`, whatever holds the cache.
    env["GIT_CEILING_DIRECTORIES"] = str(tmp)
    # setup.py imports torch (twice: metadata, then the wheel): its bytecode goes to the cache's prefix, never into
    # the image's site-packages (kernels.runtime: they are never written)
    env["PYTHONPYCACHEPREFIX"] = str(pycache_dir(cache))
    env.update(
        {
            "EP_NCCL_ROOT_DIR": str(nccl_root),
            "EP_NVSHMEM_ROOT_DIR": str(nvshmem),
            "MAX_JOBS": str(job_count(jobs)),
            "EP_JIT_CACHE_DIR": str(final / "jit"),
            "CUDA_HOME": tc.cuda_home,
        }
    )
    return env


def _deepep_setup_build(
    work: Path,
    tmp: Path,
    env: dict,
    env_vars: dict,
    tc: Toolchain,
    cache: Path,
    final: Path,
    jobs: int | None,
    log: Path,
    timeout: float,
) -> tuple[str | None, dict]:
    """Run `setup.py build` in `work` into `tmp/site` with the test's bytecode compiled meanwhile; the log gets the
    jobs, arch, ninja, the prewarm's result and each ninja step's seconds. Returns (ninja's path or None, prewarm)."""
    # upstream's setup.py straight (`build`: build_py copies the package and its headers, build_ext compiles _C)
    # into the target: pip would run setup.py twice (a metadata pass, then the wheel; each imports torch) and zip
    # and unzip the result, ~13 s of a cold build on the H200 before and after the compile (scripts/device/
    # build_anatomy.sh; results/bench). The package in `site` is the same files, without pip's dist-info.
    argv = [
        tc.python,
        "setup.py",
        "build",
        "--build-base",
        str(work / "build"),
        "--build-lib",
        str(tmp / "site"),
    ]
    # torch's cpp_extension compiles in parallel (MAX_JOBS) only through ninja; without it, one file at a time
    ninja = shutil.which("ninja", path=env.get("PATH"))
    with open(log, "a") as f:
        f.write(
            f"# jobs {env['MAX_JOBS']}, arch {env_vars.get('TORCH_CUDA_ARCH_LIST', '?')}, ninja: "
            f"{ninja or 'none on PATH (files compiled one after another)'}\n"
        )
    # the test's bytecode compiled meanwhile, on the cores nvcc leaves idle (kernels.bytecode); joined, bounded,
    # before the step ends, so it never runs during a measurement
    from . import bytecode

    warm = bytecode.start(
        tc.python,
        pycache_dir(cache),
        Path(tc.torch_site) if tc.torch_site else None,
        final / "overlay",
        jobs=max(1, job_count(jobs) // 2),
        stdlib_dirs=[tc.stdlib] if tc.stdlib else None,
    )
    try:
        run_logged(argv, cwd=work, env=env, log=log, step="deepep: setup.py build", timeout=timeout)
    except BaseException:
        warm.finish(bound_s=0)
        raise
    prewarm = warm.finish(bound_s=PREWARM_GRACE_S)
    steps = ninja_steps(work)
    with open(log, "a") as f:
        f.write(f"# bytecode prewarm (kernels.bytecode): {json.dumps(prewarm, sort_keys=True)}\n")
        for sec, target in steps:  # where the compile time went (the critical path is the longest step)
            f.write(f"# ninja step {sec:8.1f} s  {target}\n")
    return ninja, prewarm


def _deepep_puller(substitute, fields: dict, tc: Toolchain, cache: Path, nccl_root: Path, jobs: int | None):
    """`pulled(tmp) -> info | None`: DeepEP's cache entry pulled into `tmp` by `substitute` (kernels.cache), its
    overlay made here (it links this node's torch and NCCL), the test's bytecode compiled meanwhile as during a
    build (kernels.bytecode)."""
    key = build_key(fields)

    def pulled(tmp: Path) -> dict | None:
        from . import bytecode
        from .runtime import make_overlay

        warm = bytecode.start(
            tc.python,
            pycache_dir(cache),
            Path(tc.torch_site) if tc.torch_site else None,
            Path(cache) / "builds" / f"deepep-{key[:16]}" / "overlay",
            jobs=job_count(jobs),
            stdlib_dirs=[tc.stdlib] if tc.stdlib else None,
        )
        try:
            info = substitute("deepep", key, tmp)
            if info is not None:
                make_overlay(Path(tc.torch_site), nccl_root / "lib", tmp / "overlay")
        finally:
            prewarm = warm.finish(bound_s=PREWARM_GRACE_S)
        return None if info is None else {**info, "bytecode_prewarm": prewarm}

    return pulled
