"""`reprostack preflight GATE`: the cross-node preflight of one node (cluster.preflight); node 0 writes the verdict."""

from __future__ import annotations

from pathlib import Path

from ..cluster.preflight import CHECKS, SMOKE_TIMEOUT_S, TIMEOUT_S
from ..gates.registry import GATE_ORDER
from . import load_lock

HELP = (
    "cross-node preflight: same lock and image, GPUs, EFA, provider efa, clocks, port, driver vs the image's CUDA, "
    "fabric manager, NVLink, EFA devices, module and FI_HMEM, /dev/gdrdrv and gdrdrv vs libgdrapi, memlock, hugepages, ECC/Xid, PCIe width, "
    "a two-node fi_pingpong over EFA; node 0 writes DIR/preflight/verdict.json; exit 2 names node and check"
)

DESCRIPTION = (
    "Every node runs this; node 0 judges each check on every node and writes DIR/preflight/verdict.json. The "
    "checks: "
    + "; ".join(f"{c} ({what})" for c, what in CHECKS.items())
    + ". A check the gate's profile does not need is `not-needed`. Exit 0 when every check holds; 2 names the "
    "node and the check."
)


def add_arguments(p) -> None:
    from ..gates import options as gate_options

    p.add_argument("gate", choices=list(GATE_ORDER))
    p.add_argument("--out", required=True, help="shared folder of the run (facts and verdict under DIR/preflight)")
    gate_options.add_arguments(p, ("nodes", "node_rank", "profile"), required=("nodes", "node_rank"))  # gates.options
    p.add_argument("--lock", default=None, help="lockfile (default: upstreams.lock of the project root)")
    p.add_argument(
        "--timeout", type=float, default=TIMEOUT_S, help="seconds node 0 waits for every node (default %(default)g)"
    )
    p.add_argument("--port", type=int, default=None, help="rendezvous port that must be free on node 0 (default 29500)")
    p.add_argument(
        "--smoke-timeout",
        type=float,
        default=SMOKE_TIMEOUT_S,
        help="seconds each two-node fi_pingpong over EFA may take (default %(default)g)",
    )


def run(args) -> int:
    lock, root = load_lock(args)
    from ..cluster import preflight
    from ..gates import registry

    g = registry.gate(args.gate)
    return preflight.run(
        g,
        root,
        lock,
        out=Path(args.out),
        nodes=args.nodes,
        node_rank=args.node_rank,
        profile=args.profile,
        timeout_s=args.timeout,
        port=args.port,
        smoke_timeout_s=args.smoke_timeout,
    )
