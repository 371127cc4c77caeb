"""The kernel stage the gates that build kernels share (micro, megatron, fabric): the sources they run (fetched,
patched and verified here, or the image's after its manifest matched the lock), NCCL and DeepEP built or reused
(keyed), DeepEP's JIT kernels compiled ahead from a recorded manifest, and the provenance of what was used.

Invariants: nothing here judges a run; a build or check that fails raises ReprostackError (BuildError), which the
gate turns into its ERROR report; with a kernels manifest (container mode) nothing is fetched or built.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import sources, ui
from ..atomicfile import write_text_atomic
from ..fetch.wheels import fetch_wheels, wheelhouses_from_env
from ..kernels import build as kbuild
from ..kernels import cache as kcache
from ..kernels import jit, ncclwheel, preflight, runtime, toolchain
from ..kernels import prebuilt as kprebuilt
from ..kernels.recipe import load_recipe
from ..lock import Lock
from .base import RunContext
from .options import GateOptions
from .spec import Spec
from .standin import StandIn


def build_kernels(opts: GateOptions, ctx: RunContext, trees: dict, prov: dict, timings: dict):
    """Build (or reuse, keyed) NCCL and DeepEP from the patched `trees` with the interpreter `opts.python`;
    records `nccl_build_s` / `deepep_build_s` in `timings` and `kernels` / `toolchain` in `prov`.
    With a kernel cache (`--kernel-cache`, $REPROSTACK_KERNEL_CACHE) DeepEP's signed entry is pulled on a hit
    (kernels.cache); `kernels_from` in `prov` says where the kernels came from (cache or build) and what the cache
    answered. Returns (toolchain, nccl Built, deepep Built). Raises BuildError / ReprostackError."""
    tc = toolchain.detect(opts.python, arch=opts.arch, cache=ctx.cache_root)
    nccl = prepare_nccl(opts, ctx, trees, tc, prov, timings)
    t = time.monotonic()
    url, answers = kernel_cache_url(opts), {}
    deepep = kbuild.build_deepep(
        trees["deepep"].path,
        trees["deepep"].tree,
        load_recipe(ctx.root, "deepep"),
        tc,
        nccl,
        ctx.cache_root,
        jobs=opts.jobs,
        substitute=kcache.substituter(url, kernel_keyring(opts, ctx), answers, arch=tc.arch) if url else None,
    )
    timings["deepep_build_s"] = round(time.monotonic() - t, 2)
    prov["kernels"] = built_provenance(nccl, deepep)
    prov["kernels_from"] = {"mode": deepep.origin, **({"cache": {"url": url, **answers}} if url else {})}
    prov["toolchain"] = tc.key_fields()
    return tc, nccl, deepep


def kernel_cache_url(opts: GateOptions) -> str | None:
    """The kernel cache a run pulls from: --kernel-cache, else $REPROSTACK_KERNEL_CACHE, else none."""
    return opts.kernel_cache or os.environ.get("REPROSTACK_KERNEL_CACHE") or None


def kernel_keyring(opts: GateOptions, ctx: RunContext) -> Path:
    """The keys a cache entry must be signed by: --kernel-keyring, else the project's keys/."""
    from ..evidence import KEYRING_DIR

    return Path(opts.kernel_keyring) if opts.kernel_keyring else Path(ctx.root) / KEYRING_DIR


def prepare_nccl(opts: GateOptions, ctx: RunContext, trees: dict, tc, prov: dict, timings: dict):
    """The stack's pinned NCCL: NVIDIA's wheel of the pinned release (sha256-checked, unpacked once, keyed) when
    that is what the pin is, else built from the verified `nccl` tree with toolchain `tc` (keyed). Records
    `nccl_build_s` in `timings` and `nccl_from` in `prov`. Returns the Built. Raises BuildError / FetchError."""
    t = time.monotonic()
    recipe = load_recipe(ctx.root, "nccl")
    src_version = preflight.nccl_source_version(trees["nccl"].path) if "nccl" in trees else None  # none: wheel alone
    choice = ncclwheel.choose(ctx.lock, recipe.source, recipe.wheel, src_version, recipe_path=str(recipe.path))
    if choice.kind == "wheel":  # the pinned release as NVIDIA's wheel: sha256-checked, unpacked once (keyed)
        with ui.step(f"fetch nccl wheel {choice.version}", key="fetch nccl wheel"):
            wheel = fetch_wheels(
                ctx.lock,
                choice.wheel_pin,
                cache_root=ctx.cache_root,
                wheelhouses=wheelhouses_from_env(),
                offline=ctx.fetch.offline,
            )[0]
        nccl = ncclwheel.unpack(wheel.path, wheel.sha256, choice.version, ctx.cache_root)
    else:
        nccl = kbuild.build_nccl(trees["nccl"].path, trees["nccl"].tree, recipe, tc, ctx.cache_root, jobs=opts.jobs)
    timings["nccl_build_s"] = round(time.monotonic() - t, 2)
    prov["nccl_from"] = {"kind": choice.kind, "why": choice.why}
    return nccl


def built_provenance(*builds) -> dict:
    """`provenance.kernels` of the builds used: per component its key, whether it was reused, its seconds."""
    return {
        b.component: {
            "key": b.key,
            "reused": b.reused,
            "origin": b.origin,
            "build_seconds": b.info.get("seconds"),
            **({"libstdcxx": b.info["libstdcxx"]} if "libstdcxx" in b.info else {}),
        }
        for b in builds
    }


@dataclass
class Kernels:
    """What a GPU gate runs its kernels with: `env` (the one-NCCL environment), the pinned NCCL's folder and version,
    DeepEP's JIT cache, the build logs (none when prebuilt) and `accept_sha256` (a prebuilt image's copy of the
    pinned libnccl, see kernels.runtime.check_one_nccl)."""

    env: dict
    nccl_lib: Path
    nccl_version: str
    jit_dir: Path
    logs: list = field(default_factory=list)
    accept_sha256: str | None = None
    site: Path | None = None  # deep_ep built here, or the image's when it holds prebuilt JIT kernels (None: neither)
    arch: str | None = None
    prebuilt_jit: dict | None = None  # the image's prebuilt JIT kernels (kernels.json `jit`, checked by prebuilt.check)


def nccl_words(lock, trees: dict, pre=None) -> tuple[str, str]:
    """(`, nccl <tree12>`, "") for an NCCL tree among the verified sources; ("", `; NCCL is the wheel F of pin W, not
    fetched here (it is fetched and sha256-checked only when kernels are built)`) for a stack whose NCCL is a wheel
    alone; with `pre` (a checked Prebuilt) whose NCCL is the pin's release wheel, that it is the image's copy: a SKIP
    never counts it among what was verified."""
    if "nccl" in trees:
        return f", nccl {trees['nccl'].tree[:12]}", ""
    if pre is not None and pre.components.get("nccl", {}).get("kind") == "wheel":  # checked by kernels.prebuilt
        return "", "; NCCL is the image's copy of the pin's release wheel, checked against the lock by sha256"
    w = ncclwheel.wheel_alone(lock, "nccl")
    files = ", ".join(f.filename for f in lock.get(w).files)
    return (
        "",
        f"; NCCL is the wheel {files} of pin {w}, not fetched here (fetched and sha256-checked only when kernels are built)",
    )


def source_trees(opts: GateOptions, ctx: RunContext, names) -> tuple[dict, object]:
    """(trees by pin, Prebuilt or None): with `opts.kernels_manifest`, the image's trees after its manifest matched the lock
    (kernels.prebuilt.check; PrebuiltError otherwise); else fetched, patched and verified here (sources.prepare).
    A stack whose `nccl` is a wheel (kernels.ncclwheel: NCCL from that wheel alone) has no nccl tree: dropped from the
    trees; a prebuilt image's manifest is still checked for it (its `nccl` must be that wheel)."""
    asked = tuple(names)
    names = tuple(n for n in names if n != "nccl" or ncclwheel.needs_source(ctx.lock, "nccl"))
    if opts.kernels_manifest:
        manifest = Path(opts.kernels_manifest)
        pre = kprebuilt.check(manifest, ctx.lock, ctx.root, asked, arch=opts.arch or toolchain.gpu_arch())
        # an image's NCCL from the pin's release wheel (kind "wheel", checked against the lock above) has no tree
        return {n: pre.tree(ctx.lock, n) for n in names if pre.components[n]["kind"] != "wheel"}, pre
    return {n: sources.prepare(ctx.lock, n, ctx.fetch, ctx.root) for n in names}, None


def setup_kernels(opts: GateOptions, ctx: RunContext, trees: dict, prov: dict, timings: dict, pre=None) -> Kernels:
    """The kernels of a GPU gate: the image's (`pre`, a checked Prebuilt: provenance `kernels_from` says prebuilt)
    or built here (build_kernels). Raises BuildError / ReprostackError."""
    if pre is not None:
        prov["kernels"], prov["kernels_from"] = pre.kernels_provenance(), pre.provenance()
        lib, sha = pre.nccl_file()  # the folder and bytes the gate trusts come from the hashed file
        # an image with prebuilt JIT kernels: DeepEP's cache is the image's folder (the test uses them, the prewarm
        # compiles only what is missing); the package deep_ep is the hashed extension's folder
        ext = pre.components["deepep"].get("paths", {}).get("extension") if pre.jit else None
        return Kernels(
            runtime.prebuilt_env(),
            lib.parent,
            pre.components["nccl"]["nccl_version"],
            Path(pre.jit["cache_dir"]) if ext else ctx.cache_root / "jit" / f"deepep-{trees['deepep'].tree[:16]}",
            accept_sha256=sha,
            site=Path(ext).parent.parent if ext else None,
            arch=(opts.arch or toolchain.gpu_arch()) if ext else None,
            prebuilt_jit=pre.jit if ext else None,
        )
    tc, nccl, deepep = build_kernels(opts, ctx, trees, prov, timings)
    # the test sees both builds through their stable views (runtime.stable_view: the paths DeepEP's JIT hashes are
    # the build key's, so a kernel cache entry's jit/ is found wherever the entry was pulled)
    dview, nview = runtime.stable_view(deepep.out), runtime.stable_view(nccl.out) / "build"
    return Kernels(
        runtime.runtime_env(dview, cache_root=ctx.cache_root, nccl_root=nview),
        nccl.out / "build" / "lib",
        nccl.info["version"],
        deepep.out / "jit",
        [nccl.log, deepep.log],
        site=dview / "site",
        arch=tc.arch,
    )


def stand_in_kernels(
    si: StandIn, lock, run_dir: Path, opts: GateOptions | None = None, root: Path | None = None
) -> Kernels:
    """The kernels of a GPU stand-in run (gates.standin): no build, the pinned NCCL's version, a stand-in library
    under `run_dir` (one path for every node sharing the out folder), this process's environment (the replay
    imports reprostack from where this runner does). In an image with prebuilt kernels (`opts.kernels_manifest`,
    checked against the lock as a real run checks it, for the stand-in's sm_90 unless --arch): the image's pinned
    NCCL is the one the replayed ranks map, so the one-NCCL checks judge the image's own library path, as they
    would on a GPU node."""
    if opts is not None and opts.kernels_manifest and Path(opts.kernels_manifest).is_file():  # (a test image: none)
        pre = kprebuilt.check(
            Path(opts.kernels_manifest), lock, root, ("nccl", "deepep"), arch=opts.arch or si.recorded_arch
        )
        lib, sha = pre.nccl_file()
        nccl = pre.components["nccl"]["nccl_version"]
        return Kernels(dict(os.environ), lib.parent, nccl, Path(run_dir) / "stand-in-jit", accept_sha256=sha)
    lib = si.stand_in_lib(Path(run_dir) / "stand-in-nccl")
    return Kernels(dict(os.environ), lib, si.nccl_version(lock), Path(run_dir) / "stand-in-jit")


def jit_prewarm(manifest, kern: Kernels, env: dict, tree: str, timings: dict, jobs: int | None):
    """Compile the manifest's DeepEP JIT kernels before the test (kernels.jit), when deep_ep was built here or the
    image holds prebuilt ones (those already in the cache are `present`, never compiled again; `prebuilt` says how
    many of the image's kernels this run's context names, i.e. DeepEP will find). Returns (context or None, the
    report's `jit` block)."""
    block: dict = {"manifest": str(manifest.path) if manifest else None}
    if kern.site is None:
        block["prewarm"] = "none: the image's deep_ep (no prebuilt JIT kernels in the image)"
        return None, block
    ctx, why = jit.Context.of(kern.site, env, kern.arch)
    if kern.prebuilt_jit is not None:
        block["prebuilt"] = prebuilt_hits(kern.prebuilt_jit, ctx, why)
    if ctx is None:
        block["prewarm"] = f"none: {why}"
        return None, block
    if manifest is None:
        block["prewarm"] = "none: no manifest for this profile (kernels/jit/<profile>.json)"
    elif manifest.deepep_tree != tree or manifest.arch != ctx.arch:
        block["prewarm"] = (
            f"none: the manifest was recorded for deepep tree {manifest.deepep_tree[:12]} sm_{manifest.arch}, "
            f"this run is tree {tree[:12]} sm_{ctx.arch} (record it again from this run's micro/jit-kernels.json)"
        )
    else:
        with ui.step(f"JIT prewarm {len(manifest.kernels)} DeepEP kernel(s)", key="jit prewarm"):
            block["prewarm"] = jit.prewarm(ctx, manifest.kernels, env, jobs=jobs)
        timings["jit_prewarm_s"] = block["prewarm"]["seconds"]
    block["before_test"] = len(jit.present(ctx))
    return ctx, block


def prebuilt_hits(rec: dict, ctx, why: str = "") -> dict:
    """How many of the image's prebuilt JIT kernels (`rec`, kernels.json `jit`, files checked by prebuilt.check) this
    run's DeepEP will find: those whose folder is the one `ctx` names for the kernel's own kernel.cu."""
    out: dict = {"kernels": len(rec["kernels"]), "cache_dir": rec["cache_dir"], "profiles": sorted(rec["profiles"])}
    if ctx is None:
        return {**out, "found": 0, "why": why}
    misses = []
    for k in rec["kernels"]:
        d = Path(rec["cache_dir"]) / "cache" / k["folder"]
        code = jit.kernel_code(d)
        if code is None or ctx.folder(k["name"], code) != d:
            misses.append(k["folder"])
    out["found"] = len(rec["kernels"]) - len(misses)
    if misses:
        out["not_found"] = misses[:20]
        out["why"] = (
            f"this run's DeepEP context (cache {ctx.cache_dir}, {ctx.signature}, sm_{ctx.arch}) names other "
            "folders: the test's environment or flags differ from the image's"
        )
    return out


def jit_record(ctx, block: dict, run_dir: Path, tree: str, profile: str) -> Path | None:
    """After the test: how many kernels DeepEP compiled itself, and this run's manifest (`micro/jit-kernels.json`,
    the kernels it used, to record as kernels/jit/<profile>.json)."""
    if ctx is None:
        return None
    block["compiled_in_test"] = len(jit.present(ctx)) - block.get("before_test", 0)
    manifest, counts = jit.record(ctx, deepep_tree=tree, profile=profile, source=str(run_dir))
    block["recorded"] = counts
    out = run_dir / "jit-kernels.json"
    write_text_atomic(out, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return out


def provenance(lock: Lock, spec: Spec, trees: dict) -> dict:
    """Lock and spec sha256, the stack, and url/rev/tree/patched tree/series of every source used (NCCL as the
    wheel a stack takes it from, when that is where it comes from)."""
    ups = {}
    for name, st in trees.items():
        pin = st.pin
        ups[name] = {
            "url": pin.url,
            "rev": pin.rev,
            "tree": pin.tree,
            "patched_tree": pin.patched_tree,
            "series": [f"{p.kind} {p.value} ({p.upstream_status})" for p in pin.patches],
        }
    if "deepep" in trees and "nccl" not in trees and not ncclwheel.needs_source(lock, "nccl"):  # NCCL: a wheel alone
        w = lock.get("nccl")
        ups["nccl"] = {
            "wheel": ncclwheel.wheel_alone(lock, "nccl"),
            "version": w.version,
            "files": [f"{f.filename} {f.sha256}" for f in w.files],
        }
    return {"lock_sha256": lock.sha256, "stack": lock.stack, "gate_spec_sha256": spec.sha256, "upstreams": ups}
