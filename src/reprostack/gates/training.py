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
"""

from __future__ import annotations

import math
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
from ..report import GateReport, artifact_for, decide, evaluate, require_deepep_arm
from ..sources import SourceTree
from . import transport
from .base import Gate, Paths, PlanParts, RunState, env_tuple, verdict
from .evidence import Evidence
from .kernelprep import Kernels, provenance, setup_kernels, source_trees
from .kerneluse import KernelUse, built_from
from .launcher import Launcher, per_arm
from .options import GateOptions
from .parsers.failure import FailureClass, classify_failure
from .parsers.training import loss_metrics, parse_megatron, rel_diff_max
from .parsers.transport import parse_transport
from .spec import Profile
from .state import KindState
from .training_spec import TrainingBar, TrainingSpec, load_training_spec

GB = 1e9  # the campaign's "EFA TX >= 1 GB": decimal gigabytes of hw_counters tx_bytes


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


def rederive_megatron(doc: dict, folder: Path, spec: dict | None, stem: str):
    """MegatronGate's re-derivation (gates.evidence): from each arm's kept log its steps (losses, grad norms), the
    structural checks, the loss metrics the bars name, the per-step statistics, and the arms' agreement; the bars from
    the recorded spec (each arm's, the DeepEP arm's for EFA TX, the cross-arm one once). The one-NCCL check ran in its
    own process: noted."""
    from ..report.rederive import begin, kept_logs, log_text

    data, prof, got = begin(doc, spec)
    arms = data.get("arms") if isinstance(data.get("arms"), dict) else {}
    spec_arms = (spec or {}).get("arms") if isinstance((spec or {}).get("arms"), dict) else {}
    deepep = next((n for n, a in spec_arms.items() if isinstance(a, dict) and a.get("deepep")), "deepep")
    ref = next((n for n, a in spec_arms.items() if isinstance(a, dict) and a.get("reference")), "alltoall")
    done = {}
    for name, entry in arms.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("parse"), dict):
            continue  # an arm that never started (setup failure): its report entry says why
        logs = kept_logs(doc, stem, lambda p, n=name: p == f"{stem}/{n}.log" or p.startswith(f"{stem}/{n}.node"))
        parsed = parse_megatron(
            log_text(folder, doc, stem, logs), expected_steps=int(entry["parse"].get("expected_steps") or 0)
        )
        rec = entry["parse"]
        got.fields.update(
            {
                f"data.arms.{name}.parse.complete": parsed.complete,
                f"data.arms.{name}.parse.problems": list(parsed.problems),
                f"data.arms.{name}.parse.init_checksum": parsed.init_checksum,
                f"data.arms.{name}.parse.buffer_class": parsed.buffer_class,
            }
        )
        if [s.get("loss") for s in rec.get("steps") or [] if isinstance(s, dict)] != parsed.losses:
            got.fields[f"data.arms.{name}.parse.steps"] = [s.__dict__ for s in parsed.steps]
        if "failure" in entry:
            continue  # its checks were not made (the verdict is an error naming it)
        done[name] = parsed
        m = loss_metrics(parsed)
        m["efa_tx_gb"] = None if parsed.efa_tx_bytes is None else parsed.efa_tx_bytes / GB
        got.values.update({f"{name}.{k}": v for k, v in m.items()})
        got.values[f"{name}.steps_problems"] = len(parsed.problems)
        if name == deepep:
            got.values[f"{name}.buffer_class"] = parsed.buffer_class
            got.notes.append(
                f"{name}.nccl_runtime: the one-NCCL check ran in its own process (data.nccl), not in the logs"
            )
        for k, s in step_statistics(name, parsed).items():
            got.figures[k] = s["samples"]
    if deepep in done and ref in done:
        a, b = done[deepep], done[ref]
        got.values["arms_init_checksum_equal"] = a.init_checksum == b.init_checksum and a.init_checksum is not None
        got.values["arms_loss_rel_diff_max"] = rel_diff_max(a.losses, b.losses)
    _bar_thresholds(got, prof, list(done), deepep, both=deepep in done and ref in done)
    return got


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


def step_statistics(arm: str, parsed) -> dict:
    """`data.statistics` entries from an arm's per-step figures (issue 16: a training run's steps are already
    repeated samples): `<arm>.step_ms` and `<arm>.tokens_per_s` over the steps after the first (step 1 carries
    set-up and JIT), when at least two such steps have the figure (report.stats; reported, no bar)."""
    from ..report.stats import statistics_block, summarize

    out = {}
    for field_, unit in (("step_ms", "ms"), ("tokens_per_s", "tokens/sec")):
        vals = [getattr(s, field_) for s in parsed.steps[1:]]
        if len(vals) >= 2 and all(v is not None and math.isfinite(v) for v in vals):
            out[f"{arm}.{field_}"] = summarize(vals, unit)
    return statistics_block(out)


def transport_evidence(parsed, host: dict) -> str:
    """Which transport evidence an arm has: `hw_counters` (EFA tx_bytes measured), `provider log lines`
    (NCCL OFI `Selected provider is efa` only), or `no EFA device`."""
    if parsed.efa_tx_bytes is not None:
        return "hw_counters"
    if "efa" in parsed.providers:
        return "provider log lines"
    return "no EFA device" if not host.get("efa_devices") else "none (EFA present, no counters, no provider line)"


def arm_checks(
    spec: TrainingSpec, profile: Profile[TrainingBar], name: str, parsed, data: dict, nccl: dict | None = None
) -> list:
    """Structural checks and the profile's per-arm bars for one completed arm (metric `<arm>.<metric>`), and on an
    EFA profile `<arm>.transport` (arm_transport). `data`: the arm's report entry (gets `metrics` and
    `transport`); `nccl`: the one-NCCL check of the kernel setup."""
    m = loss_metrics(parsed)
    m["efa_tx_gb"] = None if parsed.efa_tx_bytes is None else parsed.efa_tx_bytes / GB
    data["metrics"] = m
    checks = [
        evaluate(
            f"{name}.steps_problems", "lines", len(parsed.problems), "==", 0, note="; ".join(parsed.problems) or None
        ),
        evaluate(f"{name}.nonfinite", "values", m["nonfinite"], "==", 0, note="loss and grad_norm of every step"),
    ]
    if spec.arms[name].deepep:
        checks.append(
            evaluate(
                f"{name}.buffer_class",
                "",
                parsed.buffer_class,
                "==",
                "ElasticBuffer",
                note=f"fused_a2a._buffer after step 1 ({parsed.buffer_module}); never the legacy Buffer",
            )
        )
        nccl = nccl or {}
        checks.append(
            evaluate(
                f"{name}.nccl_runtime",
                "version",
                nccl.get("runtime"),
                "==",
                nccl.get("pinned") or "?",
                note=f"ncclGetVersion of the only NCCL mapped: {(nccl.get('mapped') or ['?'])[0]}",
            )
        )
    checks += arm_transport(spec, profile, name, parsed, data)
    for bar in profile.bars:
        if bar.metric == "arms_loss_rel_diff_max":
            continue
        default_arm = spec.deepep_arm if bar.metric == "efa_tx_gb" else None
        if (bar.arm or default_arm) not in (None, name):
            continue
        checks.append(
            evaluate(f"{name}.{bar.metric}", bar.unit, m.get(bar.metric), bar.op, bar.threshold, note=bar.source)
        )
    return checks


def arm_transport(spec: TrainingSpec, profile: Profile[TrainingBar], name: str, parsed, data: dict) -> list:
    """The transport proof per rank of one arm (gates.transport) on an EFA profile: every rank of the run on
    `NET/OFI efa`, and GIN on for the DeepEP arm when the arm's env turns it on (the all-to-all arm uses no GIN);
    a rank on Socket, a second plugin, or GIN off fails `<arm>.transport` naming it. No check without a network:
    `data["transport"]` says why."""
    env = {**spec.env, **profile.env, **spec.arms[name].env}
    need = transport.need(profile, env, gin=spec.arms[name].deepep)
    if need is None:
        data["transport"] = {"checked": False, "why": transport.no_network(profile)}
        return []
    parsed_t = parsed.rank_transports or parse_transport("")
    data["transport"] = {"checked": True, "need": need.to_dict(), **parsed_t.to_dict()}
    return [transport.check(f"{name}.transport", need, parsed_t, where=f"{name} arm")]


def cross_arm(spec: TrainingSpec, results: dict) -> dict | None:
    """The arms' agreement when both completed: the max over steps of the relative loss difference, reported by
    every run whether or not a bar judges it (None when an arm is missing)."""
    a, b = spec.deepep_arm, spec.reference_arm
    if not (a and b and a in results and b in results):
        return None
    return {
        "loss_rel_diff_max": rel_diff_max(results[a]["parse"].losses, results[b]["parse"].losses),
        "how": f"max over steps of |loss[{a}] - loss[{b}]| / loss[{b}]",
    }


def cross_checks(spec: TrainingSpec, profile: Profile[TrainingBar], results: dict) -> list:
    """Checks that compare the DeepEP arm with the reference arm (both must have completed)."""
    a, b = spec.deepep_arm, spec.reference_arm
    if not (a and b and a in results and b in results):
        return []
    pa, pb = results[a]["parse"], results[b]["parse"]
    checks = [
        evaluate(
            "arms_init_checksum_equal",
            "",
            pa.init_checksum == pb.init_checksum and pa.init_checksum is not None,
            "==",
            True,
            note=f"{a} {pa.init_checksum} vs {b} {pb.init_checksum}",
        )
    ]
    for bar in profile.bars:
        if bar.metric == "arms_loss_rel_diff_max":
            checks.append(
                evaluate(
                    bar.metric,
                    bar.unit,
                    rel_diff_max(pa.losses, pb.losses),
                    bar.op,
                    bar.threshold,
                    note=f"max over steps of |loss[{a}] - loss[{b}]| / loss[{b}]; {bar.source}",
                )
            )
    return checks


def _bar_thresholds(got, prof: dict | None, done: list[str], deepep: str, both: bool) -> None:
    """rederive_megatron: the recorded spec's bars, each on the arms it judges (its own arm, the DeepEP arm's for
    EFA TX, every arm's otherwise), the cross-arm bound once when both arms ran."""
    for bar in (prof or {}).get("bars") or []:
        if not isinstance(bar, dict) or "metric" not in bar:
            continue
        metric = bar["metric"]
        if metric == "arms_loss_rel_diff_max":
            if both:
                got.thresholds[metric] = bar.get("threshold")
            continue
        own = bar.get("arm") or (deepep if metric == "efa_tx_gb" else None)
        for name in done:
            if own in (None, name):
                got.thresholds[f"{name}.{metric}"] = bar.get("threshold")
