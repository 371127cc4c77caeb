"""Where reprostack keeps what is not in git: the source cache, build outputs, bundles, run outputs."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

CACHE_ENV = "REPROSTACK_CACHE"


def cache_dir() -> Path:
    """The content-addressed cache root: $REPROSTACK_CACHE, else the user cache dir (~/.cache/reprostack)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser().resolve() if env else Path(platformdirs.user_cache_dir("reprostack"))


def project_root(start: Path | None = None) -> Path:
    """The folder holding `upstreams.lock`, searched upwards from `start` (default: cwd)."""
    p = (start or Path.cwd()).resolve()
    for d in (p, *p.parents):
        if (d / "upstreams.lock").is_file():
            return d
    return p
