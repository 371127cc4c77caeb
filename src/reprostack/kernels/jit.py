"""DeepEP's JIT kernels compiled before the test, all at once (issue 17: the cold gate_micro).

DeepEP V2 compiles each kernel at its first use (csrc/jit/compiler.hpp: nvcc, one after another; on the H200 the
10 kernels of profile h200-ep1 take 24.5 s in a row and 4.5 s at once, scripts/device/build_anatomy.sh). It finds a
compiled kernel by its folder `<EP_JIT_CACHE_DIR>/cache/kernel.<name>.<digest>` (kernel.cu + kernel.cubin), where
digest = DeepEP's get_hex_digest (csrc/utils/hash.hpp) of `<name>$$<signature>$$<flags>$$<code>`, signature =
`NVCC<release>` of the nvcc it runs and flags those compiler.hpp builds from the paths deep_ep was imported with.

A manifest (`kernels/jit/<profile>.json`, schema `schemas/deepep-jit.schema.json`) lists a profile's kernels as
(name, code), recorded from a real run's JIT cache (`record`; every gate run writes one, `micro/jit-kernels.json`).
`Context.of` works out, for one build and the test's environment, the nvcc, signature and flags DeepEP will use;
`prewarm` compiles each listed kernel that is not there yet, in parallel, into the folder DeepEP will look in.

Invariants:
- Correctness never rests on the manifest or on this replica of DeepEP's rules: a folder's name is the digest of
  the exact (name, signature, flags, code) it is compiled from, by the nvcc DeepEP runs, with DeepEP's command
  (`cd <cache>/tmp && nvcc kernel.cu -cubin -o kernel.cubin FLAGS`). A stale manifest or a wrong replica gives
  folders DeepEP never asks for: a miss costs the compile DeepEP would have done anyway, never a wrong kernel.
  `record` keeps only kernels whose folder name it reproduces, so what it writes hits on the same setup.
- A manifest is untrusted input: it must match the schema and each code must have the exact shape DeepEP generates
  (one `deep_ep/impls/<x>.cuh` include and one template instantiation with literal arguments, `CODE` below), its
  name must be a kernel DeepEP builds and match its code, and its include one of the known headers (`KERNELS`, read
  from DeepEP's source at the pinned rev); nothing else reaches nvcc. A bad manifest is one line naming the file and the field (ManifestError): duplicate
  keys, nesting too deep, a field the schema's `$` lets end in a newline are refused too.
- No prewarm when the test's environment (or the build's persisted deep_ep/envs.py) sets a variable that changes
  DeepEP's flags or cache layout (`FLAG_VARS`), or a path is not plain (DeepEP runs nvcc through /bin/sh): the
  reason is returned instead; so does an envs.py that is not a small regular file or names one of these variables in
  an assignment `persistent_envs['X'] = '...'` cannot read (other quotes, escapes: DeepEP's setup is unknown).
- The JIT cache is untrusted (a shared disk): prewarm writes only through `<cache dir>/cache` and `<cache dir>/tmp`
  opened as real folders (never a symlink), leaves a kernel path that is not a folder as it is, and turns every
  error (unwritable, full, hostile) into an entry of `failed`; record reads only regular kernel.cu files of at most
  MAX_CODE_BYTES, without blocking (a FIFO), never through a symlinked kernel folder.
- Never in place: each kernel is compiled in `<cache>/tmp/<unique>/` and renamed to its folder, as DeepEP does; a
  folder that exists (DeepEP or an earlier prewarm made it) is left as it is; a kernel nvcc refuses is left to
  DeepEP (its output tail is in the result).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .. import schemas
from ..errors import BuildError, ReprostackError

SCHEMA = "reprostack.deepep-jit/1"
MAX_MANIFEST_BYTES = 1 << 20
MAX_CODE_BYTES = 4096
MAX_ENVS_BYTES = 65536
NVCC_TIMEOUT_S = 600

# variables DeepEP's compiler reads that change its flags, its command or what a cache folder holds
FLAG_VARS = (
    "EP_JIT_CPP_STANDARD",
    "EP_JIT_DEBUG",
    "EP_JIT_PTXAS_VERBOSE",
    "EP_JIT_WITH_LINEINFO",
    "EP_GIN_GDAKI_DEBUG",
    "EP_NUM_TOPK_IDX_BITS",
    "EP_JIT_NVCC_COMPILER",
    "EP_JIT_DUMP_ASM",
    "EP_JIT_DUMP_PTX",
    "EP_JIT_DUMP_SASS",
)

_ARG = r"(?:-?[0-9]+|[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)"
# the shape of every code DeepEP's generators emit (csrc/kernels/elastic/*.hpp, LaunchRuntime::generate)
CODE = re.compile(
    r"// Includes' hash value: [0-9a-f]{32}\n"
    r"\n#include <deep_ep/impls/[a-z0-9_]{1,64}\.cuh>\n"
    r"\nusing namespace deep_ep::elastic;\n"
    r"\nstatic void __instantiate_kernel\(\) \{\n"
    rf"    auto ptr = reinterpret_cast<void\*>\(&[a-z0-9_]{{1,64}}_impl<{_ARG}(?:, {_ARG}){{0,40}}>\);\n"
    r"\}\n"
)
NAME = re.compile(r"[a-z0-9_]{1,64}")
# Every JIT kernel DeepEP V2 builds, from its source at the pinned rev b306af06 (csrc/kernels/elastic/*.hpp: each
# `jit::compiler->build(NAME, code)` and the include and instantiated function its generate_impl writes, with the
# number of template arguments of its format string; the patch series changes none of them): a manifest kernel's
# name must be one of these and its code must include that kernel's header and instantiate that function with that
# many arguments. A DeepEP bump that adds a kernel adds its line here (a manifest recorded from it is refused until).
KERNELS: dict[str, tuple[tuple[str, str, int], ...]] = {
    "barrier": (("barrier", "barrier_impl", 6),),
    "combine": (("combine", "combine_impl", 12), ("hybrid_combine", "hybrid_combine_impl", 13)),
    "combine_reduce_epilogue": (("combine_reduce_epilogue", "combine_reduce_epilogue_impl", 10),),
    "dispatch_deterministic_prologue": (
        ("dispatch_deterministic_prologue", "dispatch_deterministic_prologue_impl", 6),
    ),
    "dispatch": (("dispatch", "dispatch_impl", 15), ("hybrid_dispatch", "hybrid_dispatch_impl", 16)),
    "dispatch_copy_epilogue": (("dispatch_copy_epilogue", "dispatch_copy_epilogue_impl", 12),),
    "engram_fetch": (("engram_fetch", "engram_fetch_impl", 5),),
    "engram_fetch_wait": (("engram_fetch", "engram_fetch_wait_impl", 2),),
    "pp_send": (("pp_send_recv", "pp_send_impl", 4),),
    "pp_recv": (("pp_send_recv", "pp_recv_impl", 4),),
}
INCLUDES = frozenset(h for forms in KERNELS.values() for h, _, _ in forms)  # the known set of impls headers
_PARTS = re.compile(r"#include <deep_ep/impls/([a-z0-9_]+)\.cuh>.*&([a-z0-9_]+)<([^>]*)>", re.S)
FOLDER = re.compile(r"kernel\.([a-z0-9_]{1,64})\.([0-9a-f]{32})")
PLAIN_PATH = re.compile(r"/[A-Za-z0-9_./+@%=:,-]*")
_PERSISTED = re.compile(r"^persistent_envs\['([A-Z0-9_]+)'\] = '([^'\n\\]*)'$", re.M)
# the persisted variables Context.of reads (besides FLAG_VARS): one envs.py mentions but _PERSISTED cannot read
# (other quoting, escapes) makes DeepEP's setup unknown
_PATH_VARS = ("EP_NCCL_ROOT_DIR", "EP_JIT_CACHE_DIR", "CUDA_HOME", "CUDA_PATH", "PATH", "HOME")
# the manifest fields whose schema pattern ends in `$`: jsonschema's Python re lets `$` match before a final "\n"
_FIELDS = {
    "deepep_tree": re.compile(r"[0-9a-f]{40}"),
    "arch": re.compile(r"[0-9]{2,3}[af]"),
    "profile": re.compile(r"[A-Za-z0-9_.-]{1,64}"),
}


class ManifestError(ReprostackError):
    """A JIT manifest that is not one: its one line names the file and the field."""


def _read_regular(path: Path, limit: int) -> bytes:
    """The bytes of `path`, a regular file (not a symlink, FIFO, device or folder) of at most `limit` bytes, read
    without blocking on a swapped-in FIFO and without reading past the limit. Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a regular file")
        chunks, n = [], 0
        while n <= limit:
            b = os.read(fd, limit + 1 - n)
            if not b:
                break
            chunks.append(b)
            n += len(b)
    finally:
        os.close(fd)
    if n > limit:
        raise OSError(f"over {limit} bytes")
    return b"".join(chunks)


def _no_duplicates(pairs):
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"duplicate key {dup[:64]!r}")
    return d


def hex_digest(data: bytes) -> str:
    """DeepEP's get_hex_digest (csrc/utils/hash.hpp): two FNV-1a 64 states (two seeds), each through splitmix64."""

    def fnv1a(seed: int) -> int:
        h = seed
        for c in data:
            h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        return h

    def split_mix(z: int) -> int:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return z ^ (z >> 31)

    return f"{split_mix(fnv1a(0xC6A4A7935BD1E995)):016x}{split_mix(fnv1a(0x9E3779B97F4A7C15)):016x}"


def deepep_arch(arch: str, nvcc_release: str) -> str:
    """compiler.hpp's `sm_` suffix for compute capability `arch` ("90" -> "90a"; 10.x but 10.1 -> "100f" with
    nvcc >= 12.9, else "100a")."""
    major, minor = int(arch[:-1]), int(arch[-1])
    if major == 10 and minor != 1:
        rel = tuple(int(x) for x in nvcc_release.split("."))
        return "100f" if rel >= (12, 9) else "100a"
    return f"{major * 10 + minor}a"


@dataclass(frozen=True)
class Context:
    """What DeepEP's JIT will use in the test: its nvcc, signature, flags and cache folder."""

    nvcc: str
    signature: str
    flags: str
    cache_dir: Path
    arch: str

    def folder(self, name: str, code: str) -> Path:
        key = f"{name}$${self.signature}$${self.flags}$${code}".encode()
        return self.cache_dir / "cache" / f"kernel.{name}.{hex_digest(key)}"

    @staticmethod
    def of(site: Path, env: dict, arch: str) -> tuple[Context | None, str]:
        """(the context, "") for deep_ep installed in `site` run with `env` on a GPU of compute capability `arch`;
        (None, why) when DeepEP's flags cannot be known (a FLAG_VARS variable set, no NCCL root, a path that is not
        plain, nvcc missing)."""
        pkg = Path(os.path.abspath(Path(site) / "deep_ep"))
        if not (isinstance(arch, str) and re.fullmatch(r"[0-9]{2,3}", arch)):
            return None, f"GPU compute capability {arch!r} is not one like '90'"
        persisted: dict[str, str] = {}
        unread: set[str] = set()
        envs = pkg / "envs.py"
        if os.path.lexists(envs):
            try:
                text = _read_regular(envs, MAX_ENVS_BYTES).decode(errors="replace")
            except OSError as e:
                return None, f"cannot read {envs}: {e.strerror or e}"
            pairs = _PERSISTED.findall(text)
            persisted = dict(pairs)
            # each mention of a variable must be one assignment _PERSISTED reads (a later one it cannot read wins)
            unread = {
                k
                for k in (*FLAG_VARS, *_PATH_VARS)
                if len(re.findall(rf"\b{k}\b", text)) > [n for n, _ in pairs].count(k)
            }
        given = {k: v for k, v in env.items() if isinstance(v, str)}
        eff = {**persisted, **given}  # deep_ep: env wins
        unknown = sorted(k for k in unread if k in FLAG_VARS or k not in given)
        if unknown:
            return None, f"{envs} names {', '.join(unknown)} in a form other than persistent_envs['X'] = '...'"
        set_vars = [k for k in FLAG_VARS if eff.get(k)]
        if set_vars:
            return None, f"{', '.join(set_vars)} set: DeepEP's JIT flags differ from the default ones"
        nccl_root = eff.get("EP_NCCL_ROOT_DIR")
        if not nccl_root:
            return None, "no EP_NCCL_ROOT_DIR in the test's environment or deep_ep/envs.py"
        cuda_home = eff.get("CUDA_HOME") or eff.get("CUDA_PATH")
        if not cuda_home:  # deep_ep.find_cuda_home: `which nvcc`, else /usr/local/cuda
            found = shutil.which("nvcc", path=eff.get("PATH", os.defpath))
            cuda_home = os.path.dirname(os.path.dirname(found)) if found else "/usr/local/cuda"
        nvcc = os.path.join(cuda_home, "bin", "nvcc")
        cache_dir = eff.get("EP_JIT_CACHE_DIR") or os.path.join(eff.get("HOME", ""), ".deep_ep")
        for what, p in (("NCCL root", nccl_root), ("nvcc", nvcc), ("deep_ep", str(pkg)), ("JIT cache", cache_dir)):
            if not PLAIN_PATH.fullmatch(p) or {".", ".."} & set(p.split("/")):
                return None, f"{what} path {p!r} is not plain (DeepEP runs nvcc through /bin/sh)"
        from .toolchain import nvcc_version

        try:
            release = nvcc_version(nvcc)
        except BuildError as e:
            return None, str(e)
        sm = deepep_arch(arch, release)
        flags = (
            "-std=c++20 --diag-suppress=39,161,174,177,186,940,3012 --ptxas-options=--register-usage-level=10"
            f" -I {nccl_root}/include"
        )
        flags = (
            f"{flags} -I{pkg / 'include'} --gpu-architecture=sm_{sm} "
            "--compiler-options=-fPIC,-O3,-fconcepts,-Wno-deprecated-declarations,-Wno-abi "
            "-O3 --expt-relaxed-constexpr --expt-extended-lambda"
        )
        return Context(nvcc, f"NVCC{release}", flags, Path(cache_dir), sm), ""


@dataclass(frozen=True)
class Manifest:
    path: Path
    deepep_tree: str
    arch: str
    profile: str
    kernels: tuple[tuple[str, str], ...]  # (name, code)


def load_manifest(path: Path) -> Manifest:
    """Read and check a manifest. Raises ManifestError (one line: file, field, what is wrong)."""
    import jsonschema

    path = Path(path)
    try:
        if path.is_symlink() or not path.is_file():
            raise ManifestError(f"{path}: not a regular file")
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise ManifestError(f"{path}: over {MAX_MANIFEST_BYTES} bytes")
        raw = _read_regular(path, MAX_MANIFEST_BYTES)
    except OSError as e:
        raise ManifestError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError) as e:
        raise ManifestError(f"{path}: not JSON: {(str(e).splitlines() or [''])[0][:200]}") from None
    except RecursionError:
        raise ManifestError(f"{path}: not JSON: nested too deep") from None
    err = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(schemas.load("deepep-jit")).iter_errors(data)
    )
    if err is not None:
        where = "/".join(str(p) for p in err.absolute_path) or "(top)"
        raise ManifestError(f"{path}: {where}: {err.message[:200]}")
    for field, pattern in _FIELDS.items():
        if not pattern.fullmatch(data[field]):
            raise ManifestError(f"{path}: {field}: {data[field][:80]!r} does not match {pattern.pattern}")
    kernels = []
    for i, k in enumerate(data["kernels"]):
        if not NAME.fullmatch(k["name"]):
            raise ManifestError(f"{path}: kernels/{i}/name: {k['name'][:80]!r} does not match {NAME.pattern}")
        if not CODE.fullmatch(k["code"]):
            raise ManifestError(f"{path}: kernels/{i}/code: not the shape of a DeepEP JIT kernel (kernels.jit.CODE)")
        why = kernel_problem(k["name"], k["code"])
        if why:
            raise ManifestError(f"{path}: kernels/{i}: {why}")
        kernels.append((k["name"], k["code"]))
    return Manifest(path, data["deepep_tree"], data["arch"], data["profile"], tuple(kernels))


def kernel_problem(name: str, code: str) -> str | None:
    """Why (name, code) is not a kernel DeepEP builds (KERNELS: the name, the header it includes, the function it
    instantiates and its number of template arguments), or None. `code` has CODE's shape already."""
    forms = KERNELS.get(name)
    if forms is None:
        return f"name {name[:80]!r} is not a JIT kernel DeepEP builds (known: {', '.join(sorted(KERNELS))})"
    m = _PARTS.search(code)
    header, func, args = m.group(1), m.group(2), len(m.group(3).split(", "))
    if header not in INCLUDES:
        return f"code includes deep_ep/impls/{header}.cuh, not one of the known headers ({', '.join(sorted(INCLUDES))})"
    for h, f, n in forms:
        if (header, func) == (h, f):
            return None if args == n else f"code instantiates {func} with {args} template argument(s), DeepEP's has {n}"
    want = " or ".join(f"deep_ep/impls/{h}.cuh and {f}" for h, f, _ in forms)
    return f"name {name!r} does not match its code ({header}.cuh, {func}): kernel {name!r} is {want}"


def manifest_for(root: Path, profile: str) -> Manifest | None:
    """`kernels/jit/<profile>.json` of the project at `root`, checked; None when there is none."""
    d = Path(root) / "kernels" / "jit"
    p = d / f"{profile}.json"
    if not _FIELDS["profile"].fullmatch(profile):  # a gate spec's profile names are not checked: no path outside
        raise ManifestError(
            f"{d}: profile name {profile[:80]!r} cannot name a manifest (not {_FIELDS['profile'].pattern})"
        )
    if not os.path.lexists(p):
        return None
    m = load_manifest(p)
    if m.profile != profile:
        raise ManifestError(f"{p}: profile: {m.profile!r} is not this file's profile {profile!r}")
    return m


def kernel_code(folder: Path) -> str | None:
    """The kernel.cu of the kernel folder `folder` (a regular file of at most MAX_CODE_BYTES, UTF-8, read without
    blocking and never through a symlinked folder), or None."""
    try:
        if Path(folder).is_symlink():
            return None
        return _read_regular(Path(folder) / "kernel.cu", MAX_CODE_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def present(ctx: Context) -> set[str]:
    """The kernel folders in the context's cache (names only); none when `cache` is a symlink or not a folder."""
    try:
        fd = os.open(ctx.cache_dir / "cache", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return set()
    try:
        with os.scandir(fd) as it:
            return {e.name for e in it if FOLDER.fullmatch(e.name)}
    except OSError:
        return set()
    finally:
        os.close(fd)


def _subdir(ctx: Context, sub: str) -> int:
    """An fd of the cache's folder `sub` (cache or tmp), made when missing; OSError when it is a symlink or not a
    folder (the cache is on a shared disk: nothing is written through a link into somewhere else)."""
    p = ctx.cache_dir / sub
    try:
        p.mkdir(parents=True)
    except FileExistsError:
        pass
    try:
        return os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise OSError(e.errno, f"{p} is a symlink or not a folder") from None
        raise


def _compile(ctx: Context, name: str, code: str, env: dict) -> tuple[str, str]:
    """Compile one kernel into its folder; (status, detail): compiled | present | failed."""
    try:
        return _compile_in(ctx, name, code, env)
    except OSError as e:  # an unwritable, full or hostile cache: the kernel is left to DeepEP
        return "failed", f"{name}: {e.strerror or e}{': ' + str(e.filename) if e.filename else ''}"[:400]


def _compile_in(ctx: Context, name: str, code: str, env: dict) -> tuple[str, str]:
    final = ctx.folder(name, code)
    cache_fd = _subdir(ctx, "cache")
    try:
        try:
            st = os.stat(final.name, dir_fd=cache_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None:
            if stat.S_ISDIR(st.st_mode):
                return "present", ""
            return "failed", f"{name}: {final} is not a folder (left as it is)"[:400]
        tmp_fd = _subdir(ctx, "tmp")
        try:
            return _compile_tmp(ctx, name, code, env, final, cache_fd, tmp_fd)
        finally:
            os.close(tmp_fd)
    finally:
        os.close(cache_fd)


def _compile_tmp(ctx, name, code, env, final, cache_fd, tmp_fd) -> tuple[str, str]:
    tmp_root = ctx.cache_dir / "tmp"
    unique = f"reprostack-{os.getpid()}-{uuid.uuid4().hex}"
    os.mkdir(unique, 0o755, dir_fd=tmp_fd)
    tmp = tmp_root / unique
    try:
        fd = os.open(f"{unique}/kernel.cu", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=tmp_fd)
        with os.fdopen(fd, "wb") as f:
            f.write(code.encode())
        argv = [ctx.nvcc, str(tmp / "kernel.cu"), "-cubin", "-o", str(tmp / "kernel.cubin"), *shlex.split(ctx.flags)]
        try:
            p = subprocess.run(
                argv,
                cwd=tmp_root,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=NVCC_TIMEOUT_S,
            )
        except (OSError, subprocess.SubprocessError) as e:
            return "failed", f"{name}: {e}"[:400]
        if p.returncode != 0 or not (tmp / "kernel.cubin").is_file():
            tail = " | ".join((p.stdout + p.stderr).strip().splitlines()[-3:])
            return "failed", f"{name}: nvcc exit {p.returncode}: {tail}"[:400]
        for f in ("kernel.cu", "kernel.cubin"):
            fd = os.open(f"{unique}/{f}", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=tmp_fd)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        try:  # through the folders' fds: a `cache` or `tmp` swapped for a symlink meanwhile is not followed
            os.rename(unique, final.name, src_dir_fd=tmp_fd, dst_dir_fd=cache_fd)
        except OSError:  # DeepEP (another rank) made it meanwhile: theirs stays
            return "present", ""
        return "compiled", ""
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def prewarm(ctx: Context, kernels, env: dict, *, jobs: int | None = None) -> dict:
    """Compile the (name, code) `kernels` missing from the context's cache, at most `jobs` at once. Returns
    {"kernels", "compiled", "present", "failed": [...], "seconds"}; never raises for a kernel that fails."""
    t0 = time.monotonic()
    kernels = list(dict.fromkeys(kernels))
    jobs = max(1, min(jobs or len(os.sched_getaffinity(0)), len(kernels) or 1))
    with ThreadPoolExecutor(jobs) as ex:
        results = list(ex.map(lambda k: _compile(ctx, k[0], k[1], env), kernels))
    return {
        "kernels": len(kernels),
        "compiled": sum(s == "compiled" for s, _ in results),
        "present": sum(s == "present" for s, _ in results),
        "failed": [d for s, d in results if s == "failed"],
        "seconds": round(time.monotonic() - t0, 2),
    }


def record(ctx: Context, *, deepep_tree: str, profile: str, source: str) -> tuple[dict, dict]:
    """(manifest, counts) of the kernels in the context's cache: each folder whose kernel.cu has DeepEP's shape and
    whose name this context reproduces; counts says how many folders were left out and why."""
    kept, counts = [], {"folders": 0, "kept": 0, "not_reproduced": 0, "unreadable": 0, "other_shape": 0}
    for name in sorted(present(ctx)):
        counts["folders"] += 1
        kname = FOLDER.fullmatch(name).group(1)
        code = kernel_code(ctx.cache_dir / "cache" / name)
        if code is None:
            counts["unreadable"] += 1
            continue
        if not CODE.fullmatch(code) or kernel_problem(kname, code):
            counts["other_shape"] += 1
        elif ctx.folder(kname, code).name != name:
            counts["not_reproduced"] += 1
        else:
            kept.append({"name": kname, "code": code})
    counts["kept"] = len(kept)
    manifest = {
        "schema": SCHEMA,
        "deepep_tree": deepep_tree,
        "arch": ctx.arch,
        "profile": profile,
        "recorded_from": source[:300],
        "kernels": sorted(kept, key=lambda k: (k["name"], k["code"])),
    }
    return manifest, counts
