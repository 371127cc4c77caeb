"""A Docker engine for the tests: the one at $DOCKER_HOST when it answers, else a dockerd started here.

The dockerd is Debian's (`apt-get install -y docker.io`), rootful, on a unix socket in its own folder,
with no bridge and no iptables (containers get `network_mode="none"` anyway):

    dockerd --bridge=none --iptables=false --ip6tables=false --host=unix://DIR/docker.sock
            --data-root=DIR/data --exec-root=DIR/exec --pidfile=DIR/docker.pid [--storage-driver=vfs]

overlay2 is tried first; vfs only when dockerd cannot start with overlay2 (e.g. a data root on overlayfs).

Fixtures (import them into a test module): `docker_client` (session: a docker SDK client; skips with the
reason when no engine can run at all, fails instead when REPROSTACK_REQUIRE_DOCKER=1, as in CI) and
`test_base` (session: id of `reprostack-test/base:1`, the busybox image made by
reprostack.containers.testbase from Debian's busybox-static) and `debian_base` (session: id of
`reprostack-test/debian:12`, made by reprostack.containers.debianbase with debootstrap; the tests never make it
themselves, which needs Debian's mirror: the tests session's install step does, `python -m
reprostack.containers.debianbase`, else the tests that need it skip, or fail under REPROSTACK_REQUIRE_DOCKER=1).

Also a stdlib-only command for .ci/run (no venv needed):
    python3 tests/dockerd.py start /tmp/rsdocker   # prints `export DOCKER_HOST=unix:///tmp/rsdocker/docker.sock`
    python3 tests/dockerd.py stop /tmp/rsdocker
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REQUIRE_ENV = "REPROSTACK_REQUIRE_DOCKER"
START_TIMEOUT_S = 60.0


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self._path)
        self.sock = s


def ping(host: str | None, timeout: float = 3.0) -> bool:
    """True when the engine at `host` (unix:///path) answers GET /_ping with OK."""
    if not host or not host.startswith("unix://"):
        return False
    path = host[len("unix://") :]
    if not os.path.exists(path):
        return False
    try:
        c = _UnixHTTP(path, timeout)
        c.request("GET", "/_ping")
        r = c.getresponse()
        ok = r.status == 200 and r.read().strip() == b"OK"
        c.close()
        return ok
    except OSError:
        return False


class DockerdFailed(RuntimeError):
    pass


class Dockerd:
    """A dockerd started by us in `root`; `host` is its DOCKER_HOST; `stop()` ends it (by its pid only)."""

    def __init__(self, root: Path, proc: subprocess.Popen | None, driver: str, pid: int | None = None):
        self.root, self.proc, self.driver = root, proc, driver
        self.pid = proc.pid if proc else pid
        self.host = f"unix://{root}/docker.sock"
        self.log = root / "dockerd.log"

    def stop(self, timeout: float = 30.0) -> None:
        if not self.pid:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None:
                if self.proc.poll() is not None:
                    return
            elif not _alive(self.pid):
                return
            time.sleep(0.2)
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return True


def why_no_dockerd() -> str | None:
    """A reason dockerd cannot run here at all, or None."""
    if not shutil.which("dockerd"):
        return "dockerd not found (apt-get install -y docker.io)"
    if os.geteuid() != 0:
        return "dockerd needs root here (rootful engine) and this user is not root"
    return None


def start_dockerd(root: Path) -> Dockerd:
    """Start dockerd in `root` (socket, data, exec root, pid file, log) and wait until it answers.
    overlay2 (dockerd's default) first, then vfs. Raises DockerdFailed with the log's tail."""
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    errors = []
    for driver in (None, "vfs"):
        argv = [
            "dockerd",
            "--bridge=none",
            "--iptables=false",
            "--ip6tables=false",
            f"--host=unix://{root}/docker.sock",
            f"--data-root={root}/data",
            f"--exec-root={root}/exec",
            f"--pidfile={root}/docker.pid",
        ] + ([f"--storage-driver={driver}"] if driver else [])
        (root / "docker.sock").unlink(missing_ok=True)
        log = open(root / "dockerd.log", "ab")
        log.write(f"\n$ {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        log.close()
        d = Dockerd(root, proc, driver or "overlay2")
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if ping(d.host):
                return d
            time.sleep(0.3)
        d.stop()
        tail = (root / "dockerd.log").read_text(errors="replace").splitlines()[-15:]
        errors.append(f"with storage driver {driver or 'default (overlay2)'}: " + "\n".join(tail))
    raise DockerdFailed("dockerd did not start:\n" + "\n\n".join(errors))


# --------------------------------------------------------------------------- pytest fixtures

try:
    import pytest
except ImportError:  # the stdlib-only command below
    pytest = None

if pytest is not None:

    def _no_engine(reason: str):
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but no Docker engine: {reason}", pytrace=False)
        pytest.skip(f"no Docker engine: {reason}")

    @pytest.fixture(scope="session")
    def docker_client():
        """A docker SDK client on a live engine ($DOCKER_HOST, else a dockerd started for this session)."""
        import docker

        started = None
        host = os.environ.get("DOCKER_HOST")
        if not ping(host):
            why = why_no_dockerd()
            if why:
                _no_engine(f"DOCKER_HOST={host or '(unset)'} does not answer and {why}")
            root = Path(tempfile.mkdtemp(prefix="rsd-", dir="/tmp"))  # short: unix socket paths are <108 bytes
            try:
                started = start_dockerd(root)
            except DockerdFailed as e:
                shutil.rmtree(root, ignore_errors=True)
                _no_engine(str(e))
            host = started.host
        client = docker.DockerClient(base_url=host, timeout=600)
        old = os.environ.get("DOCKER_HOST")
        os.environ["DOCKER_HOST"] = host  # reprostack.containers.connect() finds the same engine
        try:
            yield client
        finally:
            client.close()
            if old is None:
                os.environ.pop("DOCKER_HOST", None)
            else:
                os.environ["DOCKER_HOST"] = old
            if started is not None:
                started.stop()
                shutil.rmtree(started.root, ignore_errors=True)

    @pytest.fixture(scope="session")
    def test_base(docker_client):
        """Id of the local busybox base image `reprostack-test/base:1` (imported once, reused after)."""
        from reprostack.containers.errors import ContainerError
        from reprostack.containers.testbase import ensure_test_base, find_busybox

        try:
            find_busybox()
        except ContainerError as e:
            _no_engine(f"cannot make the test base image: {e}")
        return ensure_test_base(docker_client)

    @pytest.fixture(scope="session")
    def debian_base(docker_client):
        """Id of `reprostack-test/debian:12` as made by the install step (never made here: no network in tests)."""
        import docker.errors

        from reprostack.containers.debianbase import DEBIAN_BASE, L_REQUEST, request_key

        try:
            img = docker_client.images.get(DEBIAN_BASE)
        except docker.errors.ImageNotFound:
            img = None
        if img is None or (img.labels or {}).get(L_REQUEST) != request_key():
            _no_engine(
                f"{DEBIAN_BASE} is not on the engine (or from another request): make it first with "
                f"`python -m reprostack.containers.debianbase` (root, debootstrap; nox -s tests does)"
            )
        return img.id


# --------------------------------------------------------------------------- command for .ci/run


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print("usage: dockerd.py start|stop DIR", file=sys.stderr)
        return 2
    root = Path(argv[1]).resolve()
    host = f"unix://{root}/docker.sock"
    if argv[0] == "stop":
        pidfile = root / "docker.pid"
        if pidfile.is_file():
            Dockerd(root, None, "", pid=int(pidfile.read_text().strip())).stop()
        return 0
    if not ping(host):
        why = why_no_dockerd()
        if why:
            print(f"dockerd.py: {why}", file=sys.stderr)
            return 1
        try:
            d = start_dockerd(root)
        except DockerdFailed as e:
            print(f"dockerd.py: {e}", file=sys.stderr)
            return 1
        print(f"# dockerd pid {d.pid}, storage driver {d.driver}, log {d.log}", file=sys.stderr)
    print(f"export DOCKER_HOST={host}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
