"""Run gates: one (`gate G`) or all of them in dependency order (`all-gates`), into GateReports.

Invariants:
- every report records `provenance.project` (the commit and whether the tree was dirty, reprostack.project), the
  one the command read before the run (`RunContext.project`);
- `run_gate` runs one gate of the registry with the operator's options (gates.options.GateOptions) through the
  Gate protocol (gates.base: `Gate.run`, or container mode); it never looks at a gate's kind; bad input (a spec that does not load, an
  unknown profile or arm) raises ReprostackError before anything runs (the CLI: one line, exit 2).
- `run_all` always returns one report per gate of the registry whose spec file exists, in registry order, and
  never raises for one gate's trouble: a gate whose requirement did not pass is NOT-RUN (naming it), a gate
  whose spec or run raised is an ERROR report with the one-line reason (an internal error's traceback goes to
  stderr), so the combined report is always written. A gate without a profile for the host is the gate's own
  SKIP, and so is a gate without the profile named by `--profile` (never a pass). Gates of the registry
  without a spec file are left to the summary's MISSING rows.
"""

from __future__ import annotations

import traceback

from .. import hostenv, hostinfo
from ..errors import ReprostackError
from ..report import GateReport, Result, not_run, skipped, utc_now
from . import profiles
from .base import Gate, RunContext
from .options import GateOptions
from .registry import GATES
from .spec import HardwareProfile, Spec


def run_gate(g: Gate, opts: GateOptions, ctx: RunContext) -> GateReport:
    """Run gate `g` and return its report (not yet written), its provenance saying where it ran: with
    `opts.container`, inside the image (reprostack.gates.container: `execution.mode` "container", image id and repo
    digests); else in host mode (`execution` holds the mode, the environment fingerprint of `--python` and its
    drift from the locked wheelset, see reprostack.hostenv). Raises ReprostackError for bad input."""
    if opts.kernels_manifest and not opts.container and not g.kernels.prebuilt(g.load(ctx.root)):
        raise ReprostackError(
            f"--kernels-manifest: gate {g.stem} builds no kernels of its own (only the gates that build "
            f"kernels take them from an image's manifest)"
        )
    from .. import ui

    with ui.step(f"gate {g.name}" + (" (container)" if opts.container else "")) as s:
        if opts.container:
            from .container import run_in_container

            report = run_in_container(g, opts, ctx)
        else:
            report = run_here(g, opts, ctx)
        s.outcome = report.label()
    if ctx.project is not None:  # the checkout's commit, as the command read it (an image's copy may have no .git)
        report.provenance["project"] = ctx.project
    return report


def run_here(g: Gate, opts: GateOptions, ctx: RunContext) -> GateReport:
    """Gate `g`'s staged run on this host (host mode), its provenance saying on what it ran."""
    report = g.run(opts, ctx)
    if report.result in (Result.PASS, Result.FAIL, Result.INCONCLUSIVE, Result.ERROR):  # it ran here: say on what
        report.provenance.setdefault("execution", hostenv.host_execution(ctx.lock, opts.python))
    return report


def _profile_here(g: Gate, spec: Spec, name: str | None, host: dict) -> HardwareProfile | None:
    """The profile gate `g` would run on this host (None: none fits, or `name` is not one of its profiles)."""
    try:
        return profiles.resolve(spec, name if name in spec.profiles else None, host, g.no_fit)
    except ReprostackError:
        return None


def required() -> set[str]:
    """Report names every all-gates run requires (a gate without a spec file is MISSING, never a pass)."""
    return {g.report_name for g in GATES}


def _error(g: Gate, opts: GateOptions, why: str) -> GateReport:
    now = utc_now()
    return GateReport(g.report_name, opts.profile or "-", Result.ERROR, why, started=now, ended=now, duration_s=0.0)


def run_all(opts: GateOptions, ctx: RunContext, *, run=None) -> list[GateReport]:
    """Every gate whose spec exists under the project root, in dependency order; see the module doc. `run`: the
    function that runs one gate (default run_gate)."""
    run = run or run_gate
    root = ctx.root
    reports: dict[str, GateReport] = {}  # by gate name
    host = hostinfo.collect()  # which profile each gate would take here: a requirement may depend on it
    for g in (g for g in GATES if (root / g.spec_file).is_file()):
        try:
            spec: Spec = g.load(root)
            needs = g.requirements(root, _profile_here(g, spec, opts.profile, host))
        except ReprostackError as e:
            reports[g.name] = _error(g, opts, f"spec: {e}")
            continue
        blocker = next((reports[d] for d in needs if d in reports and reports[d].result != Result.PASS), None)
        if blocker is not None:
            reports[g.name] = not_run(g.report_name, blocker)
            continue
        if opts.profile and opts.profile not in spec.profiles:  # --profile names one gate's hardware, not every gate's
            reports[g.name] = skipped(
                g.report_name,
                opts.profile,
                f"{spec.path.name} has no profile {opts.profile!r} (known: {', '.join(spec.profiles)})",
            )
            continue
        try:
            rep = run(g, opts, ctx)
        except ReprostackError as e:
            rep = _error(g, opts, str(e))
        except Exception as e:  # one gate's crash must not cost the combined report
            traceback.print_exc()
            rep = _error(g, opts, f"internal error: {type(e).__name__}: {e} (traceback on stderr)")
        rep.gate = g.report_name
        reports[g.name] = rep
    if ctx.project is not None:  # every report of the run, not-run and errors too, names the commit
        for r in reports.values():
            r.provenance.setdefault("project", ctx.project)
    return list(reports.values())
