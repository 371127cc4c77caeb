"""Launching: how a gate's processes are started and stopped.

- `plan`: one gate launch plan (image, ranks, env, devices, mounts, limits), rendered per engine: `docker` on one
  node, `slurm` (an sbatch script) and `k8s` (an Indexed Job + headless Service) read the same plan;
- `torchrun`: the argv + env that start DeepEP's test_ep.py on one node or across nodes;
- `watchdog`: a foreground command under a time limit, its whole process group stopped (SIGTERM, then SIGKILL)
  and its output logged; `server`: a background engine process stopped the same way;
- `preflight`: what a node must have before a multi-node launch.
"""
