#!/usr/bin/env python3
"""Installed-vs-lock check, run inside an image after every pip install (stdlib only).

usage: check-pins.py PINS.json [PINS.json ...]

Each PINS.json is what reprostack writes next to a wheelset in the build context: {"pin": NAME,
"packages": {dist: version}, "overrides": [dist, ...]}. Every pinned distribution must be installed at
exactly its pinned version in this interpreter. On a difference, the message names the distribution,
the two versions and the chain of installed distributions that require it (who pulled the other
version in), e.g. `nvidia-nccl-cu13: lock 2.30.4, installed 2.28.9 (required by torch <- vllm)`.
Exit 0 when everything matches, 1 otherwise.
"""

import json
import re
import sys
from importlib import metadata


def canon(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def installed():
    """{dist: [Distribution, ...]}: more than one when two versions' metadata are on the path."""
    out = {}
    for d in metadata.distributions():
        name = d.metadata.get("Name")
        if name:
            out.setdefault(canon(name), []).append(d)
    return out


def requirers(dists):
    """{dist: [dists whose Requires-Dist names it]} over what is installed (markers ignored)."""
    rev = {}
    for name, ds in dists.items():
        for req in ds[0].requires or ():
            if "extra ==" in req.replace('"', "").replace("'", ""):
                continue
            target = canon(re.split(r"[\s;<>=!~\[(]", req.strip(), maxsplit=1)[0])
            rev.setdefault(target, set()).add(name)
    return {k: sorted(v) for k, v in rev.items()}


def chain(name, rev, seen=None):
    """`a <- b <- c`: the first installed distribution that requires `name`, followed upwards."""
    seen = seen or {name}
    for parent in rev.get(name, ()):
        if parent in seen:
            continue
        rest = chain(parent, rev, seen | {parent})
        return parent + (" <- " + rest if rest else "")
    return ""


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    dists = installed()
    rev = requirers(dists)
    bad = 0
    for path in argv[1:]:
        with open(path) as f:
            pins = json.load(f)
        packages = {canon(k): v for k, v in pins["packages"].items()}
        wrong = 0
        for name, want in sorted(packages.items()):
            versions = sorted({d.version for d in dists.get(name, ())})
            if versions == [want]:
                continue
            wrong += 1
            others = ", ".join(v for v in versions if v != want) or "nothing"
            have = others + (f" beside {want}" if want in versions else "")
            who = chain(name, rev)
            print(f"check-pins: {pins['pin']}: {name}: lock {want}, installed {have}"
                  + (f" (required by {who})" if who else ""), file=sys.stderr)
        if not wrong:
            print(f"check-pins: {pins['pin']}: {len(packages)} distributions at their pinned versions")
        bad += wrong
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
