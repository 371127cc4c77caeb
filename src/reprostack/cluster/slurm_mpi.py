"""The Slurm steps of a gate profile started by MPI (gates.fabric_mpi.MpiLaunch: the fabric gate across nodes), as
sbatch text for cluster.slurm.render (pure: nothing runs, no Slurm needed).

Operators' way (awsome-distributed-training micro-benchmarks/nccl-tests/slurm/nccl-tests-container.sbatch): one
`srun --mpi=pmix --cpu-bind=none` step per test under pyxis, one rank per GPU (`--ntasks-per-node` = the profile's
gpus-per-node), Slurm's PMIx server wiring the ranks (the image's Open MPI is the client: containers/substrate),
pyxis handing PMIx into the container. Each step's output, every rank's as srun forwards it line by line, goes to
`<out>/<LOGS>/<test>.log` (srun's own stdout and stderr: one writer, never two nodes writing one file), its exit
status and the job id to `<out>/<LOGS>/<test>.rc`, and its time limit is the spec's (`--time`); a failing test does
not stop the next (each is judged). Then one task on node 0, the in-image runner with
`--launched-logs`, judges those files and writes the gate's report; the job's exit status is that task's.

Invariants: only pyxis runs these steps (its PMIx support; a docker, enroot or host runtime is one
SlurmRenderError line); every value reaches the text through the `word` quoting the caller passes
(cluster.slurm_words.word), every env name was checked by the caller; the lines are the same for the same launch.
"""

from __future__ import annotations

import math


def _minutes(seconds: float) -> int:
    return max(1, math.ceil(seconds / 60))


def refusal(runtime: str, plan) -> str:
    """Why `runtime` cannot run the MPI steps of `plan` (every runtime but pyxis)."""
    return (
        f"--runtime {runtime}: profile {plan.profile} of gate {plan.gate} is started by MPI (srun --mpi=pmix), "
        "which runs in the image under pyxis only (its PMIx support); use --runtime pyxis"
    )


def lines(launch, word, task, agent, node_log: str) -> list[str]:
    """The gate's steps: per test an MPI step (`task(argv, per_node_out=False)`: the pyxis arguments and the rank's
    command), then the judge (`task(agent, per_node_out=True)`: node 0's in-image runner, its rc kept as the output
    contract says), then the job's exit. `node_log`: the judge's --output."""
    judge_task = task(list(agent), per_node_out=True)
    out = [
        f"# the gate over MPI: {launch.nodes} node(s) x {launch.ranks_per_node} rank(s), one per GPU, started by Slurm's "
        "PMIx (srun --mpi=pmix) in the image",
        "# (nccl-tests MPI=1, containers/deepep); every rank's output and each test's exit status into "
        f"${{OUT}}/{launch.logs}/, judged by node 0 after",
        f'mkdir -p "${{OUT}}"/{word(launch.logs)}',
    ]
    out += [f"export {k}={word(v, f'env {k}')}" for k, v in launch.env]
    out.append("set +e")
    for s in launch.steps:
        srun = [
            "srun",
            f"--nodes={launch.nodes}",
            f"--ntasks-per-node={launch.ranks_per_node}",
            "--mpi=pmix",
            "--cpu-bind=none",
            "--kill-on-bad-exit=1",
            f"--time={_minutes(launch.timeout_s)}",
        ]
        out += [
            f"# {s.test}: {launch.ranks} ranks",
            " ".join(srun) + " \\",
            "  " + task(list(s.argv), per_node_out=False) + f' > "${{OUT}}"/{word(s.log)} 2>&1',
            f'echo "$? ${{SLURM_JOB_ID}}" > "${{OUT}}"/{word(s.rc)}',
        ]
    out += [
        "# the report: node 0's in-image runner judges what the steps above wrote (--launched-logs)",
        f'srun --nodes=1 --ntasks=1 --kill-on-bad-exit=1 --output="${{OUT}}"/{word(node_log)} \\',
        "  " + judge_task,
        "rc=$?",
        "set -e",
        f'echo "reprostack: MPI steps logged in ${{OUT}}/{launch.logs}; report in ${{OUT}}; exit ${{rc}}"',
        'exit "${rc}"',
        "",
    ]
    return out
