"""Read one gate report (`<gate>.json`, untrusted: an artifact folder copied off a node) into a history record.

A report's identity is the sha256 of its file's bytes: the same file ingested twice is the same report. What is
kept of it (everything else is ignored):

- keys: gate, profile, result (any string: a result this version does not know is kept as is and counts as
  not-pass), stack (`provenance.stack`, "campaign" when absent), lock sha256 (`provenance.lock_sha256`), pin revs
  (`provenance.upstreams.NAME.rev`), image digest (`provenance.execution.repo_digests[0]` or `image_id`, in
  container mode), a host fingerprint (sha256 of the GPU models, driver, kernel, execution mode, the environment's
  freeze digest and the image), date (`started`, else `ended`);
- measurements: `data.statistics` (contract: metric -> {n, mean, p50, stdev, ci95 [lo, hi], samples, unit,
  method}) first; then each check whose value is a finite number (not a bool), then the `data.metrics` list of
  the micro gate ({metric, unit, value}); one measurement per metric name, in that order. A measurement not from
  `data.statistics` is a single sample (n=1, no interval).
- `better`: lower when a check of the metric is `<=`/`<`, higher for `>=`/`>`; else from the unit (a time:
  lower; a rate `*/s` or `*/sec`: higher); else unknown (a separation is then "changed", neither regression nor
  improvement).

- consistency: a `data.statistics` entry must agree with itself (`inconsistency`): n samples, the mean inside its
  own 95% interval, the samples' mean, median and sample standard deviation equal to `mean`, `p50` and `stdev`,
  and for method `t` the interval mean +- t(0.975, n - 1) * stdev / sqrt(n); a report that does not is refused
  whole at ingest with the one reason (`FILE: data.statistics.METRIC.FIELD: why`), and a stored row that does
  not (a database of an older version, or edited) is skipped by the store the same way. An interval that
  contradicts its samples would flag (or hide) a regression by itself.

Invariants: the file is read through reprostack.jsonsrc (size, depth, numbers and UTF-8 bounded); a JSON object
without `gate`, `result` and `checks` is not a gate report (a summary.json, an AIPerf export) and is passed over
silently; anything wrong inside a report is one ReportError line `FILE: key.path: what`; strings kept are
bounded in length and have no control characters (they are printed to a terminal and an HTML page).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from .. import jsonsrc
from ..errors import ReprostackError

MAX_REPORT_BYTES = 16 << 20  # a real report is < 100 KB
MAX_SAMPLES = 100_000  # samples kept per metric
MAX_METRICS = 2_000  # measurements per report
MAX_NAME = 200  # characters of a gate, profile, metric, unit or pin name
DEFAULT_STACK = "campaign"  # contract item 3
TIME_UNITS = {"ns", "us", "µs", "ms", "s", "sec", "seconds", "min"}
_CTRL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_HEX = re.compile(r"[0-9a-f]{7,64}")


class ReportError(ReprostackError):
    """A gate report could not be read: `FILE: key.path: what is wrong`."""


class NotAReport(Exception):
    """A JSON file that is not a gate report (no `gate`/`result`/`checks`): passed over, not an error."""


@dataclass(frozen=True)
class Measurement:
    """One metric of one report; `lo`/`hi` only when n >= 2 with a 95% interval."""

    metric: str
    unit: str
    n: int
    mean: float
    p50: float | None = None
    stdev: float | None = None
    lo: float | None = None
    hi: float | None = None
    method: str | None = None
    samples: tuple[float, ...] = ()
    better: str | None = None  # "lower" | "higher" | None

    @property
    def has_interval(self) -> bool:
        return self.n >= 2 and self.lo is not None and self.hi is not None


@dataclass
class Record:
    """What the history keeps of one report (see the module doc)."""

    id: str
    path: str
    gate: str
    profile: str
    result: str
    stack: str
    lock_sha256: str
    image_digest: str
    host_fp: str
    host: str
    date: str
    pins: dict[str, str] = field(default_factory=dict)
    measurements: list[Measurement] = field(default_factory=list)


def clean(s, limit: int = MAX_NAME) -> str:
    """A string fit to print: control, bidi and lone surrogate characters replaced by '?', at most `limit` characters."""
    s = str(s)
    if not (s.isascii() and s.isprintable()):  # printable ASCII (most names) has nothing to replace
        s = _CTRL.sub("?", s)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _num(v) -> bool:
    return jsonsrc.number(v) and math.isfinite(v)


def _better(op, unit: str) -> str | None:
    if op in ("<=", "<"):
        return "lower"
    if op in (">=", ">"):
        return "higher"
    u = unit.strip().lower()
    if u in TIME_UNITS:
        return "lower"
    if u.endswith(("/s", "/sec")):  # GB/s; AIPerf's tokens/sec and requests/sec
        return "higher"
    return None


class _Reader:
    def __init__(self, path: Path):
        self.path = path

    def fail(self, where: str, what: str) -> ReportError:
        return ReportError(f"{self.path}: {where}: {what}")

    def text(self, d: dict, key: str, where: str, *, default=None, limit: int = MAX_NAME) -> str:
        v = d.get(key)
        if v is None and default is not None:
            v = default
        if not isinstance(v, str):
            raise self.fail(f"{where}{key}", f"is {jsonsrc.kind(v)}, expected a string")
        return clean(v, limit)

    def obj(self, d: dict, key: str, where: str) -> dict:
        v = d.get(key, {})
        if v is None:
            return {}
        if not isinstance(v, dict):
            raise self.fail(f"{where}{key}", f"is {jsonsrc.kind(v)}, expected an object")
        return v


REL_TOL = 1e-6  # statistics are written rounded to 9 decimals (evidence.bars.stats.summarize): far inside this
ABS_TOL = 1e-8
CI_REL_TOL = 0.01  # the t interval's half-width: another t table or df rule moves it by < 1% (df 35: 0.6%)


def _close(a: float, b: float, rel: float = REL_TOL) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b)) + ABS_TOL


def _g(v: float) -> str:
    return f"{v:.6g}"


def _t975():
    """reprostack.evidence.bars.stats.t975 (imported on first use: the report package is large)."""
    from ..evidence.bars.stats import t975

    return t975


def inconsistency(m: Measurement) -> tuple[str, str] | None:
    """(field, why) of the first way the statistics of `m` contradict themselves, else None (see the module doc).

    A single sample without samples listed (n=1 from a check) has nothing to contradict. Every difference that a
    comparison or a plot takes (the interval's span, the distances to the mean) must be a finite number too."""
    named = {"mean": m.mean, "p50": m.p50, "stdev": m.stdev, "ci95": m.lo, "ci95 ": m.hi}
    for k, v in named.items():
        if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v)):
            return k.strip(), f"{v!r} is not a finite number"
    if not all(map(math.isfinite, m.samples)):
        return "samples", "holds a value that is not a finite number"
    if m.stdev is not None and m.stdev < 0:
        return "stdev", f"{_g(m.stdev)} is negative"
    if (m.lo is None) != (m.hi is None):
        return "ci95", "has one bound only"
    if m.lo is not None:
        if m.lo > m.hi:
            return "ci95", f"lo {m.lo} is above hi {m.hi}"
        if not (math.isfinite(m.hi - m.lo) and math.isfinite(m.mean - m.lo) and math.isfinite(m.hi - m.mean)):
            return "ci95", f"[{_g(m.lo)}, {_g(m.hi)}] spans more than a float holds"
        tol = REL_TOL * max(abs(m.lo), abs(m.hi), abs(m.mean)) + ABS_TOL
        if not m.lo - tol <= m.mean <= m.hi + tol:
            return "mean", f"{_g(m.mean)} lies outside its own 95% interval [{_g(m.lo)}, {_g(m.hi)}]"
    elif m.n >= 2:
        return "ci95", f"missing: n={m.n} needs [lo, hi]"
    if not m.samples:
        if m.n >= 2:
            return "samples", f"none listed, so n={m.n} and the interval cannot be checked"
        return None
    if len(m.samples) != m.n:
        return "n", f"{m.n} but {len(m.samples)} sample{'s' * (len(m.samples) != 1)} listed"
    xs = m.samples
    mean = math.fsum(xs) / len(xs)
    if not math.isfinite(mean):
        return "samples", "their sum is more than a float holds"
    if not _close(mean, m.mean):
        return "mean", f"{_g(m.mean)} but the {len(xs)} samples' mean is {_g(mean)}"
    s = sorted(xs)
    med = s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2
    if m.p50 is not None and not _close(med, m.p50):
        return "p50", f"{_g(m.p50)} but the {len(xs)} samples' median is {_g(med)}"
    if m.n < 2:
        return None
    sd = math.sqrt(math.fsum((x - mean) * (x - mean) for x in xs) / (len(xs) - 1))
    if not math.isfinite(sd):
        return "samples", "their spread is more than a float holds"
    if m.stdev is not None and not _close(sd, m.stdev):
        return "stdev", f"{_g(m.stdev)} but the {len(xs)} samples' standard deviation (n - 1) is {_g(sd)}"
    if m.method == "t" and m.stdev is not None:
        half = _t975()(m.n - 1) * m.stdev / math.sqrt(m.n)
        lo, hi = m.mean - half, m.mean + half
        tol = CI_REL_TOL * half + REL_TOL * max(abs(lo), abs(hi)) + ABS_TOL
        if abs(lo - m.lo) > tol or abs(hi - m.hi) > tol:
            return "ci95", (
                f"[{_g(m.lo)}, {_g(m.hi)}] is not mean +- t(0.975, {m.n - 1}) * stdev / sqrt({m.n}) = "
                f"[{_g(lo)}, {_g(hi)}] (method t)"
            )
    return None


def _statistic(r: _Reader, name: str, s, unit_of: dict, op_of: dict) -> Measurement:
    where = f"data.statistics.{clean(name, 60)}"
    if not isinstance(s, dict):
        raise r.fail(where, f"is {jsonsrc.kind(s)}, expected an object")
    n = s.get("n")
    if type(n) is not int or n < 1:
        raise r.fail(f"{where}.n", f"{n!r} is not a count of samples (an integer >= 1)")
    vals = {}
    for k in ("mean", "p50", "stdev"):
        v = s.get(k)
        if v is None and k != "mean":
            vals[k] = None
            continue
        if not _num(v):
            raise r.fail(f"{where}.{k}", f"is {jsonsrc.kind(v)}, expected a finite number")
        vals[k] = float(v)
    if vals["stdev"] is not None and vals["stdev"] < 0:
        raise r.fail(f"{where}.stdev", f"{vals['stdev']} is negative")
    lo = hi = None
    ci = s.get("ci95")
    if n >= 2 or ci is not None:
        if not (isinstance(ci, list) and len(ci) == 2 and all(_num(x) for x in ci)):
            raise r.fail(f"{where}.ci95", "expected [lo, hi], two finite numbers")
        lo, hi = float(ci[0]), float(ci[1])
        if lo > hi:
            raise r.fail(f"{where}.ci95", f"lo {lo} is above hi {hi}")
    samples = s.get("samples", [])
    if not isinstance(samples, list) or len(samples) > MAX_SAMPLES or not all(_num(x) for x in samples):
        raise r.fail(f"{where}.samples", f"expected a list of at most {MAX_SAMPLES} finite numbers")
    unit = s.get("unit", unit_of.get(name, ""))
    if not isinstance(unit, str):
        raise r.fail(f"{where}.unit", f"is {jsonsrc.kind(unit)}, expected a string")
    method = s.get("method")
    if method is not None and not isinstance(method, str):
        raise r.fail(f"{where}.method", f"is {jsonsrc.kind(method)}, expected a string")
    unit = clean(unit)
    m = Measurement(
        clean(name),
        unit,
        n,
        vals["mean"],
        vals["p50"],
        vals["stdev"],
        lo,
        hi,
        clean(method, 20) if method else None,
        tuple(float(x) for x in samples),
        _better(op_of.get(name), unit),
    )
    bad = inconsistency(m)
    if bad:
        raise r.fail(f"{where}.{bad[0]}", bad[1])
    return m


def host_fingerprint(prov: dict) -> tuple[str, str]:
    """(12-hex fingerprint, a short description) of where a report ran, from provenance.host and .execution."""
    host = prov.get("host") if isinstance(prov.get("host"), dict) else {}
    ex = prov.get("execution") if isinstance(prov.get("execution"), dict) else {}
    env = ex.get("environment") if isinstance(ex.get("environment"), dict) else {}
    gpus = host.get("gpus") if isinstance(host.get("gpus"), list) else []
    names = sorted(clean(g.get("name", "?"), 60) for g in gpus if isinstance(g, dict))
    facts = {
        "gpus": names,
        "driver": host.get("driver_version"),
        "kernel": host.get("kernel"),
        "machine": host.get("machine"),
        "mode": ex.get("mode"),
        "freeze": env.get("freeze_sha256"),
        "image": ex.get("image_id"),
    }
    facts = {k: (v if isinstance(v, (str, list)) else None) for k, v in facts.items()}
    fp = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:12]
    counts: dict[str, int] = {}
    for nm in names:
        counts[nm] = counts.get(nm, 0) + 1
    desc = ", ".join(f"{c}x {nm}" for nm, c in counts.items()) or "no GPU recorded"
    if isinstance(facts["driver"], str):
        desc += f", driver {clean(facts['driver'], 30)}"
    if isinstance(facts["mode"], str):
        desc += f", {clean(facts['mode'], 20)} mode"
    # every fact of the fingerprint shows, so two hosts that differ never read alike ("host differs (A -> B)")
    if isinstance(facts["kernel"], str):
        desc += f", kernel {clean(facts['kernel'], 60)}"
    if isinstance(facts["machine"], str) and facts["machine"] != "x86_64":
        desc += f", {clean(facts['machine'], 20)}"
    if isinstance(facts["freeze"], str):
        desc += f", packages {clean(facts['freeze'], 64)[:12]}"
    if isinstance(facts["image"], str):
        desc += f", image {clean(facts['image'], 80)[:19]}"
    return fp, desc


def read_report(path: Path) -> Record:
    """The Record of the report at `path`; raises NotAReport for another JSON document, ReportError when bad."""
    return parse_report(*read_bytes(path))


def read_bytes(path: Path) -> tuple[str, bytes]:
    """(the path as printed, the file's bytes) of a report file, bounded; ReportError when it cannot be read."""
    path = Path(path)
    shown = clean(str(path), 1000)  # a file name may hold any byte (undecodable ones arrive as surrogates)
    if not path.is_file():  # a FIFO would block open(), a device never ends (is_file follows a symlink)
        raise ReportError(f"{shown}: not a regular file")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_REPORT_BYTES + 1)
    except OSError as e:
        raise ReportError(f"{shown}: {e.strerror or e}") from None
    if len(raw) > MAX_REPORT_BYTES:
        raise ReportError(f"{shown}: more than {MAX_REPORT_BYTES} bytes, the most a gate report here may have")
    return shown, raw


def parse_report(shown: str, raw: bytes) -> Record:
    """The Record of a report's bytes (`shown` names the file in messages); its id is the sha256 of `raw`."""

    def error(msg: str) -> ReportError:
        return ReportError(msg)

    d = jsonsrc.loads(raw, shown, error)  # one read: the identity is the sha256 of the bytes parsed
    if not all(k in d for k in ("gate", "result", "checks")):
        raise NotAReport(shown)
    data = d.get("data") if isinstance(d.get("data"), dict) else {}
    if d.get("evidence") is False or data.get("deliberate") is not None:  # a stand-in or a deliberate variation:
        raise NotAReport(shown)  # never a point of the stack's history (it would be judged a regression)
    r = _Reader(shown)
    gate = r.text(d, "gate", "")
    if not gate:
        raise r.fail("gate", "is empty")
    profile = r.text(d, "profile", "", default="-")
    result = r.text(d, "result", "", limit=40)
    checks = d["checks"]
    if not isinstance(checks, list):
        raise r.fail("checks", f"is {jsonsrc.kind(checks)}, expected a list")
    prov = r.obj(d, "provenance", "")
    data = r.obj(d, "data", "")
    stack = r.text(prov, "stack", "provenance.", default=DEFAULT_STACK) or DEFAULT_STACK
    lock = prov.get("lock_sha256") or ""
    if not isinstance(lock, str) or (lock and not _HEX.fullmatch(lock)):
        raise r.fail("provenance.lock_sha256", "expected a hex sha256")
    pins = {}
    ups = r.obj(prov, "upstreams", "provenance.")
    for name, pin in ups.items():
        if isinstance(pin, dict) and isinstance(pin.get("rev"), str):
            pins[clean(name)] = clean(pin["rev"], 80)
    ex = r.obj(prov, "execution", "provenance.")
    image = ""
    if ex.get("mode") == "container":
        digests = ex.get("repo_digests")
        if isinstance(digests, list) and digests and isinstance(digests[0], str):
            image = clean(digests[0], 300)
        elif isinstance(ex.get("image_id"), str):
            image = clean(ex["image_id"], 100)
    fp, host = host_fingerprint(prov)
    date = d.get("started") or d.get("ended") or ""
    if not isinstance(date, str):
        raise r.fail("started", f"is {jsonsrc.kind(date)}, expected an ISO-8601 string")
    date = clean(date, 40)

    op_of, unit_of = {}, {}
    for i, c in enumerate(checks):
        if not isinstance(c, dict) or not isinstance(c.get("metric"), str):
            raise r.fail(f"checks[{i}]", "expected an object with a 'metric' string")
        op_of.setdefault(c["metric"], c.get("op"))
        if isinstance(c.get("unit"), str):
            unit_of.setdefault(c["metric"], c["unit"])
    out: dict[str, Measurement] = {}
    stats = r.obj(data, "statistics", "data.")
    for name, s in stats.items():
        m = _statistic(r, name, s, unit_of, op_of)
        out.setdefault(m.metric, m)
    extra = data.get("metrics") if isinstance(data.get("metrics"), list) else []
    for c in list(checks) + extra:
        if not isinstance(c, dict) or not isinstance(c.get("metric"), str):
            continue
        v = c.get("value")
        if not _num(v):
            continue  # a bool, a version string, None: not a measurement
        name, unit = clean(c["metric"]), clean(c.get("unit") if isinstance(c.get("unit"), str) else "")
        if name not in out:
            out[name] = Measurement(name, unit, 1, float(v), better=_better(op_of.get(c["metric"]), unit))
    if len(out) > MAX_METRICS:
        raise r.fail("data", f"{len(out)} metrics, more than the {MAX_METRICS} a report here may have")
    sha = hashlib.sha256(raw).hexdigest()
    return Record(sha, shown, gate, profile, result, stack, lock, image, fp, host, date, pins, list(out.values()))
