"""The device code (cubins) of a DeepEP build, by sha256, and the per-kernel comparison of two builds (issue 26 item 4).

    python3 scripts/cubins.py record --label h200-host BUILD_DIR... > cubins.json
    python3 scripts/cubins.py compare A.json B.json > table.md
    python3 scripts/cubins.py sass --labels A B A.cubin B.cubin > sass.json   (per function; nvdisasm on PATH)

`record` walks each BUILD_DIR (a DeepEP build folder, a JIT cache, an image's file tree) for
- every shared object with a `.nv_fatbin` section (DeepEP's `_C*.so`): its embedded cubins, extracted with
  `cuobjdump -xelf all` (the CUDA toolkit's; `$CUOBJDUMP`, else `cuobjdump` on PATH, else `$CUDA_HOME/bin`), each
  by its cuobjdump name (`<so>.<n>.sm_<arch>.cubin`) and sha256, and its PTX entries (`-lptx`) by name;
- every JIT kernel folder `kernel.<name>.<digest>/kernel.cubin` (DeepEP's JIT cache: the digest is that of the
  kernel's code, nvcc signature and flags, so two builds' folders of one name are the same kernel asked for), by
  folder name and sha256 (with the sha256 of its kernel.cu).
`compare` joins two records by key (shared object basename without its CPython ABI tag + cubin index + arch; a JIT
kernel by its name and the sha256 of its kernel.cu, `jit:<name>:<cu sha256, 16 hex>`, since the folder's digest also
hashes the nvcc flags, which hold the build's include paths: one kernel has another folder on another machine) and
writes a markdown table: identical, differs (both sha256), or only in one build.

Invariants: read-only on the build folders; cuobjdump runs with an argument vector in a temporary folder; a
missing cuobjdump is one line on stderr naming it and exit 2 (the JIT cubins need no tool and are still recorded
when `--no-so` is given).
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
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # run from a checkout
from reprostack.digest import sha256_file as _sha  # noqa: E402


def _has_fatbin(p: Path) -> bool:
    """Whether ELF file `p` has a section named .nv_fatbin (read from the section header string table)."""
    import struct

    try:
        with open(p, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:
                return False
            shoff = struct.unpack_from("<Q", head, 0x28)[0]
            shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
            f.seek(shoff)
            sh = f.read(shentsize * shnum)
            str_off, str_size = struct.unpack_from("<QQ", sh, shstrndx * shentsize + 0x18)
            f.seek(str_off)
            names = f.read(str_size)
    except (OSError, struct.error):
        return False
    return b"\0.nv_fatbin\0" in b"\0" + names


def cuobjdump() -> str | None:
    for c in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")):
        if c and Path(c).is_file():
            return c
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and Path(home, "bin", "cuobjdump").is_file():
        return str(Path(home, "bin", "cuobjdump"))
    return None


def so_cubins(so: Path, tool: str, keep: Path | None = None) -> tuple[list[dict], list[str]]:
    """([{key, cubin, arch, sha256}], [ptx names]) of shared object `so`; `keep`: also copy each cubin there."""
    out = []
    with tempfile.TemporaryDirectory(prefix="cubins-") as tmp:
        r = subprocess.run([tool, "-xelf", "all", str(so)], cwd=tmp, capture_output=True, text=True)
        if r.returncode != 0 and "does not contain" not in r.stderr:
            raise RuntimeError(f"{tool} -xelf all {so}: {r.stderr.strip()[-300:]}")
        for f in sorted(Path(tmp).iterdir()):
            parts = f.name.split(".")
            arch = next((x for x in parts if x.startswith("sm_")), "")
            out.append({"key": f"{so.name}:{f.name}", "cubin": f.name, "arch": arch, "sha256": _sha(f)})
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, keep / f.name)
    r = subprocess.run([tool, "-lptx", str(so)], capture_output=True, text=True)
    ptx = [ln.split(":", 1)[-1].strip() for ln in r.stdout.splitlines() if "PTX file" in ln]
    return out, ptx


def record(dirs: list[Path], label: str, with_so: bool, keep: Path | None = None) -> dict:
    tool = cuobjdump() if with_so else None
    if with_so and tool is None:
        print(
            "cuobjdump not found ($CUOBJDUMP, PATH, $CUDA_HOME/bin); --no-so records the JIT cubins only",
            file=sys.stderr,
        )
        raise SystemExit(2)
    rec = {"label": label, "cuobjdump": None, "shared_objects": [], "jit": []}
    if tool:
        v = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
        rec["cuobjdump"] = v[-1] if v else tool
    for d in dirs:
        for root, dirnames, files in os.walk(d):
            dirnames.sort()
            for fn in sorted(files):
                p = Path(root, fn)
                if p.is_symlink():
                    continue
                if fn == "kernel.cubin" and Path(root).name.startswith("kernel."):
                    cu = Path(root, "kernel.cu")
                    rec["jit"].append(
                        {
                            "key": Path(root).name,
                            "sha256": _sha(p),
                            "kernel_cu_sha256": _sha(cu) if cu.is_file() else None,
                        }
                    )
                elif tool and ".so" in fn and _has_fatbin(p):
                    cubins, ptx = so_cubins(p, tool, keep if "_C" in fn else None)
                    rec["shared_objects"].append(
                        {"path": str(p.relative_to(d)), "sha256": _sha(p), "cubins": cubins, "ptx": ptx}
                    )
    return rec


_ABI = re.compile(r"\.cpython-[0-9]+-[A-Za-z0-9_]+-linux-gnu")  # _C.cpython-312-x86_64-linux-gnu.so -> _C.cpython.so


def _entries(rec: dict) -> dict:
    """{key: sha256}; a shared object's CPython ABI tag is left out of its keys, so the `_C` built for CPython 3.12 on
    the host and for 3.11 in the image are joined (the device code does not depend on the host Python)."""
    out = {}
    for so in rec["shared_objects"]:
        for c in so["cubins"]:
            out[_ABI.sub(".cpython", c["key"])] = c["sha256"]
    for j in rec["jit"]:  # by (name, code): the folder digest differs with the include paths in the flags
        cu = j.get("kernel_cu_sha256")
        out[f"jit:{j['key'].split('.')[1]}:{cu[:16]}" if cu else f"jit:{j['key']}"] = j["sha256"]
    return out


def compare(a: dict, b: dict) -> str:
    ea, eb = _entries(a), _entries(b)
    rows = [f"| kernel (cubin) | {a['label']} sha256 | {b['label']} sha256 | same |", "|---|---|---|---|"]
    same = 0
    for k in sorted(set(ea) | set(eb)):
        x, y = ea.get(k), eb.get(k)
        verdict = "identical" if x == y else ("differs" if x and y else f"only in {a['label'] if x else b['label']}")
        same += x == y
        rows.append(f"| `{k}` | {(x or '-')[:16]} | {(y or '-')[:16]} | {verdict} |")
    head = f"{same} of {len(set(ea) | set(eb))} cubins identical ({a['label']} vs {b['label']})\n\n"
    return head + "\n".join(rows) + "\n"


# a translation unit's tag in internal-linkage names (`_INTERNAL_71702da8_12_internode_cu_b3b04a8e`,
# `__nv_static_26__ebea7cf7_5_k2_cu_4536d6f1`, `_GLOBAL__N__ebea7cf7_...`): nvcc hashes the source file's path into it
_INTERNAL = re.compile(r"_[0-9a-f]{8}_[0-9]+_([A-Za-z0-9_]+?_cu)_[0-9a-f]{8}")


def sass_functions(cubin: Path, tool: str) -> dict:
    """{function: sha256 of its SASS} of `cubin` (`cuobjdump -sass`, which needs nvdisasm on PATH). A function's
    internal-linkage tag (`<hash>_<n>_<file>_cu_<hash>`: nvcc hashes the translation unit's path into it) is
    reduced to its file name, in names and in the instruction text, so two builds from different folders are
    joined by function; everything else (every instruction, its encoding and offset) is hashed as printed."""
    r = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{tool} -sass {cubin}: {r.stderr.strip()[-300:]}")
    out, name, body = {}, None, []
    for line in r.stdout.splitlines() + ["\t\tFunction : <end>"]:
        if line.strip().startswith("Function : "):
            if name is not None:
                out[name] = hashlib.sha256("\n".join(body).encode()).hexdigest()
            name, body = _INTERNAL.sub(r"_\1", line.split("Function : ", 1)[1].strip()), []
        elif name is not None:
            body.append(_INTERNAL.sub(r"_\1", line.strip()))
    return out


def compare_sass(a: Path, b: Path, la: str, lb: str, tool: str) -> dict:
    """Per function, the SASS of cubin `a` against cubin `b` (sass_functions): counts and the names that differ."""
    fa, fb = sass_functions(a, tool), sass_functions(b, tool)
    both = sorted(set(fa) & set(fb))
    differ = [f for f in both if fa[f] != fb[f]]
    return {
        "a": {"label": la, "cubin": a.name, "sha256": _sha(a), "functions": len(fa)},
        "b": {"label": lb, "cubin": b.name, "sha256": _sha(b), "functions": len(fb)},
        "cuobjdump": tool,
        "functions_in_both": len(both),
        "identical_sass": len(both) - len(differ),
        "differ": differ,
        f"only_in_{la}": sorted(set(fa) - set(fb)),
        f"only_in_{lb}": sorted(set(fb) - set(fa)),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--label", required=True)
    r.add_argument("--no-so", action="store_true", help="JIT cubins only (no cuobjdump needed)")
    r.add_argument("--keep", type=Path, help="also copy the cubins of each _C*.so into this folder")
    r.add_argument("dirs", nargs="+", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    sa = sub.add_parser("sass", help="per-function SASS of two cubins (cuobjdump -sass; nvdisasm on PATH)")
    sa.add_argument("a", type=Path)
    sa.add_argument("b", type=Path)
    sa.add_argument("--labels", nargs=2, default=["a", "b"])
    args = p.parse_args(argv)
    if args.cmd == "record":
        missing = [str(d) for d in args.dirs if not d.is_dir()]
        if missing:
            print(f"not a folder: {', '.join(missing)}", file=sys.stderr)
            return 2
        print(json.dumps(record(args.dirs, args.label, not args.no_so, args.keep), indent=1, sort_keys=True))
        return 0
    if args.cmd == "sass":
        tool = cuobjdump()
        if tool is None or not all(x.is_file() for x in (args.a, args.b)):
            print("sass: needs two cubin files and cuobjdump ($CUOBJDUMP, PATH, $CUDA_HOME/bin)", file=sys.stderr)
            return 2
        print(json.dumps(compare_sass(args.a, args.b, *args.labels, tool), indent=1, sort_keys=True))
        return 0
    try:
        a, b = (json.loads(x.read_text()) for x in (args.a, args.b))
    except (OSError, ValueError) as e:
        print(f"cannot read a record: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(compare(a, b))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
