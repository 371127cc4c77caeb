"""Serving gates (vLLM, SGLang, TRT-LLM): spec -> server per arm -> readiness probe -> AIPerf sweep -> backend
assertion on the server log -> checks -> report.

Verdict (report.decide): ERROR when a server or AIPerf could not produce a trustworthy measurement (server not
ready in time or dead, AIPerf non-zero or no export); FAIL when it ran and a check failed (errors, incomplete
requests, agg tok/s below the bar, backend assertion, and on an EFA profile the deepep arm's transport proof per
rank: gates.transport on every node's server log, every rank on NET/OFI efa with GIN on); PASS only when every check passed and the deepep arm ran
(an alternative arm alone is comparison evidence: a SKIP naming that). SKIP (never a pass) when the host lacks
what the profile needs or no profile fits it. On a worker node (`node_rank > 0`) the gate only serves: it starts
the worker command and waits for it; its report is a SKIP that says the verdict is node 0's.
Trials: `--trials K` (K >= 2) runs each cell as AIPerf's K profile runs (gates.aiperfrun) and judges the tok/s bar
on their 95% interval (INCONCLUSIVE when it straddles the bar; `data.statistics` per `<arm>.<cell>.agg_tok_s`);
the errors and completed-requests checks then cover every run. Default: DEFAULT_TRIALS (3) runs per cell on a GPU
profile, where one run (`--trials 1`) is INCONCLUSIVE on its bar, never PASS; one run on the local-test profile
(the stand-in server's PASS is never evidence anyway).

One NCCL (issue 29): a server's environment that would load an NCCL of another release than the lock's first
(LD_PRELOAD, LD_LIBRARY_PATH) is refused before it starts; while it serves, every process of its run (the process
group, the leader's descendants, the cookie's carriers: launch.server) has its /proc/<pid>/maps read (launch.procmaps)
once it answers (before any request), after each cell and before it stops: each maps exactly one NCCL, not deleted,
of the lock's release, all the same file, and a GPU profile's server maps one; else the arm is an ERROR naming the
process, the file, its version and how it got there.

The run executes its own launch plan (ServingGate.plan_parts with this host's paths and the port it chose): each
arm's server command for this node, with that arm's env.

A profile can say less than the published contract (servingspec, issue 28: one GPU, a small model): its own model,
cells and backend assertion; `bars-status: unmeasured` (every number reported, the verdict FAIL "no measured bar yet",
never PASS, as gates.base.verdict says for micro); `requires-modules` (not importable by the server's interpreter:
SKIP naming them); `engaged` lines per arm: an arm whose server is ready but has not printed them did not use the
backend it was launched with (vLLM at DP1 ignores --all2all-backend): that arm is SKIP, its reason the spec's `why`
and the engine's own lines matched by `quote`, no AIPerf is run on it, and the other arms still run; an arm in the
profile's `skip-arms` is not launched (SKIP with that reason). The gate's result says so, and a gate whose DeepEP arm
was skipped never passes (report.require_deepep_arm).

The judge (each arm's checks, the verdict, the report's data) is evidence.judge.serving; what verify-report re-derives of
a report from its kept AIPerf exports and server logs is evidence.rederive.serving.

Invariants: the run executes its own launch plan's server commands (plan_parts), the ones a launcher renders; no
request is sent before the server is ready and its processes passed the one-NCCL check; the local-test profile's
stand-in server is never evidence; a worker node only serves, its report is never the verdict (node 0's is).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .. import ui
from ..errors import GateError, ReprostackError
from ..kernels import ncclwheel, runtime
from ..launch import plan as lp
from ..launch import rendezvous
from ..launch import procmaps, torchrun
from ..launch.server import ServerProcess
from ..report import GateReport, artifact_for
from .aiperfrun import profile_run_started, run_cell
from .aiperftool import AiperfTool, ensure_aiperf, make_test_tokenizer
from .base import Gate, Paths, PlanParts, RunState, env_tuple
from ..evidence.kind import Evidence
from .kerneluse import KernelUse, kernel_pins
from .launcher import Launcher, per_arm
from .options import SERVING_TRIALS, GateOptions
from .parsers.failure import classify_failure
from .parsers.servelog import assert_backend
from .probe import wait_ready
from .servingspec import Arm, ServingProfile, ServingSpec, load_serving_spec, render
from ..evidence.judge.serving import ArmRun, arm_transport, judge
from ..evidence.rederive.serving import rederive_serving
from .state import KindState

if TYPE_CHECKING:
    from ..lock.model import Lock

DEFAULT_TRIALS = SERVING_TRIALS  # AIPerf runs per cell on a GPU profile without --trials (gates.options holds it)


def _variables(spec: ServingSpec, profile: ServingProfile, arm: Arm, opts: GateOptions, paths: Paths, node, port):
    """The template variables of `arm`'s server on `node` (servingspec doc); the profile's model (a template
    itself, e.g. `${root}/...`) and served model when it has them."""
    leader = paths.rendezvous(profile.nodes)[0] or "127.0.0.1"
    v = {
        "model": spec.model,
        "served_model": spec.served_model,
        "port": str(port),
        "leader_addr": leader,
        "nodes": str(profile.nodes),
        "node_rank": str(node),
        "gpus_per_node": str(profile.gpus_per_node),
        "ep": str(profile.ep_size),
        "python": paths.python,
        "run_dir": f"{paths.out}/{spec.gate}",
        "arm": arm.name,
        "root": paths.work,
    }
    v.update(spec.vars)
    v.update(profile.vars)
    v.update(arm.vars)
    v.update(opts.vars_dict)
    if profile.model:
        v["model"] = render(profile.model, v, f"{spec.path}: profiles.{profile.name}.model")
        v["served_model"] = v["model"]
    if profile.served_model:
        v["served_model"] = render(profile.served_model, v, f"{spec.path}: profiles.{profile.name}.served-model")
    return v


def server_command(spec: ServingSpec, profile: ServingProfile, arm: Arm, opts: GateOptions, paths: Paths, node, port):
    """(argv, env) of arm `arm`'s server on node `node`: the spec's leader/worker command rendered, the operator's
    --server-args appended; env = the spec's, the profile's and the arm's, rendered (on top of the environment
    the server inherits). Raises ReprostackError for a worker node of an engine the leader launches everywhere."""
    server = profile.server or spec.server
    variables = _variables(spec, profile, arm, opts, paths, node, port)
    role = "leader" if str(node) == "0" else "worker"
    if role == "worker" and "worker" not in server:
        raise ReprostackError(
            f"{spec.path}: {spec.gate} launches every node from the leader (no server.worker): "
            f"run the gate on node 0 only"
        )
    where = f"{spec.path}: server.{role}"
    argv = [render(a, variables, where) for a in server[role]] + list(opts.server_args)
    env = {}
    for src, name in (
        (server.get("env", {}), "server.env"),
        (profile.env, f"profiles.{profile.name}.env"),
        (arm.env, f"arms.{arm.name}.env"),
    ):
        env.update({k: render(v, variables, f"{spec.path}: {name}.{k}") for k, v in src.items()})
    return argv, env


def arm_order(spec: ServingSpec, names) -> list[Arm]:
    """The arms to run (default: all), the deepep arm first. Raises ReprostackError for an unknown name."""
    for n in names:
        if n not in spec.arms:
            raise ReprostackError(f"{spec.path}: no arm {n!r} (arms: {', '.join(spec.arms)})")
    chosen = [spec.arms[n] for n in (names or spec.arms)]
    return sorted(chosen, key=lambda a: a.role != "deepep")


@dataclass
class ServingState(KindState):
    """What a serving gate keeps between its stages: the arms to run, DeepEP's first (check_request); the run folder,
    this host's paths with the run's server port, the served model's name, the pinned AIPerf and its tokenizer
    (prepare; AIPerf and the tokenizer on node 0 only)."""

    arms: list[Arm] = field(default_factory=list)
    run_dir: Path | None = None
    paths: Paths | None = None
    served_model: str | None = None
    tool: AiperfTool | None = None
    tokenizer: str | None = None


ServingRun = RunState[ServingSpec, ServingProfile]  # one run of a serving gate


def kernels_line(spec: ServingSpec, lock: Lock, image: lp.ImageRef | None, mode: str) -> str:
    """The engine's own DeepEP and NCCL (installed on this host, or inherited in its image from image deepep)."""
    from ..kernels.prebuilt import MANIFEST

    if not spec.kernels:
        return ""
    words = "; ".join(kernel_pins(spec, lock, tuple(spec.kernels)))
    if mode != lp.MODE_CONTAINER:
        return f"the engine's DeepEP and NCCL as installed on this host (pinned: {words})"
    img = image.recipe if image else "?"
    return (
        f"the engine's DeepEP and NCCL in image {img} (inherited from image deepep, whose {MANIFEST} records "
        f"them: {words})"
    )


class ServingGate(Gate[ServingSpec, ServingProfile]):
    """Gates 2-4: an engine serving the model over DeepEP, measured by the pinned AIPerf (module doc)."""

    kind = "serving"
    serves = True
    state = ServingState
    kernels = KernelUse(describe=kernels_line)  # the engine brings its own: none prebuilt by the gate
    launcher = Launcher(count=per_arm)
    evidence = Evidence(from_logs=rederive_serving)
    no_fit = (
        "no profile of {name} matches this host ({gpus} GPU(s), EFA: {efa}); "
        "--profile local-test runs the gate against the test server"
    )

    def __init__(self, name: str, stem: str | None = None):
        super().__init__(name, stem, requires=None)  # the spec's own `requires:`

    def load(self, root: Path) -> ServingSpec:
        return load_serving_spec(root, self.stem)

    def plan_parts(self, spec: ServingSpec, profile: ServingProfile, opts: GateOptions, paths: Paths) -> PlanParts:
        """Every arm's server command per node (a node without a worker command: sshd for the leader's launcher);
        `commands` and `env` are the DeepEP arm's."""
        server = profile.server or spec.server
        port = paths.server_port or server.get("port", 8000) or torchrun.free_port()
        first = next((a for a in spec.arms.values() if a.role == "deepep"), next(iter(spec.arms.values())))
        notes: list[str] = []
        arms = []
        for a in [first, *(a for a in spec.arms.values() if a is not first)]:
            cmds, env = [], {}
            for node in range(profile.nodes):
                if node > 0 and "worker" not in server:  # TRT-LLM: the leader's mpirun starts every rank over ssh
                    cmds.append(lp.NodeCommand(node, "worker", ("/usr/sbin/sshd", "-D", "-p", "2222")))
                    if a is first:
                        notes.append(
                            f"node {node}: ranks started by the leader's launcher over ssh (sshd on port 2222)"
                        )
                    continue
                argv, env = server_command(spec, profile, a, opts, paths, node, port)
                cmds.append(lp.NodeCommand(node, "leader" if node == 0 else "worker", tuple(argv)))
            arms.append(lp.ArmPlan(a.name, a.role, tuple(cmds), env_tuple(env)))
        for name, why in profile.skip_arms.items():  # listed, never launched (SKIP with this reason)
            notes.append(f"arm {name}: not launched on profile {profile.name}: {' '.join(why.split())}")
        return PlanParts(arms[0].commands, arms[0].env, paths.work, tuple(notes), tuple(arms))

    # ------------------------------------------------------------------ the staged run

    def check_request(self, st: ServingRun) -> None:
        super().check_request(st)
        ServingState.of(st).arms = arm_order(st.spec, st.opts.arms)

    def sources(self, st: ServingRun) -> None:
        spec = st.spec
        st.prov = {
            "lock_sha256": st.ctx.lock.sha256,
            "gate_spec_sha256": spec.sha256,
            "engine": spec.engine,
            "model": spec.model,
            "host": st.host,
        }

    def skip(self, st: ServingRun, what: str = "") -> GateReport | None:
        early = super().skip(st, what)
        if early is not None:
            return early
        profile = st.profile
        if profile.nodes > 1 and not st.opts.master_addr:
            raise ReprostackError(
                f"profile {profile.name} spans {profile.nodes} nodes: give --master-addr (the leader's "
                f"address) and --node-rank on each node"
            )
        if str(st.opts.node_rank) != "0" and "worker" not in (profile.server or st.spec.server):
            raise ReprostackError(
                f"{st.spec.path}: {st.spec.gate} launches every node from the leader (no server.worker): "
                f"run the gate on node 0 only"
            )
        if st.opts.trials is None:
            st.opts = st.opts.with_(trials=DEFAULT_TRIALS if profile.needs_gpu else 1)
        missing = [m for m in profile.requires_modules if not _importable(m)]
        if missing:
            return st.skip(
                f"profile {profile.name} serves with modules {sys.executable} cannot import: {', '.join(missing)} "
                f"(the engine is not installed for this interpreter; on the lent H200: scripts/device/seed_engine.sh)",
                profile.name,
            )
        return None

    def finish(self, st: ServingRun, report: GateReport) -> GateReport:
        report = st.finish(report)
        if st.profile is not None and not st.profile.needs_gpu:  # local-test: a stand-in server, never evidence
            report.evidence = False
            report.provenance["engine"] = {
                "name": "reprostack.gates.testserver",
                "stands_in_for": dict(st.spec.engine),
                "note": "the engine was not run",
            }
        return report

    def prepare(self, st: ServingRun) -> GateReport | None:
        own = ServingState.of(st)
        own.run_dir = run_dir = st.out_dir.resolve() / self.stem  # absolute: AIPerf runs in each cell
        run_dir.mkdir(parents=True, exist_ok=True)
        server = st.profile.server or st.spec.server
        paths = Paths.host(
            root=Path(st.ctx.root).resolve(),
            out=st.out_dir.resolve(),
            cache=st.ctx.cache_root,
            python=sys.executable,
            opts=st.opts,
        )
        own.paths = replace(paths, server_port=server.get("port", 8000) or torchrun.free_port())
        variables = _variables(st.spec, st.profile, own.arms[0], st.opts, paths, 0, 0)
        st.prov["model"], own.served_model = variables["model"], variables["served_model"]
        if str(st.opts.node_rank) != "0":
            return None
        try:
            tool = ensure_aiperf(st.ctx.lock, st.ctx.cache_root, st.ctx.root, base_python=sys.executable)
            st.prov["aiperf"] = {"version": tool.version, "wheel_sha256": tool.sha256}
            tok = st.profile.tokenizer or "${model}"
            if tok == "test":
                tokenizer = str(make_test_tokenizer(tool, run_dir / "tokenizer"))
            else:
                where = f"{st.spec.path}: profiles.{st.profile.name}.tokenizer"
                tokenizer = render(tok, variables, where)
        except GateError as e:
            return st.error(f"setup: {e}")
        own.tool, own.tokenizer = tool, tokenizer
        return None

    def launch_and_judge(self, st: ServingRun) -> GateReport:
        own = ServingState.of(st)
        parts = self.plan_parts(st.spec, st.profile, st.opts, own.paths)
        by_name = {a.name: a for a in parts.arms}
        if not st.reporter:
            return self._serve_worker(st, by_name[own.arms[0].name])
        runs = [self._run_arm(st, arm, by_name[arm.name]) for arm in own.arms]
        self._artifacts(st, runs)
        if st.outputs.nodes > 1:  # the workers stop serving; then every node's rc (output contract)
            rendezvous.mark_done(st.node_run)
            why, st.data["nodes"] = rendezvous.gather(st.node_run, [f"server.{own.arms[0].name}"], st.profile.nodes)
            if why:
                rep = st.error(why)
                rep.artifacts = st.artifacts
                return rep
        return judge(st, runs, self.stem, own.tokenizer)

    def _run_arm(self, st: ServingRun, arm: Arm, plan: lp.ArmPlan) -> ArmRun:
        """Start the arm's server (its plan command for node 0), probe it, run every cell, assert the backend."""
        spec, profile = st.spec, st.profile
        run = ArmRun(arm)
        if arm.name in profile.skip_arms:
            run.skipped = f"not launched on profile {profile.name}: {profile.skip_arms[arm.name]}"
            return run
        cmd = next(c for c in plan.commands if c.node == 0)
        log = st.rank_log(f"server.{arm.name}")  # the output contract: one log per node, node 0 reads them all
        run.logs = [log]
        env = {**os.environ, **dict(plan.env)}
        shadow = _nccl_shadows(st, env)
        if shadow:  # before the server starts: its environment would load another NCCL first
            run.error = f"one-NCCL preflight: {shadow}"
            return run
        try:
            server = ServerProcess(list(cmd.argv), env=env, cwd=str(st.ctx.root), log_path=log)
        except OSError as e:
            run.error = f"server command could not start: {cmd.argv[0]}: {e.strerror or e}"
            return run
        try:
            self._serve_cells(st, run, server, f"http://127.0.0.1:{ServingState.of(st).paths.server_port}")
        finally:
            runtime.merge_samples(run.nccl, procmaps.sample(server.pids()))  # what it mapped at the end
            run.server_exit = server.stop()
        if run.server_exit is not None and run.error is None:
            run.error = f"server exited {run.server_exit} during the sweep"
        if run.error is None:
            run.error = _nccl_error(st, run.nccl, f"server of arm {arm.name}")
        if profile.nodes > 1:
            run.logs = [p for p in st.rank_logs(f"server.{arm.name}") if p.is_file()]
        text = "\n".join(p.read_text(errors="replace") for p in run.logs if p.is_file())
        required, forbidden, _ = spec.assertion(profile)
        run.backend = assert_backend(
            text,
            num_ranks=profile.ep_size,
            gpus_per_node=profile.gpus_per_node,
            required=list(required),
            forbidden=list(forbidden),
        )
        if arm.assert_backend:
            run.transport, run.transport_check = arm_transport(profile, dict(plan.env), arm.name, text)
        if run.error and run.server_exit is not None:
            fc = classify_failure(text, run.server_exit, False)
            run.error += f" ({fc.line()})"
        if run.error and run.backend.first_dead_rank is not None:
            run.error += f"; first rank that died: {run.backend.first_dead_rank} ({run.backend.death})"
        return run

    def _serve_cells(self, st: ServingRun, run: ArmRun, server: ServerProcess, url: str) -> None:
        """Wait for the server, then the AIPerf sweep cell by cell (stops at the first cell that fails)."""
        spec, profile, opts, arm, own = st.spec, st.profile, st.opts, run.arm, ServingState.of(st)
        with ui.step(f"{spec.gate} {arm.name}: server ready [{profile.name}]", log=server.log_path):
            pr = wait_ready(
                url,
                spec.probe["path"],
                timeout_s=float(spec.probe["timeout-s"]),
                interval_s=float(spec.probe.get("interval-s", 5)),
                alive=server.alive,
            )
        run.probe_s = pr.seconds
        if not pr.ready:
            run.error = (
                f"server not ready at {url}{spec.probe['path']} after {pr.seconds} s ({pr.attempts} probes): {pr.last}"
            )
            return
        runtime.merge_samples(run.nccl, procmaps.sample(server.pids()))  # every rank of the server, once ready
        run.error = _nccl_error(st, run.nccl, f"server of arm {arm.name}", need=False)  # before any request
        if run.error:
            return
        run.skipped = not_engaged(profile, arm, server.log_path)
        if run.skipped:
            return
        for cell in spec.cells_for(profile):
            if not server.alive():
                run.error = f"server exited {server.returncode} before cell {cell.name}"
                return
            runs = f" x{opts.trials} runs" if opts.trials > 1 else ""  # one AIPerf process; its ETA per K
            many = opts.trials > 1  # `run k/K` as AIPerf starts each profile run (aiperfrun.profile_run_started)
            title = f"{spec.gate} {arm.name} {cell.name}: aiperf [{profile.name}]{runs}"
            with ui.step(title, total=opts.trials if many else None, unit="run") as s:
                res = run_cell(
                    own.tool,
                    arm=arm.name,
                    cell=cell,
                    url=url,
                    model=own.served_model,
                    tokenizer=own.tokenizer,
                    aiperf=spec.aiperf,
                    cell_dir=own.run_dir / arm.name / cell.name,
                    extra=profile.aiperf_args,
                    echo=None,
                    runs=opts.trials,
                    on_line=ui.line_counter(s, profile_run_started) if many else None,
                )
                s.outcome = res.status
            run.cells.append(res)
            runtime.merge_samples(run.nccl, procmaps.sample(server.pids()))
            if res.status != "ok":
                dead = "" if server.alive() else f"; server exited {server.returncode}"
                run.error = f"cell {cell.name}: {res.detail}{dead}"
                return

    def _artifacts(self, st: ServingRun, runs: list[ArmRun]) -> None:
        """Every server log and every cell's AIPerf log and exports (each profile run's too), with sha256."""
        for r in runs:
            files = [p for p in r.logs]
            for c in r.cells:
                run_dirs = sorted((c.dir / "aiperf" / "profile_runs").glob("run_*")) if c.runs else []
                files.append(c.log)
                files += [
                    d / f
                    for d in (c.dir / "aiperf", *run_dirs)
                    for f in ("profile_export_aiperf.json", "profile_export.jsonl")
                ]
            st.artifacts += [artifact_for(p, relative_to=st.out_dir) for p in files if p.is_file()]

    def _serve_worker(self, st: ServingRun, plan: lp.ArmPlan) -> GateReport:
        """Worker node: the worker command of the first chosen arm, until node 0 is done (its mark in the out
        folder), its own exit or the spec's timeout; its report is never written (node 0's is the verdict)."""
        node = st.opts.node_rank
        cmd = next(c for c in plan.commands if str(c.node) == str(node))
        log = st.rank_log(f"server.{plan.name}")
        env, seen = {**os.environ, **dict(plan.env)}, {}
        shadow = _nccl_shadows(st, env)
        if shadow:  # before the server starts: its environment would load another NCCL first
            return st.worker_done(f"one-NCCL preflight (nothing was started): {shadow}", False, [])
        ok, what = rendezvous.serve_until_done(
            st.node_run,
            list(cmd.argv),
            env,
            str(st.ctx.root),
            log,
            st.spec.timeout_s,
            watch=lambda pids: runtime.merge_samples(seen, procmaps.sample(pids)),
        )
        bad = _nccl_error(st, seen, f"worker node {node}'s server")
        if bad:
            return st.worker_done(f"served arm {plan.name}: {what}; {bad}", False, [log])
        return st.worker_done(f"served arm {plan.name}: {what}", ok, [log])


def _importable(module: str) -> bool:
    """Whether this interpreter (the one a profile's `${python}` server runs) can import `module`."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def not_engaged(profile: ServingProfile, arm: Arm, log: Path) -> str | None:
    """Why arm `arm` did not use its backend (profile.engaged: a line missing from the ready server's log), quoting
    the engine's own lines that `quote` matches; None when it did, or when the profile lists nothing for the arm."""
    e = profile.engaged.get(arm.name)
    if e is None:
        return None
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        text = ""
    missing = [r for r in e.lines if not re.search(r.pattern, text)]
    if not missing:
        return None
    said = []
    for q in e.quote:
        said += [m.group(0)[:300] for m in re.finditer(q, text)][:2]
    words = f"; it printed: {' | '.join(dict.fromkeys(said))}" if said else "; it printed nothing more about it"
    names = ", ".join(f"`{r.pattern}` ({r.source})" for r in missing)
    return f"the engine did not engage the arm's backend: its log has no {names}{words}; {' '.join(e.why.split())}"


def _nccl_shadows(st: ServingRun, env: dict) -> str | None:
    """What in a server's environment would load an NCCL of another version than the lock's first (LD_PRELOAD,
    LD_LIBRARY_PATH: launch.procmaps.shadows), in one line; None when nothing would."""
    found = runtime.shadows_by_version(env, ncclwheel.pinned_version(st.ctx.lock))
    return "; ".join(found[:4]) + ": unset it or point it at the pinned NCCL" if found else None


def _nccl_error(st: ServingRun, samples: dict, what: str, *, need: bool = True) -> str | None:
    """The one-NCCL check of a server's processes (kernels.runtime.judge_processes against the lock's NCCL version;
    with `need`, a GPU profile's server must have been seen mapping it), as an arm error; None when it holds."""
    try:
        one = runtime.judge_processes(
            samples,
            what,
            pinned_version=ncclwheel.pinned_version(st.ctx.lock),
            need_nccl=need and st.profile.needs_gpu,
        )
    except ReprostackError as e:
        return f"one-NCCL check: {e}"
    st.data.setdefault("nccl", {})[what] = one
    return None
