"""Cluster renderers, above the gates: the gate's launch plan (reprostack.gates.plan) as an operator runs it on a
cluster, and the check every node makes before it.

- `slurm`: one sbatch script (pyxis/enroot/docker/host), `--submit` follows the job;
- `k8s`: an Indexed Job + headless Service (or a JobSet / LeaderWorkerSet);
- `preflight`: what every node must have (same lock and image, GPUs, EFA, provider, clocks, port) before a
  multi-node gate starts.

They read gates through the Gate protocol (reprostack.gates.base) and the one options model
(reprostack.gates.options); the process tools they rely on live below the gates in reprostack.launch.
"""
