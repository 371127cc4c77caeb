"""Transport proof per rank: what a profile and a stack need of every rank's transport, and the check that judges
the ranks' evidence (gates.parsers.transport) against it. One judge for every gate on an EFA profile: fabric (per
nccl-tests binary), micro (test_ep's ranks through the trials driver), megatron (per arm), nemo-rl, and the serving
gates (vllm, sglang, trtllm: the deepep arm's server logs of every node).

What is needed (`need`):
- an EFA profile: every rank of the profile (nodes x GPUs per node) on `NET/OFI efa` (the OFI net plugin with the
  libfabric `efa` provider); a rank on `Socket`, `IB`, another provider, `mixed`, or `unknown` (no NCCL INFO line
  for it) fails, named with its host; so does a rank whose process took a second network (`Assigned NET plugin` /
  `Using network` with two names: a second plugin), and a process no rank line names that shows another network;
- a one-node profile without EFA: no network to prove (one GPU: no peer; NVLink: P2P/SHM only): fabric checks
  `none: no network (one node)` per rank (nccl-tests always prints its init lines); the other gates report why no
  transport check applies (`no_network`), never a silent pass;
- GIN, when the gate runs DeepEP over NCCL's GPU-initiated networking (`gin=True`: micro, megatron's DeepEP arm,
  nemo-rl, the serving gates' deepep arm) and the run's env turns it on (`NCCL_GIN_ENABLE=1`, and not `EP_DISABLE_GIN=1`): every rank's comm got a
  GIN plugin (`Assigned GIN plugin ...`), never `Failed to initialize any GIN plugin` / `GIN is disabled.`; a GIN
  type the log shows must be the one asked (`NCCL_GIN_TYPE`); and when the asked type is GPU-initiated (3 GDAKI,
  4 GPI, 5 EFA-GDA: the stack `gin-gdaki`, docs/stacks.md) a line must show that type ran (NCCL 2.30.7+'s
  `GIN/Plugin: Assigned plugin NAME type T to comm`, aws-ofi-nccl's `gin GDAKI: createContext done`): the CPU proxy
  (type 2) or no type line is a fallback, named per rank. NCCL 2.30.4 (the campaign's) prints no type: the campaign
  asks for type 2 (the CPU proxy), where a GIN plugin assigned is the evidence.

Invariants: pure (no I/O); every failure names the rank (or the process) and what it used; a missing rank fails,
never shrinks the expected set; the check's value is at most 600 characters (the rest counted).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..report import Check
from .parsers.transport import GIN_TYPES, GPU_INITIATED, NONE_ONE_NODE, RankTransport, TransportParse
from .spec import HardwareProfile

EFA_TRANSPORT = "NET/OFI efa"
MAX_SHOWN = 8


@dataclass(frozen=True)
class TransportNeed:
    """What every rank must show: `network` (EFA_TRANSPORT, NONE_ONE_NODE, or None: one network, any), `ranks`
    (the profile's nodes x GPUs per node), `gin` (a GIN plugin on every rank), `gin_type` (NCCL_GIN_TYPE asked, or
    None), and `words` (the need in one line, for the report)."""

    network: str | None
    ranks: int
    gin: bool = False
    gin_type: int | None = None

    @property
    def gpu_initiated(self) -> bool:
        return self.gin and self.gin_type in GPU_INITIATED

    @property
    def words(self) -> str:
        out = f"{self.ranks} rank(s) on {self.network or 'one network'}"
        if self.gin:
            t = self.gin_type
            out += ", GIN on" + (f" (type {t}, {GIN_TYPES.get(t, '?')})" if t is not None else "")
            if self.gpu_initiated:
                out += ", a line showing that type ran"
        return out

    def to_dict(self) -> dict:
        return {"network": self.network, "ranks": self.ranks, "gin": self.gin, "gin_type": self.gin_type}


def _int(v) -> int | None:
    try:
        return int(str(v).strip())
    except (TypeError, ValueError):
        return None


def need(profile: HardwareProfile, env: dict | None = None, *, gin: bool = False) -> TransportNeed | None:
    """What `profile` (a gate profile: nodes, gpus_per_node, needs_efa) and the run's `env` need of every rank; None
    when there is no network to prove (one node without EFA; `no_network` says why). `gin`: the gate runs DeepEP
    over NCCL GIN (it is needed when the env turns GIN on)."""
    env = env or {}
    ranks = profile.nodes * profile.gpus_per_node
    if not profile.needs_efa:
        return None
    wants_gin = gin and str(env.get("NCCL_GIN_ENABLE", "")).strip() == "1"
    wants_gin = wants_gin and str(env.get("EP_DISABLE_GIN", "0")).strip() in ("", "0")
    return TransportNeed(EFA_TRANSPORT, ranks, wants_gin, _int(env.get("NCCL_GIN_TYPE")) if wants_gin else None)


def no_network(profile: HardwareProfile) -> str:
    """Why a profile has no transport to prove, in words (for the report)."""
    gpus = profile.gpus_per_node
    peers = "one GPU, no peer" if gpus <= 1 else f"{gpus} GPUs over NVLink (P2P/SHM), no NIC"
    return (
        f"profile {profile.name} is {profile.nodes} node(s) without EFA ({peers}): no network carries the traffic, "
        f"so no per-rank transport is checked"
    )


def rank_problems(need_: TransportNeed, t: RankTransport) -> list[str]:
    """What is wrong with one rank (or process) against the need, one phrase each naming it."""
    who = f"rank {t.rank}" if t.rank is not None else f"process {t.host}:{t.pid} (no rank line)"
    who += f" ({t.host})" if t.rank is not None and t.host else ""
    out = []
    if need_.network is not None and t.transport != need_.network:
        out.append(f"{who} {t.transport}" + (f" [{t.why}]" if t.why else ""))
    elif need_.network is None and t.transport.startswith(("unknown", "mixed")):
        out.append(f"{who} {t.transport}")
    if len(t.networks) > 1:
        out.append(f"{who} took a second net plugin: {', '.join(t.networks)}")
    if need_.gin and t.rank is not None:
        if t.gin is None:
            out.append(f"{who} GIN off: {t.gin_off or 'no GIN plugin assigned to its comm'}")
        elif t.gin_type is not None and need_.gin_type is not None and t.gin_type != need_.gin_type:
            out.append(
                f"{who} GIN type {t.gin_type} ({GIN_TYPES.get(t.gin_type, '?')}) ran, the stack asks for "
                f"{need_.gin_type} ({GIN_TYPES.get(need_.gin_type, '?')})"
            )
        elif need_.gpu_initiated and t.gin_type is None:
            out.append(
                f"{who} no line shows GIN type {need_.gin_type} ({GIN_TYPES.get(need_.gin_type, '?')}) ran "
                f"(GIN plugin {t.gin} assigned; NCCL_GIN_TYPE read as {t.gin_type_env}): the GPU-initiated path is "
                f"not proven"
            )
    return out


def problems(need_: TransportNeed, parsed: TransportParse) -> list[str]:
    """Every problem of a parse against the need: ranks missing, each rank's, each unattributed process's."""
    expected = set(range(need_.ranks))
    ranks = {t.rank: t for t in parsed.ranks}
    out = []
    missing = sorted(expected - set(ranks))
    if missing:
        out.append(f"rank(s) {ranges(missing)} not in the output")
    for r in sorted(ranks):
        if r not in expected:
            out.append(f"rank {r} is not a rank of the profile (0..{need_.ranks - 1})")
            continue
        out += rank_problems(need_, ranks[r])
    for t in parsed.unattributed:
        if not t.transport.startswith("unknown"):
            out += [p for p in rank_problems(need_, t)]
    return out


def summary(parsed: TransportParse) -> str:
    """The ranks' plugins, providers, networks and GIN in a few words (what every rank showed, counted)."""
    from collections import Counter

    def count(values) -> str:
        c = Counter(v for v in values)
        return ", ".join(f"{k or '-'} x{n}" for k, n in sorted(c.items(), key=lambda kv: str(kv[0])))

    rs = parsed.ranks
    if not rs:
        return "no rank in the output"
    return (
        f"{len(rs)} rank(s) on {len(parsed.hosts)} host(s): transport {count(t.transport for t in rs)}; "
        f"plugin {count(t.net_plugin for t in rs)}; provider {count(t.provider for t in rs)}; "
        f"GIN {count(t.gin for t in rs)}, type {count(t.gin_type for t in rs)}"
    )


def check(metric: str, need_: TransportNeed, parsed: TransportParse, *, where: str = "") -> Check:
    """`metric` == the need's words for every rank: PASS only when no rank (or process) has a problem."""
    bad = problems(need_, parsed)
    value = need_.network or "one network"
    if bad:
        value = "; ".join(bad[:MAX_SHOWN]) + (f"; ... {len(bad) - MAX_SHOWN} more" if len(bad) > MAX_SHOWN else "")
    note = (f"{where}: " if where else "") + f"needs {need_.words}; {summary(parsed)}"
    return Check(metric, "", value[:600], "==", need_.network or "one network", not bad, note[:600])


def ranges(xs: list[int]) -> str:
    """`0-3,7` of [0, 1, 2, 3, 7]."""
    out, start = [], None
    for i, x in enumerate(xs):
        if start is None:
            start = x
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            out.append(f"{start}" if start == x else f"{start}-{x}")
            start = None
    return ",".join(out)


__all__ = [
    "EFA_TRANSPORT",
    "NONE_ONE_NODE",
    "TransportNeed",
    "check",
    "need",
    "no_network",
    "problems",
    "rank_problems",
    "ranges",
    "summary",
]
