"""`verify.html`: the claim table plus plots of agg output tok/s vs concurrency per arm, published vs recomputed.

Plots are drawn with matplotlib (Agg backend, no display) into SVG and embedded inline, so the page is one
self-contained file. A point is plotted only for a claim whose metric is `output_token_throughput` and whose cell
is `c<N>` (N = concurrency); missing or unreadable recomputed values are left out of the recomputed line (the
table says why).
"""

from __future__ import annotations

import html
import io
import math
import re
from collections import defaultdict
from pathlib import Path

_CELL = re.compile(r"^c(\d+)$")


def _series(results) -> dict:
    """{arm: {"published": [(conc, value)], "recomputed": [(conc, value)]}} for agg tok/s claims (first claim per
    cell, i.e. the primary figure when one is published twice)."""
    out: dict = defaultdict(lambda: {"published": {}, "recomputed": {}})
    for r in results:
        c = r.claim
        m = _CELL.match(c.cell)
        if c.metric != "output_token_throughput" or not m:
            continue
        conc = int(m.group(1))
        s = out[c.arm]
        s["published"].setdefault(conc, c.value)
        if r.recomputed is not None and math.isfinite(r.recomputed):
            s["recomputed"].setdefault(conc, r.recomputed)
    return {a: {k: sorted(v.items()) for k, v in s.items()} for a, s in out.items()}


def plot_svg(series: dict) -> str:
    """One SVG (string) with a line per arm and kind: published (dashed, markers o) and recomputed (solid, x);
    x = concurrency (log2 scale), y = agg output tokens/sec."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=100)
    for i, (arm, s) in enumerate(sorted(series.items())):
        color = f"C{i}"
        if s["published"]:
            xs, ys = zip(*s["published"])
            ax.plot(xs, ys, "o--", color=color, label=f"{arm} published")
        if s["recomputed"]:
            xs, ys = zip(*s["recomputed"])
            ax.plot(xs, ys, "x-", color=color, label=f"{arm} recomputed")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("agg output tokens/sec")
    ax.set_title("AIPerf agg output tok/s vs concurrency (ISL120/OSL128)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg") :]


def _rel(p) -> str:
    """A path as the reader typed it from the checkout: relative to the current folder when under it (no developer's
    absolute path on a page that is shared or committed), else as given."""
    try:
        return Path(p).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except (ValueError, OSError):
        return str(p)


_CODE = re.compile(r"`([^`]+)`")


def md_inline(cell: str) -> str:
    """A Markdown table cell as HTML: escaped, `code` as <code>, **bold** as <b>, `\\|` as `|` (no Markdown is
    left for the reader to see)."""
    text = html.escape(cell.replace("\\|", "|"))
    text = _CODE.sub(lambda m: f"<code>{m.group(1)}</code>", text)
    return re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text).replace("**", "")


def render_html(results, claims_path: Path, dirs: list[Path], rc: int, md_table: str) -> str:
    """The whole page: heading, plot(s) (or a note when no agg tok/s claim exists), and the claim table."""
    series = _series(results)
    rows = []
    for line in md_table.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            tag = "th" if line.startswith("| claim |") else "td"
            rows.append("<tr>" + "".join(f"<{tag}>{md_inline(c)}</{tag}>" for c in cells) + "</tr>")
    plot = plot_svg(series) if series else "<p>No agg tok/s claim to plot.</p>"
    return (
        "<!doctype html>\n<html><head><meta charset='utf-8'><title>reprostack verify</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}</style></head><body>\n"
        f"<h1>Published-claim verification</h1>\n<p>claims: <code>{html.escape(_rel(claims_path))}</code>; "
        f"artifacts: {html.escape(', '.join(map(_rel, dirs)))}; exit code {rc}</p>\n"
        f"<h2>agg output tok/s vs concurrency</h2>\n{plot}\n<h2>claims</h2>\n<table>\n"
        + "\n".join(rows)
        + "\n</table>\n</body></html>\n"
    )
