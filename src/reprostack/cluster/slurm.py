"""A gate's launch plan as ONE sbatch script (pure: plan -> text; rendering runs nothing and needs no Slurm);
cluster.slurm_submit hands a script to sbatch and follows the job to its end.

The script (`render(plan, options)`):
- `#SBATCH --nodes=N --ntasks-per-node=1 --exclusive --wait-all-nodes=1`, the partition, `--gpus-per-node` (GPU
  profiles), `--time` from the plan's watchdog (x arms, + the container slack of gates.container), `--signal=TERM@300`
  (every task of the steps gets SIGTERM 5 min before the limit: node 0 stops and still writes its report), the batch
  log in the out dir;
- checks it runs from the project root it was rendered for (`upstreams.lock` of the submit dir has the plan's
  sha256), then takes the rendezvous from Slurm only: master = the NodeAddr of the first host of
  `scontrol show hostnames "$SLURM_JOB_NODELIST"`, node rank = SLURM_NODEID (nothing hand-typed);
- first srun step (unless `preflight=False`): `reprostack preflight` (contract item 4) on every node; a failing
  preflight ends the job with its exit code before anything else runs;
- one srun step, one task per node, that starts the per-node agent in the gate's image: the in-image runner of
  gates.container (`python3 -m reprostack gate G --no-container ... --node-rank $SLURM_NODEID --master-addr
  $MASTER_ADDR --run-id $SLURM_JOB_ID`), which runs the plan's per-node command (listed as comments); the output
  contract (LaunchPlan.outputs): every node writes its rank logs and its rc (`RC JOB_ID`) into the one out dir, node 0
  waits for them and alone writes the gate's report; `srun --kill-on-bad-exit=1` with workers' tasks ending 0 (their
  status is in their rc file), so the step ends when node 0 ended badly, after its report, and not before;
- runtimes: `pyxis` (srun --container-image = the image by digest, else its enroot squashfs, or with --enroot-import
  DIR the image by digest imported once per node into DIR/<digest>.sqsh for enroot 3.x: cluster.enroot; --container-mounts
  from the plan's mounts, and GDRCopy's /dev/gdrdrv for a plan with EFA: launch.plan.host_devices), `enroot` (create + start a squashfs made from `reprostack build --save`), `docker`
  (docker run per node with the plan's devices, ulimits, shm, host network/IPC), `host` (no runtime: this
  checkout on each node's own packages; labelled host mode in the script and, by the runner, in the report);
- per-node logs `<out>/logs/node-R.log` (srun --output with %n); the job's exit status = node 0's rc, else the
  first failing worker's (named on stderr), a node without this job's rc counting as a failure.

- a serving gate's models folder: `--models DIR`, else the submitter's HF_HOME, taken into MODELS before the plan's
  env sets HF_HOME=/models for inside the container, and mounted read-only at /models.

Invariants: every interpolated value is shell-quoted (shlex.quote, by cluster.slurm_words) or a fixed word; a
value from the lock or a gate spec that cannot be carried safely (a control character, an env name that is not a shell name) is a
SlurmRenderError naming it, and nothing is written; so is an operator's path with a character its consumer splits
on (`,` and `:` in a mount spec, `%` in `#SBATCH --output`) or an image that is not one reference, and the paths only
the job knows (project, out, models) are checked the same way by the script before any srun. Paths in the script are relative to the submit dir unless the
operator gave absolute ones, so a committed example stays valid on any checkout.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from functools import partial
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from ..launch import plan as lp
from . import enroot, slurm_mpi

if TYPE_CHECKING:
    from ..gates.fabric_mpi import MpiLaunch
    from ..gates.spec import HardwareProfile, Spec
from .slurm_words import (  # noqa: F401 (re-exported: the quoting and checks of every value)
    JOBV,
    MASTER,
    OUTV,
    RANK,
    WORKV,
    SlurmRenderError,
    checked,
    env_name,
    image_arg,
    path_arg,
    word,
    words,
)

RUNTIMES = ("pyxis", "enroot", "docker", "host")
CODE = "/opt/reprostack/code"  # as gates.container: this checkout's package, on PYTHONPATH in the image
IN_OUT, IN_WORK = "/out", "/workspace"
SLACK_S = 600.0  # image start, AIPerf set-up and the report (gates.container's slack)
# seconds before the time limit at which every task of the job's steps gets SIGTERM (`#SBATCH --signal`, no `B:`:
# the steps, not the batch shell): node 0's runtime stops its run and still writes the gate's report
SIGNAL_S = 300


@dataclass(frozen=True)
class SlurmOptions:
    """nodes: must equal the plan's; out: the out dir as the job sees it (relative: to the submit dir);
    lock_name: the lock's file name in the project root; image: an image ref that overrides the plan's;
    sqsh: the enroot squashfs (default out/images/<recipe>.sqsh); agent: the in-image runner's argv (placeholders
    RANK/MASTER/OUTV/WORKV for the per-node values); cache: host mode's --cache (None: the runner's default)."""

    nodes: int
    out: str
    agent: tuple[str, ...]
    partition: str | None = None
    runtime: str = "pyxis"
    preflight: bool = True
    image: str | None = None
    sqsh: str | None = None
    lock_name: str = "upstreams.lock"
    runs: int = 1  # the gate's sequential runs (arms): the time limit covers them all
    needs_gpu: bool = True
    job_name: str | None = None
    models: str | None = None  # a serving gate's models folder on the nodes (None: the submitter's HF_HOME)
    mpi: MpiLaunch | None = None  # the MPI launch of a profile started by MPI (cluster.slurm_mpi)
    enroot_import: str | None = None  # pyxis on enroot 3.x: import by digest into this folder (cluster.enroot)


def _time(seconds: float) -> str:
    m = max(1, math.ceil(seconds / 60))
    return f"{m // 1440}-{m % 1440 // 60:02d}:{m % 60:02d}:00"


def _image_word(plan: lp.LaunchPlan, o: SlurmOptions) -> tuple[str | None, str]:
    """(ref, how) of the image for the container runtimes: --image, else the repo digest, else the image id."""
    img = plan.image
    ref = o.image or img.repo_digest or img.image_id
    how = "--image" if o.image else "repo digest" if img.repo_digest else "image id" if img.image_id else ""
    return ref, how


def _mounts(plan: lp.LaunchPlan) -> list[tuple[str, str, bool]]:
    """(source as a shell word, target, read-only) of the container's mounts: the plan's, with host paths the job
    knows (out dir, project root, models) instead of the paths of the machine that rendered it, plus the code."""
    out = []
    for m in plan.mounts:
        src = {"out": '"${OUT}"', "project": '"${PROJECT}"', "models": '"${MODELS}"'}.get(m.what) or word(
            m.source, f"mount {m.what}"
        )
        out.append((src, checked(m.target, f"mount {m.what}"), m.read_only))
    out.append(('"${PROJECT}"/src/reprostack', f"{CODE}/reprostack", True))
    return out


def _checked_options(plan: lp.LaunchPlan, o: SlurmOptions) -> tuple[str, str, str]:
    """(gate, job name word, out dir) once every option and every value of the plan is one the script can carry;
    else the SlurmRenderError of the first that is not, before any text exists."""
    if o.runtime not in RUNTIMES:
        raise SlurmRenderError(f"--runtime {o.runtime!r}: one of {', '.join(RUNTIMES)}")
    if o.nodes != plan.nodes:
        raise SlurmRenderError(
            f"--nodes {o.nodes}: profile {plan.profile} of gate {plan.gate} spans {plan.nodes} "
            f"node(s) ({plan.gpus_per_node} GPU(s) each); name a profile with {o.nodes} node(s)"
        )
    if o.runtime != "host" and plan.image is None:
        raise SlurmRenderError(f"gate {plan.gate}: a host-mode plan has no image; use --runtime host")
    if o.mpi is not None and o.runtime != "pyxis":
        raise SlurmRenderError(slurm_mpi.refusal(o.runtime, plan))
    _validate(plan)
    gate = checked(plan.gate, "gate")
    job = word(o.job_name or f"rs-{gate}", "--job-name")
    out_s = path_arg(o.out, "--out", percent=True)
    if o.image:
        image_arg(o.image)
    if o.sqsh:
        path_arg(o.sqsh, "--sqsh")
    if o.enroot_import is not None:  # pyxis only, a folder a mount spec keeps whole, the image by digest: or one line
        enroot.check(o.runtime, path_arg(o.enroot_import, "--enroot-import"), _image_word(plan, o)[0])
    if o.models is not None and not any(m.what == "models" for m in plan.mounts):
        raise SlurmRenderError(f"--models: gate {plan.gate} serves no model (only the serving gates mount one)")
    if o.models is not None and o.runtime == "host":
        raise SlurmRenderError("--models: the host runtime mounts nothing (each node's engine reads its own HF_HOME)")
    if o.models is not None:
        path_arg(o.models, "--models")
    return gate, job, out_s


def _sbatch_header(plan: lp.LaunchPlan, o: SlurmOptions, gate: str, job: str, outdir: PurePosixPath) -> list[str]:
    """The script's head: what it runs, how to submit it, the #SBATCH options and the launch plan as comments."""
    L = [
        "#!/bin/bash",
        f"# reprostack: gate {gate} [{checked(plan.profile, 'profile')}], {plan.nodes} node(s) x "
        f"{plan.gpus_per_node} GPU(s) = EP{plan.ep_size}, runtime {o.runtime}"
        + (
            " (HOST MODE: each node's own packages, not the pinned image; the report says so)"
            if o.runtime == "host"
            else ""
        ),
        "# rendered by `reprostack launch slurm` from the gate's launch plan; submit from the project root:",
        f"#   mkdir -p {word(str(outdir / 'logs'))} && sbatch THIS_FILE   (or `reprostack launch slurm ... --submit`)",
        f"#SBATCH --job-name={job}",
        f"#SBATCH --nodes={plan.nodes}",
        f"#SBATCH --ntasks-per-node={o.mpi.ranks_per_node if o.mpi is not None else 1}",
        "#SBATCH --exclusive",
        # every node booted before the script starts (awsome-distributed-training's sbatch files, e.g.
        # micro-benchmarks/nccl-tests/slurm/nccl-tests-container.sbatch: --wait-all-nodes=1)
        "#SBATCH --wait-all-nodes=1",
        f"#SBATCH --signal=TERM@{SIGNAL_S}",
    ]
    if o.partition:
        L.append(f"#SBATCH --partition={word(o.partition, '--partition')}")
    if o.needs_gpu and plan.gpus_per_node:
        L.append(f"#SBATCH --gpus-per-node={plan.gpus_per_node}")
    timeout = (plan.timeout_s or 3600.0) * max(1, o.runs) + SLACK_S
    L += [
        f"#SBATCH --time={_time(timeout)}",
        f"#SBATCH --output={word(str(outdir / 'logs' / 'batch-%j.log'))}",
        f"#SBATCH --error={word(str(outdir / 'logs' / 'batch-%j.log'))}",
        "#",
        "# the launch plan (reprostack.launch.plan), for the reader:",
    ]
    return L + [f"#   {checked(line, 'plan')}" for line in plan.lines() if not line.startswith("mount ")]  # host paths


def _job_setup(plan: lp.LaunchPlan, o: SlurmOptions, out_s: str, models_mount: bool) -> list[str]:
    """The batch shell's set-up: the project root checked against the lock's sha256, the out dir (and the models
    folder) the job knows, checked as the launcher checks the paths it was given, the rendezvous from Slurm, the
    plan's env."""
    outdir = PurePosixPath(out_s)
    L = [
        "set -euo pipefail",
        'PROJECT="${SLURM_SUBMIT_DIR:-$PWD}"',
        f"OUT={word(out_s) if outdir.is_absolute() else chr(34) + '${PROJECT}' + chr(34) + '/' + word(out_s)}",
        f"LOCK_SHA256={word(plan.lock_sha256 or '-', 'lock sha256')}",
        f"have=$(sha256sum \"${{PROJECT}}\"/{word(o.lock_name, 'lock')} 2>/dev/null | cut -d' ' -f1 || true)",
        'if [ "${have}" != "${LOCK_SHA256}" ]; then',
        f'  echo "reprostack: ${{PROJECT}}/{checked(o.lock_name, "lock")}: sha256 ${{have:-missing}}, this script '
        'was rendered for ${LOCK_SHA256}: submit from that project root or render again" >&2',
        "  exit 2",
        "fi",
    ]
    if models_mount:  # before the plan's env: it sets HF_HOME=/models for inside the container
        L += [
            "# the models folder on the nodes, mounted read-only at /models (HF_HOME inside); --models DIR names it",
            "MODELS="
            + (
                (word(o.models) if o.models.startswith("/") else '"${PROJECT}"/' + word(o.models))
                if o.models
                else '"${HF_HOME:-${HOME}/.cache/huggingface}"'
            ),
            'if [ ! -d "${MODELS}" ]; then echo "reprostack: models folder ${MODELS}: not a folder on this node" >&2; '
            "exit 2; fi",
        ]
    mounted = '"${PROJECT}${OUT}' + ('${MODELS}"' if models_mount else '"')
    L += [
        "export PROJECT OUT" + (" MODELS" if models_mount else "") + "   # the tasks below expand them",
    ]
    if o.runtime != "host":  # the paths only the job knows, checked as the launcher checks the ones it was given
        L += [
            f"case {mounted} in *[,:]*) echo \"reprostack: the project, out or models path holds ',' or ':', which "
            'the container mounts split on; refused" >&2; exit 2;; esac',
        ]
    L += [
        'mkdir -p "${OUT}/logs"',
        "# rendezvous from Slurm: the first node of the allocation is the leader (node rank = SLURM_NODEID)",
        'MASTER_NODE=$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | head -n 1)',
        'MASTER_ADDR=$(scontrol show node "${MASTER_NODE}" | sed -n "s/.*NodeAddr=\\([^ ]*\\).*/\\1/p")',
        'export MASTER_ADDR="${MASTER_ADDR:-${MASTER_NODE}}"',
        f"export MASTER_PORT={word(_master_port(o.agent))}",
    ]
    if plan.env:
        L.append("# the plan's env (the runner sets the gate's own env again for each process it starts)")
        L += [f"export {env_name(k, 'plan env')}={word(v, f'env {k}')}" for k, v in plan.env]
    return L


def _preflight_step(plan: lp.LaunchPlan, o: SlurmOptions, srun: list[str]) -> list[str]:
    """Step 1: `reprostack preflight` on every node (its log per node); a failing node ends the job."""
    from ..gates.registry import gate as gate_named  # the CLI's name (nemo-rl), not the report's (nemo_rl)

    pre = [
        "python3",
        "-m",
        "reprostack",
        "preflight",
        gate_named(plan.gate).name,
        "--out",
        OUTV,
        "--nodes",
        str(plan.nodes),
        "--node-rank",
        RANK,
        "--profile",
        plan.profile,
        "--lock",
        f"{WORKV}/{o.lock_name}",
    ]
    return [
        "# step 1: the cross-node preflight (same lock and image on every node, GPUs, EFA, provider efa, clocks,",
        "# ports); a failing node is named in its log and nothing else runs",
        " ".join(srun + ['--output="${OUT}"/' + word(f"{plan.outputs.logs}/preflight-node-%n.log")]) + " \\",
        "  " + _task(plan, o, pre, per_node_out=False),
    ]


def render(plan: lp.LaunchPlan, o: SlurmOptions) -> str:
    """The sbatch script of `plan` (see the module docstring). Raises SlurmRenderError before any text exists."""
    gate, job, out_s = _checked_options(plan, o)
    models_mount = o.runtime != "host" and any(m.what == "models" for m in plan.mounts)
    L = _sbatch_header(plan, o, gate, job, PurePosixPath(out_s))
    L += _job_setup(plan, o, out_s, models_mount)
    L += _runtime_setup(plan, o)
    srun = ["srun", f"--nodes={plan.nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=0"]
    o_ = plan.outputs
    logs = '--output="${OUT}"/' + word(o_.node_log("%n"), "node log")
    if o.enroot_import is not None:  # step 0 on enroot 3.x: every node has the image by digest as a squashfs
        imported = '"${OUT}"/' + word(f"{o_.logs}/import-node-%n.log")
        L += enroot.import_step(_image_word(plan, o)[0], o.enroot_import, srun=srun, output=imported, word=word)
    if o.preflight:
        L += _preflight_step(plan, o, srun)
    if o.mpi is not None:  # the ranks started by MPI, then node 0 judges what they wrote (cluster.slurm_mpi)
        return "\n".join(L + slurm_mpi.lines(o.mpi, word, partial(_task, plan, o), o.agent, o_.node_log(0)))
    gate_srun = [*srun[:-1], "--kill-on-bad-exit=1"]  # node 0 ends the step once it has reported (workers exit 0)
    L += [
        "# the gate: one task per node, the per-node agent in the image; the output contract (launch.plan.Outputs):",
        f"# {o_.describe()}",
        "set +e",
        " ".join(gate_srun + [logs]) + " \\",
        "  " + _task(plan, o, list(o.agent), per_node_out=True),
        "rc=$?",
        "set -e",
        *_job_exit(o_, gate),
        "",
    ]
    return "\n".join(L)


def _job_exit(o_: lp.Outputs, gate: str) -> list[str]:
    """The job's exit status from the nodes' rc files of this job: node 0's, else a worker's failure, named."""
    rc_file = word(o_.node_rc("NODE")).replace("NODE", '"$1"')
    log = o_.node_log("${n}")
    return [
        "# the job's exit status: node 0's rc; a worker's failure is never hidden behind it",
        f'rc_of() {{ local w id; read -r w id 2>/dev/null < "${{OUT}}"/{rc_file} || return 1; '
        '[ "${id}" = "${SLURM_JOB_ID}" ] || return 1; echo "${w}"; }',
        "if r=$(rc_of 0); then rc=${r}; else",
        f'  echo "reprostack: node 0 wrote no rc for job ${{SLURM_JOB_ID}} (its log: ${{OUT}}/{o_.node_log(0)})" >&2',
        '  [ "${rc}" != 0 ] || rc=1',
        "fi",
        f"for n in $(seq 1 {o_.nodes - 1}); do",
        '  if r=$(rc_of "${n}"); then',
        f'    [ "${{r}}" = 0 ] || {{ echo "reprostack: node ${{n}} exit ${{r}} (its log: ${{OUT}}/{log})" >&2; '
        '[ "${rc}" != 0 ] || rc=${r}; }',
        "  else",
        f'    echo "reprostack: node ${{n}} wrote no rc for job ${{SLURM_JOB_ID}} (its log: ${{OUT}}/{log})" >&2',
        '    [ "${rc}" != 0 ] || rc=1',
        "  fi",
        "done",
        'echo "reprostack: gate ' + gate + " job ${SLURM_JOB_ID}: exit ${rc}; report in ${OUT}, "
        "per-node logs in ${OUT}/" + o_.logs + '"',
        'exit "${rc}"',
    ]


def _validate(plan: lp.LaunchPlan) -> None:
    """Every value of the plan that reaches the script, checked once, named (spec env, commands, image, mounts)."""
    for k, v in plan.env:
        env_name(k, "plan env")
        checked(v, f"env {k}")
    for c in plan.commands:
        for k, v in c.env:
            checked(f"{k}={v}", f"node {c.node} env")
        for a in c.argv:
            checked(a, f"node {c.node} command")
    if plan.image is not None:
        checked(plan.image.describe(), "image")
    for m in plan.mounts:
        checked(m.target, f"mount {m.what}")
    for n in plan.notes:
        checked(n, "plan note")


def _master_port(agent) -> str:
    a = list(agent)
    return a[a.index("--master-port") + 1] if "--master-port" in a else str(29500)


IMAGE_FROM = "# image from: "  # the script's one line saying where the job's image comes from (launch prints it)


def image_from(text: str) -> str | None:
    """What a rendered script says of its image (the IMAGE_FROM line), for the CLI to print; None without one."""
    return next((line[len(IMAGE_FROM) :] for line in text.splitlines() if line.startswith(IMAGE_FROM)), None)


def _image_from(plan: lp.LaunchPlan, o: SlurmOptions, ref: str | None, how: str, sqsh: str) -> str:
    """Where the job's image comes from, in words: the --image, the built image's digest or id (out/build/images.json),
    or the enroot squashfs that must exist before the job runs and how it is made."""
    recipe = plan.image.recipe
    if o.runtime == "docker":
        if ref:
            return f"{ref} ({how}); every node must hold it (reprostack build --load FILE)"
        return f"{plan.image.tag} (its tag: image {recipe} is not built here); every node must hold it"
    if o.runtime == "pyxis" and ref and o.enroot_import is not None:
        return f"{ref} ({how}), imported by digest into {o.enroot_import}/<digest>.sqsh on each node (enroot 3.x)"
    if o.runtime == "pyxis" and ref:
        return f"{ref} ({how}{', out/build/images.json' if how != '--image' else ''})"
    built = "" if plan.image.image_id else f" (image {recipe} is not built here: `reprostack build {recipe}` first)"
    return (
        f"the enroot squashfs {sqsh}, which must exist before the job runs: made from image {recipe} with "
        f"`reprostack build {recipe} --save` and `enroot import` (the script's comment){built}; or --image REF"
    )


def _runtime_setup(plan: lp.LaunchPlan, o: SlurmOptions) -> list[str]:
    if o.runtime == "host":
        return [
            f"{IMAGE_FROM}none: host mode, each node's own packages (not the pinned image)",
            "# host mode: this checkout's reprostack on each node's own python (REPROSTACK_PYTHON, default python3)",
            'if [ -d "${PROJECT}/src/reprostack" ]; then export PYTHONPATH="${PROJECT}/src${PYTHONPATH:+:${PYTHONPATH}}"; fi',
        ]
    ref, how = _image_word(plan, o)
    recipe = checked(plan.image.recipe, "image recipe")
    sqsh = o.sqsh or f"out/images/{recipe}.sqsh"
    out = [
        f"# image: {checked(plan.image.describe(), 'image')}",
        IMAGE_FROM + checked(_image_from(plan, o, ref, how, sqsh), "image"),
    ]
    if o.runtime == "docker":
        if not ref and not plan.image.tag:
            raise SlurmRenderError(
                f"gate {plan.gate}: image {recipe} is not built here (no id or digest in "
                f"out/build/images.json): `reprostack build {recipe}` first, or --image REF"
            )
        return out + [
            f"export IMAGE={word(ref or plan.image.tag, 'image')}   # {how or 'tag'}; every node must hold it "
            "(`reprostack build --load FILE`)"
        ]
    if o.runtime == "pyxis" and ref:  # with --enroot-import, IMAGE is the squashfs its step makes (cluster.enroot)
        return out + ([] if o.enroot_import is not None else [f"export IMAGE={word(ref, 'image')}   # {how}"])
    made = f"dockerd://{plan.image.image_id}" if plan.image.image_id else f"dockerd://<the id of {recipe}>"
    out += [
        "# the image as an enroot squashfs, made once on a node with docker and enroot:",
        f"#   reprostack build {recipe} --save out/images/{recipe}.tar   (then on that node: "
        f"reprostack build --load out/images/{recipe}.tar)",
        f"#   enroot import -o {checked(sqsh, '--sqsh')} {checked(made, 'image id')}",
        f"export SQSH={word(sqsh, '--sqsh') if sqsh.startswith('/') else chr(34) + '${PROJECT}' + chr(34) + '/' + word(sqsh, '--sqsh')}",
        'if [ ! -f "${SQSH}" ]; then echo "reprostack: ${SQSH}: no such squashfs (see the comment above)" >&2; '
        "exit 2; fi",
    ]
    if o.runtime == "pyxis":
        out.append('export IMAGE="${SQSH}"')
    return out


def _task(plan: lp.LaunchPlan, o: SlurmOptions, argv: list[str], *, per_node_out: bool) -> str:
    """The task each node runs: `bash -c` of the per-node command (paths of the runtime; workers' out dir apart),
    wrapped in the runtime. Returns one shell line."""
    host = o.runtime == "host"
    pre = ['RS_OUT="${OUT}"; RS_WORK="${PROJECT}"' if host else f"RS_OUT={IN_OUT}; RS_WORK={IN_WORK}"]
    if o.runtime == "pyxis":  # pyxis gives the container the submitter's PYTHONPATH over srun's --export value
        pre.insert(0, f"export PYTHONPATH={CODE} PYTHONUNBUFFERED=1")  # (results/rehearsal/pyxis.md): set it inside
    o_ = plan.outputs
    if per_node_out:
        # the time limit's SIGTERM (`#SBATCH --signal`) reaches every process of the step: this shell waits for the
        # runtime (which stops its run and writes its report and rc) instead of dying first (a trap, not an ignore:
        # the runtime's processes keep the default SIGTERM)
        pre.append(f'trap : TERM INT; mkdir -p "${{RS_OUT}}"/{word(o_.logs)}')
    cmd = words(argv, "agent")
    if host:
        cmd = '"${REPROSTACK_PYTHON:-python3}"' + cmd[len("python3") :] if cmd.startswith("python3 ") else cmd
    inner = "; ".join(pre) + "; " + cmd
    if per_node_out:  # the runtime wrote this job's rc; if it could not, its exit status goes there instead
        f = '"${RS_OUT}"/' + word(o_.node_rc("NODE")).replace("NODE", '"${SLURM_NODEID}"')
        inner += (
            f"; rc=$?; read -r was id 2>/dev/null < {f}; "
            f'[ "${{id:-}}" = "${{SLURM_JOB_ID}}" ] || echo "${{rc}} ${{SLURM_JOB_ID}}" > {f}; '
            # a worker's task ends 0 (its status is its rc file): srun --kill-on-bad-exit=1 then stops the step
            # only when node 0 has ended badly, after its report
            '[ "${SLURM_NODEID}" = 0 ] || exit 0; exit "${rc}"'
        )
    inner_q = shlex.quote(inner)
    mounts = _mounts(plan)
    if o.runtime == "host":
        return f"bash -c {inner_q}"
    env_names = ["SLURM_NODEID", "MASTER_ADDR", "MASTER_PORT", *(k for k, _ in plan.env)]
    devs = lp.host_devices(plan)  # GDRCopy's /dev/gdrdrv for a plan with EFA (GIN opens it in the container)
    if o.runtime == "pyxis":
        spec = ",".join([*(f"{s}:{t}{':ro' if ro else ''}" for s, t, ro in mounts), *(f"{d}:{d}" for d in devs)])
        return (
            f'--container-image="${{IMAGE}}" --container-mounts={spec} --container-workdir={word(plan.workdir)} '
            f"--no-container-mount-home --export=ALL,PYTHONPATH={CODE},PYTHONUNBUFFERED=1 bash -c {inner_q}"
        )
    if o.runtime == "enroot":
        ms = " ".join(
            [*(f"--mount {s}:{t}" + (":ro" if ro else "") for s, t, ro in mounts), *(f"--mount {d}:{d}" for d in devs)]
        )
        es = " ".join(f"--env {n}" for n in env_names)
        run = (
            # this shell waits through the time limit's SIGTERM too (the runtime inside writes its report)
            f'trap : TERM INT; n=rs-${{SLURM_JOB_ID}}-${{SLURM_NODEID}}; enroot create --force --name "$n" "${{SQSH}}" && '
            f"{{ PYTHONPATH={CODE} PYTHONUNBUFFERED=1 enroot start --rw {ms} {es} --env PYTHONPATH "
            f'--env PYTHONUNBUFFERED "$n" bash -c {inner_q}; rc=$?; enroot remove --force "$n"; exit $rc; }}'
        )
        return f"bash -c {shlex.quote(run)}"
    # docker run per node
    ms = " ".join(f"-v {s}:{t}" + (":ro" if ro else "") for s, t, ro in mounts)
    es = " ".join(f"-e {n}" for n in env_names)
    cpu_only = not (o.needs_gpu and plan.gpus_per_node) and not plan.efa_devices_per_node
    uls = " ".join(
        f"--ulimit {word(n)}={s}:{h}" for n, s, h in plan.ulimits if not (cpu_only and n == "memlock")
    )  # as gates.container: a CPU profile pins no memory
    gpus = "--gpus all " if o.needs_gpu and plan.gpus_per_node else ""
    run = (
        'efa=(); for d in /dev/infiniband/uverbs*; do [ -e "$d" ] && efa+=(--device="$d"); done; '
        + "".join(f"efa+=(--device={d}); " for d in devs)
        + f'exec docker run --rm --name rs-${{SLURM_JOB_ID}}-${{SLURM_NODEID}} {gpus}"${{efa[@]}}" '
        f"--network {'host' if plan.host_network else 'none'} {'--ipc host ' if plan.host_ipc else ''}"
        f"--cap-add IPC_LOCK --shm-size {word(plan.shm_size)} {uls} {ms} -w {word(plan.workdir)} {es} "
        f'-e PYTHONPATH={CODE} -e PYTHONUNBUFFERED=1 "${{IMAGE}}" bash -c {inner_q}'
    )
    return f"bash -c {shlex.quote(run)}"


def agent_argv(g, a, lock, *, host: bool, cache: str | None, kernels: bool = False) -> tuple[str, ...]:
    """The per-node agent: gates.container's in-image runner command (`python3 -m reprostack gate G --no-container
    ...`) for GateOptions `a`, with the node rank and master address left to each task (RANK / MASTER) and its paths
    as the runtime sees them (OUTV, WORKV); host mode keeps the operator's --cache (None: the runner's default)."""
    import dataclasses
    from ..gates.container import inner_argv

    argv = inner_argv(  # in an image: its prebuilt kernels (`kernels`), as `gate G --container` takes them
        g, dataclasses.replace(a, node_rank=RANK, master_addr=MASTER, run_id=JOBV), lock, kernels=kernels and not host
    )
    lock_in = f"{IN_WORK}/{PurePosixPath(str(lock.path)).name}"
    out = [OUTV if x == IN_OUT else WORKV + x[len(IN_WORK) :] if x == lock_in else x for x in argv]
    if host:
        i = out.index("--cache")
        out[i : i + 2] = ["--cache", cache] if cache else []
    return tuple(out)


def script_for(
    g,
    root,
    lock,
    *,
    nodes: int,
    out: str,
    profile: str | None = None,
    runtime: str = "pyxis",
    partition: str | None = None,
    preflight: bool = True,
    image: str | None = None,
    sqsh: str | None = None,
    arms: list[str] | None = None,
    cache: str | None = None,
    images_json=None,
    master_port: int | None = None,
    models: str | None = None,
    enroot_import: str | None = None,
) -> str:
    """The sbatch script of gate `g` (a gates.registry.Gate) for `profile` (default: the published p5en one):
    its plan from gates.plan.gate_plan, the agent from gates.container.inner_argv, rendered. images_json: the
    build summary that names the image id (default: out/build/images.json of `root`; the committed examples are
    rendered without one). Raises ReprostackError (bad spec, profile or value) before anything is written."""
    from pathlib import Path

    from ..gates.options import GateOptions
    from ..gates.plan import MASTER_PORT, gate_plan

    root = Path(root)
    plan = gate_plan(g, root, lock, profile=profile, out_dir=root / out, images_json=images_json)
    spec: Spec = g.load(root)
    prof: HardwareProfile = spec.profile(plan.profile)
    why = g.launcher.unrenderable(spec, prof)
    if why:
        raise SlurmRenderError(f"gate {g.name}: {why}")
    mpi = g.launcher.mpi_launch(spec, prof)
    ga = GateOptions(
        out=Path(IN_OUT),
        profile=plan.profile,
        nodes=plan.nodes,
        master_port=master_port or MASTER_PORT,
        arms=tuple(arms or ()),
        launched_logs=f"{IN_OUT}/{mpi.logs}" if mpi else None,
    )
    agent = agent_argv(
        g,
        ga,
        lock,
        host=runtime == "host",
        cache=cache if runtime == "host" else None,
        kernels=bool(g.kernels.prebuilt(spec)),
    )
    runs = g.launcher.launches(spec, ga)
    return render(
        plan,
        SlurmOptions(
            nodes=nodes,
            out=out,
            agent=agent,
            partition=partition,
            runtime=runtime,
            preflight=preflight,
            image=image,
            sqsh=sqsh,
            lock_name=Path(str(lock.path)).name,
            runs=runs,
            needs_gpu=prof.needs_gpu,
            models=models,
            mpi=mpi,
            enroot_import=enroot_import,
        ),
    )
