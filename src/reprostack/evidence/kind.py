"""How a gate kind's reports are held to their evidence (`Gate.evidence`, one `Evidence` per kind, declared as data):
the one face `verify-report` and the bump PR body ask, whatever the kind.

- `rederive(gate, doc, folder, spec)`: what the kind re-derives of one of its reports (evidence.rederive.Rederived):
  from the raw logs the report keeps in `folder`, each check's value, each statistic's samples and the fields it
  names; from `spec` (the mapping of the gate spec the report records by sha256, None when unreadable) each bar's
  threshold and whether the profile is unmeasured. Raises evidence.rederive.RederiveError naming a log that cannot be
  read. A kind with no re-derivation of its own re-derives nothing from logs and says so (a note, never a silent
  pass). Asked by `verify-report` (cmd.verify_report);
- `baseline_bars(root, spec)`: (profile name, bar) of every bar of `spec` whose threshold is a baseline (accepted
  earlier runs x a tolerance: evidence.bars.baseline), its threshold made from the runs the spec names; [] for a kind whose
  bars cite published figures only. Raises BaselineError naming a run that cannot be used. Asked by the bump PR
  body's "Verdict against the baseline" (history.bumpview).

The kinds' own re-derivations are evidence.rederive's modules (micro, serving, fabric, megatron), each declared by
its gate (`Evidence(from_logs=rederive_micro)`), and share evidence.rederive's readers.

Invariants: reports, logs and specs are untrusted input (evidence.rederive); a kind differs only by the functions it
declares, never by a kind string; nothing here writes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .rederive import Rederived

# (doc, folder, spec, the gate's stem) -> what its raw logs give again
FromLogs = Callable[[dict, Path, "dict | None", str], "Rederived"]


class Stemmed(Protocol):
    """The gate a report is of (gates.base.Gate): its stem names its logs and reports."""

    stem: str


def no_baseline(root: Path, spec: Any) -> list[tuple[str, object]]:
    """A kind whose bars cite published figures only."""
    return []


@dataclass(frozen=True)
class Evidence:
    """A kind's evidence (module doc): `from_logs` its re-derivation (None: none yet), `baselines` its baseline
    bars."""

    from_logs: FromLogs | None = None
    baselines: Callable[[Path, Any], list[tuple[str, object]]] = no_baseline

    def rederive(self, gate: Stemmed, doc: dict, folder: Path, spec: dict | None) -> Rederived:
        """What `gate` re-derives of its report `doc` (module doc)."""
        if self.from_logs is not None:
            return self.from_logs(doc, folder, spec, gate.stem)
        from .rederive import Rederived, spec_profile

        _, unmeasured = spec_profile(
            spec, doc.get("profile", ""), (doc.get("provenance") or {}).get("stack") or "campaign"
        )
        return Rederived(
            unmeasured=unmeasured, notes=[f"gate kind {type(gate).__name__}: no raw-log re-derivation yet"]
        )

    def baseline_bars(self, root: Path, spec: Any) -> list[tuple[str, object]]:
        """(profile name, bar) of every baseline bar of `spec`, resolved from the runs it names (module doc)."""
        return self.baselines(root, spec)
