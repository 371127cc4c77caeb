"""Launch one node of a gate's launch plan in its image through the docker SDK.

`run_node(client, plan, node, out_dir)` starts the container that `plan.docker_run_kwargs` describes, streams its
output line by line into the output contract's node log (`<out_dir>/logs/node-<N>.log`, launch.plan.Outputs) with a `[node N]` prefix, stops it at the plan's timeout (SIGKILL
after a grace period; the container and every process in it go, no setsid escapes a container), removes it, and
returns what ran: the image id and repo digests the engine reports for the image it started, the exit code, the
log and whether it timed out. The report records these as provenance (image id == what was built or pulled).

Invariants:
- the image must exist locally before the run: a launch never pulls (a pull by digest is `reprostack build` /
  `--load`'s job, which checks digests); a missing image is a LaunchError naming it, nothing is started;
- a container is always removed, on success, failure, timeout or an exception while streaming;
- the log is written as the container prints (line buffered), so a killed run keeps what it printed;
- a plan with EFA gets the host's GDRCopy device (/dev/gdrdrv, launch.plan.host_devices) as docker `devices`.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ReprostackError
from .plan import LaunchPlan, docker_run_kwargs, host_devices

GRACE_S = 10


class LaunchError(ReprostackError):
    """A gate container could not be started (missing image, engine refused the options)."""


@dataclass(frozen=True)
class NodeRun:
    node: int
    exit_code: int | None  # None: killed at the timeout
    timed_out: bool
    log: Path
    image_id: str
    repo_digests: tuple[str, ...]
    container_id: str
    seconds: float

    def provenance(self) -> dict:
        return {
            "node": self.node,
            "image_id": self.image_id,
            "repo_digests": list(self.repo_digests),
            "container_id": self.container_id,
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
        }


def _run_kwargs(
    client, plan: LaunchPlan, node: int, *, efa_devices, gpu_ids, gpus: bool, gdrdrv
) -> tuple[dict, object]:
    """(docker run options, the local image) of node `node`: the plan's options, no GPU request for a CPU profile,
    the host's GDRCopy device where the plan has EFA, the image by its id; LaunchError when the engine lacks it."""
    import docker.errors

    kwargs = docker_run_kwargs(plan, node, efa_devices=efa_devices, gpu_ids=gpu_ids)
    if not gpus:
        kwargs["device_requests"] = []
    for target in host_devices(plan):  # GDRCopy's device: GIN on EFA needs it in the container
        source = gdrdrv or target
        if os.path.exists(source):
            kwargs["devices"].append(f"{source}:{target}:rwm")
    try:
        image = client.images.get(kwargs["image"])
    except docker.errors.ImageNotFound:
        raise LaunchError(
            f"gate {plan.gate}: image {kwargs['image']} is not on this engine "
            f"(build it with `reprostack build {plan.image.recipe}` or load it with "
            f"`reprostack build --load FILE`)"
        ) from None
    kwargs["image"] = image.id
    return kwargs, image


def _stop_at(container, timeout_s: float, grace_s: float, done: threading.Event) -> threading.Event:
    """Start a thread that stops `container` (SIGTERM, SIGKILL after `grace_s`) unless `done` is set within
    `timeout_s` (none when <= 0); returns the event it sets when it did."""
    import docker.errors

    timed_out = threading.Event()

    def watchdog():
        if not done.wait(timeout_s if timeout_s > 0 else None):
            timed_out.set()
            try:
                container.stop(timeout=grace_s)  # SIGTERM, then SIGKILL after the grace period
            except docker.errors.APIError:
                pass

    threading.Thread(target=watchdog, daemon=True).start()
    return timed_out


def _stream(container, log: Path, node: int) -> None:
    """The container's output, line by line with a `[node N]` prefix, into `log` as it prints (line buffered)."""
    with open(log, "w", buffering=1, errors="replace") as f:
        pending = b""
        for chunk in container.logs(stream=True, follow=True, stdout=True, stderr=True):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                f.write(f"[node {node}] {line.decode(errors='replace')}\n")
        if pending:
            f.write(f"[node {node}] {pending.decode(errors='replace')}\n")


def run_node(
    client,
    plan: LaunchPlan,
    node: int,
    out_dir: Path,
    *,
    efa_devices: list[str] | None = None,
    gpu_ids: list[str] | None = None,
    gpus: bool = True,
    grace_s: float = GRACE_S,
    gdrdrv: str | None = None,
) -> NodeRun:
    """Run node `node` of `plan` to completion or its timeout (see the module docstring).

    gpus=False drops the GPU device request (CPU profiles such as the serving gate's local-test: the engine
    refuses a GPU request on a host without the NVIDIA runtime); grace_s: seconds between SIGTERM and SIGKILL at
    the timeout; gdrdrv: the host's GDRCopy device to map at /dev/gdrdrv for a plan with EFA (None: /dev/gdrdrv when
    the host has it; without it the preflight and the gate's GIN init name what is missing). Raises LaunchError
    before anything runs."""
    import docker.errors

    kwargs, image = _run_kwargs(client, plan, node, efa_devices=efa_devices, gpu_ids=gpu_ids, gpus=gpus, gdrdrv=gdrdrv)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / plan.outputs.node_log(node)  # the output contract's node log
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        container = client.containers.run(**kwargs)
    except docker.errors.APIError as e:
        raise LaunchError(
            f"gate {plan.gate}: the engine refused node {node}'s container: {e.explanation or e}"
        ) from None
    done = threading.Event()
    timed_out = _stop_at(container, plan.timeout_s, grace_s, done)
    try:
        _stream(container, log, node)
        status = container.wait()
        code = None if timed_out.is_set() else int(status.get("StatusCode", -1))
    finally:
        done.set()
        try:
            container.remove(force=True)
        except docker.errors.APIError:
            pass
    return NodeRun(
        node,
        code,
        timed_out.is_set(),
        log,
        image.id,
        tuple(image.attrs.get("RepoDigests") or ()),
        container.id,
        round(time.monotonic() - t0, 2),
    )
