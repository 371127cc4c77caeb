"""A bar from a baseline: accepted earlier runs of the same gate, profile and stack, and a stated tolerance.

A bar cites either a published figure (the p5en profiles) or a baseline. A baseline's reference is the median of the
accepted runs' means of the bar's metric (each run's `data.statistics.<metric>.mean`, the mean of its trials); the
threshold is reference x (1 + tolerance) for a `<=`/`<` bar (lower is better) and reference x (1 - tolerance) for a
`>=`/`>` bar. The bar is then judged like any other (on the run's 95% interval: PASS only when the whole interval
clears it, FAIL when it is wholly past it, INCONCLUSIVE otherwise), and its note says which runs made it.

Invariants:
- a run is read as untrusted input: a regular file inside the project (no absolute path, no `..`, no link out of
  it), at most MAX_BYTES, JSON through reprostack.jsonsrc; it must be a report of this gate and profile, result
  `pass` on evidence (never a deliberate variation such as `--num-sms K`, never a stand-in), of this stack (a report
  older than stacks, without `provenance.stack`, is the campaign's), with a finite mean and n >= 2 for the metric; anything else is BaselineError naming the file and what is wrong, never a
  threshold made of the rest;
- the first runs of a profile without a bar cannot pass (gates.base.verdict: FAIL "no measured bar yet"): such a
  run is accepted only when `bars_status` (the profile unmeasured) is its one failed check, every other check passed;
- `model` (the profile's GPU model, e.g. H100 / H200): every GPU the run's host listed (provenance.host.gpus) names
  it, so a bar is made of runs on that GPU model only;
- the runs' sha256 are recorded with the reference (the report says exactly which bytes made its bar).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ... import jsonsrc
from ...digest import sha256_file
from ...errors import ReprostackError

MAX_BYTES = 8 << 20
DEFAULT_STACK = "campaign"


class BaselineError(ReprostackError):
    """A baseline run cannot be used: one line naming the file."""


@dataclass(frozen=True)
class BaselineSpec:
    """A bar's `baseline:` as the spec says it (the runs are read only when a run is judged: `resolve`)."""

    runs: tuple[str, ...]
    tolerance: float
    why: str
    stack: str = DEFAULT_STACK
    signed_only: bool = False  # `signed-only: true`: every run a signed baseline run (signed_baseline_run)

    def resolve(self, root: Path, *, gate: str, profile: str, metric: str, model: str | None = None) -> Baseline:
        """The Baseline of these runs. Raises BaselineError naming the run that cannot be used."""
        if self.signed_only:
            for rel in self.runs:
                signed_baseline_run(root, rel)
        return baseline(
            root,
            self.runs,
            tolerance=self.tolerance,
            why=self.why,
            gate=gate,
            profile=profile,
            metric=metric,
            stack=self.stack,
            model=model,
        )


@dataclass(frozen=True)
class Baseline:
    """The reference of a bar: `runs` (project-relative paths), their sha256 and their means, the tolerance."""

    runs: tuple[str, ...]
    sha256: tuple[str, ...]
    means: tuple[float, ...]
    tolerance: float
    why: str = ""
    origin: str = ""  # where and when the runs ran, generated from their reports (origin_of), never typed

    @property
    def reference(self) -> float:
        return statistics.median(self.means)

    def threshold(self, op: str) -> float:
        """reference x (1 + tolerance) for a lower-is-better bar, x (1 - tolerance) for a higher-is-better one."""
        factor = 1 + self.tolerance if op in ("<=", "<") else 1 - self.tolerance
        return round(self.reference * factor, 4)

    def describe(self, op: str, unit: str) -> str:
        sign = "+" if op in ("<=", "<") else "-"
        return (
            f"baseline: median {self.reference:.4g} {unit} of {len(self.runs)} accepted run(s) "
            f"({', '.join(f'{m:.4g}' for m in self.means)}) x (1 {sign} {self.tolerance:g})"
            + (f"; {self.why}" if self.why else "")
            + (f"; {self.origin}" if self.origin else "")
            + f"; runs: {', '.join(self.runs)}"
        )

    def to_dict(self) -> dict:
        return {
            "runs": [{"path": p, "sha256": s, "mean": m} for p, s, m in zip(self.runs, self.sha256, self.means)],
            "reference": self.reference,
            "tolerance": self.tolerance,
            "why": self.why,
        }


def read_run(
    root: Path, rel: str, *, gate: str, profile: str, metric: str, stack: str, model: str | None = None
) -> tuple[str, float]:
    """(sha256, mean of `metric`) of the accepted run at project path `rel`. Raises BaselineError naming it."""
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not rel.strip():
        raise BaselineError(f"baseline run {rel!r}: a path inside the project, without '..'")
    base = Path(root).resolve()
    path = base / rel
    try:
        real = path.resolve()
    except OSError as e:
        raise BaselineError(f"baseline run {rel}: {e.strerror or e}") from None
    if not real.is_relative_to(base):
        raise BaselineError(f"baseline run {rel}: leads out of the project ({real})")
    if not real.is_file():
        raise BaselineError(f"baseline run {rel}: not a file")
    doc = jsonsrc.load(real, BaselineError, max_bytes=MAX_BYTES)
    return sha256_file(real), _mean(doc, rel, gate=gate, profile=profile, metric=metric, stack=stack, model=model)


def _only_unmeasured(doc: dict) -> bool:
    """A FAIL whose one failed check is `bars_status` (the profile had no bar yet; every other check passed)."""
    checks = doc.get("checks") if isinstance(doc.get("checks"), list) else []
    failed = [c.get("metric") for c in checks if isinstance(c, dict) and c.get("pass") is not True]
    data = doc.get("data") if isinstance(doc.get("data"), dict) else {}
    return doc.get("result") == "fail" and failed == ["bars_status"] and data.get("bars_status") == "unmeasured"


def _mean(doc, rel: str, *, gate: str, profile: str, metric: str, stack: str, model: str | None = None) -> float:
    def bad(why: str) -> BaselineError:
        return BaselineError(f"baseline run {rel}: {why}")

    if not isinstance(doc, dict):
        raise bad("not a gate report (not a JSON object)")
    got = (doc.get("gate"), doc.get("profile"), doc.get("result"))
    if got[:2] != (gate, profile) or (got[2] != "pass" and not _only_unmeasured(doc)):
        raise bad(
            f"is gate {got[0]!r} profile {got[1]!r} result {got[2]!r}; an accepted run is {gate} {profile} pass "
            "(or a FAIL on bars_status alone: the profile's first runs)"
        )
    prov = doc.get("provenance") if isinstance(doc.get("provenance"), dict) else {}
    its = prov.get("stack") or DEFAULT_STACK
    if its != stack:
        raise bad(f"ran on stack {its!r}, this run is stack {stack!r}")
    data = doc.get("data") if isinstance(doc.get("data"), dict) else {}
    if doc.get("evidence") is False or data.get("deliberate") is not None:
        raise bad("is a deliberate variation or a stand-in (not evidence), never an accepted run")
    if model:  # a run on other hardware than the profile's is never its baseline, whoever chose the profile
        host = prov.get("host") if isinstance(prov.get("host"), dict) else {}
        names = [str(g.get("name", "")) for g in host.get("gpus") or [] if isinstance(g, dict)]
        if not names or not all(model in n for n in names):
            raise bad(f"ran on {', '.join(names) or 'no GPU it recorded'}, not the profile's {model}")
    st = (data.get("statistics") or {}).get(metric) if isinstance(data.get("statistics"), dict) else None
    if not isinstance(st, dict):
        raise bad(f"has no data.statistics.{metric} (a run of one trial, or older than trials)")
    mean, n = st.get("mean"), st.get("n")
    if not isinstance(mean, (int, float)) or isinstance(mean, bool) or not math.isfinite(mean) or mean <= 0:
        raise bad(f"data.statistics.{metric}.mean is {mean!r}, not a finite positive number")
    if not isinstance(n, int) or isinstance(n, bool) or n < 2:
        raise bad(f"data.statistics.{metric}.n is {n!r}: an accepted run has an interval (n >= 2)")
    return float(mean)


def baseline(
    root: Path,
    runs,
    *,
    tolerance: float,
    why: str = "",
    gate: str,
    profile: str,
    metric: str,
    stack: str,
    model: str | None = None,
) -> Baseline:
    """The Baseline of `runs` (project-relative report paths). Raises BaselineError for a run that cannot be used,
    none at all, or a tolerance outside [0, 1)."""
    if not runs:
        raise BaselineError(f"baseline of {metric}: no accepted run")
    if not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
        raise BaselineError(f"baseline of {metric}: tolerance {tolerance!r} is not in [0, 1)")
    got = [read_run(root, r, gate=gate, profile=profile, metric=metric, stack=stack, model=model) for r in runs]
    return Baseline(
        tuple(runs), tuple(s for s, _ in got), tuple(m for _, m in got), float(tolerance), why, origin_of(root, runs)
    )


def origin_of(root: Path, runs) -> str:
    """Where and when the runs ran, from what their reports recorded (each was read and checked by read_run): the
    span of their start times, the UTC days, the host names and machine ids (a machine id not recorded is said so)."""
    starts, hosts, machines, unknown = [], set(), set(), 0
    for rel in runs:
        try:
            doc = jsonsrc.load(Path(root) / rel, BaselineError, max_bytes=MAX_BYTES)
        except BaselineError:
            continue
        if isinstance(doc.get("started"), str):
            starts.append(doc["started"][:19])
        host = (doc.get("provenance") or {}).get("host") if isinstance(doc.get("provenance"), dict) else None
        host = host if isinstance(host, dict) else {}
        hosts.add(str(host.get("hostname")))
        mid = (host.get("identity") or {}).get("machine_id") if isinstance(host.get("identity"), dict) else None
        if mid:
            machines.add(str(mid)[:12])
        else:
            unknown += 1
    if not starts:
        return ""
    days = sorted({s[:10] for s in starts})
    return (
        f"origin (from the runs' reports): started {min(starts)}Z .. {max(starts)}Z, {len(days)} day(s) "
        f"({', '.join(days)}), host name(s) {', '.join(sorted(hosts))}, "
        + (f"{len(machines)} machine id(s)" if machines else "no machine id recorded")
        + (f" ({unknown} run(s) without one)" if machines and unknown else "")
    )


def accepted_runs(
    root: Path, folder: Path, *, gate: str, profile: str, metric: str, stack: str, model: str | None = None
) -> list[str]:
    """Project-relative paths of every `<gate>.json` under `folder` that is an accepted run of this gate, profile and
    stack with the metric's statistics (the others are passed over: a folder of results holds every kind of run)."""
    base = Path(root).resolve()
    rels = []
    for p in sorted(Path(folder).resolve().rglob(f"{gate}.json")):
        if p.is_symlink() or not p.is_file() or not p.resolve().is_relative_to(base):
            continue
        rels.append(p.resolve().relative_to(base).as_posix())
    return accepted_among(base, rels, gate=gate, profile=profile, metric=metric, stack=stack, model=model)


def accepted_among(
    root: Path, runs, *, gate: str, profile: str, metric: str, stack: str, model: str | None = None
) -> list[str]:
    """The project-relative paths among `runs` that are accepted runs of this gate, profile and stack with the
    metric's statistics, in the order given (the others are passed over: a history holds every kind of run)."""
    out = []
    for rel in runs:
        try:
            read_run(root, rel, gate=gate, profile=profile, metric=metric, stack=stack, model=model)
        except BaselineError:
            continue
        if rel not in out:
            out.append(rel)
    return out


def signed_baseline_run(root: Path, rel: str) -> str:
    """Who signed the baseline run `rel` (a project path). Raises BaselineError unless its run folder's attestation
    verifies with the project's keyring (reprostack.evidence), every file a subject, the report one of its gates,
    and the signed purpose is `baseline` (a run made to be one: gate --purpose baseline)."""
    from ... import evidence

    path = (Path(root) / rel).resolve()
    folder = evidence.attested_folder(path.parent, Path(root))
    if folder is None:
        raise BaselineError(f"baseline run {rel}: unsigned; this bar takes signed baseline runs only")
    c = evidence.check_folder(folder, evidence.Keyring.read(Path(root) / evidence.KEYRING_DIR))
    if not c.ok:
        raise BaselineError(f"baseline run {rel}: {c.problems[0]}")
    name = path.relative_to(folder.resolve()).as_posix()
    if not any(g.get("report") == name for g in c.predicate.get("gates") or []):
        raise BaselineError(f"baseline run {rel}: not a report of its signed run")
    if c.predicate["purpose"]["kind"] != "baseline":
        raise BaselineError(f"baseline run {rel}: signed as a {c.predicate['purpose']['kind']} run, not a baseline run")
    return c.opened.who
