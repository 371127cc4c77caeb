"""What `reprostack history` shows: the short summary (flagged regressions first, one line per metric with
intervals; `short`), a text table per series (`text`, `--all`), one PNG per series, one self-contained HTML page.

Scale: one matplotlib figure is reused for every PNG, each series drawn with one errorbar call and at most
MAX_TICKS x labels (a series of 10,000 runs is one plot, not 10,000 artists and labels); the page lists the latest
PAGE_ROWS runs of each metric (the plot shows every run) and the first PAGE_FLAGGED regressions.

Invariants: matplotlib runs on its Agg backend (no display) and is imported only here, when plots are written;
without it (the plain install) the page is written with its tables, no PNG, and says why (`plots_missing`);
a series matplotlib refuses to draw is one warning line, its table still in the page;
the PNGs carry no timestamp or version metadata and the page no generation time, so the same history gives the
same bytes (the committed results/history/ does not churn); the page has no external asset: every image is a
`data:image/png;base64,` URI, no script, no link; every string from a report is HTML-escaped (and was stripped
of control characters by the reader).
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import re
from pathlib import Path

from ..atomicfile import write_text_atomic
from .compare import NO_INTERVAL, Comparison, Series, describe, fmt, value

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain fixed-width table (two spaces between columns): ui.plain_table."""
    from ..ui import plain_table

    return plain_table(headers, rows)


HEADERS = ["date", "lock", "result", "n", "mean", "95% interval", "host", "vs previous run"]


def rows(s: Series) -> list[list[str]]:
    """The table rows of a series: one per run, with the verdict against the run before it."""
    out = []
    vs = {c.after.report_id: c.verdict for c in s.runs}
    for p in s.points:
        m = p.m
        ci = f"[{fmt(m.lo)}, {fmt(m.hi)}]" if m.has_interval else NO_INTERVAL
        out.append(
            [
                p.date or "?",
                p.lock_sha256[:8] or "?",
                p.result,
                str(m.n),
                fmt(m.mean),
                ci,
                p.host_fp[:8],
                vs.get(p.report_id, "(first)"),
            ]
        )
    return out


def text(series: list[Series]) -> str:
    """Every series as a titled table, its lock comparisons below it, then a summary line (`--all`)."""
    out = []
    for s in series:
        out.append(s.title())
        out.append(table(HEADERS, rows(s)))
        for c in s.locks:
            out.append("  " + describe(c))
        out.append("")
    out.append(summary(series))
    return "\n".join(out) + "\n"


FLAGGED_SHOWN = 20  # regressions printed by default (all with --all)
SERIES_SHOWN = 30  # metrics with intervals printed by default


def flagged(series: list[Series]) -> list[tuple[Series, Comparison]]:
    """Every flagged regression (series, comparison), in series order."""
    return [(s, c) for s in series for c in s.regressions]


def head(series: list[Series], reports: int) -> str:
    """The one-line summary: `history: N reports, M metrics, K flagged`."""
    k = len(flagged(series))
    return f"history: {reports} report(s), {len(series)} metric(s), {k} flagged regression(s)"


def short(series: list[Series], reports: int, full: bool = False) -> str:
    """What `reprostack history` prints: the summary line, the flagged regressions first, then one line per metric
    with intervals (its latest run and verdict); capped unless `full`, which adds every run of every metric."""
    regs = flagged(series)
    out = [head(series, reports)]
    shown = regs if full else regs[:FLAGGED_SHOWN]
    if regs:
        out.append("flagged (two 95% intervals separate, the later one worse):")
        out += [f"  {s.title()}: {describe(c)}" for s, c in shown]
        if len(regs) > len(shown):
            out.append(f"  ... and {len(regs) - len(shown)} more (--all lists every one)")
    judged = [s for s in series if any(p.m.has_interval for p in s.points)]
    if judged:
        listed = judged if full else judged[:SERIES_SHOWN]
        out.append("metrics with intervals: the latest run, and its verdict against the run before it")
        rows_ = []
        for s in listed:
            last = s.points[-1]
            vs = {c.after.report_id: c.verdict for c in s.runs}.get(last.report_id, "(first)")
            rows_.append([s.title(), str(len(s.points)), value(last), vs])
        out += ["  " + x for x in table(["metric", "runs", "latest", "vs previous run"], rows_).splitlines()]
        if len(judged) > len(listed):
            out.append(f"  ... and {len(judged) - len(listed)} more metric(s) with intervals (--all)")
    single = len(series) - len(judged)
    if single:
        out.append(
            f"{single} metric(s) have one sample per run (n=1, no interval): shown, never judged"
            + ("" if full else " (their runs: --all, or the page)")
        )
    if full:
        out += ["", text(series).rstrip("\n")]
    return "\n".join(out) + "\n"


def summary(series: list[Series]) -> str:
    regs = flagged(series)
    judged = sum(1 for s in series for c in s.runs + s.locks if c.verdict != NO_INTERVAL)
    unjudged = sum(1 for s in series for c in s.runs + s.locks if c.verdict == NO_INTERVAL)
    if not regs:
        return (
            f"no regression flagged ({len(series)} series; {judged} comparison(s) with intervals, "
            f"{unjudged} without: n=1, no interval)"
        )
    lines = [f"{len(regs)} regression(s) flagged:"]
    lines += [f"  {s.title()}: {describe(c)}" for s, c in regs]
    return "\n".join(lines)


def plot_name(s: Series) -> str:
    """A file name for the series' PNG: readable, safe, unique (a hash of the key)."""
    readable = _SAFE.sub("_", "-".join(s.key))[:80]
    return f"{readable}-{hashlib.sha256(repr(s.key).encode()).hexdigest()[:8]}.png"


def plots_missing() -> str | None:
    """None when the PNGs can be drawn; else why not (matplotlib, the `plots` extra, is not installed)."""
    try:
        import matplotlib  # noqa: F401
        from PIL import Image  # noqa: F401
    except ImportError as e:
        return f"{e.name or 'matplotlib'} is not installed"
    return None


MAX_TICKS = 8  # x labels per plot: a long history is not 10,000 labels


class _Plotter:
    """One matplotlib figure reused for every series (a new figure per PNG costs more than drawing it). Layout
    fixed (no tight_layout: it draws the figure once more to measure it)."""

    def __init__(self):
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt

        self.plt = plt
        self.fig = plt.figure(figsize=(5.6, 2.3), dpi=72)
        self.fig.subplots_adjust(left=0.12, right=0.98, top=0.87, bottom=0.3)

    def png(self, s: Series) -> bytes:
        fig = self.fig
        fig.clf()
        fig.subplots_adjust(left=0.12, right=0.98, top=0.87, bottom=0.3)
        ax = fig.add_subplot(1, 1, 1)
        pts = s.points
        xs = range(len(pts))
        ci = [(i, p.m) for i, p in zip(xs, pts) if p.m.has_interval]
        one = [(i, p.m) for i, p in zip(xs, pts) if not p.m.has_interval]
        if ci:
            ax.errorbar(
                [i for i, _ in ci],
                [m.mean for _, m in ci],
                yerr=[[m.mean - m.lo for _, m in ci], [m.hi - m.mean for _, m in ci]],
                fmt="o",
                color="tab:blue",
                capsize=4 if len(ci) <= 50 else 0,
                ms=6 if len(pts) <= 200 else 2,
                label=LEGEND["ci"],
            )
        if one:
            ax.plot(
                [i for i, _ in one],
                [m.mean for _, m in one],
                "o",
                mfc="none",
                color="tab:gray",
                ms=6 if len(pts) <= 200 else 2,
                label=LEGEND["one"],
            )
        ax.plot(list(xs), [p.m.mean for p in pts], "-", color="tab:blue", alpha=0.3, lw=1 if len(pts) <= 200 else 0.5)
        at = {p.report_id: i for i, p in enumerate(pts)}
        bad = [at[c.after.report_id] for c in s.regressions if c.after.report_id in at]
        if bad:
            ax.plot(
                bad,
                [pts[j].m.mean for j in bad],
                "x",
                color="tab:red",
                ms=12 if len(pts) <= 200 else 6,
                mew=2,
                label=LEGEND["regression"],
            )
        ax.legend(loc="upper left", fontsize=6, frameon=False, ncol=3, borderaxespad=0.2)  # fixed: no "best" search
        step = max(1, -(-len(pts) // MAX_TICKS))
        ticks = list(range(0, len(pts), step))
        if ticks[-1] != len(pts) - 1 and len(pts) - 1 - ticks[-1] >= step / 2:
            ticks.append(len(pts) - 1)
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{(pts[i].date or '?')[:10]}\n{pts[i].lock_sha256[:8]}" for i in ticks], fontsize=7)
        ax.set_ylabel(s.unit or "value", fontsize=8)
        ax.set_xlabel("run: date, lock sha256", fontsize=7, labelpad=1)
        ax.set_title(s.title(), fontsize=8, y=1.0, pad=4)  # a fixed y: no automatic title placement (slow)
        ax.tick_params(axis="y", labelsize=7)
        ax.margins(x=0.1 if len(pts) <= 20 else 0.02)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", metadata={"Software": None})
        return _small(buf.getvalue())

    def close(self) -> None:
        self.plt.close(self.fig)


def _small(png: bytes) -> bytes:
    """The PNG as 64 palette colours (Pillow, which matplotlib needs): a third of the bytes, no metadata."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        out = io.BytesIO()
        im.convert("RGB").quantize(colors=64).save(out, format="PNG", optimize=True)
    return out.getvalue()


PAGE_ROWS = 60  # runs per metric in the page's table (the latest; the plot shows every run)
PAGE_FLAGGED = 100  # regressions listed at the top of the page


LEGEND = {  # the plots' legend, also written under the page's heading (a tables-only page has no plot)
    "ci": "mean, 95% CI (n >= 2)",
    "one": "one sample (n=1, no interval)",
    "regression": "flagged regression",
}


def _html(series: list[Series], pngs: dict[str, bytes], reports: int, note: str | None = None) -> str:
    e = html.escape
    regs = flagged(series)
    out = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8"><title>reprostack history</title>',
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}.regression{color:#b00;font-weight:bold}"
        "</style></head><body>",
        "<h1>reprostack results history</h1>",
        f"<p>{e(head(series, reports))}</p>",
    ]
    if regs:
        out.append("<ul>" + "".join(f"<li>{e(s.title())}: {e(describe(c))}</li>" for s, c in regs[:PAGE_FLAGGED]))
        if len(regs) > PAGE_FLAGGED:
            out.append(f"<li>... and {len(regs) - PAGE_FLAGGED} more (<code>reprostack history --all</code>)</li>")
        out.append("</ul>")
    out.append(
        "<p>A regression is flagged only when two 95% intervals separate; a report without "
        "<code>data.statistics</code> is one sample (n=1, no interval) and is shown, never judged.</p>"
    )
    out.append(
        '<p class="legend">Legend of the plots: blue dot with bars: '
        f"{e(LEGEND['ci'])}; hollow grey dot: {e(LEGEND['one'])}; red cross: {e(LEGEND['regression'])}. "
        "x axis: the run (its date and the first 8 hex digits of its lock's sha256); y axis: the metric's unit.</p>"
    )
    if note:
        out.append(f"<p>{e(note)}</p>")
    for s in series:
        name = plot_name(s)
        out.append(f"<h2>{e(s.title())}</h2>")
        if name in pngs:
            out.append(
                f'<img alt="{e(s.title())}" src="data:image/png;base64,{base64.b64encode(pngs[name]).decode()}">'
            )
        shown = rows(s)
        if len(shown) > PAGE_ROWS:
            out.append(
                f"<p>The latest {PAGE_ROWS} of {len(shown)} runs (the plot shows every run; "
                f"<code>reprostack history --all</code> prints them).</p>"
            )
            shown = shown[-PAGE_ROWS:]
        out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in HEADERS) + "</tr>")
        for r in shown:
            cls = ' class="regression"' if r[-1] == "regression" else ""
            out.append(f"<tr{cls}>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>")
        out.append("</table>")
        if s.locks:
            out.append("<ul>" + "".join(f"<li>{e(describe(c))}</li>" for c in s.locks) + "</ul>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write(
    series: list[Series],
    out: Path,
    *,
    reports: int | None = None,
    plots: bool = True,
    progress=None,
    warn=None,
) -> list[Path]:
    """Write one PNG per series (when `plots` and matplotlib is there) and index.html into `out` (created);
    returns the paths written, index.html last. `progress()` is called once per series drawn; `warn(line)` for a
    series that could not be drawn (its table is still in the page). PNGs of series no longer in the history are
    left alone (never a delete outside what we write)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    reports = reports if reports is not None else len({p.report_id for s in series for p in s.points})
    pngs, written = {}, []
    missing = plots_missing() if plots else "not drawn (--no-plots)"
    if missing is None:
        plotter = _Plotter()
        try:
            for s in series:
                name = plot_name(s)
                try:
                    pngs[name] = plotter.png(s)
                except (ValueError, OverflowError) as e:  # a value matplotlib cannot place: named, never a traceback
                    if warn:
                        warn(f"history: no plot for {s.title()}: {str(e)[:200]}")
                    if progress:
                        progress()
                    continue
                p = out / name
                tmp = out / f".{name}.tmp"
                tmp.write_bytes(pngs[name])
                tmp.replace(p)
                written.append(p)
                if progress:
                    progress()
        finally:
            plotter.close()
    note = None if missing is None else f"No plots: {missing}."
    written.append(write_text_atomic(out / "index.html", _html(series, pngs, reports, note)))
    return written
