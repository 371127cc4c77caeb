"""spec -> plan: the launch plan (reprostack.launch.plan.LaunchPlan) of a gate run, built from its spec, a profile,
the lock and the image recipes, without running, fetching or building anything.

`gate G --plan` prints it; the docker launcher and the Slurm/Kubernetes renderers read the same object.

Invariants:
- the plan's commands are the ones the gate runs (same script/driver, arguments, env and launcher rules as the
  host-mode runner), with paths inside the image: the verified source trees under /src/<pin>, this project under
  /workspace, the out dir at /out, the cache at /cache (read-only);
- the image is named by its recipe; its base by the lock's digest (`repo:tag@sha256:...`) when the recipe chain
  ends in a pinned base; its id only when `out/build/images.json` (written by `reprostack build` on this machine)
  records one for that recipe — never a made-up id;
- a recipe whose build is `unresolved` (TRT-LLM wheels, NeMo-RL deps) says so in the plan's notes;
- with no `--profile`, the plan is for the published hardware (the gate's p5en profile), whatever this host is;
- `arms` lists every arm of the gate (the DeepEP arm and the comparison arms), each with its per-node commands;
  `commands` stays the DeepEP arm's, so a launcher that reads only `commands` runs what it did before;
- `kernels` says where a gate with `kernels:` gets them: in container mode prebuilt in the image, from its
  manifest (reprostack.kernels.prebuilt.MANIFEST), checked against the lock's pins when the gate starts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..containers import recipe as recipes
from ..errors import GateError
from ..launch import plan as lp
from ..lock import Lock
from . import profiles
from .base import CACHE, IMAGE_PATHS, MASTER, MASTER_PORT, MODELS, OUT, SRC, WORK, Gate  # noqa: F401 (re-exported)
from .options import GateOptions
from .spec import HardwareProfile, Spec

P5EN_EFA_DEVICES = 16  # EFA interfaces of one p5en.48xlarge (the campaign's nodes)


def image_ref(root: Path, lock: Lock, name: str, images_json: Path | None = None) -> tuple[lp.ImageRef, list[str]]:
    """(ImageRef, notes) of recipe `name`: its base by digest through the recipe chain, the tag and id recorded
    by the last `reprostack build` here (images_json), and why it cannot be built when a recipe is unresolved.
    Raises RecipeError (file:line) for a recipe that does not load or a lock base that is not pinned."""
    loaded = recipes.resolve_lock_bases(recipes.load_all(root, [name]), lock)
    notes, base, r = [], None, loaded[name]
    while r is not None:
        if r.unresolved:
            notes.append(f"image {r.name} cannot be built yet: {r.unresolved}")
        for w in r.wheels:
            why = getattr(lock.upstreams.get(w.pin), "unresolved", None)
            if why:
                notes.append(f"image {r.name} cannot be built yet: wheel pin {w.pin} is unresolved ({why})")
        if r.base is not None:
            base = r.base.text if r.base.kind != "local" else f"local:{r.base.name}"
            break
        r = loaded.get(r.parent) if r.parent else None
    tag = image_id = None
    built = _built(images_json) if images_json else {}
    if name in built:
        tag, image_id = built[name].get("tag"), built[name].get("image_id")
    else:
        notes.append(
            f"image {name} is not built on this machine (`reprostack build {name}`); its tag is its "
            "content key, known once built"
        )
    return lp.ImageRef(name, tag=tag, image_id=image_id, base=base), notes


def _built(path: Path) -> dict:
    """{recipe: {tag, image_id}} from a build's images.json; {} when absent or unreadable (a plan never fails
    on a stale or foreign build summary: it only loses the ids)."""
    try:
        data = json.loads(Path(path).read_text())
        rows = data.get("images", data) if isinstance(data, dict) else data
        return {
            r["name"]: {"tag": str(r.get("tag")), "image_id": str(r.get("image_id"))}
            for r in rows
            if isinstance(r, dict) and isinstance(r.get("name"), str) and r.get("image_id")
        }
    except (OSError, ValueError, TypeError, AttributeError, KeyError):
        return {}


def gate_plan(
    g: Gate,
    root: Path,
    lock: Lock,
    *,
    profile: str | None = None,
    out_dir: Path = Path("out/gates"),
    cache_dir: Path | None = None,
    mode: str = lp.MODE_CONTAINER,
    images_json: Path | None = None,
    options: GateOptions | None = None,
) -> lp.LaunchPlan:
    """The launch plan of gate `g` for `profile` (default: the published hardware) and the operator's `options`
    (default: none given), its commands from the gate's own plan_parts with the image's paths. Raises
    GateSpecError / RecipeError (file:line) or GateError (unknown profile) before anything is built."""
    opts = options or GateOptions()
    spec: Spec = g.spec_for(Path(root), lock)
    prof: HardwareProfile = profiles.resolve(spec, profile or opts.profile)
    parts = g.plan_parts(spec, prof, opts, IMAGE_PATHS)
    notes, env = list(parts.notes), parts.env
    image = None
    if mode == lp.MODE_CONTAINER:
        if not spec.image:
            raise GateError(f"{spec.path}: no `image:` (the recipe the gate runs in)")
        image, image_notes = image_ref(
            Path(root),
            lock,
            spec.image,
            images_json if images_json is not None else Path(root) / "out/build/images.json",
        )
        notes = image_notes + notes
    mounts = _mounts(g, root, out_dir, cache_dir)
    if g.serves:  # the engine finds the model in the models mount (HF_HUB_OFFLINE=1 in the specs)
        env = tuple(sorted({**dict(env), "HF_HOME": MODELS}.items()))
    if prof.needs_efa:
        notes.append(f"EFA: every /dev/infiniband/uverbs* of the node ({P5EN_EFA_DEVICES} on a p5en.48xlarge)")
    return lp.LaunchPlan(
        gate=g.report_name,
        profile=prof.name,
        mode=mode,
        image=image,
        nodes=prof.nodes,
        gpus_per_node=prof.gpus_per_node,
        commands=tuple(parts.commands),
        env=env,
        efa_devices_per_node=P5EN_EFA_DEVICES if prof.needs_efa else 0,
        mounts=tuple(mounts),
        workdir=parts.workdir,
        timeout_s=float(spec.timeout_s),
        lock_sha256=lock.sha256,
        notes=tuple(notes),
        arms=tuple(parts.arms),
        kernels=g.kernels.line(spec, lock, image, mode),
    )


def _mounts(g: Gate, root: Path, out_dir: Path, cache_dir: Path | None) -> list:
    """The out dir read-write, the project (and the cache) read-only; a serving gate's model folder read-only."""
    mounts = [
        lp.Mount(str(Path(out_dir).resolve()), OUT, read_only=False, what="out"),
        lp.Mount(str(Path(root).resolve()), WORK, what="project"),
    ]
    if cache_dir is not None:
        mounts.append(lp.Mount(str(Path(cache_dir).resolve()), CACHE, what="cache"))
    if g.serves:
        models = os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface")
        mounts.append(lp.Mount(str(Path(models).resolve()), MODELS, what="models"))
    return mounts
