"""Open the project's HTML pages (the history page, verify.html) in headless Chromium and check what a reader sees.

    python3 scripts/pagecheck.py [--shots docs/screenshots]   # make both pages from the committed files, check them,
                                                              # write one PNG screenshot per page

Chromium (Debian's `chromium` package; `.ci/run` installs it) is driven over the DevTools protocol on a pipe
(`--remote-debugging-pipe`: JSON messages, NUL-terminated, on fds 3 and 4), with the standard library only: no
websocket client, no Playwright. It starts headless with a fresh --user-data-dir, no sandbox, no GPU, no
background networking, no component updates, no sync, no first-run; the pages are local files with no external
asset, so nothing reaches the network.

What is checked on each page (check_page): it loads; no console error and no uncaught exception; every plot has a
legend and both axis labels (the history page's SVG-free PNGs carry them in the image, so the page's legend
paragraph is checked there; verify.html's inline SVG is read for its legend and axis label texts); no raw Markdown
(a backtick, `**`, an escaped `\\|`) in the rendered text; a screenshot of the page.

Invariants: Chromium runs under a watchdog (TIMEOUT_S) and is killed on any exit path; its profile folder is
removed; a page that cannot be checked is a PageError naming the page and why, never a pass.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TIMEOUT_S = 60.0
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--remote-debugging-pipe",
    "--hide-scrollbars",
    "--window-size=1280,900",
)


class PageError(Exception):
    """A page could not be opened or does not hold what a reader needs (one line)."""


def chromium() -> str | None:
    """The Chromium binary on PATH (Debian: chromium; others: chromium-browser), else None."""
    return next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)


class Browser:
    """A headless Chromium and its DevTools pipe; use as a context manager."""

    def __init__(self, binary: str):
        self.profile = tempfile.mkdtemp(prefix="rs-chromium-")
        to_child_r, self._w = os.pipe()
        self._r, from_child_w = os.pipe()
        os.set_inheritable(to_child_r, True)
        os.set_inheritable(from_child_w, True)

        def fds() -> None:  # the child's fd 3 reads commands, fd 4 writes answers
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=fds,
            close_fds=False,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf, self._id, self.events = b"", 0, []

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.profile, ignore_errors=True)

    def _read(self, deadline: float) -> dict:
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise PageError(f"chromium did not answer within {TIMEOUT_S:g} s")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace")[-300:] if self.proc.stderr else ""
                raise PageError(f"chromium closed its DevTools pipe (exit {self.proc.poll()}): {' '.join(err.split())}")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Send one command; return its result (events that arrive meanwhile go to self.events)."""
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            got = self._read(deadline)
            if got.get("id") == self._id:
                if "error" in got:
                    raise PageError(f"{method}: {got['error'].get('message')}")
                return got.get("result", {})
            self.events.append(got)

    def wait_for(self, method: str, session: str) -> dict:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            for i, ev in enumerate(self.events):
                if ev.get("method") == method and ev.get("sessionId") == session:
                    return self.events.pop(i)
            self.events.append(self._read(deadline))


_PROBE = """(() => {
  const text = document.body ? document.body.innerText : "";
  const svgs = [...document.querySelectorAll("svg")].map(s => {
    const t = [...s.querySelectorAll("text, g[id^=legend], g[id^=text]")].map(n => n.textContent).join(" ");
    return {legend: !!s.querySelector("g[id^=legend]"), xlabel: !!s.querySelector("g[id^=text]"), text: t,
            ids: [...s.querySelectorAll("g[id]")].map(g => g.id)};
  });
  return JSON.stringify({title: document.title, text: text, imgs: document.images.length,
    broken: [...document.images].filter(i => !i.complete || i.naturalWidth === 0).length,
    legend: [...document.querySelectorAll(".legend")].map(n => n.innerText), svgs: svgs,
    width: document.documentElement.scrollWidth, height: document.documentElement.scrollHeight});
})()"""


def open_page(b: Browser, page: Path) -> tuple[dict, list[str], bytes]:
    """(what the probe read, console errors and exceptions, a PNG screenshot) of one local page."""
    target = b.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = b.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Page", "Runtime", "Log"):
        b.call(f"{domain}.enable", session=session)
    b.call("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
    b.wait_for("Page.loadEventFired", session)
    probe = json.loads(
        b.call("Runtime.evaluate", {"expression": _PROBE, "returnByValue": True}, session)["result"]["value"]
    )
    errors = []
    for ev in b.events:
        m, p = ev.get("method"), ev.get("params", {})
        if m == "Runtime.exceptionThrown":
            errors.append(f"exception: {p.get('exceptionDetails', {}).get('text')}")
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errors.append(f"console.{p['type']}: {[a.get('value') for a in p.get('args', [])]}")
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            errors.append(f"log: {p['entry'].get('text')}")
    height = min(int(probe.get("height") or 900), 1600)
    b.call(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1280, "height": height, "deviceScaleFactor": 1, "mobile": False},
        session,
    )
    shot = base64.b64decode(b.call("Page.captureScreenshot", {"format": "png"}, session)["data"])
    b.call("Target.closeTarget", {"targetId": target})
    b.events.clear()
    return probe, errors, shot


def check_page(kind: str, probe: dict, errors: list[str]) -> list[str]:
    """What a reader would miss on the page (empty: nothing): console errors, a plot without legend or axis labels,
    raw Markdown in the text."""
    bad = [f"console: {e}" for e in errors]
    text = probe.get("text", "")
    for mark in ("`", "**", "\\|"):
        if mark in text:
            at = text.index(mark)
            bad.append(f"raw Markdown {mark!r} in the text: {text[max(0, at - 40) : at + 40]!r}")
    if probe.get("broken"):
        bad.append(f"{probe['broken']} image(s) did not load")
    if kind == "history":
        if not probe.get("imgs"):
            bad.append("no plot (img) on the history page")
        legend = " ".join(probe.get("legend") or [])
        for word in ("95% CI", "n=1", "regression", "x axis", "y axis"):
            if word not in legend:
                bad.append(f"the legend does not say {word!r}")
    if kind == "verify":
        svgs = probe.get("svgs") or []
        if not svgs:
            bad.append("no plot (svg) on the verify page")
        for i, s in enumerate(svgs):
            if not s["legend"]:
                bad.append(f"plot {i}: no legend")
            if not any(x.startswith("text_") for x in s["ids"]) or "concurrency" not in text + s["text"]:
                bad.append(f"plot {i}: no axis labels")
    return bad


def make_pages(root: Path, work: Path, history_of: str = "results") -> dict[str, Path]:
    """The two pages, made with the project's own commands from committed files: the history page over
    `history_of` (default results/; a fresh database), verify.html over the published AIPerf exports
    (tests/fixtures/published-2026-07)."""
    env = {**os.environ, "REPROSTACK_CACHE": str(work / "cache")}
    run = [sys.executable, "-m", "reprostack"]
    subprocess.run(
        [*run, "history", str(root / history_of), "--db", str(work / "h.sqlite3"), "--out", str(work / "history")],
        cwd=root, env=env, check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    subprocess.run(
        [*run, "verify", "tests/fixtures/published-2026-07", "--out", str(work / "verify")],
        cwd=root, env=env, check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return {"history": work / "history" / "index.html", "verify": work / "verify" / "verify.html"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shots", default="docs/screenshots", help="folder of the screenshots (default: %(default)s)")
    args = ap.parse_args(argv)
    binary = chromium()
    if binary is None:
        print("pagecheck: no chromium on PATH (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    root = Path(__file__).resolve().parent.parent
    shots = Path(args.shots)
    shots.mkdir(parents=True, exist_ok=True)
    rc = 0
    with tempfile.TemporaryDirectory(prefix="rs-pages-") as d:
        pages = make_pages(root, Path(d))
        with Browser(binary) as b:
            for kind, page in pages.items():
                probe, errors, shot = open_page(b, page)
                bad = check_page(kind, probe, errors)
                (shots / f"{kind}.png").write_bytes(shot)
                print(f"pagecheck: {kind}: {'ok' if not bad else '; '.join(bad)} (screenshot {shots / kind}.png)")
                rc = rc or (1 if bad else 0)
    return rc


if __name__ == "__main__":
    sys.exit(main())
