"""`reprostack preflight GATE`: the cross-node preflight of one node (cluster.preflight); node 0 writes the verdict."""

from __future__ import annotations

from pathlib import Path

from ..cluster.preflight import CHECKS, CLOCK_TOLERANCE_S, SMOKE_TIMEOUT_S, TIMEOUT_S
from ..gates.registry import GATE_ORDER
from . import load_lock

HELP = (
    "cross-node preflight: same lock and image, GPUs, EFA, provider efa, clocks, port, driver vs the image's CUDA, "
    "fabric manager, NVLink, EFA devices, module and FI_HMEM, /dev/gdrdrv and gdrdrv vs libgdrapi, memlock, hugepages, ECC/Xid, PCIe width, "
    "a two-node fi_pingpong over EFA; node 0 writes DIR/preflight/verdict.json; exit 2 names node and check"
)

_WHAT = {  # a gloss per check of cluster.preflight.CHECKS (the one list; a test checks each is here)
    "arrival": "every node wrote its facts in time",
    "facts": "each node's facts file valid",
    "lock": "one upstreams.lock (sha256) on every node",
    "image": "one image (digest) on every node",
    "gpus": "the profile's GPUs per node",
    "efa": "the profile's EFA devices per node",
    "provider": "`fi_info -p efa` selects efa",
    "clock": f"clocks within {CLOCK_TOLERANCE_S:g} s",
    "port": "the rendezvous port free on node 0",
    "driver": "the NVIDIA driver supports the image's CUDA",
    "fabricmanager": "nvidia-fabricmanager running (NVSwitch)",
    "nvlink": "NVLink links up",
    "efa-devices": "/dev/infiniband/uverbs* present",
    "efa-hmem": "`fi_info -p efa -c FI_HMEM` offers GPU memory (GPUDirect RDMA)",
    "efa-module": "the efa kernel module loaded",
    "gdrdrv": "/dev/gdrdrv opens and the gdrdrv module matches the image's libgdrapi",
    "memlock": "ulimit -l unlimited",
    "hugepages": "hugepages for libfabric",
    "ecc": "no uncorrected ECC errors",
    "xid": "no Xid errors in the kernel log",
    "pcie": "GPU and NIC PCIe links at full width",
    "smoke": "a two-node fi_pingpong over EFA",
}
DESCRIPTION = (
    "Every node runs this; node 0 judges each check on every node and writes DIR/preflight/verdict.json. The "
    "checks: "
    + "; ".join(f"{c} ({_WHAT[c]})" for c in CHECKS)
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
