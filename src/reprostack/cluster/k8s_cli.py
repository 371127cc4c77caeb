"""`reprostack launch k8s GATE`: the command around cluster.k8s (its options, the operator's values checked before
anything is written, the manifests written, `--apply`).

Invariants: every operator value (--host-path, --node-selector, --out-hostpath, --models, --nodes) is checked before a
file is written (K8sError, one line, exit 2); nothing touches the cluster unless --apply, which runs `kubectl apply -f
DIR` only (no kubectl: one line, the manifests kept).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from ..launch import plan as lp
from .k8s import HOST_PATH_KINDS, MAX_NAME, PVC, VARIANTS, K8sError, agent_plan, dns1123, render, sh_word, write

if TYPE_CHECKING:
    from ..gates.fabric_mpi import MpiLaunch
    from ..gates.spec import Spec

HELP = (
    "render Kubernetes manifests (Indexed Job + headless Service; or a JobSet / LeaderWorkerSet) of a gate's "
    "launch plan into DIR; --apply runs `kubectl apply -f DIR`"
)


def add_arguments(p) -> None:
    from ..gates.registry import GATE_ORDER

    from ..gates import options as gate_options

    p.add_argument("gate", choices=list(GATE_ORDER))
    gate_options.add_arguments(p, ("nodes", "profile", "master_port"))  # defined once (gates.options)
    p.add_argument("--out", default=None, help="folder of the manifests (default: out/k8s/<gate>)")
    p.add_argument(
        "--variant",
        choices=VARIANTS,
        default="job",
        help="job: Indexed Job + headless Service (default); jobset: a JobSet; lws: a LeaderWorkerSet (serving gates)",
    )
    p.add_argument(
        "--image",
        default=None,
        metavar="REPO@sha256:HEX",
        help="the gate's image by digest as the cluster pulls it (default: the plan's repo digest)",
    )
    p.add_argument(
        "--name",
        default=None,
        help="name of the Job/Service (default: rs-<gate>-<UTC time>, new at every rendering: a Job is never "
        "applied twice under one name)",
    )
    p.add_argument(
        "--pod-network",
        action="store_true",
        help="pods on the cluster's pod network: no hostNetwork and no hostIPC, which need the privileged Pod "
        "Security level (EFA is a device; NCCL's bootstrap uses the pod's interface)",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--out-pvc", default=PVC, help=f"PersistentVolumeClaim of the shared out dir (default: {PVC})")
    out.add_argument("--out-hostpath", default=None, metavar="PATH", help="the out dir as a hostPath instead")
    p.add_argument(
        "--host-path",
        action="append",
        default=[],
        metavar="WHAT=PATH",
        help="node path of a read-only mount (project, models): e.g. project=/fsx/reprostack",
    )
    p.add_argument(
        "--models",
        default=None,
        metavar="DIR",
        help="serving gates: the models folder on the nodes (a hostPath mounted read-only at /models, HF_HOME "
        "inside); the same as --host-path models=DIR",
    )
    p.add_argument(
        "--node-selector",
        action="append",
        default=[],
        metavar="K=V",
        help="e.g. node.kubernetes.io/instance-type=p5en.48xlarge",
    )
    p.add_argument("--no-preflight", action="store_true", help="leave out the cross-node preflight step")
    p.add_argument("--apply", action="store_true", help="then `kubectl apply -f DIR`")
    p.add_argument("--lock", default=None, help="lockfile (default: upstreams.lock of the project root)")


def _unique_name(gate: str) -> str:
    """rs-<gate>-<UTC time to the second>: a new Job at every rendering (a Job's spec is immutable, and one applied
    again under its name would not run again)."""
    import time

    return dns1123(f"rs-{gate}-{time.strftime('%y%m%d-%H%M%S', time.gmtime())}", "name", MAX_NAME)


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise K8sError(f"{flag} {item!r}: expected K=V")
        out[k] = v
    return out


def _refusal(args, g, spec: Spec, plan: lp.LaunchPlan) -> MpiLaunch | None:
    """The gate's MPI launch (None: the gate's own rendezvous) once the profile and --variant are ones a cluster can
    run; K8sError naming what is not."""
    why = g.launcher.unrenderable(spec, spec.profile(plan.profile))
    if why:
        raise K8sError(f"gate {g.name}: {why}")
    mpi = g.launcher.mpi_launch(spec, spec.profile(plan.profile))
    if mpi is not None and args.variant != "job":
        raise K8sError(f"--variant {args.variant}: profile {plan.profile} is started by MPI: an MPIJob (--variant job)")
    if args.variant == "lws" and not g.serves:
        raise K8sError(f"--variant lws is for serving gates (gate {g.name} is {g.kind}: use job or jobset)")
    return mpi


def _host_paths(args, g) -> dict[str, str]:
    """{mount what: node path} from --host-path and --models, checked: a gate's mount, an absolute path, named once."""
    host = _pairs(args.host_path, "--host-path")
    if args.models is not None:
        if not g.serves:
            raise K8sError(f"--models: gate {g.name} serves no model (only the serving gates mount one)")
        if host.get("models", args.models) != args.models:
            raise K8sError(f"--models {args.models} and --host-path models={host['models']}: name the folder once")
        host["models"] = args.models
    for k, v in host.items():
        if k not in HOST_PATH_KINDS:  # a typo would leave the mount on the rendering machine's path, unsaid
            raise K8sError(f"--host-path {k}={v}: {k!r} is no mount of a gate (one of {', '.join(HOST_PATH_KINDS)})")
        if not v.startswith("/"):
            raise K8sError(f"--host-path {k}={v}: the node path must be absolute")
    return host


def _node_selector(args) -> dict[str, str]:
    """--node-selector's K=V pairs, each a Kubernetes label key and value (checked before anything is written)."""
    sel = _pairs(args.node_selector, "--node-selector")
    for k, v in sel.items():  # the operator's label keys/values: checked before anything is written
        if not re.fullmatch(
            r"([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", k
        ) or not re.fullmatch(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?", v):
            raise K8sError(f"--node-selector {k}={v}: not a Kubernetes label key=value")
    return sel


def _written(docs: list[dict], paths: list[Path], variant: str, mpi: MpiLaunch | None) -> None:
    """What was written, and where node 0's log is (an Indexed Job's pods carry their index as a label)."""
    for p in paths:
        print(f"wrote {p}")
    kind = "mpijob" if mpi else {"job": "job", "jobset": "jobset", "lws": "leaderworkerset"}[variant]
    name = next(d["metadata"]["name"] for d in docs if d.get("kind", "").lower() == kind)
    logs = (  # an Indexed Job's pods carry their index as a label (node 0: index 0)
        f"; node 0's log: kubectl logs -f -l batch.kubernetes.io/job-name={name},"
        "batch.kubernetes.io/job-completion-index=0"
        if kind == "job"
        else ""
    )
    print(f"{kind} {name}: node 0 writes the reports into the out volume{logs}")


def _apply(out: Path) -> int:
    """`kubectl apply -f OUT`: 0, or 2 when kubectl failed; K8sError when there is no kubectl."""
    kubectl = shutil.which("kubectl")
    if not kubectl:
        raise K8sError(
            f"--apply: kubectl is not on PATH (the manifests are written; apply them with `kubectl apply -f {out}`)"
        )
    return subprocess.run([kubectl, "apply", "-f", str(out)], stdin=subprocess.DEVNULL).returncode and 2


def main(args, g, lock, root: Path) -> int:
    """`reprostack launch k8s`: plan -> agent plan -> manifests in DIR (-> kubectl apply)."""
    from ..gates import profiles
    from ..gates.plan import gate_plan
    from . import preflight

    out = Path(args.out or f"out/k8s/{g.name}")
    plan = gate_plan(g, root, lock, profile=args.profile, out_dir=out)
    spec: Spec = g.load(root)
    nodes = profiles.check_nodes(g.name, spec, spec.profile(plan.profile), args.nodes)  # as `launch slurm`: its count
    if args.pod_network:
        plan = dataclasses.replace(plan, host_network=False, host_ipc=False)
    mpi = _refusal(args, g, spec, plan)
    image = args.image or plan.image.repo_digest
    if not image:
        raise K8sError(
            f"gate {g.name}: image {plan.image.recipe} has no registry digest here: push it and pass "
            f"--image REPO@sha256:<digest> (a cluster never runs an image by tag)"
        )
    host = _host_paths(args, g)
    sel = _node_selector(args)
    if args.out_hostpath and not args.out_hostpath.startswith("/"):
        raise K8sError(f"--out-hostpath {args.out_hostpath}: must be absolute")
    agent = agent_plan(g, root, lock, plan, nodes, args.master_port)
    from ..gates.plan import OUT, WORK

    pf = (
        None
        if args.no_preflight
        else preflight.command(g.name, nodes, profile=plan.profile, out=OUT, lock=f"{WORK}/{Path(lock.path).name}")
    )
    prof = spec.profile(plan.profile)
    docs = render(
        agent,
        image=image,
        variant=args.variant,
        name=args.name or _unique_name(g.name),
        gpus=prof.needs_gpu,
        preflight=pf,
        out_pvc=None if args.out_hostpath else args.out_pvc,
        out_hostpath=args.out_hostpath,
        host_paths=host,
        node_selector=sel,
        master_port=args.master_port,
    )
    if mpi is not None:  # the Kubeflow MPI operator's MPIJob in place of the Job and its Service (cluster.k8s_mpi)
        from . import k8s_mpi

        judge = k8s_mpi.judge_argv(g, lock, agent, OUT)
        docs = [k8s_mpi.mpijob(docs[-1], mpi, judge=judge, sh=sh_word, plan=agent)]
    header = (
        f"# Rendered by `reprostack launch k8s {g.name} --variant {args.variant}` from gate {plan.gate}'s "
        f"launch plan\n# (profile {plan.profile}, {nodes} node(s), lock sha256 {lock.sha256}). "
        "Re-render; do not edit.\n"
    )
    _written(docs, write(docs, out, header), args.variant, mpi)
    return _apply(out) if args.apply else 0
