"""`reprostack launch slurm --submit`: hand a rendered sbatch script (cluster.slurm) to sbatch and follow the job to its
end (squeue / scontrol show job, else sacct), returning its exit code.

Invariants: runs sbatch, scontrol and sacct only, each reading the job's state; sbatch missing or refusing the script
is one SlurmRenderError line; the script itself is never changed here.
"""

from __future__ import annotations

import subprocess
import time

from .slurm import SlurmRenderError


def submit(script: str, *, cwd: str, poll_s: float = 2.0, echo=print) -> int:
    """`sbatch --parsable SCRIPT` from `cwd` (the project root), then follow the job: each state change printed
    (squeue while queued or running, then `scontrol show job`, else sacct), and return its exit code (the batch
    script's: node 0's agent's). sbatch missing or refusing the script: SlurmRenderError (one line)."""
    import shutil

    if shutil.which("sbatch") is None:
        raise SlurmRenderError("--submit: sbatch not found on PATH (run on a Slurm login node, or render only)")
    p = subprocess.run(["sbatch", "--parsable", script], cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        why = " ".join((p.stderr or p.stdout).split())[:300]
        raise SlurmRenderError(f"--submit: sbatch refused {script}: {why}")
    job = p.stdout.strip().split(";")[0]
    echo(f"submitted job {job}")
    last = None
    while True:
        state, code = _state(job)
        if state != last:
            echo(f"job {job}: {state or 'unknown'}")
            last = state
        if state and state not in (
            "PENDING",
            "CONFIGURING",
            "RUNNING",
            "COMPLETING",
            "SUSPENDED",
            "REQUEUED",
            "RESIZING",
            "STAGE_OUT",
            "SIGNALING",
        ):
            return code if code is not None else (0 if state == "COMPLETED" else 1)
        time.sleep(poll_s)


def _state(job: str) -> tuple[str | None, int | None]:
    """(state, exit code) of `job` from `scontrol show job -o` (works without accounting), else sacct."""
    p = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True)
    if p.returncode == 0 and "JobState=" in p.stdout:
        f = dict(kv.split("=", 1) for kv in p.stdout.split() if "=" in kv)
        code = f.get("ExitCode", "")
        return f.get("JobState"), int(code.split(":")[0]) if code[:1].isdigit() else None
    p = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State,ExitCode"], capture_output=True, text=True)
    if p.returncode == 0 and p.stdout.strip():
        state, _, code = p.stdout.strip().splitlines()[0].partition("|")
        return state.split()[0], int(code.split(":")[0]) if code[:1].isdigit() else None
    return None, None
