"""Run gates: one (`gate G`) or all of them in dependency order (`all-gates`), into GateReports.

Invariants:
- `run_gate` runs one gate of the registry with the operator's options; bad input (a spec that does not load, an
  unknown profile or arm) raises ReprostackError before anything runs (the CLI: one line, exit 2).
- `run_all` always returns one report per gate of the registry whose spec file exists, in registry order, and
  never raises for one gate's trouble: a gate whose requirement did not pass is NOT-RUN (naming it), a gate
  whose spec or run raised is an ERROR report with the one-line reason (an internal error's traceback goes to
  stderr), so the combined report is always written. A gate without a profile for the host is the gate's own
  SKIP, and so is a gate without the profile named by `--profile` (never a pass). Gates of the registry
  without a spec file are left to the summary's MISSING rows.
"""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from .. import hostenv
from ..errors import ReprostackError
from ..report import GateReport, Result, not_run, skipped, utc_now
from .registry import GATES, Gate


@dataclass
class GateArgs:
    """The operator's options for a gate run (from the CLI's `gate`/`all-gates` arguments).
    arms: arm names (already split on commas); vars: `--var K=V` values; server_args: `--server-arg`s."""

    out: Path
    profile: str | None = None
    python: str = sys.executable
    jobs: int | None = None
    arch: str | None = None
    nodes: int | None = None
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    modes: str = "first"
    trials: int | None = None  # --trials K: repeated trials of a measurement (micro: default 5, report.stats)
    timeout: float | None = None
    arms: list[str] = field(default_factory=list)
    vars: dict = field(default_factory=dict)
    server_args: list[str] = field(default_factory=list)
    legacy: bool = False
    container: bool = False  # --container: run inside the image (gates.container); default: host mode
    image: str | None = None  # --image: the image to run in (default: the recipe's last build here)
    kernels_manifest: str | None = None  # --kernels-manifest: the image's prebuilt kernels (the in-image runner)


def run_gate(g: Gate, a: GateArgs, lock, root: Path, fetch) -> GateReport:
    """Run gate `g` and return its report (not yet written), its provenance saying where it ran: with
    `a.container`, inside the image (reprostack.gates.container: `execution.mode` "container", image id and repo
    digests); else in host mode (`execution` holds the mode, the environment fingerprint of `--python` and its
    drift from the locked wheelset, see reprostack.hostenv). Raises ReprostackError for bad input."""
    if a.kernels_manifest and not a.container:
        from .container import uses_prebuilt

        if not uses_prebuilt(g, g.load(root)):
            raise ReprostackError(
                f"--kernels-manifest: gate {g.stem} builds no kernels of its own (only the micro "
                f"and training gates with `kernels:` take them from an image's manifest)"
            )
    from .. import ui

    with ui.step(f"gate {g.name}" + (" (container)" if a.container else "")) as s:
        if a.container:
            from .container import run_in_container

            report = run_in_container(g, a, lock, root)
        else:
            report = _run_gate(g, a, lock, root, fetch)
            if report.result in (
                Result.PASS,
                Result.FAIL,
                Result.INCONCLUSIVE,
                Result.ERROR,
            ):  # it ran here: say on what
                report.provenance.setdefault("execution", hostenv.host_execution(lock, a.python))
        s.outcome = report.label()
    return report


def _gpu_options(a: GateArgs, lock, root: Path, fetch) -> dict:
    """The GateRunOptions fields (gates.micro) of a GPU gate run, from the operator's options: one place for
    what micro and the training gates share."""
    return dict(
        root=root,
        lock=lock,
        fetch=fetch,
        out_dir=Path(a.out),
        profile=a.profile,
        python=a.python,
        jobs=a.jobs,
        arch=a.arch,
        nodes=a.nodes,
        node_rank=a.node_rank,
        master_addr=a.master_addr,
        master_port=a.master_port,
        timeout_s=a.timeout,
        prebuilt=Path(a.kernels_manifest) if a.kernels_manifest else None,
    )


def _run_gate(g: Gate, a: GateArgs, lock, root: Path, fetch) -> GateReport:
    if g.kind == "training":
        from .training import TrainingOptions

        opts = TrainingOptions(**_gpu_options(a, lock, root, fetch), arms=list(a.arms) or None)
        if g.stem == "megatron":
            from .training import run_megatron

            return run_megatron(opts)
        from .nemo_rl import run_nemo_rl

        return run_nemo_rl(opts)
    if g.kind == "micro":
        from .arms import parse_arms
        from .micro import MicroOptions, run_micro

        return run_micro(
            MicroOptions(
                **_gpu_options(a, lock, root, fetch),
                modes=a.modes,
                arms=parse_arms(",".join(a.arms) or "deepep"),
                legacy=a.legacy,
                **({"trials": a.trials} if a.trials is not None else {}),
            )
        )
    from .serving import ServingOptions, run_serving

    return run_serving(
        g.stem,
        ServingOptions(
            root=root,
            lock=lock,
            out_dir=Path(a.out),
            cache_root=fetch.cache.root,
            profile=a.profile,
            node_rank=a.node_rank,
            leader_addr=a.master_addr,
            arms=list(a.arms),
            vars=dict(a.vars),
            extra_server_args=list(a.server_args),
            python=sys.executable,
            trials=a.trials,
        ),
    )


def required() -> set[str]:
    """Report names every all-gates run requires (a gate without a spec file is MISSING, never a pass)."""
    return {g.report_name for g in GATES}


def _error(g: Gate, a: GateArgs, why: str) -> GateReport:
    now = utc_now()
    return GateReport(g.report_name, a.profile or "-", Result.ERROR, why, started=now, ended=now, duration_s=0.0)


def run_all(a: GateArgs, lock, root: Path, fetch, *, run=None) -> list[GateReport]:
    """Every gate whose spec exists under `root`, in dependency order; see the module doc. `run`: the function
    that runs one gate (default run_gate)."""
    run = run or run_gate
    reports: dict[str, GateReport] = {}  # by gate name
    for g in (g for g in GATES if g.spec_file(root).is_file()):
        try:
            spec, needs = g.load(root), g.requirements(root)
        except ReprostackError as e:
            reports[g.name] = _error(g, a, f"spec: {e}")
            continue
        blocker = next((reports[d] for d in needs if d in reports and reports[d].result != Result.PASS), None)
        if blocker is not None:
            reports[g.name] = not_run(g.report_name, blocker)
            continue
        if a.profile and a.profile not in spec.profiles:  # --profile names one gate's hardware, not every gate's
            reports[g.name] = skipped(
                g.report_name,
                a.profile,
                f"{spec.path.name} has no profile {a.profile!r} (known: {', '.join(spec.profiles)})",
            )
            continue
        try:
            rep = run(g, a, lock, root, fetch)
        except ReprostackError as e:
            rep = _error(g, a, str(e))
        except Exception as e:  # one gate's crash must not cost the combined report
            traceback.print_exc()
            rep = _error(g, a, f"internal error: {type(e).__name__}: {e} (traceback on stderr)")
        rep.gate = g.report_name
        reports[g.name] = rep
    return list(reports.values())
