"""`reprostack preflight GATE`: the cross-node preflight of one node (cluster.preflight); node 0 writes the verdict."""

from __future__ import annotations

from pathlib import Path

from ..gates.registry import GATE_ORDER
from . import load_lock

HELP = (
    "cross-node preflight: same lock and image, GPUs, EFA, provider efa, clocks, port, driver vs the image's CUDA, "
    "fabric manager, NVLink, EFA devices and module, gdrdrv vs libgdrapi, memlock, hugepages, ECC/Xid, PCIe width, "
    "a two-node fi_pingpong over EFA; node 0 writes DIR/preflight/verdict.json; exit 2 names node and check"
)


def add_arguments(p) -> None:
    from ..gates import options as gate_options

    p.add_argument("gate", choices=list(GATE_ORDER))
    p.add_argument("--out", required=True, help="shared folder of the run (facts and verdict under DIR/preflight)")
    gate_options.add_arguments(p, ("nodes", "node_rank", "profile"), required=("nodes", "node_rank"))  # gates.options
    p.add_argument("--lock", default=None, help="lockfile (default: upstreams.lock of the project root)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds node 0 waits for every node (default 300)")
    p.add_argument("--port", type=int, default=None, help="rendezvous port that must be free on node 0 (default 29500)")
    p.add_argument(
        "--smoke-timeout",
        type=float,
        default=60.0,
        help="seconds each two-node fi_pingpong over EFA may take (default 60)",
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
