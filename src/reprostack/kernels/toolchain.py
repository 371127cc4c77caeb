"""What a kernel build depends on besides sources: nvcc, the Python that holds torch, the GPU arch."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import BuildError

_PROBE = r"""
import json, os, sys, sysconfig
out = {"python": sys.executable, "python_version": sys.version.split()[0],
       "purelib": sysconfig.get_paths()["purelib"], "stdlib": sysconfig.get_paths()["stdlib"]}
try:
    import torch
    out.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
               torch_site=os.path.dirname(os.path.dirname(torch.__file__)))
except Exception as e:
    out["torch_error"] = f"{type(e).__name__}: {e}"
try:
    import nvidia.nvshmem as m
    out["nvshmem_root"] = list(m.__path__)[0]
except Exception:
    pass
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Toolchain:
    """Versions that go into the build key. arch: compute capability without dot, e.g. "90" (H200)."""

    python: str
    python_version: str
    torch: str
    torch_cuda: str | None
    torch_site: str
    nvcc: str
    nvcc_version: str
    cuda_home: str
    arch: str
    nvshmem_root: str | None
    stdlib: str | None = None  # the interpreter's stdlib folder (kernels.bytecode compiles it ahead)

    def key_fields(self) -> dict:
        d = asdict(self)
        for path_only in ("python", "nvcc", "cuda_home", "stdlib"):  # where a tool is is not what the binary depends on
            d.pop(path_only)
        return d


def cuda_home(nvcc: str) -> str:
    """$CUDA_HOME, else the toolkit folder above nvcc (holding include/cuda.h), else /usr/local/cuda."""
    if os.environ.get("CUDA_HOME"):
        return os.environ["CUDA_HOME"]
    guess = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    return guess if os.path.isfile(os.path.join(guess, "include", "cuda.h")) else "/usr/local/cuda"


def nvcc_version(nvcc: str) -> str:
    """`release X.Y` of `nvcc --version`. Raises BuildError when nvcc is missing or unreadable."""
    try:
        out = subprocess.run(
            [nvcc, "--version"], capture_output=True, text=True, errors="replace", timeout=60, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"nvcc at {nvcc!r} did not run: {e} (set CUDA_HOME or put nvcc on PATH)") from None
    m = re.search(r"release ([0-9]+\.[0-9]+)", out)
    if not m:
        raise BuildError(f"cannot read the release from `{nvcc} --version`: {out.strip()[:200]}")
    return m.group(1)


def gpu_arch(nvidia_smi: str = "nvidia-smi") -> str | None:
    """Compute capability of GPU 0 as "90", from `nvidia-smi --query-gpu=compute_cap`; None without GPU."""
    if os.environ.get("REPROSTACK_CUDA_ARCH"):
        return os.environ["REPROSTACK_CUDA_ARCH"].replace(".", "")
    if not shutil.which(nvidia_smi):
        return None
    try:
        out = subprocess.run(
            [nvidia_smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True, timeout=60
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0].replace(".", "") if out else None


PROBE_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONNOUSERSITE", "PYTHONSAFEPATH")
_PROBE_FIELDS = ("python", "python_version", "purelib", "stdlib", "torch", "torch_cuda", "torch_site", "nvshmem_root")
_PROBE_PATHS = ("python", "purelib", "stdlib", "torch_site", "nvshmem_root")  # a cached one must be absolute


def _stat(path: str | None) -> list[int] | None:
    try:
        st = os.stat(path) if path else None
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size] if st else None


def _probe_witness(python: str, probe: dict) -> dict:
    """What a cached probe of `python` stands on: the interpreter path as given and its file, the environment that
    moves sys.path, and the files that say torch's and nvshmem's versions (a reinstall changes their stat)."""
    site = probe.get("torch_site")
    return {
        "python": os.path.abspath(python),
        "python_file": _stat(os.path.realpath(python)),
        "env": {k: os.environ.get(k) for k in PROBE_ENV},
        "torch_version_py": _stat(os.path.join(site, "torch", "version.py")) if site else None,
        "nvshmem": _stat(probe.get("nvshmem_root")),
        "pyvenv": _stat(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(python))), "pyvenv.cfg")),
    }


def _cached_probe(python: str, cache: Path | None) -> tuple[dict | None, Path | None]:
    """(the probe stored for `python` when everything it stands on is unchanged, else None; the cache file).
    The file is untrusted (a shared cache): anything but the expected shape is ignored and probed again."""
    if cache is None:
        return None, None
    import hashlib

    f = Path(cache) / "toolchain" / (hashlib.sha256(os.path.abspath(python).encode()).hexdigest()[:32] + ".json")
    try:
        d = json.loads(_read_regular(f, 64 * 1024))
        probe = d["probe"]
        if (
            not isinstance(probe, dict)
            or set(probe) - set(_PROBE_FIELDS)
            or not all(isinstance(v, str) and v.isprintable() and len(v) <= 4096 for v in probe.values())
            or not all(os.path.isabs(probe[k]) for k in _PROBE_PATHS if k in probe)
            or "torch" not in probe
            or d.get("witness") != _probe_witness(python, probe)
        ):
            return None, f
        return probe, f
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None, f


def _read_regular(f: Path, limit: int) -> str:
    """The text of `f` when it is a regular file (not a symlink, FIFO or device: a shared disk's FIFO would block
    the read forever, /dev/zero would never end) of at most `limit` bytes; raises OSError or ValueError otherwise."""
    fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{f}: not a regular file")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{f}: over {limit} bytes")
    return data.decode()


def detect(python: str, *, arch: str | None = None, cache: Path | None = None) -> Toolchain:
    """Probe `python` (which must import torch), nvcc and the GPU arch.

    With `cache` (the reprostack cache root), the interpreter's probe (an import of torch: seconds) is kept in
    `<cache>/toolchain/` and reused while the interpreter, the environment that moves sys.path and the torch and
    nvshmem installs are unchanged (`_probe_witness`); nvcc and the arch are asked every time.
    Raises BuildError: torch not importable by `python`; no nvcc; no arch (no GPU and none given).
    """
    probe, cfile = _cached_probe(python, cache)
    if probe is None:
        # importing torch must not write bytecode into the image's site-packages: into the cache's prefix, or nowhere
        penv = dict(os.environ)
        if cache is not None:
            penv["PYTHONPYCACHEPREFIX"] = str(Path(cache) / "pycache")
        else:
            penv["PYTHONDONTWRITEBYTECODE"] = "1"
        try:
            probe = json.loads(
                subprocess.run(
                    [python, "-c", _PROBE], capture_output=True, text=True, timeout=300, check=True, env=penv
                ).stdout
            )
        except (OSError, subprocess.SubprocessError, json.JSONDecodeError) as e:
            raise BuildError(f"cannot probe {python}: {e}") from None
        if cfile is not None and "torch" in probe:
            from ..atomicfile import write_text_atomic

            keep = {k: v for k, v in probe.items() if k in _PROBE_FIELDS and isinstance(v, str)}
            try:
                cfile.parent.mkdir(parents=True, exist_ok=True)
                write_text_atomic(cfile, json.dumps({"probe": keep, "witness": _probe_witness(python, keep)}))
            except OSError:
                pass  # a read-only cache: probed again next time
    if "torch" not in probe:
        raise BuildError(
            f"{python} cannot import torch ({probe.get('torch_error')}); kernels are built "
            f"against the torch of the Python that will run them: pass --python (nox: set "
            f"REPROSTACK_TORCH_PYTHON) to the interpreter that holds torch"
        )
    toolkit = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    nvcc = shutil.which("nvcc") or os.path.join(toolkit, "bin", "nvcc")
    arch = arch or gpu_arch()
    if not arch:
        raise BuildError("no GPU found to take the CUDA arch from; pass --arch (e.g. 90) or set REPROSTACK_CUDA_ARCH")
    return Toolchain(
        python=python,
        python_version=probe["python_version"],
        torch=probe["torch"],
        torch_cuda=probe.get("torch_cuda"),
        torch_site=probe["torch_site"],
        nvcc=nvcc,
        nvcc_version=nvcc_version(nvcc),
        cuda_home=cuda_home(nvcc),
        arch=arch,
        nvshmem_root=probe.get("nvshmem_root"),
        stdlib=probe.get("stdlib"),
    )


def detect_nvcc(*, arch: str | None = None) -> Toolchain:
    """nvcc, its release, the toolkit folder and the GPU arch, without probing a Python: for builds that load no
    torch (kernels.nccltests, NCCL from source). Its Python fields are empty and enter no build key (build_nccl and
    build_nccl_tests key on nvcc_version and arch only). Raises BuildError: no nvcc; no arch (no GPU and none given)."""
    toolkit = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    nvcc = shutil.which("nvcc") or os.path.join(toolkit, "bin", "nvcc")
    arch = arch or gpu_arch()
    if not arch:
        raise BuildError("no GPU found to take the CUDA arch from; pass --arch (e.g. 90) or set REPROSTACK_CUDA_ARCH")
    return Toolchain(
        python="",
        python_version="",
        torch="",
        torch_cuda=None,
        torch_site="",
        nvcc=nvcc,
        nvcc_version=nvcc_version(nvcc),
        cuda_home=cuda_home(nvcc),
        arch=arch,
        nvshmem_root=None,
    )
