"""Parse training logs into per-step records: our Megatron MoE driver (gate 5) and NeMo-RL GRPO (gate 6).

Megatron driver (gates/drivers/megatron_moe.py; its docstring is the format's contract), lines tagged
`[megatron-moe]`, launcher prefixes (`[rank0]: `, timestamps) ignored:
  `step 2/3 | loss 8.901234 | grad_norm 1.234 | tokens/s 52000.1 | step_ms 78.8`,
  `buffer: ElasticBuffer module=deep_ep.buffers.elastic ...`, `dispatcher: ...`, `init_checksum: 1.2e+03`,
  `transport: node=0 efa_tx_bytes=123 source=hw_counters devices=16` or `transport: node=0 no EFA device`,
  `done: 3 steps`. Provider evidence: NCCL's OFI plugin `Selected provider is efa` (NCCL_DEBUG=INFO); per rank
  (`rank_transports`, both parsers): the NCCL INFO lines read by gates.parsers.transport, each process's rank
  from NCCL's init lines of the widest communicator (Megatron's TP/EP/DP sub-groups are not the global ranks).
NeMo-RL GRPO (nemo_rl/algorithms/grpo.py at v0.7.0, read there; nothing copied): per step a banner
  `===== Step 2/3 =====`, then `• Loss: 0.1234`, `• Avg Reward: 0.5`, `• Mean Generation Length: 312.0`,
  `• Total step time: 41.20s` and one `• <timer>: 12.34s (30.0%)` line per timer (`generation` = rollout).

Never raises on log content: what is wrong is listed in `problems` (with line numbers).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

from .logtext import numbered_lines
from .transport import TransportParse, parse_transport

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)"
_TAG = "[megatron-moe]"
_MSTEP = re.compile(
    rf"step (?P<i>\d+)/(?P<n>\d+) \| loss (?P<loss>{_NUM}) \| grad_norm (?P<gn>{_NUM}) \| "
    rf"tokens/s (?P<tps>{_NUM}) \| step_ms (?P<ms>{_NUM})",
    re.I,
)
_BUFFER = re.compile(r"buffer: (?P<cls>\w+) module=(?P<mod>\S+)")
_DISPATCHER = re.compile(r"dispatcher: (?P<text>.+)$")
_CHECKSUM = re.compile(rf"init_checksum: (?P<v>{_NUM})", re.I)
_CONFIG = re.compile(r"config: (?P<kv>.+)$")
_TX = re.compile(r"transport: node=(?P<node>\d+) efa_tx_bytes=(?P<b>-?\d+) source=(?P<src>\S+)")
_NO_EFA = re.compile(r"transport: node=(?P<node>\d+) (?P<what>no EFA device|efa devices=\d+ no hw_counters\S*)")
_DONE = re.compile(r"done: (?P<n>\d+) steps")
_PROVIDER = re.compile(r"Selected provider is (?P<p>\w+)")
_RSTEP = re.compile(r"={3,} Step (?P<i>\d+)/(?P<n>\d+) ={3,}")
_RLOSS = re.compile(rf"•\s*Loss: (?P<v>{_NUM})", re.I)
_RREWARD = re.compile(rf"•\s*Avg (?:Total )?Reward: (?P<v>{_NUM})", re.I)
_RGENLEN = re.compile(rf"•\s*Mean Generation Length: (?P<v>{_NUM})", re.I)
_RTOTAL = re.compile(rf"•\s*Total step time: (?P<v>{_NUM})s", re.I)
_RGEN = re.compile(rf"•\s*generation: (?P<v>{_NUM})s", re.I)


@dataclass
class Step:
    """One logged step: `loss` (mean over ranks), `grad_norm` (global L2), `tokens_per_s` (all ranks),
    `step_ms` (wall ms), NeMo-RL: `step_s` total step time (s), `rollout_s` generation time (s),
    `gen_len` mean generation length (tokens), `reward`; `line` = 1-based log line of the step's loss."""

    step: int
    loss: float
    line: int
    grad_norm: float | None = None
    tokens_per_s: float | None = None
    step_ms: float | None = None
    step_s: float | None = None
    rollout_s: float | None = None
    gen_len: float | None = None
    reward: float | None = None


@dataclass
class TrainingParse:
    """A parsed log. `complete`: steps 1..expected all present and the run said it finished;
    `problems`: every anomaly (missing/duplicate steps, non-finite numbers, no end line)."""

    __test__ = False

    expected_steps: int
    steps: list[Step] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    dispatcher: str | None = None
    buffer_class: str | None = None
    buffer_module: str | None = None
    init_checksum: float | None = None
    efa_tx_bytes: int | None = None
    transport: list[str] = field(default_factory=list)
    providers: list[str] = field(default_factory=list)
    rank_transports: TransportParse | None = None
    finished: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every expected step was logged, and the run's end line was seen."""
        return self.finished and [s.step for s in self.steps] == list(range(1, self.expected_steps + 1))

    @property
    def losses(self) -> list[float]:
        return [s.loss for s in self.steps]

    def to_dict(self) -> dict:
        """JSON-ready (non-finite floats are turned into strings by the report writer)."""
        d = asdict(self)
        d["complete"] = self.complete
        return d


def _f(text: str) -> float:
    return float(text)


def _check_steps(p: TrainingParse, seen: dict[int, int], n_announced: set[int]) -> None:
    for n in sorted(n_announced):
        if n != p.expected_steps:
            p.problems.append(f"the log announces {n} steps, the gate expects {p.expected_steps}")
    got = {s.step for s in p.steps}
    missing = [i for i in range(1, p.expected_steps + 1) if i not in got]
    if missing:
        p.problems.append(f"step(s) {', '.join(map(str, missing))} of {p.expected_steps} missing")
    for s in p.steps:
        for name in ("loss", "grad_norm", "tokens_per_s", "step_s", "rollout_s"):
            v = getattr(s, name)
            if v is not None and not math.isfinite(v):
                p.problems.append(f"line {s.line}: step {s.step}: {name} is {v}")
    p.steps.sort(key=lambda s: s.step)


def parse_megatron(text: str, *, expected_steps: int) -> TrainingParse:
    """Parse one arm's log of gates/drivers/megatron_moe.py (see module doc). Raises ValueError only for
    expected_steps < 1."""
    if expected_steps < 1:
        raise ValueError(f"expected_steps must be >= 1, not {expected_steps}")
    p, seen, announced = TrainingParse(expected_steps), {}, set()
    tx: dict[int, int] = {}
    for no, _pre, body in numbered_lines(text):
        m = _PROVIDER.search(body)
        if m and m.group("p") not in p.providers:
            p.providers.append(m.group("p"))
        if _TAG not in body:
            continue
        body = body[body.index(_TAG) + len(_TAG) :].strip()
        if m := _MSTEP.match(body):
            i = int(m["i"])
            announced.add(int(m["n"]))
            if i in seen:
                p.problems.append(f"line {no}: step {i} logged again (first at line {seen[i]})")
                continue
            seen[i] = no
            p.steps.append(
                Step(i, _f(m["loss"]), no, grad_norm=_f(m["gn"]), tokens_per_s=_f(m["tps"]), step_ms=_f(m["ms"]))
            )
        elif m := _BUFFER.match(body):
            p.buffer_class, p.buffer_module = m["cls"], m["mod"]
        elif m := _DISPATCHER.match(body):
            p.dispatcher = m["text"].strip()
        elif m := _CHECKSUM.match(body):
            p.init_checksum = _f(m["v"])
        elif m := _CONFIG.match(body):
            p.config = dict(kv.split("=", 1) for kv in m["kv"].split() if "=" in kv)
        elif m := _TX.match(body):
            tx[int(m["node"])] = int(m["b"])
            p.transport.append(f"node {m['node']}: {m['b']} bytes ({m['src']})")
        elif m := _NO_EFA.match(body):
            p.transport.append(f"node {m['node']}: {m['what']}")
        elif _DONE.match(body):
            p.finished = True
    p.efa_tx_bytes = sum(tx.values()) if tx else None
    p.rank_transports = parse_transport(text)
    _check_steps(p, seen, announced)
    if not p.finished:
        p.problems.append("no `done:` line: the run did not finish")
    return p


def parse_nemo_rl(text: str, *, expected_steps: int) -> TrainingParse:
    """Parse NeMo-RL GRPO output (see module doc): one Step per `Step i/N` banner that has a Loss line.
    `finished` = the last expected step printed its `Total step time`. Raises ValueError for expected_steps < 1."""
    if expected_steps < 1:
        raise ValueError(f"expected_steps must be >= 1, not {expected_steps}")
    p, seen, announced = TrainingParse(expected_steps), {}, set()
    cur: Step | None = None
    current_i: int | None = None
    for no, _pre, body in numbered_lines(text):
        if m := _RSTEP.search(body):
            current_i, cur = int(m["i"]), None
            announced.add(int(m["n"]))
            continue
        if current_i is None:
            continue
        if m := _RLOSS.search(body):
            if current_i in seen:
                p.problems.append(f"line {no}: step {current_i} logged again (first at line {seen[current_i]})")
                continue
            seen[current_i] = no
            cur = Step(current_i, _f(m["v"]), no)
            p.steps.append(cur)
        elif cur is None:
            continue
        elif m := _RREWARD.search(body):
            cur.reward = _f(m["v"])
        elif m := _RGENLEN.search(body):
            cur.gen_len = _f(m["v"])
        elif m := _RTOTAL.search(body):
            cur.step_s = _f(m["v"])
            if cur.step == expected_steps:
                p.finished = True
        elif m := _RGEN.search(body):
            cur.rollout_s = _f(m["v"])
    p.rank_transports = parse_transport(text)
    _check_steps(p, seen, announced)
    if not p.finished:
        p.problems.append(f"no `Total step time` for step {expected_steps}: the run did not finish")
    return p


def loss_metrics(p: TrainingParse) -> dict:
    """Metrics the bars name, from the parsed steps (None where there is nothing to measure):
    loss_first/loss_last; loss_drop = first - last; loss_increases = steps whose loss is >= the previous
    one; grad_norm_min; nonfinite = count of non-finite loss/grad_norm values; tokens_per_s = median over
    steps after the first (the first includes JIT builds; the only step when there is one)."""
    losses = p.losses
    gns = [s.grad_norm for s in p.steps if s.grad_norm is not None]
    tps = [s.tokens_per_s for s in p.steps if s.tokens_per_s is not None]
    tps = sorted(tps[1:] or tps)
    finite = [x for x in losses if math.isfinite(x)]
    return {
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "loss_drop": (losses[0] - losses[-1]) if len(losses) >= 2 and len(finite) == len(losses) else None,
        "loss_increases": (sum(1 for a, b in zip(losses, losses[1:]) if not b < a) if len(losses) >= 2 else None),
        "grad_norm_min": min(gns) if gns and all(math.isfinite(g) for g in gns) else (float("nan") if gns else None),
        "nonfinite": sum(1 for x in losses + gns if not math.isfinite(x)),
        "tokens_per_s": tps[len(tps) // 2] if tps else None,
    }


def rel_diff_max(a: list[float], b: list[float]) -> float | None:
    """max over steps of |a_i - b_i| / |b_i| (b = the comparison arm); None when the lists differ in length
    or are empty; NaN when a value is not finite."""
    if not a or len(a) != len(b):
        return None
    out = 0.0
    for x, y in zip(a, b):
        if not (math.isfinite(x) and math.isfinite(y)) or y == 0:
            return float("nan")
        out = max(out, abs(x - y) / abs(y))
    return out
