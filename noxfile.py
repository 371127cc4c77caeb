"""nox sessions: thin wrappers over the `reprostack` CLI (each session parses posargs and calls one stage).

GPU sessions are not run by a bare `nox`; `all_gates` exits non-zero unless every required gate passed
(a skipped gate never passes). Offline nodes: set REPROSTACK_WHEELHOUSE to a folder of our pinned
wheels (see README) and pass `-- --offline --bundle FILE`.
"""

import json
import os
import sys
from pathlib import Path

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_venv = "yes"

# The interpreter that holds torch (the image's); kernels are built and run with it, never with nox's venv.
TORCH_PYTHON = os.environ.get("REPROSTACK_TORCH_PYTHON", sys.executable)


def _install(session: nox.Session, extra: str = "") -> None:
    target = f".{extra}" if extra else "."
    wheelhouse = os.environ.get("REPROSTACK_WHEELHOUSE")
    if wheelhouse:
        session.install("--no-index", "--find-links", wheelhouse, target)
    else:
        session.install(target)


@nox.session(tags=["ci"])
def tests(session: nox.Session) -> None:
    """CPU test suite (no GPU, no network)."""
    _install(session, "[test]")
    session.run("pytest", *session.posargs)


@nox.session
def lock(session: nox.Session) -> None:
    """Validate upstreams.lock (`-- --lock FILE`)."""
    _install(session)
    session.run("reprostack", "lock", "check", *session.posargs)


@nox.session
def fetch(session: nox.Session) -> None:
    """Fetch and verify pinned sources into the cache (`-- [PIN...] [--offline] [--bundle F] [--mirror U=P]`)."""
    _install(session)
    session.run("reprostack", "fetch", *session.posargs)


@nox.session
def patch(session: nox.Session) -> None:
    """Build and verify the patched trees (`-- [PIN...]`)."""
    _install(session)
    session.run("reprostack", "patch", *session.posargs)


@nox.session
def bundle(session: nox.Session) -> None:
    """Write fetched sources into one archive for offline nodes (`-- -o out/sources.tar [PIN...]`)."""
    _install(session)
    session.run("reprostack", "bundle", *session.posargs)


@nox.session
def build(session: nox.Session) -> None:
    """Build images from containers/ on the Docker engine at $DOCKER_HOST
    (`-- [IMAGE...] [--offline] [--test-base] [--base-override BASE=IMAGE]`); logs + images.json in out/build."""
    _install(session)
    session.run("reprostack", "build", *session.posargs)


def _out(posargs: list) -> str:
    return posargs[posargs.index("--out") + 1] if "--out" in posargs[:-1] else "out/gates"


@nox.session(default=False, tags=["gpu"])
def gate_micro(session: nox.Session) -> None:
    """Gate 1: sources -> NCCL + DeepEP kernels -> test_ep.py -> report. Without a GPU the gate is
    reported as SKIP (exit 3) and the session is marked skipped with the gate's reason — never passed."""
    _install(session)
    session.run("reprostack", "gate", "micro", "--python", TORCH_PYTHON, *session.posargs, success_codes=[0, 1, 3])
    summary = json.loads(Path(_out(session.posargs), "summary.json").read_text())
    rc = summary["exit_code"]
    reason = "; ".join(f"{g['gate']}: {g['reason']}" for g in summary["gates"])
    if rc == 3:
        session.skip(f"SKIP (not a pass): {reason}")
    if rc != 0:
        session.error(f"gate failed: {reason}")


@nox.session(default=False, tags=["gpu"])
def all_gates(session: nox.Session) -> None:
    """Every gate in dependency order, one combined report; non-zero unless all required gates passed."""
    _install(session)
    session.run("reprostack", "all-gates", "--python", TORCH_PYTHON, *session.posargs)
