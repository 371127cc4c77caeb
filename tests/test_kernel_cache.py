"""The signed binary kernel cache (kernels.cache, issue 41) on the CPU with real artifacts: DeepEP built by the real
build_deepep (a fake setup.py that links a real shared object with g++, as tests/test_kernels.py does), signed with
a real ed25519 key (reprostack.evidence), pushed to the real local registry (tests/registry.py: Debian's
docker-registry on loopback) and to a folder, then taken by a second cache: a hit (no compiler runs), a miss (built),
and each refusal (unsigned, foreign-signed, a wrong key's signature, a tampered .so, another arch, another build key,
a path out of the entry, another component) said in one line, then built from source; nothing of a refused entry
is ever loaded."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from registry import registry  # noqa: F401  (session fixture: the real local registry)
from test_kernels import (  # noqa: F401  (regex_obj: a module fixture)
    FAKE_PIP,
    fake_nccl_built,
    fake_nvshmem,
    fake_site,
    needs_gxx,
    needs_readelf,
    regex_obj,
    toolchain,
    write_recipe,
)

from reprostack import cli, evidence
from reprostack.evidence.attest import keys as keysmod
from reprostack.kernels import build, cachesign, cachestore, oci
from reprostack.kernels import cache as kcache
from reprostack.kernels.recipe import load_recipe

REPO_ROOT = Path(__file__).resolve().parents[1]
pytestmark = [needs_gxx, needs_readelf]


def make_key(folder: Path, who: str, ring: Path | None = None) -> Path:
    """A fresh ed25519 key at folder/key.pem; its public half into `ring` when given."""
    folder.mkdir(parents=True, exist_ok=True)
    signer = evidence.new_key(folder / "key.pem")
    if ring is not None:
        ring.mkdir(parents=True, exist_ok=True)
        entry = evidence.public_entry(signer, who)
        (ring / keysmod.entry_name(entry)).write_text(json.dumps(entry))
    return folder / "key.pem"


class Node:
    """One node's DeepEP build: its own cache, the shared toolchain, NCCL, NVSHMEM and sources (so both nodes
    compute the same build key, as two nodes of one image do)."""

    def __init__(self, world: dict, name: str):
        self.w, self.cache = world, world["tmp"] / name / "cache"

    def build(self, *, url: str | None = None, arch: str = "90", tc=None):
        record: dict = {}
        sub = kcache.substituter(url, self.w["ring"], record, arch=arch) if url else None
        b = build.build_deepep(
            self.w["src"],
            "e" * 40,
            self.w["recipe"],
            tc or self.w["tc"],
            self.w["nccl"],
            self.cache,
            jobs=2,
            substitute=sub,
        )
        return b, record.get("deepep", {})


@pytest.fixture
def world(tmp_path, regex_obj, monkeypatch):
    """A project recipe, a DeepEP 'source' (re.o), a fake setup.py interpreter, torch site, NVSHMEM and NCCL; a
    trusted key (in the keyring) and a foreign one (not in it)."""
    monkeypatch.delenv("EP_NVSHMEM_ROOT_DIR", raising=False)
    root = tmp_path / "proj"
    write_recipe(root, "deepep", (REPO_ROOT / "kernels" / "deepep.yaml").read_text())
    src = tmp_path / "deepep-src"
    src.mkdir()
    shutil.copy(regex_obj, src / "re.o")
    py = tmp_path / "bin" / "python"
    py.parent.mkdir()
    py.write_text(FAKE_PIP)
    py.chmod(0o755)
    tc = toolchain(
        tmp_path, python=str(py), torch_site=str(fake_site(tmp_path)), nvshmem_root=str(fake_nvshmem(tmp_path / "nv"))
    )
    ring = tmp_path / "keys"
    w = {
        "tmp": tmp_path,
        "src": src,
        "py": py,
        "tc": tc,
        "recipe": load_recipe(root, "deepep"),
        "nccl": fake_nccl_built(tmp_path, "2.30.4"),
        "ring": ring,
        "key": make_key(tmp_path / "trusted", "build node", ring),
        "foreign": make_key(tmp_path / "foreign", "someone else"),
    }
    built, _ = Node(w, "builder").build()
    (built.out / "jit" / "cache" / "kernel.dispatch.abc").mkdir(parents=True)
    (built.out / "jit" / "cache" / "kernel.dispatch.abc" / "kernel.cubin").write_bytes(b"\x7fELF cubin")
    # what a test run leaves in the build: torch.compile's caches (kernels.runtime.runtime_env), and a link in one
    (built.out / "inductor" / "fxgraph" / "ab").mkdir(parents=True)
    (built.out / "inductor" / "fxgraph" / "ab" / "entry").write_bytes(b"compiled graph")
    (built.out / "inductor" / "latest").symlink_to(built.out / "inductor" / "fxgraph")
    (built.out / "triton" / "XYZ").mkdir(parents=True)
    (built.out / "triton" / "XYZ" / "k.cubin").write_bytes(b"\x7fELF triton cubin")
    w["built"] = built
    return w


def so_of(b) -> Path:
    return b.out / b.info["extension"]


def oci_url(registry, name: str) -> str:  # noqa: F811
    return f"oci://{registry.host}/reprostack/{name}"


def no_compiler(w) -> None:
    """From here on a build would fail loudly: the 'compiler' is gone."""
    w["py"].unlink()


# --------------------------------------------------------------------------- hit and miss


def test_push_to_the_local_registry_then_a_cold_node_pulls_instead_of_building(world, registry, capsys):  # noqa: F811
    url = oci_url(registry, "hit")
    where, m = kcache.push(world["built"].out, url, world["key"])
    assert where.startswith(f"{url}:{world['built'].key}@sha256:")
    paths = {f["path"] for f in m["files"]}
    assert {"build.json", "build.log", world["built"].info["extension"]} <= paths
    assert "jit/cache/kernel.dispatch.abc/kernel.cubin" in paths and not any(p.startswith("overlay") for p in paths)
    # torch.compile's caches travel too (a cold hit compiles nothing again); a link in a cache is left behind
    assert {"inductor/fxgraph/ab/entry", "triton/XYZ/k.cubin"} <= paths and not any("latest" in p for p in paths)
    assert m["arch"] == "90" and m["toolchain"]["nvcc_version"] == "13.0"
    assert m["cubins"]["tool"] is None or m["cubins"]["objects"]  # cuobjdump absent here: said, not guessed
    # the registry holds an ORAS-style artifact: artifactType, the envelope as config, one layer per file
    body = json.loads(oci.Repo(url).get_manifest(world["built"].key))
    assert body["artifactType"] == cachestore.ARTIFACT_TYPE and body["config"]["mediaType"] == cachestore.ENVELOPE_TYPE
    assert {layer["annotations"][cachestore.TITLE] for layer in body["layers"]} == paths

    no_compiler(world)
    b, rec = Node(world, "fresh").build(url=url)
    assert (b.origin, b.reused, rec["result"]) == ("cache", False, "hit")
    assert rec["signer"].endswith("(build node)")
    assert so_of(b).read_bytes() == so_of(world["built"]).read_bytes()
    assert (b.out / "triton" / "XYZ" / "k.cubin").read_bytes() == b"\x7fELF triton cubin"
    assert (b.out / "inductor" / "fxgraph" / "ab" / "entry").read_bytes() == b"compiled graph"
    overlay_nccl = b.out / "overlay" / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    assert overlay_nccl.resolve() == (world["nccl"].out / "build" / "lib" / "libnccl.so.2").resolve()
    assert "pulled and verified (signed by" in capsys.readouterr().err
    again, _ = Node(world, "fresh").build(url=url)  # the next run: reused, still says it came from the cache
    assert (again.origin, again.reused) == ("cache", True)


def test_a_miss_builds_from_source_and_says_so(world, registry):  # noqa: F811
    b, rec = Node(world, "fresh").build(url=oci_url(registry, "empty"))
    assert (b.origin, b.reused, rec["result"]) == ("build", False, "miss")


def test_a_folder_cache_and_pull_into_a_folder_for_a_node_without_a_registry(world, registry, tmp_path):  # noqa: F811
    url = oci_url(registry, "fleet")
    kcache.push(world["built"].out, url, world["key"])
    folder = tmp_path / "shared-kcache"
    got = kcache.mirror(url, world["built"].key, str(folder), keyring=world["ring"], arch="90")
    assert got is not None and (folder / world["built"].key / "envelope.json").is_file()
    no_compiler(world)
    b, rec = Node(world, "offline").build(url=f"file://{folder}")
    assert (b.origin, rec["result"]) == ("cache", "hit")


# --------------------------------------------------------------------------- refusals: one line, then built


def envelope_of(url: str, key: str) -> dict:
    return json.loads(cachestore.open_store(url).envelope(key))


def put_raw(url: str, key: str, envelope: dict | bytes, src_build: Path, manifest: dict) -> None:
    """Put `envelope` (as given, signed or not) with the files of `manifest` from `src_build` under `key`."""
    files = [(src_build / f["path"], f["path"], f["sha256"], f["bytes"]) for f in manifest["files"]]
    raw = envelope if isinstance(envelope, bytes) else json.dumps(envelope).encode()
    cachestore.open_store(url).put(key, raw, files)


def resigned(manifest: dict, key: Path) -> dict:
    return json.loads(cachesign.sign(manifest, key))


def _unsigned(w, url):
    m = kcache.entry_manifest(w["built"].out)
    env = resigned(m, w["key"])
    env["signatures"] = []
    put_raw(url, w["built"].key, env, w["built"].out, m)
    return "no signature"


def _not_json(w, url):
    m = kcache.entry_manifest(w["built"].out)
    put_raw(url, w["built"].key, json.dumps(m).encode() + b"\xff", w["built"].out, m)
    return "not a DSSE envelope"


def _foreign(w, url):
    kcache.push(w["built"].out, url, w["foreign"])
    return "which is not in the keyring"


def _wrong_key(w, url):
    """Signed by another key, but claiming the trusted key's id."""
    trusted = kcache.entry_manifest(w["built"].out)
    env = resigned(trusted, w["foreign"])
    env["signatures"][0]["keyid"] = envelope_of_trusted_keyid(w)
    put_raw(url, w["built"].key, env, w["built"].out, trusted)
    return "the signature does not verify"


def envelope_of_trusted_keyid(w) -> str:
    return json.loads(next(w["ring"].iterdir()).read_text())["keyid"]


def _edited_payload(w, url):
    """The trusted signature kept, the manifest in it edited (a tampered .so's sha256 put in)."""
    m = kcache.entry_manifest(w["built"].out)
    env = resigned(m, w["key"])
    st = json.loads(base64.b64decode(env["payload"]))
    st["predicate"]["files"][0]["sha256"] = "0" * 64
    env["payload"] = base64.b64encode(json.dumps(st).encode()).decode()
    put_raw(url, w["built"].key, env, w["built"].out, m)
    return "the signature does not verify"


def _other_key(w, url):
    """A genuine signed entry of another build, put under this build's key (tag)."""
    other = Node(w, "other").build(tc=replace(w["tc"], torch="2.12.0"))[0]
    m = kcache.entry_manifest(other.out)
    put_raw(url, w["built"].key, resigned(m, w["key"]), other.out, m)
    return f"is for build key {other.key[:16]}, not {w['built'].key[:16]}"


def _escape(w, url):
    """Signed by the trusted key, but a file path leaves the entry."""
    m = kcache.entry_manifest(w["built"].out)
    m["files"][-1]["path"] = "site/../../../escaped.so"
    put_raw(url, w["built"].key, resigned(m, w["key"]), w["built"].out, kcache.entry_manifest(w["built"].out))
    return "leaves the entry"


def _component(w, url):
    m = kcache.entry_manifest(w["built"].out)
    m["component"] = "nccl"
    put_raw(url, w["built"].key, resigned(m, w["key"]), w["built"].out, m)
    return "is for component nccl, not deepep"


def _other_artifact(w, url):
    """An OCI artifact of another type (a plain image manifest, config `{}`) under this build key's tag."""
    import hashlib

    repo = oci.Repo(url)
    cfg = b"{}"
    digest = "sha256:" + hashlib.sha256(cfg).hexdigest()
    repo.push_blob(cfg, digest, len(cfg))
    body = {
        "schemaVersion": 2,
        "mediaType": oci.MANIFEST_TYPE,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest, "size": len(cfg)},
        "layers": [],
    }
    repo.put_manifest(w["built"].key, json.dumps(body).encode())
    return "not a kernel cache artifact"


REFUSALS = {
    "another-artifact": _other_artifact,
    "unsigned": _unsigned,
    "not-json": _not_json,
    "foreign-signed": _foreign,
    "wrong-key": _wrong_key,
    "edited-manifest": _edited_payload,
    "another-build-key": _other_key,
    "path-escape": _escape,
    "another-component": _component,
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_hostile_registry_entry_is_refused_in_one_line_then_built(world, registry, case, capsys):  # noqa: F811
    url = oci_url(registry, f"refuse-{case}")
    why = REFUSALS[case](world, url)
    fresh = Node(world, "fresh")
    b, rec = fresh.build(url=url)
    assert (b.origin, rec["result"]) == ("build", "refused") and why in rec["why"], rec
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if "refused" in ln)
    assert why in line and line.endswith("building from source") and "Traceback" not in err
    assert not (world["tmp"] / "escaped.so").exists() and not list(fresh.cache.rglob("*.partial"))


def test_a_tampered_so_in_a_folder_cache_is_refused_and_never_loaded(world, tmp_path, capsys):
    folder = tmp_path / "kcache"
    kcache.push(world["built"].out, str(folder), world["key"])
    so = so_of(world["built"])
    target = next(
        folder / world["built"].key / "blobs" / f["sha256"]
        for f in kcache.entry_manifest(world["built"].out)["files"]
        if f["path"] == world["built"].info["extension"]
    )
    target.write_bytes(so.read_bytes()[:-4] + b"EVIL")  # same size, other bytes
    b, rec = Node(world, "fresh").build(url=str(folder))
    assert (b.origin, rec["result"]) == ("build", "refused") and "hashing to" in rec["why"]
    assert b"EVIL" not in so_of(b).read_bytes()  # the loaded .so is the one built here
    assert "refused" in capsys.readouterr().err


def test_an_entry_for_another_arch_is_refused(world, tmp_path):
    folder = tmp_path / "kcache"
    kcache.push(world["built"].out, str(folder), world["key"])
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(kcache.Refused, match="is for sm_90, this node is sm_100"):
        kcache.pull_into(str(folder), world["built"].key, "deepep", dest, keyring=world["ring"], arch="100")
    assert list(dest.iterdir()) == []


def test_an_unreachable_cache_builds_from_source(world):
    b, rec = Node(world, "fresh").build(url="oci://127.0.0.1:9/reprostack/kernels")
    assert (b.origin, rec["result"]) == ("build", "unreachable")


# --------------------------------------------------------------------------- the command


def test_kernels_push_and_pull_commands(world, registry, tmp_path, capsys):  # noqa: F811
    url = oci_url(registry, "cli")
    cache = world["built"].out.parent.parent
    assert cli.main(["kernels", "push", "--to", url, "--key", str(world["key"]), "--cache", str(cache)]) == 0
    out = capsys.readouterr().out
    assert f"deepep {world['built'].key}: pushed to {url}:" in out
    folder = tmp_path / "pulled"
    argv = ["kernels", "pull", "--from", url, "--to", str(folder), "--kernel-keyring", str(world["ring"])]
    assert cli.main([*argv, "--all", "--arch", "90"]) == 0
    assert "verified (signed by" in capsys.readouterr().out
    # a foreign keyring: refused, one line, exit 2, nothing written
    other = tmp_path / "other-ring"
    make_key(tmp_path / "k3", "nobody", other)
    argv2 = ["kernels", "pull", "--from", url, "--to", str(tmp_path / "p2"), "--kernel-keyring", str(other)]
    assert cli.main([*argv2, world["built"].key]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "refused" in out[0] and "not in the keyring" in out[0]
    assert not (tmp_path / "p2").exists()


# --------------------------------------------------------------------------- the gate's kernel stage


@pytest.mark.parametrize("hit", [True, False])
def test_the_gate_stage_says_where_its_kernels_came_from(world, tmp_path, monkeypatch, hit):
    """kernelprep.build_kernels with --kernel-cache: provenance.kernels_from is `cache` on a hit and `build` on a
    miss, with what the cache answered, and the report schema takes it."""
    import jsonschema

    from reprostack import schemas
    from reprostack.gates import kernelprep
    from reprostack.gates.options import GateOptions

    folder = tmp_path / "kcache"
    if hit:
        kcache.push(world["built"].out, str(folder), world["key"])
    monkeypatch.setattr(kernelprep.toolchain, "detect", lambda *a, **k: world["tc"])
    monkeypatch.setattr(kernelprep, "prepare_nccl", lambda *a, **k: world["nccl"])
    ctx = type("Ctx", (), {"cache_root": tmp_path / "node" / "cache", "root": tmp_path / "proj"})()
    opts = GateOptions(kernel_cache=f"file://{folder}", kernel_keyring=str(world["ring"]))
    prov: dict = {}
    _, _, deepep = kernelprep.build_kernels(
        opts, ctx, {"deepep": type("T", (), {"path": world["src"], "tree": "e" * 40})()}, prov, {}
    )
    kf = prov["kernels_from"]
    assert kf["mode"] == ("cache" if hit else "build") and kf["cache"]["url"] == f"file://{folder}"
    assert kf["cache"]["deepep"]["result"] == ("hit" if hit else "miss")
    assert prov["kernels"]["deepep"]["origin"] == kf["mode"]
    schema = schemas.load("report")["properties"]["provenance"]["properties"]["kernels_from"]
    jsonschema.validate(kf, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"mode": "prebuilt"}, schema)


def test_the_manifest_lists_cubins_by_cuobjdump_where_the_toolkit_has_it(world, tmp_path, monkeypatch):
    """With cuobjdump ($CUOBJDUMP here: a stand-in printing `--list-elf`'s lines) each shared object's ELF cubins are
    listed; without it the manifest says so (tool null, why), never a guessed list."""
    tool = tmp_path / "cuobjdump"
    tool.write_text(
        '#!/bin/sh\n[ "$1" = --list-elf ] && printf "ELF file    1: _C.1.sm_90a.cubin\\nELF file    2: _C.2.sm_90a.cubin\\n"\n'
    )
    tool.chmod(0o755)
    monkeypatch.setenv("CUOBJDUMP", str(tool))
    m = kcache.entry_manifest(world["built"].out)
    assert m["cubins"]["tool"] == str(tool)
    assert m["cubins"]["objects"] == {world["built"].info["extension"]: ["_C.1.sm_90a.cubin", "_C.2.sm_90a.cubin"]}
    monkeypatch.setenv("CUOBJDUMP", str(tmp_path / "absent"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    m = kcache.entry_manifest(world["built"].out)
    assert m["cubins"] == {"tool": None, "why": "cuobjdump not found ($CUOBJDUMP, PATH, $CUDA_HOME/bin)", "objects": {}}


def test_a_blob_is_read_at_most_one_byte_past_its_size():
    """digest.sha256_stream(limit=N), the one hashed copy of the folder, web and OCI stores: a longer blob stops at
    N + 1 bytes (its count says it is longer), never read to its end."""
    import io

    from reprostack.digest import sha256_stream

    src, dst = io.BytesIO(b"x" * 10_000), io.BytesIO()
    assert sha256_stream(src, dst, limit=100)[1] == 101 and src.tell() == 101 and len(dst.getvalue()) == 101
    got, n = sha256_stream(io.BytesIO(b"abc"), limit=3)
    assert (got, n) == (hashlib.sha256(b"abc").hexdigest(), 3)
