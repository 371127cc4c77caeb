"""Gate 6 (nemo_rl): NeMo-RL GRPO from the pinned tree -> rollout smoke + a few training steps -> report.

The command of gates/nemo_rl.yaml runs on the head node of a Ray cluster (2 nodes x 8 GPUs, the NeMo-RL
image, the model's weights), inside the pinned NeMo-RL tree. Rollout smoke: step 1's rollout returned
(a `generation` timing and a mean generation length > 0; its line is the pass line), duration = that
`generation` time. Training: every step's loss logged and finite, and the profile's bars; on an EFA profile
`transport` (gates.transport): every policy rank on `NET/OFI efa` with GIN on, from the NCCL INFO lines the Ray
workers' output carries into the head's log (a rank on Socket, a second plugin, GIN off: FAIL naming the rank). Without the
hardware the gate is a SKIP with the reason (never a pass); the parser is tested on logs. The run executes its
own launch plan (NemoRLGate.plan_parts with this host's paths): the head node's command.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .. import sources
from ..launch import plan as lp
from ..launch import rendezvous
from ..launch.watchdog import run_with_watchdog
from ..report import GateReport, artifact_for, decide, evaluate
from . import transport
from .base import Gate, Paths, PlanParts, RunState, env_tuple
from .kernelprep import provenance
from .options import GateOptions
from .parsers.failure import classify_failure
from .parsers.training import loss_metrics, parse_nemo_rl
from .parsers.transport import parse_transport
from .spec import Profile
from .state import KindState
from .training_spec import TrainingBar, TrainingSpec, load_training_spec


@dataclass
class NemoRLState(KindState):
    """What the nemo-rl gate keeps between its stages: the verified NeMo-RL tree (sources)."""

    tree: sources.SourceTree | None = None


NemoRLRun = RunState[TrainingSpec, Profile[TrainingBar]]  # one run of the NeMo-RL gate


class NemoRLGate(Gate[TrainingSpec, Profile[TrainingBar]]):
    """Gate 6: NeMo-RL's GRPO on a Ray cluster (module doc)."""

    kind = "nemo-rl"
    state = NemoRLState

    def load(self, root: Path) -> TrainingSpec:
        return load_training_spec(root, self.stem)

    def plan_parts(
        self, spec: TrainingSpec, profile: Profile[TrainingBar], opts: GateOptions, paths: Paths
    ) -> PlanParts:
        """The command on the Ray head (node 0); the other nodes join the Ray cluster."""
        head, _ = paths.rendezvous(profile.nodes)
        cmds = []
        for node in range(profile.nodes):
            argv = (
                [paths.python, *spec.command, *profile.args]
                if node == 0
                else ["ray", "start", "--block", f"--address={head}:6379"]
            )
            cmds.append(lp.NodeCommand(node, "leader" if node == 0 else "worker", tuple(argv)))
        env = env_tuple(spec.env, profile.env)
        return PlanParts(tuple(cmds), env, paths.source(spec.source), (), ())

    def sources(self, st: NemoRLRun) -> None:
        tree = sources.prepare(st.ctx.lock, st.spec.source, st.ctx.fetch, st.ctx.root)
        NemoRLState.of(st).tree = tree
        st.prov = provenance(st.ctx.lock, st.spec, {st.spec.source: tree})
        st.prov["host"] = st.host

    def skip(self, st: NemoRLRun, what: str = "") -> GateReport | None:
        done = (
            f"NeMo-RL {NemoRLState.of(st).tree.tree[:12]} verified; GRPO needs "
            f"a Ray cluster of 2 nodes x 8 GPUs with EFA, the NeMo-RL image and the model"
        )
        return super().skip(st, done)

    def launch_and_judge(self, st: NemoRLRun) -> GateReport:
        tree = NemoRLState.of(st).tree
        paths = Paths.host(
            root=st.ctx.root,
            out=st.out_dir,
            cache=st.ctx.cache_root,
            python=st.opts.python,
            trees={st.spec.source: tree},
            opts=st.opts,
        )
        parts = self.plan_parts(st.spec, st.profile, st.opts, paths)
        cmd = next(c for c in parts.commands if str(c.node) == str(st.opts.node_rank))
        env = {**os.environ, **dict(parts.env)}
        if not st.reporter:  # a Ray worker node: joins the head until node 0 is done (output contract)
            log = st.rank_log("ray")
            ok, what = rendezvous.serve_until_done(st.node_run, list(cmd.argv), env, parts.workdir, log, st.timeout_s)
            return st.worker_done(f"Ray worker: {what}", ok, [log])
        log = st.rank_log("grpo")
        outcome = run_with_watchdog(
            list(cmd.argv),
            env=env,
            cwd=parts.workdir,
            log_path=log,
            timeout_s=st.timeout_s,
        )
        if st.outputs.nodes > 1:  # the Ray workers leave; then every node's rc (output contract)
            rendezvous.mark_done(st.node_run)
            why, st.data["nodes"] = rendezvous.gather(st.node_run, ["ray"], st.profile.nodes)
            if why:
                rep = st.error(why)
                rep.artifacts = [artifact_for(log, relative_to=st.out_dir)]
                return rep
        text = log.read_text(errors="replace")
        parsed = parse_nemo_rl(text, expected_steps=st.spec.steps)
        st.data.update(
            command=list(cmd.argv), returncode=outcome.returncode, timed_out=outcome.timed_out, parse=parsed.to_dict()
        )
        st.artifacts.append(artifact_for(log, relative_to=st.out_dir))
        name = st.profile.name
        if not parsed.complete:
            fc = classify_failure(text, outcome.returncode, outcome.timed_out)
            st.data["failure"] = fc.to_dict()
            result, reason = decide([], ran_ok=False, failure_reason=fc.line())
            return GateReport(self.stem, name, result, reason, provenance=st.prov, artifacts=st.artifacts)
        checks, st.data["metrics"] = nemo_rl_checks(st.spec, st.profile, parsed)
        result, reason = decide(checks, ran_ok=True)
        return GateReport(self.stem, name, result, reason, checks=checks, provenance=st.prov, artifacts=st.artifacts)


def rollout_metrics(parsed) -> dict:
    """`rollout_s` (s) and `rollout_gen_len` (tokens) of step 1, `rollout_line` (the pass line), from the parse."""
    first = next((s for s in parsed.steps if s.step == 1), None)
    if first is None:
        return {"rollout_s": None, "rollout_gen_len": None, "rollout_line": None}
    return {"rollout_s": first.rollout_s, "rollout_gen_len": first.gen_len, "rollout_line": first.line}


def nemo_rl_checks(spec: TrainingSpec, profile: Profile[TrainingBar], parsed) -> tuple[list, dict]:
    """(checks, metrics) of a completed run: steps complete, finite losses, then the profile's bars."""
    m = {**loss_metrics(parsed), **rollout_metrics(parsed)}
    checks = [
        evaluate("steps_problems", "lines", len(parsed.problems), "==", 0, note="; ".join(parsed.problems) or None),
        evaluate("nonfinite", "values", m["nonfinite"], "==", 0, note="loss of every step"),
    ]
    checks += rank_transport(spec, profile, parsed, m)
    for bar in profile.bars:
        checks.append(evaluate(bar.metric, bar.unit, m.get(bar.metric), bar.op, bar.threshold, note=bar.source))
    return checks, m


def rank_transport(spec: TrainingSpec, profile: Profile[TrainingBar], parsed, m: dict) -> list:
    """The transport proof per rank (gates.transport) on an EFA profile: every policy rank (nodes x GPUs per node:
    the widest NCCL communicator of the log) on `NET/OFI efa` with GIN on (the policy runs DeepEP,
    moe_enable_deepep, when the env turns GIN on); `m["transport"]` holds what each rank showed, or why no
    network is checked."""
    need = transport.need(profile, {**spec.env, **profile.env}, gin=True)
    if need is None:
        m["transport"] = {"checked": False, "why": transport.no_network(profile)}
        return []
    parsed_t = parsed.rank_transports or parse_transport("")
    m["transport"] = {"checked": True, "need": need.to_dict(), **parsed_t.to_dict()}
    return [transport.check("transport", need, parsed_t, where="the GRPO run's ranks")]
