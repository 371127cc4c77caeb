"""Gate 1's one-NCCL check on what the measuring ranks saw (issue 17): each rank of the trials driver prints, after
its trials, a record of every libnccl mapping of its /proc/self/maps (a deleted one too, launch.procmaps) and
ncclGetVersion; this module holds the records of this host's ranks to the lock's NCCL (kernels.runtime.judge_one_nccl)
and to each other.

Invariants: the records come from a log and are untrusted (a line of test_ep's output can mimic the tag): each names
a rank of the run, once, in its place (after the rank's last trial); every failure is one BuildError naming the rank
and what it mapped; nothing here reads a file, writes or runs anything.
"""

from __future__ import annotations

from ..kernels import runtime
from .kernelprep import Kernels


def one_nccl_of_ranks(
    records: list[dict],
    kern: Kernels,
    host: str | None = None,
    *,
    num_ranks: int | None = None,
    all_local: bool = False,
    misplaced: list[tuple[int, object, object]] = (),
) -> dict:
    """The one-NCCL check (kernels.runtime.judge_one_nccl) of every rank record of THIS host (`host`, default this
    machine's name; the other nodes' gates judge theirs): each must map exactly the pinned NCCL, and they must agree
    on its version. Returns the first record plus `ranks`. Raises BuildError naming the rank and what it mapped,
    or that no rank of this host left a record (a driver from before the records, or a log cut short).

    The records come from a log (a line of test_ep's output can mimic the tag): each must name a rank of the run
    (0..num_ranks-1, an int), once; with `all_local` (one node) every rank must have one; a record out of its place
    (`misplaced`: parsers.micro_trials) is refused; the runtime must be a version string."""
    import socket

    from ..errors import BuildError

    host = host or socket.gethostname()
    mine = _records_of(host, records, num_ranks=num_ranks, all_local=all_local, misplaced=misplaced)
    for r in mine:
        if "error" in r:
            raise BuildError(f"rank {r['rank']}: reading its NCCL failed: {str(r['error'])[:300]}")
        try:
            runtime.judge_one_nccl(r, kern.nccl_lib, accept_sha256=kern.accept_sha256, pinned_version=kern.nccl_version)
        except BuildError as e:
            raise BuildError(f"rank {r['rank']}: {e}") from None
        if not isinstance(r.get("runtime"), str) or len(r["runtime"]) > 40:
            raise BuildError(f"rank {r['rank']}: ncclGetVersion gave no version string: {str(r.get('runtime'))[:60]}")
    versions = {r["rank"]: r["runtime"] for r in mine}
    if len(set(versions.values())) != 1:
        raise BuildError(f"the ranks on this host loaded different NCCL versions: {versions}")
    first = mine[0]
    return {**first, "ranks": sorted(versions)}


def _records_of(host: str, records: list[dict], *, num_ranks, all_local: bool, misplaced) -> list[dict]:
    """The one-NCCL records of `host`, each for a rank of the run, once (every rank's with `all_local`); BuildError
    naming the rank otherwise (one_nccl_of_ranks)."""
    from collections import Counter

    from ..errors import BuildError

    def shown(rank: object) -> str:
        return str(rank) if type(rank) is int else repr(rank)[:40]

    mine = [r for r in records if r.get("host") == host]
    for no, rank, h in misplaced:
        if h == host:
            raise BuildError(
                f"rank {shown(rank)}: a one-NCCL record out of its place at line {no} of the test's log "
                f"(the driver prints it after the rank's last trial, before its done)"
            )
    if not mine:
        raise BuildError(
            f"no rank on this host ({host}) left its one-NCCL record in the test's log "
            f"({len(records)} record(s) from other hosts)"
        )
    for r in mine:
        rank = r.get("rank")
        if type(rank) is not int or (num_ranks is not None and not 0 <= rank < num_ranks):
            raise BuildError(
                f"rank {shown(rank)}: a one-NCCL record for no rank of this run (ranks 0..{(num_ranks or 0) - 1})"
            )
    count = Counter(r["rank"] for r in mine)
    twice = sorted(k for k, n in count.items() if n > 1)
    if twice:
        raise BuildError(f"rank {twice[0]}: {count[twice[0]]} one-NCCL records in the test's log (one expected)")
    if all_local and num_ranks is not None and len(count) != num_ranks:
        lost = sorted(set(range(num_ranks)) - set(count))
        raise BuildError(f"rank {lost[0]}: no one-NCCL record in the test's log (ranks with one: {sorted(count)})")
    return mine
