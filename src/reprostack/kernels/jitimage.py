"""DeepEP's JIT kernels compiled into an image at build time (issue 26): the deepep image's build step runs this
module, from a copy of reprostack's own modules in the build context (`MODULES`, put there by the image engine with
the recorded manifests its recipe's `jit:` picks), as

    python3 -m reprostack.kernels.jitimage OUT --arch 90 --tree <deepep patched tree> <folder with manifests/>

It loads each manifest of `<folder>/manifests/*.json` with `jit.load_manifest` (untrusted input, checked), works out
DeepEP's JIT context with `jit.Context.of` for the deep_ep package the image's python finds and the image's own
environment (EP_JIT_CACHE_DIR from the image's ENV; PYTHONPATH dropped, as `runtime.prebuilt_env` drops it for the
test: the call the in-image runner makes, `gates.kernelprep.jit_prewarm`), compiles the kernels with `jit.prewarm`
into that cache, then writes OUT (JSON): the cache folder, the context's arch and nvcc signature, the profiles
compiled (each manifest's sha256) and those the engine left out (`<folder>/selection.json`), and per kernel its name,
folder, sha256 of kernel.cu and of kernel.cubin. record-kernels.py copies it into kernels.json (`jit`).

Invariants:
- a recorded manifest of another DeepEP tree or arch is left out by the engine (selection.json, copied into OUT's
  `left_out`: the image then holds no prebuilt kernels of that profile, and says why); the build fails (exit 1, one
  line naming the manifest or kernel; nothing written) when a manifest in the folder is not one, when it was
  recorded for another arch or DeepEP tree than the image's, when the context cannot be known (a flag
  variable set, a path not plain, no nvcc), when a kernel does not compile, or when a kernel's folder is not the one
  the context names for (name, code) or does not hold that exact kernel.cu and a kernel.cubin;
- one kernel at a time (`--jobs 1`, the default), like the image's other compiles (MAX_JOBS=1); each kernel is
  compiled in its own `<cache>/tmp/<unique>/` and renamed into place (jit.prewarm), as DeepEP does;
- OUT holds no time and no build-machine path other than the image's own: the same image gives the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

from . import jit

# reprostack's modules this step needs (relative to the package folder): the engine copies exactly these into the
# context, so the image's key changes with them and with nothing else of reprostack
MODULES = (
    "__init__.py",
    "errors.py",
    "schemas/__init__.py",
    "schemas/deepep-jit.schema.json",
    "kernels/__init__.py",
    "kernels/jit.py",
    "kernels/jitimage.py",
    "kernels/toolchain.py",
)
SCHEMA = "reprostack.deepep-jit-prebuilt/1"


class JitImageError(Exception):
    """One line: what stops the image build."""


def deepep_site() -> Path:
    """The folder holding the deep_ep package this python finds (not imported: no GPU, no torch load)."""
    spec = importlib.util.find_spec("deep_ep")
    if spec is None or not spec.submodule_search_locations:
        raise JitImageError("python finds no deep_ep package")
    return Path(list(spec.submodule_search_locations)[0]).parent


def runner_env(environ: dict | None = None) -> dict:
    """The environment the in-image runner gives the test (runtime.prebuilt_env): this one without PYTHONPATH."""
    env = dict(os.environ if environ is None else environ)
    env.pop("PYTHONPATH", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def compile_into_image(folder: Path, *, arch: str, tree: str, site: Path, env: dict, jobs: int = 1, log=print) -> dict:
    """Compile the manifests of `folder/manifests/` into the context's cache; the record (see the module doc).
    Raises JitImageError (one line) or jit.ManifestError."""
    if not re.fullmatch(r"[0-9a-f]{40}", tree):
        raise JitImageError(f"--tree {tree!r} is not a 40-hex git tree")
    if not env.get("EP_JIT_CACHE_DIR"):
        raise JitImageError("EP_JIT_CACHE_DIR is not set in the image's environment (the Dockerfile's ENV)")
    ctx, why = jit.Context.of(site, env, arch)
    if ctx is None:
        raise JitImageError(f"DeepEP's JIT context cannot be known: {why}")
    selection = {}
    sel = Path(folder) / "selection.json"
    if sel.is_file():
        selection = json.loads(sel.read_text())
    paths = sorted((Path(folder) / "manifests").glob("*.json"))  # none: the record says which were left out, and why
    profiles, wanted = {}, {}  # wanted: folder name -> (name, code, [profiles])
    for p in paths:
        m = jit.load_manifest(p)
        if m.arch != ctx.arch or m.deepep_tree != tree:
            raise JitImageError(
                f"{p}: recorded for deepep tree {m.deepep_tree} sm_{m.arch}, this image is tree {tree} sm_{ctx.arch}"
            )
        profiles[m.profile] = {"manifest_sha256": _sha256(p.read_bytes()), "kernels": len(m.kernels)}
        for name, code in m.kernels:
            entry = wanted.setdefault(ctx.folder(name, code).name, (name, code, []))
            entry[2].append(m.profile)
    kernels = [(n, c) for n, c, _ in wanted.values()]
    for prof, why in sorted(selection.get("left_out", {}).items()):
        log(f"jitimage: manifest {prof} left out: {why}")
    log(
        f"jitimage: {len(kernels)} kernel(s) of {', '.join(sorted(profiles)) or 'no manifest'} into {ctx.cache_dir} (sm_{ctx.arch})"
    )
    res = jit.prewarm(ctx, kernels, env, jobs=jobs)
    if res["failed"]:
        raise JitImageError(f"{len(res['failed'])} kernel(s) did not compile: {res['failed'][0]}")
    log(f"jitimage: compiled {res['compiled']}, present {res['present']} in {res['seconds']} s")
    rows = []
    for fname, (name, code, profs) in sorted(wanted.items()):
        d = ctx.cache_dir / "cache" / fname
        if d.is_symlink() or not d.is_dir():
            raise JitImageError(f"{name}: no folder {d} after compiling (not the one DeepEP will ask for)")
        if jit.kernel_code(d) != code:
            raise JitImageError(f"{name}: {d}/kernel.cu is not the manifest's code")
        try:
            cubin = (d / "kernel.cubin").read_bytes() if not (d / "kernel.cubin").is_symlink() else b""
        except OSError as e:
            raise JitImageError(f"{name}: {d}: {e.strerror or e}") from None
        if not cubin:
            raise JitImageError(f"{name}: {d}/kernel.cubin is missing or empty")
        rows.append(
            {
                "name": name,
                "folder": fname,
                "code_sha256": _sha256(code.encode()),
                "cubin_sha256": _sha256(cubin),
                "profiles": sorted(set(profs)),
            }
        )
    return {
        "schema": SCHEMA,
        "cache_dir": str(ctx.cache_dir),
        "arch": ctx.arch,
        "signature": ctx.signature,
        "deepep_patched_tree": tree,
        "profiles": profiles,
        "left_out": selection.get("left_out", {}),
        "kernels": rows,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m reprostack.kernels.jitimage", description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("folder", type=Path, help="the context folder holding manifests/ (and selection.json)")
    ap.add_argument("--arch", required=True, help="compute capability, e.g. 90 (the image's CUDA_ARCH)")
    ap.add_argument("--tree", required=True, help="the image's DeepEP patched tree")
    ap.add_argument("--jobs", type=int, default=1)
    a = ap.parse_args(argv)
    try:
        rec = compile_into_image(a.folder, arch=a.arch, tree=a.tree, site=deepep_site(), env=runner_env(), jobs=a.jobs)
    except (JitImageError, jit.ManifestError) as e:
        print(f"jitimage: {e}", file=sys.stderr)
        return 1
    tmp = a.out.with_name(a.out.name + ".tmp")
    tmp.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, a.out)
    for r in rec["kernels"]:
        print(f"jitimage: {r['folder']} cubin {r['cubin_sha256']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
