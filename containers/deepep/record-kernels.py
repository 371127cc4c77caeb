#!/usr/bin/env python3
"""Record in the image which kernels were built from which pin: /opt/reprostack/kernels.json.

Usage: record-kernels.py OUT [arch=90] [image=deepep] [jit=PATH] C.FIELD=VALUE ...
  C.pin, C.rev, C.patched_tree and C.src for every component C; a kernel also names C.recipe (the Recipe.digest
  of kernels/C.yaml, rendered by reprostack) and, for nccl, C.include (holding the built nccl.h) and C.lib (the
  built libnccl.so.2); for deepep, C.package=python names the deep_ep package the image's python3 finds.
  An NCCL from a pinned wheel alone (a stack whose `nccl` is a wheel pin; the deepep-gin-gdaki recipe) names, instead
  of rev/patched_tree/src/recipe: C.wheel_pin (the lock's wheel pin), C.wheel (its filename), C.wheel_sha256 (the
  lock's sha256 of it), C.wheel_path (the image's copy, hashed again here: it must have that sha256), C.version (the
  pin's version, which the unpacked nccl.h must say), C.include and C.lib: a component of kind "wheel".
  jit=PATH (the record reprostack.kernels.jitimage wrote when it compiled DeepEP's JIT kernels into the image) adds
  `jit`: its cache folder, arch, nvcc signature, DeepEP tree, profiles and per kernel name, folder, sha256 of kernel.cu
  and kernel.cubin, each file hashed again here (a kernel whose folder or bytes differ: exit 1).
Derived here, from what was built: NCCL versions (nccl.h), the CUDA version (nvcc --version), paths and the
sha256 of each built file. OUT is merged with what it holds (a child image adds its own component).
The format is reprostack's schemas/kernels-manifest.schema.json; reprostack.kernels.prebuilt reads and checks it.
Each component is identified by its own pin (rev and patched tree, or wheel and sha256), never by the whole lock's
sha256: that would change the image's bytes, and so rebuild it, on an edit of any other pin (`lock_sha256=` is refused).
Stdlib only (reprostack itself is not installed in the image). Any problem: exit 1 naming it, nothing written.
"""

import glob
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys


def fail(msg):
    sys.exit(f"record-kernels: {msg}")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def nccl_h_version(include):
    try:
        text = open(os.path.join(include, "nccl.h")).read()
    except OSError as e:
        fail(f"{include}/nccl.h: {e.strerror}")
    parts = [re.search(rf"#define\s+NCCL_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        fail(f"{include}/nccl.h: NCCL_MAJOR/MINOR/PATCH not found")
    return ".".join(p.group(1) for p in parts)


def cuda_version():
    nvcc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        fail(f"{nvcc} --version: {e}")
    m = re.search(r"release (\d+\.\d+)", out)
    if not m:
        fail(f"no release in `{nvcc} --version`")
    return m.group(1)


def wheel_component(name, f):
    """The manifest entry of an NCCL taken from a pinned wheel alone (no tree, no recipe): see the module doc."""
    for req in ("wheel", "wheel_sha256", "wheel_path", "version", "include", "lib"):
        if req not in f:
            fail(f"{name}.{req} is required with {name}.wheel_pin")
    if not re.fullmatch(r"[0-9a-f]{64}", f["wheel_sha256"]):
        fail(f"{name}.wheel_sha256 must be 64 hex (got {f['wheel_sha256']!r})")
    if os.path.basename(f["wheel_path"]) != f["wheel"] or not os.path.isfile(f["wheel_path"]):
        fail(f"{name}.wheel_path {f['wheel_path']} is not the file {f['wheel']}")
    got = sha256(f["wheel_path"])
    if got != f["wheel_sha256"]:
        fail(f"{f['wheel_path']}: sha256 {got}, the lock pins {f['wheel_sha256']}")
    version = nccl_h_version(f["include"])
    if version != f["version"]:
        fail(f"{f['include']}/nccl.h says {version}, the wheel pin {f['wheel_pin']} is {f['version']}")
    if not os.path.isfile(f["lib"]):
        fail(f"{name}.lib {f['lib']} is not a file")
    return {
        "pin": f.get("pin", name),
        "kind": "wheel",
        "wheel_pin": f["wheel_pin"],
        "wheel": f["wheel"],
        "wheel_sha256": f["wheel_sha256"],
        "nccl_version": version,
        "paths": {"include": f["include"], "lib": os.path.dirname(f["lib"]), "wheel": f["wheel_path"]},
        "files": {f["lib"]: sha256(f["lib"])},
    }


def jit_record(path, tree):
    """The `jit` entry: the record at `path`, every kernel's files hashed again (see the module doc)."""
    try:
        with open(path) as f:
            rec = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"jit={path}: {e}")
    keep = ("cache_dir", "arch", "signature", "deepep_patched_tree", "profiles", "left_out", "kernels")
    if rec.get("schema") != "reprostack.deepep-jit-prebuilt/1" or not all(k in rec for k in keep):
        fail(f"jit={path}: not a reprostack.deepep-jit-prebuilt/1 record")
    if tree and rec["deepep_patched_tree"] != tree:
        fail(f"jit={path}: compiled for deepep tree {rec['deepep_patched_tree']}, deepep.patched_tree is {tree}")
    for k in rec["kernels"]:
        if not re.fullmatch(r"kernel\.[a-z0-9_]{1,64}\.[0-9a-f]{32}", k["folder"]) or not k["folder"].startswith(
            f"kernel.{k['name']}."
        ):
            fail(f"jit={path}: kernel folder {k['folder']!r} is not DeepEP's kernel.<name>.<digest> of {k['name']!r}")
        d = os.path.join(rec["cache_dir"], "cache", k["folder"])
        for f, field in (("kernel.cu", "code_sha256"), ("kernel.cubin", "cubin_sha256")):
            fp = os.path.join(d, f)
            if os.path.islink(fp) or not os.path.isfile(fp) or sha256(fp) != k[field]:
                fail(f"{fp}: not the file {path} records ({field} {k[field]})")
    return {k: rec[k] for k in keep}


def main(argv):
    if not argv:
        fail("usage: record-kernels.py OUT [arch=90] [image=deepep] [jit=PATH] C.FIELD=VALUE ...")
    out, top, comps = argv[0], {}, {}
    for a in argv[1:]:
        k, eq, v = a.partition("=")
        if not eq or not v:
            fail(f"{a!r}: expected KEY=VALUE with a value")
        c, dot, f = k.partition(".")
        (comps.setdefault(c, {}).__setitem__(f, v) if dot else top.__setitem__(k, v))
    if "lock_sha256" in top:
        fail("lock_sha256=: a manifest names each component's own pin, not the whole lock (see the module doc)")
    data = {"manifest_version": 1, "image": top.get("image", "deepep"), "components": {}}
    if os.path.exists(out):  # a child image adds its component; the image that built the kernels stays named
        with open(out) as f:
            data = json.load(f)
    if "jit" in top:
        data["jit"] = jit_record(top["jit"], comps.get("deepep", {}).get("patched_tree"))
    nccl_version = data["components"].get("nccl", {}).get("nccl_version")
    for name, f in comps.items():
        if "wheel_pin" in f:
            data["components"][name] = c = wheel_component(name, f)
            nccl_version = c["nccl_version"]
            continue
        for req in ("rev", "patched_tree", "src"):
            if req not in f:
                fail(f"{name}.{req} is required")
        if not all(re.fullmatch(r"[0-9a-f]{40}", f[k]) for k in ("rev", "patched_tree")):
            fail(f"{name}: rev/patched_tree must be 40 hex (got {f['rev']!r}, {f['patched_tree']!r})")
        if not os.path.isdir(f["src"]):
            fail(f"{name}.src {f['src']} is not a folder")
        c = {
            "pin": f.get("pin", name),
            "kind": "kernel" if "recipe" in f else "source",
            "rev": f["rev"],
            "patched_tree": f["patched_tree"],
            "paths": {"src": f["src"]},
        }
        if "recipe" in f:
            arch = top.get("arch") or fail("arch=NN is required for a kernel")
            c.update(recipe=f["recipe"], cuda_version=cuda_version(), arch=arch.split(","), files={})
            if "include" in f:  # nccl
                nccl_version = nccl_h_version(f["include"])
                lib = f.get("lib") or fail(f"{name}.lib is required with {name}.include")
                c["paths"].update(include=f["include"], lib=os.path.dirname(lib))
                c["files"][lib] = sha256(lib)
            if f.get("package") == "python":  # deepep, built against the nccl recorded before it
                spec = importlib.util.find_spec("deep_ep")
                if spec is None or not spec.submodule_search_locations:
                    fail("python3 finds no deep_ep package")
                pkg = list(spec.submodule_search_locations)[0]
                so = sorted(glob.glob(os.path.join(pkg, "_C*.so")))
                if not so:
                    fail(f"no _C*.so in {pkg}")
                c["paths"].update(package=pkg, extension=so[0])
                c["files"][so[0]] = sha256(so[0])
            if not nccl_version:
                fail(f"{name}: record nccl (with nccl.include) before or with it")
            c["nccl_version"] = nccl_version
        data["components"][name] = c
    with open(out + ".tmp", "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
    os.replace(out + ".tmp", out)
    if "jit" in data:
        print(
            f"kernels.json: {len(data['jit']['kernels'])} prebuilt DeepEP JIT kernel(s) of "
            f"{', '.join(sorted(data['jit']['profiles']))} (sm_{data['jit']['arch']}) -> {data['jit']['cache_dir']}"
        )
    for name, c in sorted(data["components"].items()):
        if c["kind"] == "wheel":
            print(
                f"kernels.json: {name} wheel {c['wheel']} (pin {c['wheel_pin']}, sha256 {c['wheel_sha256']}), "
                f"NCCL {c['nccl_version']} -> {c['paths']['lib']}"
            )
            continue
        print(
            f"kernels.json: {name} {c['rev']} (patched tree {c['patched_tree']}) {c['kind']}"
            + (
                f", NCCL {c['nccl_version']}, CUDA {c['cuda_version']}, arch {','.join(c['arch'])}"
                if c["kind"] == "kernel"
                else ""
            )
            + f" -> {c['paths']['src']}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
