"""Launchers: the argv + env that start DeepEP's test_ep.py on one node or on several.

test_ep.py's own contract (deep_ep/utils/envs.py:init_dist): it spawns `--num-processes` local ranks
and reads WORLD_SIZE = number of nodes, RANK = node rank, MASTER_ADDR / MASTER_PORT.
- local: one node, the script started directly.
- torchrun: several nodes, `torchrun --nproc-per-node 1` per node, which sets exactly that contract
  (WORLD_SIZE = nnodes x 1, RANK = node rank) and lets init_process_group reuse the agent's store.
"""

from __future__ import annotations

import random
import socket
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict


EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10000  # below it sit the well-known and registered services a node may run


def ephemeral_range(path: Path = EPHEMERAL) -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default when it cannot be read or makes no sense)."""
    try:
        low, high = (int(w) for w in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return (low, high) if 0 < low <= high <= 65535 else (32768, 60999)


def free_port(*, host: str = "127.0.0.1", tries: int = 200) -> int:
    """A port free now, chosen below the kernel's ephemeral range.

    A port taken from the ephemeral range (bind to 0) is free only until the next outgoing connection or listener:
    srun's I/O sockets, NCCL's bootstrap or any client may be handed the same number before the rendezvous binds it,
    and then a rank talks to the wrong server (seen in CI: node 1's store client reaching srun, "Insane message
    length"). Below the range no such process is given a port by the kernel.
    """
    low, _ = ephemeral_range()
    top = max(low - 1, LOWEST + 1)
    for _ in range(tries):
        port = random.randint(LOWEST, top)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port between {LOWEST} and {top} after {tries} tries")


def local(python: str, script: str, args: list[str], *, gpus: int, port: int | None = None) -> Launch:
    """One node: `python -X faulthandler script --num-processes gpus ARGS` (WORLD_SIZE=1, RANK=0)."""
    return Launch(
        [python, "-X", "faulthandler", script, "--num-processes", str(gpus), *args],
        {"WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port or free_port())},
    )


def need_master(profile: str, nodes: int, master_addr, master_port) -> None:
    """A run over several nodes needs its rendezvous from the operator: ReprostackError naming the profile if not."""
    if nodes > 1 and (not master_addr or not master_port):
        from ..errors import ReprostackError

        raise ReprostackError(
            f"profile {profile} spans {nodes} nodes: give --master-addr and --master-port (and --node-rank on each node)"
        )


def _rank_in(node_rank: int, nodes: int) -> None:
    if not 0 <= node_rank < nodes:
        raise ValueError(f"node rank {node_rank} outside 0..{nodes - 1}")


def _torchrun_argv(python: str, *, nodes: int, per_node: int, node_rank: int, master_addr: str, master_port) -> list:
    """`python -X faulthandler -m torch.distributed.run` with the rendezvous flags (a script and its args follow)."""
    _rank_in(node_rank, nodes)
    return [
        python,
        "-X",
        "faulthandler",
        "-m",
        "torch.distributed.run",
        f"--nnodes={nodes}",
        f"--nproc-per-node={per_node}",
        f"--node-rank={node_rank}",
        f"--master-addr={master_addr}",
        f"--master-port={master_port}",
    ]


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
    argv = _torchrun_argv(
        python, nodes=nodes, per_node=1, node_rank=node_rank, master_addr=master_addr, master_port=master_port
    )
    argv += [script, "--num-processes", str(gpus), *args]
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
    _rank_in(node_rank, nodes)
    if nodes > 1 and (not master_addr or not master_port):
        raise ValueError(f"{nodes} nodes need a master address and port")
    master_addr = master_addr or "127.0.0.1"
    master_port = master_port or free_port()
    argv = _torchrun_argv(
        python, nodes=nodes, per_node=gpus, node_rank=node_rank, master_addr=master_addr, master_port=master_port
    )
    argv += [script, *args]
    return Launch(argv, {"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), "PYTHONFAULTHANDLER": "1"})
