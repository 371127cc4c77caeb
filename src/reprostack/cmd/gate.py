"""`reprostack gate G` / `reprostack all-gates` (cmd.all_gates): run gates and write their reports; `--plan`
prints each gate's launch plan and runs nothing (gates.runner, gates.plan, report). The run folder and its
`latest` link: reprostack.runs.

Invariants:
- bad input raises before any gate runs and leaves no run folder (runs.RunDir.abandon), `latest` as it was;
- a run that dies at a stage (fetch, patch, build: exit 2) writes an ERROR report saying so and `latest` moves to it,
  so `latest/summary.json` is never an earlier run's verdict; a located error (a bad input file, e.g. an image's
  kernels manifest: errors.LocatedError) is bad input, as above: nothing written;
- exit code: report.exit_code (0 every required gate passed, 1 a gate failed or errored, 3 one was skipped).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import BuildError, FetchError, LocatedError, PatchError, ReprostackError, Signalled
from ..gates.registry import GATE_ORDER, GATE_STEMS
from . import add_source_options, fetch_options, load_lock

HELP = "run a gate and write its reports"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "gate", choices=list(dict.fromkeys([*GATE_ORDER, *GATE_STEMS])), metavar="{" + ",".join(GATE_ORDER) + "}"
    )
    add_gate_options(p)


def run(args) -> int:
    lock, root = load_lock(args)
    return _gates(args, lock, root, fetch_options(args))


def add_gate_options(p: argparse.ArgumentParser) -> None:
    """The options of `gate` and `all-gates` (the source options first)."""
    from ..gates import options as gate_options

    add_source_options(p)
    gate_options.add_arguments(p)  # every gate option, defined once (gates.options)


def _gates(args, lock, root, opts) -> int:
    """`gate NAME` runs one gate (bad input: exit 2); `all-gates` runs every gate in dependency order and always
    writes one combined report (gates.runner). Then the reports, one line per gate, and the exit code."""
    from .. import project, runs, ui
    from ..gates import registry
    from ..gates.base import RunContext
    from ..gates.options import BASELINE_HISTORY, GateOptions
    from ..report import exit_code, utc_now, write_reports

    base = Path(args.out) if args.out else runs.default_base(None if args.cmd == "all-gates" else args.gate)
    ga = GateOptions.from_args(args, out=base)
    if args.image and not args.container:
        raise ReprostackError("--image IMAGE needs --container (host mode runs no image)")
    if args.kernels_manifest and args.container:
        raise ReprostackError(
            "--kernels-manifest is the in-image runner's option: --container already uses the "
            "image's /opt/reprostack/kernels.json"
        )
    near = next((p for p in (base, *base.parents) if p.exists()), None)  # before any gate runs for minutes
    if near is not None and not near.is_dir():
        raise ReprostackError(f"--out {base}: {near} exists and is not a folder")
    if args.plan:
        args.out = str(base)
        return _plans(args, lock, root, opts, ga)
    if not args.out and ((args.nodes or 1) > 1 or args.node_rank > 0):  # each node would stamp its own folder
        raise ReprostackError(
            "a run on several nodes needs --out DIR, the same folder on every node (node 0 reads "
            "every node's log there)"
        )
    # a new folder per run; `latest` moves to it only once its summary is written (runs.RunDir.finish): a run that
    # died leaves `latest` on the last run that finished, and says so; --out DIR is used as given
    if ga.baseline == BASELINE_HISTORY and not ga.baseline_runs:  # the gates never read the history: paths here
        stem = registry.gate(args.gate).stem if args.cmd == "gate" else None
        ga = ga.with_(baseline_runs=history_runs(root, opts.cache.root, lock.stack, stem, ga.profile))
    state = project.state(root)  # the commit and whether the tree is dirty, before this run writes anything
    started = utc_now()
    folder = runs.start(base, given=bool(args.out))
    out = folder.path
    ga, ctx = ga.with_(out=out), RunContext(root, lock, opts, project=state)
    ui.detail(f"reports will be in {out.resolve()}")
    node = _Node(ga, out, root)  # the output contract on several nodes (launch.plan.Outputs)
    sigterm = _Sigterm()
    try:
        reports, required = _run(args, ga, ctx, node, folder, started, sigterm)
        sigterm.hold()  # the run is over: the reports and the rc are written whole
        if not node.reporter:  # a worker: no report (only node 0 writes them); its rc says how its part went
            return node.worker_end(reports)
        for r in reports:  # which of the lock's stacks ran (contract: provenance.stack)
            r.provenance.setdefault("stack", lock.stack)
        written = write_reports(reports, out, required=required)
        folder.finish()
        for line in result_lines(reports):
            print(line)
        print(f"reports: {out.resolve()} ({', '.join(sorted(written))})" + ("" if args.out else f"; {base / 'latest'}"))
        rc = exit_code(reports, required)
        print(_attest(out, reports, rc, state, ga, lock, started))  # the last file of the run folder
        return node.end(rc)
    finally:
        sigterm.restore()


def _run(args, ga, ctx, node: _Node, folder, started: str, sigterm: _Sigterm) -> tuple[list, set]:
    """(reports, the gates they must cover) of `gate NAME` or `all-gates`, SIGTERM raising Signalled in it from the
    start: the time limit's signal still gives the gate's report; a stage that could not run (fetch, patch, build) writes and signs the report of a run that died,
    then raises; bad input leaves no trace of the run (its folder abandoned), and raises."""
    from ..gates import registry, runner
    from ..report import write_reports

    try:
        sigterm.stop_the_run()
        if args.cmd == "gate":
            reports = [runner.run_gate(registry.gate(args.gate), ga, ctx)]
            return reports, {r.gate for r in reports}
        return runner.run_all(ga, ctx), runner.required()
    except Signalled as e:  # the time limit's signal (Slurm --signal, a pod's termination): still a report
        g = registry.gate(args.gate) if args.cmd == "gate" else None
        reports = [node.stopped(g, e)] if g is not None else []
        return reports, {r.gate for r in reports} if g is not None else runner.required()
    except (FetchError, PatchError, BuildError) as e:  # a stage could not run: the run died, and says so
        if args.cmd != "gate" or not node.reporter or isinstance(e, LocatedError):  # located: bad input, below
            folder.abandon()
            raise
        rep = node.died(registry.gate(args.gate), e)
        write_reports([rep], ga.out, required={rep.gate})
        folder.finish()  # `latest` names this run: its summary says it died, never an earlier verdict
        print(_attest(ga.out, [rep], 2, ctx.project, ga, ctx.lock, started))  # a run that died is signed as one too
        raise
    except ReprostackError:
        folder.abandon()  # bad input, nothing ran: no trace of this run; latest never moved
        raise


def _attest(out: Path, reports, rc: int, state: dict, ga, lock, started: str) -> str:
    """Sign the run folder (reprostack.evidence.attest.runs.finish_run): the line to print, `attested: ...` or `unsigned: no
    key ...`. Every report's verdict goes into the predicate; the overall verdict is `pass` only when the exit code
    is 0."""
    from ..evidence.attest.runs import finish_run, purpose_of
    from ..report import utc_now

    docs = [r.to_dict() for r in reports]
    results = {d.get("result") for d in docs}
    verdict = "pass" if rc == 0 else (results.pop() if len(results) == 1 else "mixed")
    return finish_run(
        out,
        kind="gate",
        verdict=verdict,
        exit_code=rc,
        project=state,
        started=started,
        ended=utc_now(),
        reports=docs,
        purpose_=purpose_of(docs, ga.purpose),
        stack=lock.stack,
    )


class _Sigterm:
    """SIGTERM during the run raises Signalled in it (the watchdog stops the run's processes on the way out; the CLI
    still writes an ERROR report); once the run is over it is ignored while the reports and the rc are written (a Job
    failed by another pod's failure terminates node 0 right after its verdict: the reports are never left half
    written); then the handler that was there before comes back."""

    def __init__(self):
        import signal

        self.old = signal.getsignal(signal.SIGTERM)

    def stop_the_run(self) -> None:
        import signal

        def stop(signum, frame):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            raise Signalled(signum)

        signal.signal(signal.SIGTERM, stop)

    def hold(self) -> None:
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def restore(self) -> None:
        import signal

        signal.signal(signal.SIGTERM, self.old)


class _Node:
    """This node's side of the output contract (launch.plan.Outputs) for the CLI: its rc file (this run's id), a
    worker's end (no report), the report of a run stopped by a signal."""

    def __init__(self, ga, out: Path, root: Path):
        from ..launch.plan import Outputs

        self.ga, self.out, self.root = ga, out, root
        self.multi = (ga.nodes or 1) > 1 or int(ga.node_rank) != 0
        self.outputs = Outputs(max(ga.nodes or 1, int(ga.node_rank) + 1))
        self.reporter = self.outputs.writes_reports(ga.node_rank)
        self.rc_path = out / self.outputs.node_rc(ga.node_rank)
        if self.multi:  # an earlier run's rc of this node is never taken for this run's
            self.rc_path.unlink(missing_ok=True)

    def end(self, rc: int) -> int:
        if self.multi:
            from ..atomicfile import write_text_atomic
            from ..launch.plan import rc_text

            self.rc_path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.rc_path, rc_text(rc, self.ga.run_id))
        return rc

    def worker_end(self, reports) -> int:
        ok = bool(reports) and all((r.data.get("node") or {}).get("ok") for r in reports)
        for r in reports:
            print(f"{r.gate} [{r.profile}]: node {self.ga.node_rank}: {'done' if ok else 'FAILED'} — {r.reason}")
        return self.end(0 if ok else 1)

    def died(self, g, e: ReprostackError):
        """The ERROR report of a run that died at a stage (a fetch, a patch, a build that could not run): nothing
        was measured (never evidence); its reason is the error's line."""
        rep = self._error_report(g, f"the run died before the gate ran: {' '.join(str(e).split())[:600]}")
        rep.evidence = False
        return rep

    def _error_report(self, g, why: str):
        """An ERROR report of gate `g` that measured nothing, started and ended now."""
        from ..report import GateReport, Result, utc_now

        now = utc_now()
        return GateReport(
            g.report_name, self.ga.profile or "-", Result.ERROR, why, started=now, ended=now, duration_s=0.0
        )

    def stopped(self, g, e: Signalled):
        """The ERROR report of a run stopped by signal `e` (node 0: with what the other nodes' rc files say)."""
        from ..gates import standin
        from ..launch.plan import read_rc

        why = f"stopped by {e.name} before its end (a time limit's signal: Slurm's --signal, a pod's termination)"
        if self.reporter and self.multi:
            said = []
            for n in range(1, self.outputs.nodes):  # a Job failed by a worker's exit stops node 0 this way
                rc = read_rc(self.out / self.outputs.node_rc(n), self.ga.run_id)
                state = "no rc yet" if rc is None else f"exit {rc}"
                said.append(f"node {n}: {state}; its log: {self.out / self.outputs.node_log(n)}")
            why += "; " + "; ".join(said)
        rep = self._error_report(g, why)
        st = standin.from_env(self.root)
        if st is not None:
            rep.evidence, rep.provenance["stand_in"] = False, st.record()
            rep.reason = f"{standin.NOTE}: {rep.reason}"
        return rep


def history_runs(root: Path, cache_root: Path, stack: str, gate: str | None, profile: str | None) -> tuple[str, ...]:
    """`--baseline history`: the project paths of the accepted runs (result pass, this stack; this gate and profile
    when known) that the results history database (`<cache>/history/history.sqlite3`, `reprostack history`) holds
    and that are still what was ingested: a file inside the project whose sha256 is the stored id. The others
    (moved, changed since, outside the project) are passed over and counted in one line. Raises ReprostackError when
    there is no database or no run is left."""
    from .. import ui
    from ..digest import sha256_file
    from ..history.store import Store

    db = Path(cache_root) / "history" / "history.sqlite3"
    if not db.is_file():
        raise ReprostackError(
            f"--baseline history: no results history at {db}; ingest the results first: reprostack history"
        )
    with Store.copy_of(db) as store:  # checked, read-only (a damaged file is one line)
        rows = store.accepted(stack, gate=gate, profile=profile)
    base, out, passed = Path(root).resolve(), [], 0
    for sha, shown in rows:
        p = Path(shown) if Path(shown).is_absolute() else Path.cwd() / shown
        try:
            real = p.resolve()
            ok = real.is_relative_to(base) and real.is_file() and sha256_file(real) == sha
        except OSError:
            ok = False
        if not ok:
            passed += 1
            continue
        rel = real.relative_to(base).as_posix()
        if rel not in out:
            out.append(rel)
    what = f"gate {gate}" if gate else "any gate"
    ui.info(
        f"--baseline history: {len(out)} accepted run(s) of {what}, stack {stack} in {db}"
        + (f"; {passed} passed over (moved, changed since ingested, or outside the project)" if passed else "")
    )
    if not out:
        raise ReprostackError(
            f"--baseline history: {db} holds no accepted run of {what} on stack {stack} that is still in the project"
        )
    return tuple(out)


def result_lines(reports) -> list[str]:
    """One short line per gate, named as the operator types it (`nemo-rl`): `NAME [PROFILE]: LABEL — REASON`; a
    reason an earlier gate already gave is not repeated (`same reason as fabric`)."""
    from ..gates import registry

    seen: dict[str, str] = {}
    out = []
    for r in reports:
        name = registry.gate(r.gate).name
        why = f"same reason as {seen[r.reason]}" if r.reason in seen else r.reason
        seen.setdefault(r.reason, name)
        out.append(f"{name} [{r.profile}]: {r.label()} — {why}")
    return out


def _plans(args, lock, root, opts, ga) -> int:
    """`gate G --plan` / `all-gates --plan`: each gate's launch plan (gates.plan), printed; nothing runs."""
    import json

    from ..gates import registry
    from ..gates.plan import gate_plan

    gates = [registry.gate(args.gate)] if args.cmd == "gate" else registry.present(root)
    plans = []
    for g in gates:
        profile = args.profile
        if profile and args.cmd == "all-gates" and profile not in g.load(root).profiles:
            profile = None  # --profile names one gate's hardware; the others show their published one
        plans.append(
            gate_plan(
                g, root, lock, out_dir=Path(args.out), cache_dir=opts.cache.root, options=ga.with_(profile=profile)
            )
        )
    if args.json:
        print(
            json.dumps(
                [p.to_dict() for p in plans] if args.cmd == "all-gates" else plans[0].to_dict(),
                indent=2,
                sort_keys=True,
            )
        )
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from .. import ui

    console = Console()
    for p in plans:
        name = registry.gate(p.gate).name  # what the operator types (`gate nemo-rl`), not the spec stem
        if not ui.live_display():  # off a terminal: plain `field: value` lines, never wrapped (digests stay whole)
            print(f"launch plan: gate {name} [{p.profile}] (nothing was run)")
            print("\n".join(f"  {line}" for line in p.lines()))
            continue
        t = Table(
            title=escape(f"launch plan: gate {name} [{p.profile}] (nothing was run)"),
            show_header=False,
            title_justify="left",
        )
        t.add_column(style="bold")
        t.add_column(overflow="fold")
        for line in p.lines():
            k, _, v = line.partition(": ")
            t.add_row(escape(k), escape(v))
        console.print(t)
    return 0
