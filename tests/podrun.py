"""Run the pods of a rendered Kubernetes Indexed Job as containers on the local Docker engine (the rehearsal's
cluster, tests/test_rehearsal.py): what a kubelet would start, taken from the manifests and nothing else.

From the Job: each index's container (its image replaced by a local one: no registry here), command and args,
workingDir, env (`value`s, and the downward API fields the pod spec asks for: the Job's controller uid label and the
pod name), JOB_COMPLETION_INDEX (what the Job controller sets in an Indexed Job's pods), the volumes (hostPath as a
bind mount, a PersistentVolumeClaim as a folder the caller names, an emptyDir of medium Memory as a tmpfs), the
capabilities, a hostPath of type CharDevice as a docker device (a stand-in character device where this host has none),
terminationGracePeriodSeconds (docker stop's timeout); from the Service: the headless name each pod
answers to, `<job>-<index>.<service>` (hostNetwork: every pod on the host network, the names pointing at this host;
otherwise one Docker network for the pods, each pod's hostname `<job>-<index>` and its alias the Service name).
What a kubelet does and this does not: resources (GPUs, EFA devices, hugepages: there are none here), scheduling,
restarts, the Job's deadlines and failure policy (read by the tests from the manifests instead).
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Pods:
    """The containers of one Job run: `containers[index]`, `uid` (the Job's controller uid), the network."""

    client: object
    job: str
    containers: dict = field(default_factory=dict)
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    network: object = None
    grace_s: int = 30

    def wait(self, timeout_s: float = 120) -> dict[int, int]:
        """{index: exit code} once every started container ended (TimeoutError naming those still running)."""
        deadline = time.monotonic() + timeout_s
        codes = {}
        for i, c in self.containers.items():
            left = max(1.0, deadline - time.monotonic())
            try:
                codes[i] = c.wait(timeout=left)["StatusCode"]
            except Exception as e:  # requests' ReadTimeout
                raise TimeoutError(f"pod {self.job}-{i} still running after {timeout_s} s: {e}") from None
        return codes

    def logs(self, i: int) -> str:
        return self.containers[i].logs().decode(errors="replace")

    def stop(self, i: int) -> None:
        """What a kubelet does to a pod it terminates: SIGTERM, SIGKILL after the grace period."""
        self.containers[i].stop(timeout=self.grace_s)

    def remove(self) -> None:
        for c in self.containers.values():
            try:
                c.remove(force=True)
            except Exception:
                pass
        if self.network is not None:
            try:
                self.network.remove()
            except Exception:
                pass


def _field(path: str, *, job: str, index: int, uid: str) -> str:
    m = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
    if m and m.group(1) in ("batch.kubernetes.io/controller-uid", "controller-uid"):
        return uid
    if m and m.group(1) == "batch.kubernetes.io/job-completion-index":
        return str(index)
    if path == "metadata.name":
        return f"{job}-{index}-{uid[:5]}"
    raise ValueError(f"downward API field {path!r}: not one this runner knows")


def run_job(
    client,
    job: dict,
    service: dict | None,
    *,
    image: str,
    pvcs: dict[str, Path],
    indexes=None,
    extra_env: dict | None = None,
    stand_in_devices: dict[str, str] | None = None,
) -> Pods:
    """Start the pods `indexes` (default: every completion index) of the Indexed Job `job` (module doc).
    `stand_in_devices`: {a hostPath CharDevice's node path: this host's character device standing in for it} (this
    CPU machine has no /dev/gdrdrv); a CharDevice hostPath that is no character device here fails as the kubelet's
    type check fails the pod."""
    name = job["metadata"]["name"]
    spec = job["spec"]
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    pods = Pods(client, name, grace_s=int(pod.get("terminationGracePeriodSeconds", 30)))
    host_net = bool(pod.get("hostNetwork"))
    svc = service["metadata"]["name"] if service else None
    if svc and pod.get("subdomain") != svc:
        raise ValueError(f"pod subdomain {pod.get('subdomain')!r} is not the Service {svc!r}: no DNS name")
    names = {i: f"{name}-{i}" + (f".{svc}" if svc else "") for i in range(spec["completions"])}
    if not host_net:
        pods.network = client.networks.create(f"rs-pods-{pods.uid[:8]}", driver="bridge")
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    try:
        for i in indexes if indexes is not None else range(spec["completions"]):
            env = {"JOB_COMPLETION_INDEX": str(i)}
            for e in c.get("env", []):
                if "value" in e:
                    env[e["name"]] = e["value"]
                else:
                    env[e["name"]] = _field(e["valueFrom"]["fieldRef"]["fieldPath"], job=name, index=i, uid=pods.uid)
            env.update(extra_env or {})
            mounts, tmpfs, devices = [], {}, []
            from docker.types import Mount

            for m in c.get("volumeMounts", []):
                v = vols[m["name"]]
                ro = bool(m.get("readOnly"))
                if "emptyDir" in v:
                    size = v["emptyDir"].get("sizeLimit", "64Mi").replace("Gi", "g").replace("Mi", "m")
                    tmpfs[m["mountPath"]] = f"size={size}"
                elif v.get("hostPath", {}).get("type") == "CharDevice":  # a device node: docker maps it as one
                    src = (stand_in_devices or {}).get(v["hostPath"]["path"], v["hostPath"]["path"])
                    if not Path(src).is_char_device():
                        raise ValueError(f"hostPath {src}: type check failed: not a character device (the pod fails)")
                    devices.append(f"{src}:{m['mountPath']}:rwm")
                elif "hostPath" in v:
                    mounts.append(Mount(m["mountPath"], v["hostPath"]["path"], type="bind", read_only=ro))
                elif "persistentVolumeClaim" in v:
                    src = pvcs[v["persistentVolumeClaim"]["claimName"]]
                    mounts.append(Mount(m["mountPath"], str(src), type="bind", read_only=ro))
                else:
                    raise ValueError(f"volume {m['name']}: a kind this runner does not mount")
            caps = c.get("securityContext", {}).get("capabilities", {}).get("add", [])
            kw = dict(
                image=image,
                command=[*c["command"], *c.get("args", [])],
                environment=env,
                working_dir=c.get("workingDir"),
                mounts=mounts,
                tmpfs=tmpfs,
                cap_add=caps or None,
                devices=devices or None,
                detach=True,
                labels={"dev.reprostack.rehearsal": name},
            )
            if host_net:
                kw.update(network_mode="host", extra_hosts={n: "127.0.0.1" for n in names.values()})
            else:
                kw.update(hostname=f"{name}-{i}", network=pods.network.name)
            ctr = client.containers.create(**kw)
            if not host_net:
                pods.network.disconnect(ctr)
                pods.network.connect(ctr, aliases=[names[i], f"{name}-{i}"])
            ctr.start()
            pods.containers[i] = ctr
    except Exception:
        pods.remove()
        raise
    return pods


def _fails_job(rules: list, code: int) -> bool:
    for r in rules:
        on = r.get("onExitCodes")
        if r.get("action") != "FailJob" or not on:
            continue
        inside = code in on.get("values", [])
        if inside == (on.get("operator") == "In"):
            return True
    return False


def run_policy(pods: Pods, job: dict, timeout_s: float = 120) -> dict[int, int]:
    """Wait for the pods as the Job controller would: a pod whose exit code matches a FailJob rule of the Job's
    podFailurePolicy fails the Job, and the controller terminates the pods still running (SIGTERM, then the grace
    period). Returns {index: exit code}."""
    rules = job["spec"].get("podFailurePolicy", {}).get("rules", [])
    deadline = time.monotonic() + timeout_s
    codes: dict[int, int] = {}
    failed = False
    while len(codes) < len(pods.containers):
        if time.monotonic() > deadline:
            raise TimeoutError(f"pods {sorted(set(pods.containers) - set(codes))} still running after {timeout_s} s")
        for i, c in pods.containers.items():
            if i in codes:
                continue
            c.reload()
            if c.status == "exited":
                codes[i] = c.attrs["State"]["ExitCode"]
                if not failed and _fails_job(rules, codes[i]):
                    failed = True
                    for j in pods.containers:
                        if j not in codes:
                            pods.stop(j)
        time.sleep(0.3)
    return codes


Pods.run_policy = run_policy
