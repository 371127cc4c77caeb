"""CLI glue for the training gates (5 megatron, 6 nemo-rl): options from argparse, one report per gate.

Kept apart from cli.py so that file only names the gates and their order (gate 1 first, then these).
"""

from __future__ import annotations

from pathlib import Path

from ..report import GateReport
from .training import TrainingOptions

# CLI name -> report gate name, in all-gates order (after micro)
TRAINING_GATES = {"megatron": "megatron", "nemo-rl": "nemo_rl"}


def options(args, lock, root, fetch) -> TrainingOptions:
    """TrainingOptions from the parsed `gate`/`all-gates` arguments (see cli._gate_args)."""
    return TrainingOptions(root=root, lock=lock, fetch=fetch, out_dir=Path(args.out), profile=args.profile,
                           python=args.python, jobs=args.jobs, arch=args.arch, nodes=args.nodes,
                           node_rank=args.node_rank, master_addr=args.master_addr, master_port=args.master_port,
                           timeout_s=args.timeout, arms=getattr(args, "arm", None) or None)


def run_training_gate(name: str, args, lock, root, fetch) -> GateReport:
    """Run the training gate `name` (a key of TRAINING_GATES). Raises KeyError for another name and
    ReprostackError for operator errors (see run_megatron / run_nemo_rl)."""
    opts = options(args, lock, root, fetch)
    if TRAINING_GATES[name] == "megatron":
        from .training import run_megatron
        return run_megatron(opts)
    from .nemo_rl import run_nemo_rl
    return run_nemo_rl(opts)
