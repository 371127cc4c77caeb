"""sha256 of files and streams (1 MiB chunks), optionally copying what passes through."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

CHUNK = 1 << 20


def _bounded(src: BinaryIO, limit: int) -> Iterator[bytes]:
    """`src`'s chunks until more than `limit` bytes came (at most limit + 1 are read)."""
    n = 0
    while n <= limit and (chunk := src.read(min(CHUNK, limit - n + 1))):
        n += len(chunk)
        yield chunk


def sha256_stream(
    src: BinaryIO | Iterable[bytes], dst: BinaryIO | None = None, *, limit: int | None = None
) -> tuple[str, int]:
    """Hash a readable file object or an iterable of byte chunks, writing each chunk to `dst` when given.
    Returns (sha256 hex, bytes). With `limit` (a file object), reading stops once more than `limit` bytes came: a
    count over `limit` says the source is longer (an untrusted blob is never read to its end).
    Raises whatever reading or writing raises (OSError, tarfile.TarError...)."""
    if limit is not None:
        chunks: Iterable[bytes] = _bounded(src, limit)  # type: ignore[arg-type]
    else:
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
