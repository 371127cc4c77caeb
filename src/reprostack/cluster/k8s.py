"""Kubernetes manifests of a gate's launch plan (issue 15 item 2): `reprostack launch k8s GATE --nodes N`.

`render(plan, ...)` is pure: a LaunchPlan (reprostack.launch.plan, built by reprostack.gates.plan.gate_plan) in,
a list of manifest dicts out, dumped one file each with yaml.safe_dump. Variants:
- `job` (default): an Indexed Job (completions = parallelism = N, completionMode Indexed, backoffLimit 0) and a
  headless Service (publishNotReadyAddresses) for the rendezvous: the master is pod index 0's stable DNS name
  `<job>-0.<service>`, the node rank is JOB_COMPLETION_INDEX;
- `jobset` (jobset.x-k8s.io/v1alpha2): one replicated Indexed Job; JobSet makes the headless Service; master
  `<jobset>-node-0-0.<jobset>`;
- `lws` (leaderworkerset.x-k8s.io/v1, serving gates): one group of N pods; master $LWS_LEADER_ADDRESS, rank
  $LWS_WORKER_INDEX. A LeaderWorkerSet restarts pods that exit, so the pod sleeps after the gate: read the
  report, then delete the set.

Each pod: the image by digest, `nvidia.com/gpu` = the plan's GPUs per node (when the profile needs GPUs),
`vpc.amazonaws.com/efa` = the plan's EFA devices per node with 2 MiB hugepages (the EFA device plugin's
recipe) and GDRCopy's /dev/gdrdrv (a hostPath CharDevice, the container privileged on the host network: a device
outside the device plugins' is refused to an unprivileged one), /dev/shm as a memory emptyDir of the plan's shm size, IPC_LOCK (pinned memory without a memlock
limit), host network and IPC where the plan says (`--pod-network`: neither, for clusters whose Pod Security level
is not privileged), the plan's env and mounts (the out dir as a PVC or a hostPath; the others as hostPaths), one pod
per node (pod anti-affinity), and one command: the cross-node preflight (reprostack.cluster.preflight) first, then the
gate's in-image runner in host mode with this node's rank and the run's id (the Job's uid, from the downward API;
the same runner `gate G --container` starts, reprostack.gates.container.inner_argv) under the pod's own time limit
(`timeout`, from the container's start: the image pull does not count), its output teed into the output contract's
node log, SIGTERM passed on to it, this run's rc left where the contract says (node 0 waits for the others' and alone
writes the reports). The Job: a new name at each rendering (`rs-<gate>-<UTC time>`), ttlSecondsAfterFinished, a
podFailurePolicy that fails it at once when a pod fails or is disrupted (the others get SIGTERM; node 0 reports),
activeDeadlineSeconds only as a backstop (the pod's limit + PULL_S), terminationGracePeriodSeconds for node 0's
report.

The command (`reprostack launch k8s`: options, checks, --apply) is cluster.k8s_cli.

Invariants:
- nothing here runs or reads the cluster; `--apply` alone (cluster.k8s_cli) calls `kubectl apply -f DIR`;
- the image is named by digest (`REPO@sha256:<64 hex>`): the plan's repo digest or `--image`; never a tag;
- names and label values are DNS-1123 labels (lowercase, `_`/`.` become `-`, long ones cut and suffixed with a
  hash); a value that cannot be made one (another character, nothing left) is a K8sError naming it (exit 2);
- the same plan and options give byte-identical files (docs/examples/k8s is checked by a test).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ReprostackError
from ..launch import plan as lp

if TYPE_CHECKING:
    from ..gates.spec import Spec

VARIANTS = ("job", "jobset", "lws")
GPU, EFA = "nvidia.com/gpu", "vpc.amazonaws.com/efa"
# The EFA device plugin's pod recipe (AWS EKS user guide, "Run machine learning training on Amazon EKS with
# Elastic Fabric Adapter"): libfabric's efa provider takes 2 MiB hugepages; a hugepages request needs a memory one.
HUGEPAGES = ("hugepages-2Mi", "5120Mi")
EFA_MEMORY_REQUEST = "32000Mi"
PVC = "reprostack-out"
# every Kubernetes minor the manifests are validated against (tests/test_launch_k8s.py, kubernetes-validate's bundled
# schemas, offline): the minors Amazon EKS supports, standard and extended support (docs.aws.amazon.com/eks/latest/
# userguide/kubernetes-versions.html; 1.31's extended support ended 2026-11-26, kept while a cluster may still run it),
# up to the newest the pinned kubernetes-validate ships
KUBERNETES_MINORS = ("1.31", "1.32", "1.33", "1.34", "1.35", "1.36", "1.37")
MAX_NAME = 40  # the pod hostname `<name>-node-0-0` stays a DNS-1123 label (<= 63)
LABEL = "reprostack.dev"
_DNS = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_IMAGE = re.compile(
    r"[a-z0-9]([a-z0-9._-]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*"
    r"@sha256:[0-9a-f]{64}"
)
_VARS = re.compile(r"(\$\{(?:NODE_RANK|MASTER_ADDR|RUN_ID)\})")
HOST_PATH_KINDS = ("project", "models", "cache", "wheelhouse", "sources")  # launch.plan.Mount.what, but the out dir
KILL_AFTER_S = 60  # `timeout -k`: SIGKILL this long after the time limit's SIGTERM
GRACE_S = 120  # terminationGracePeriodSeconds: node 0 stops its run and writes its report after a SIGTERM
PULL_S = 1800  # the Job's activeDeadlineSeconds backstop: the pod's own time limit + this for the image pull
RESOLVE_TRIES, RESOLVE_WAIT_S = 60, 5  # the leader's DNS name: 60 lookups 5 s apart (5 min), then one line, exit 2
TTL_S = 86400  # ttlSecondsAfterFinished: the finished Job and its pods (kubectl logs) kept a day
# a pod's label the downward API gives as this run's id: the Job's uid (Job, JobSet) or the group's (LWS)
RUN_ID_LABEL = {
    "job": "batch.kubernetes.io/controller-uid",
    "jobset": "batch.kubernetes.io/controller-uid",
    "lws": "leaderworkerset.sigs.k8s.io/group-key",
}


class K8sError(ReprostackError):
    """A manifest could not be rendered or applied (a name, image or option that Kubernetes would refuse)."""


def dns1123(value: str, what: str, max_len: int = 63) -> str:
    """`value` as a DNS-1123 label: lowercase, `_` and `.` as `-`, cut to max_len with a hash suffix."""
    v = str(value).lower().replace("_", "-").replace(".", "-").strip("-")
    if not v or not re.fullmatch(r"[-a-z0-9]+", v):
        raise K8sError(f"{what} {value!r}: cannot be made a DNS-1123 label (letters, digits, '-', '_', '.' only)")
    if len(v) > max_len:
        v = v[: max_len - 9].rstrip("-") + "-" + hashlib.sha256(str(value).encode()).hexdigest()[:8]
    assert _DNS.fullmatch(v), v
    return v


def _quantity(size: str) -> str:
    """Docker's shm size (`32g`, `512m`, bytes) as a Kubernetes quantity (`32Gi`)."""
    m = re.fullmatch(r"(\d+)([bkmg]?)", str(size).strip().lower())
    if not m:
        raise K8sError(f"shm size {size!r}: not a size (e.g. 32g)")
    return m.group(1) + {"": "", "b": "", "k": "Ki", "m": "Mi", "g": "Gi"}[m.group(2)]


def sh_word(token: str) -> str:
    """One argv token for sh, with ${NODE_RANK} / ${MASTER_ADDR} expanded at run time and nothing else."""
    parts = [p for p in _VARS.split(token) if p]
    return "".join(f'"{p}"' if _VARS.fullmatch(p) else shlex.quote(p) for p in parts) or "''"


def _resolve_leader() -> list[str]:
    """The leader's stable DNS name (the headless Service's `<job>-0.<service>`, LWS's leader address) resolved to its
    IPv4 address before anything starts: vLLM's `--data-parallel-address` takes an IP, not a name (vllm-project/vllm
    issue 7118); the rendezvous and the preflight's EFA smoke get the same address. The name exists once the leader
    pod has an IP (publishNotReadyAddresses), so the lookup is retried RESOLVE_TRIES times RESOLVE_WAIT_S apart, then
    one line and exit 2 (`getent ahostsv4`: glibc's, in every image; IPv4 only, as EFA's NCCL bootstrap)."""
    return [
        "# the leader's address as an IP (vLLM's --data-parallel-address takes no DNS name: vllm issue 7118)",
        'i=0; while ip=$(getent ahostsv4 "$MASTER_ADDR" 2>/dev/null); ip=${ip%%[[:space:]]*}; [ -z "$ip" ]; do',
        f'  i=$((i + 1)); if [ "$i" -ge {RESOLVE_TRIES} ]; then echo "reprostack: the leader\'s name $MASTER_ADDR did '
        f"not resolve to an IPv4 address within {RESOLVE_TRIES * RESOLVE_WAIT_S} s (getent ahostsv4; the headless "
        'Service and its DNS): nothing was run" >&2; exit 2; fi',
        f"  sleep {RESOLVE_WAIT_S}",
        "done",
        'echo "reprostack: leader $MASTER_ADDR is $ip"; MASTER_ADDR="$ip"; export MASTER_ADDR',
    ]


def _script(plan: lp.LaunchPlan, variant: str, preflight: list[str] | None) -> str:
    """The pod's /bin/sh script: rank and master, soft limits, the preflight, then the agent under the pod's own time
    limit (`timeout`: the clock starts in the container, after the image pull), its output to the container log and
    to the contract's node log, SIGTERM passed on to it (sh is PID 1, which no signal kills by default), and this
    run's rc left where the contract says when the runtime could not write it."""
    rank = "LWS_WORKER_INDEX" if variant == "lws" else "JOB_COMPLETION_INDEX"
    o = plan.outputs
    out = next(m.target for m in plan.mounts if m.what == "out")
    lines = ["set -eu", f'NODE_RANK="${{{rank}}}"']
    if variant == "lws":
        lines.append('MASTER_ADDR="${LWS_LEADER_ADDRESS}"')
    lines.append("export NODE_RANK MASTER_ADDR")
    lines += _resolve_leader()
    flags = {"memlock": "-l", "stack": "-s"}
    for name, soft, _ in plan.ulimits:  # soft limits up to the node's hard ones (IPC_LOCK covers memlock)
        if name in flags:
            v = "unlimited" if soft < 0 else str(soft // 1024)
            lines.append(
                f"ulimit -S {flags[name]} {v} 2>/dev/null || "
                f'echo "reprostack: ulimit {name} stays $(ulimit -S {flags[name]})" >&2'
            )
    if preflight:
        lines.append(" ".join(sh_word(a) for a in preflight))
    cmds = {c.node: c for c in plan.commands}
    same = len({(c.argv, c.env) for c in plan.commands}) == 1
    limit = f"timeout --foreground -s TERM -k {KILL_AFTER_S} {int(plan.timeout_s)} "

    def run(c: lp.NodeCommand) -> str:
        env = "".join(f"{k}={sh_word(v)} " for k, v in c.env)
        return limit + ("env " + env if env else "") + " ".join(sh_word(a) for a in c.argv)

    if same:
        body = [run(plan.commands[0])]
    else:
        body = ['case "$NODE_RANK" in']
        body += [f"  {n}) {run(cmds[n])} ;;" for n in sorted(cmds)]
        body += ['  *) echo "reprostack: no command for node $NODE_RANK" >&2; exit 2 ;;', "esac"]
    log, rc = f"{out}/{o.node_log('${NODE_RANK}')}", f"{out}/{o.node_rc('${NODE_RANK}')}"
    lines += [
        f'mkdir -p {out}/{o.logs}; LOG="{log}"; RC="{rc}"',
        "set +e",
        # SIGTERM (the Job's deadline, a failed node's FailJob, a drain) to the agent, never to tee (the log's end)
        "trap 'trap \"\" TERM INT; kill -TERM 0 2>/dev/null' TERM INT",
        "{",
        *(f"  {b}" for b in body),
        '  echo "$?" > /tmp/reprostack-agent.rc',
        "} 2>&1 | (trap '' TERM INT; exec tee -a \"$LOG\") &",
        'pid=$!; wait "$pid"; while kill -0 "$pid" 2>/dev/null; do wait "$pid"; done',
        "rc=$(cat /tmp/reprostack-agent.rc 2>/dev/null || echo 143)",
        'read -r was id 2>/dev/null < "$RC"; [ "${id:-}" = "${RUN_ID:--}" ] || echo "$rc ${RUN_ID:--}" > "$RC"',
    ]
    if variant == "lws":  # a LeaderWorkerSet restarts a pod that exits: keep it, the reports are in the out folder
        lines += [
            f'echo "reprostack: the gate exited $rc; reports in {out}; delete the LeaderWorkerSet when read"',
            "exec sleep infinity",
        ]
    else:
        lines.append('exit "$rc"')
    return "\n".join(lines) + "\n"


def _volumes(plan: lp.LaunchPlan, out_pvc, out_hostpath, host_paths: dict[str, str]) -> tuple[list, list]:
    """(volumes, volumeMounts) of the pod: /dev/shm, the plan's mounts (the out dir a PVC or a hostPath, the others
    hostPaths) and the host devices every launcher maps (launch.plan.host_devices: GDRCopy's /dev/gdrdrv for a plan
    with EFA, a hostPath CharDevice as EKS GPU recipes map it). K8sError for a node path with a control character."""
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": _quantity(plan.shm_size)}}]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
    for flag, p in [*((f"--host-path {k}", v) for k, v in host_paths.items()), ("--out-hostpath", out_hostpath)]:
        if p is not None and re.search(r"[\x00-\x1f\x7f]", p):
            raise K8sError(f"{flag}: {p[:60]!r} holds a control character; refused")
    for m in plan.mounts:
        vol = dns1123(m.what or Path(m.target).name, "mount")
        if m.what == "out":
            if out_pvc:
                source = {"persistentVolumeClaim": {"claimName": dns1123(out_pvc, "--out-pvc", 253)}}
            else:
                source = {"hostPath": {"path": out_hostpath or m.source, "type": "DirectoryOrCreate"}}
        else:
            source = {"hostPath": {"path": host_paths.get(m.what, m.source), "type": "Directory"}}
        volumes.append({"name": vol, **source})
        mounts.append({"name": vol, "mountPath": m.target, **({"readOnly": True} if m.read_only else {})})
    for dev in lp.host_devices(plan):
        volumes.append({"name": dns1123(Path(dev).name, "device"), "hostPath": {"path": dev, "type": "CharDevice"}})
        mounts.append({"name": dns1123(Path(dev).name, "device"), "mountPath": dev})
    return volumes, mounts


def _security(plan: lp.LaunchPlan) -> dict:
    """The container's securityContext: IPC_LOCK (pinned memory), SYS_PTRACE; privileged when it maps a host device
    on the host network. A hostPath device node is outside the container's device cgroup (runc allows the runtime's
    and the device plugins' devices only): open(/dev/gdrdrv) is EPERM unless the container is privileged. The host
    network already needs the privileged Pod Security level; with --pod-network the preflight names the EPERM."""
    security: dict = {"capabilities": {"add": ["IPC_LOCK", "SYS_PTRACE"]}}
    if lp.host_devices(plan) and plan.host_network:
        security["privileged"] = True
    return security


def _check_image(image: str) -> None:
    """K8sError unless `image` is one image reference by digest (REPO@sha256:<64 hex>): a cluster never pulls a tag."""
    if _IMAGE.fullmatch(image or ""):
        return
    if re.search(r"@sha256:[0-9a-f]{64}$", image or ""):  # the digest is right: the name is what is refused
        raise K8sError(
            f"image {image!r}: the repository name is not a valid image reference (lowercase "
            f"letters, digits, '.', '_', '-', '/' and a registry ':port'; placeholders such as "
            f"ACCOUNT or REGION must be replaced), by digest: REPO@sha256:<64 hex>"
        )
    raise K8sError(
        f"image {image!r}: a cluster pulls by digest: REPO@sha256:<64 hex> (build and push the "
        f"image, then pass --image)"
    )


def _metadata(plan: lp.LaunchPlan, base: str) -> tuple[dict, dict]:
    """(labels, annotations) of every object: the run's name, gate and profile as labels; the lock's sha256, the
    image recipe (and base), the profile and the node count as annotations."""
    labels = {
        "app.kubernetes.io/name": "reprostack",
        "app.kubernetes.io/component": "gate",
        f"{LABEL}/gate": dns1123(plan.gate, "gate"),
        f"{LABEL}/profile": dns1123(plan.profile, "profile"),
        f"{LABEL}/run": base,
    }
    notes = {
        f"{LABEL}/lock-sha256": plan.lock_sha256,
        f"{LABEL}/image-recipe": plan.image.recipe,
        f"{LABEL}/profile": plan.profile,
        f"{LABEL}/nodes": str(plan.nodes),
    }
    if plan.image.base:
        notes[f"{LABEL}/image-base"] = plan.image.base
    return labels, notes


def _env(plan: lp.LaunchPlan, variant: str, image: str, base: str, port: int) -> list[dict]:
    """The container's env: the plan's, the image by digest, the run's id (downward API), the master (the leader's
    stable DNS name; LWS sets its own) and the rendezvous port."""
    master = {"job": f"{base}-0.{base}", "jobset": f"{base}-node-0-0.{base}", "lws": None}[variant]
    env = [{"name": k, "value": v} for k, v in plan.env]
    env += [{"name": "REPROSTACK_IMAGE", "value": image}]
    env += [{"name": "RUN_ID", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{RUN_ID_LABEL[variant]}']"}}}]
    if master:
        env += [{"name": "MASTER_ADDR", "value": master}]
    return env + [{"name": "MASTER_PORT", "value": str(port)}]


def _resources(plan: lp.LaunchPlan, gpus: bool) -> tuple[dict, dict]:
    """(limits, requests): the GPUs per node (GPU profiles), the EFA devices with the EFA device plugin's hugepages
    and memory request."""
    limits, requests = {}, {}
    if gpus and plan.gpus_per_node:
        limits[GPU] = plan.gpus_per_node
    if plan.efa_devices_per_node:
        limits[EFA] = plan.efa_devices_per_node
        limits[HUGEPAGES[0]] = requests[HUGEPAGES[0]] = HUGEPAGES[1]
        requests["memory"] = EFA_MEMORY_REQUEST
    return limits, requests


def _pod(plan: lp.LaunchPlan, variant: str, base: str, container: dict, volumes: list, node_selector) -> dict:
    """The pod spec around `container`: restart policy, grace period, one pod per node (anti-affinity), tolerations
    of the devices it requests, host network and IPC where the plan says, the node selector, the Job's subdomain."""
    limits = container.get("resources", {}).get("limits", {})
    pod = {
        "restartPolicy": "Never" if variant != "lws" else "Always",
        "terminationGracePeriodSeconds": GRACE_S,
        "containers": [container],
        "volumes": volumes,
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {f"{LABEL}/run": base}}, "topologyKey": "kubernetes.io/hostname"}
                ]
            }
        },
        "tolerations": [
            {"key": k, "operator": "Exists", "effect": "NoSchedule"}
            for k in ((GPU,) if GPU in limits else ()) + ((EFA,) if EFA in limits else ())
        ],
    }
    if not pod["tolerations"]:
        del pod["tolerations"]
    if plan.host_network:
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"  # the headless Service's names resolve from the host network
    if plan.host_ipc:
        pod["hostIPC"] = True
    if node_selector:
        pod["nodeSelector"] = dict(sorted(node_selector.items()))
    if variant == "job":
        pod["subdomain"] = base
    return pod


def _job_spec(plan: lp.LaunchPlan, template: dict) -> dict:
    """The Indexed Job's spec (the Job's, the JobSet's replicated Job's): N pods, no retry, the backstop deadline,
    the TTL, and a failure policy that fails the Job when a pod fails or is disrupted."""
    # the time limit is the pod's own (`timeout` in its script, from the container's start): the Job's deadline
    # counts from the Job's start, image pull included, so it is only a backstop PULL_S later
    deadline = int(plan.timeout_s) + PULL_S if plan.timeout_s else None
    return {
        "completionMode": "Indexed",
        "completions": plan.nodes,
        "parallelism": plan.nodes,
        "backoffLimit": 0,
        **({"activeDeadlineSeconds": deadline} if deadline else {}),
        "ttlSecondsAfterFinished": TTL_S,
        # a node that fails or is evicted fails the Job at once: the other pods get SIGTERM, node 0 reports ERROR
        # naming it (a lone replacement pod could never rejoin the run's rendezvous)
        "podFailurePolicy": {
            "rules": [
                # `status` is optional from Kubernetes 1.35 on and required before (1.31-1.34 refuse the Job)
                {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                {"action": "FailJob", "onExitCodes": {"containerName": "gate", "operator": "NotIn", "values": [0]}},
            ]
        },
        "template": template,
    }


def _objects(plan: lp.LaunchPlan, variant: str, base: str, labels: dict, notes: dict, pod: dict, port: int) -> list:
    """The variant's objects around the pod: Service + Job, a JobSet, or a LeaderWorkerSet."""
    meta = {"name": base, "labels": labels, "annotations": notes}
    template = {"metadata": {"labels": labels, "annotations": notes}, "spec": pod}
    if variant == "job":
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": base, "labels": labels},
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {f"{LABEL}/run": base},
                "ports": [{"name": "rendezvous", "port": port, "protocol": "TCP"}],
            },
        }
        return [service, {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": _job_spec(plan, template)}]
    if variant == "jobset":
        return [
            {
                "apiVersion": "jobset.x-k8s.io/v1alpha2",
                "kind": "JobSet",
                "metadata": meta,
                "spec": {
                    "network": {"enableDNSHostnames": True, "subdomain": base, "publishNotReadyAddresses": True},
                    "failurePolicy": {"maxRestarts": 0},
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "replicas": 1,
                            "template": {"metadata": {"labels": labels}, "spec": _job_spec(plan, template)},
                        }
                    ],
                },
            }
        ]
    return [
        {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": meta,
            "spec": {
                "replicas": 1,
                "startupPolicy": "LeaderCreated",
                "leaderWorkerTemplate": {
                    "size": plan.nodes,
                    "restartPolicy": "RecreateGroupOnPodRestart",
                    "workerTemplate": template,
                },
            },
        }
    ]


def render(
    plan: lp.LaunchPlan,
    *,
    image: str,
    variant: str = "job",
    name: str | None = None,
    gpus: bool = True,
    preflight: list[str] | None = None,
    out_pvc: str | None = PVC,
    out_hostpath: str | None = None,
    host_paths: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
    master_port: int | None = None,
) -> list[dict]:
    """The manifests of `plan` (see the module docstring). `image`: REPO@sha256:HEX; gpus=False: a CPU profile
    (no GPU request); `preflight`: its argv (reprostack.cluster.preflight.command) or None; the out dir is the
    PVC `out_pvc`, else the hostPath `out_hostpath`; `host_paths`: {mount what: node path} for the other mounts
    (default: the plan's source paths). Raises K8sError naming what Kubernetes would refuse."""
    if variant not in VARIANTS:
        raise K8sError(f"--variant {variant!r}: one of {', '.join(VARIANTS)}")
    if plan.mode != lp.MODE_CONTAINER:
        raise K8sError(f"gate {plan.gate}: a host-mode plan has no image to run on a cluster")
    _check_image(image)
    base = dns1123(name or f"rs-{plan.gate}-{plan.profile}", "name", MAX_NAME)
    labels, notes = _metadata(plan, base)
    from ..gates.plan import MASTER_PORT

    port = master_port or MASTER_PORT
    limits, requests = _resources(plan, gpus)
    volumes, mounts = _volumes(plan, out_pvc, out_hostpath, host_paths or {})
    container = {
        "name": "gate",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", _script(plan, variant, preflight)],
        "workingDir": plan.workdir,
        "env": _env(plan, variant, image, base, port),
        "securityContext": _security(plan),
        "volumeMounts": mounts,
    }
    resources = {k: v for k, v in (("limits", limits), ("requests", requests)) if v}
    if resources:
        container["resources"] = resources
    pod = _pod(plan, variant, base, container, volumes, node_selector)
    return _objects(plan, variant, base, labels, notes, pod, port)


def agent_plan(g, root: Path, lock, plan: lp.LaunchPlan, nodes: int, master_port: int | None = None) -> lp.LaunchPlan:
    """`plan` with, on every node, the gate's in-image runner in host mode (gates.container.inner_argv: node 0
    parses and writes the reports), this node's rank and the master from the launcher, reprostack from the
    project mount (/workspace/src), the timeout of every arm plus the container slack
    and the preflight's."""
    from ..gates.container import CONTAINER_SLACK_S, inner_argv
    from ..gates.options import GateOptions
    from ..gates.plan import MASTER_PORT, OUT, WORK
    from . import preflight

    a = GateOptions(
        out=Path(OUT),
        profile=plan.profile,
        nodes=nodes,
        node_rank="${NODE_RANK}",
        run_id="${RUN_ID}",
        master_addr="${MASTER_ADDR}",
        master_port=master_port or MASTER_PORT,
    )
    spec: Spec = g.load(root)  # the image's prebuilt kernels for a gate that takes them (never a node-side rebuild)
    argv = tuple(inner_argv(g, a, lock, kernels=bool(g.kernels.prebuilt(spec))))
    runs = g.launcher.launches(spec, a)
    env = tuple(sorted({**dict(plan.env), "PYTHONPATH": f"{WORK}/src", "PYTHONUNBUFFERED": "1"}.items()))
    cmds = tuple(lp.NodeCommand(n, "leader" if n == 0 else "worker", argv) for n in range(nodes))
    return dataclasses.replace(
        plan,
        nodes=nodes,
        commands=cmds,
        env=env,
        workdir=WORK,
        timeout_s=plan.timeout_s * runs + CONTAINER_SLACK_S + preflight.TIMEOUT_S,
    )


def dump(docs: list[dict], header: str) -> str:
    """YAML of `docs` (no anchors; multi-line strings, the pod's script, as literal blocks)."""
    import json

    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):
            return True

    def text(dumper, s):
        return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)

    Dumper.add_representer(str, text)
    return header + "".join(
        ("---\n" if i else "") + yaml.dump(json.loads(json.dumps(d)), Dumper=Dumper, sort_keys=False, width=120)
        for i, d in enumerate(docs)
    )


def write(docs: list[dict], out: Path, header: str) -> list[Path]:
    """One file per manifest, `<kind>.yaml` (lowercase), written atomically; returns the paths."""
    from ..atomicfile import write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    return [write_text_atomic(out / f"{d['kind'].lower()}.yaml", dump([d], header)) for d in docs]
