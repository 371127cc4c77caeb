"""The Kubernetes manifest of a gate profile started by MPI (gates.fabric_mpi.MpiLaunch: the fabric gate across nodes):
an MPIJob of the Kubeflow MPI operator (kubeflow.org/v2beta1), as operators run nccl-tests on EKS
(awsome-distributed-training micro-benchmarks/nccl-tests/kubernetes/nccl-tests.yaml).

`mpijob(job, launch, ...)` is pure: the Indexed Job cluster.k8s renders for the profile (its pod: the image by
digest, GPUs, EFA devices, hugepages, /dev/shm, IPC_LOCK, the out volume and the plan's mounts) in, the MPIJob out:
- Worker: `nodes` replicas of that pod (one per node, its anti-affinity kept), each running sshd (the operator's
  launcher reaches its workers over SSH with the key it mounts at /root/.ssh): host keys made at start (the image has
  none: containers.debsbase removes them), `StrictModes no` (the mounted key's modes); no host network (sshd's port
  22 would be the node's);
- Launcher: one pod of the same image without GPUs or EFA (mpirun and the judge only), after the workers are ready
  (launcherCreationPolicy WaitForWorkersReady); its script runs each test with the image's mpirun by absolute path
  (its prefix on the workers too), `-np ranks -N ranks-per-node --bind-to none`, every rank's env forwarded with `-x`,
  under the step's time limit, into `<out>/<LOGS>/<test>.log` and `<test>.rc` (`RC RUN_ID`: the launcher Job's
  uid), then the in-image runner with `--launched-logs` (node 0: it writes the report), its output teed into node
  0's log; the pod's exit status is the runner's.
- runPolicy: backoffLimit 0, cleanPodPolicy Running (the workers stop when the launcher ends), the Job's TTL and
  deadline.

How it is validated offline: the MPI operator's CRD is not a Kubernetes built-in (kubernetes-validate has no schema
for it) and is upstream text this project does not copy. Its pod templates are validated as Pods with
kubernetes-validate at every Kubernetes minor the tests take; its own fields against SPEC_FIELDS, the field names of
the v2beta1 CRD (kubeflow/mpi-operator v0.8.0, commit 101db144e019e1de65aaded07745e9d805c2852a,
manifests/base/kubeflow.org_mpijobs.yaml: openAPIV3Schema spec, runPolicy, mpiReplicaSpecs.*), read there.

Invariants: nothing here reads or runs the cluster; the same inputs give the same dict; each token of the launcher's
script is quoted by the caller's `sh` (cluster.k8s's quoting: only ${RUN_ID}/${NODE_RANK}/${MASTER_ADDR} expand).
"""

from __future__ import annotations

import copy
from pathlib import Path

API = "kubeflow.org/v2beta1"
MPIRUN = "/opt/reprostack/openmpi/bin/mpirun"  # containers/substrate: Open MPI; by absolute path = --prefix
SSH_DIR = "/root/.ssh"
# kubeflow/mpi-operator v0.8.0 manifests/base/kubeflow.org_mpijobs.yaml (v2beta1): the fields an MPIJob may set
SPEC_FIELDS = {
    "spec": {
        "launcherCreationPolicy",
        "mpiImplementation",
        "mpiReplicaSpecs",
        "runLauncherAsWorker",
        "runPolicy",
        "slotsPerWorker",
        "sshAuthMountPath",
    },
    "runPolicy": {
        "activeDeadlineSeconds",
        "backoffLimit",
        "cleanPodPolicy",
        "managedBy",
        "schedulingPolicy",
        "suspend",
        "ttlSecondsAfterFinished",
    },
    "replicaSpec": {"replicas", "restartPolicy", "template"},
}
# the launcher's ssh to the workers: the operator's own ConnectionAttempts, and no prompt for a host key the launcher
# has never seen (each worker makes its host keys at start)
RSH_ARGS = "-o ConnectionAttempts=10 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
WORKER = "ssh-keygen -A >/dev/null && mkdir -p /run/sshd && exec /usr/sbin/sshd -De -o StrictModes=no"
KILL_AFTER_S = 60


def launcher_script(launch, judge: list[str], *, out: str, sh, node_log: str) -> str:
    """The launcher's /bin/sh script: each MPI step, then the judge (`judge`: the in-image runner's argv)."""
    names = sorted({k for k, _ in launch.env} | {"PATH", "LD_LIBRARY_PATH", "PYTHONPATH"})
    fwd = " ".join(f"-x {n}" for n in names)
    logs = f"{out}/{launch.logs}"
    lines = ["set -eu", "NODE_RANK=0", "export NODE_RANK"]
    lines += [f"export {k}={sh(v)}" for k, v in launch.env]
    lines += [f"mkdir -p {sh(logs)} {sh(f'{out}/logs')}", "set +e"]
    for s in launch.steps:
        lines += [
            f"# {s.test}: {launch.ranks} ranks",
            f"timeout -s TERM -k {KILL_AFTER_S} {int(launch.timeout_s)} {MPIRUN} --allow-run-as-root "
            f"-np {launch.ranks} -N {launch.ranks_per_node} --bind-to none --mca plm_rsh_args {sh(RSH_ARGS)} {fwd} "
            + " ".join(sh(a) for a in s.argv)
            + f" > {sh(f'{out}/{s.log}')} 2>&1",
            f'echo "$? ${{RUN_ID:--}}" > {sh(f"{out}/{s.rc}")}',
        ]
    lines += [
        "# the report: the in-image runner judges what the steps above wrote (--launched-logs)",
        "{ " + " ".join(sh(a) for a in judge) + '; echo "$?" > /tmp/reprostack-agent.rc; } 2>&1 | '
        f"tee -a {sh(f'{out}/{node_log}')}",
        "rc=$(cat /tmp/reprostack-agent.rc 2>/dev/null || echo 1)",
        'exit "$rc"',
    ]
    return "\n".join(lines) + "\n"


def judge_argv(g, lock, plan, out: str) -> list[str]:
    """The in-image runner that judges the launch (node 0 of `plan`'s nodes, --launched-logs <out>/<LOGS>): the
    runner every pod of cluster.k8s's Job runs, as gates.container.inner_argv makes it."""
    from ..gates.container import inner_argv
    from ..gates.fabric_mpi import LOGS
    from ..gates.options import GateOptions
    from ..gates.plan import MASTER_PORT

    a = GateOptions(
        out=Path(out),
        profile=plan.profile,
        nodes=plan.nodes,
        node_rank=0,
        run_id="${RUN_ID}",
        master_port=MASTER_PORT,
        launched_logs=f"{out}/{LOGS}",
    )
    return list(inner_argv(g, a, lock))


def mpijob(job: dict, launch, *, judge: list[str], sh, plan) -> dict:
    """The MPIJob of `launch` from cluster.k8s's Indexed Job `job` of the same (agent) `plan` (module doc)."""
    out = next(m.target for m in plan.mounts if m.what == "out")
    node_log = plan.outputs.node_log(0)
    pod = job["spec"]["template"]
    worker = copy.deepcopy(pod)
    ws = worker["spec"]
    for k in ("subdomain", "hostNetwork", "dnsPolicy"):
        ws.pop(k, None)
    wc = ws["containers"][0]
    wc["name"] = "worker"
    wc["command"] = ["/bin/sh", "-c", WORKER]
    launcher = copy.deepcopy(pod)
    ls = launcher["spec"]
    for k in ("subdomain", "hostNetwork", "dnsPolicy", "affinity", "tolerations", "hostIPC"):
        ls.pop(k, None)
    lc = ls["containers"][0]
    lc["name"] = "launcher"
    lc.pop("resources", None)
    lc["command"] = ["/bin/sh", "-c", launcher_script(launch, judge, out=out, sh=sh, node_log=node_log)]
    run_policy = {"backoffLimit": 0, "cleanPodPolicy": "Running"}
    for k in ("ttlSecondsAfterFinished", "activeDeadlineSeconds"):
        if k in job["spec"]:
            run_policy[k] = job["spec"][k]
    return {
        "apiVersion": API,
        "kind": "MPIJob",
        "metadata": copy.deepcopy(job["metadata"]),
        "spec": {
            "slotsPerWorker": launch.ranks_per_node,
            "runPolicy": run_policy,
            "sshAuthMountPath": SSH_DIR,
            "mpiImplementation": "OpenMPI",
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": "Never", "template": launcher},
                "Worker": {"replicas": launch.nodes, "restartPolicy": "Never", "template": worker},
            },
        },
    }
