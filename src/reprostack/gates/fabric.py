"""Gate 0 (fabric): NVIDIA's nccl-tests (all_reduce_perf, alltoall_perf) built against the stack's pinned NCCL and run
over the profile's GPUs and nodes; the gate under every other gate (FabricGate, first in gates.registry).

The Gate class (FabricGate) runs the staged run of gates.base: sources (nccl-tests and, unless the stack takes NCCL
from a wheel alone, the nccl tree, fetched, patched and verified) -> skip (no GPU, no profile fits, too few GPUs,
no EFA: SKIP naming what was verified) -> prepare (the pinned NCCL and the keyed nccl-tests build; a profile whose
launcher this runner cannot start, MPI, is an ERROR saying what it needs) -> launch (the plan's command of each test
for this node, under the watchdog, the pinned NCCL first on the library path) -> judge (the functions below).

Its pure functions: node_commands(spec, profile, bin_dir, nodes=, node_rank=, master_addr=, nccl_lib=): per test
one TestCommand, the argv (the binary, the spec's args, `-g <gpus-per-node>`, `-N <trials>`) and env (the spec's,
then the profile's), the same for the plan and the run. Its judge (parse, checks, transport_check, figures) is
evidence.judge.fabric; what verify-report re-derives of its reports is evidence.rederive.fabric.

Trials: one launch per test, `-N trials` cycles of the whole sweep in it (nccl-tests' own repetition: the same
communicator and buffers, no re-initialisation between cycles), so each size has `trials` samples and a bar is
judged on their 95% interval (PASS only when the whole interval clears it; one cycle is INCONCLUSIVE).

Multi-node (profile launcher `mpi`): nccl-tests has no bootstrap between processes without MPI (kernels/nccl-tests.yaml),
so the deepep image's nccl-tests built with MPI=1 runs one MPI rank per GPU (`-g 1`), started by the MPI runtime
(`srun --mpi=pmix` under pyxis, an MPIJob's mpirun on EKS: gates.fabric_mpi, rendered by cluster.slurm / cluster.k8s);
node rank and master address come from MPI, not from the argv. This runner then judges what those launches wrote
(`--launched-logs DIR`: every rank's output and the exit status of each test), with the same checks as a local run.

Verdict (the Gate class's): a profile whose bars are unmeasured reports every number and never passes (micro's rule);
a transport check that fails is a FAIL naming the ranks; no output at all is an ERROR, not a FAIL.

Invariants: no function here starts a process except FabricGate's prepare (the keyed builds) and launch (under
launch.watchdog, each test's output kept whole in its log); checks never pass on a missing or non-finite number
(report.evaluate, in evidence.judge.fabric).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .. import ui
from ..errors import GateError, ReprostackError
from ..kernels import nccltests, toolchain
from ..kernels import preflight as kpreflight
from ..kernels.recipe import load_recipe
from ..launch import plan as lp
from ..launch.watchdog import run_with_watchdog
from ..report import GateReport, artifact_for, decide
from ..sources import SourceTree
from .base import Gate, Paths, PlanParts, RunState, env_tuple, verdict
from .fabric_spec import FabricBar, FabricSpec, load_fabric_spec, resolve_bars
from ..evidence.kind import Evidence
from ..evidence.judge.fabric import FabricParse, checks, figures, parse
from ..evidence.rederive.fabric import rederive_fabric
from .kernelprep import built_provenance, prepare_nccl, provenance, source_trees
from .kerneluse import KernelUse, built_kernels_line, kernel_pins
from .launcher import Launcher
from .options import GateOptions
from . import fabric_mpi, profiles, transport
from .spec import Profile
from .state import KindState

if TYPE_CHECKING:
    from ..lock.model import Lock

EFA_TRANSPORT = transport.EFA_TRANSPORT


@dataclass(frozen=True)
class TestCommand:
    """What one node runs for one test: `argv` (the binary's path first), `env` (overrides of the process env),
    `launcher` (`local`: this process drives the node's GPUs; `mpi`: one MPI rank of `ranks` per node), `needs`
    (what must be true before it can run, in words; empty when nothing)."""

    test: str
    binary: str
    argv: tuple[str, ...]
    env: dict
    launcher: str
    nodes: int
    node_rank: int
    gpus_per_node: int
    timeout_s: float
    needs: tuple[str, ...] = ()
    master_addr: str | None = None


def node_commands(
    spec: FabricSpec,
    profile: Profile[FabricBar],
    bin_dir: Path | str,
    *,
    nodes: int | None = None,
    node_rank: int = 0,
    master_addr: str | None = None,
) -> tuple[TestCommand, ...]:
    """One TestCommand per test of the spec for node `node_rank` of `nodes` (default: the profile's). Raises
    GateError for a node count other than the profile's, a node rank out of range, or a multi-node profile whose
    launcher is not `mpi` (nccl-tests cannot span processes without MPI)."""
    nodes = profile.nodes if nodes is None else nodes
    if nodes != profile.nodes:
        raise GateError(f"{spec.path}: profile {profile.name} is {profile.nodes} node(s), not {nodes}")
    if not 0 <= node_rank < nodes:
        raise GateError(f"{spec.path}: node rank {node_rank} is not one of 0..{nodes - 1}")
    if nodes > 1 and profile.launcher != "mpi":
        raise GateError(f"{spec.path}: profile {profile.name} spans {nodes} nodes: its launcher must be mpi")
    needs, per_process = (), profile.gpus_per_node
    if profile.launcher == "mpi":  # one MPI rank per GPU, as operators run it (gates.fabric_mpi)
        per_process = 1
        needs = (
            "the deepep image's nccl-tests built with MPI=1 against its Open MPI (containers/deepep)",
            f"started by the MPI runtime, {profile.gpus_per_node} rank(s) per node: `srun --mpi=pmix` under pyxis "
            f"(reprostack launch slurm) or an MPIJob's mpirun (reprostack launch k8s); this runner then judges "
            f"what they wrote (--launched-logs)",
        )
    env = {**spec.env, **profile.env}
    out = []
    for name, t in spec.tests.items():
        argv = (str(Path(bin_dir) / t.binary), *t.args, "-g", str(per_process), "-N", str(spec.trials))
        out.append(
            TestCommand(
                name,
                t.binary,
                argv,
                dict(env),
                profile.launcher,
                nodes,
                node_rank,
                profile.gpus_per_node,
                spec.timeout_s,
                needs,
                master_addr,
            )
        )
    return tuple(out)


@dataclass
class FabricState(KindState):
    """What the fabric gate keeps between its stages: the verified trees by pin (sources; none for an MPI launch's
    logs), the nccl-tests binaries and the pinned NCCL they load, its folder and version (prepare; the image's for
    an MPI launch's logs)."""

    trees: dict[str, SourceTree] = field(default_factory=dict)
    bin_dir: Path | None = None
    nccl_lib: Path | None = None
    nccl_version: str | None = None


FabricRun = RunState[FabricSpec, Profile[FabricBar]]  # one run of the fabric gate


def kernels_line(spec: FabricSpec, lock: Lock, image: lp.ImageRef | None, mode: str) -> str:
    """nccl-tests built on the host (host mode), or by the in-image runner into its cache (container mode)."""

    if mode != lp.MODE_CONTAINER:
        return built_kernels_line(spec, lock, image, mode, pins=tuple(spec.kernels))
    words = "; ".join(kernel_pins(spec, lock, tuple(spec.kernels)))
    return (
        f"nccl-tests is not prebuilt in image {image.recipe if image else '?'} yet (its commands name "
        f"/opt/reprostack/kernels/nccl-tests/bin, where an image would put it): the in-image runner fetches, "
        f"verifies and builds it into its cache against the pinned NCCL and runs that build ({words}); a profile "
        f"started by MPI runs the image's MPI=1 build, {fabric_mpi.IMAGE_BIN}"
    )


def mpi_launch(spec: FabricSpec, profile: Profile[FabricBar]) -> fabric_mpi.MpiLaunch | None:
    """A profile whose `launcher` is mpi: the ranks run the image's MPI build (gates.fabric_mpi)."""
    if profile.launcher != "mpi":
        return None
    return fabric_mpi.mpi_launch(spec, profile, node_commands(spec, profile, fabric_mpi.IMAGE_BIN))


def launches(spec: FabricSpec, opts: GateOptions | None) -> int:
    """One launch per test, its cycles inside it."""
    return len(spec.tests)


class FabricGate(Gate[FabricSpec, Profile[FabricBar]]):
    """Gate 0: nccl-tests over the profile's fabric (module doc)."""

    kind = "fabric"
    state = FabricState
    kernels = KernelUse(describe=kernels_line)  # built by the run (no image prebuilds nccl-tests yet)
    launcher = Launcher(count=launches, mpi=mpi_launch)
    evidence = Evidence(from_logs=rederive_fabric)

    def load(self, root: Path) -> FabricSpec:
        return load_fabric_spec(root, self.stem)

    def plan_parts(self, spec: FabricSpec, profile: Profile[FabricBar], opts: GateOptions, paths: Paths) -> PlanParts:
        """Each test's command on every node (`-g gpus-per-node -N trials`); a multi-node profile's notes say what its
        MPI launch needs. `commands` are the first test's."""
        nodes = opts.nodes or profile.nodes
        addr, _ = paths.rendezvous(nodes)
        by_test: dict = {}
        notes: list[str] = []
        for node in range(nodes):
            bins = fabric_mpi.IMAGE_BIN if profile.launcher == "mpi" else paths.build("nccl-tests")
            for c in node_commands(spec, profile, bins, nodes=nodes, node_rank=node, master_addr=addr):
                by_test.setdefault(c.test, []).append(lp.NodeCommand(node, "leader" if node == 0 else "worker", c.argv))
                by_test.setdefault((c.test, "env"), c.env)
                notes += [n for n in c.needs if n not in notes]
        arms = tuple(lp.ArmPlan(t, "test", tuple(by_test[t]), env_tuple(by_test[(t, "env")])) for t in spec.tests)
        return PlanParts(arms[0].commands, arms[0].env, paths.out, tuple(notes), arms)

    # ------------------------------------------------------------------ the staged run

    def sources(self, st: FabricRun) -> None:
        if st.opts.launched_logs:  # the MPI launch ran the image's build: nothing to fetch here
            st.prov = provenance(st.ctx.lock, st.spec, {})
            st.prov["host"] = st.host
            return
        t = time.monotonic()
        trees, _ = source_trees(st.opts.with_(kernels_manifest=None), st.ctx, tuple(st.spec.kernels))
        st.timed("sources_s", t)
        FabricState.of(st).trees = trees
        st.prov = provenance(st.ctx.lock, st.spec, trees)
        st.prov["host"] = st.host
        st.data.update(timings_s=st.timings, sources_reused={n: s.reused for n, s in trees.items()})

    def skip(self, st: FabricRun, what: str = "") -> GateReport | None:
        if st.opts.launched_logs:  # the ranks ran on the profile's nodes; their logs are the evidence
            st.profile = profiles.resolve(st.spec, st.opts.profile, st.host, self.no_fit)
            return None
        trees = FabricState.of(st).trees
        words = ", ".join(f"{n} {t.tree[:12]}" for n, t in sorted(trees.items()))
        return super().skip(st, f"sources verified ({words}); nccl-tests not built or run")

    def prepare(self, st: FabricRun) -> GateReport | None:
        own = FabricState.of(st)
        if (st.profile.launcher == "mpi") != bool(st.opts.launched_logs):
            if st.opts.launched_logs:
                return st.error(f"--launched-logs: profile {st.profile.name} is launched here, not by MPI")
            cmd = node_commands(st.spec, st.profile, "bin")[0]
            return st.error(f"profile {st.profile.name} cannot be launched by this runner: {'; '.join(cmd.needs)}")
        if st.opts.launched_logs:  # the image's NCCL: the nccl-wheel pin the deepep image installs
            own.nccl_version, own.nccl_lib = st.ctx.lock.get("nccl-wheel").version, Path("/opt/reprostack/nccl/lib")
            return None
        trees, prov = own.trees, st.prov
        try:
            tc = toolchain.detect_nvcc(arch=st.opts.arch)
            nccl = prepare_nccl(st.opts, st.ctx, trees, tc, prov, st.timings)
            t = time.monotonic()
            recipe = load_recipe(st.ctx.root, "nccl-tests")
            tree = trees["nccl-tests"]
            nt = nccltests.build_nccl_tests(
                tree.path, tree.tree, recipe, tc, nccl, st.ctx.cache_root, jobs=st.opts.jobs
            )
            st.timed("nccl_tests_build_s", t)
        except ReprostackError as e:
            return st.error(f"setup: {e}")
        prov["kernels"] = built_provenance(nccl, nt)
        prov["toolchain"] = {"nvcc": tc.nvcc_version, "arch": tc.arch, "cuda_home": tc.cuda_home}
        st.artifacts += [artifact_for(b.log) for b in (nccl, nt) if b.log.exists()]
        own.bin_dir, own.nccl_lib = nt.out / "bin", nccl.out / "build" / "lib"
        own.nccl_version = kpreflight.nccl_header_version(nccl.out / "build" / "include")
        return None

    def launch_and_judge(self, st: FabricRun) -> GateReport:
        opts, own = st.opts, FabricState.of(st)
        if opts.launched_logs:
            launch = self.launcher.mpi_launch(st.spec, st.profile)
            folder = Path(opts.launched_logs)
            ran, text, logs = fabric_mpi.read_launched(folder, launch, opts.run_id)
            st.artifacts += [artifact_for(p, relative_to=st.out_dir) for p in logs if p.is_relative_to(st.out_dir)]
            st.data["runs"] = ran
            st.data["launch"] = {"launcher": "mpi", "ranks": launch.ranks, "logs": str(folder)}
            return self._judge(st, ran, parse(text))
        paths = Paths.host(
            root=st.ctx.root, out=st.out_dir, cache=st.ctx.cache_root, python=opts.python, opts=opts
        ).with_builds({"nccl-tests": str(own.bin_dir)})
        parts = self.plan_parts(st.spec, st.profile, opts, paths)
        ran, text = {}, {}
        run_dir = st.out_dir / self.stem
        for arm in parts.arms:
            cmd = next(c for c in arm.commands if str(c.node) == str(opts.node_rank))
            log = run_dir / f"{arm.name}.log"
            env = {**os.environ, **dict(arm.env)}
            rest = env.get("LD_LIBRARY_PATH", "")  # the binaries NEED libnccl.so.2: the pinned one comes first
            env["LD_LIBRARY_PATH"] = str(own.nccl_lib) + (os.pathsep + rest if rest else "")
            with ui.step(f"fabric {arm.name} [{st.profile.name}] x{st.spec.trials} cycle(s)", log=log):
                o = run_with_watchdog(
                    list(cmd.argv), env=env, cwd=str(st.out_dir), timeout_s=st.timeout_s, log_path=log, echo=False
                )
            st.timings[f"{arm.name}_s"] = round(o.duration_s, 2)
            ran[arm.name] = {"command": list(cmd.argv), "returncode": o.returncode, "timed_out": o.timed_out}
            text[arm.name] = log.read_text(errors="replace")
            st.artifacts.append(artifact_for(log, relative_to=st.out_dir))
        st.data["runs"] = ran
        return self._judge(st, ran, parse(text))

    def _judge(self, st: FabricRun, ran: dict, parsed: FabricParse) -> GateReport:
        """The checks and figures of the runs; ERROR when a test did not end with exit 0 (its failure line). The
        profile's measured bars are made first from the accepted runs committed for it (fabric_spec.resolve_bars)."""
        try:
            st.profile, _ = resolve_bars(st.ctx.root, st.profile, stack=st.ctx.lock.stack or "campaign")
        except ReprostackError as e:
            return st.error(f"bars: {e}")
        spec, profile, own = st.spec, st.profile, FabricState.of(st)
        checks_ = checks(spec, profile, parsed, nccl_version=own.nccl_version)
        figs = figures(spec, profile, parsed)
        st.data["figures"] = figs
        st.data["statistics"] = {
            k: v["statistics"] for k, v in figs.items() if isinstance(v, dict) and v.get("statistics")
        }
        st.data["nccl"] = {"pinned": own.nccl_version, "lib": str(own.nccl_lib)}
        st.data["bars_status"] = profile.bars_status
        crashed = {t: r for t, r in ran.items() if r["returncode"] != 0 or r["timed_out"]}
        if crashed:
            why = "; ".join(
                f"{t} {'timed out' if r['timed_out'] else r.get('why') or 'exit ' + str(r['returncode'])}"
                + (f": {parsed.get(t).failures[0]}" if parsed.get(t) and parsed.get(t).failures else "")
                for t, r in crashed.items()
            )
            result, reason = decide(checks_, ran_ok=False, failure_reason=why)
        else:
            result, reason = verdict(profile, checks_, spec.path.name)
        return GateReport(
            self.stem, profile.name, result, reason, checks=checks_, provenance=st.prov, artifacts=st.artifacts
        )
