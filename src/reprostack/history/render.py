"""What `reprostack history` shows: a text table per series, one PNG per series, one self-contained HTML page.

Invariants: matplotlib runs on its Agg backend (no display) and is imported only here, when plots are written;
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
from .compare import NO_INTERVAL, Series, describe, fmt

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain fixed-width table (two spaces between columns)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip(), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


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
    """Every series as a titled table, its lock comparisons below it, then a summary line."""
    out = []
    for s in series:
        out.append(s.title())
        out.append(table(HEADERS, rows(s)))
        for c in s.locks:
            out.append("  " + describe(c))
        out.append("")
    out.append(summary(series))
    return "\n".join(out) + "\n"


def summary(series: list[Series]) -> str:
    regs = [(s, c) for s in series for c in s.regressions]
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


def _png(s: Series) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(5.6, 2.3), dpi=72)
    try:
        xs = list(range(len(s.points)))
        for i, p in zip(xs, s.points):
            m = p.m
            if m.has_interval:
                ax.errorbar(
                    [i], [m.mean], yerr=[[m.mean - m.lo], [m.hi - m.mean]], fmt="o", color="tab:blue", capsize=4
                )
            else:
                ax.plot([i], [m.mean], "o", mfc="none", color="tab:gray")
        ax.plot(xs, [p.m.mean for p in s.points], "-", color="tab:blue", alpha=0.3)
        for c in s.regressions:
            j = s.points.index(c.after)
            ax.plot([j], [c.after.m.mean], "x", color="tab:red", ms=12, mew=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{(p.date or '?')[:10]}\n{p.lock_sha256[:8]}" for p in s.points], fontsize=7)
        ax.set_ylabel(s.unit or "value", fontsize=8)
        ax.set_title(s.title(), fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.margins(x=0.1)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", metadata={"Software": None})
    finally:
        plt.close(fig)
    return _small(buf.getvalue())


def _small(png: bytes) -> bytes:
    """The PNG as 64 palette colours (Pillow, which matplotlib needs): a third of the bytes, no metadata."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        out = io.BytesIO()
        im.convert("RGB").quantize(colors=64).save(out, format="PNG", optimize=True)
    return out.getvalue()


def _html(series: list[Series], pngs: dict[str, bytes]) -> str:
    e = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8"><title>reprostack history</title>',
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}.regression{color:#b00;font-weight:bold}"
        "</style></head><body>",
        "<h1>reprostack results history</h1>",
        f"<p>{e(summary(series)).replace(chr(10), '<br>')}</p>",
        "<p>A regression is flagged only when two 95% intervals separate; a report without "
        "<code>data.statistics</code> is one sample (n=1, no interval) and is shown, never judged.</p>",
    ]
    for s in series:
        name = plot_name(s)
        out.append(f"<h2>{e(s.title())}</h2>")
        if name in pngs:
            out.append(
                f'<img alt="{e(s.title())}" src="data:image/png;base64,{base64.b64encode(pngs[name]).decode()}">'
            )
        out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in HEADERS) + "</tr>")
        for r in rows(s):
            cls = ' class="regression"' if r[-1] == "regression" else ""
            out.append(f"<tr{cls}>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>")
        out.append("</table>")
        if s.locks:
            out.append("<ul>" + "".join(f"<li>{e(describe(c))}</li>" for c in s.locks) + "</ul>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write(series: list[Series], out: Path) -> list[Path]:
    """Write one PNG per series and index.html into `out` (created); returns the paths written.
    PNGs of series no longer in the history are left alone (never a delete outside what we write)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pngs, written = {}, []
    for s in series:
        name = plot_name(s)
        pngs[name] = _png(s)
        p = out / name
        tmp = out / f".{name}.tmp"
        tmp.write_bytes(pngs[name])
        tmp.replace(p)
        written.append(p)
    written.append(write_text_atomic(out / "index.html", _html(series, pngs)))
    return written
