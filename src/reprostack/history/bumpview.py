"""The history comparison of a bump PR body: for each gate the bump asks to re-run, each metric before (the old
lock's latest run) and after (the new lock's), with the verdict (reprostack.history.compare); then each of those
gates' baseline bars (evidence.bars.baseline: accepted runs x a tolerance) with the new lock's run judged against it, the
way the gate judges a run (on its 95% interval: PASS only when the whole interval clears the bar, FAIL when it is
wholly past it, INCONCLUSIVE otherwise; n=1 is never judged).

Source: an in-memory copy of the history database (when the default one exists; the file is never written)
plus the project's results/ ingested into that copy. "before" is the latest run under the old lock (by its
sha256), else the latest run under any other lock than the new one (its lock named); "after" is the latest run
under the new lock, usually none yet when the PR is opened ("not run yet"). Never raises: a history that cannot
be read is one line in the section instead (a bump does not fail for its history).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..errors import ReprostackError
from .command import ingest, scan
from .compare import representative, analyse, value, verdict
from .store import Store, default_db

MAX_ROWS = 40


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rows(store: Store, old_sha: str, new_sha: str, gates: tuple[str, ...]) -> list[list[str]]:
    """[gate, metric, before, after, verdict] per series of `gates` that has a run to compare."""
    out = []
    for s in analyse(store, tuple(gates)):
        old = [p for p in s.points if p.lock_sha256 == old_sha]
        other = [p for p in s.points if p.lock_sha256 != new_sha]
        new = [p for p in s.points if p.lock_sha256 == new_sha]
        before = representative(old or other) if (old or other) else None
        after = representative(new) if new else None
        if before is None and after is None:
            continue
        g, prof, stack, metric = s.key
        b = (
            "-"
            if before is None
            else (value(before) + ("" if before.lock_sha256 == old_sha else f" (lock {before.lock_sha256[:8] or '?'})"))
        )
        a = "not run yet" if after is None else value(after)
        v = (
            verdict(before, after)
            if before and after
            else ("not run under the new lock" if after is None else "no run before")
        )
        out.append([f"{g}/{prof} [{stack}]", f"{metric} ({s.unit})" if s.unit else metric, b, a, v])
    return out


def baseline_rows(root: Path, store: Store, new_sha: str, gates: tuple[str, ...]) -> list[list[str]]:
    """[gate, bar, baseline, after, verdict] per baseline bar of each gate in `gates` (their specs under `root`); a
    gate without one gets one row saying so. A spec or a baseline run that cannot be read is its row's verdict."""
    from ..gates import registry
    from ..evidence.bars.stats import Summary, interval_verdict

    points = {}
    for p in store.points(
        tuple(registry.gate(g).stem for g in gates if g in registry.BY_NAME or g in registry.BY_STEM)
    ):
        if p.lock_sha256 == new_sha:
            points[(p.gate, p.profile, p.stack, p.m.metric)] = p  # points come oldest first: the latest wins
    out = []
    for name in gates:
        try:
            gate = registry.gate(name)
            bars = gate.evidence.baseline_bars(root, gate.load(root))
        except ReprostackError as e:
            out.append([f"{name}", "-", "-", "-", f"cannot be judged: {e}"])
            continue
        if not bars:
            out.append([name, "-", "no baseline bar (its bars cite published figures, or none is set)", "-", "-"])
        for prof, b in bars:
            unit = f" {b.unit}" if b.unit else ""
            bar = f"{b.metric} {b.op} {b.threshold:g}{unit}"
            base = f"median {b.baseline.reference:.4g}{unit} of {len(b.baseline.runs)} run(s) x (1 {'+' if b.op in ('<=', '<') else '-'} {b.baseline.tolerance:g})"
            p = points.get((gate.stem, prof, "campaign", b.metric))
            if p is None:
                out.append([f"{gate.stem}/{prof} [campaign]", bar, base, "not run yet", "not run under the new lock"])
                continue
            m = p.m
            if not m.has_interval:
                v = "n=1, no interval: never judged"
            else:
                s = Summary(
                    m.n, m.mean, m.p50 if m.p50 is not None else m.mean, m.stdev or 0.0, (m.lo, m.hi), m.samples
                )
                v = interval_verdict(s, b.op, b.threshold).upper()
            out.append([f"{gate.stem}/{prof} [campaign]", bar, base, value(p), v])
    return out


def section(
    root: Path, old_lock_text: str, new_lock_text: str | None, gates: tuple[str, ...], db: Path | None = None
) -> str | None:
    """The Markdown section ("### Gate history"), or None when there is no gate or no run of one."""
    if not gates or new_lock_text is None:
        return None
    old_sha = hashlib.sha256(old_lock_text.encode()).hexdigest()
    new_sha = hashlib.sha256(new_lock_text.encode()).hexdigest()
    db = db if db is not None else default_db()
    try:
        store = Store.copy_of(db) if db.is_file() else Store.open(":memory:")
        with store:
            results = Path(root) / "results"
            files = scan([results], exclude=results / "history") if results.is_dir() else []
            _, _, _, skipped = ingest(store, files)
            table = rows(store, old_sha, new_sha, gates)
            against = baseline_rows(root, store, new_sha, gates)
    except ReprostackError as e:
        return f"### Gate history\n\nThe results history could not be read: {_cell(str(e))}\n"
    if not table and not any(r[1] != "-" for r in against):
        return None
    out = [
        "### Gate history\n",
        f"Old lock `{old_sha[:12]}`, new lock `{new_sha[:12]}`; a verdict needs both runs with 95% intervals "
        f"(`reprostack history`).\n",
        "| gate | metric | before | after | verdict |",
        "|---|---|---|---|---|",
    ]
    for r in table[:MAX_ROWS]:
        out.append("| " + " | ".join(_cell(c) for c in r) + " |")
    if len(table) > MAX_ROWS:
        out.append(f"| … | *{len(table) - MAX_ROWS} more metrics* | | | |")
    if not table:
        out.append("| - | *no run of these gates to compare* | | | |")
    if skipped:
        out.append(f"\n{len(skipped)} report(s) under results/ could not be read and were left out.")
    out += [
        "\n#### Verdict against the baseline\n",
        "Each baseline bar of the gates to re-run, and the new lock's latest run judged against it as the gate judges "
        "(its 95% interval: PASS when the whole interval clears the bar, FAIL when it is wholly past it, "
        "INCONCLUSIVE otherwise).\n",
        "| gate | bar | baseline | after (new lock) | verdict |",
        "|---|---|---|---|---|",
    ]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in against[:MAX_ROWS]]
    return "\n".join(out) + "\n"
