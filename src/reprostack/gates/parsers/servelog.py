"""Backend assertion on a serving engine's logs: which rank printed which evidence line, and who died first.

A serving gate's number counts only with evidence that the engine ran its MoE all-to-all over DeepEP's
ElasticBuffer on EFA (docs/campaign.md). The gate spec lists, per engine, `required` lines (each a regex and a
scope: `all` = every rank of the EP group must print it, `any` = at least one line) and `forbidden` lines (any
match fails). This module counts matches per rank and classifies failures.

Rank attribution of one line (first rule that matches wins; shapes taken from real logs):
- DeepEP's own ElasticBuffer debug line (EP_BUFFER_DEBUG=1, deep_ep/buffers/elastic.py:179 at b306af06):
  `Initializing EP elastic buffer with N bytes at rank EP r/n`;
- DeepEP's per-dispatch line (EP_BUFFER_DEBUG=1, a printf after every CPU-synced ElasticBuffer.dispatch,
  csrc/elastic/buffer.hpp:993 at b306af06): `CPU side received count (scaleup: s): ...`, rank s only when every
  rank is on one node (there the scaleup index is the rank; across nodes it repeats, so the line is unattributed);
- TRT-LLM: `[TRT-LLM] [RANK r]` (tests/fixtures/published-2026-07/trtllm-shim/serve_log_head.log);
- vLLM DP workers: `(EngineCore_DP<r> pid=...)`; SGLang: `DP<d> TP<t> EP<e>]` in its log prefix (EP, else TP, else DP);
- launcher prefixes (torchrun `[rank3]:`, OpenMPI `[1,3]<stdout>:`, srun `3: `), see logtext;
- NCCL `host:pid:tid [dev] NCCL INFO|WARN ...` lines: the rank of that (host, pid) as its own
  `ncclCommInitRankConfig comm 0x.. rank R nranks N` line says; else node index x GPUs per node + dev, nodes in
  natural host-name order (serve_log_head.log: deepep-efa-bench-1 [0] is rank 8).
Lines with none of these count under rank None ("unattributed").

Failure classes come from parsers.failure; `gin_barrier_timeout` is a symptom (a live rank waiting at a barrier
for a peer that is gone): the report names the first rank with death evidence of another kind, else the peers
the waiters were waiting for (`thread: i` in DeepEP's printf, deep_ep/include/deep_ep/common/comm.cuh:174).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from .failure import evidence_kind
from .logtext import numbered_lines, prefix_rank

_ELASTIC_RANK = re.compile(r"at rank EP (\d+)/(\d+)")
_RECV_COUNT = re.compile(r"CPU side received count \(scaleup: (\d+)\)")
_TRT_RANK = re.compile(r"\[TRT-LLM\] \[RANK (\d+)\]")
_VLLM_RANK = re.compile(r"\(EngineCore_DP(\d+) pid=\d+\)")
_SGL_RANK = re.compile(r"\bDP(\d+) TP(\d+)(?: EP(\d+))?\]|\bTP(\d+)(?: EP(\d+))?\]")
_NCCL = re.compile(r"^(?P<host>[\w.-]+):(?P<pid>\d+):\d+ \[(?P<dev>\d+)\] NCCL (?:INFO|WARN)")
_NCCL_COMM = re.compile(r"ncclCommInitRank\w* comm 0x[0-9a-f]+ rank (\d+) nranks (\d+)")
_GIN = re.compile(r"DeepEP Gin barrier timeout, tag: (-?\d+), scaleout: (\d+), scaleup: (\d+), thread: (\d+)")
_DEATH_KINDS = ("oom", "ep_assertion", "cuda_error", "sigsegv", "sigabrt", "sigbus", "nccl_error")
_SYMPTOM_KINDS = ("gin_barrier_timeout", "ep_timeout")
_MAX_LINES = 5


@dataclass(frozen=True)
class Requirement:
    """One evidence line: `name`, regex `pattern`, `scope` (`all`: every rank; `any`: at least one line),
    `source` (where the line shape comes from)."""

    name: str
    pattern: str
    scope: str = "all"
    source: str = ""

    def regex(self) -> re.Pattern:
        return re.compile(self.pattern)


@dataclass
class RequirementResult:
    """Matches of one requirement: `per_rank` {rank or None: count}, `missing_ranks` (scope all), `ok`, and the
    first matching lines `examples` as `"line N: text"`."""

    name: str
    scope: str
    per_rank: dict
    total: int
    missing_ranks: list
    ok: bool
    examples: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "scope": self.scope,
            "total": self.total,
            "ok": self.ok,
            "per_rank": {
                ("unattributed" if r is None else str(r)): n
                for r, n in sorted(self.per_rank.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))
            },
            "missing_ranks": self.missing_ranks,
            "examples": self.examples,
        }


@dataclass
class ServeLogReport:
    """Result of `assert_backend`: `required` / `forbidden` RequirementResults, `ok` (every required satisfied,
    no forbidden line), `problems` (one sentence each), `symptoms` (`"line N: text"` of barrier timeouts),
    `first_dead_rank` (int or None) with `death` (how it is known)."""

    num_ranks: int
    required: list
    forbidden: list
    problems: list
    symptoms: list
    first_dead_rank: int | None
    death: str | None

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {
            "num_ranks": self.num_ranks,
            "ok": self.ok,
            "problems": self.problems,
            "required": [r.to_dict() for r in self.required],
            "forbidden": [r.to_dict() for r in self.forbidden],
            "symptoms": self.symptoms,
            "first_dead_rank": self.first_dead_rank,
            "death": self.death,
        }


def _natural(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


class RankMap:
    """Rank attribution for one log (see the module doc). `gpus_per_node` is used for NCCL lines without a
    `ncclCommInitRank... rank R` line of their own (host, pid)."""

    def __init__(self, lines: list[tuple[int, str, str]], gpus_per_node: int, one_node: bool = False):
        self.gpus_per_node = gpus_per_node
        self.one_node = one_node  # every rank on one node: DeepEP's scaleup index is the rank
        self.by_pid: dict[tuple[str, str], int] = {}
        hosts = set()
        for _no, _pre, body in lines:
            m = _NCCL.match(body)
            if not m:
                continue
            hosts.add(m["host"])
            c = _NCCL_COMM.search(body)
            if c:
                self.by_pid[(m["host"], m["pid"])] = int(c.group(1))
        self.host_index = {h: i for i, h in enumerate(sorted(hosts, key=_natural))}

    def rank(self, prefix: str, body: str) -> int | None:
        """The rank a line belongs to, or None."""
        for rx in (_ELASTIC_RANK, _TRT_RANK, _VLLM_RANK):
            m = rx.search(body)
            if m:
                return int(m.group(1))
        m = _RECV_COUNT.search(body) if self.one_node else None
        if m:
            return int(m.group(1))
        m = _SGL_RANK.search(prefix + body)
        if m:
            ep = m.group(3) or m.group(5)
            tp = m.group(2) or m.group(4)
            return int(ep if ep is not None else tp if tp is not None else m.group(1))
        r = prefix_rank(prefix)
        if r is not None:
            return r
        m = _NCCL.match(body)
        if m:
            key = (m["host"], m["pid"])
            if key in self.by_pid:
                return self.by_pid[key]
            return self.host_index[m["host"]] * self.gpus_per_node + int(m["dev"])
        return None


def _count(req: Requirement, lines, ranks: RankMap, num_ranks: int, forbidden: bool) -> RequirementResult:
    rx = req.regex()
    per_rank: dict = defaultdict(int)
    examples = []
    for no, pre, body in lines:
        if rx.search(body):
            per_rank[ranks.rank(pre, body)] += 1
            if len(examples) < _MAX_LINES:
                examples.append(f"line {no}: {(pre + body)[:240]}")
    total = sum(per_rank.values())
    if forbidden:
        return RequirementResult(req.name, "none", dict(per_rank), total, [], total == 0, examples)
    missing = [r for r in range(num_ranks) if not per_rank.get(r)] if req.scope == "all" else []
    ok = total > 0 and not missing
    return RequirementResult(req.name, req.scope, dict(per_rank), total, missing, ok, examples)


def _ranges(ranks: list[int]) -> str:
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ", ".join(out)


def assert_backend(
    text: str, *, num_ranks: int, gpus_per_node: int, required: list[Requirement], forbidden: list[Requirement]
) -> ServeLogReport:
    """Check a serving log (one node's or several nodes' concatenated) against the backend assertion.

    num_ranks: EP size (ranks 0..num_ranks-1 must each print every `scope: all` line); gpus_per_node: for NCCL
    prefix attribution. Never raises on log content; a bad regex raises re.error (the spec loader checks them).
    """
    lines = numbered_lines(text)
    ranks = RankMap(lines, gpus_per_node, one_node=num_ranks <= gpus_per_node)
    req = [_count(r, lines, ranks, num_ranks, False) for r in required]
    forb = [_count(r, lines, ranks, num_ranks, True) for r in forbidden]
    problems = []
    for r in req:
        if r.total == 0:
            problems.append(f"required `{r.name}`: no line in the server log")
        elif r.missing_ranks:
            problems.append(
                f"required `{r.name}`: ranks {_ranges(r.missing_ranks)} missing "
                f"({num_ranks - len(r.missing_ranks)} of {num_ranks} ranks printed it)"
            )
    for f in forb:
        if f.total:
            problems.append(f"forbidden `{f.name}`: {f.total} line(s), first {f.examples[0]}")
    symptoms, first_dead, death = _deaths(lines, ranks)
    return ServeLogReport(num_ranks, req, forb, problems, symptoms, first_dead, death)


def _deaths(lines, ranks: RankMap) -> tuple[list[str], int | None, str | None]:
    """(symptom lines, first dead rank, how we know). See the module doc."""
    symptoms, waited_on = [], defaultdict(int)
    first = None
    for no, pre, body in lines:
        kind = evidence_kind(body)
        if kind is None:
            continue
        if kind in _SYMPTOM_KINDS:
            if len(symptoms) < _MAX_LINES:
                symptoms.append(f"line {no}: {(pre + body)[:240]}")
            g = _GIN.search(body)
            if g:
                waited_on[int(g.group(4))] += 1
            continue
        if kind in _DEATH_KINDS and first is None:
            r = ranks.rank(pre, body)
            if r is not None:
                first = (r, f"line {no}: {kind}: {(pre + body)[:240]}")
    if first:
        return symptoms, first[0], first[1]
    if waited_on:
        peers = sorted(waited_on, key=lambda p: (-waited_on[p], p))
        return (
            symptoms,
            peers[0],
            (
                f"no rank printed its own death; DeepEP Gin barrier waiters wait on peer(s) "
                f"{_ranges(sorted(waited_on))} (`thread:` field), most often {peers[0]}"
            ),
        )
    return symptoms, None, None
