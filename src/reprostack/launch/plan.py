"""A gate run as data: one launch plan, rendered many ways (a table for a person, JSON for machines, the docker
SDK's `containers.run` arguments for one node; the Slurm and Kubernetes renderers read the same object).

A plan says everything a launcher needs and nothing it must guess: the image (recipe name, the content-keyed tag
once built, the image id / repo digest when known, the pinned base digest), one command per node (each node's
process starts its local ranks: `gpus_per_node` ranks per node, EP size = nodes x gpus_per_node), the env, the
GPUs and EFA devices, host network and IPC, memlock/stack ulimits, shm size, mounts (the out dir read-write;
cache, models, wheelhouse read-only) and the watchdog timeout.

Invariants:
- a plan is plain data (frozen dataclasses of str/int/tuples): building one runs nothing and reads no network;
- `mode` is "container" or "host"; a host-mode plan has no image and is always labelled so when rendered;
- mounts are absolute container paths; exactly one mount is writable and it is the out dir;
- an image without a known id or digest is rendered as such ("not built here"), never as a made-up id;
- `outputs` is the one output contract (Outputs): every renderer and the gate runtime take node logs, rc files,
  rank logs and the reporting node from it, never a path of their own.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

MODE_CONTAINER, MODE_HOST = "container", "host"
EFA_DEVICE_DIR = "/dev/infiniband"
# GDRCopy's device: libgdrapi opens it (NVIDIA/gdrcopy src/gdrapi.c gdr_open: open("/dev/gdrdrv", O_RDWR)); NCCL GIN
# and the EFA plugin's GDRCopy path need it inside the container, and no runtime maps it by itself: every launcher
# maps it for a plan with EFA (host_devices), the preflight opens it (cluster.nodecheck)
GDRDRV_DEVICE = "/dev/gdrdrv"
# The campaign's container limits (EFA and NCCL need pinned memory; DeepEP's CPU proxy deep stacks).
ULIMITS = (("memlock", -1, -1), ("stack", 67108864, 67108864))
SHM_SIZE = "32g"


@dataclass(frozen=True)
class Mount:
    source: str  # host path (or a named volume)
    target: str  # absolute path in the container
    read_only: bool = True
    what: str = ""  # out | cache | models | wheelhouse | sources


@dataclass(frozen=True)
class ImageRef:
    """The gate's image: `recipe` under containers/, `tag` = reprostack/<recipe>:<key16> once the key is known,
    `image_id` / `repo_digest` once built or pulled here, `base` = the pinned base `repo:tag@sha256:...`."""

    recipe: str
    tag: str | None = None
    image_id: str | None = None
    repo_digest: str | None = None
    base: str | None = None
    note: str = ""

    def describe(self) -> str:
        ident = self.repo_digest or self.image_id
        built = (
            f"{self.tag or 'reprostack/' + self.recipe} {ident}"
            if ident
            else f"{self.tag or 'reprostack/' + self.recipe} (not built here)"
        )
        return built + (f" on {self.base}" if self.base else "")


@dataclass(frozen=True)
class NodeCommand:
    """What runs on node `node` (0 = the leader that parses and reports): argv and its node-specific env."""

    node: int
    role: str  # leader | worker
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ArmPlan:
    """One arm of the gate (the DeepEP arm and its comparison arms): its role ("deepep", "comparison",
    "reference", "second-evidence", "alternative"), one command per node and the env it runs with (besides each
    node command's own; () when it is the plan's). The launchers run `LaunchPlan.commands` (the gate's runner,
    which starts every asked-for arm); the arms say what those runs are, and the gate's run executes them."""

    name: str
    role: str
    commands: tuple[NodeCommand, ...]
    env: tuple[tuple[str, str], ...] = ()


NODE_WAIT_S = 300.0  # how long node 0 waits, after its own part, for every other node's rc and rank logs


@dataclass(frozen=True)
class Outputs:
    """The output contract of a run on `nodes` node(s) that share one out folder: where each node writes, who
    reports, how long node 0 waits. Paths are relative to the out folder (the container's /out, the job's OUT).
    Read by the gate runtime (gates.base: every node writes its rank logs and its rc here; only `reporter`
    writes reports; the reporter waits, at most `wait_s` after its own part, for every other node's rc and rank
    logs, and names a node that failed or never wrote them) and by the renderers (gates.container: the node
    log; cluster.slurm: srun --output, the rc a task leaves when its runtime could not; cluster.k8s: the pod's
    tee and rc). `node` may be a launcher's placeholder (`%n`, `${NODE_RANK}`)."""

    nodes: int = 1
    reporter: int = 0
    wait_s: float = NODE_WAIT_S
    logs: str = "logs"

    def node_log(self, node) -> str:
        """Everything the node's agent printed (the launcher captures it)."""
        return f"{self.logs}/node-{node}.log"

    def node_rc(self, node) -> str:
        """`RC RUN_ID`: the exit status of the node's part (the runtime writes it; the launcher when it could not)."""
        return f"{self.logs}/node-{node}.rc"

    def leader_done(self) -> str:
        """The reporter's word that its part is over (`RUN_ID`): a worker that serves (an engine's worker, a Ray
        node) stops then, and its stop is no failure."""
        return f"{self.logs}/node-{self.reporter}.done"

    def rank_log(self, folder: str, stem: str, node) -> str:
        """A node's log of its ranks (the gate's command): `<folder>/<stem>.node<R>.log` on several nodes."""
        return f"{folder}/{stem}.node{node}.log" if self.nodes > 1 else f"{folder}/{stem}.log"

    def writes_reports(self, node) -> bool:
        return str(node) == str(self.reporter)

    def describe(self) -> str:
        return (
            f"node R: {self.node_log('R')}, {self.node_rc('R')} and its rank logs (<gate>/<log>.nodeR.log); "
            f"reports from node {self.reporter} only, after every node's rc (waits {self.wait_s:g} s at most)"
        )


def rc_text(rc: int, run_id: str | None) -> str:
    """The rc file's one line: `RC RUN_ID` (`-` when the run has no id)."""
    return f"{int(rc)} {run_id or '-'}\n"


def read_rc(path, run_id: str | None) -> int | None:
    """The exit status an rc file holds for run `run_id` (None: absent, unreadable, or another run's)."""
    try:
        words = open(path, encoding="utf-8", errors="replace").read(256).split()
    except OSError:
        return None
    if len(words) != 2 or words[1] != (run_id or "-") or not words[0].lstrip("-").isdigit():
        return None
    return int(words[0])


@dataclass(frozen=True)
class LaunchPlan:
    gate: str
    profile: str
    mode: str
    image: ImageRef | None
    nodes: int
    gpus_per_node: int
    commands: tuple[NodeCommand, ...]
    env: tuple[tuple[str, str], ...] = ()
    efa_devices_per_node: int = 0
    host_network: bool = True
    host_ipc: bool = True
    ulimits: tuple[tuple[str, int, int], ...] = ULIMITS
    shm_size: str = SHM_SIZE
    mounts: tuple[Mount, ...] = ()
    workdir: str = "/workspace"
    timeout_s: float = 0.0
    lock_sha256: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    arms: tuple[ArmPlan, ...] = ()
    kernels: str = ""  # where the kernels come from: prebuilt in the image (its manifest) or built on the host
    outputs: Outputs | None = None  # the output contract (None: the default one for `nodes`)

    def __post_init__(self):
        if self.outputs is None:
            object.__setattr__(self, "outputs", Outputs(self.nodes))
        elif self.outputs.nodes != self.nodes:
            raise ValueError(
                f"gate {self.gate}: the output contract is for {self.outputs.nodes} node(s), not {self.nodes}"
            )
        if self.mode not in (MODE_CONTAINER, MODE_HOST):
            raise ValueError(f"mode {self.mode!r}: container or host")
        if self.mode == MODE_CONTAINER and self.image is None:
            raise ValueError(f"gate {self.gate}: a container plan needs an image")
        writable = [m for m in self.mounts if not m.read_only]
        if len(writable) > 1 or any(m.what != "out" for m in writable):
            raise ValueError(f"gate {self.gate}: only the out dir may be mounted read-write")
        if any(not m.target.startswith("/") for m in self.mounts):
            raise ValueError(f"gate {self.gate}: mount targets must be absolute")

    @property
    def ep_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def to_dict(self) -> dict:
        d = asdict(self)
        d["env"] = dict(self.env)
        d["commands"] = [{**asdict(c), "env": dict(c.env)} for c in self.commands]
        d["ulimits"] = [{"name": n, "soft": s, "hard": h} for n, s, h in self.ulimits]
        d["ep_size"] = self.ep_size
        d["arms"] = [
            {
                "name": a.name,
                "role": a.role,
                "env": dict(a.env),
                "commands": [{**asdict(c), "env": dict(c.env)} for c in a.commands],
            }
            for a in self.arms
        ]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def lines(self) -> list[str]:
        """The plan for a person: one `field: value` per line (the CLI prints them in a rich table)."""
        img = self.image.describe() if self.image else "none (host mode: this host's own packages)"
        out = [
            ("gate", f"{self.gate} [{self.profile}]"),
            (
                "mode",
                self.mode
                + (
                    " (labelled in the report; not the pinned image)"
                    if self.mode == MODE_HOST
                    else " (what `gate G --container`, `launch slurm` and `launch k8s` run; `gate G` alone runs host mode)"
                ),
            ),
            ("image", img),
            ("ranks", f"{self.nodes} node(s) x {self.gpus_per_node} GPU(s) = EP{self.ep_size}"),
            (
                "EFA",
                f"{self.efa_devices_per_node} device(s) per node under {EFA_DEVICE_DIR}"
                if self.efa_devices_per_node
                else "none",
            ),
            ("network / IPC", f"{'host' if self.host_network else 'none'} / {'host' if self.host_ipc else 'private'}"),
            ("ulimits", ", ".join(f"{n}={'unlimited' if s < 0 else s}" for n, s, _ in self.ulimits)),
            ("shm", self.shm_size),
            ("timeout", f"{self.timeout_s:g} s"),
            ("outputs", self.outputs.describe()),
            ("lock", self.lock_sha256 or "-"),
        ]
        out += [("kernels", self.kernels)] if self.kernels else []
        out += [
            (f"mount {m.what or '-'}", f"{m.source} -> {m.target} ({'ro' if m.read_only else 'rw'})")
            for m in self.mounts
        ]
        out += [(f"node {c.node} ({c.role})", " ".join(c.argv)) for c in self.commands]
        out += [("env", " ".join(f"{k}={v}" for k, v in self.env))] if self.env else []
        for a in self.arms:
            if a.commands == self.commands:  # the DeepEP arm: the node commands above
                out.append((f"arm {a.name}", f"({a.role}) the node commands above"))
            for c in a.commands if a.commands != self.commands else ():
                out.append((f"arm {a.name}", f"({a.role}) node {c.node}: " + " ".join(c.argv)))
            own = [(k, v) for k, v in a.env if dict(self.env).get(k) != v]  # what the arm sets otherwise
            if own:
                out.append((f"arm {a.name}", f"({a.role}) env " + " ".join(f"{k}={v}" for k, v in own)))
        out += [("note", n) for n in self.notes]
        return [f"{k}: {v}" for k, v in out]


def host_devices(plan: LaunchPlan) -> tuple[str, ...]:
    """The host device nodes every launcher maps into the container, besides the GPUs and EFA devices (their own
    runtime/plugin's): GDRCOPY's /dev/gdrdrv for a plan with EFA; none otherwise."""
    return (GDRDRV_DEVICE,) if plan.efa_devices_per_node else ()


def docker_run_kwargs(
    plan: LaunchPlan, node: int, *, efa_devices: list[str] | None = None, gpu_ids: list[str] | None = None
) -> dict:
    """Arguments of docker SDK `client.containers.run(**kwargs)` for node `node` of a container plan:
    GPUs as a device request (all, or `gpu_ids`), EFA devices (the given `/dev/infiniband/*` paths of this
    host), host network and IPC, ulimits, shm size, mounts, env (plan env, then the node's). Raises
    ValueError for a host-mode plan or a node not in the plan."""
    from docker.types import DeviceRequest, Mount as DockerMount, Ulimit

    if plan.mode != MODE_CONTAINER:
        raise ValueError(f"gate {plan.gate}: a host-mode plan has no container")
    cmd = next((c for c in plan.commands if c.node == node), None)
    if cmd is None:
        raise ValueError(f"gate {plan.gate}: no command for node {node} (nodes 0..{plan.nodes - 1})")
    gpus = (
        DeviceRequest(device_ids=gpu_ids, capabilities=[["gpu"]])
        if gpu_ids
        else DeviceRequest(count=-1, capabilities=[["gpu"]])
    )
    image = plan.image.repo_digest or plan.image.image_id or plan.image.tag or f"reprostack/{plan.image.recipe}"
    return {
        "image": image,
        "command": list(cmd.argv),
        "environment": {**dict(plan.env), **dict(cmd.env)},
        "device_requests": [gpus] if plan.gpus_per_node else [],
        "devices": [f"{d}:{d}:rwm" for d in (efa_devices or [])],
        "network_mode": "host" if plan.host_network else "none",
        "ipc_mode": "host" if plan.host_ipc else None,
        "ulimits": [Ulimit(name=n, soft=s, hard=h) for n, s, h in plan.ulimits],
        "shm_size": plan.shm_size,
        "mounts": [DockerMount(m.target, m.source, type="bind", read_only=m.read_only) for m in plan.mounts],
        "working_dir": plan.workdir,
        "cap_add": ["IPC_LOCK", "SYS_PTRACE"],
        "detach": True,
        "labels": {
            "dev.reprostack.gate": plan.gate,
            "dev.reprostack.profile": plan.profile,
            "dev.reprostack.node": str(node),
            "dev.reprostack.lock-sha256": plan.lock_sha256,
        },
    }
