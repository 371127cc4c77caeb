"""The NCCL INFO lines of 16 real ranks on 2x p5en.48xlarge (the published campaign's serve log head, NCCL 2.30.4
with aws-ofi-nccl: every rank `NET/OFI Selected provider is efa`, `Using network Libfabric`, `Assigned GIN plugin
Libfabric to comm`), and the same lines with one process edited into what NCCL prints on a fallback. The edits use
only lines NCCL itself prints on that path, as the lent H200 printed them (tests/fixtures/nccl-tests/real/
h200-ep1-all_reduce.log: `Initialized NET plugin Socket`, `Assigned NET plugin Socket to comm`, `Using network
Socket`, `Failed to initialize any GIN plugin`)."""

from __future__ import annotations

import re
from pathlib import Path

P5EN_LOG = Path(__file__).parent / "fixtures" / "published-2026-07" / "trtllm-shim" / "serve_log_head.log"
_NCCL = re.compile(r"^([\w.-]+):(\d+):\d+ \[(\d+)\] NCCL (?:INFO|WARN) ")
_INIT = re.compile(r"\[Rank (\d+)\] ncclCommInitRankConfig comm 0x[0-9a-f]+ rank \d+ nranks (\d+) cudaDev (\d+)")
SOCKET = (
    ("Initialized NET plugin Libfabric", "Initialized NET plugin Socket"),
    ("Assigned NET plugin Libfabric to comm", "Assigned NET plugin Socket to comm"),
    ("Using network Libfabric", "Using network Socket"),
)


def nccl_lines() -> list[str]:
    """Every NCCL INFO/WARN line of the real log, in order."""
    return [ln for ln in P5EN_LOG.read_text().splitlines() if _NCCL.match(ln)]


def ranks() -> dict[int, tuple[str, int, int]]:
    """{rank: (host, pid, cudaDev)} from the log's own init lines."""
    out = {}
    for ln in nccl_lines():
        m, i = _NCCL.match(ln), _INIT.search(ln)
        if m and i:
            out[int(i.group(1))] = (m.group(1), int(m.group(2)), int(i.group(3)))
    return out


def edited(*, socket: int | None = None, gin_off: int | None = None, hosts: dict | None = None) -> list[str]:
    """The real lines with rank `socket`'s process on NCCL's Socket path (no plugin, no provider line), rank
    `gin_off`'s without a GIN plugin, and host names replaced (`hosts`: {real: new})."""
    where = ranks()
    sock = where[socket][:2] if socket is not None else None
    off = where[gin_off][:2] if gin_off is not None else None
    out = []
    for ln in nccl_lines():
        m = _NCCL.match(ln)
        proc = (m.group(1), int(m.group(2)))
        if proc == sock:
            if "Selected provider is" in ln or "Loaded net plugin" in ln or "NET/OFI" in ln:
                continue
            for a, b in SOCKET:
                ln = ln.replace(a, b)
        if proc == off:
            if "gin plugin" in ln or "NET/OFI gin" in ln:
                continue
            ln = ln.replace("Assigned GIN plugin Libfabric to comm", "Failed to initialize any GIN plugin")
        for a, b in (hosts or {}).items():
            if ln.startswith(a + ":"):
                ln = b + ln[len(a) :]
        out.append(ln)
    return out
