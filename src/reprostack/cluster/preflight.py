"""Cross-node preflight: before any gate runs on N nodes, every node proves it runs the same thing on the hardware
the profile needs (issue 15 item 3; contract: `reprostack preflight GATE --out DIR --nodes N --node-rank R
[--profile P]`). The Slurm script and the Kubernetes manifests run it as their first step (`command()`).

Each node writes its facts to DIR/preflight/node-R.json: the lock's sha256, the image it runs in (in a container:
`$REPROSTACK_IMAGE`, the image by digest the launcher put there), the GPU count (nvidia-smi), the EFA devices
under /dev/infiniband (`uverbs*`), whether libfabric selects the `efa` provider (`fi_info -p efa` and
`$FI_PROVIDER`), its UTC clock and whether the rendezvous port is free. Node 0 waits (at most `--timeout` s) for
every node's facts, compares them with its own and with the gate's launch plan (reprostack.gates.plan: GPUs and
EFA devices per node, lock sha256) and writes DIR/preflight/verdict.json; the other nodes wait for that verdict.
Every node exits 0 on pass and 2 on failure, with one line naming the node(s) and the check(s).

Checks: arrival (every node's facts within the timeout), facts (a readable, valid facts file), lock, image,
gpus, efa, provider, clock (|node 0's clock at reading - the node's clock| <= CLOCK_TOLERANCE_S; the other nodes
rewrite their facts every HEARTBEAT_S while they wait, so a file is never older than that), port (node 0's
rendezvous port: nothing listens there yet); then what fails real p5en runs, read per node by cluster.nodecheck
(judged by cluster.nodejudge)
(issue 25 item 5): driver (the driver's CUDA, nvidia-smi, >= the image's, nvcc / $CUDA_VERSION), fabricmanager
(every GPU's Fabric State Completed / Status Success, nvidia-smi -q), nvlink (no inactive link, nvidia-smi nvlink
-s), efa-devices (the EFA devices `fi_info -p efa` lists >= the profile's, 16 on p5en), efa-hmem (`fi_info -p efa
-c FI_HMEM` lists the efa provider: libfabric serves GPU memory; off, EFA silently loses GPUDirect RDMA and GIN),
efa-module (/sys/module/efa/version), gdrdrv (loaded, /dev/gdrdrv opens read-write in the container as libgdrapi
opens it, /sys/module/gdrdrv/version >= the image's libgdrapi.so.MAJOR.MINOR, and >= 2.5 when the gate runs GIN:
the host/container skew users hit as CUDA error 719 or a GIN init failure),
memlock (`ulimit -l` unlimited), hugepages (configured ones not all taken), ecc (no volatile DRAM uncorrectable
error, no page retirement or row remap pending or failed), xid (no `NVRM: Xid` line in the kernel log; `unreadable`
where the log cannot be read, said so in the pass line), pcie (every GPU's link at its max width), smoke (node 0
runs `fi_pingpong -p efa -e rdm` as the server for each other node in turn, that node the client: its MB/s at the
largest size goes into the verdict and the pass line, a failure names the node). A check the profile does not need
(a CPU profile: no GPU; a profile without EFA: no EFA devices, no provider; one GPU per node: no fabric manager, no
NVLink) is recorded `not-needed`, never failed and never passed silently.

Invariants:
- facts files and the verdict are untrusted input (a shared disk): read bounded (reprostack.jsonsrc, at most
  MAX_FACTS_BYTES), schema-validated (schemas/preflight-node.schema.json); a bad facts file fails the preflight
  naming the file and the node (check `facts`), never a traceback;
- a stale verdict or facts file of an earlier run is never taken: node 0 removes the earlier ones when it starts,
  and a verdict counts for a node when it lists that node's nonce (random per run), or when it is a failure
  written after the node started (node 0 judged without that node's facts: missing or unreadable);
- the libfabric provider is `efa` or the check fails: never a silent fallback to sockets/tcp;
- files are written atomically (reprostack.atomicfile); nothing outside DIR/preflight is written; preflight runs
  nothing of the gate; the only programs it starts are the read-only tools of cluster.nodecheck and fi_pingpong
  (cluster.smoke), each under a timeout; a smoke turn file counts only with the worker's own nonce.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import time
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from .. import hostinfo, jsonsrc, schemas
from . import nodecheck
from . import smoke as smoke_
from .smoke import ADDR, SMOKE_PORT, SMOKE_TIMEOUT_S  # noqa: F401 (re-exported)
from .nodejudge import GIN_GDRDRV_FLOOR, NODE_CHECKS, NOT_NEEDED, UNREADABLE, judge_node, needs_gin  # noqa: F401
from ..atomicfile import write_text_atomic
from ..errors import ReprostackError

if TYPE_CHECKING:
    from ..gates.spec import HardwareProfile

SCHEMA, VERDICT_SCHEMA = "reprostack.preflight.node/1", "reprostack.preflight.verdict/1"
DEV_DIR = "/dev/infiniband"
MAX_FACTS_BYTES = 64 << 10
MAX_VERDICT_BYTES = 16 << 20
CLOCK_TOLERANCE_S = 5.0
HEARTBEAT_S = 1.0
POLL_S = 0.25
TIMEOUT_S = 300.0
CHECKS = {  # every check, in report order, with what it checks (`preflight --help` prints these)
    "arrival": "every node wrote its facts in time",
    "facts": "each node's facts file valid",
    "lock": "one upstreams.lock (sha256) on every node",
    "image": "one image (digest) on every node",
    "gpus": "the profile's GPUs per node",
    "efa": "the profile's EFA devices per node",
    "provider": "`fi_info -p efa` selects efa",
    "clock": f"clocks within {CLOCK_TOLERANCE_S:g} s",
    "port": "the rendezvous port free on node 0",
    **NODE_CHECKS,
    "smoke": "a two-node fi_pingpong over EFA",
}
MAX_WAIT_S = 3600.0  # --timeout / --smoke-timeout: an hour at most (a NaN or a year never reaches a wait)


class PreflightError(ReprostackError):
    """The preflight failed (a check, a bad facts file, no verdict in time): one line naming node and check."""


def command(
    gate: str,
    nodes: int,
    *,
    profile: str,
    out: str = "/out",
    node_rank: str = "${NODE_RANK}",
    lock: str | None = None,
    python: str = "python3",
) -> list[str]:
    """The preflight's argv for a launcher (node rank as a shell variable the launcher expands)."""
    argv = [
        python,
        "-m",
        "reprostack",
        "preflight",
        gate,
        "--out",
        out,
        "--nodes",
        str(nodes),
        "--node-rank",
        node_rank,
        "--profile",
        profile,
    ]
    return argv + (["--lock", lock] if lock else [])


@lru_cache(maxsize=1)
def _schema() -> dict:
    return schemas.load("preflight-node")


def _fi_info() -> tuple[bool, str]:
    """(efa selected, detail) from `fi_info -p efa` (exit 0 and a `provider: efa` line)."""
    try:
        p = subprocess.run(
            ["fi_info", "-p", "efa"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        return False, "fi_info not found (libfabric's tools are not on PATH)"
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"fi_info -p efa: {e}"[:900]
    out = (p.stdout + p.stderr).strip()
    if p.returncode == 0 and re.search(r"^\s*provider:\s*efa\s*$", p.stdout, re.M):
        return True, "fi_info -p efa: provider efa"
    first = out.splitlines()[0][:300] if out else "no output"
    return False, f"fi_info -p efa: exit {p.returncode}: {first}"


def _port(port: int) -> tuple[bool, str]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is free; a listener is not
        s.bind(("0.0.0.0", port))
        return True, ""
    except OSError as e:
        return False, f"port {port}: {e.strerror or e}"
    finally:
        s.close()


def _addr() -> str | None:
    """The address the other nodes reach this node at: $MASTER_ADDR (the launcher's, node 0's), else the host name's;
    None when neither is a plain host name or address."""
    a = os.environ.get("MASTER_ADDR")
    if not a:
        try:
            a = socket.gethostbyname(socket.gethostname())
        except OSError:
            return None
    return a if ADDR.fullmatch(a) else None


def collect(
    *,
    gate: str,
    profile: str,
    nodes: int,
    node: int,
    lock_sha256: str,
    port: int,
    nonce: str,
    dev_dir: str = DEV_DIR,
    need_provider: bool = True,
    need_gpu: bool = True,
) -> dict:
    """This node's facts (schemas/preflight-node.schema.json)."""
    gpus, notes = hostinfo.gpus()
    try:
        devices = sorted(
            (p.name for p in Path(dev_dir).glob("uverbs*") if re.fullmatch(r"uverbs\d{1,4}", p.name)),
            key=lambda n: int(n[6:]),
        )
    except OSError:
        devices = []
    efa, detail = _fi_info() if need_provider else (False, "not asked (the profile needs no EFA)")
    checks = nodecheck.collect(need_gpu=need_gpu, need_efa=need_provider)
    free, why = _port(port)
    in_container = (
        any(Path(p).exists() for p in ("/.dockerenv", "/run/.containerenv")) or "KUBERNETES_SERVICE_HOST" in os.environ
    )
    return {
        "schema": SCHEMA,
        "gate": gate,
        "profile": profile,
        "nodes": nodes,
        "node": node,
        "nonce": nonce,
        "hostname": socket.gethostname()[:255],
        "lock_sha256": lock_sha256,
        "image": {"in_container": in_container, "ref": (os.environ.get("REPROSTACK_IMAGE") or None)},
        "gpus": {"count": len(gpus), "note": "; ".join(notes)[:1000] or None},
        "efa": {"devices": devices},
        "provider": {"efa": efa, "fi_provider_env": os.environ.get("FI_PROVIDER"), "detail": detail[:1000]},
        "clock_utc": time.time(),
        "port": {"number": port, "free": free, "detail": why},
        "addr": _addr(),
        "node_checks": checks,
    }


def read_facts(path: Path, *, gate: str, nodes: int, node: int) -> dict:
    """Node `node`'s facts file, bounded and validated; PreflightError naming the file on anything else."""
    import jsonschema

    data = jsonsrc.load(path, PreflightError, max_bytes=MAX_FACTS_BYTES)
    err = next(iter(jsonschema.Draft202012Validator(_schema()).iter_errors(data)), None)
    if err is not None:
        where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        raise PreflightError(f"{path}: {where}: {err.message[:200]}")
    for key, want in (("node", node), ("nodes", nodes), ("gate", gate)):
        if data[key] != want:
            raise PreflightError(f"{path}: {key} is {data[key]!r}, expected {want!r}")
    return data


def _identity(row, n: int, f: dict, refs: dict, lock_sha256: str) -> None:
    """Node `n`'s lock and image rows: the lock's sha256 and the image's digest are node 0's."""
    row(
        "lock",
        n,
        f["lock_sha256"] == lock_sha256,
        ""
        if f["lock_sha256"] == lock_sha256
        else f"lock sha256 {f['lock_sha256'][:12]} differs from node 0's {lock_sha256[:12]}",
    )
    if not any(refs.values()):
        row("image", n, NOT_NEEDED, "no node runs in an image that names its digest ($REPROSTACK_IMAGE)")
    else:
        row(
            "image",
            n,
            refs[n] == refs.get(0),
            ""
            if refs[n] == refs.get(0)
            else f"image {refs[n] or 'unknown'} differs from node 0's {refs.get(0) or 'unknown'}",
        )


def _devices(row, n: int, f: dict, *, need_gpu: bool, gpus_per_node: int, efa_devices: int) -> None:
    """Node `n`'s gpus, efa and provider rows: the profile's GPUs, its EFA devices and libfabric's efa provider."""
    count = f["gpus"]["count"]
    if need_gpu:
        row(
            "gpus",
            n,
            count == gpus_per_node,
            ""
            if count == gpus_per_node
            else f"{count} GPU(s), the profile needs {gpus_per_node}"
            + (f" ({f['gpus']['note']})" if f["gpus"]["note"] else ""),
        )
    else:
        row("gpus", n, NOT_NEEDED, f"the profile needs no GPU ({count} seen)")
    devs = len(f["efa"]["devices"])
    if not efa_devices:
        row("efa", n, NOT_NEEDED, "the profile needs no EFA")
        row("provider", n, NOT_NEEDED, "the profile needs no EFA")
        return
    row(
        "efa",
        n,
        devs >= efa_devices,
        "" if devs >= efa_devices else f"{devs} EFA device(s) under {DEV_DIR}, the profile needs {efa_devices}",
    )
    env = f["provider"]["fi_provider_env"]
    ok = f["provider"]["efa"] and env in (None, "efa")
    row(
        "provider",
        n,
        ok,
        ""
        if ok
        else (
            f"FI_PROVIDER={env}: libfabric would not use efa" if env not in (None, "efa") else f["provider"]["detail"]
        ),
    )


def judge(
    facts: dict[int, dict],
    *,
    nodes: int,
    gpus_per_node: int,
    need_gpu: bool,
    efa_devices: int,
    lock_sha256: str,
    skew: dict[int, float],
    need_gin: bool = False,
) -> list[dict]:
    """Every check of every node: [{check, node, status: pass|fail|not-needed|unreadable, detail}] (pure); the
    node checks (judge_node) after the identity ones."""
    rows = []

    def row(check, node, ok, detail=""):
        rows.append(
            {
                "check": check,
                "node": node,
                "status": ok if isinstance(ok, str) else ("pass" if ok else "fail"),
                "detail": detail[:1000],
            }
        )

    refs = {n: f["image"]["ref"] for n, f in facts.items()}
    for n in sorted(facts):
        f = facts[n]
        _identity(row, n, f, refs, lock_sha256)
        _devices(row, n, f, need_gpu=need_gpu, gpus_per_node=gpus_per_node, efa_devices=efa_devices)
        if n in skew:
            ok = abs(skew[n]) <= CLOCK_TOLERANCE_S
            row(
                "clock",
                n,
                ok,
                "" if ok else f"clock {skew[n]:+.1f} s from node 0's (tolerance {CLOCK_TOLERANCE_S:g} s)",
            )
        if n == 0:
            row("port", 0, f["port"]["free"], f["port"].get("detail", ""))
        judge_node(
            f["node_checks"],
            n,
            row,
            need_gpu=need_gpu,
            gpus_per_node=gpus_per_node,
            efa_devices=efa_devices,
            need_gin=need_gin,
        )
    return rows


def _verdict_path(d: Path) -> Path:
    return d / "verdict.json"


def _summary(rows: list[dict]) -> str:
    bad = [r for r in rows if r["status"] == "fail"]
    return "; ".join(f"node {r['node']}: {r['check']}: {r['detail']}" for r in bad)


def _check_args(nodes: int, node_rank: int, timeout_s: float, smoke_timeout_s: float) -> None:
    """The counts and waits before any work: an absurd count never starts a wait or a list of that size."""
    from ..gates.options import MAX_NODES

    if not 1 <= nodes <= MAX_NODES:  # before any work: an absurd count never starts a wait or a list of that size
        raise PreflightError(f"preflight: --nodes {nodes}: not in 1..{MAX_NODES}")
    if not 0 <= node_rank < nodes:
        raise PreflightError(f"preflight: --node-rank {node_rank} is not in 0..{nodes - 1} (--nodes {nodes})")
    for flag, s_ in (("--timeout", timeout_s), ("--smoke-timeout", smoke_timeout_s)):
        if not 0 < s_ <= MAX_WAIT_S:  # NaN fails this too
            raise PreflightError(f"preflight: {flag} {s_!r} is not a number of seconds in (0, {MAX_WAIT_S:g}]")


def run(
    g,
    root: Path,
    lock,
    *,
    out: Path,
    nodes: int,
    node_rank: int,
    profile: str | None = None,
    timeout_s: float = TIMEOUT_S,
    port: int | None = None,
    smoke_timeout_s: float = SMOKE_TIMEOUT_S,
) -> int:
    """This node's preflight (module docstring). Returns 0 on pass; raises PreflightError on failure."""
    from ..gates.plan import MASTER_PORT, gate_plan
    from ..launch import plan as lp

    _check_args(nodes, node_rank, timeout_s, smoke_timeout_s)
    plan = gate_plan(g, root, lock, profile=profile, out_dir=Path(out), mode=lp.MODE_HOST)
    prof: HardwareProfile = g.load(root).profile(plan.profile)
    need_gpu = prof.needs_gpu and plan.gpus_per_node > 0
    port = port or MASTER_PORT
    d = Path(out) / "preflight"
    d.mkdir(parents=True, exist_ok=True)
    nonce = secrets.token_hex(16)

    mine = collect(
        gate=plan.gate,
        profile=plan.profile,
        nodes=nodes,
        node=node_rank,
        lock_sha256=lock.sha256,
        port=port,
        nonce=nonce,
        need_provider=bool(plan.efa_devices_per_node),
        need_gpu=need_gpu,
    )

    def facts_now():  # the facts are taken once; the heartbeat refreshes the clock only
        return {**mine, "clock_utc": time.time()}

    if node_rank != 0:
        smoke_s = smoke_timeout_s * (nodes - 1) if plan.efa_devices_per_node else 0.0  # node 0 smokes node by node
        return _wait_verdict(d, node_rank, nonce, facts_now, timeout_s + smoke_s)
    return _lead(d, plan, lock, mine, nodes=nodes, need_gpu=need_gpu, timeout_s=timeout_s, smoke_s=smoke_timeout_s)


def _gather(d: Path, gate: str, nodes: int, timeout_s: float, rows: list[dict]) -> tuple[dict, dict]:
    """Node 0 reads the other nodes' facts as they arrive, until all are there or `timeout_s` has passed: ({node:
    facts, or None when unreadable}, {node: clock skew}); a bad facts file and a node that wrote none are rows."""
    facts, skew = {}, {}
    deadline = time.monotonic() + timeout_s
    while len(facts) < nodes - 1 and time.monotonic() < deadline:
        for n in range(1, nodes):
            p = d / f"node-{n}.json"
            if n in facts or not os.path.lexists(p):
                continue
            try:
                facts[n] = read_facts(p, gate=gate, nodes=nodes, node=n)
            except PreflightError as e:
                rows.append({"check": "facts", "node": n, "status": "fail", "detail": str(e)})
                facts[n] = None
                continue
            skew[n] = time.time() - facts[n]["clock_utc"]
        if len(facts) < nodes - 1:
            time.sleep(POLL_S)
    rows += [
        {
            "check": "arrival",
            "node": n,
            "status": "fail",
            "detail": f"no facts ({d / f'node-{n}.json'}) within {timeout_s:g} s",
        }
        for n in range(1, nodes)
        if n not in facts
    ]
    return facts, skew


def _lead(d: Path, plan, lock, mine: dict, *, nodes: int, need_gpu: bool, timeout_s: float, smoke_s: float) -> int:
    """Node 0: the other nodes' facts gathered, every check judged, the EFA smoke run, the verdict written; 0 on
    pass (one line: what passed, what was not readable, what the profile does not need), else PreflightError."""
    for stale in [*d.glob("node-*.json"), *(d / "smoke").glob("*.json"), _verdict_path(d)]:  # an earlier run's
        stale.unlink(missing_ok=True)
    write_text_atomic(d / "node-0.json", json.dumps(mine, indent=2, sort_keys=True) + "\n")
    rows = []
    others, skew = _gather(d, plan.gate, nodes, timeout_s, rows)
    facts, skew = {0: mine, **others}, {0: 0.0, **skew}
    good = {n: f for n, f in facts.items() if f is not None}
    rows += judge(
        good,
        nodes=nodes,
        gpus_per_node=plan.gpus_per_node,
        need_gpu=need_gpu,
        efa_devices=plan.efa_devices_per_node,
        lock_sha256=lock.sha256,
        skew=skew,
        need_gin=needs_gin(dict(plan.env)),
    )
    smoke = {}
    if plan.efa_devices_per_node and nodes > 1:
        smoke = smoke_.run_pairs(d, good, rows, nodes, smoke_s)
    else:
        why = "the profile needs no EFA" if not plan.efa_devices_per_node else "one node: no peer to reach"
        rows += [{"check": "smoke", "node": n, "status": NOT_NEEDED, "detail": why} for n in sorted(good)]
    failed = [r for r in rows if r["status"] == "fail"]
    verdict = {
        "schema": VERDICT_SCHEMA,
        "gate": plan.gate,
        "profile": plan.profile,
        "nodes": nodes,
        "result": "fail" if failed else "pass",
        "failures": failed,
        "checks": rows,
        "smoke": smoke,
        "nonces": {str(n): f["nonce"] for n, f in good.items()},
        "clock_tolerance_s": CLOCK_TOLERANCE_S,
        "lock_sha256": lock.sha256,
        "written_utc": time.time(),
    }
    write_text_atomic(_verdict_path(d), json.dumps(verdict, indent=2, sort_keys=True) + "\n")
    if failed:
        raise PreflightError(f"preflight failed: {_summary(rows)} (nothing was run; {_verdict_path(d)})")
    needless = sorted({r["check"] for r in rows if r["status"] == NOT_NEEDED})
    unread = sorted({r["check"] for r in rows if r["status"] == UNREADABLE})
    bw = "; ".join(f"EFA smoke node 0 <-> {n}: {s_['mb_s']} MB/s at {s_['bytes']} B" for n, s_ in smoke.items())
    print(
        f"preflight: pass: {nodes} node(s), gate {plan.gate} [{plan.profile}]"
        + (f"; {bw}" if bw else "")
        + (f"; not readable here: {', '.join(unread)}" if unread else "")
        + (f"; not needed by this profile: {', '.join(needless)}" if needless else "")
        + f" ({_verdict_path(d)})"
    )
    return 0


def _read_verdict(path: Path) -> dict | None:
    """The verdict, or None while it is absent; PreflightError naming it when it is malformed."""
    if not os.path.lexists(path):
        return None
    v = jsonsrc.load(path, PreflightError, max_bytes=MAX_VERDICT_BYTES)
    if (
        v.get("schema") != VERDICT_SCHEMA
        or v.get("result") not in ("pass", "fail")
        or not isinstance(v.get("nonces"), dict)
        or not isinstance(v.get("failures"), list)
    ):
        raise PreflightError(f"{path}: not a preflight verdict ({VERDICT_SCHEMA})")
    return v


def _wait_verdict(d: Path, node: int, nonce: str, facts_now, timeout_s: float) -> int:
    """A node other than 0: keep its facts fresh until node 0's verdict names this run's nonce."""
    grace = timeout_s + 10.0  # node 0 may start up to its own timeout later than this node, then judges
    deadline = time.monotonic() + timeout_s + grace
    me, started = d / f"node-{node}.json", time.time()
    smoked = False
    while time.monotonic() < deadline:
        write_text_atomic(me, json.dumps(facts_now(), indent=2, sort_keys=True) + "\n")
        if not smoked:
            smoked = smoke_.client_turn(d, node, nonce)
        try:
            v = _read_verdict(_verdict_path(d))
        except PreflightError:
            v = None  # node 0 writes atomically: a bad verdict is a foreign one; wait for ours
        ours = v is not None and (
            v["nonces"].get(str(node)) == nonce
            or (  # judged with our facts, or a
                v["result"] == "fail"
                and jsonsrc.number(v.get("written_utc"))  # failure node 0 wrote after we
                and v["written_utc"] >= started - CLOCK_TOLERANCE_S
            )
        )  # started (our facts missing/bad)
        if ours:
            if v["result"] == "pass":
                print(f"preflight: node {node}: pass ({_verdict_path(d)})")
                return 0
            lines = "; ".join(
                " ".join(f"node {r.get('node')}: {r.get('check')}: {r.get('detail')}".split())
                for r in v["failures"]
                if isinstance(r, dict)
            )  # the verdict's text: one line
            raise PreflightError(f"preflight failed: {lines[:2000]} (nothing was run; {_verdict_path(d)})")
        time.sleep(HEARTBEAT_S)
    raise PreflightError(
        f"preflight: node {node}: no verdict from node 0 in {d} within {timeout_s + grace:g} s (nothing was run)"
    )
