"""Issue 40: the HTML pages a reader opens (the history page, verify.html) checked in a real headless Chromium
(scripts/pagecheck.py, DevTools protocol over a pipe): they load with no console error, the history page has the
plots' legend and axis labels, verify.html's plot has its legend and axis labels and its table shows no raw
Markdown (it showed `code` backticks); a screenshot of each. A page with a console error or raw Markdown is caught
(the check is not blind). The committed screenshots (docs/screenshots/) are what `python3 scripts/pagecheck.py`
writes."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("pagecheck", REPO / "scripts" / "pagecheck.py")
pagecheck = importlib.util.module_from_spec(spec)
sys.modules["pagecheck"] = pagecheck
spec.loader.exec_module(pagecheck)

BINARY = pagecheck.chromium()
needs_chromium = pytest.mark.skipif(
    BINARY is None and not os.environ.get("REPROSTACK_REQUIRE_CHROMIUM"),
    reason="no chromium on PATH (Debian's `chromium` package; .ci/run installs it and requires it)",
)


@needs_chromium
def test_history_and_verify_pages_in_headless_chromium(tmp_path):
    pages = pagecheck.make_pages(REPO, tmp_path, history_of="results/gate_micro")
    with pagecheck.Browser(BINARY) as b:
        for kind, page in pages.items():
            probe, errors, shot = pagecheck.open_page(b, page)
            assert pagecheck.check_page(kind, probe, errors) == [], (kind, probe.get("text", "")[:300])
            assert shot.startswith(b"\x89PNG\r\n\x1a\n") and len(shot) > 10_000
    assert "/work/" not in probe["text"] and "claims: claims/published.yaml" in probe["text"]  # verify's header


@needs_chromium
def test_the_check_catches_a_console_error_raw_markdown_and_a_plot_without_legend(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text(
        "<!doctype html><html><head><title>x</title></head><body><p>the `code` and **bold** of a table</p>"
        "<svg><g id='axes_1'></g></svg><script>console.error('broken page')</script></body></html>"
    )
    with pagecheck.Browser(BINARY) as b:
        probe, errors, _ = pagecheck.open_page(b, page)
    bad = pagecheck.check_page("verify", probe, errors)
    assert any(x.startswith("console: console.error: ['broken page']") for x in bad), bad
    assert any("raw Markdown '`'" in x for x in bad) and any("raw Markdown '**'" in x for x in bad)
    assert "plot 0: no legend" in bad and "plot 0: no axis labels" in bad
    history = pagecheck.check_page("history", {"text": "", "imgs": 0, "legend": []}, [])
    assert "no plot (img) on the history page" in history and "the legend does not say '95% CI'" in history


def test_the_committed_screenshots_are_pngs_of_both_pages():
    for kind in ("history", "verify"):
        p = REPO / "docs" / "screenshots" / f"{kind}.png"
        assert p.is_file() and p.read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), p
    assert "docs/screenshots/" in (REPO / "docs" / "README.md").read_text()


def test_ci_installs_chromium():
    ci = (REPO / ".ci" / "run").read_text()
    assert "chromium" in ci
