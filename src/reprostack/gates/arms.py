"""Gate 1's arms and extra runs next to test_ep: the arm names (deepep, dense), and DeepEP's legacy intranode
test as second evidence, run under the watchdog with the gate's environment (one NCCL, multicast off), its raw
log kept, coming back as data + figures + one completeness check: a run the operator asked for that did not
produce its whole output makes the gate fail, never pass. The dense comparison arm runs inside the trials
launch (gates/drivers/micro_trials.py, interleaved with DeepEP; issue 16 item 2), not as a run of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GateError
from ..report import Check, artifact_for, evaluate
from . import metrics
from .parsers.failure import classify_failure
from .parsers.legacy_intranode import parse_legacy
from .spec import GateSpec, Profile
from ..launch.watchdog import run_with_watchdog

ARMS = ("deepep", "dense")


def parse_arms(text: str) -> tuple[str, ...]:
    """`deepep,dense` -> ("deepep", "dense"). Raises GateError for an unknown arm or one without deepep
    (the gate's verdict is DeepEP's; the dense arm is its comparison)."""
    arms = tuple(dict.fromkeys(a.strip() for a in text.split(",") if a.strip()))
    bad = [a for a in arms if a not in ARMS]
    if bad or "deepep" not in arms:
        raise GateError(
            f"--arm {text!r}: give a comma list of {', '.join(ARMS)} that includes deepep"
            + (f" (unknown: {', '.join(bad)})" if bad else "")
        )
    return arms


def check_request(spec: GateSpec, profile: Profile, arms: tuple[str, ...], legacy: bool) -> None:
    """Raise GateError (before anything is built) when an asked-for run cannot happen on this profile."""
    if "dense" in arms and spec.dense is None:
        raise GateError(f"{spec.path}: --arm dense, but the spec has no `dense:` section")
    if not legacy:
        return
    if spec.legacy is None:
        raise GateError(f"{spec.path}: --legacy, but the spec has no `legacy:` section")
    if profile.nodes > 1:
        raise GateError(
            f"--legacy: {spec.legacy.script} is intranode only; profile {profile.name} spans {profile.nodes} nodes"
        )
    if spec.legacy.ep_sizes and profile.ep_size not in spec.legacy.ep_sizes:
        raise GateError(
            f"--legacy: {spec.legacy.script} runs at EP {', '.join(map(str, spec.legacy.ep_sizes))} "
            f"only ({spec.path}: legacy.ep-sizes); profile {profile.name} is EP{profile.ep_size}"
        )


@dataclass
class ArmRun:
    """One extra run: `data` for the report, `values` (metrics.py names), `check` (completeness) and the
    raw log(s) as artifacts."""

    name: str
    data: dict
    values: dict
    check: Check
    artifacts: list = field(default_factory=list)


def _run(argv, env, cwd, timeout_s, log: Path) -> tuple[str, dict]:
    from .. import ui

    with ui.step(f"micro {log.stem}", log=log):
        outcome = run_with_watchdog(argv, env=env, cwd=str(cwd), timeout_s=timeout_s, log_path=log, echo=False)
    return log.read_text(errors="replace"), {
        "command": argv,
        "returncode": outcome.returncode,
        "timed_out": outcome.timed_out,
        "seconds": round(outcome.duration_s, 2),
    }


def _failure(text: str, run: dict) -> dict:
    return classify_failure(text, run["returncode"], run["timed_out"]).to_dict()


def run_legacy(command, *, env: dict, cwd: str, run_dir: Path, out_dir: Path, timeout_s: float) -> ArmRun:
    """Run DeepEP's legacy intranode test from the patched tree: `command`, the legacy arm's node command of the
    gate's launch plan (gates.micro: it spawns its own ranks; check_request has already refused profiles it cannot
    run on), with the gate's environment `env`, and parse it. Never raises on the run's outcome."""
    log = run_dir / "test_intranode.log"
    text, run = _run(list(command.argv), {**env, **dict(command.env)}, cwd, timeout_s, log)
    parsed = parse_legacy(text)
    data = {**run, "parse": parsed.to_dict()}
    if not parsed.ok:
        data["failure"] = _failure(text, run)
    check = evaluate(
        "legacy_complete",
        "",
        parsed.ok,
        "==",
        True,
        note="; ".join(parsed.problems[:4])
        or f"{parsed.tests_passed}/{parsed.tests_run} cases passed, {', '.join(parsed.sections)} tuned",
    )
    return ArmRun("legacy", data, metrics.legacy_metrics(parsed), check, [artifact_for(log, relative_to=out_dir)])
