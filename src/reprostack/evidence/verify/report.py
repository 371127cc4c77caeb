"""Re-derive a gate report from its raw logs and check its provenance (`reprostack verify-report`).

A report claims figures, checks and a verdict; this module holds it to what can be recomputed:

1. the report itself: a JSON object of the report schema (read as untrusted input: reprostack.jsonsrc);
2. its artifacts: every one kept in the report's folder (a relative path) exists there with the recorded sha256 and
   size (an absolute path, e.g. a build log in the device's cache, is named as not kept here);
3. its provenance: the lock and the gate spec it records by sha256 are versions some commit of this repository
   holds (evidence.verify.trace.Versions), or a correction written down for this report says why and what stands for
   them (evidence.verify.trace: its claim is checked, never taken); a report that records `provenance.project` names a
   commit of this repository, and when its tree was clean that commit's lock and spec are the recorded ones
   (evidence.verify.tracecheck);
4. the figures: the gate kind re-derives, from the raw logs kept in the folder, the value of each check, the samples
   of each statistic and the fields it names (Gate.evidence.rederive, evidence.kind: test_ep and trials logs,
   training logs, nccl-tests logs, AIPerf exports): each must equal the report's; every statistic is recomputed from
   its own samples (evidence.bars.stats);
5. the bars: each bar check's threshold is the bar of the spec recorded by sha256 (a baseline bar: its recorded
   runs' means, median x (1 +- tolerance), the tolerance and runs the spec's, each run's file still the recorded
   bytes);
6. the verdict: each check's pass is recomputed from its value, op and threshold (on the interval of its statistic
   where the bar is judged on one), and the result from the checks (report.model.decide; a profile the spec says is
   unmeasured never passes).

Each problem is one line; a report is verified when it has none. Notes say what could not be re-derived and why
(e.g. a figure measured in a process whose output the report does not keep): never counted as verified silently.

Invariants: nothing here writes or runs anything but git (read-only); a report, its logs, the corrections and the
history are untrusted input; numbers compare with a relative tolerance of 1e-6 (reports round to 6-9 digits).
"""

from __future__ import annotations

import statistics as stats_mod
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ...digest import sha256_file
from ...report.model import OPS, Check, decide, evaluate, evaluate_interval
from ..bars.stats import summarize
from ..rederive import (
    BaselineRef,
    Rederived,
    RederiveError,
    dig,
    load,
    same,
)
from .trace import Versions, spec_path
from .tracecheck import RESULTS_JUDGED, check_provenance, spec_mapping


@dataclass
class Outcome:
    """verify-report's finding on one report."""

    path: str
    gate: str = "?"
    profile: str = "?"
    result: str = "?"
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    traced: list = field(default_factory=list)  # how the lock and spec trace to commits
    rederived: list = field(default_factory=list)  # what was re-derived
    operator_baseline: bool = False  # the run's signed command line chose its baseline runs (verify.signed)
    tag: str = ""  # how the run is vouched for: "signed by WHO (KEYID)" or "UNSIGNED" (verify.signed)

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        word = "FAIL" if not self.ok else "UNSIGNED" if self.tag == "UNSIGNED" else "OK"
        head = f"{word} {self.path}: {self.gate} [{self.profile}] {self.result.upper()}"
        if self.tag and self.tag != "UNSIGNED" and self.ok:
            head += f" ({self.tag})"
        if self.problems:
            return (
                head
                + ": "
                + "; ".join(self.problems[:6])
                + (f"; ... {len(self.problems) - 6} more" if len(self.problems) > 6 else "")
            )
        return head + ": " + "; ".join([*self.rederived, *self.traced] or ["nothing to re-derive"])

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "gate": self.gate,
            "profile": self.profile,
            "result": self.result,
            "verified": self.ok,
            "signed": self.tag.startswith("signed"),
            "vouched": self.tag or None,
            "problems": list(self.problems),
            "rederived": list(self.rederived),
            "traced": list(self.traced),
            "notes": list(self.notes),
        }


# ----------------------------------------------------------------------------------------------- the checks


def check_artifacts(out: Outcome, folder: Path, doc: dict) -> None:
    kept = away = 0
    for a in doc.get("artifacts") or []:
        if not isinstance(a, dict) or not isinstance(a.get("path"), str):
            out.problems.append("an artifact entry without a path")
            continue
        rel = PurePosixPath(a["path"])
        if rel.is_absolute():
            away += 1
            continue
        if ".." in rel.parts:
            out.problems.append(f"artifact {a['path']}: a path with '..'")
            continue
        p = folder / rel
        if not p.is_file():
            out.problems.append(f"artifact {a['path']}: not in the report's folder")
            continue
        if sha256_file(p) != a.get("sha256") or p.stat().st_size != a.get("bytes"):
            out.problems.append(f"artifact {a['path']}: its bytes are not the recorded ones (sha256 or size differs)")
            continue
        kept += 1
    if kept:
        out.rederived.append(f"{kept} kept artifact(s) hash to their records")
    if away:
        out.notes.append(
            f"{away} artifact(s) outside the report's folder (absolute paths, e.g. build logs): not kept here"
        )


def check_statistics(out: Outcome, data: dict) -> dict:
    """Every `data.statistics` entry recomputed from its own samples; returns {metric: Summary} of the good ones."""
    good = {}
    st = data.get("statistics") if isinstance(data.get("statistics"), dict) else {}
    for metric, s in st.items():
        if not isinstance(s, dict) or not isinstance(s.get("samples"), list):
            out.problems.append(f"statistics {metric}: no samples")
            continue
        try:
            re_ = summarize(s["samples"], s.get("unit") or "")
        except (ValueError, TypeError) as e:
            out.problems.append(f"statistics {metric}: {e}")
            continue
        bad = [
            k
            for k, v in (
                ("n", re_.n),
                ("mean", re_.mean),
                ("p50", re_.p50),
                ("stdev", re_.stdev),
                ("ci95", list(re_.ci95 or ())),
            )
            if not same(s.get(k), v)
        ]
        if bad:
            out.problems.append(f"statistics {metric}: {', '.join(bad)} not what its samples give")
            continue
        good[metric] = re_
    if good:
        out.rederived.append(f"{len(good)} statistic(s) recomputed from their samples")
    return good


def check_figures(out: Outcome, doc: dict, got: Rederived, summaries: dict) -> None:
    data = doc.get("data") if isinstance(doc.get("data"), dict) else {}
    st = data.get("statistics") if isinstance(data.get("statistics"), dict) else {}
    n = 0
    for metric, samples in got.figures.items():
        rec = st.get(metric)
        if not isinstance(rec, dict):
            if len(samples) >= 2 and st:
                out.problems.append(f"statistics {metric}: the logs give {len(samples)} samples, the report none")
            elif len(samples) >= 2:
                out.notes.append(
                    f"statistics {metric}: the logs give {len(samples)} samples; the report has no "
                    f"data.statistics (it predates them)"
                )
            continue
        if not same(rec.get("samples"), samples):
            out.problems.append(
                f"statistics {metric}: samples {_short(rec.get('samples'))} but the logs give {_short(samples)}"
            )
        else:
            n += 1
    for metric in st:
        if metric not in got.figures and got.figures:
            out.notes.append(f"statistics {metric}: not re-derived from the logs")
    for dotted, want in got.fields.items():
        try:
            have = dig(doc, dotted)
        except KeyError:
            out.problems.append(f"{dotted}: missing from the report, the logs give {_short(want)}")
            continue
        if not same(have, want):
            out.problems.append(f"{dotted}: {_short(have)} but the logs give {_short(want)}")
        else:
            n += 1
    if n:
        out.rederived.append(f"{n} figure set(s) re-derived from the raw logs")


def _short(v) -> str:
    s = repr(v)
    return s if len(s) <= 80 else s[:77] + "..."


def _one_trial(metric: str, got: Rederived, data: dict):
    """The Summary of a metric judged on trials whose report keeps no `data.statistics` entry for it (one trial:
    statistics hold n >= 2 only), from the logs' figures, else the report's own `data.trials.figures`; None when it
    was not judged on trials. A one-trial bar is inconclusive (no interval), never a pass of `value op threshold`."""
    figs = got.figures.get(metric)
    if figs is None:
        trials = data.get("trials") if isinstance(data.get("trials"), dict) else {}
        tf = trials.get("figures") if isinstance(trials.get("figures"), dict) else {}
        figs = tf.get(metric)
    if not isinstance(figs, list) or len(figs) != 1:
        return None
    try:
        return summarize(figs)
    except (ValueError, TypeError):
        return None


def check_checks(out: Outcome, doc: dict, got: Rederived, summaries: dict, root: Path, stack: str) -> list[Check]:
    """Each check: its value against the logs' (when re-derived), its threshold against the recorded spec's bar, its
    pass recomputed. Returns the checks with their recomputed pass (for the verdict)."""
    checks, n_val, n_bar = [], 0, 0
    data = doc.get("data") if isinstance(doc.get("data"), dict) else {}
    for i, c in enumerate(doc.get("checks") or []):
        try:
            ck = Check.from_dict(c)
        except (KeyError, TypeError):
            out.problems.append(f"checks[{i}]: not a check")
            continue
        m = ck.metric
        if m in got.values:
            if not same(ck.value, got.values[m]):
                out.problems.append(f"check {m}: value {_short(ck.value)} but the logs give {_short(got.values[m])}")
            else:
                n_val += 1
        if m in got.thresholds:
            want = got.thresholds[m]
            if isinstance(want, BaselineRef):
                want = baseline_threshold(out, data, m, ck.op, want, root, doc, stack)
            if want is not None and not same(ck.threshold, want):
                out.problems.append(f"check {m}: threshold {ck.threshold} but the recorded spec's bar is {want}")
            elif want is not None:
                n_bar += 1
        if ck.op not in OPS:
            out.problems.append(f"check {m}: op {ck.op!r}")
            continue
        trial = summaries.get(m) or _one_trial(m, got, data)
        if m in got.passes:
            passed, inconclusive = bool(got.passes[m]), False
        elif trial is not None and ck.op != "==" and same(ck.value, round(trial.mean, 6)):
            re_ = evaluate_interval(m, trial, ck.op, ck.threshold)
            passed, inconclusive = re_.passed, re_.inconclusive
        else:
            re_ = evaluate(m, ck.unit, ck.value, ck.op, ck.threshold)
            passed, inconclusive = re_.passed, False
        if (passed, inconclusive) != (ck.passed, ck.inconclusive):
            out.problems.append(
                f"check {m}: recorded {'pass' if ck.passed else 'inconclusive' if ck.inconclusive else 'fail'}, "
                f"recomputed {'pass' if passed else 'inconclusive' if inconclusive else 'fail'}"
            )
        checks.append(Check(m, ck.unit, ck.value, ck.op, ck.threshold, passed, ck.note, inconclusive))
    if n_val:
        out.rederived.append(f"{n_val} check value(s) re-derived from the logs")
    if n_bar:
        out.rederived.append(f"{n_bar} bar(s) are the recorded spec's")
    for m in got.thresholds:
        if not any(c.metric == m for c in checks) and doc.get("result") in RESULTS_JUDGED:
            out.problems.append(f"bar {m} of the recorded spec: no check judges it")
    return checks


def baseline_threshold(out: Outcome, data: dict, metric: str, op: str, ref: BaselineRef, root: Path, doc, stack):
    """The threshold of a baseline bar from what the report recorded of it (data.bars[].baseline), each run held to
    its file and the spec's tolerance and runs. None (with a problem) when it cannot be recomputed."""
    bars = data.get("bars") if isinstance(data.get("bars"), list) else []
    rec = next((b.get("baseline") for b in bars if isinstance(b, dict) and b.get("metric") == metric), None)
    if not isinstance(rec, dict) or not isinstance(rec.get("runs"), list) or not rec["runs"]:
        out.problems.append(
            f"bar {metric}: a baseline bar in the recorded spec, but data.bars records no baseline runs"
        )
        return None
    if not same(rec.get("tolerance"), ref.tolerance):
        out.problems.append(
            f"bar {metric}: tolerance {rec.get('tolerance')} but the recorded spec's is {ref.tolerance}"
        )
    paths = [r.get("path") for r in rec["runs"] if isinstance(r, dict)]
    if tuple(paths) != ref.runs and not out.operator_baseline:  # no free text exempts a run: only a signed argv
        out.problems.append(
            f"bar {metric}: its runs are not the recorded spec's (and no signed --baseline/--baseline-run chose them)"
        )
    means = []
    for r in rec["runs"]:
        p, sha, mean = (r.get("path"), r.get("sha256"), r.get("mean")) if isinstance(r, dict) else (None, None, None)
        f = Path(root) / str(p)
        if (
            not isinstance(p, str)
            or ".." in PurePosixPath(p).parts
            or PurePosixPath(p).is_absolute()
            or not f.is_file()
        ):
            out.problems.append(f"bar {metric}: baseline run {p}: not a file of the project")
            return None
        if sha256_file(f) != sha:
            out.problems.append(f"bar {metric}: baseline run {p}: its bytes changed since the run was judged")
            return None
        try:
            rd = load(f)
            its = rd["data"]["statistics"][metric]["mean"]
        except (RederiveError, KeyError, TypeError):
            out.problems.append(f"bar {metric}: baseline run {p}: no data.statistics.{metric}.mean")
            return None
        if not same(its, mean):
            out.problems.append(f"bar {metric}: baseline run {p}: mean {mean} recorded, the file says {its}")
            return None
        means.append(float(its))
    factor = 1 + ref.tolerance if op in ("<=", "<") else 1 - ref.tolerance
    return round(stats_mod.median(means) * factor, 4)


def check_verdict(out: Outcome, doc: dict, checks: list[Check], got: Rederived) -> None:
    result = doc.get("result")
    if result not in RESULTS_JUDGED:
        return
    if got.unmeasured and result == "pass":
        out.problems.append("result pass, but the recorded spec says this profile has no measured bar")
    want, _ = decide(checks, ran_ok=True)
    if str(want) != result:
        out.problems.append(f"result {result}, but its checks give {want}")
    else:
        out.rederived.append(f"verdict {result} from {len(checks)} check(s)")


def verify(
    path: Path, *, root: Path, versions: Versions, corrections: list, rederive, operator_baseline: bool = False
) -> Outcome:
    """verify-report's finding on the report at `path` (see the module doc). `rederive(doc, folder, spec)`: the gate
    kind's Rederived from the report, its folder and the recorded spec's mapping (RederiveError: a problem).
    `operator_baseline`: the run's signed command line chose its baseline runs (never a text in the report)."""
    root = Path(root).resolve()
    path = Path(path).resolve()
    try:
        rel = path.relative_to(root).as_posix()
    except ValueError:
        rel = str(path)
    out = Outcome(rel, operator_baseline=operator_baseline)
    try:
        doc = load(path)
    except RederiveError as e:
        out.problems.append(str(e))
        return out
    out.gate, out.profile, out.result = str(doc.get("gate")), str(doc.get("profile")), str(doc.get("result"))
    import jsonschema

    from ...report.writers import validate_report

    try:
        validate_report(doc)
    except jsonschema.ValidationError as e:
        where = ".".join(str(x) for x in e.absolute_path) or "(top)"
        out.problems.append(f"not a valid report: {where}: {' '.join(e.message.split())[:200]}")
        return out
    folder = path.parent
    check_artifacts(out, folder, doc)
    spec_bytes = check_provenance(out, doc, rel, sha256_file(path), root, versions, corrections)
    data = doc.get("data") if isinstance(doc.get("data"), dict) else {}
    summaries = check_statistics(out, data)
    spec = spec_mapping(spec_bytes, spec_path(doc["gate"]))
    if spec_bytes is not None and spec is None:
        out.problems.append(f"the recorded {spec_path(doc['gate'])} is not a YAML mapping")
    try:
        got = rederive(doc, folder, spec)
    except RederiveError as e:
        out.problems.append(f"raw logs: {e}")
        got = Rederived()
    out.notes += got.notes
    check_figures(out, doc, got, summaries)
    stack = (doc.get("provenance") or {}).get("stack") or "campaign"
    checks = check_checks(out, doc, got, summaries, root, stack)
    check_verdict(out, doc, checks, got)
    return out
