"""Gate 1 (micro): lock -> sources -> kernels -> DeepEP test_ep.py -> parsed phases -> bars -> report.

The gate passes only on measured evidence: a complete phase table for every rank and every bar of
the profile met, with exactly one NCCL (the pinned one) in each measuring process (judged on the record each rank
of the trials driver prints after its trials: every libnccl mapping of /proc/self/maps, a deleted one too, read by
launch.procmaps, and ncclGetVersion; no separate check process, issue 17; anything else is ERROR naming the rank, the
file, its version and how it got there), with nothing in the test's environment loading another NCCL first (a
preflight before the builds and again before the test: LD_PRELOAD, LD_LIBRARY_PATH; issue 29), on a profile whose bars were
measured (`bars-status: unmeasured` -> FAIL with every number reported). No GPU, or no profile that fits
the host -> SKIP with the reason (after sources were fetched, patched and verified, which needs no GPU). A crash or timeout ->
ERROR with the classified failure and the raw log. Optional runs (gates.arms): the dense comparison arm
(`arms` with "dense") and DeepEP's legacy intranode test (`legacy`); each asked-for run adds a
completeness check. Per-phase figures (gates.metrics) go to `data.metrics`, reported, not bars. On an EFA profile
the judge adds `transport` (gates.transport): every rank of the EP group, from the NCCL INFO lines of every node's
log, on `NET/OFI efa` with GIN on (the type the stack asks for when it is GPU-initiated); a rank that fell back to
Socket, a second plugin, or GIN off fails the gate naming it. On one node `data.transport` says why nothing is
checked.

Trials (issue 16): test_ep runs through our trials driver (gates/drivers/micro_trials.py: upstream's test,
its case called `--trials K` times in ONE launch, default 5; why one launch: see the driver's doc), and the
dense arm, when asked for, runs inside that same launch, interleaved with DeepEP trial by trial, on the same
sizes and payload (item 2). Each trial gives one figure per metric (parsers.micro_trials); `data.statistics`
holds n, mean, p50, stdev, the 95% t interval and the samples per metric (evidence.bars.stats), and every bar with
an inequality is judged on the interval (report.evaluate_interval): PASS only when the whole interval
clears it, FAIL when the whole interval is past it, otherwise INCONCLUSIVE (never PASS). One trial (K=1)
has no interval: INCONCLUSIVE. `data.metrics` gives the per-trial mean for the metrics with statistics and
the first trial's figure for the others (per-phase GB/s, ...).

The run executes its own launch plan (MicroGate.plan_parts with this host's paths): the trials driver's command
for this node and, with `--legacy`, the legacy arm's; a launcher renders the same function's commands with the
image's paths.

Kernels (gates.kernelprep): built here from the fetched, patched trees (host mode), or, with
`--kernels-manifest` (the in-image runner of container mode), taken from the image: its manifest is checked
against the lock and this checkout's kernel recipes (reprostack.kernels.prebuilt) and nothing is fetched or built;
a missing or mismatching manifest is one error line before anything ran, never a build of another kind.

The one-NCCL check of the ranks' records is gates.micro_nccl; what verify-report re-derives of a report from its kept
logs is evidence.rederive.micro.

Invariants: the run executes its own launch plan's commands (plan_parts), the ones a launcher renders; PASS only on
measured evidence (complete tables of every rank, every bar cleared by the trials' interval, one NCCL of the lock's
release in every measuring rank, on EFA every rank's transport); a deliberate variation (--num-sms) is never
evidence; no GPU or no profile that fits the host is a SKIP, never a PASS.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .. import ui
from ..errors import ReprostackError
from ..kernels import jit, ncclwheel, runtime
from ..kernels.prebuilt import Prebuilt
from ..launch import plan as lp
from ..launch import rendezvous
from ..launch import torchrun
from ..launch.watchdog import run_with_watchdog
from ..report import GateReport, artifact_for, decide, evaluate, evaluate_interval
from ..evidence.bars.stats import statistics_block
from ..sources import SourceTree
from . import arms as armsmod
from . import metrics, transport
from .base import Gate, Paths, PlanParts, RunState, env_tuple, verdict
from ..evidence.kind import Evidence
from .kernelprep import (
    Kernels,
    jit_prewarm,
    stand_in_kernels,
    jit_record,
    nccl_words,
    provenance,
    setup_kernels,
    source_trees,
)
from .kerneluse import KernelUse, built_from
from .launcher import Launcher
from .micro_nccl import one_nccl_of_ranks
from ..evidence.rederive.micro import rederive_micro
from .options import BASELINE_HISTORY as HISTORY
from .options import MICRO_TRIALS, GateOptions
from .parsers.failure import classify_failure
from .parsers.micro_trials import deepep_trial_started, markers, parse_micro_trials
from .parsers.test_ep import classify_test_ep_failure
from .parsers.transport import nccl_host, parse_transport
from .spec import Bar, BaselineSpec, GateSpec, Profile, load_spec, resolve_bars
from .state import KindState

if TYPE_CHECKING:
    from ..lock.model import Lock

TRIALS_DRIVER = "gates/drivers/micro_trials.py"
DEFAULT_TRIALS = MICRO_TRIALS  # the one value, in gates.options (its --trials help states it)


@dataclass
class MicroState(KindState):
    """What the micro gate keeps between its stages: the verified trees by pin and the image's checked manifest
    (sources); the kernels, the gate's environment, DeepEP's JIT context and the run folder (prepare); test_ep's
    environment as launched (launch, read by the transport check)."""

    trees: dict[str, SourceTree] = field(default_factory=dict)
    pre: Prebuilt | None = None  # the image's kernels manifest, checked against the lock (container mode)
    kern: Kernels | None = None
    env: dict[str, str] = field(default_factory=dict)  # the legacy run's: without test_ep's launcher variables
    jit_ctx: jit.Context | None = None
    run_dir: Path | None = None
    run_env: dict[str, str] | None = None


MicroRun = RunState[GateSpec, Profile[Bar]]  # one run of the micro gate


def launches(spec: GateSpec, opts: GateOptions | None) -> int:
    """The legacy arm is a second launch; the dense arm runs inside the trials launch."""
    return 2 if opts is not None and opts.legacy else 1


def baseline_bars(root: Path, spec: GateSpec) -> list[tuple[str, object]]:
    """(profile, bar) of every baseline bar of `spec`, its threshold resolved from the runs the spec names."""
    out = []
    for p in spec.profiles.values():
        if any(isinstance(b.baseline, BaselineSpec) for b in p.bars):
            resolved = resolve_bars(spec, p, root=root, stack=spec.stack or "campaign")
            out += [(p.name, b) for b in resolved.bars if b.baseline is not None]
    return out


class MicroGate(Gate[GateSpec, Profile[Bar]]):
    """Gate 1: DeepEP's test_ep.py through the trials driver (module doc)."""

    kind = "micro"
    state = MicroState
    kernels = KernelUse(takes_prebuilt=True, describe=built_from(source=False))
    launcher = Launcher(count=launches)
    evidence = Evidence(from_logs=rederive_micro, baselines=baseline_bars)

    def load(self, root: Path) -> GateSpec:
        return load_spec(root, self.stem)

    def spec_for(self, root: Path, lock: Lock | None) -> GateSpec:
        spec = self.load(root)
        return spec.with_stack(lock.stack, lock.env) if lock is not None else spec  # the lock stack's env

    def requirements(self, root: Path, profile: Profile[Bar] | None = None) -> tuple[str, ...]:
        """On an EFA profile the fabric gate must pass first (DeepEP over a fabric NCCL cannot use is no evidence);
        on one node (NVLink, or one GPU) the gate stands alone."""
        own = super().requirements(root, profile)
        return (*own, "fabric") if profile is not None and profile.needs_efa and "fabric" in self.earlier else own

    # ------------------------------------------------------------------ the plan

    def plan_parts(self, spec: GateSpec, profile: Profile[Bar], opts: GateOptions, paths: Paths) -> PlanParts:
        """The trials driver's launch on every node (the dense arm inside it when asked for), and the legacy arm on
        one node; `commands` is the launch of the run's arms (`opts.arms`, default deepep)."""
        nodes = opts.nodes or profile.nodes
        addr, port = paths.rendezvous(nodes)
        script = f"{paths.work}/{TRIALS_DRIVER}"
        own = [*spec.args, *profile.args]
        if opts.modes == "all":
            own = [a for a in own if a != "--test-first-only"]
        if opts.num_sms is not None:  # a deliberate variation (the report names it)
            own += ["--num-sms", str(opts.num_sms)]

        def node_commands(arms: str, extra: list[str]) -> tuple:
            args = ["--test-ep", f"{paths.source('deepep')}/{spec.script}", "--trials"]
            args += [str(opts.trials or DEFAULT_TRIALS), "--arms", arms, *extra, *own]
            cmds = []
            for node in range(nodes):  # the very launch the run executes (test_ep_launch)
                launch = test_ep_launch(
                    profile, paths.python, script, args, nodes=nodes, node_rank=node, master_addr=addr, master_port=port
                )
                role = "leader" if node == 0 else "worker"
                cmds.append(lp.NodeCommand(node, role, tuple(launch.argv), env_tuple(launch.env)))
            return tuple(cmds)

        deepep = node_commands("deepep", [])
        arms = [lp.ArmPlan("deepep", "deepep", deepep)]
        cmds = deepep
        if spec.dense is not None:  # `--arm deepep,dense`: the dense arm runs INSIDE the trials launch, interleaved
            both = node_commands("deepep,dense", list(spec.dense.args))
            arms.append(lp.ArmPlan("dense", "comparison, in the same launch as deepep (trial by trial, ABAB)", both))
            cmds = both if "dense" in opts.arms else deepep
        if spec.legacy is not None and nodes == 1:  # one node, from the patched tree
            launch = torchrun.local(
                paths.python,
                f"{paths.source('deepep')}/{spec.legacy.script}",
                list(spec.legacy.args),
                gpus=profile.gpus_per_node,
                port=port,
            )
            cmd = lp.NodeCommand(0, "leader", tuple(launch.argv), env_tuple(launch.env))
            arms.append(lp.ArmPlan("legacy", "second-evidence", (cmd,)))
        return PlanParts(cmds, env_tuple(spec.env, profile.env), paths.source("deepep"), (), tuple(arms))

    # ------------------------------------------------------------------ the staged run

    def check_options(self, opts: GateOptions) -> GateOptions:
        trials = DEFAULT_TRIALS if opts.trials is None else opts.trials
        if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
            raise ReprostackError(f"--trials {trials}: give a whole number >= 1")
        if opts.num_sms is not None and not 1 <= opts.num_sms <= 1024:
            raise ReprostackError(f"--num-sms {opts.num_sms}: give a number of SMs from 1 to 1024")
        if opts.baseline == HISTORY:
            if not opts.baseline_runs:  # the command layer (cmd.gate) resolves it from the history database
                raise ReprostackError("--baseline history: no accepted run was resolved from the results history")
        elif opts.baseline is not None and opts.baseline_runs:
            raise ReprostackError("--baseline DIR and --baseline-run: give one of them")
        elif opts.baseline is not None and not Path(opts.baseline).is_dir():
            raise ReprostackError(f"--baseline {opts.baseline}: not a folder of reports (or `history`)")
        return opts.with_(trials=trials, arms=armsmod.parse_arms(",".join(opts.arms) or "deepep"))

    def check_request(self, st: MicroRun) -> None:
        arms = st.opts.arms
        if st.opts.profile:  # a typo'd profile or an impossible run is an error, also on a host that will skip
            armsmod.check_request(st.spec, st.spec.profile(st.opts.profile), arms, st.opts.legacy)

    def sources(self, st: MicroRun) -> None:
        t = time.monotonic()
        if st.standin is not None:  # the GPU stand-in: nothing fetched, the pins' trees by name (gates.standin)
            trees, pre = st.standin.trees(st.ctx.lock, ("nccl", "deepep"), st.out_dir), None
        else:
            trees, pre = source_trees(st.opts, st.ctx, ("nccl", "deepep"))
        st.timed("sources_s", t)
        own = MicroState.of(st)
        own.trees, own.pre = trees, pre
        st.prov = provenance(st.ctx.lock, st.spec, trees)
        st.prov["host"] = st.host
        st.data.update(timings_s=st.timings, sources_reused={n: s.reused for n, s in trees.items()})

    def skip(self, st: MicroRun, what: str = "") -> GateReport | None:
        own = MicroState.of(st)
        trees, pre = own.trees, own.pre
        if st.host["gpu_count"] == 0:
            jit_words = pre.jit_words() if pre is not None else ""
            why = (
                "no GPU on this host (nvidia-smi lists none): "
                + ("the image's kernels manifest matched the lock " if pre else "sources were verified and patched ")
                + "(deepep {}{}){}".format(trees["deepep"].tree[:12], *nccl_words(st.ctx.lock, trees, pre))
                + (f"; the image holds {jit_words}" if jit_words else "")
                + "; kernels and test_ep not run"
            )
            return st.skip(why)
        early = super().skip(st, what)
        if st.profile is not None:  # an arm or the legacy run this profile cannot take: an error, not a skip
            armsmod.check_request(st.spec, st.profile, st.opts.arms, st.opts.legacy)
            # the baseline bars' thresholds from their accepted runs (the spec's, or --baseline DIR's): before any
            # build, a run that cannot be used is one line
            o = st.opts
            folder = Path(o.baseline) if o.baseline and o.baseline != HISTORY else None
            st.profile = resolve_bars(
                st.spec,
                st.profile,
                root=st.ctx.root,
                folder=folder,
                stack=st.ctx.lock.stack,
                runs=o.baseline_runs,
                runs_from="the results history (--baseline history)" if o.baseline == HISTORY else "--baseline-run",
            )
        return early

    def prepare(self, st: MicroRun) -> GateReport | None:
        own = MicroState.of(st)
        spec, profile, trees = st.spec, st.profile, own.trees
        manifest = jit.manifest_for(st.ctx.root, profile.name)  # a bad one: one line, exit 2, before any build
        run_dir = st.out_dir / self.stem
        run_dir.mkdir(parents=True, exist_ok=True)
        try:  # before the builds: an NCCL of another release that the environment would load first
            runtime.refuse(runtime.shadows_by_version({**os.environ, **spec.env, **profile.env}, pinned_version(st)))
        except ReprostackError as e:
            return st.error(f"one-NCCL preflight: {e}")
        try:
            if st.standin is not None:  # no kernels: a stand-in library the replayed ranks map (gates.standin)
                kern = stand_in_kernels(st.standin, st.ctx.lock, st.out_dir / self.stem, st.opts, st.ctx.root)
            else:
                kern = setup_kernels(st.opts, st.ctx, trees, st.prov, st.timings, own.pre)
        except ReprostackError as e:
            return st.error(f"setup: {e}")
        env = {**kern.env, **spec.env, **profile.env, "EP_JIT_CACHE_DIR": str(kern.jit_dir)}
        try:  # before the test: nothing in its environment may load another NCCL first (LD_PRELOAD, LD_LIBRARY_PATH)
            runtime.preflight(env, kern.nccl_lib, kern.nccl_version, accept_sha256=kern.accept_sha256)
        except ReprostackError as e:
            return st.error(f"one-NCCL preflight: {e}")
        jit_ctx, st.data["jit"] = jit_prewarm(manifest, kern, env, trees["deepep"].tree, st.timings, st.opts.jobs)
        own.kern, own.env, own.jit_ctx, own.run_dir = kern, env, jit_ctx, run_dir
        return None

    def launch_and_judge(self, st: MicroRun) -> GateReport:
        own = MicroState.of(st)
        opts, profile, trees = st.opts, st.profile, own.trees
        paths = Paths.host(
            root=st.ctx.root, out=st.out_dir, cache=st.ctx.cache_root, python=opts.python, trees=trees, opts=opts
        )
        parts = self.plan_parts(st.spec, profile, opts, paths)
        run_dir = own.run_dir
        cmd = next(c for c in parts.commands if c.node == opts.node_rank)
        base_env = own.env  # the legacy run gets the gate's environment without test_ep's launcher variables
        env = {**base_env, **dict(parts.env), **dict(cmd.env)}
        log = st.rank_log("test_ep")  # the output contract: each node its own log, node 0 reads them all
        st.data["command"] = list(cmd.argv)
        keys = {*st.spec.env, *profile.env, *dict(cmd.env), *runtime.RUNTIME_KEYS}
        st.data["env"] = {k: env[k] for k in sorted(keys) if k in env}
        own.run_env = env
        outcome = self._run_test_ep(st, parts, list(cmd.argv), env, log)
        if not st.reporter:  # a worker: its ranks ran; node 0 judges every node's log
            ok = outcome.returncode == 0 and not outcome.timed_out
            what = f"ran its {profile.gpus_per_node} rank(s) of test_ep (exit {outcome.returncode}" + (
                ", timed out)" if outcome.timed_out else ")"
            )
            return st.worker_done(what, ok, [log])
        jit_manifest = jit_record(own.jit_ctx, st.data["jit"], run_dir, trees["deepep"].tree, profile.name)
        logs = st.rank_logs("test_ep")
        why = None
        if len(logs) > 1:  # every node's rc and log, bounded wait
            why, st.data["nodes"] = rendezvous.gather(st.node_run, ["test_ep"], profile.nodes)
        st.artifacts += [artifact_for(p, relative_to=st.out_dir) for p in logs if p.is_file()]
        if jit_manifest is not None:
            st.artifacts.append(artifact_for(jit_manifest, relative_to=st.out_dir))
        st.artifacts += [artifact_for(b) for b in own.kern.logs if b.exists()]
        if why:
            rep = st.error(why)
            rep.artifacts = st.artifacts
            return rep
        extra = [self._legacy(st, parts, base_env)] if opts.legacy else []
        return self._judge(st, "\n".join(p.read_text(errors="replace") for p in logs), outcome, extra)

    def _run_test_ep(self, st: MicroRun, parts: PlanParts, argv: list[str], env: dict, log: Path):
        """This node's command of the plan under the watchdog (the GPU stand-in replays it when asked). Its output:
        the live line (-v: every line); the ETA is per profile and number of trials; `trial k/K` from rank 0's DeepEP
        trial markers (a plain line each; the bar when live)."""
        if st.standin is not None:  # the plan's own command, replayed per rank by the GPU stand-in
            kern = MicroState.of(st).kern
            argv = st.standin.wrap(argv, root=Path(st.ctx.root), nccl_lib=kern.nccl_lib, version=kern.nccl_version)
        with ui.step(
            f"test_ep [{st.profile.name}] x{st.opts.trials} trial(s)", log=log, total=st.opts.trials, unit="trial"
        ) as s:
            outcome = run_with_watchdog(
                argv,
                env=env,
                cwd=parts.workdir if st.standin is None else str(st.out_dir),  # the stand-in fetched no tree
                timeout_s=st.timeout_s,
                log_path=log,
                echo=False,
                on_line=ui.line_counter(s, deepep_trial_started),
            )
        st.timings["test_s"] = round(outcome.duration_s, 2)
        return outcome

    def _legacy(self, st: MicroRun, parts: PlanParts, env: dict):
        """The legacy arm of the plan, run under its own watchdog (its yaml `timeout-s`, else the gate's, capped by
        the operator's --timeout)."""
        arm = next(a for a in parts.arms if a.name == "legacy")
        own = st.spec.legacy.timeout_s or st.spec.timeout_s
        limit = min(own, st.opts.timeout) if st.opts.timeout else own
        return armsmod.run_legacy(
            arm.commands[0],
            env=env,
            cwd=parts.workdir,
            run_dir=MicroState.of(st).run_dir,
            out_dir=st.out_dir,
            timeout_s=limit,
        )

    def _judge(self, st: MicroRun, text: str, outcome, extra: list) -> GateReport:
        """Parse every trial, add the dense and legacy arms, the statistics and the metrics; a verdict."""
        opts, profile = st.opts, st.profile
        tp = parse_micro_trials(text, num_ranks=profile.ep_size, trials=opts.trials, arms=opts.arms, modes=opts.modes)
        parsed = tp.deepep[0]
        st.data["test_ep"] = parsed.to_dict()  # the first trial's full table; every trial's figures in data.trials
        how = f"one launch, test_ep's case run {opts.trials} time(s)"
        how += ", the dense arm after each DeepEP trial (ABAB)" if tp.dense else ""
        st.data["trials"] = {**tp.to_dict(), "driver": TRIALS_DRIVER, "how": how}
        st.data["returncode"], st.data["timed_out"] = outcome.returncode, outcome.timed_out
        values = metrics.deepep_metrics(parsed, profile.scale_up_limit_gbs)
        if tp.dense:
            extra = [self._dense(st, tp, text, outcome, values, parsed), *extra]
        for a in extra:
            st.data[a.name] = a.data
            values.update(a.values)
            st.artifacts += a.artifacts
        try:
            summaries = tp.summaries()
        except ValueError:  # a non-finite figure: no statistics, the completeness check already fails
            summaries = {}
        for k, s in summaries.items():  # the trials' mean stands for the metric; its spread is in data.statistics
            values[k] = round(s.mean, 6)
        st.data["statistics"] = statistics_block(summaries)
        rows = metrics.rows(values, profile.scale_up_limit_source)
        for r in rows:
            if r["metric"] in summaries:
                mean = f"mean of {opts.trials} trial(s): {summaries[r['metric']].describe()}"
                r["note"] = mean + (f"; {r['note']}" if r["note"] else "")
        st.data["metrics"], st.data["bars_status"] = rows, profile.bars_status
        if not tp.complete:
            self._transport(st, text, tp)  # the ranks' transport is reported, also when the run is an error
            return self._incomplete(st, tp, text, outcome)
        return self._verdict(st, tp, values, summaries, outcome, extra, text)

    def _dense(self, st: MicroRun, tp, text: str, outcome, values: dict, parsed) -> armsmod.ArmRun:
        """The dense arm's data, figures and completeness check (it ran inside the trials launch)."""
        dense0 = tp.dense[0]
        data = {"parse": dense0.to_dict(), "trials_ok": tp.dense_ok}
        if not tp.dense_ok:
            data["failure"] = classify_failure(text, outcome.returncode, outcome.timed_out).to_dict()
        values.update(metrics.dense_metrics(dense0, parsed.dc_p50_us))
        bad = [f"trial {k}: {p}" for k, d in enumerate(tp.dense) for p in d.problems]
        note = "; ".join(bad[:4]) or (
            f"{st.profile.ep_size} rank(s) x {len(dense0.phases)} phases x {st.opts.trials} trial(s), checks ok"
        )
        return armsmod.ArmRun("dense", data, {}, evaluate("dense_arm_complete", "", tp.dense_ok, "==", True, note=note))

    def _incomplete(self, st: MicroRun, tp, text: str, outcome) -> GateReport:
        """ERROR (or FAIL) of a run whose phase tables or trial markers are not complete, the failure classified."""
        fc = classify_test_ep_failure(
            _failed_part(text, tp),
            outcome.returncode,
            outcome.timed_out,
            num_ranks=st.profile.ep_size,
            modes=st.opts.modes,
        )
        st.data["failure"] = fc.to_dict()
        why = fc.line()
        own = MicroState.of(st)
        kern = own.kern
        hint = runtime.older_nccl_hint(text, kern.nccl_version)
        if hint:  # an ImportError on an nccl symbol: say which NCCL the environment loads first
            found = runtime.shadows(own.env, kern.nccl_lib, kern.nccl_version, accept_sha256=kern.accept_sha256)
            why += " " + hint.strip() + (": " + "; ".join(found[:2]) if found else "")
        if all(p.complete for p in tp.deepep):  # every table complete: what is wrong is in the driver's markers
            why = "trials driver's markers: " + "; ".join(tp.problems[:3])
        result, reason = decide([], ran_ok=False, failure_reason=why)
        return GateReport(self.stem, st.profile.name, result, reason, provenance=st.prov, artifacts=st.artifacts)

    def _transport(self, st: MicroRun, text: str, tp) -> list:
        """The transport proof per rank (gates.transport) on an EFA profile: every rank of the EP group on
        `NET/OFI efa` with GIN on (the type the stack asks for when it is GPU-initiated), from the NCCL INFO lines of
        every node's log; each rank's process known by the trials driver's record (host, pid), else by NCCL's init
        lines. On a profile without a network: no check, `data.transport` says why."""
        need = transport.need(st.profile, MicroState.of(st).run_env or {}, gin=True)
        if need is None:
            st.data["transport"] = {"checked": False, "why": transport.no_network(st.profile)}
            return []
        known = {}
        for r in tp.nccl:
            rank, host, pid = r.get("rank"), r.get("host"), r.get("pid")
            if type(rank) is int and type(pid) is int and isinstance(host, str):
                known.setdefault(rank, (nccl_host(host), pid, None))
        parsed = parse_transport(text, known)
        st.data["transport"] = {"checked": True, "need": need.to_dict(), **parsed.to_dict()}
        return [transport.check("transport", need, parsed, where=f"test_ep's {st.profile.ep_size} rank(s)")]

    def _verdict(
        self, st: MicroRun, tp, values: dict, summaries: dict, outcome, extra: list, text: str = ""
    ) -> GateReport:
        """The one-NCCL check, the completeness and bar checks of a complete run, and the verdict."""
        profile, kern = st.profile, MicroState.of(st).kern
        nodes = st.opts.nodes or profile.nodes
        try:  # the one-NCCL check, judged on what the measuring ranks saw (no separate process: issue 17)
            one = one_nccl_of_ranks(
                tp.nccl, kern, num_ranks=profile.ep_size, all_local=nodes == 1, misplaced=tp.nccl_misplaced
            )
        except ReprostackError as e:
            rep = st.error(f"one-NCCL check: {e}")
            rep.artifacts = st.artifacts
            return rep
        st.host["nccl_runtime"] = one["runtime"]
        built_with = one.get("torch_built_with")
        st.data["torch_built_with_nccl"] = built_with if isinstance(built_with, str) else None
        st.data["nccl_mapped"] = one["mapped"]
        st.data["nccl_check"] = f"in the measuring process of rank(s) {one['ranks']} after the trials (/proc/self/maps)"
        problems = tp.problems + [f"trial {k}: {p}" for k, t in enumerate(tp.deepep) for p in t.problems]
        note = f"ncclGetVersion of the only NCCL mapped: {one['mapped'][0]}"
        checks = [
            evaluate("ranks_x_phases_missing", "lines", len(problems), "==", 0, note="; ".join(problems[:8]) or None),
            evaluate("nccl_runtime", "version", one["runtime"], "==", kern.nccl_version, note=note),
        ]
        for bar in profile.bars:
            if bar.metric in summaries and bar.op != "==":
                checks.append(
                    evaluate_interval(bar.metric, summaries[bar.metric], bar.op, bar.threshold, note=bar.reference)
                )
            else:
                checks.append(
                    evaluate(bar.metric, bar.unit, values.get(bar.metric), bar.op, bar.threshold, note=bar.reference)
                )
        st.data["bars"] = [
            {"metric": b.metric, "op": b.op, "threshold": b.threshold, "unit": b.unit, "source": b.source}
            | ({"baseline": b.baseline.to_dict()} if b.baseline else {})
            for b in profile.bars
        ]
        checks += [a.check for a in extra] + self._transport(st, text, tp)
        if outcome.returncode != 0:
            st.data["after_finish"] = (
                f"exit {outcome.returncode} after every phase line was printed "
                f"(teardown; not counted, see test_ep.teardown_lines)"
            )
        result, reason = verdict(profile, checks, st.spec.path.name)
        deliberate = st.opts.num_sms is not None
        if deliberate:  # never mistaken for the profile's own evidence: its PASS is printed "not evidence", exit 3
            st.data["deliberate"] = {"num_sms": st.opts.num_sms, "why": "--num-sms: DeepEP given this many SMs"}
            reason = f"deliberate variation (--num-sms {st.opts.num_sms}): {reason}"
        return GateReport(
            self.stem,
            profile.name,
            result,
            reason,
            checks=checks,
            provenance=st.prov,
            artifacts=st.artifacts,
            evidence=not deliberate,
        )


def pinned_version(st: MicroRun) -> str | None:
    """The NCCL release the run's lock pins (kernels.ncclwheel.pinned_version; None: an unreleased rev)."""
    return ncclwheel.pinned_version(st.ctx.lock)


def test_ep_launch(
    profile: Profile,
    python: str,
    script: str,
    args: list[str],
    *,
    nodes: int,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
) -> torchrun.Launch:
    """How gate 1 starts its trials driver on node `node_rank` (the run and its launch plan, gates.plan, both use
    this): several nodes -> torchrun, one agent per node (the operator's rendezvous, ReprostackError without it);
    one node with a `torchrun` profile -> the same agent on 127.0.0.1; else the driver started directly."""
    if nodes > 1:
        torchrun.need_master(profile.name, nodes, master_addr, master_port)
        return torchrun.torchrun(
            python,
            script,
            args,
            gpus=profile.gpus_per_node,
            nodes=nodes,
            node_rank=node_rank,
            master_addr=master_addr,
            master_port=master_port,
        )
    if profile.launcher == "torchrun":  # one agent on this node; test_ep spawns the GPUs' ranks
        return torchrun.torchrun(
            python,
            script,
            args,
            gpus=profile.gpus_per_node,
            nodes=1,
            node_rank=0,
            master_addr=master_addr or "127.0.0.1",
            master_port=master_port or torchrun.free_port(),
        )
    return torchrun.local(python, script, args, gpus=profile.gpus_per_node, port=master_port)


def _failed_part(text: str, tp) -> str:
    """The log from the driver's marker of the first incomplete DeepEP trial on (the whole log when every trial
    is complete or no marker is found): earlier trials' complete tables would make the crash look like
    teardown noise to classify_failure."""
    bad = next((k for k, p in enumerate(tp.deepep) if not p.complete), None)
    if bad is None:
        return text
    at = next(
        (
            no
            for no, m in markers(text)
            if m.get("event") == "trial" and m.get("arm") == "deepep" and m.get("trial") == bad
        ),
        None,
    )
    return text if at is None else "\n".join(text.split("\n")[at - 1 :])
