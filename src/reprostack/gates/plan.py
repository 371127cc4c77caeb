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
from ..launch import torchrun
from .registry import Gate

P5EN_EFA_DEVICES = 16  # EFA interfaces of one p5en.48xlarge (the campaign's nodes)
# in the images: the verified trees the recipes copy (containers/deepep: /opt/reprostack/src/<pin>); this project
# (drivers, reprostack itself) mounted read-only at /workspace; reports at /out
SRC, WORK, OUT, CACHE, MODELS = "/opt/reprostack/src", "/workspace", "/out", "/cache", "/models"
MASTER = "${MASTER_ADDR}"  # filled per cluster by the launcher (Slurm: first node; k8s: headless Service)
MASTER_PORT = 29500


def published_profile(spec) -> str:
    """The profile a plan shows when none is named: the first multi-node EFA profile (the campaign's 2 x p5en),
    else the spec's first profile."""
    for name, p in spec.profiles.items():
        if getattr(p, "needs_efa", False) and p.nodes > 1:
            return name
    return next(iter(spec.profiles))


def image_ref(root: Path, lock, name: str, images_json: Path | None = None) -> tuple[lp.ImageRef, list[str]]:
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


def _env(*maps) -> tuple[tuple[str, str], ...]:
    out: dict[str, str] = {}
    for m in maps:
        out.update({str(k): str(v) for k, v in (m or {}).items()})
    return tuple(sorted(out.items()))


def _micro(spec, profile, root: Path):
    # the gate runs test_ep.py through its trials driver (gates.micro: K trials in one launch, default K)
    from .micro import DEFAULT_TRIALS, TRIALS_DRIVER, test_ep_launch

    script = f"{WORK}/{TRIALS_DRIVER}"

    def node_commands(arms: str, extra: list[str]) -> tuple:
        args = [
            "--test-ep",
            f"{SRC}/deepep/{spec.script}",
            "--trials",
            str(DEFAULT_TRIALS),
            "--arms",
            arms,
            *extra,
            *spec.args,
            *profile.args,
        ]
        cmds = []
        for node in range(profile.nodes):  # the very launch the gate makes (gates.micro.test_ep_launch)
            many = profile.nodes > 1
            launch = test_ep_launch(
                profile,
                "python3",
                script,
                args,
                nodes=profile.nodes,
                node_rank=node,
                master_addr=MASTER if many else "127.0.0.1",
                master_port=MASTER_PORT,
            )
            cmds.append(lp.NodeCommand(node, "leader" if node == 0 else "worker", tuple(launch.argv), _env(launch.env)))
        return tuple(cmds)

    cmds = node_commands("deepep", [])
    arms = [lp.ArmPlan("deepep", "deepep", cmds)]
    if spec.dense is not None:  # `--arm deepep,dense`: the dense arm runs INSIDE the trials launch, interleaved
        arms.append(
            lp.ArmPlan(
                "dense",
                "comparison, in the same launch as deepep (trial by trial, ABAB)",
                node_commands("deepep,dense", list(spec.dense.args)),
            )
        )
    if spec.legacy is not None and profile.nodes == 1:  # gates.arms.run_legacy: one node, from the patched tree
        launch = torchrun.local(
            "python3",
            f"{SRC}/deepep/{spec.legacy.script}",
            list(spec.legacy.args),
            gpus=profile.gpus_per_node,
            port=MASTER_PORT,
        )
        arms.append(
            lp.ArmPlan(
                "legacy", "second-evidence", (lp.NodeCommand(0, "leader", tuple(launch.argv), _env(launch.env)),)
            )
        )
    return cmds, _env(spec.env, profile.env), f"{SRC}/deepep", [], arms


def _training_cmds(spec, profile, arm) -> list:
    cmds = []
    for node in range(profile.nodes):
        if spec.driver:
            args = [*spec.args, *(arm.args if arm else ()), *profile.args]
            launch = torchrun.torchrun_workers(
                "python3",
                f"{WORK}/{spec.driver}",
                args,
                gpus=profile.gpus_per_node,
                nodes=profile.nodes,
                node_rank=node,
                master_addr=MASTER if profile.nodes > 1 else None,
                master_port=MASTER_PORT if profile.nodes > 1 else None,
            )
            argv, env = launch.argv, launch.env
            if profile.nodes == 1:  # a local master: no port to agree on
                argv = [a if not a.startswith("--master-port=") else f"--master-port={MASTER_PORT}" for a in argv]
                env = {**env, "MASTER_PORT": str(MASTER_PORT)}
        else:  # nemo-rl: the command runs on the Ray head (node 0); workers join the Ray cluster
            argv = (
                ["python3", *spec.command, *profile.args]
                if node == 0
                else ["ray", "start", "--block", f"--address={MASTER}:6379"]
            )
            env = {}
        cmds.append(lp.NodeCommand(node, "leader" if node == 0 else "worker", tuple(argv), _env(env)))
    return cmds


def _training(spec, profile, root: Path):
    arm = spec.arms.get(spec.deepep_arm) if spec.deepep_arm else None
    cmds = _training_cmds(spec, profile, arm)
    arms = []
    if spec.driver:  # every arm runs the same driver with its own args/env (gates.training._run_arm)
        for name, a in spec.arms.items():
            role = "deepep" if a.deepep else "reference" if name == spec.reference_arm else "comparison"
            arms.append(lp.ArmPlan(name, role, tuple(_training_cmds(spec, profile, a)), _env(a.env)))
    workdir = f"{SRC}/{spec.source}" if not spec.driver else WORK
    return cmds, _env(spec.env, profile.env, arm.env if arm else None), workdir, [], arms


def _serving(spec, profile, root: Path):
    from .serving import ServingOptions, _server_command

    arm = next((a for a in spec.arms.values() if a.role == "deepep"), next(iter(spec.arms.values())))
    server = profile.server or spec.server
    notes: list[str] = []

    def commands(a) -> tuple[list, dict]:
        cmds, env = [], {}
        for node in range(profile.nodes):
            if node > 0 and "worker" not in server:  # TRT-LLM: the leader's mpirun starts every rank over ssh
                cmds.append(lp.NodeCommand(node, "worker", ("/usr/sbin/sshd", "-D", "-p", "2222")))
                if a is arm:
                    notes.append(f"node {node}: ranks started by the leader's launcher over ssh (sshd on port 2222)")
                continue
            opts = ServingOptions(
                root=Path(WORK),
                lock=None,
                out_dir=Path(OUT),
                cache_root=Path(CACHE),
                profile=profile.name,
                node_rank=node,
                leader_addr=MASTER,
                arms=[a.name],
                python="python3",
            )
            argv, full_env, _, _ = _server_command(spec, profile, a, opts, Path(OUT) / spec.gate)
            keys = {*server.get("env", {}), *profile.env, *a.env}
            env = {k: full_env[k] for k in keys if k in full_env}
            cmds.append(lp.NodeCommand(node, "leader" if node == 0 else "worker", tuple(argv)))
        return cmds, env

    cmds, env = commands(arm)
    arms = [lp.ArmPlan(arm.name, arm.role, tuple(cmds))]
    for a in spec.arms.values():
        if a is not arm:
            other, other_env = commands(a)
            arms.append(
                lp.ArmPlan(
                    a.name, a.role, tuple(other), tuple(sorted((k, v) for k, v in other_env.items() if env.get(k) != v))
                )
            )
    return cmds, _env(env), WORK, notes, arms


_BUILDERS = {"micro": _micro, "training": _training, "serving": _serving}


def gate_plan(
    g: Gate,
    root: Path,
    lock,
    *,
    profile: str | None = None,
    out_dir: Path = Path("out/gates"),
    cache_dir: Path | None = None,
    mode: str = lp.MODE_CONTAINER,
    images_json: Path | None = None,
) -> lp.LaunchPlan:
    """The launch plan of gate `g` for `profile` (default: the published hardware). Raises GateSpecError /
    RecipeError (file:line) or GateError (unknown profile) before anything is built."""
    spec = g.load(root)
    if hasattr(spec, "with_stack") and lock is not None:  # the lock stack's env (lockstacks; gates/spec.py)
        spec = spec.with_stack(lock.stack, lock.env)
    name = profile or published_profile(spec)
    prof = spec.profile(name)
    cmds, env, workdir, notes, arms = _BUILDERS[g.kind](spec, prof, Path(root))
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
    mounts = [
        lp.Mount(str(Path(out_dir).resolve()), OUT, read_only=False, what="out"),
        lp.Mount(str(Path(root).resolve()), WORK, what="project"),
    ]
    if cache_dir is not None:
        mounts.append(lp.Mount(str(Path(cache_dir).resolve()), CACHE, what="cache"))
    if g.kind == "serving":  # the model, read-only, where the engine looks for it (HF_HUB_OFFLINE=1 in the specs)
        models = os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface")
        mounts.append(lp.Mount(str(Path(models).resolve()), MODELS, what="models"))
        env = tuple(sorted({**dict(env), "HF_HOME": MODELS}.items()))
    needs_efa = bool(getattr(prof, "needs_efa", False))
    if needs_efa:
        notes.append(f"EFA: every /dev/infiniband/uverbs* of the node ({P5EN_EFA_DEVICES} on a p5en.48xlarge)")
    return lp.LaunchPlan(
        gate=g.report_name,
        profile=prof.name,
        mode=mode,
        image=image,
        nodes=prof.nodes,
        gpus_per_node=prof.gpus_per_node,
        commands=tuple(cmds),
        env=env,
        efa_devices_per_node=P5EN_EFA_DEVICES if needs_efa else 0,
        mounts=tuple(mounts),
        workdir=workdir,
        timeout_s=float(spec.timeout_s),
        lock_sha256=lock.sha256,
        notes=tuple(notes),
        arms=tuple(arms),
        kernels=kernels_line(g.kind, spec, lock, image, mode),
    )


def kernels_line(kind: str, spec, lock, image, mode: str) -> str:
    """Where a gate with `kernels:` gets NCCL and DeepEP: prebuilt in its image (container mode; the manifest the
    in-image runner checks against these pins before anything runs) or built on the host (host mode)."""
    from ..kernels import ncclwheel
    from ..kernels.prebuilt import MANIFEST
    from ..lock import WheelPin

    names = list(getattr(spec, "kernels", ()) or ())
    if not names:
        return ""
    pins = []
    for n in ([spec.source] if getattr(spec, "driver", None) and getattr(spec, "source", None) else []) + names:
        pin = lock.upstreams.get(n)
        if pin is not None and getattr(pin, "rev", None):
            pins.append(f"{n} {pin.rev[:12]} patched tree {(pin.patched_tree or pin.tree)[:12]}")
        elif isinstance(pin, WheelPin):  # the stack's NCCL is a wheel alone (kernels.ncclwheel)
            pins.append(
                f"{n} from wheel {ncclwheel.wheel_alone(lock, n)} "
                f"({', '.join(f'{f.filename} sha256 {f.sha256[:12]}' for f in pin.files)})"
            )
    img = image.recipe if image else "?"
    if kind == "serving":
        return (
            f"the engine's DeepEP and NCCL in image {img} (inherited from image deepep, whose {MANIFEST} records "
            f"them: {'; '.join(pins)})"
            if mode == lp.MODE_CONTAINER
            else f"the engine's DeepEP and NCCL as installed on this host (pinned: {'; '.join(pins)})"
        )
    if mode != lp.MODE_CONTAINER:
        return f"built on this host from the fetched, patched trees ({'; '.join(pins)}), cached by build key"
    return (
        f"prebuilt in image {img}: {MANIFEST}, checked at start against the lock "
        f"({'; '.join(pins)}) and kernels/*.yaml; no fetch, no build; a mismatch stops the gate"
    )
