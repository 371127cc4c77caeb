"""Checks made before compiling, so a wrong NCCL or NVSHMEM fails in seconds, not after minutes of nvcc."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import BuildError


def parse_version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def nccl_source_version(src: Path) -> str:
    """NCCL version of a source tree, from `makefiles/version.mk` (NCCL_MAJOR/MINOR/PATCH)."""
    mk = Path(src) / "makefiles" / "version.mk"
    try:
        text = mk.read_text()
    except OSError as e:
        raise BuildError(f"{mk}: cannot read NCCL version: {e.strerror}") from None
    parts = [re.search(rf"^NCCL_{k}\s*:=\s*(\d+)", text, re.M) for k in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        raise BuildError(f"{mk}: NCCL_MAJOR/MINOR/PATCH not found")
    return ".".join(p.group(1) for p in parts)


def nccl_header_version(include_dir: Path) -> str:
    """NCCL version of a built/installed `nccl.h` (NCCL_MAJOR/MINOR/PATCH defines)."""
    h = Path(include_dir) / "nccl.h"
    try:
        text = h.read_text()
    except OSError as e:
        raise BuildError(f"{h}: cannot read: {e.strerror}") from None
    parts = [re.search(rf"#define\s+NCCL_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        raise BuildError(f"{h}: NCCL_MAJOR/MINOR/PATCH defines not found")
    return ".".join(p.group(1) for p in parts)


def check_floor(what: str, version: str, floor: str) -> None:
    """Raise BuildError when `version` < `floor` (both "X.Y.Z")."""
    if parse_version(version) < parse_version(floor):
        raise BuildError(
            f"{what} is NCCL {version}, DeepEP needs >= {floor} "
            f"(ncclCommQueryProperties / device API; 2.28.9 does not compile)"
        )


def check_nvshmem_root(root: str | None) -> Path:
    """An NVSHMEM root must have include/nvshmem.h, lib/libnvshmem_host.so*, lib/libnvshmem_device.a."""
    if not root:
        raise BuildError(
            "no NVSHMEM found: install the pinned nvidia-nvshmem-cu13 wheel next to torch or set EP_NVSHMEM_ROOT_DIR"
        )
    r = Path(root)
    missing = []
    if not (r / "include" / "nvshmem.h").is_file():
        missing.append("include/nvshmem.h")
    if not list((r / "lib").glob("libnvshmem_host.so*")):
        missing.append("lib/libnvshmem_host.so*")
    if not (r / "lib" / "libnvshmem_device.a").is_file():
        missing.append("lib/libnvshmem_device.a")
    if missing:
        raise BuildError(f"NVSHMEM root {r} lacks {', '.join(missing)}")
    return r
