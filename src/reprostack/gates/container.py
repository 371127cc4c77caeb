"""Container mode: `reprostack gate G --container` runs the gate inside an image through the docker SDK.

The container runs the in-image runner in host mode (`python3 -m reprostack gate G --no-container --out /out
...` with the operator's options), this node's part of the gate's launch plan (reprostack.gates.plan): the out
dir mounted read-write at /out, the lock's folder read-only at /workspace, reprostack's own package read-only at
/opt/reprostack/code (on PYTHONPATH: the code that runs is this checkout's), GPUs as a device request when the
profile needs them (none when the engine has no NVIDIA runtime: the in-image runner then finds no GPU and the gate is
a SKIP, `execution.no_gpus` saying why), every `/dev/infiniband/uverbs*` of this host when it needs EFA, the plan's ulimits, shm, host
network and IPC. The image: `--image IMAGE`, else the recipe's id recorded by the last `reprostack build` here
(out/build/images.json). reprostack.launch.docker streams the output into the output contract's node log (`<out>/logs/node-<N>.log`) with a
`[node N]` prefix and stops the container at the timeout (the spec's watchdog per run, plus CONTAINER_SLACK_S).

The report the container wrote through the mount is input from the container, read back like any untrusted
file: at most MAX_REPORT_BYTES, valid against report.schema.json, the gate's own name, started after the
container did (a report left by an earlier run stays until this one replaces it, and one not rewritten is
never taken), every artifact a relative path inside the out dir whose bytes have the recorded sha256. A bad report is
one GateError line naming it (exit 2); a container that wrote none is the gate's ERROR naming its exit code (or
the timeout), its last output line and the log.

A gate that takes its kernels prebuilt (Gate.kernels, gates.kerneluse: micro, megatron) runs with
`--kernels-manifest /opt/reprostack/kernels.json`: it takes the
image's prebuilt NCCL and DeepEP after checking that manifest against the lock (reprostack.kernels.prebuilt), and
fetches and builds nothing; a missing or mismatching manifest ends the in-image runner with that one line (the
gate's ERROR here names it). Its report's `provenance.kernels_from` (mode "image", manifest and its sha256)
gets the image id, and `execution.kernels` says the same.

`provenance.execution` then says where it ran: {"mode": "container", "image" (recipe), "image_ref" (as asked),
"image_id", "repo_digests", "lock_sha256", "image_lock_sha256" (the image's label), "container" (id, exit code,
timed out), "host" (driver and EFA devices of this host), "inner" (the in-image runner's own execution record:
its interpreter fingerprint inside the image)}.

Invariants: `--profile` is required (the container's devices follow from it, never guessed); no engine is one
GateError line before anything runs, never a silent fall back to host mode; the
container is always removed (reprostack.launch.docker); nothing outside `<out>` is written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from glob import glob
from pathlib import Path, PurePosixPath

from .. import hostinfo
from ..digest import sha256_file
from ..errors import GateError, ReprostackError
from ..kernels.prebuilt import MANIFEST
from ..launch import plan as lp
from ..lock import Lock
from ..report import GateReport, Result, utc_now, validate_report
from .base import OUT, WORK, Gate, RunContext
from .options import GateOptions
from .spec import HardwareProfile, Spec

CODE = "/opt/reprostack/code"  # reprostack's package (this checkout's), read-only, on PYTHONPATH
CONTAINER_SLACK_S = 600.0  # image start, AIPerf set-up and the report, beyond the gate's watchdog
MAX_REPORT_BYTES = 64 << 20
L_IMAGE, L_LOCK = "dev.reprostack.image", "dev.reprostack.lock-sha256"


def _client():
    from ..containers.engine import connect

    try:
        return connect()
    except ReprostackError as e:
        raise GateError(
            f"--container: {e} (or run on this host with --no-container: the report then says host mode)"
        ) from None


def inner_argv(g: Gate, opts: GateOptions, lock, *, kernels: bool = False) -> list[str]:
    """The in-image runner's command: this gate in host mode with the operator's options (GateOptions.runner_argv),
    paths inside the image; `kernels` (a gate that takes its kernels prebuilt): `--kernels-manifest` MANIFEST."""
    return opts.runner_argv(
        g.name, out=OUT, lock=f"{WORK}/{Path(lock.path).name}", kernels=MANIFEST if kernels else None
    )


def host_record() -> dict:
    """This host's side of a container run: NVIDIA driver, EFA devices and the efa module's version."""
    gpus, notes = hostinfo.gpus()
    efa, _ = hostinfo.rdma_devices()
    try:
        efa_version = Path("/sys/module/efa/version").read_text().strip()
    except OSError:
        efa_version = None
    return {
        "driver_version": gpus[0]["driver_version"] if gpus else None,
        "gpus": len(gpus),
        "efa_devices": [d["name"] for d in efa],
        "efa_driver_version": efa_version,
        **({"notes": notes} if notes and not gpus else {}),
    }


def _host_memlock(ulimits: tuple) -> tuple:
    """`ulimits` with this host's memlock limit: a run with no GPU and no EFA pins no memory (an engine in a sandbox
    may not raise memlock to the campaign's unlimited, which EFA and NCCL need)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return tuple((n, soft, hard) if n == "memlock" else (n, s, h) for n, s, h in ulimits)


def _engine_gpu_runtime(client) -> str | None:
    """None when the engine can give a container GPUs (an NVIDIA runtime registered: `docker info`'s Runtimes),
    else why not. Without one the engine refuses any GPU request, so the container runs with no GPU and the
    in-image runner finds none: the gate ends SKIP (never PASS) after checking the image's kernels against the
    lock, and `execution.no_gpus` says why it had none."""
    import docker.errors

    try:
        runtimes = client.info().get("Runtimes") or {}
    except (docker.errors.DockerException, AttributeError):
        return None  # cannot tell: ask for the GPUs, and the engine's own refusal is the error
    if "nvidia" in runtimes:
        return None
    return f"the engine has no NVIDIA runtime (runtimes: {', '.join(sorted(runtimes)) or 'none'}): no GPU to give"


def _image(client, ref: str, recipe: str):
    import docker.errors

    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        raise GateError(
            f"--container: image {ref} is not on this engine (build it with `reprostack build "
            f"{recipe}` or name one with --image)"
        ) from None
    except docker.errors.APIError as e:
        raise GateError(f"--container: the engine cannot inspect image {ref}: {e.explanation or e}") from None


def container_plan(
    g: Gate, a: GateOptions, lock: Lock, root: Path, image_ref: str | None
) -> tuple[lp.LaunchPlan, HardwareProfile]:
    """(plan, profile) of this node's container: the gate's plan with the in-image runner as its command."""
    from .plan import gate_plan

    spec: Spec = g.load(root)
    if not a.profile:  # the container's GPUs, EFA devices and limits follow from the profile: never guessed
        raise GateError(
            f"--container needs --profile (one of {', '.join(spec.profiles)} in {spec.path.name}): "
            f"the container's GPUs and EFA devices follow from it"
        )
    plan = gate_plan(g, root, lock, profile=a.profile, out_dir=a.out_dir, options=a)
    prof = spec.profile(plan.profile)
    ref = image_ref or plan.image.image_id or plan.image.tag
    if not ref:
        raise GateError(
            f"--container: image {plan.image.recipe} (gate {g.name}'s `image:`) is not built on this "
            f"machine (`reprostack build {plan.image.recipe}`), or name one with --image"
        )
    import reprostack

    mounts = [m for m in plan.mounts if m.what in ("out", "project")]
    mounts.append(lp.Mount(str(Path(reprostack.__file__).resolve().parent), f"{CODE}/reprostack", what="code"))
    env = {"PYTHONPATH": CODE, "PYTHONUNBUFFERED": "1"}
    models = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    if g.serves and models.is_dir():
        mounts.append(lp.Mount(str(models.resolve()), "/models", what="models"))
        env["HF_HOME"] = "/models"
    ulimits = plan.ulimits
    if not prof.needs_gpu and not plan.efa_devices_per_node:
        ulimits = _host_memlock(ulimits)
    timeout = (a.timeout or plan.timeout_s) * g.launcher.launches(spec, a) + CONTAINER_SLACK_S
    cmd = lp.NodeCommand(
        a.node_rank,
        "leader" if a.node_rank == 0 else "worker",
        tuple(inner_argv(g, a, lock, kernels=bool(g.kernels.prebuilt(spec)))),
        tuple(sorted(env.items())),
    )
    plan = dataclasses.replace(
        plan,
        image=dataclasses.replace(plan.image, tag=ref),
        commands=(cmd,),
        mounts=tuple(mounts),
        workdir=WORK,
        timeout_s=timeout,
        ulimits=ulimits,
    )
    return plan, prof


def run_in_container(g: Gate, a: GateOptions, ctx: RunContext, *, client=None) -> GateReport:
    """Run gate `g` in its container and return the report it wrote, stamped (see the module docstring)."""
    from ..launch.docker import run_node

    lock = ctx.lock
    plan, prof = container_plan(g, a, lock, Path(ctx.root), a.image)
    client = client or _client()
    image = _image(client, plan.image.tag, plan.image.recipe)
    engine_gpus = _engine_gpu_runtime(client)
    needs_gpu = prof.needs_gpu and plan.gpus_per_node > 0 and engine_gpus is None
    efa = sorted(glob(f"{lp.EFA_DEVICE_DIR}/uverbs*")) if plan.efa_devices_per_node else []
    if prof.needs_gpu and not needs_gpu and not efa:  # no GPU to give and no EFA: nothing pins memory
        plan = dataclasses.replace(plan, ulimits=_host_memlock(plan.ulimits))
    out = a.out_dir
    out.mkdir(parents=True, exist_ok=True)
    report_path = out / f"{g.report_name}.json"
    stale = _stat(report_path)  # an earlier run's report: kept until this one replaces it, never read back
    started = utc_now()
    t0 = time.monotonic()
    run = run_node(client, plan, a.node_rank, out, efa_devices=efa, gpus=needs_gpu)
    execution = {
        "mode": "container",
        "image": (image.labels or {}).get(L_IMAGE) or plan.image.recipe,
        "image_ref": a.image or plan.image.tag,
        "image_id": run.image_id,
        "repo_digests": list(run.repo_digests),
        "lock_sha256": lock.sha256,
        "image_lock_sha256": (image.labels or {}).get(L_LOCK),
        "container": run.provenance(),
        "log": str(run.log),
        "host": host_record(),
        "ulimits": {n: [s, h] for n, s, h in plan.ulimits},
        "gpus": needs_gpu,
        **({"no_gpus": engine_gpus} if prof.needs_gpu and engine_gpus else {}),
        "efa_devices": efa,
    }
    written = report_path.is_file() and _stat(report_path) != stale
    if run.timed_out or not written:
        why = (
            f"killed at the timeout of {plan.timeout_s:g} s"
            if run.timed_out
            else f"exited {run.exit_code} without writing {report_path.name}"
        )
        last = _last_line(run.log)
        why += f" (its last line: {last})" if last else ""
        rep = GateReport(
            g.report_name,
            plan.profile,
            Result.ERROR,
            f"the gate's container {why}; log {run.log}",
            started=started,
            ended=utc_now(),
            duration_s=round(time.monotonic() - t0, 3),
        )
        rep.provenance["execution"] = execution
        return rep
    return _stamped(read_report(report_path, g.report_name, started, out), execution, run)


def _stamped(rep: GateReport, execution: dict, run) -> GateReport:
    """The report the in-image runner wrote, its `execution` the container's (the runner's own record under
    `inner`), its prebuilt kernels tied to the image id that ran."""
    inner = rep.provenance.get("execution")
    if isinstance(inner, dict) and inner.get("mode") == "host":  # host mode as seen from inside the image
        inner["note"] = "the in-image runner's own record: the interpreter that ran the gate inside the image"
    execution["inner"] = inner
    kf = rep.provenance.get("kernels_from")
    if isinstance(kf, dict) and kf.get("mode") == "image":  # the in-image runner used the image's kernels
        kf.update(image_id=run.image_id, image_ref=execution["image_ref"])
        execution["kernels"] = {
            "mode": "prebuilt",
            "image_id": run.image_id,
            "manifest": kf.get("manifest"),
            "manifest_sha256": kf.get("manifest_sha256"),
        }
    rep.provenance["execution"] = execution
    return rep


def _stat(path: Path):
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _last_line(log: Path) -> str:
    """The container's last non-empty output line (prefix removed, at most 300 characters), or ""."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = [x for x in f.read().decode(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return lines[-1].partition("] ")[2].strip()[:300] if lines else ""


def read_report(path: Path, gate: str, not_before: str, out_dir: Path) -> GateReport:
    """The report a container wrote at `path`, checked (see the module docstring); GateError naming it otherwise."""
    import jsonschema

    def bad(why: str):
        return GateError(f"{path}: the report the gate's container wrote {why}")

    try:
        size = path.stat().st_size
        if size > MAX_REPORT_BYTES:
            raise bad(f"is {size} bytes (more than {MAX_REPORT_BYTES})")
        d = json.loads(path.read_bytes())
    except OSError as e:
        raise bad(f"cannot be read: {e.strerror or e}") from None
    except ValueError as e:
        raise bad(f"is not JSON: {e}") from None
    try:
        validate_report(d)
    except jsonschema.ValidationError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(top)"
        raise bad(f"is not a gate report: {where}: {e.message[:200]}") from None
    if d["gate"] != gate:
        raise bad(f"is for gate {d['gate']!r}, not {gate!r}")
    if (d.get("started") or "") < not_before:
        raise bad(f"started {d.get('started')}, before this run's container ({not_before}): not this run's report")
    rep = GateReport.from_dict(d)
    root = out_dir.resolve()
    for a in rep.artifacts:
        p = PurePosixPath(a.path)
        f = (root / a.path).resolve()
        if p.is_absolute() or ".." in p.parts or not f.is_relative_to(root) or not f.is_file():
            raise bad(f"names artifact {a.path!r}, not a file inside {out_dir}")
        if sha256_file(f) != a.sha256:
            raise bad(f"names artifact {a.path} with sha256 {a.sha256}; the file there has {sha256_file(f)}")
    return rep
