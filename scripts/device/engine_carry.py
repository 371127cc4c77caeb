"""Carry a serving engine's locked wheels to the lent H200 in parts, check every wheel against upstreams.lock there
before anything is installed, and install them beside the device's torch venv (issue 28 item 2).

    here:    python scripts/device/engine_carry.py split ENGINE [--part-bytes N] [--record FILE]
    device:  python3 scripts/device/engine_carry.py receive                  (one call per part, carry [".eN"])
             python3 scripts/device/engine_carry.py install ENGINE --site DIR --aiperf-venv DIR [--python PY]

What travels is written down in `scripts/device/carry/ENGINE.txt` (the recipe), one directive a line:
  `pin PIN TARGET`               a wheelset pin of the lock; TARGET `site` (vLLM/SGLang: pip --target DIR, put on
                                 PYTHONPATH beside /opt/torch/.venv, which is never modified) or `aiperf` (the pinned
                                 AIPerf's own venv, gates/aiperftool.py REPROSTACK_AIPERF_VENV);
  `omit PIN NAME -- WHY`         a distribution of the pin not carried (the run's path never imports it);
  `keep PIN NAME...`             when a pin has `keep` lines, only those distributions are carried;
  `have PIN NAME VERSION -- SRC` not carried: the device's torch venv has it at that version (checked there by
                                 `install` before it installs anything: a different version is one line, exit 2).
The pin's `installed-on` base (h200-torch-wheels: what /opt/torch/.venv is assumed to hold) is never carried;
`install` checks that each of its distributions is importable there and prints the versions it finds.

`split` (here, with this project's venv: it loads the lock and fetches the selected wheels into the reprostack cache,
sha256-checked) concatenates the selected wheels, each file once, into one stream and cuts it into parts of at most
--part-bytes (default $SEED_PART_BYTES, else 54 MiB: a part and the ~8 MB working tree fit one call's 64 MiB) in
git-ignored folders `.e1/ .e2/ ...`; each holds `part`, `meta` (`CARRY_ID PARTS INDEX PART_SHA256`) and `plan.json`
(every wheel in stream order: pin, name, version, filename, sha256, bytes; CARRY_ID is the plan's sha256). It prints
what it carries, omits and assumes, the bytes and the number of calls.
`receive` (device) stores each carried part under .cache/engine-parts/CARRY_ID/ after checking its sha256 against its
meta and the plan against CARRY_ID; once every part of a carry is there it cuts the stream back into wheels, and each
wheel is written to .cache/wheelhouse/ only when its sha256 equals the plan's AND the one upstreams.lock pins for that
filename in that pin (read here with the standard library: the device has no reprostack dependencies). Idempotent:
it says which parts are still missing. `install` re-hashes every wheel against the lock, then installs.

Invariants: nothing half-written is left in .cache/wheelhouse (temporary name, then rename); a wheel whose bytes are
not the lock's is never installed; every problem is one line on stderr and exit 2; the torch venv is never written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

MIB = 1024 * 1024
DEFAULT_PART = 54 * MIB
PREFIX = ".e"
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*\.whl$")
_SHA = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 4 * MIB


class CarryError(Exception):
    """One line for the operator: what is wrong and where."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------- the recipe


@dataclass
class Recipe:
    path: Path
    pins: dict = field(default_factory=dict)  # pin -> target
    omit: dict = field(default_factory=dict)  # pin -> {name: why}
    keep: dict = field(default_factory=dict)  # pin -> set of names
    have: dict = field(default_factory=dict)  # pin -> {name: (version, source)}


def read_recipe(path: Path) -> Recipe:
    """The carry recipe (module doc); CarryError `FILE:LINE: problem` for anything it cannot use."""
    r = Recipe(Path(path))
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise CarryError(f"{path}: cannot read the carry recipe: {e}") from None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        head, _, why = line.partition(" -- ")
        words = head.split()
        where = f"{path}:{n}"
        if words[0] == "pin" and len(words) == 3 and words[2] in ("site", "aiperf"):
            r.pins[words[1]] = words[2]
        elif words[0] == "omit" and len(words) == 3 and why.strip():
            r.omit.setdefault(words[1], {})[canonical(words[2])] = why.strip()
        elif words[0] == "keep" and len(words) >= 3:
            r.keep.setdefault(words[1], set()).update(canonical(w) for w in words[2:])
        elif words[0] == "have" and len(words) == 4 and why.strip():
            r.have.setdefault(words[1], {})[canonical(words[2])] = (words[3], why.strip())
        else:
            raise CarryError(
                f"{where}: not a directive (pin PIN site|aiperf; omit PIN NAME -- WHY; keep PIN NAME...; "
                f"have PIN NAME VERSION -- SOURCE): {raw.strip()[:120]!r}"
            )
        if words[0] != "pin" and words[1] not in r.pins:
            raise CarryError(f"{where}: pin {words[1]!r} has no `pin` line above")
    if not r.pins:
        raise CarryError(f"{path}: no `pin` line")
    for pin in r.have:
        if r.pins[pin] != "site":
            raise CarryError(f"{path}: have {pin}: only a `site` pin can count on the torch venv's packages")
    return r


# ----------------------------------------------------------------------------------- the lock, standard library


def lock_files(lock_text: str, pin: str) -> dict[str, str]:
    """{filename: sha256} of wheelset pin `pin` in the lock's text, read line by line: the pin's block is from
    `  PIN:` to the next line indented by two spaces; its entries are `filename:` lines followed by `sha256:`.
    The lock is validated here by `reprostack lock check`; on the device this reads only what it needs."""
    out: dict[str, str] = {}
    inside, filename = False, None
    for line in lock_text.splitlines():
        if re.match(r"^  [^ #]", line):
            inside = line.rstrip() == f"  {pin}:"
            filename = None
            continue
        if not inside:
            continue
        m = re.match(r"^\s+(?:- )?(filename|sha256):\s*(\S+)\s*$", line)
        if not m:
            continue
        if m.group(1) == "filename":
            filename = m.group(2)
        elif filename is not None:
            out[filename] = m.group(2)
            filename = None
    return out


# -------------------------------------------------------------------------------------------------- split


def select(lock, recipe: Recipe) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
    """(carried, omitted, assumed present, base) of the recipe's pins in `lock` (a reprostack.lock.Lock). Carried:
    dicts pin, target, name, version, filename, sha256, in pin then name order, each file once (the first pin that
    lists it carries it; later pins name it in `also`)."""
    carried, omitted, have, base, seen = [], [], [], [], {}
    for pin, target in recipe.pins.items():
        p = lock.get(pin)
        files = getattr(p, "files", None)
        if not files or not hasattr(p, "installed_on"):
            raise CarryError(f"{lock.where('upstreams', pin)}: not a wheelset pin with files")
        names = {f.name for f in files}
        for kind, wanted in (("omit", recipe.omit.get(pin, {})), ("keep", recipe.keep.get(pin, set()))):
            for n in sorted(set(wanted) - names):
                raise CarryError(f"{recipe.path}: {kind} {pin} {n}: {n} is not a distribution of {pin}")
        for n, (v, src) in sorted(recipe.have.get(pin, {}).items()):
            f = p.file(n)
            if f is None or f.version != v:
                raise CarryError(
                    f"{recipe.path}: have {pin} {n} {v}: {pin} pins {n} {f.version if f else '(absent)'}, so the "
                    f"device's {n} {v} is not the one it needs"
                )
            have.append({"pin": pin, "name": n, "version": v, "source": src})
        if p.installed_on:
            base += [
                {"pin": p.installed_on, "name": f.name, "version": f.version} for f in lock.get(p.installed_on).files
            ]
        keep = recipe.keep.get(pin)
        for f in files:
            if f.name in recipe.omit.get(pin, {}) or (keep is not None and f.name not in keep):
                why = recipe.omit.get(pin, {}).get(f.name, "not on the recipe's keep list")
                omitted.append({"pin": pin, "name": f.name, "version": f.version, "why": why, "filename": f.filename})
                continue
            if f.name in recipe.have.get(pin, {}):
                continue
            if f.sha256 in seen:
                seen[f.sha256].setdefault("also", []).append(pin)
                continue
            seen[f.sha256] = w = {
                "pin": pin,
                "target": target,
                "name": f.name,
                "version": f.version,
                "filename": f.filename,
                "sha256": f.sha256,
            }
            carried.append(w)
    return carried, omitted, have, base


def split(
    root: Path, engine: str, part_bytes: int, cache: Path | None, record: Path | None, full: bool = False
) -> dict:
    """Write the parts (module doc); returns the summary that is printed (and written to `record`). `full`: fetch
    the omitted wheels too, to measure what the whole closure would carry (nothing more travels)."""
    sys.path.insert(0, str(root / "src"))
    from dataclasses import replace

    from reprostack.errors import ReprostackError
    from reprostack.fetch.wheels import fetch_wheels, wheelhouses_from_env
    from reprostack.lock import load

    recipe = read_recipe(root / "scripts" / "device" / "carry" / f"{engine}.txt")
    try:
        lock = load(root / "upstreams.lock")
        carried, omitted, have, base = select(lock, recipe)
        for pin in recipe.pins:  # fetch only what is carried (sha256-checked into the cache)
            want = {w["filename"] for w in carried if w["pin"] == pin}
            if full:
                want |= {o["filename"] for o in omitted if o["pin"] == pin}
            sub = replace(lock.get(pin), files=tuple(f for f in lock.get(pin).files if f.filename in want))
            if sub.files:
                one = replace(lock, upstreams={**lock.upstreams, pin: sub})
                got = fetch_wheels(one, pin, cache_root=cache, wheelhouses=wheelhouses_from_env())
                for w in carried + omitted:
                    for g in got:
                        if g.filename == w["filename"] and w["pin"] == pin:
                            w["path"] = str(g.path)
    except ReprostackError as e:
        raise CarryError(str(e)) from None
    for w in carried:
        w["bytes"] = Path(w["path"]).stat().st_size
    plan = {
        "engine": engine,
        "recipe": str(recipe.path.relative_to(root)),
        "pins": recipe.pins,
        "wheels": [{k: v for k, v in w.items() if k != "path"} for w in carried],
        "have": have,
        "base": base,
        "omitted": [{k: v for k, v in o.items() if k not in ("filename", "path")} for o in omitted],
    }
    text = (json.dumps(plan, indent=1, sort_keys=True) + "\n").encode()
    carry_id = hashlib.sha256(text).hexdigest()
    total = sum(w["bytes"] for w in carried)
    n = max(1, -(-total // part_bytes))
    for old in root.glob(f"{PREFIX}[0-9]*"):
        shutil.rmtree(old)
    stream = _Stream([Path(w["path"]) for w in carried])
    for i in range(1, n + 1):
        d = root / f"{PREFIX}{i}"
        d.mkdir()
        h = hashlib.sha256()
        with open(d / "part", "wb") as out:
            left = part_bytes
            while left:
                block = stream.read(min(left, _CHUNK))
                if not block:
                    break
                out.write(block)
                h.update(block)
                left -= len(block)
        (d / "meta").write_text(f"{carry_id} {n} {i} {h.hexdigest()}\n")
        (d / "plan.json").write_bytes(text)
    summary = {
        "engine": engine,
        "carry_id": carry_id,
        "part_bytes": part_bytes,
        "parts": n,
        "bytes": total,
        "wheels": len(carried),
        "by_pin": {
            p: {
                "wheels": sum(1 for w in carried if w["pin"] == p),
                "bytes": sum(w["bytes"] for w in carried if w["pin"] == p),
            }
            for p in recipe.pins
        },
        "omitted": len(omitted),
        "omitted_bytes": sum(Path(o["path"]).stat().st_size for o in omitted) if full else None,
        "have": [f"{h['name']}=={h['version']}" for h in have],
        "base": sorted({b["pin"] for b in base}),
    }
    if record is not None:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    return summary


class _Stream:
    """The files one after another as one readable stream."""

    def __init__(self, paths: list[Path]):
        self.paths, self.f = list(paths), None

    def read(self, n: int) -> bytes:
        while True:
            if self.f is None:
                if not self.paths:
                    return b""
                self.f = open(self.paths.pop(0), "rb")
            b = self.f.read(n)
            if b:
                return b
            self.f.close()
            self.f = None


# ------------------------------------------------------------------------------------------------ receive


def _meta(d: Path) -> tuple[str, int, int, str]:
    try:
        words = (d / "meta").read_text().split()
    except (OSError, UnicodeDecodeError) as e:
        raise CarryError(f"{d}/meta: unreadable: {e}") from None
    if len(words) != 4 or not _SHA.match(words[0]) or not _SHA.match(words[3]):
        raise CarryError(f"{d}/meta: expected `CARRY_ID PARTS INDEX PART_SHA256`")
    if not (words[1].isdigit() and words[2].isdigit()) or words[1].startswith("0") or words[2].startswith("0"):
        raise CarryError(f"{d}/meta: part numbers must be integers from 1")
    n, i = int(words[1]), int(words[2])
    if not (1 <= i <= n <= 9999):
        raise CarryError(f"{d}/meta: part {i} of {n} is out of range")
    return words[0], n, i, words[3]


def _plan(text: bytes, where: str) -> dict:
    try:
        plan = json.loads(text)
        wheels = plan["wheels"]
        for w in wheels:
            if not (_FILE.match(w["filename"]) and _SHA.match(w["sha256"]) and _NAME.match(w["name"])):
                raise ValueError(f"bad wheel entry {w.get('filename')!r}")
            if not isinstance(w["bytes"], int) or w["bytes"] <= 0 or w["target"] not in ("site", "aiperf"):
                raise ValueError(f"bad size or target of {w['filename']}")
            if w["pin"] not in plan["pins"]:
                raise ValueError(f"{w['filename']}: pin {w['pin']!r} is not one of the plan's")
        for p in plan["pins"]:
            if not _NAME.match(p):
                raise ValueError(f"bad pin name {p!r}")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CarryError(f"{where}: not a carry plan ({e})") from None
    return plan


def receive(root: Path) -> list[str]:
    """Store the carried parts; join every complete carry into .cache/wheelhouse (module doc). Returns the lines
    to print."""
    store, house = root / ".cache" / "engine-parts", root / ".cache" / "wheelhouse"
    said = []
    folders = [d for d in root.glob(f"{PREFIX}[0-9]*") if d.name[len(PREFIX) :].isdigit()]
    for d in sorted(folders, key=lambda p: int(p.name[len(PREFIX) :])):
        if not (d / "meta").is_file():
            continue
        cid, n, i, psha = _meta(d)
        text = (d / "plan.json").read_bytes() if (d / "plan.json").is_file() else b""
        if hashlib.sha256(text).hexdigest() != cid:
            raise CarryError(f"{d}/plan.json: sha256 is not the carry id {cid} of its meta")
        _plan(text, f"{d}/plan.json")
        if sha256_file(d / "part") != psha:
            raise CarryError(f"{d}/part: sha256 differs from its meta (torn transfer)")
        dest = store / cid
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "plan.json").write_bytes(text)
        tmp = dest / f".part.{i}.tmp"
        shutil.copyfile(d / "part", tmp)
        os.replace(tmp, dest / f"part.{i}")
        (dest / "parts").write_text(f"{n}\n")
        said.append(f"stored part {i}/{n} of carry {cid[:12]}")
    for dest in sorted(p for p in store.glob("*") if p.is_dir()) if store.is_dir() else []:
        if (dest / "complete").is_file():
            said.append(f"carry {dest.name[:12]}: complete ({(dest / 'complete').read_text().strip()})")
            continue
        n = int((dest / "parts").read_text())
        missing = [str(i) for i in range(1, n + 1) if not (dest / f"part.{i}").is_file()]
        if missing:
            said.append(f"carry {dest.name[:12]}: still missing part(s) {' '.join(missing)} of {n}")
            continue
        said += join(root, dest, n, house)
    return said


def join(root: Path, dest: Path, n: int, house: Path) -> list[str]:
    """Cut the joined parts back into wheels, each checked against the plan and the lock before it is placed."""
    plan = _plan((dest / "plan.json").read_bytes(), f"{dest}/plan.json")
    lock_text = (root / "upstreams.lock").read_text()
    locked = {p: lock_files(lock_text, p) for p in plan["pins"]}
    house.mkdir(parents=True, exist_ok=True)
    parts = [open(dest / f"part.{i}", "rb") for i in range(1, n + 1)]
    placed = 0
    try:
        src = _Files(parts)
        for w in plan["wheels"]:
            want = locked[w["pin"]].get(w["filename"])
            if want is None:
                raise CarryError(f"upstreams.lock: {w['pin']} pins no file {w['filename']} (the plan carries it)")
            if want != w["sha256"]:
                raise CarryError(f"{w['filename']}: the plan says sha256 {w['sha256']}, upstreams.lock pins {want}")
            tmp = house / f".{w['filename']}.tmp"
            h, left = hashlib.sha256(), w["bytes"]
            with open(tmp, "wb") as out:
                while left:
                    block = src.read(min(left, _CHUNK))
                    if not block:
                        break
                    out.write(block)
                    h.update(block)
                    left -= len(block)
            if left or h.hexdigest() != want:
                tmp.unlink()
                got = "short" if left else f"sha256 {h.hexdigest()}"
                raise CarryError(f"{w['filename']}: joined bytes are {got}, upstreams.lock pins {want}")
            os.replace(tmp, house / w["filename"])
            placed += 1
        if src.read(1):
            raise CarryError(f"{dest}: the parts hold more bytes than the plan's wheels")
    finally:
        for f in parts:
            f.close()
    total = sum(w["bytes"] for w in plan["wheels"])
    (dest / "complete").write_text(f"{placed} wheels, {total} bytes, in {house}\n")
    for i in range(1, n + 1):
        (dest / f"part.{i}").unlink()
    return [
        f"carry {dest.name[:12]}: joined {n} part(s): {placed} wheels, {total} bytes, each sha256 as "
        f"upstreams.lock pins ({house})"
    ]


class _Files(_Stream):
    def __init__(self, files):
        self.files, self.f = list(files), None

    def read(self, n: int) -> bytes:
        while self.files:
            b = self.files[0].read(n)
            if b:
                return b
            self.files.pop(0)
        return b""


# ------------------------------------------------------------------------------------------------ install


def complete_plan(root: Path, engine: str) -> dict:
    store = root / ".cache" / "engine-parts"
    found = [d for d in (store.glob("*") if store.is_dir() else []) if (d / "complete").is_file() and d.is_dir()]
    plans = [_plan((d / "plan.json").read_bytes(), f"{d}/plan.json") for d in found]
    plans = [p for p in plans if p.get("engine") == engine]
    if len(plans) != 1:
        raise CarryError(
            f"{store}: {len(plans)} complete carries of {engine} (need exactly 1: run `receive` with every part)"
        )
    return plans[0]


_PROBE = r"""
import importlib.metadata as md, json, sys
out = {}
for n in sys.argv[1:]:
    try:
        out[n] = md.version(n)
    except md.PackageNotFoundError:
        out[n] = None
print(json.dumps(out))
"""


def installed(python: str, names: list[str]) -> dict:
    """{name: version or None} as `python` (without our PYTHONPATH) sees them."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([python, "-c", _PROBE, *names], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise CarryError(f"{python}: cannot list its packages: {r.stderr.strip()[-300:]}")
    return json.loads(r.stdout)


def install(root: Path, engine: str, site: Path, venv: Path, python: str) -> list[str]:
    plan = complete_plan(root, engine)
    house = root / ".cache" / "wheelhouse"
    said = []
    have = installed(python, [h["name"] for h in plan["have"]] + [b["name"] for b in plan["base"]])
    for h in plan["have"]:
        got = have.get(h["name"])
        if got is None or got.split("+")[0] != h["version"]:
            raise CarryError(
                f"{python} has {h['name']} {got or '(not installed)'}, the carry assumed {h['version']} "
                f"({h['source']}): carry it (drop its `have` line from {plan['recipe']})"
            )
    missing = sorted({b["name"] for b in plan["base"] if have.get(b["name"]) is None})
    if missing:
        raise CarryError(f"{python} lacks {', '.join(missing)} of {plan['base'][0]['pin']} (assumed installed there)")
    differ = sorted(
        f"{b['name']} {have[b['name']]} (locked {b['version']})"
        for b in plan["base"]
        if have[b["name"]].split("+")[0] != b["version"]
    )
    said.append(
        f"{python}: the {len({b['name'] for b in plan['base']})} distributions of the base are there"
        + (f"; at other versions than the base pins: {', '.join(differ)}" if differ else "")
    )
    lock_text = (root / "upstreams.lock").read_text()
    locked = {p: lock_files(lock_text, p) for p in plan["pins"]}
    wheels = {"site": [], "aiperf": []}
    for w in plan["wheels"]:
        f = house / w["filename"]
        got = sha256_file(f) if f.is_file() else "absent"
        if got != locked[w["pin"]].get(w["filename"]):
            raise CarryError(f"{f}: sha256 {got}, upstreams.lock pins {locked[w['pin']].get(w['filename'])}")
        for pin in [w["pin"], *w.get("also", [])]:
            wheels[plan["pins"][pin]].append(str(f))
    said.append(f"{len(plan['wheels'])} wheels re-hashed: each as upstreams.lock pins")
    pip = [
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--disable-pip-version-check",
    ]
    if wheels["site"]:
        _run([*pip, "--target", str(site), *sorted(set(wheels["site"]))], "pip install --target")
        said.append(f"{len(set(wheels['site']))} wheels installed into {site} (PYTHONPATH; {python}'s venv untouched)")
    if wheels["aiperf"]:
        said.append(aiperf_venv(python, venv, sorted(set(wheels["aiperf"])), plan, pip))
    return said


def aiperf_venv(python: str, venv: Path, wheels: list[str], plan: dict, pip: list[str]) -> str:
    """The pinned AIPerf's venv from the carried wheels, with the marker gates/aiperftool.py accepts
    (REPROSTACK_AIPERF_VENV): `python -m venv` (or `--without-pip` when ensurepip is absent, then pip --python)."""
    shutil.rmtree(venv, ignore_errors=True)
    r = subprocess.run([python, "-m", "venv", str(venv)], capture_output=True, text=True)
    if r.returncode == 0:
        cmd = [str(venv / "bin" / "python"), *pip[1:]]
    else:
        shutil.rmtree(venv, ignore_errors=True)
        _run([python, "-m", "venv", "--without-pip", str(venv)], "python -m venv --without-pip")
        cmd = [python, "-m", "pip", "--python", str(venv / "bin" / "python"), *pip[3:]]
    _run([*cmd, *wheels], "pip install (aiperf venv)")
    ap = [w for w in plan["wheels"] if w["name"] == "aiperf"]
    if len(ap) != 1 or not (venv / "bin" / "aiperf").is_file():
        raise CarryError(f"{venv}: no aiperf script after the install (the carry has {len(ap)} aiperf wheel(s))")
    marker = {"version": ap[0]["version"], "sha256": ap[0]["sha256"], "wheel": ap[0]["filename"]}
    (venv / ".reprostack-verified.json").write_text(json.dumps(marker) + "\n")
    return f"{len(wheels)} wheels installed into the AIPerf venv {venv} (REPROSTACK_AIPERF_VENV)"


def _run(cmd: list[str], what: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-4:])[-600:]
        raise CarryError(f"{what} failed (exit {r.returncode}): {tail}")


# --------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="engine_carry.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("engine")
    s.add_argument("--part-bytes", type=int, default=int(os.environ.get("SEED_PART_BYTES", DEFAULT_PART)))
    s.add_argument("--cache", type=Path, default=None)
    s.add_argument("--record", type=Path, default=None)
    s.add_argument("--full", action="store_true", help="also fetch the omitted wheels to record their bytes")
    sub.add_parser("receive")
    i = sub.add_parser("install")
    i.add_argument("engine")
    i.add_argument("--site", type=Path, required=True)
    i.add_argument("--aiperf-venv", type=Path, required=True)
    i.add_argument("--python", default=sys.executable)
    a = ap.parse_args(argv)
    root = Path.cwd()
    try:
        if a.cmd == "split":
            if a.part_bytes < 1 or a.part_bytes > 60 * MIB:
                raise CarryError(f"--part-bytes {a.part_bytes}: must be 1 .. {60 * MIB} (a call carries 64 MiB)")
            if not re.match(r"^[a-z0-9-]+$", a.engine):
                raise CarryError(f"engine {a.engine!r}: a recipe name under scripts/device/carry/")
            s = split(root, a.engine, a.part_bytes, a.cache, a.record, a.full)
            print(json.dumps(s, indent=1, sort_keys=True))
            print(
                f"{a.engine}: {s['wheels']} wheels, {s['bytes']} bytes ({s['bytes'] / MIB:.1f} MiB) in {s['parts']} "
                f"part(s) of <= {a.part_bytes} bytes: {' '.join(f'{PREFIX}{k}' for k in range(1, s['parts'] + 1))}"
            )
        elif a.cmd == "receive":
            print("\n".join(receive(root)))
        else:
            print("\n".join(install(root, a.engine, a.site.resolve(), a.aiperf_venv.resolve(), a.python)))
    except CarryError as e:
        print(f"engine_carry: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
