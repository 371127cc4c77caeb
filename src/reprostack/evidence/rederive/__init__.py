"""Re-derivation: a committed report read back as untrusted input, and what a gate kind gets again from the raw logs
it keeps (`Gate.evidence.rederive`, evidence.kind).

The shared readers, here: `load(path)` (a report: a JSON object, at most MAX_BYTES), `reports_under(folders)` (every
report of a results tree), `log_text(folder, doc, prefix, names)` and `kept_logs(doc, prefix, match)` (the raw logs
a report keeps: only those its artifacts list; their bytes are held to the recorded sha256 by
evidence.verify.report), `begin(doc, spec)` (the report's data, the recorded
spec's profile, an empty Rederived with the profile's unmeasured flag), `spec_profile(spec, profile, stack)`,
`same(a, b)` (numbers to a relative 1e-6), `dig(doc, "a.b.c")`; `Rederived` (what a kind re-derived), `BaselineRef`
(a bar whose threshold is a baseline), RederiveError (one line naming the log).

Each kind's re-derivation, one module per kind, declared by its gate as data (`Evidence(from_logs=...)`):
`micro` (test_ep, trials and dense logs), `serving` (AIPerf exports and server logs), `fabric` (nccl-tests logs),
`megatron` (training logs). The check of a report against what was re-derived is evidence.verify.report.

Invariants: a report, its logs and a recorded spec are untrusted input (reprostack.jsonsrc; a log is read only when the
report lists it among its artifacts); nothing here writes or runs anything; numbers compare with a relative tolerance of
1e-6 (reports round to 6-9 digits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ... import jsonsrc
from ...errors import ReprostackError

MAX_BYTES = 32 << 20


class RederiveError(ReprostackError):
    """A report's raw logs cannot be re-derived (one line, naming the file)."""


@dataclass(frozen=True)
class BaselineRef:
    """A bar whose threshold is a baseline in the recorded spec: its tolerance and the runs it names."""

    tolerance: float
    runs: tuple[str, ...]


@dataclass
class Rederived:
    """What a gate kind re-derived from a report's raw logs (Gate.evidence.rederive).

    values: check metric -> value from the logs; figures: statistic -> its per-trial samples from the logs;
    fields: a dotted path into the report ("data.trials.figures") -> the value it must hold; passes: check metric ->
    whether it passes, for a check whose pass is more than `value op threshold`; thresholds: check metric -> the
    bar of the recorded spec (a number, or a BaselineRef); unmeasured: the recorded spec says the profile has no
    measured bar; notes: what was not re-derived and why."""

    values: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    fields: dict = field(default_factory=dict)
    passes: dict = field(default_factory=dict)
    thresholds: dict = field(default_factory=dict)
    unmeasured: bool | None = None
    notes: list = field(default_factory=list)


def same(a, b) -> bool:
    """Equal, numbers to a relative 1e-6 (reports round figures), containers element by element."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (isinstance(a, bool) and isinstance(b, bool) and a == b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, float) and math.isnan(a) or isinstance(b, float) and math.isnan(b):
            return False
        return a == b or abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def dig(doc, dotted: str):
    """The value at `data.trials.figures` in `doc` (KeyError when absent)."""
    cur = doc
    for k in dotted.split("."):
        if not isinstance(cur, dict) or k not in cur:
            raise KeyError(dotted)
        cur = cur[k]
    return cur


def load(path: Path) -> dict:
    """The report at `path` as untrusted input. Raises RederiveError (one line)."""
    doc = jsonsrc.load(path, RederiveError, max_bytes=MAX_BYTES)
    if not isinstance(doc, dict):
        raise RederiveError(f"{path}: not a JSON object")
    return doc


def reports_under(folders: list[Path], *, damaged: bool = False) -> list[Path]:
    """Every `*.json` under the folders (a file named is taken as is) that is a gate report (an object with `gate`,
    `result` and `checks`), sorted; other JSON (summaries, AIPerf exports, bench results) is passed over. `damaged`:
    also every `*.json` that cannot be read (not UTF-8, not JSON, a NaN): it may be a damaged report, and
    verify-report's line for it says why (the count never shrinks silently)."""
    out = []
    for f in folders:
        files = [f] if f.is_file() else sorted(p for p in f.rglob("*.json") if p.is_file() and not p.is_symlink())
        for p in files:
            try:
                d = load(p)
            except RederiveError:
                if f.is_file() or damaged:
                    out.append(p)  # named directly, or asked for: its line says why it cannot be read
                continue
            if "gate" in d and "result" in d and "checks" in d or f.is_file():
                out.append(p)
    return out


def log_text(folder: Path, doc: dict, prefix: str, names: list[str]) -> str:
    """The text of the kept logs `<prefix>/<name>` (one per name, in that order) the report's artifacts list,
    joined as the gate joined them. Raises RederiveError for one that is not listed or not kept."""
    listed = {a.get("path") for a in doc.get("artifacts") or [] if isinstance(a, dict)}
    parts = []
    for n in names:
        rel = f"{prefix}/{n}" if prefix else n
        if rel not in listed:
            raise RederiveError(f"{rel}: not among the report's artifacts")
        p = folder / rel
        try:
            parts.append(p.read_text(errors="replace"))
        except OSError as e:
            raise RederiveError(f"{rel}: cannot be read ({e.strerror or e})") from None
    return "\n".join(parts)


def begin(doc: dict, spec: dict | None) -> tuple[dict, dict | None, Rederived]:
    """What every Gate.evidence.rederive starts from: the report's data (a mapping, {} when not), the recorded spec's
    profile (spec_profile, on the report's stack) and a Rederived that says whether that profile is unmeasured."""
    data = doc.get("data") if isinstance(doc.get("data"), dict) else {}
    stack = (doc.get("provenance") or {}).get("stack") or "campaign"
    prof, unmeasured = spec_profile(spec, doc.get("profile", ""), stack)
    return data, prof, Rederived(unmeasured=unmeasured)


def kept_logs(doc: dict, prefix: str, match) -> list[str]:
    """The names (below `prefix/`) of the report's artifacts whose path `match(path)` accepts, sorted."""
    return sorted(
        a["path"].split("/", 1)[1]
        for a in doc.get("artifacts") or []
        if isinstance(a, dict)
        and isinstance(a.get("path"), str)
        and a["path"].startswith(f"{prefix}/")
        and match(a["path"])
    )


def spec_profile(spec: dict | None, profile: str, stack: str) -> tuple[dict | None, bool | None]:
    """(the recorded spec's `profiles.<profile>` mapping, whether that profile is unmeasured on `stack`: the
    stack's `stacks.<stack>.profiles.<profile>.bars-status` over the profile's own); (None, None) when absent."""
    if not isinstance(spec, dict) or not isinstance(spec.get("profiles"), dict):
        return None, None
    p = spec["profiles"].get(profile)
    if not isinstance(p, dict):
        return None, None
    status = p.get("bars-status", "measured")
    over = (((spec.get("stacks") or {}).get(stack) or {}).get("profiles") or {}).get(profile) or {}
    if isinstance(over, dict):
        status = over.get("bars-status", status)
    return p, status == "unmeasured"
