"""Small real shared libraries that look like NCCL to the one-NCCL check: built with g++ here, each holds the
string NCCL prints at init (`NCCL version X.Y.Z+cuda13.0`) and exports `ncclGetVersion`; and a Python site whose
`nvidia_nccl_cu13-X.Y.Z.dist-info/RECORD` lists its `nvidia/nccl/lib/libnccl.so.2`, as NVIDIA's wheel installs it."""

from __future__ import annotations

import subprocess
from pathlib import Path


def make_libnccl(folder: Path, version: str, name: str = "libnccl.so.2") -> Path:
    """`folder/name`: a shared library whose bytes say NCCL `version` and whose ncclGetVersion returns its code."""
    major, minor, patch = (int(x) for x in version.split("."))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / f".{name}.cc"
    src.write_text(
        'extern "C" {\n'
        f'const char reprostack_fake_nccl_version[] = "NCCL version {version}+cuda13.0";\n'
        f"int ncclGetVersion(int* v) {{ *v = {major * 10000 + minor * 100 + patch}; return 0; }}\n"
        "}\n"
    )
    out = folder / name
    subprocess.run(
        ["g++", "-shared", "-fPIC", "-O0", f"-Wl,-soname,{name}", "-o", str(out), str(src)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    src.unlink()
    return out


def make_wheel_site(site: Path, version: str, dist: str = "nvidia_nccl_cu13") -> Path:
    """A site-packages folder holding NVIDIA's NCCL wheel layout at `version`; returns its libnccl.so.2."""
    lib = make_libnccl(Path(site) / "nvidia" / "nccl" / "lib", version)
    info = Path(site) / f"{dist}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"nvidia/nccl/lib/libnccl.so.2,,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    return lib
