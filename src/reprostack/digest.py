"""sha256 of files and streams (1 MiB chunks), optionally copying what passes through."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import BinaryIO, Iterable

CHUNK = 1 << 20


def sha256_stream(src: BinaryIO | Iterable[bytes], dst: BinaryIO | None = None) -> tuple[str, int]:
    """Hash a readable file object or an iterable of byte chunks, writing each chunk to `dst` when given.
    Returns (sha256 hex, bytes). Raises whatever reading or writing raises (OSError, tarfile.TarError...)."""
    chunks = iter(lambda: src.read(CHUNK), b"") if hasattr(src, "read") else src
    h, n = hashlib.sha256(), 0
    for chunk in chunks:
        h.update(chunk)
        n += len(chunk)
        if dst is not None:
            dst.write(chunk)
    return h.hexdigest(), n


def sha256_file(path: str | Path) -> str:
    """sha256 hex of the file at `path`. Raises OSError when it cannot be read."""
    with open(path, "rb") as f:
        return sha256_stream(f)[0]
