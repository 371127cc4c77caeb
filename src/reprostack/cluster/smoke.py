"""The preflight's two-node EFA smoke (cluster.preflight, check `smoke`): node 0 serves `fi_pingpong -p efa -e rdm`
for each other node in turn, that node the client, through turn files on the shared out dir; the MB/s at the largest
size goes into the verdict.

Invariants: turn and result files are untrusted (a shared disk): read bounded (reprostack.jsonsrc, at most
MAX_TURN_BYTES); a turn counts only with the client's own nonce and an address fi_pingpong cannot read as an option
(ADDR); every fi_pingpong runs under a timeout; files are written atomically.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

from .. import jsonsrc
from ..atomicfile import write_text_atomic
from ..errors import ReprostackError
from . import nodecheck

SMOKE_PORT = 47592  # fi_pingpong's own default control port (fabtests)
SMOKE_TIMEOUT_S = 60.0
MAX_TURN_BYTES = 64 << 10
POLL_S = 0.25
ADDR = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]{0,253}")  # a host name or an IPv4/IPv6 address; never an option


class SmokeFileError(ReprostackError):
    """A turn or result file that cannot be read (it is waited for, or ignored; never raised out of here)."""


def command(port: int, addr: str | None = None) -> list[str]:
    """fi_pingpong over the EFA provider's reliable datagram endpoint: the server on node 0 (`addr` None), the
    client on the other node; `-B`/`-P` the control port; 100 iterations of its default sizes (64 B to 1 MiB in the
    substrate's libfabric v2.6.0, util/pingpong.c generate_test_sizes), so the figure is the MB/s at 1 MiB."""
    base = ["fi_pingpong", "-p", "efa", "-e", "rdm", "-I", "100"]
    return [*base, "-B", str(port)] if addr is None else [*base, "-P", str(port), addr]


def run_pairs(d: Path, facts: dict, rows: list, nodes: int, timeout_s: float) -> dict:
    """Node 0: `fi_pingpong -p efa` with each other node in turn (node 0 the server), when both passed the provider
    check; a `smoke` row per node (its bandwidth at the largest size, or the failure naming it). Returns
    {node: {"bytes", "mb_s", "server_rc", "client_rc"}} of the pairs that ran."""
    sd = d / "smoke"
    sd.mkdir(exist_ok=True)
    provider_ok = {r["node"] for r in rows if r["check"] == "provider" and r["status"] == "pass"}
    out: dict = {}
    for n in range(1, nodes):
        f = facts.get(n)
        if f is None:
            continue
        if not {0, n} <= provider_ok:
            rows.append(
                {
                    "check": "smoke",
                    "node": n,
                    "status": "fail",
                    "detail": "not run: libfabric's efa provider is not available on node 0 and this node",
                }
            )
            continue
        res = _pair(sd, n, f["nonce"], facts[0], timeout_s)
        out[str(n)] = res
        ok = res["server_rc"] == 0 and res["client_rc"] == 0 and res["mb_s"] is not None
        detail = (
            f"fi_pingpong -p efa node 0 <-> node {n}: {res['mb_s']} MB/s at {res['bytes']} B"
            if ok
            else f"fi_pingpong -p efa node 0 <-> node {n} failed: server exit {res['server_rc']}, client exit "
            f"{res['client_rc']}: {res['why']}"
        )
        rows.append({"check": "smoke", "node": n, "status": "pass" if ok else "fail", "detail": detail[:1000]})
    rows.append(
        {
            "check": "smoke",
            "node": 0,
            "status": "pass" if all(str(n) in out for n in range(1, nodes)) else "fail",
            "detail": "node 0 served every pair" if out else "no pair ran",
        }
    )
    return out


def _pair(sd: Path, n: int, nonce: str, me: dict, timeout_s: float) -> dict:
    """One pair: start the server, then write node n's turn; the server's table gives the bandwidth."""
    port = SMOKE_PORT
    log = sd / f"server-{n}.log"
    with open(log, "wb") as fh:
        try:
            srv = subprocess.Popen(command(port), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        except OSError as e:
            return {"bytes": None, "mb_s": None, "server_rc": None, "client_rc": None, "why": f"fi_pingpong: {e}"}
        time.sleep(0.2)
        write_text_atomic(
            sd / f"turn-{n}.json", json.dumps({"nonce": nonce, "addr": me.get("addr"), "port": port}) + "\n"
        )
        try:
            rc = srv.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()
            rc = None
    client = {}
    end = time.monotonic() + 5.0
    while time.monotonic() < end:
        try:
            client = jsonsrc.load(sd / f"node-{n}.json", SmokeFileError, max_bytes=MAX_TURN_BYTES)
            break
        except SmokeFileError:
            time.sleep(POLL_S)
    text = log.read_text(errors="replace")[: nodecheck.MAX_OUT]
    pp = nodecheck.pingpong(text)
    client_rc = client.get("rc") if isinstance(client, dict) and type(client.get("rc")) is int else None
    why = " ".join(str(client.get("first", "") if isinstance(client, dict) else "").split())[:300] or (
        "no answer from the client" if not client else ""
    )
    if rc is None:
        why = f"the server had no client within {timeout_s:g} s" + (f"; client: {why}" if why else "")
    return {
        "bytes": pp["bytes"],
        "mb_s": pp["mb_s"],
        "server_rc": rc,
        "client_rc": client_rc,
        "why": why or text.strip()[:300],
    }


def client_turn(d: Path, node: int, nonce: str) -> bool:
    """A node other than 0: when node 0 wrote this run's turn for it, run the fi_pingpong client once and leave its
    exit code and first line; True once done."""
    turn = d / "smoke" / f"turn-{node}.json"
    if not os.path.lexists(turn):
        return False
    try:
        t = jsonsrc.load(turn, SmokeFileError, max_bytes=4096)
    except SmokeFileError:
        return False
    if not isinstance(t, dict) or t.get("nonce") != nonce or not ADDR.fullmatch(str(t.get("addr"))):
        return False  # not this run's turn, or an address fi_pingpong could read as an option: never run
    port = t.get("port") if type(t.get("port")) is int and 0 < t.get("port") < 65536 else SMOKE_PORT
    rc, out = nodecheck.run_tool(command(port, t["addr"]), timeout=SMOKE_TIMEOUT_S)
    first = next((ln for ln in out.splitlines() if ln.strip()), "")
    pp = nodecheck.pingpong(out)
    write_text_atomic(
        d / "smoke" / f"node-{node}.json",
        json.dumps({"rc": rc, "first": first[:300], "mb_s": pp["mb_s"], "bytes": pp["bytes"]}) + "\n",
    )
    return True
