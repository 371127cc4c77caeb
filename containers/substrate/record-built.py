#!/usr/bin/env python3
"""Record in the image what was built from which pin: /opt/reprostack/built.json.

Usage: record-built.py OUT PIN=REV:TREE:PREFIX:FLAGSFILE ...
Each FLAGSFILE holds the exact configure/cmake arguments of that build, one per line (written by the RUN step
that used them). OUT gets {"built": {PIN: {"rev", "tree", "prefix", "flags"}}}, merged with what OUT holds.
"""
import json
import os
import sys


def main(argv):
    out, specs = argv[0], argv[1:]
    data = {"built": {}}
    if os.path.exists(out):
        with open(out) as f:
            data = json.load(f)
    for spec in specs:
        pin, _, rest = spec.partition("=")
        rev, tree, prefix, flags_file = rest.split(":", 3)
        if len(rev) != 40 or len(tree) != 40:
            sys.exit(f"record-built: {pin}: rev/tree must be 40 hex (got {rev!r}, {tree!r})")
        with open(flags_file) as f:
            flags = [l.rstrip("\n") for l in f if l.strip()]
        data["built"][pin] = {"rev": rev, "tree": tree, "prefix": prefix, "flags": flags}
    with open(out + ".tmp", "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(out + ".tmp", out)
    for pin, b in sorted(data["built"].items()):
        print(f"built {pin} {b['rev']} (tree {b['tree']}) -> {b['prefix']}")


if __name__ == "__main__":
    main(sys.argv[1:])
