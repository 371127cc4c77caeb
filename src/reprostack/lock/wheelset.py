"""`reprostack lock wheels` for `kind: wheelset` pins: the whole dependency closure of `requirements` for one
target interpreter, resolved by pip, each wheel with its sha256.

How a wheelset is resolved (pip itself, never index scraping):
1. `pip install --dry-run --ignore-installed --report - --target TMP --only-binary=:all: --python-version V
   --platform TAG... [--index-url INDEX] REQUIREMENT...` gives every distribution pip would install;
   A wheelset `installed-on` another one is resolved with the other's distributions as constraints (`-c`, except the ones
   it overrides, which its own requirements may pin differently) and keeps only the distributions the other
   does not have: installed on top of it with --no-deps, it never replaces what the other pinned;
2. each `overrides` entry is resolved alone with `--no-deps` and replaces the distribution of the same name
   (an override that replaces nothing is an error: it belongs under `requirements`);
3. a file whose index gave no sha256 is downloaded (`pip download --no-deps`) and hashed.
The result is sorted by distribution name. Fill and check follow `reprostack.lock.fill` (only the pin's
`files:` block is rewritten; on any error nothing is written).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..errors import ReprostackError
from .. import lock as lockmod  # the pin model's public face (lock.model, lock.pins)
from .pip import Resolved, download_hash, pip_report, report_wheel


def _target(pin: lockmod.WheelsetPin) -> list[str]:
    args = ["--only-binary=:all:", "--no-cache-dir", "--python-version", pin.python_version]
    for tag in pin.platform_tags:
        args += ["--platform", tag]
    if pin.index:
        args += ["--index-url", pin.index]
    return args


def _file(item: dict, pin: lockmod.WheelsetPin, what: str, tmp: str, timeout: float) -> lockmod.WheelsetFile:
    name, version, filename, sha = report_wheel(item, what)
    if not sha:
        sha = download_hash(_target(pin), f"{name}=={version}", filename, Path(tmp, "dl", name), what, timeout)
    return lockmod.WheelsetFile(name, version, filename, sha)


def resolve(lock: lockmod.Lock, name: str, timeout: float = 900.0) -> Resolved:
    """Resolve wheelset pin `name` (see module doc). Returns every distribution's file, sorted by name.
    Raises ReprostackError naming the pin's line when pip cannot resolve, resolves a non-wheel, or an override
    replaces nothing."""
    pin = lock.get(name)
    where = lock.where("upstreams", name, "requirements")
    what = f"{where}: {' '.join(pin.requirements)} (python {pin.python_version}, {', '.join(pin.platform_tags)})"
    with tempfile.TemporaryDirectory(prefix="reprostack-wheelset-") as tmp:
        extra, below = [], {}
        if pin.installed_on:
            base = lock.get(pin.installed_on)
            if not base.files:
                raise ReprostackError(
                    f"{lock.where('upstreams', name, 'installed-on')}: {pin.installed_on} has no files yet: "
                    f"resolve it first (`reprostack lock wheels {pin.installed_on} {name}`)"
                )
            below = {f.name: f.version for f in base.files}
            skip = {lockmod.canonical_name(o.split("==")[0]) for o in base.overrides}
            cfile = Path(tmp, "constraints.txt")
            cfile.write_text("".join(f"{n}=={v}\n" for n, v in sorted(below.items()) if n not in skip))
            extra = ["-c", str(cfile)]
        items = pip_report([*_target(pin), *extra, *pin.requirements], what, tmp, timeout)
        found = {
            f.name: f
            for f in (
                _file(i, pin, what, tmp, timeout)
                for i in items
                if lockmod.canonical_name(i["metadata"]["name"]) not in below
            )
        }
        for i, req in enumerate(pin.overrides):
            owhat = f"{lock.where('upstreams', name, 'overrides', i)}: {req}"
            items = pip_report([*_target(pin), "--no-deps", req], owhat, tmp, timeout)
            if len(items) != 1:
                raise ReprostackError(f"{owhat}: pip's report lists {len(items)} distributions, expected exactly 1")
            f = _file(items[0], pin, owhat, tmp, timeout)
            if f.name not in found:
                raise ReprostackError(
                    f"{owhat}: replaces nothing ({f.name} is not in the closure of the requirements); "
                    f"an added distribution belongs under `requirements`"
                )
            found[f.name] = f
    return Resolved(name, tuple(found[k] for k in sorted(found)))


def check(lock: lockmod.Lock, r: Resolved) -> list[str]:
    """Every difference between the pin's `files` and the resolved set, as `FILE:LINE: field: problem`."""
    pin = lock.get(r.pin)
    if not pin.files:
        return [
            f"{lock.where('upstreams', r.pin)}: no files pinned (pip resolves {len(r.files)} wheels; "
            f"run `reprostack lock wheels {r.pin}`)"
        ]
    problems = []
    have = {f.name: (i, f) for i, f in enumerate(pin.files)}
    for f in r.files:
        if f.name not in have:
            problems.append(
                f"{lock.where('upstreams', r.pin, 'files')}: {f.name}=={f.version} ({f.filename}) is in "
                f"the resolved set and missing from the lock"
            )
            continue
        i, g = have[f.name]
        if (g.version, g.filename, g.sha256) != (f.version, f.filename, f.sha256):
            problems.append(
                f"{lock.where('upstreams', r.pin, 'files', i)}: lock has {g.filename} sha256 {g.sha256}, "
                f"pip resolves {f.filename} sha256 {f.sha256}"
            )
    want = {f.name for f in r.files}
    for n, (i, g) in have.items():
        if n not in want:
            problems.append(
                f"{lock.where('upstreams', r.pin, 'files', i, 'name')}: {n}=={g.version} is not in the "
                f"resolved set any more"
            )
    return problems
