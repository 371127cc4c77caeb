"""Judging: what a gate kind's run produced -> checks -> verdict, one module per kind that has its own judge.

- serving: the serving gates' judge (ArmRun -> backend, transport, cell and bar checks -> verdict -> report);
- fabric: the fabric gate's (nccl-tests parses -> row, correctness, NCCL, busbw bar and transport checks, figures);
- megatron: the Megatron gate's (each arm's training log -> checks, per-step statistics, cross-arm agreement).

A check is judged against its bar with report.evaluate / report.evaluate_interval on evidence.bars.stats' interval;
the micro gate's checks are still made in gates.micro. The gates call these from their `launch_and_judge` stage.

Invariants: nothing here runs or writes anything; a check never passes on a missing or non-finite number.
"""
