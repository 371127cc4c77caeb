"""An image built twice from scratch, compared (issue 26 item 3): layers by diff id, files by sha256, ELF sections.

    python3 scripts/image_twice.py record IMAGE --out A.json [--build-json out/build/images.json] [--key GLOB]...
    python3 scripts/image_twice.py compare A.json B.json --image NAME --how TEXT --out results/images/NAME-twice.json

`record` (needs the Docker engine at $DOCKER_HOST) writes what one build made: the image id, each layer's diff id with
the history step that made it (the engine's `created_by`, empty layers left out), the sha256 of every regular file of
the image (`find / -xdev -type f` in a container with no network, less the files the engine mounts per container and
/proc, /sys, /dev), and, for each file matching a `--key` glob (the files that matter: libnccl, DeepEP's `_C*.so`, the
aws-ofi-nccl plugin, kernels.json, libfabric / libibverbs / libefa), its sha256 and, for an ELF file, the sha256 of
each section by name (read from the file copied out of a container). With `--build-json`, the build's own record for
that image (seconds, context bytes, tag) is kept too.

`compare` joins two records: per layer (by position) identical or not; the files that differ or exist in one build
only (by path); per key file identical or not and, where an ELF file differs, the sections that differ. The result
names the project commit and lock sha256 both records were made at (they must be the same, else exit 2), both image
ids and a `differences` list in words; nothing is typed in by hand.

Invariants: `compare` is pure (reads two JSON files, writes one atomically); every input is untrusted: a record that
is not the shape `record` writes is one line naming the file and field, exit 2, no traceback; `record` runs the
engine with an argument vector only (no shell on this machine) and leaves no container behind.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

ENGINE_FILES = ("/etc/hostname", "/etc/hosts", "/etc/resolv.conf")
FIND = (
    "find / -xdev \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o -type f -print0"
    " | sort -z | xargs -0r sha256sum"
)
DEFAULT_KEYS = (
    "*/libnccl.so*",
    "*/deep_ep/_C*.so",
    "*/libnccl-net*.so",
    "/opt/reprostack/kernels.json",
    "*/libfabric.so*",
    "*/libibverbs.so*",
    "*/libefa*.so*",
    "*/libgdrapi.so*",
    "/opt/reprostack/built.json",
)


class Bad(Exception):
    """An input that is not what this script writes: one line."""


def elf_sections(data: bytes) -> dict[str, str] | None:
    """{section name: sha256 of its bytes} of a 64-bit little-endian ELF file, None for anything else. NOBITS
    sections (no bytes in the file) hash their size. Raises Bad for a truncated or inconsistent header."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shnum == 0:
        return {}
    if shentsize < 64 or shoff + shnum * shentsize > len(data) or shstrndx >= shnum:
        raise Bad(f"ELF section headers out of the file (offset {shoff}, {shnum} x {shentsize})")
    heads = []
    for i in range(shnum):
        name, typ, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        heads.append((name, typ, off, size))
    _, _, stroff, strsize = heads[shstrndx]
    if stroff + strsize > len(data):
        raise Bad("ELF section name table out of the file")
    names = data[stroff : stroff + strsize]
    out: dict[str, str] = {}
    for i, (name, typ, off, size) in enumerate(heads):
        if i == 0:
            continue
        end = names.find(b"\0", name)
        label = names[name : end if end >= 0 else None].decode("utf-8", "replace") or f"[{i}]"
        if label in out:
            label = f"{label}[{i}]"
        if typ == 8:  # SHT_NOBITS
            out[label] = f"nobits:{size}"
            continue
        if off + size > len(data):
            raise Bad(f"ELF section {label} out of the file")
        out[label] = hashlib.sha256(data[off : off + size]).hexdigest()
    return out


def layer_steps(created_by: list[str], n_layers: int) -> list[str]:
    """The history step (oldest first) that made each of the image's `n_layers` layers: the classic builder writes
    `/bin/sh -c #(nop) ` before every step that makes no layer (ENV, ARG, LABEL, ...) except COPY and ADD. When the
    count does not match (a base made otherwise), the oldest layers are labelled "" ."""
    made = [s for s in created_by if "#(nop) " not in s or "#(nop) COPY" in s or "#(nop) ADD" in s]
    made = [s.replace("/bin/sh -c #(nop) ", "").replace("/bin/sh -c ", "RUN ").strip() for s in made]
    if len(made) >= n_layers:
        return made[len(made) - n_layers :]
    return [""] * (n_layers - len(made)) + made


def _docker(*args: str, stdin: bytes | None = None) -> bytes:
    p = subprocess.run(["docker", *args], input=stdin, capture_output=True)
    if p.returncode != 0:
        raise Bad(f"docker {' '.join(args[:2])}: {p.stderr.decode(errors='replace').strip().splitlines()[-1:]}")
    return p.stdout


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()


def record(image: str, keys: list[str], build_json: Path | None) -> dict:
    """What one build made (see the module doc)."""
    insp = json.loads(_docker("image", "inspect", image))[0]
    diff_ids = insp["RootFS"]["Layers"]
    hist = [
        json.loads(x) for x in _docker("image", "history", "--no-trunc", "--format", "{{json .}}", image).splitlines()
    ]
    steps = layer_steps([h.get("CreatedBy", "") for h in reversed(hist)], len(diff_ids))
    cid = _docker("create", "--network", "none", "--entrypoint", "sh", image, "-c", FIND).decode().strip()
    try:
        _docker("start", cid)
        code = _docker("wait", cid).decode().strip()
        listing = _docker("logs", cid).decode("utf-8", "replace")
        if code != "0":
            raise Bad(f"{image}: the file listing exited {code}")
        files = {}
        for line in listing.splitlines():
            sha, _, path = line.partition("  ")
            if len(sha) == 64 and path and path not in ENGINE_FILES:
                files[path] = sha
        key_files = {}
        for path in sorted(files):
            if not any(fnmatch.fnmatch(path, k) for k in keys):
                continue
            entry = {"sha256": files[path]}
            tar = _docker("cp", f"{cid}:{path}", "-")
            with tarfile.open(fileobj=io.BytesIO(tar)) as t:
                member = t.next()
                data = t.extractfile(member).read() if member is not None and member.isfile() else b""
            secs = elf_sections(data)
            if secs is not None:
                entry["elf_sections"] = secs
            key_files[path] = entry
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
    rec = {
        "kind": "image-build",
        "image": image,
        "image_id": insp["Id"],
        "size_bytes": insp.get("Size"),
        "project_commit": _git("rev-parse", "HEAD"),
        "project_dirty": bool(_git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!results")),
        "lock_sha256": hashlib.sha256(Path("upstreams.lock").read_bytes()).hexdigest(),
        "layers": [{"step": s, "diff_id": d} for s, d in zip(steps, diff_ids)],
        "files": files,
        "key_files": key_files,
    }
    if build_json is not None:
        summary = json.loads(build_json.read_text())
        rec["builds"] = [
            i for i in summary.get("images", []) if i.get("image_id") == insp["Id"] or i.get("id") == insp["Id"]
        ]
    return rec


def _need(rec: object, field: str, typ, where: str):
    if not isinstance(rec, dict) or not isinstance(rec.get(field), typ):
        raise Bad(f"{where}: {field}: missing or not a {typ.__name__}")
    return rec[field]


def compare(a: dict, b: dict, image: str, how: str, where: tuple[str, str] = ("A", "B")) -> dict:
    """The comparison of two `record` outputs (see the module doc). Raises Bad naming the file and field."""
    for rec, w in zip((a, b), where):
        for f, t in (("image_id", str), ("project_commit", str), ("lock_sha256", str), ("layers", list)):
            _need(rec, f, t, w)
        for f in ("files", "key_files"):
            _need(rec, f, dict, w)
    for f in ("project_commit", "lock_sha256"):
        if a[f] != b[f]:
            raise Bad(f"{where[1]}: {f}: {b[f]}, {where[0]} has {a[f]}: the two builds are not of the same inputs")
    layers = []
    for i in range(max(len(a["layers"]), len(b["layers"]))):
        la = a["layers"][i] if i < len(a["layers"]) else {}
        lb = b["layers"][i] if i < len(b["layers"]) else {}
        layers.append(
            {
                "step": la.get("step") or lb.get("step") or "",
                "diff_ids": [la.get("diff_id"), lb.get("diff_id")],
                "identical": bool(la) and la.get("diff_id") == lb.get("diff_id"),
            }
        )
    fa, fb = a["files"], b["files"]
    differ = sorted(p for p in fa.keys() & fb.keys() if fa[p] != fb[p])
    only_a, only_b = sorted(fa.keys() - fb.keys()), sorted(fb.keys() - fa.keys())
    keys = []
    for path in sorted(a["key_files"].keys() | b["key_files"].keys()):
        ka, kb = a["key_files"].get(path), b["key_files"].get(path)
        row = {"path": path, "sha256": [ka and ka.get("sha256"), kb and kb.get("sha256")]}
        row["identical"] = bool(ka and kb) and ka.get("sha256") == kb.get("sha256")
        sa, sb = (ka or {}).get("elf_sections"), (kb or {}).get("elf_sections")
        if not row["identical"] and isinstance(sa, dict) and isinstance(sb, dict):
            row["sections_differ"] = sorted(s for s in sa.keys() | sb.keys() if sa.get(s) != sb.get(s))
        keys.append(row)
    n_same_layers = sum(1 for x in layers if x["identical"])
    diffs = []
    for x in layers:
        if not x["identical"]:
            diffs.append(f"layer `{x['step'][:120]}`: diff ids differ")
    for p in differ:
        diffs.append(f"file {p}: sha256 differs")
    for p in only_a:
        diffs.append(f"file {p}: only in build 1")
    for p in only_b:
        diffs.append(f"file {p}: only in build 2")
    return {
        "kind": "image-twice",
        "image": image,
        "how": how,
        "project_commit": a["project_commit"],
        "project_dirty": bool(a.get("project_dirty")) or bool(b.get("project_dirty")),
        "lock_sha256": a["lock_sha256"],
        "image_ids": [a["image_id"], b["image_id"]],
        "size_bytes": [a.get("size_bytes"), b.get("size_bytes")],
        "builds": [a.get("builds", []), b.get("builds", [])],
        "layers": layers,
        "layers_identical": f"{n_same_layers} of {len(layers)}",
        "files": len(fa.keys() | fb.keys()),
        "files_identical": not (differ or only_a or only_b),
        "files_differ": differ,
        "files_only_in": [only_a, only_b],
        "key_files": keys,
        "key_files_identical": all(k["identical"] for k in keys),
        "differences": diffs,
    }


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)


def _load(path: Path) -> dict:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise Bad(f"{path}: {e}") from None
    if not isinstance(d, dict) or d.get("kind") != "image-build":
        raise Bad(f"{path}: kind: not an image-build record")
    return d


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("image")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--build-json", type=Path)
    r.add_argument("--key", action="append", help="glob of a file that matters (default: the module doc's list)")
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    c.add_argument("--image", required=True)
    c.add_argument("--how", required=True)
    c.add_argument("--note", action="append", default=[], help="a why for the differences (kept as `why`)")
    c.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "record":
            _write(args.out, record(args.image, args.key or list(DEFAULT_KEYS), args.build_json))
        else:
            out = compare(_load(args.a), _load(args.b), args.image, args.how, (str(args.a), str(args.b)))
            if args.note:
                out["why"] = args.note
            _write(args.out, out)
            print(
                f"{args.image}: layers identical {out['layers_identical']}, files identical {out['files_identical']}"
                f" ({out['files']}), key files identical {out['key_files_identical']}"
            )
    except Bad as e:
        print(f"image_twice: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
