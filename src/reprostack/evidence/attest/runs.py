"""The last step of every run that leaves a folder (a gate run, a bench, an image build): sign the folder, or say
that it is unsigned.

`finish_run(folder, kind=..., ...)` builds the run predicate (evidence.attest.statement.run_predicate) from what the
command knows (its argv, verdict and exit code, the reports it wrote as dicts, the project state it read before
the run, the host inventory) and signs it with the configured key (evidence.attest.keys.configured_signer); it returns
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


def gate_entries(reports: list[dict], names: list[str] | None = None) -> list[dict]:
    """The predicate's `gates` of a run's report dicts: each at `names[i]` in the folder (default `<gate>.json`)."""
    return [
        {
            "gate": str(r.get("gate")),
            "profile": str(r.get("profile")),
            "result": str(r.get("result")),
            "report": names[i] if names else f"{r.get('gate')}.json",
            "spec_sha256": (r.get("provenance") or {}).get("gate_spec_sha256"),
            "evidence": r.get("evidence") is not False,
        }
        for i, r in enumerate(reports)
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


def run_host(reports: list[dict]) -> dict:
    """The host inventory the run recorded (its first report's `provenance.host`, hostinfo.collect()'s at the start
    of the run: one inventory per run, no second round of nvidia-smi calls at its end); this machine's, collected now,
    when a report has none or played another host (the GPU stand-in's p5en: the attestation names the real one)."""
    provs = [(r.get("provenance") if isinstance(r, dict) else None) or {} for r in reports]
    if provs and all(
        isinstance(p.get("host"), dict) and "stand_in" not in p and not p["host"].get("stand_in") for p in provs
    ):
        return provs[0]["host"]
    from ... import hostinfo

    return hostinfo.collect()


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
    reports = list(reports)
    if host is None:
        host = run_host(reports)
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

    own = transcript_in(folder)
    if own:
        pred["unsigned_transcript"] = own
    path = write(Path(folder) / NAME, [sign(statement(subjects(folder, exclude=(own,) if own else ()), pred), signer)])
    line = f"attested: {path} (key {signer.public_key.keyid[:12]})"
    if own:
        line += f"; this output ({own}) is not signed yet: once it is complete, `reprostack attest {folder}`"
    return line


def transcript_in(folder: Path, streams=None) -> str | None:
    """The path (relative to `folder`) of the file of the run folder that this process's stdout or stderr writes
    to (`gate ... --out D > D/cli.log`): still being written while the command signs. None when neither is."""
    import os

    folder = Path(folder)
    for fd in streams if streams is not None else (1, 2):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        for p in folder.rglob("*"):
            try:
                q = p.stat()
            except OSError:
                continue
            if p.is_file() and not p.is_symlink() and (q.st_dev, q.st_ino) == (st.st_dev, st.st_ino):
                return p.relative_to(folder).as_posix()
    return None


def add_after(folder: Path, signer, keyring) -> tuple[Path, list[str]]:
    """`reprostack attest DIR`: sign the files added to a signed run folder after its command signed it (its console
    transcript). The folder's attestation must verify (with `keyring`) and every one of its subjects still hash to
    its record; then the same predicate, `added_after` naming the new files and when, is signed over every file.
    Returns (attestation path, the files added). Raises EvidenceError (one line) when the folder does not hold."""
    from .check import check_folder
    from .envelope import EvidenceError, sign, write
    from .statement import utc_now

    c = check_folder(folder, keyring)
    if not c.signed:
        raise EvidenceError(f"{folder}: " + (c.problems[0] if c.problems else "no attestation to add files to"))
    broken = [p for p in c.problems if "no subject of the attestation covers it" not in p]
    if broken:
        raise EvidenceError(broken[0])
    if not c.uncovered:
        raise EvidenceError(f"{folder}: every file is already a subject; nothing to add")
    pred = dict(c.predicate)
    when = utc_now()
    pred["added_after"] = [*pred.get("added_after", []), *({"name": r, "when": when} for r in c.uncovered)]
    if pred.get("unsigned_transcript") in c.uncovered:
        pred.pop("unsigned_transcript")
    path = write(Path(folder) / NAME, [sign(statement(subjects(folder), pred), signer)])
    return path, list(c.uncovered)


def re_attest(folder: Path, signer, why: str, recorded_commit: str | None = None) -> Path:
    """Sign an unsigned run folder now, saying so (`re_attested`: today's date and `why`): the predicate is made from
    what its reports recorded, never from this machine (their host, project, lock, spec, times, verdicts); a report
    that recorded no project commit takes `recorded_commit` (the commit that first added it, given by the caller),
    marked `source: re-attested`. Raises EvidenceError when the folder is signed already or holds no gate report."""

    from ... import jsonsrc
    from .envelope import EvidenceError, sign, write
    from .statement import utc_now

    folder = Path(folder)
    if (folder / NAME).exists():
        raise EvidenceError(f"{folder}: already signed ({NAME}); re-attestation is for unsigned runs")
    from .check import attested_folder

    reports, names = [], []
    for p in sorted(folder.rglob("*.json")):  # a report in a subfolder signed on its own is that folder's
        if p.is_symlink() or attested_folder(p.parent, folder) is not None:
            continue
        try:
            d = jsonsrc.load(p, EvidenceError)
        except EvidenceError:
            continue
        if {"gate", "result", "checks"} <= set(d):
            reports.append(d)
            names.append(p.relative_to(folder).as_posix())
    if not reports:
        raise EvidenceError(f"{folder}: no gate report (<gate>.json) to re-attest")
    first = reports[0]
    prov = first.get("provenance") if isinstance(first.get("provenance"), dict) else {}
    proj = prov.get("project") if isinstance(prov.get("project"), dict) else None
    if not proj or not proj.get("commit"):
        proj = {"commit": recorded_commit, "dirty": None, "source": "re-attested: the commit that first added it"}
    host = prov.get("host") if isinstance(prov.get("host"), dict) else {}
    data = first.get("data") if isinstance(first.get("data"), dict) else {}
    argv = data.get("command") if isinstance(data.get("command"), list) else ["(the command line was not recorded)"]
    results = {str(r.get("result")) for r in reports}
    pred = run_predicate(
        kind="gate",
        argv=[str(a) for a in argv],
        verdict=results.pop() if len(results) == 1 else "mixed",
        project=proj,
        host=host,
        started=str(first.get("started") or utc_now()),
        ended=str(first.get("ended") or utc_now()),
        purpose_=purpose_of(reports),
        gates=gate_entries(reports, names),
        lock_sha256=prov.get("lock_sha256"),
        stack=prov.get("stack"),
        images=images_of(reports),
        re_attested={"date": utc_now()[:10], "why": why},
    )
    return write(folder / NAME, [sign(statement(subjects(folder), pred), signer)])
