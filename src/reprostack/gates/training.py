"""Gate 5 (megatron): lock -> sources (Megatron-LM tree, NCCL, DeepEP) -> kernels -> one training run per arm
-> parsed steps -> checks and bars -> report.

Each arm runs the driver under torchrun with the same seed; the DeepEP arm in the one-NCCL overlay of the
pinned NCCL + DeepEP build (kernels/), the comparison arm in the same environment, so the arms differ only
in Megatron's token dispatcher. The gate passes only on measured evidence: every step of every arm logged,
finite, every structural check (DeepEP's active buffer is `ElasticBuffer`, the only NCCL mapped is the
pinned one, both arms started from the same weights) and every bar of the profile met. No GPU (or too few,
or no EFA where the profile needs it, or no profile fits the host) -> SKIP with the reason, after sources were
fetched and verified. Only the comparison arm run (`--arm alltoall`) -> never a PASS (SKIP naming why).
An arm that crashes or times out -> ERROR naming that arm's classified failure; the other arm's checks are
still reported and stand on their own. In container mode (`--kernels-manifest`, the image's kernels manifest) the
Megatron-LM tree and the kernels are the image's, checked against the lock (gates.kernelprep.source_trees): nothing
fetched or built.

One NCCL (issue 29): besides the check process after the kernel setup, each arm's ranks are read while they run (the
watchdog hands the run's pids to launch.procmaps every second): every process that maps NCCL maps only the pinned
build, none deleted since; an arm's environment that would load another NCCL first is refused before it starts.

The run executes its own launch plan (MegatronGate.plan_parts with this host's paths): each arm's torchrun command
for this node, with that arm's env.

Its judge (each arm's checks, per-step statistics, the cross-arm agreement) is evidence.judge.megatron; what
verify-report re-derives of its reports is evidence.rederive.megatron.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import ui
from ..errors import ReprostackError
from ..kernels import ncclwheel, runtime
from ..kernels.prebuilt import Prebuilt
from ..launch import plan as lp
from ..launch import rendezvous
from ..launch import procmaps, torchrun
from ..launch.watchdog import run_with_watchdog
from ..report import GateReport, artifact_for, decide, require_deepep_arm
from ..sources import SourceTree
from .base import Gate, Paths, PlanParts, RunState, env_tuple, verdict
from ..evidence.kind import Evidence
from ..evidence.judge.megatron import arm_checks, cross_arm, cross_checks, step_statistics, transport_evidence
from ..evidence.rederive.megatron import rederive_megatron
from .kernelprep import Kernels, provenance, setup_kernels, source_trees
from .kerneluse import KernelUse, built_from
from .launcher import Launcher, per_arm
from .options import GateOptions
from .parsers.failure import FailureClass, classify_failure
from .parsers.training import parse_megatron
from .spec import Profile
from .state import KindState
from .training_spec import TrainingBar, TrainingSpec, load_training_spec


@dataclass
class MegatronState(KindState):
    """What the megatron gate keeps between its stages: the verified trees by pin and the image's checked manifest
    (sources); the arms' base environment, why the kernels could not be set up (the DeepEP arms then do not run; the
    comparison arm still does) and the kernels when they were (prepare)."""

    trees: dict[str, SourceTree] = field(default_factory=dict)
    pre: Prebuilt | None = None  # the image's kernels manifest, checked against the lock (container mode)
    base_env: dict[str, str] = field(default_factory=dict)
    setup_error: str | None = None
    kern: Kernels | None = None


TrainingRun = RunState[TrainingSpec, Profile[TrainingBar]]  # one run of a training gate


class MegatronGate(Gate[TrainingSpec, Profile[TrainingBar]]):
    """Gate 5: a Megatron-LM training run per arm over DeepEP and over Megatron's all-to-all (module doc)."""

    kind = "training"
    state = MegatronState
    kernels = KernelUse(takes_prebuilt=True, describe=built_from(source=True))
    launcher = Launcher(count=per_arm)
    evidence = Evidence(from_logs=rederive_megatron)

    def load(self, root: Path) -> TrainingSpec:
        return load_training_spec(root, self.stem)

    def plan_parts(
        self, spec: TrainingSpec, profile: Profile[TrainingBar], opts: GateOptions, paths: Paths
    ) -> PlanParts:
        """Every arm's torchrun command per node (the same driver, the arm's args and env); `commands` and `env`
        are the DeepEP arm's."""
        nodes = opts.nodes or profile.nodes
        addr, port = paths.rendezvous(nodes)
        arms = []
        for name, a in spec.arms.items():
            role = "deepep" if a.deepep else "reference" if name == spec.reference_arm else "comparison"
            args = [*spec.args, *a.args, *profile.args]
            cmds = []
            for node in range(nodes):
                launch = torchrun.torchrun_workers(
                    paths.python,
                    f"{paths.work}/{spec.driver}",
                    args,
                    gpus=profile.gpus_per_node,
                    nodes=nodes,
                    node_rank=node,
                    master_addr=addr,
                    master_port=port,
                )
                cmds.append(
                    lp.NodeCommand(node, "leader" if node == 0 else "worker", tuple(launch.argv), env_tuple(launch.env))
                )
            arms.append(lp.ArmPlan(name, role, tuple(cmds), env_tuple(spec.env, profile.env, a.env)))
        first = next((a for a in arms if a.role == "deepep"), arms[0])
        return PlanParts(first.commands, first.env, paths.work, (), tuple(arms))

    # ------------------------------------------------------------------ the staged run

    def check_request(self, st: TrainingRun) -> None:
        super().check_request(st)
        unknown = [a for a in st.opts.arms if a not in st.spec.arms]
        if unknown:
            raise ReprostackError(f"{st.spec.path}: no arm {unknown[0]!r} (known: {', '.join(st.spec.arms)})")

    def sources(self, st: TrainingRun) -> None:
        t = time.monotonic()
        # container mode (--kernels-manifest): the image's trees and kernels, its manifest checked against the lock
        trees, pre = source_trees(st.opts, st.ctx, (st.spec.source, *st.spec.kernels))
        st.timed("sources_s", t)
        own = MegatronState.of(st)
        own.trees, own.pre = trees, pre
        st.prov = provenance(st.ctx.lock, st.spec, trees)
        st.prov["host"] = st.host
        st.data.update(timings_s=st.timings, arms={})

    def skip(self, st: TrainingRun, what: str = "") -> GateReport | None:
        tree = MegatronState.of(st).trees[st.spec.source].tree
        return super().skip(st, f"sources verified ({st.spec.source} {tree[:12]}); kernels and training not run")

    def prepare(self, st: TrainingRun) -> GateReport | None:
        own = MegatronState.of(st)
        run_dir = st.out_dir / self.stem
        run_dir.mkdir(parents=True, exist_ok=True)
        base, own.setup_error = {**os.environ, "PYTHONPATH": ""}, None
        try:
            t = time.monotonic()
            base = self._kernels(st)
            st.timed("kernels_s", t)
            st.host["nccl_runtime"] = st.data["nccl"]["runtime"]
        except ReprostackError as e:  # the DeepEP arm cannot run; the comparison arm still does
            own.setup_error = f"setup: {e}"
        tree = str(own.trees[st.spec.source].path)
        base["PYTHONPATH"] = os.pathsep.join(p for p in (base.get("PYTHONPATH"), tree) if p)
        own.base_env = base
        return None

    def _kernels(self, st: TrainingRun) -> dict:
        """Build NCCL + DeepEP (cached), or take the image's (container mode), and return the environment with
        exactly one NCCL. Raises ReprostackError (BuildError) when a build or the one-NCCL check fails."""
        early = {**os.environ, **st.spec.env, **st.profile.env}  # before the builds: another release loaded first
        runtime.refuse(runtime.shadows_by_version(early, ncclwheel.pinned_version(st.ctx.lock)))
        own = MegatronState.of(st)
        own.kern = kern = setup_kernels(st.opts, st.ctx, own.trees, st.prov, st.timings, own.pre)
        env = dict(kern.env)
        one = runtime.check_one_nccl(
            st.opts.python, env, kern.nccl_lib, accept_sha256=kern.accept_sha256, pinned_version=kern.nccl_version
        )
        st.data["nccl"] = {
            "runtime": one["runtime"],
            "mapped": one["mapped"],
            "torch_built_with": one["torch_built_with"],
            "pinned": kern.nccl_version,
        }
        env["EP_JIT_CACHE_DIR"] = str(kern.jit_dir)
        return env

    def launch_and_judge(self, st: TrainingRun) -> GateReport:
        spec, profile, opts, own = st.spec, st.profile, st.opts, MegatronState.of(st)
        torchrun.need_master(profile.name, opts.nodes or profile.nodes, opts.master_addr, opts.master_port)
        paths = Paths.host(root=st.ctx.root, out=st.out_dir, cache=st.ctx.cache_root, python=opts.python, opts=opts)
        parts = self.plan_parts(spec, profile, opts, paths)
        results, checks, failures, ran = {}, [], [], []
        for plan in parts.arms:
            name, arm = plan.name, spec.arms[plan.name]
            if opts.arms and name not in opts.arms:
                continue
            if arm.deepep and own.setup_error:
                failures.append(f"{name} arm: {own.setup_error}")
                st.data["arms"][name] = {"failure": {"kind": "setup", "detail": own.setup_error}}
                continue
            t = time.monotonic()
            ran.append((plan, self._launch_arm(st, plan)))
            st.timed(f"{name}_s", t)
        if not st.reporter:  # a worker: its ranks of every arm ran; node 0 parses every node's logs
            bad = [
                blocked.detail if o is None else f"{p.name} exit {o.returncode}"
                for p, (o, _, _, _, blocked) in ran
                if o is None or o.returncode != 0 or o.timed_out
            ]
            what = f"ran its ranks of arm(s) {', '.join(p.name for p, _ in ran) or 'none'}"
            return st.worker_done(
                what + (f" ({'; '.join(bad)})" if bad else ""), not bad, [st.rank_log(p.name) for p, _ in ran]
            )
        why = None
        if st.outputs.nodes > 1:  # every node's rc and rank logs, bounded wait
            why, st.data["nodes"] = rendezvous.gather(st.node_run, [p.name for p, _ in ran], st.profile.nodes)
        if why:  # never a verdict on fewer ranks than the profile has
            st.artifacts.extend(
                artifact_for(x, relative_to=st.out_dir) for p, _ in ran for x in st.rank_logs(p.name) if x.is_file()
            )
            rep = st.error(why)
            rep.artifacts = st.artifacts
            return rep
        for plan, launched in ran:
            name = plan.name
            res = self._parse_arm(st, plan, *launched)
            entry = st.data["arms"][name] = self._entry(st, res)
            if "failure" in res:
                fc = res["failure"]
                entry["failure"] = fc.to_dict()
                failures.append(f"{name} arm: {fc.line()}")
                continue
            results[name] = res
            checks += arm_checks(spec, profile, name, res["parse"], entry, st.data.get("nccl"))
            st.data.setdefault("statistics", {}).update(step_statistics(name, res["parse"]))
        checks += cross_checks(spec, profile, results)
        cross = cross_arm(spec, results)
        if cross is not None:  # reported with or without a bar naming it
            st.data["cross_arm"] = cross
        return self._verdict(st, results, checks, failures)

    def _launch_arm(self, st: TrainingRun, plan: lp.ArmPlan):
        """Start one arm (its plan command for this node) under the watchdog. Returns (outcome, command, env)."""
        spec, profile, opts = st.spec, st.profile, st.opts
        cmd = next(c for c in plan.commands if str(c.node) == str(opts.node_rank))
        own = MegatronState.of(st)
        env = {**own.base_env, **dict(plan.env), **dict(cmd.env)}
        log = st.rank_log(plan.name)  # the output contract: one log per node, node 0 reads them all
        kern, seen = own.kern, {}
        if kern is not None:  # the arm's own environment too (its spec env may add loader variables)
            found = runtime.shadows(env, kern.nccl_lib, kern.nccl_version, accept_sha256=kern.accept_sha256)
            if found:
                why = "one-NCCL preflight (nothing was started): " + "; ".join(found[:4])
                return None, cmd, env, seen, FailureClass("one_nccl", None, why)
        with ui.step(f"{spec.gate} {plan.name} [{profile.name}]", log=log):
            outcome = run_with_watchdog(
                list(cmd.argv),
                env=env,
                cwd=str(st.out_dir),
                log_path=log,
                timeout_s=st.timeout_s,
                echo=False,
                watch=lambda pids: runtime.merge_samples(seen, procmaps.sample(pids)),
            )
        return outcome, cmd, env, seen, None

    def _parse_arm(self, st: TrainingRun, plan: lp.ArmPlan, outcome, cmd, env, seen, blocked) -> dict:
        """Every node's log of one arm, parsed. Returns {"parse", "outcome", "failure"?, "log", "command", "env"}."""
        spec, profile, kern = st.spec, st.profile, MegatronState.of(st).kern
        keys = {*spec.env, *profile.env, *spec.arms[plan.name].env, "PYTHONPATH"}
        res = {
            "command": list(cmd.argv),
            "log": st.rank_log(plan.name).name,
            "env": {k: env[k] for k in sorted(keys) if k in env},
        }
        if blocked is not None:  # the one-NCCL preflight stopped it before it started
            res.update(parse=parse_megatron("", expected_steps=spec.steps), outcome=None, failure=blocked)
            return res
        logs = [p for p in st.rank_logs(plan.name) if p.is_file()]
        text = "\n".join(p.read_text(errors="replace") for p in logs)
        parsed = parse_megatron(text, expected_steps=spec.steps)
        st.artifacts.extend(artifact_for(p, relative_to=st.out_dir) for p in logs)
        res.update(parse=parsed, outcome=outcome)
        if not parsed.complete:
            res["failure"] = classify_failure(text, outcome.returncode, outcome.timed_out)
        elif kern is not None:  # every rank's maps, read while it ran: the pinned NCCL only (fail closed)
            try:
                res["nccl_ranks"] = runtime.judge_processes(
                    seen,
                    f"arm {plan.name}'s ranks",
                    nccl_lib=kern.nccl_lib,
                    accept_sha256=kern.accept_sha256,
                    pinned_version=kern.nccl_version,
                )
            except ReprostackError as e:
                res["failure"] = FailureClass("one_nccl", None, f"one-NCCL check of the ranks: {e}")
        return res

    @staticmethod
    def _entry(st: TrainingRun, res: dict) -> dict:
        return {
            "command": res["command"],
            "log": res["log"],
            "env": res["env"],
            "returncode": res["outcome"].returncode if res["outcome"] else None,
            "timed_out": res["outcome"].timed_out if res["outcome"] else False,
            "transport_evidence": transport_evidence(res["parse"], st.host),
            "parse": res["parse"].to_dict(),
        }

    def _verdict(self, st: TrainingRun, results: dict, checks: list, failures: list) -> GateReport:
        if failures:
            stood = list(results)
            done = sum(c.passed for c in checks)
            why = "; ".join(failures) + (
                f" — completed arm(s) {', '.join(stood)}: {done}/{len(checks)} check(s) passed" if stood else ""
            )
            result, reason = decide(checks, ran_ok=False, failure_reason=why)
        else:  # a profile without a measured bar never passes (gates.base.verdict)
            result, reason = verdict(st.profile, checks, st.spec.path.name)
        result, reason = require_deepep_arm(result, reason, st.spec.deepep_arm, list(results))
        return GateReport(
            self.stem, st.profile.name, result, reason, checks=checks, provenance=st.prov, artifacts=st.artifacts
        )
