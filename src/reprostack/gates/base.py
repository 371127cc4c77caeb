"""The Gate protocol: what every kind of gate answers, and the staged run they share.

A gate is one object of a Gate subclass (one class per kind: gates.micro.MicroGate, gates.serving.ServingGate,
gates.training.MegatronGate, gates.nemo_rl.NemoRLGate, gates.fabric.FabricGate), listed once in gates.registry.
Everything outside the gate classes asks the object, never a kind string and never the spec's attributes:

- `load(root)` / `spec_for(root, lock)`: the spec, validated by the gate's own schema (and as the lock's stack runs
  it); `requirements(root)`: the gates that must pass first;
- `no_fit`: the SKIP's line when no profile fits this host; which profile a run, a plan or a launcher takes is the
  one rule of gates.profiles (`resolve`, gates.options.PROFILE_RULE), the same for every kind;
- `plan_parts(spec, profile, options, paths)`: the commands, env, workdir, notes and arms of the launch plan
  (gates.plan.gate_plan wraps them with the image, mounts and limits); the same function gives the commands a
  run executes here (`paths` = this host's) and the ones a launcher renders (`paths` = the image's);
- `serves`: an engine serving a model (the models folder mounted, leader/worker pods);
- the other roles are one typed object each, declared by the kind as data and asked through it, never the gate:
  `kernels` (gates.kerneluse.KernelUse: `prebuilt(spec)` the kernels container mode takes from the image,
  `rebuilt_by(spec)` the kernels whose bump re-runs it, `line(...)` the plan's kernels line); `launcher`
  (gates.launcher.Launcher: `launches(spec, options)` how many watchdog-bounded launches a run makes, the
  container's time limit; `mpi_launch(spec, profile)`; `unrenderable(spec, profile)`); `evidence`
  (evidence.kind.Evidence: `rederive(gate, doc, folder, spec)` for verify-report, `baseline_bars(root, spec)` for
  the bump PR body);
- `run(options, ctx)`: the staged run (below) into a GateReport.

The staged run (`Gate.run`, a template the kinds fill in, nox-style small stages):
  start -> sources (fetch/patch/verify, or the image's manifest) -> skip (no profile or hardware for it: SKIP with
  the reason, never a pass) -> prepare (kernels, tools) -> launch (the plan's own commands for this node) -> judge
  (parse, checks, verdict) -> finish (timings, times, data, `provenance.project`: the commit and whether the tree
  was dirty, reprostack.project).

Invariants: a gate class never imports another gate's module; the registry is the only list of gates; no kind has
a profile rule of its own (gates.profiles; a kind differs by its `no_fit` line only); Gate's methods are the protocol
above and nothing else (its kernels, launch traits and evidence are objects; tests/test_gate_protocol.py); a stage
returns a report to end the run early (skip, error) or None to go on; bad operator input raises ReprostackError
before anything runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Generic, cast

from .. import hostinfo, project
from ..launch.plan import NODE_WAIT_S, Outputs
from ..launch.rendezvous import NodeRun
from ..lock import Lock
from ..report import GateReport, Result, artifact_for, decide, evaluate, skipped, utc_now
from . import profiles
from ..evidence.kind import Evidence
from .kerneluse import KernelUse
from .launcher import Launcher
from .options import GateOptions
from .spec import GateSpecError, HardwareProfile, NoProfileForHost, ProfileT as P, Requiring, SpecT as S
from .state import KindState

if TYPE_CHECKING:
    from ..sources import FetchOptions
    from .standin import StandIn

# in the images: the verified trees the recipes copy (containers/deepep: /opt/reprostack/src/<pin>); this project
# (drivers, reprostack itself) mounted read-only at /workspace; reports at /out
SRC, WORK, OUT, CACHE, MODELS = "/opt/reprostack/src", "/workspace", "/out", "/cache", "/models"
KERNELS = "/opt/reprostack/kernels"  # binaries an image builds for a gate (nccl-tests)
MASTER = "${MASTER_ADDR}"  # filled per cluster by the launcher (Slurm: first node; k8s: headless Service)
MASTER_PORT = 29500


@dataclass(frozen=True)
class Paths:
    """Where a plan's commands find things. IMAGE_PATHS: inside the gate's image (the verified trees under
    /opt/reprostack/src/<pin>, this project at /workspace, reports at /out, the master from the launcher);
    `Paths.host(...)`: on this host after `prepare` (the cached trees, the project root, the report folder, the
    operator's --python and rendezvous)."""

    work: str = WORK
    out: str = OUT
    cache: str = CACHE
    python: str = "python3"
    src_root: str = SRC
    sources: tuple[tuple[str, str], ...] = ()
    master: str | None = MASTER
    master_port: int | None = MASTER_PORT
    one_node_master: str | None = "127.0.0.1"
    image: bool = True
    server_port: int | None = None  # a serving gate's port, chosen once per run (None: the spec's)
    builds: tuple[tuple[str, str], ...] = ()  # component -> the folder of its binaries (on this host: after prepare)

    def source(self, pin: str) -> str:
        """The folder of pin `pin`'s verified (patched) tree."""
        return dict(self.sources).get(pin, f"{self.src_root}/{pin}")

    def build(self, component: str) -> str:
        """The folder of `component`'s built binaries (in the image: /opt/reprostack/kernels/<component>/bin)."""
        return dict(self.builds).get(component, f"{KERNELS}/{component}/bin")

    def with_builds(self, builds: dict) -> "Paths":
        from dataclasses import replace

        return replace(self, builds=tuple(sorted({**dict(self.builds), **builds}.items())))

    def rendezvous(self, nodes: int) -> tuple[str | None, int | None]:
        """(address, port) of the rendezvous on `nodes` node(s)."""
        return (self.master if nodes > 1 else self.one_node_master), self.master_port

    @classmethod
    def host(cls, *, root, out, cache, python: str, trees: dict | None = None, opts: GateOptions | None = None):
        """This host's paths: `trees` {pin: SourceTree or path}, the operator's rendezvous from `opts`."""
        srcs = tuple(sorted((n, str(getattr(t, "path", t))) for n, t in (trees or {}).items()))
        o = opts or GateOptions()
        return cls(
            work=str(root),
            out=str(out),
            cache=str(cache),
            python=python,
            src_root="",
            sources=srcs,
            master=o.master_addr,
            master_port=o.master_port,
            one_node_master=o.master_addr,
            image=False,
        )


IMAGE_PATHS = Paths()


@dataclass(frozen=True)
class PlanParts:
    """What a gate kind contributes to its launch plan (reprostack.launch.plan.LaunchPlan): one command per node
    (the DeepEP arm's), the env, the working folder, notes, and every arm with its commands."""

    commands: tuple
    env: tuple[tuple[str, str], ...]
    workdir: str
    notes: tuple[str, ...] = ()
    arms: tuple = ()


@dataclass(frozen=True)
class RunContext:
    """What a run needs besides the operator's options: the project root, the lock, how to fetch sources."""

    root: Path
    lock: Lock
    fetch: FetchOptions | None = None
    # provenance.project of the run (reprostack.project.state), read by the command before it wrote anything; None:
    # read when the gate's run starts
    project: dict | None = None

    @property
    def cache_root(self) -> Path:
        return Path(self.fetch.cache.root)


def env_tuple(*maps) -> tuple[tuple[str, str], ...]:
    """The maps merged in order (later wins), as the sorted pairs a plan holds."""
    out: dict[str, str] = {}
    for m in maps:
        out.update({str(k): str(v) for k, v in (m or {}).items()})
    return tuple(sorted(out.items()))


@dataclass
class RunState(Generic[S, P]):
    """What flows through the stages of one run: the options and context, the spec, the host inventory, the
    chosen profile, the timings, provenance and data that every report of the run carries."""

    gate: Gate[S, P]
    opts: GateOptions
    ctx: RunContext
    spec: S
    host: dict = field(default_factory=dict)
    profile: P | None = None  # set by the skip stage
    prov: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    artifacts: list = field(default_factory=list)
    started: str = field(default_factory=utc_now)
    t0: float = field(default_factory=time.monotonic)
    kind: KindState = field(default_factory=KindState)  # the kind's own values between its stages (Gate.state)
    project: dict = field(default_factory=dict)  # provenance.project: the commit and whether the tree was dirty
    standin: StandIn | None = None  # when REPROSTACK_STANDIN asks for the GPU stand-in

    @property
    def out_dir(self) -> Path:
        return self.opts.out_dir

    @property
    def timeout_s(self) -> float:
        return self.opts.timeout or self.spec.timeout_s

    # ---- the output contract (reprostack.launch.plan.Outputs): where this node writes, who reports

    @property
    def node(self) -> int:
        return int(self.opts.node_rank)

    @property
    def outputs(self) -> Outputs:
        nodes = self.opts.nodes or (self.profile.nodes if self.profile is not None else 1)
        wait = self.standin.wait_s if self.standin is not None and self.standin.wait_s else NODE_WAIT_S
        return Outputs(nodes, wait_s=wait)

    @property
    def reporter(self) -> bool:
        """Whether this node writes the reports (node 0; every node of a one-node run)."""
        return self.outputs.writes_reports(self.node)

    @property
    def node_run(self) -> NodeRun:
        """This node's view of the run for the rendezvous of its nodes (reprostack.launch.rendezvous)."""
        return NodeRun(self.outputs, self.out_dir, self.opts.run_id, self.gate.stem)

    def rank_log(self, stem: str, node=None) -> Path:
        """This node's (or `node`'s) log of its ranks for the gate's command `stem` (test_ep, an arm)."""
        return self.node_run.rank_log(stem, self.node if node is None else node)

    def rank_logs(self, stem: str) -> list[Path]:
        """Every node's log of `stem`, node 0 first."""
        return [self.rank_log(stem, n) for n in range(self.outputs.nodes)]

    def timed(self, key: str, since: float) -> None:
        self.timings[key] = round(time.monotonic() - since, 2)

    def skip(self, why: str, profile: str | None = None) -> GateReport:
        return skipped(self.gate.stem, profile or self.opts.profile or "-", why, provenance=self.prov)

    def error(self, why: str) -> GateReport:
        return GateReport(self.gate.stem, self.profile.name, Result.ERROR, why, provenance=self.prov)

    def worker_done(self, what: str, ok: bool, logs: list[Path]) -> GateReport:
        """A worker's part is over: the report it returns is never written (only the reporter writes reports,
        launch.plan.Outputs); the CLI prints it and writes the node's rc (0 when `ok`)."""
        o = self.outputs
        rep = GateReport(
            self.gate.stem,
            self.profile.name,
            Result.SKIP if ok else Result.ERROR,
            f"worker node {self.node} of {o.nodes}: {what}; the verdict is node {o.reporter}'s report",
            provenance=self.prov,
            artifacts=[artifact_for(p, relative_to=self.out_dir) for p in logs if p.is_file()],
        )
        rep.data["node"] = {"node": self.node, "role": "worker", "ok": ok}
        return rep

    def finish(self, report: GateReport) -> GateReport:
        """The report with this run's data, times, duration and project commit (every report of a run ends here). A
        judged run on other hardware than its profile's (gates.profiles.hardware_mismatch) is never evidence for it,
        whoever chose the profile: `evidence` false, the reason and `provenance.hardware_mismatch` say why."""
        self.timings["total_s"] = round(time.monotonic() - self.t0, 2)
        other = profiles.hardware_mismatch(self.profile, self.host) if self.profile is not None else None
        if other and str(report.result) in ("pass", "fail", "inconclusive"):
            report.evidence = False
            report.provenance["hardware_mismatch"] = other
            report.reason = f"not evidence for profile {self.profile.name} ({other}): {report.reason}"
        if self.project:
            report.provenance.setdefault("project", self.project)
        report.data = {**self.data, **report.data}
        if self.standin is not None:  # never evidence, and every report it touched says so
            from .standin import NOTE

            report.evidence = False
            report.provenance["stand_in"] = self.standin.record()
            if not report.reason.startswith(NOTE):
                report.reason = f"{NOTE}: {report.reason}"
        report.started, report.ended, report.duration_s = self.started, utc_now(), self.timings["total_s"]
        return report


class Gate(Generic[S, P]):
    """One gate (see the module doc). `name`: what the operator types (`gate nemo-rl`); `stem`: its spec file and
    report name (`spec_file` gates/nemo_rl.yaml under the root, `report_name` nemo_rl: nemo_rl.json); `requires`: the
    gates that must pass first (None: the spec's own `requires:`)."""

    kind: ClassVar[str] = ""  # shown in docs and errors; nothing branches on it
    serves: ClassVar[bool] = False  # an engine serving a model: the models mount, leader/worker pods
    state: ClassVar[type[KindState]] = KindState  # what the kind keeps between its stages (gates.state)
    no_fit: ClassVar[str] = profiles.NO_FIT  # the SKIP's line when no profile fits the host (gates.profiles)
    kernels: ClassVar[KernelUse] = KernelUse()  # its kernels: prebuilt, rebuilt by, the plan's line (gates.kerneluse)
    launcher: ClassVar[Launcher] = Launcher()  # launches, MPI launch, renderable (gates.launcher)
    evidence: ClassVar[Evidence] = Evidence()  # re-derivation and baseline bars of its reports (evidence.kind)

    def __init__(self, name: str, stem: str | None = None, requires: tuple[str, ...] | None = ()):
        self.name, self.stem, self.requires = name, stem or name, requires
        self.report_name = self.stem  # its report: <report_name>.json
        self.spec_file = Path("gates") / f"{self.stem}.yaml"  # its spec, under the project root
        self.earlier: tuple[str, ...] = ()  # the gates before this one in the registry (gates.registry sets it)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # ---------------------------------------------------------------- spec

    def load(self, root: Path) -> S:
        """The validated spec. Raises GateSpecError (file:line)."""
        raise NotImplementedError

    def spec_for(self, root: Path, lock: Lock | None) -> S:
        """The spec as the lock's selected stack runs it (default: as loaded; a kind with `stacks:` applies it)."""
        return self.load(root)

    def requirements(self, root: Path, profile: P | None = None) -> tuple[str, ...]:
        """Gate names that must pass before this one runs (on `profile`, when known): the object's, else the spec's
        `requires:`, each a gate before it in the registry (`earlier`, set there). Raises GateSpecError for a name
        that is not."""
        if self.requires is not None:
            return self.requires
        spec = cast(Requiring, self.load(root))
        earlier = self.earlier
        for i, r in enumerate(spec.requires):
            if r not in earlier:
                raise GateSpecError(
                    str(spec.path),
                    spec.lines.get(("requires", i)) or spec.lines.get(("requires",)),
                    f"requires[{i}]",
                    f"{r!r} is not a gate that runs before {self.name} (those: {', '.join(earlier) or 'none'})",
                )
        return tuple(spec.requires)

    def plan_parts(self, spec: S, profile: P, opts: GateOptions, paths: Paths) -> PlanParts:
        """The commands, env, workdir, notes and arms of the launch plan (module doc)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- the staged run

    def run(self, opts: GateOptions, ctx: RunContext) -> GateReport:
        """Run the gate here (host mode) and return its report, not yet written. Raises ReprostackError only for
        operator errors found before anything ran."""
        from . import standin

        opts, stand_in, kind = self.check_options(opts), standin.from_env(ctx.root), self.state()
        started, t0 = utc_now(), time.monotonic()  # the run's clock starts before its project state and spec
        proj = ctx.project if ctx.project is not None else project.state(ctx.root)
        spec = self.spec_for(ctx.root, ctx.lock)
        st = RunState(self, opts, ctx, spec, started=started, t0=t0, kind=kind, project=proj, standin=stand_in)
        self.check_request(st)
        st.host = st.standin.host_facts() if st.standin is not None else hostinfo.collect()
        self.sources(st)
        for stage in (self.skip, self.prepare, self.launch_and_judge):
            report = stage(st)
            if report is not None:
                return self.finish(st, report)
        raise AssertionError(f"gate {self.name}: launch_and_judge returned no report")

    def finish(self, st: RunState[S, P], report: GateReport) -> GateReport:
        """Every report of the run passes here (data, times, duration; a kind may add what all its reports say)."""
        return st.finish(report)

    def check_options(self, opts: GateOptions) -> GateOptions:
        """The options as this gate takes them (defaults filled in); ReprostackError for a value it cannot take,
        before its spec is even read."""
        return opts

    def check_request(self, st: RunState[S, P]) -> None:
        """Raise ReprostackError for options this gate cannot take (before anything runs)."""
        if st.opts.profile:
            st.spec.profile(st.opts.profile)

    def sources(self, st: RunState[S, P]) -> None:
        """Fetch, patch and verify the sources the gate runs (or check the image's); record provenance."""

    def skip(self, st: RunState[S, P], what: str = "") -> GateReport | None:
        """A SKIP when no profile or hardware fits (sets `st.profile` otherwise). `what`: what the kind did without a
        GPU (its sources verified); given, a host without a GPU is a SKIP first, and each reason ends with it."""
        if what and st.host.get("gpu_count", 0) == 0:
            return st.skip(f"no GPU on this host (nvidia-smi lists none): {what}")
        try:
            st.profile = profiles.resolve(st.spec, st.opts.profile, st.host, self.no_fit)
        except NoProfileForHost as e:
            return st.skip(f"{e}: {what}", "-") if what else st.skip(str(e))
        gap = profiles.hardware_gap(st.profile, st.host)
        return st.skip(gap, st.profile.name) if gap else None

    def prepare(self, st: RunState[S, P]) -> GateReport | None:
        """Kernels and tools; an ERROR report when they cannot be made."""

    def launch_and_judge(self, st: RunState[S, P]) -> GateReport:
        """Launch the plan's commands for this node, parse their output, judge it: the verdict's report."""
        raise NotImplementedError


def verdict(profile: HardwareProfile, checks: list, spec_file: str = "gates/micro.yaml") -> tuple[Result, str]:
    """(result, reason) of a run that completed. A profile whose bars are not measured never passes: a
    failing `bars_status` check is added to `checks` (in place; its note gives the spec's `bars-status-why`) and the
    result is FAIL with the reason "profile X has no measured bar yet; numbers reported" (plus any other failed
    check)."""
    if profile.measured:
        return decide(checks, ran_ok=True)
    others = [c for c in checks if not c.passed]
    why = f"profile {profile.name} has no measured bar yet; numbers reported"
    own = profile.bars_status_why
    note = f"{why} ({spec_file}: bars-status)" + (f": {own}" if own else "")
    checks.append(evaluate("bars_status", "", profile.bars_status, "==", "measured", note=note))
    _, more = decide(others, ran_ok=True) if others else (None, "")
    return Result.FAIL, why + (f"; also: {more}" if more else "")
