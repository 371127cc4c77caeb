"""`reprostack all-gates`: every gate in dependency order, one combined report (cmd.gate runs it)."""

from __future__ import annotations

from . import gate

HELP = "run every gate in dependency order; one combined report"


def add_arguments(p) -> None:
    gate.add_gate_options(p)


def run(args) -> int:
    return gate.run(args)
