"""`reprostack lock wheels`: resolve each `kind: wheel` pin's files and sha256 with pip, then fill or check the lock.

How a pin is resolved: pip itself (never hand-written index scraping) is asked which file it would install for
`name==version`: `python -m pip install --dry-run --ignore-installed --no-deps --only-binary=:all: --report -
--target TMP [--index-url INDEX] [--python-version V] [--platform P] name==version`, once per entry of the pin's
`platforms` (once for the running interpreter when it has none). The file's sha256 comes from the report's
`download_info.archive_info.hashes`; when the index gave none, the file is downloaded with `pip download
--no-deps` into a temporary folder and hashed. A version pip cannot resolve is an error, never a placeholder.

The files come only from the pin's `index` (PyPI when it has none): pip's config files are not read and
`PIP_FIND_LINKS`, `PIP_EXTRA_INDEX_URL`, `PIP_INDEX_URL`, `PIP_CONSTRAINT` and `PIP_NO_INDEX` are removed from its
environment, so neither a local wheel folder nor a machine's constraints can shape a pin (cert and proxy
variables still apply).

Fill (default): only the `files:` block of each resolved pin is rewritten (or appended to the pin when it has
none); every other byte of the lockfile stays as it is. The new text is loaded and validated again and written
atomically; on any error nothing is written.
Check (`--check`): the lock's files must be exactly the resolved ones; every difference is reported as
`FILE:LINE: upstreams.PIN.files...: problem`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml

from ..errors import LockError, ReprostackError
from . import fill as lockfill
from .. import lock as lockmod  # the pin model's public face (lock.model, lock.pins)
from . import wheelset
from .pip import Resolved, download_hash, pip_report, report_wheel


def _target_args(pin: lockmod.WheelPin, platform: str | None) -> list[str]:
    args = ["--only-binary=:all:", "--no-deps", "--no-cache-dir"]
    if pin.index:
        args += ["--index-url", pin.index]
    if pin.python_version:
        args += ["--python-version", pin.python_version]
    if platform:
        args += ["--platform", platform]
    return args


def _where(lock: lockmod.Lock, name: str, *path) -> str:
    return lock.where("upstreams", name, *path)


def resolve_pin(lock: lockmod.Lock, name: str, timeout: float = 300.0):
    """Ask pip which wheel file(s) `name==version` resolves to for the pin's targets, with their sha256
    (a wheelset pin: its whole closure, see reprostack.lock.wheelset)."""
    pin = lock.get(name)
    if isinstance(pin, lockmod.WheelsetPin):
        return wheelset.resolve(lock, name)
    if not isinstance(pin, lockmod.WheelPin):
        raise LockError(
            str(lock.path),
            lock.line_of(("upstreams", name)),
            f"upstreams.{name}",
            f"is kind {pin.kind}, `lock wheels` takes wheel and wheelset pins",
        )
    req = f"{pin.name}=={pin.version}"
    found: dict[str, str] = {}
    for platform in pin.platforms or (None,):
        target = (
            f"{req}"
            + (f" for {platform}" if platform else "")
            + (f" (python {pin.python_version})" if pin.python_version else "")
        )
        what = f"{_where(lock, name, 'version')}: {target}"
        with tempfile.TemporaryDirectory(prefix="reprostack-lockwheels-") as tmp:
            items = pip_report(
                [*_target_args(pin, platform), req], what, tmp, timeout, failed="found no matching wheel"
            )
            if len(items) != 1:
                raise ReprostackError(f"{what}: pip's report lists {len(items)} distributions, expected exactly 1")
            dist, version, filename, sha = report_wheel(items[0], what)
            if dist != lockmod.canonical_name(pin.name) or version != pin.version:
                raise ReprostackError(f"{what}: pip resolved {dist}=={version}, not {req}")
            if not sha:
                sha = download_hash(_target_args(pin, platform), req, filename, Path(tmp, "dl"), what, timeout)
        if found.get(filename, sha) != sha:
            raise ReprostackError(f"{what}: {filename} resolved with two different sha256")
        found[filename] = sha
    return Resolved(name, tuple(lockmod.WheelFile(f, s) for f, s in sorted(found.items())))


def wheel_names(lock: lockmod.Lock, names: list[str]) -> list[str]:
    if names:
        for n in names:
            lock.get(n)
        return list(names)
    return [n for n, p in lock.upstreams.items() if isinstance(p, (lockmod.WheelPin, lockmod.WheelsetPin))]


def check(lock: lockmod.Lock, resolved: list[Resolved]) -> list[str]:
    """Every difference between the lock's files and the resolved ones, as `FILE:LINE: field: problem`."""
    problems = []
    for r in resolved:
        pin = lock.get(r.pin)
        if isinstance(pin, lockmod.WheelsetPin):
            problems += wheelset.check(lock, r)
            continue
        want = {f.filename: f.sha256 for f in r.files}
        have = {f.filename: (i, f.sha256) for i, f in enumerate(pin.files)}
        if not pin.files:
            problems.append(
                f"{_where(lock, r.pin)}: no files pinned (pip resolves {', '.join(want)}; "
                f"run `reprostack lock wheels {r.pin}`)"
            )
            continue
        for fn, sha in want.items():
            if fn not in have:
                problems.append(
                    f"{_where(lock, r.pin, 'files')}: {fn} (sha256 {sha}) is what pip resolves for "
                    f"{pin.name}=={pin.version} and is missing from the lock"
                )
            elif have[fn][1] != sha:
                problems.append(
                    f"{_where(lock, r.pin, 'files', have[fn][0], 'sha256')}: {fn}: lock has "
                    f"{have[fn][1]}, the index serves {sha}"
                )
        for fn, (i, _) in have.items():
            if fn not in want:
                problems.append(
                    f"{_where(lock, r.pin, 'files', i, 'filename')}: {fn} is not what pip resolves for "
                    f"{pin.name}=={pin.version} (resolved: {', '.join(want)})"
                )
    return problems


def _span(text: str, name: str) -> tuple[int, int, int, bool]:
    """(first line, last line, key column, has_files) of the pin's `files:` block, 0-based and inclusive;
    without a `files` key: the pin's last line (the block is inserted after it) and has_files False."""
    pin_node = lockfill.pin_node(text, name)

    def last_line(node) -> int:
        if isinstance(node, yaml.ScalarNode):
            end = node.end_mark
            return end.line if end.column > 0 or end.line == node.start_mark.line else end.line - 1
        if isinstance(node, yaml.MappingNode):
            return max(max(last_line(k), last_line(v)) for k, v in node.value)
        if isinstance(node, yaml.SequenceNode):
            if not node.value:
                return node.end_mark.line
            return max(last_line(v) for v in node.value)
        return node.end_mark.line

    col = pin_node.value[0][0].start_mark.column
    try:
        key, val = lockfill.child(pin_node, "files")
    except KeyError:
        return last_line(pin_node) + 1, last_line(pin_node), col, False
    return key.start_mark.line, max(key.start_mark.line, last_line(val)), col, True


def render_files(files, col: int) -> list[str]:
    """The `files:` block at indent `col`: `filename` + `sha256` per wheel (a wheelset's files lead with `name`
    and `version`)."""
    ind = " " * col
    out = [f"{ind}files:\n"]
    for f in files:
        sha = f.sha256 if any(c.isalpha() for c in f.sha256) else f'"{f.sha256}"'  # all digits would read as a number
        if isinstance(f, lockmod.WheelsetFile):
            out += [
                f"{ind}  - name: {f.name}\n",
                f'{ind}    version: "{f.version}"\n',
                f"{ind}    filename: {f.filename}\n",
                f"{ind}    sha256: {sha}\n",
            ]
        else:
            out += [f"{ind}  - filename: {f.filename}\n", f"{ind}    sha256: {sha}\n"]
    return out


def fill_text(text: str, resolved: list[Resolved]) -> str:
    """`text` with the `files:` block of each resolved pin replaced (or appended) and its `unresolved:` line
    dropped; nothing else changes."""
    for r in resolved:
        text = lockfill.drop_unresolved(text, r.pin)
        span = _span(text, r.pin)
        text = lockfill.put_block(text, span, render_files(r.files, span[2]))
    return text


def _describe(r) -> str:
    if r.files and isinstance(r.files[0], lockmod.WheelsetFile):
        return f"{len(r.files)} wheels: " + ", ".join(f"{f.name}=={f.version}" for f in r.files)
    return ", ".join(f"{f.filename} sha256 {f.sha256}" for f in r.files)


KIND = lockfill.PinKind(
    what="wheel",
    field="files",
    source="the index",
    names=wheel_names,
    resolve=resolve_pin,
    describe=lambda lock, r: _describe(r),
    check=check,
    fill_text=fill_text,
)


def run(lock_path: Path, names: list[str], do_check: bool, out=print) -> int:
    """Fill or check wheel pins (see reprostack.lock.fill.run)."""
    return lockfill.run(KIND, lock_path, names, do_check, out)
