"""The last step of every run that leaves a folder (a gate run, a bench, an image build): sign the folder, or say
that it is unsigned.

`finish_run(folder, kind=..., ...)` builds the run predicate (evidence.statement.run_predicate) from what the
command knows (its argv, verdict and exit code, the reports it wrote as dicts, the project state it read before
the run, the host inventory) and signs it with the configured key (evidence.keys.configured_signer); it returns
the one line the command prints: `attested: FOLDER/run.intoto.jsonl (key KEYID)` or `unsigned: no key at
PATH ...`.

`purpose_of(reports, asked)`: what the run was. A report that records `data.deliberate` (a deliberate variation,
e.g. micro --num-sms K) makes the run `deliberate` with its options as `how`, whatever was asked; else `asked`
(gate --purpose: ordinary or baseline).

Invariants: called once, after the command wrote its last file into the folder; a key named by
$REPROSTACK_SIGNING_KEY that does not exist is an error before anything is signed (never a silent unsigned run);
nothing but the attestation file is written.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .keys import configured_signer
from .statement import NAME, purpose, run_predicate, statement, subjects


def purpose_of(reports: list[dict], asked: str = "ordinary") -> dict:
    """See the module doc."""
    for r in reports:
        d = (r.get("data") or {}).get("deliberate") if isinstance(r.get("data"), dict) else None
        if isinstance(d, dict):
            how = {k: v for k, v in d.items() if k != "why"}
            return purpose(
                "deliberate", how or {"variation": True}, d.get("why") if isinstance(d.get("why"), str) else None
            )
    return purpose(asked)


def gate_entries(reports: list[dict]) -> list[dict]:
    """The predicate's `gates` of a run's report dicts (each written as `<gate>.json` in the folder)."""
    return [
        {
            "gate": str(r.get("gate")),
            "profile": str(r.get("profile")),
            "result": str(r.get("result")),
            "report": f"{r.get('gate')}.json",
            "spec_sha256": (r.get("provenance") or {}).get("gate_spec_sha256"),
            "evidence": r.get("evidence") is not False,
        }
        for r in reports
    ]


def images_of(reports: list[dict]) -> list[dict]:
    """The images a run's reports say they ran in (provenance.execution of container mode)."""
    out = []
    for r in reports:
        ex = (r.get("provenance") or {}).get("execution") or {}
        if isinstance(ex, dict) and ex.get("image_id"):
            digests = ex.get("repo_digests") or []
            out.append(
                {"name": str(ex.get("image") or "?"), "id": ex["image_id"], "digest": digests[0] if digests else None}
            )
    return out


def finish_run(
    folder: Path,
    *,
    kind: str,
    verdict: str | None,
    exit_code: int | None,
    project: dict,
    started: str,
    ended: str,
    reports: list[dict] = (),
    purpose_: dict | None = None,
    lock_sha256: str | None = None,
    stack: str | None = None,
    images: list[dict] = (),
    argv: list[str] | None = None,
    host: dict | None = None,
    environ=None,
) -> str:
    """Sign `folder` (module doc); returns the line to print."""
    signer, why = configured_signer(environ)
    if signer is None:
        return why
    if host is None:
        from .. import hostinfo

        host = hostinfo.collect()
    reports = list(reports)
    lock = lock_sha256 or next(
        (
            (r.get("provenance") or {}).get("lock_sha256")
            for r in reports
            if (r.get("provenance") or {}).get("lock_sha256")
        ),
        None,
    )
    pred = run_predicate(
        kind=kind,
        argv=list(argv if argv is not None else sys.argv),
        verdict=verdict,
        exit_code=exit_code,
        project=project,
        host=host,
        started=started,
        ended=ended,
        purpose_=purpose_ or purpose_of(reports),
        gates=gate_entries(reports),
        lock_sha256=lock,
        stack=stack
        or next(
            (
                str((r.get("provenance") or {}).get("stack"))
                for r in reports
                if (r.get("provenance") or {}).get("stack")
            ),
            None,
        ),
        images=list(images) or images_of(reports),
        cwd=str(Path.cwd()),
    )
    from .envelope import sign, write

    path = write(Path(folder) / NAME, [sign(statement(subjects(folder), pred), signer)])
    return f"attested: {path} (key {signer.public_key.keyid[:12]})"
