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
    return Launch([python, "-X", "faulthandler", script, "--num-processes", str(gpus), *args],
                  {"WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port or free_port())})


def torchrun(python: str, script: str, args: list[str], *, gpus: int, nodes: int, node_rank: int,
             master_addr: str, master_port: int) -> Launch:
    """Node `node_rank` of `nodes`: torchrun with one agent process per node that spawns `gpus` ranks."""
    if not 0 <= node_rank < nodes:
        raise ValueError(f"node rank {node_rank} outside 0..{nodes - 1}")
    argv = [python, "-X", "faulthandler", "-m", "torch.distributed.run", f"--nnodes={nodes}", "--nproc-per-node=1",
            f"--node-rank={node_rank}", f"--master-addr={master_addr}", f"--master-port={master_port}",
            script, "--num-processes", str(gpus), *args]
    return Launch(argv, {"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)})


def torchrun_gpus(python: str, script: str, args: list[str], *, gpus: int, nodes: int, node_rank: int,
                  master_addr: str, master_port: int) -> Launch:
    """A training driver that is one process per GPU: torchrun with `gpus` workers on each of `nodes` nodes
    (node `node_rank`); one node is the same with nodes=1 and a local master. Workers get RANK, LOCAL_RANK,
    WORLD_SIZE, GROUP_RANK (= node rank) from torchrun. Raises ValueError for a node rank outside the nodes."""
    if not 0 <= node_rank < nodes:
        raise ValueError(f"node rank {node_rank} outside 0..{nodes - 1}")
    argv = [python, "-X", "faulthandler", "-m", "torch.distributed.run", f"--nnodes={nodes}",
            f"--nproc-per-node={gpus}", f"--node-rank={node_rank}", f"--master-addr={master_addr}",
            f"--master-port={master_port}", script, *args]
    return Launch(argv, {"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), "PYTHONFAULTHANDLER": "1"})
