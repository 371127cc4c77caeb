"""A real Docker registry for the tests: Debian's `docker-registry` (distribution 2.x) on 127.0.0.1, storage in tmp.

    apt-get install -y docker-registry      # /usr/bin/docker-registry; its own systemd unit is not used

`start_registry(root)` writes a config (filesystem storage under ROOT/data, `http.addr: 127.0.0.1:<free port>`,
no auth) and runs `docker-registry serve ROOT/config.yml` until `GET /v2/` answers; `stop()` ends that process
by its pid. dockerd treats 127.0.0.0/8 registries as insecure (plain HTTP) by default, so the test engine can
push to it without any configuration.

Fixture (import it into a test module): `registry` (session: a running Registry; skips with the reason when
the binary is missing, fails instead when REPROSTACK_REQUIRE_DOCKER=1, as in CI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from reprostack.launch.torchrun import free_port  # below the ephemeral range: no client is handed it meanwhile

BINARY = "docker-registry"
START_TIMEOUT_S = 30.0

CONFIG = """version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {data}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""


class RegistryFailed(RuntimeError):
    pass


class Registry:
    """A docker-registry started by us; `host` is `127.0.0.1:PORT` (the prefix of pushed repos)."""

    def __init__(self, root: Path, proc: subprocess.Popen, port: int):
        self.root, self.proc, self.port = root, proc, port
        self.host = f"127.0.0.1:{port}"
        self.log = root / "registry.log"

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)


def why_no_registry() -> str | None:
    if shutil.which(BINARY) is None:
        return f"`{BINARY}` not found (apt-get install -y docker-registry)"
    return None


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_registry(root: Path) -> Registry:
    """Start `docker-registry serve` on a free loopback port with storage under `root`."""
    root.mkdir(parents=True, exist_ok=True)
    last = ""
    for _ in range(3):  # the free port may be taken between probing and binding: try another
        port = free_port()
        cfg = root / "config.yml"
        cfg.write_text(CONFIG.format(data=root / "data", port=port))
        log = (root / "registry.log").open("ab")
        proc = subprocess.Popen(
            [shutil.which(BINARY), "serve", str(cfg)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "OTEL_TRACES_EXPORTER": "none"},
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if _answers(port):
                return Registry(root, proc, port)
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        last = (root / "registry.log").read_text(errors="replace")[-2000:]
    raise RegistryFailed(f"docker-registry did not answer on 127.0.0.1 within {START_TIMEOUT_S:.0f}s; log:\n{last}")


try:
    import pytest
except ImportError:
    pytest = None

if pytest is not None:

    @pytest.fixture(scope="session")
    def registry():
        def unavailable(reason: str):
            if os.environ.get("REPROSTACK_REQUIRE_DOCKER") == "1":
                pytest.fail(f"REPROSTACK_REQUIRE_DOCKER=1 but no local registry: {reason}", pytrace=False)
            pytest.skip(f"no local registry: {reason}")

        why = why_no_registry()
        if why:
            unavailable(why)
        root = Path(tempfile.mkdtemp(prefix="rsreg-"))
        try:
            reg = start_registry(root)
        except RegistryFailed as e:
            shutil.rmtree(root, ignore_errors=True)
            unavailable(str(e))
        try:
            yield reg
        finally:
            reg.stop()
            shutil.rmtree(root, ignore_errors=True)
