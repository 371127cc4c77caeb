"""pip as the resolver of wheel and wheelset pins: its `install --dry-run --report` and `download`, with an environment
that only the pin shapes (`reprostack lock wheels`: lock.wheels and lock.wheelset; fetch.wheels downloads with the
same environment).

Invariants:
- pip's config files are not read and PIP_FIND_LINKS, PIP_EXTRA_INDEX_URL, PIP_INDEX_URL, PIP_CONSTRAINT and
  PIP_NO_INDEX are removed from its environment (pip_env), so neither a local wheel folder nor a machine's
  constraints can shape a pin; cert and proxy variables still apply;
- nothing is installed: `install --dry-run` targets a scratch folder; a download goes to the folder given;
- a file pip names is a bare wheel filename (lock.wheel_filename_problem) before it is a path or a lock entry;
  any failure raises ReprostackError starting with `what` (the pin's FILE:LINE).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ..digest import sha256_file
from ..errors import ReprostackError
from .. import lock as lockmod  # the pin model's public face (lock.model, lock.pins)

_DROP_ENV = ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX", "PIP_CONSTRAINT", "PIP_INDEX_URL")


@dataclass(frozen=True)
class Resolved:
    """A pin as the index resolves it: its files (WheelFile; WheelsetFile for a wheelset pin)."""

    pin: str
    files: tuple


def pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    env["PIP_CONFIG_FILE"] = os.devnull  # a machine's pip.conf (extra indexes, constraints) never shapes a pin
    return env


def _run_pip(args: list[str], what: str, timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            [sys.executable, "-m", "pip", *args], capture_output=True, text=True, env=pip_env(), timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise ReprostackError(f"{what}: pip did not answer within {timeout:.0f}s") from None


def _tail(text: str, n: int = 8) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "\n  ".join(lines[-n:])


def pip_report(args: list[str], what: str, tmp: str, timeout: float, failed: str = "could not resolve") -> list[dict]:
    """The `install` list of pip's `install --dry-run --report -` for `args` (target options + requirements),
    installing nothing (`--target` a scratch folder under `tmp`). Raises ReprostackError `what: pip FAILED`."""
    cp = _run_pip(
        [
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            "-",
            "--target",
            str(Path(tmp, "target")),
            *args,
        ],
        what,
        timeout,
    )
    if cp.returncode != 0:
        raise ReprostackError(f"{what}: pip {failed} (exit {cp.returncode}):\n  {_tail(cp.stderr)}")
    try:
        return json.loads(cp.stdout)["install"]
    except (ValueError, KeyError, TypeError):
        raise ReprostackError(f"{what}: pip gave no installation report:\n  {_tail(cp.stdout + cp.stderr)}") from None


def report_wheel(item: dict, what: str) -> tuple[str, str, str, str | None]:
    """(canonical name, version, wheel filename, sha256 or None when the index gave none) of one entry of
    pip's report. Raises ReprostackError when the entry is not a wheel or its filename is not a bare wheel
    filename (a URL-quoted `/` or `..`)."""
    meta, info = item.get("metadata", {}), item.get("download_info", {})
    name, version = lockmod.canonical_name(meta.get("name", "")), str(meta.get("version", ""))
    url = info.get("url", "")
    filename = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
    if not filename.endswith(".whl"):
        raise ReprostackError(f"{what}: {name}=={version} resolves to {url!r}, not a wheel")
    problem = lockmod.wheel_filename_problem(filename)
    if problem:  # e.g. `..%2F..%2Fx.whl` in an index's URL: never a path we write to or a lock entry
        raise ReprostackError(f"{what}: {name}=={version} resolves to {url!r}: {problem}")
    return name, version, filename, ((info.get("archive_info") or {}).get("hashes") or {}).get("sha256")


def download_hash(target_args: list[str], req: str, filename: str, dest: Path, what: str, timeout: float) -> str:
    """sha256 of `filename`, downloaded with `pip download --no-deps` (for an index that gives no hashes)."""
    cp = _run_pip(["download", "--quiet", "--no-deps", "-d", str(dest), *target_args, req], what, timeout)
    if cp.returncode != 0:
        raise ReprostackError(f"{what}: pip download failed (exit {cp.returncode}):\n  {_tail(cp.stderr)}")
    f = dest / filename
    if not f.is_file():
        got = ", ".join(sorted(p.name for p in dest.iterdir())) if dest.is_dir() else "nothing"
        raise ReprostackError(f"{what}: pip download gave {got}, not {filename}")
    return sha256_file(f)
