"""Node rendezvous of a run on several nodes that share one out folder, on the output contract (launch.plan.Outputs):
the reporter gathers every other node's rc and rank logs after its own part and marks its part done; a worker whose
command serves (an engine's worker, `ray start --block`) runs until that mark.

- `NodeRun`: one node's view of the run (the contract, the out folder, the run's id, the folder of the gate's rank
  logs), made by the gate runtime (gates.base.RunState.node_run);
- `gather(run, stems, profile_nodes)`: the reporter's bounded wait for every other node, and what each left;
- `mark_done(run)`: the reporter's done mark; `serve_until_done(run, ...)`: a serving worker until that mark.

Invariants: a process tool (below the gates: nothing here imports reprostack.gates, the gate passes a NodeRun in);
the reporter waits at most the contract's `wait_s` and never judges on fewer nodes than the run has (a node that
failed, wrote no rc of this run or no rank log is named); an rc or done mark of another run (`--run-id`) on the
shared folder is never this run's; a serving worker is always stopped (its whole process group) before it returns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..atomicfile import write_text_atomic
from .plan import Outputs, read_rc
from .server import ServerProcess


@dataclass(frozen=True)
class NodeRun:
    """One node's part of a run: the output contract, the out folder every node shares, the run's id (`--run-id`,
    None: `-`) and the folder of the gate's rank logs (its report stem)."""

    outputs: Outputs
    out: Path
    run_id: str | None
    folder: str

    def rank_log(self, stem: str, node) -> Path:
        """Node `node`'s log of its ranks for the gate's command `stem` (test_ep, an arm)."""
        return self.out / self.outputs.rank_log(self.folder, stem, node)


def gather(run: NodeRun, stems: list[str], profile_nodes: int) -> tuple[str | None, dict]:
    """On the reporter of a run on several nodes, after its own part: wait, at most the contract's `wait_s`, for
    every other node's rc of this run, then check it is 0 and that the node's rank logs of `stems` exist. Returns
    (why, nodes): why is None when every node did its part, else one line naming each node that failed (its exit and
    its node log) or wrote no rc, for the run's ERROR: never a verdict on fewer ranks than the profile's
    `profile_nodes`; nodes is what each other node left (the report's `data.nodes`)."""
    o, out = run.outputs, run.out
    others = [n for n in range(o.nodes) if n != o.reporter]
    rcs: dict[int, int | None] = {n: None for n in others}
    deadline = time.monotonic() + o.wait_s
    while True:
        for n in others:
            if rcs[n] is None:
                rcs[n] = read_rc(out / o.node_rc(n), run.run_id)
        if all(v is not None for v in rcs.values()) or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    problems = []
    nodes: dict[str, dict] = {}
    for n in others:
        log = out / o.node_log(n)
        ranks = [run.rank_log(s, n) for s in stems]
        nodes[str(n)] = {
            "rc": rcs[n],
            "node_log": o.node_log(n),
            "rank_logs": [str(p.relative_to(out)) for p in ranks],
        }
        seen = "" if log.is_file() else " (absent)"
        if rcs[n] is None:
            problems.append(
                f"node {n}: no rc of this run in {o.wait_s:g} s ({o.node_rc(n)}): it never started, or died "
                f"before its runtime began; its log: {log}{seen}"
            )
        elif rcs[n] != 0:
            problems.append(f"node {n}: exit {rcs[n]}; its log: {log}{seen}")
        elif missing := [str(p.relative_to(out)) for p in ranks if not p.is_file()]:
            problems.append(f"node {n}: exit 0 but no {', '.join(missing)}; its log: {log}{seen}")
    if not problems:
        return None, nodes
    return (
        f"{len(problems)} of the {len(others)} other node(s) did not complete their part: "
        + "; ".join(problems)
        + f" (no verdict on fewer than the profile's {profile_nodes} node(s))"
    ), nodes


def mark_done(run: NodeRun) -> None:
    """The reporter's part is over (Outputs.leader_done): a serving worker stops on it."""
    path = run.out / run.outputs.leader_done()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, f"{run.run_id or '-'}\n")


def serve_until_done(
    run: NodeRun, argv: list[str], env: dict, cwd: str, log: Path, timeout_s: float, watch=None
) -> tuple[bool, str]:
    """A worker's command that serves (no end of its own: an engine's worker, `ray start --block`): run it until
    the reporter's done mark of this run, its own exit or `timeout_s`. `watch(pids)`, when given, is called with
    the server's processes every few seconds and once before it is stopped (the one-NCCL check reads their maps
    while they run). Returns (ok, what happened)."""
    mark = run.out / run.outputs.leader_done()
    mine = run.run_id or "-"
    reporter = run.outputs.reporter
    server = ServerProcess(argv, env=env, cwd=cwd, log_path=log)
    deadline = time.monotonic() + timeout_s
    looked = 0.0
    try:
        while server.alive() and time.monotonic() < deadline:
            if watch is not None and time.monotonic() - looked >= 5.0:
                watch(server.pids())
                looked = time.monotonic()
            try:
                if mark.read_text().split() == [mine]:
                    break
            except OSError:
                pass
            time.sleep(0.5)
    finally:
        if watch is not None and server.alive():
            watch(server.pids())
        before = server.stop()
    if before is None and time.monotonic() < deadline:
        return True, f"served until node {reporter} was done (then stopped)"
    if before is None:
        return False, f"still serving at its timeout of {timeout_s:g} s (node {reporter} never said done)"
    return before == 0, f"its command exited {before} before node {reporter} was done"
