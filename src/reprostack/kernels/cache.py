"""The signed binary kernel cache (the Nix substituter / Spack build cache idea): a kernel build is a function of its
build key (kernels.build: source tree, recipe, toolchain, arch, flags, the keys of what it links), so a node that has
an entry for that key, signed by a key it trusts, takes the entry instead of running nvcc; a miss builds from source.

An entry is a build folder's `site/`, `jit/`, `inductor/`, `triton/`, `build.json` and `build.log` (the overlay is
made on the node: it links that node's torch; inductor/ and triton/ are torch.compile's caches, filled by the tests
that ran on the build before it was pushed: executable code, trusted as its .so files are, by the signature) and its manifest (schemas/kernel-cache-entry.schema.json): the build key and fields, the arch, the
toolchain, every file's path, size, mode and sha256, and the cubins each shared object holds (`cuobjdump --list-elf`
where the toolkit has it). The manifest is signed as a run attestation is (kernels.cachesign: a DSSE envelope) and
kept in a store (kernels.cachestore: an OCI registry, a folder, a web folder).

A pull is refused, with one line saying why, and the kernels built from source, when: the envelope is unsigned, signed
by a key not in the keyring, or its signature does not verify; the manifest is malformed or for another build key,
component or arch; a file's bytes are not the manifest's (a tampered .so); a path leaves the entry. Nothing of a
refused entry stays on disk, and nothing of an entry is loaded before all of it was checked.

Invariants: `pull_into` writes only under the folder it is given (the caller's `.partial`, renamed into place only
after it returned); the manifest a pull trusts is the signed payload, never a file beside it; every limit is a
named constant.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path, PurePosixPath

from .. import schemas
from ..digest import sha256_file
from ..errors import ReprostackError
from . import cachesign
from .cachestore import KEY, StoreError, StoreRefused, open_store

ENTRY_VERSION = 1
TOP = ("site", "jit", "inductor", "triton", "build.json", "build.log")  # what an entry carries of a build folder
CODE_CACHES = ("inductor", "triton")  # torch.compile's caches the test fills (kernels.runtime.runtime_env)
MAX_FILES = 20000
MAX_ENTRY_BYTES = 16 << 30


class Refused(ReprostackError):
    """An entry that must not be used (the message is the one line an operator sees)."""


def _files(build: Path) -> list[dict]:
    out = []
    for top in TOP:
        p = build / top
        if not p.exists() and not p.is_symlink():
            continue
        walk = [p] if not p.is_dir() or p.is_symlink() else sorted(x for x in p.rglob("*"))
        for f in walk:
            if f.is_symlink() and top in CODE_CACHES:
                continue  # a cache: what it does not carry is compiled again on the node, never followed
            if f.is_symlink():
                raise ReprostackError(f"{f}: a symlink in a build folder: not pushed (an entry holds files only)")
            if f.is_file():
                st = f.stat()
                out.append(
                    {
                        "path": f.relative_to(build).as_posix(),
                        "sha256": sha256_file(f),
                        "bytes": st.st_size,
                        "mode": "755" if st.st_mode & stat.S_IXUSR else "644",
                    }
                )
    return out


def cuobjdump() -> str | None:
    """The CUDA toolkit's cuobjdump: $CUOBJDUMP, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin (None: not here)."""
    home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    for c in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"), os.path.join(home, "bin", "cuobjdump")):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def cubin_list(build: Path, files: list[dict]) -> dict:
    """`cubins` of a manifest: per shared object, the ELF cubins `cuobjdump --list-elf` names (e.g.
    `_C.1.sm_90a.cubin`); without cuobjdump, `tool: null` and why."""
    tool = cuobjdump()
    if tool is None:
        return {"tool": None, "why": "cuobjdump not found ($CUOBJDUMP, PATH, $CUDA_HOME/bin)", "objects": {}}
    objects = {}
    for f in files:
        if ".so" not in PurePosixPath(f["path"]).name:
            continue
        r = subprocess.run([tool, "--list-elf", str(build / f["path"])], capture_output=True, text=True, timeout=120)
        objects[f["path"]] = [ln.split(":", 1)[-1].strip() for ln in r.stdout.splitlines() if "ELF file" in ln]
    return {"tool": tool, "objects": objects}


def entry_manifest(build: Path) -> dict:
    """The manifest of the complete build folder `build` (its build.json must hold the key its fields hash to and
    its folder name must be `<component>-<key16>`). Raises ReprostackError."""
    from .build import build_key

    try:
        info = json.loads((build / "build.json").read_text())
        component, key, fields = info["component"], info["key"], info["fields"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ReprostackError(f"{build}: not a complete kernel build (build.json: {type(e).__name__}: {e})") from None
    if build_key(fields) != key or build.name != f"{component}-{key[:16]}":
        raise ReprostackError(f"{build}: build.json's key is not its fields' hash or not this folder's name")
    if fields.get("from") == "wheel":
        raise ReprostackError(f"{build}: an unpacked wheel, not a build (the wheel is pinned by sha256 in the lock)")
    tc = fields.get("toolchain") or {"nvcc": fields.get("nvcc"), "arch": fields.get("arch")}
    files = _files(build)
    return {
        "entry_version": ENTRY_VERSION,
        "component": component,
        "key": key,
        "arch": str(tc.get("arch")),
        "toolchain": tc,
        "fields": fields,
        "files": files,
        "cubins": cubin_list(build, files),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def push(build: Path, url: str, key_file: Path | None) -> tuple[str, dict]:
    """Sign the manifest of `build` with `key_file` (None: the operator's configured key) and put the entry into the
    store `url`. Returns (where, the manifest). Raises ReprostackError (StoreError, a signing error)."""
    m = entry_manifest(Path(build))
    envelope = cachesign.sign(m, Path(key_file) if key_file else None)
    files = [(Path(build) / f["path"], f["path"], f["sha256"], f["bytes"]) for f in m["files"]]
    return open_store(url).put(m["key"], envelope, files), m


def _safe_path(rel) -> PurePosixPath:
    p = PurePosixPath(rel) if isinstance(rel, str) and rel.isprintable() and "\\" not in rel else None
    if p is None or p.is_absolute() or ".." in p.parts or not p.parts or p.parts[0] not in TOP:
        raise Refused(f"file path {rel!r} leaves the entry or is not one of {', '.join(TOP)}")
    if p.parts[0] in ("build.json", "build.log") and len(p.parts) != 1:
        raise Refused(f"file path {rel!r} is not an entry file")
    return p


def check_manifest(m, *, key: str, component: str | None, arch: str | None) -> dict:
    """The signed manifest `m`, held to its schema, as the manifest of build `key` of `component` (None: any) on
    `arch` (None: any). Raises Refused."""
    import jsonschema

    from .build import build_key

    try:
        jsonschema.Draft202012Validator(schemas.load("kernel-cache-entry")).validate(m)
    except jsonschema.ValidationError as e:
        where = "/".join(str(x) for x in e.absolute_path) or "(top)"
        raise Refused(f"manifest {where}: {' '.join(e.message.split())[:200]}") from None
    if m["key"] != key or build_key(m["fields"]) != key:
        raise Refused(f"manifest is for build key {m['key'][:16]}, not {key[:16]} (another build)")
    if component is not None and m["component"] != component:
        raise Refused(f"manifest is for component {m['component']}, not {component}")
    if arch is not None and m["arch"] != str(arch):
        raise Refused(f"manifest is for sm_{m['arch']}, this node is sm_{arch}")
    paths = [str(_safe_path(f["path"])) for f in m["files"]]
    if len(set(paths)) != len(paths):
        raise Refused("manifest names one file twice")
    if len(paths) > MAX_FILES or sum(f["bytes"] for f in m["files"]) > MAX_ENTRY_BYTES:
        raise Refused(f"manifest over {MAX_FILES} files or {MAX_ENTRY_BYTES} bytes")
    return m


def pull_into(
    url: str, key: str, component: str | None, dest: Path, *, keyring: Path, arch: str | None
) -> tuple[dict, str] | None:
    """Entry `key` of store `url` checked and written into the empty folder `dest`: (manifest, signer key id), or
    None when the store has no entry for `key`. Raises Refused (nothing left in `dest`) or StoreError."""
    if not KEY.match(key):
        raise Refused(f"{key!r} is not a build key")
    store = open_store(url)
    envelope = store.envelope(key)
    if envelope is None:
        return None
    m, signer = _pull_checked(store, envelope, key, component, Path(dest), keyring=keyring, arch=arch)
    return m, signer


def _pull_checked(store, envelope: bytes, key: str, component, dest: Path, *, keyring: Path, arch) -> tuple[dict, str]:
    try:
        m, signer = cachesign.verify(envelope, Path(keyring))
        m = check_manifest(m, key=key, component=component, arch=arch)
        for f in m["files"]:
            _write_file(store, key, f, Path(dest))
        _check_build_json(Path(dest), m)
    except (cachesign.Unverified, Refused) as e:
        _empty(Path(dest))
        raise Refused(str(e)) from None
    except BaseException:
        _empty(Path(dest))
        raise
    return m, signer


def mirror(src: str, key: str, dest: str, *, keyring: Path, arch: str | None) -> tuple[dict, str, str] | None:
    """Entry `key` of store `src`, checked as a run would check it, copied as it is (its envelope, still signed by
    its producer) into store `dest` (a folder for nodes without a registry, or another registry): (manifest, signer,
    where), or None when `src` has no such entry. Raises Refused / StoreError; nothing is written for a refusal."""
    import tempfile

    if not KEY.match(key):
        raise Refused(f"{key!r} is not a build key")
    store = open_store(src)
    envelope = store.envelope(key)
    if envelope is None:
        return None
    with tempfile.TemporaryDirectory(prefix="kcache-") as tmp:
        m, signer = _pull_checked(store, envelope, key, None, Path(tmp), keyring=keyring, arch=arch)
        files = [(Path(tmp) / f["path"], f["path"], f["sha256"], f["bytes"]) for f in m["files"]]
        return m, signer, open_store(dest).put(key, envelope, files)


def _write_file(store, key: str, f: dict, dest: Path) -> None:
    """File `f` of the manifest from the store into `dest` (its bytes hashed on the way). Raises Refused."""
    target = dest / _safe_path(f["path"])
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "xb") as out:
            store.blob(key, f["sha256"], f["bytes"], out)
        os.chmod(target, 0o755 if f["mode"] == "755" else 0o644)
    except StoreError as e:
        raise Refused(f"{f['path']}: {e}") from None
    except OSError as e:  # a path that is also a folder of another path, ...: not an entry a build wrote
        raise Refused(f"{f['path']}: cannot be written ({e.strerror or e})") from None


def _check_build_json(dest: Path, m: dict) -> None:
    try:
        info = json.loads((dest / "build.json").read_text())
    except (OSError, ValueError) as e:
        raise Refused(f"build.json: {type(e).__name__}") from None
    if not isinstance(info, dict) or info.get("key") != m["key"] or info.get("fields") != m["fields"]:
        raise Refused("build.json is not the manifest's build (key or fields differ)")


def _empty(d: Path) -> None:
    for p in list(d.iterdir()) if d.is_dir() else []:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def substituter(url: str, keyring: Path, record: dict, *, arch: str | None):
    """A `substitute(component, key, tmp) -> info | None` for kernels.build.reuse_or_build: the entry pulled into
    `tmp` (its build.json returned) on a hit; None on a miss, a refusal or an unreachable store, each said in one
    line and recorded in `record[component]` (the report's provenance.kernels_from.cache)."""
    from .. import ui

    def substitute(component: str, key: str, tmp: Path) -> dict | None:
        t = time.monotonic()
        rec = record.setdefault(component, {"url": url, "key": key})
        try:
            got = pull_into(url, key, component, tmp, keyring=keyring, arch=arch)
        except (Refused, StoreRefused) as e:
            rec.update(result="refused", why=str(e))
            ui.warn(f"kernel cache {url}: {component} {key[:16]} refused: {e}; building from source")
            return None
        except (StoreError, OSError) as e:
            rec.update(result="unreachable", why=str(e))
            ui.warn(f"kernel cache {url}: {component} {key[:16]}: {e}; building from source")
            return None
        rec["seconds"] = round(time.monotonic() - t, 2)
        if got is None:
            rec["result"] = "miss"
            ui.info(f"kernel cache {url}: no entry for {component} {key[:16]}: building from source")
            return None
        m, signer = got
        rec.update(result="hit", signer=signer, files=len(m["files"]))
        rec["manifest_sha256"] = hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()
        ui.info(f"kernel cache {url}: {component} {key[:16]} pulled and verified (signed by {signer})")
        return json.loads((tmp / "build.json").read_text())

    return substitute


def builds(cache_root: Path) -> list[Path]:
    """The complete kernel builds under `<cache_root>/builds` (folders with a build.json), wheels excluded."""
    out = []
    for d in sorted((Path(cache_root) / "builds").glob("*-*")):
        try:
            info = json.loads((d / "build.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and (info.get("fields") or {}).get("from") != "wheel":
            out.append(d)
    return out
