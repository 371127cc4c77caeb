"""Readiness probe for a serving engine: HTTP GET `/v1/models` or `/health` until it answers 200, with a timeout.

`/v1/models` must also list at least one model (an OpenAI-compatible server that answers 200 with an empty
list has not loaded the model). The probe gives up early when the server process has exited.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass


FIRST_PAUSE_S = 0.1


@dataclass(frozen=True)
class ProbeResult:
    """`ready`; `seconds` waited; `attempts`; `last` = the last answer or error as one line; `models` = ids
    listed by /v1/models (empty for /health)."""

    ready: bool
    seconds: float
    attempts: int
    last: str
    models: tuple = ()


def probe_once(url: str, path: str, timeout_s: float = 5.0) -> tuple[bool, str, tuple]:
    """One GET of `url + path`: (ready, what it answered as one line, model ids)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + path, timeout=timeout_s) as r:
            body = r.read(65536)
            code = r.status
    except urllib.error.HTTPError as e:
        return False, f"HTTP {e.code}", ()
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return False, f"{type(reason).__name__}: {reason}", ()
    if code != 200:
        return False, f"HTTP {code}", ()
    if path == "/v1/models":
        try:
            ids = tuple(str(m.get("id")) for m in json.loads(body).get("data", []))
        except (ValueError, AttributeError):
            return False, "HTTP 200 but /v1/models is not an OpenAI model list", ()
        return (bool(ids), f"HTTP 200, models: {', '.join(ids) or 'none'}", ids)
    return True, "HTTP 200", ()


def wait_ready(
    url: str, path: str, *, timeout_s: float, interval_s: float = 5.0, alive: Callable[[], bool] | None = None
) -> ProbeResult:
    """Probe until ready, `timeout_s` seconds have passed, or `alive()` says the server process is gone.

    url: `http://host:port`; path: `/v1/models` or `/health`. Never raises for network errors (they are
    the `last` answer). The pause between probes starts at FIRST_PAUSE_S and doubles up to `interval_s`: a
    server that is up in a second is seen then, not one whole interval later."""
    start = time.monotonic()
    attempts, last = 0, "not probed"
    while True:
        attempts += 1
        ok, last, models = probe_once(url, path, timeout_s=min(5.0, max(0.5, interval_s)))
        waited = round(time.monotonic() - start, 2)
        if ok:
            return ProbeResult(True, waited, attempts, last, models)
        if alive is not None and not alive():
            return ProbeResult(False, waited, attempts, f"server process exited; last answer: {last}")
        if waited >= timeout_s:
            return ProbeResult(False, waited, attempts, last)
        time.sleep(min(interval_s, FIRST_PAUSE_S * 2 ** (attempts - 1), max(0.0, timeout_s - waited)))
