"""Launchers: the argv + env that start DeepEP's test_ep.py on one node or on several.

test_ep.py's own contract (deep_ep/utils/envs.py:init_dist): it spawns `--num-processes` local ranks
and reads WORLD_SIZE = number of nodes, RANK = node rank, MASTER_ADDR / MASTER_PORT.
- local: one node, the script started directly.
- torchrun: several nodes, `torchrun --nproc-per-node 1` per node, which sets exactly that contract
  (WORLD_SIZE = nnodes x 1, RANK = node rank) and lets init_process_group reuse the agent's store.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local(python: str, script: str, args: list[str], *, gpus: int, port: int | None = None) -> Launch:
    """One node: `python -X faulthandler script --num-processes gpus ARGS` (WORLD_SIZE=1, RANK=0)."""
    return Launch(
        [python, "-X", "faulthandler", script, "--num-processes", str(gpus), *args],
        {"WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port or free_port())},
    )


def torchrun(
    python: str,
    script: str,
    args: list[str],
    *,
    gpus: int,
    nodes: int,
    node_rank: int,
    master_addr: str,
    master_port: int,
) -> Launch:
    """Node `node_rank` of `nodes`: torchrun with one agent process per node that spawns `gpus` ranks."""
    if not 0 <= node_rank < nodes:
        raise ValueError(f"node rank {node_rank} outside 0..{nodes - 1}")
    argv = [
        python,
        "-X",
        "faulthandler",
        "-m",
        "torch.distributed.run",
        f"--nnodes={nodes}",
        "--nproc-per-node=1",
        f"--node-rank={node_rank}",
        f"--master-addr={master_addr}",
        f"--master-port={master_port}",
        script,
        "--num-processes",
        str(gpus),
        *args,
    ]
    return Launch(argv, {"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)})


def torchrun_workers(
    python: str,
    script: str,
    args: list[str],
    *,
    gpus: int,
    nodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
) -> Launch:
    """One process per GPU under torchrun (`--nproc-per-node gpus`) on each of `nodes` nodes (this is node
    `node_rank`), for drivers that call init_process_group from RANK / WORLD_SIZE / LOCAL_RANK (the training
    driver, the dense arm). One node without a master: a local one on 127.0.0.1 and a free port (the form
    that ran on the lent H200). Raises ValueError for a node rank outside the nodes or several nodes
    without master address and port."""
    if not 0 <= node_rank < nodes:
        raise ValueError(f"node rank {node_rank} outside 0..{nodes - 1}")
    if nodes > 1 and (not master_addr or not master_port):
        raise ValueError(f"{nodes} nodes need a master address and port")
    master_addr = master_addr or "127.0.0.1"
    master_port = master_port or free_port()
    argv = [
        python,
        "-X",
        "faulthandler",
        "-m",
        "torch.distributed.run",
        f"--nnodes={nodes}",
        f"--nproc-per-node={gpus}",
        f"--node-rank={node_rank}",
        f"--master-addr={master_addr}",
        f"--master-port={master_port}",
        script,
        *args,
    ]
    return Launch(argv, {"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), "PYTHONFAULTHANDLER": "1"})
