"""Launching: how a gate's processes are started and stopped (process tools, below the gates: nothing here imports
reprostack.gates).

- `plan`: one gate launch plan as data (image, ranks, env, devices, mounts, limits), rendered per engine: `docker`
  on one node here; the cluster renderers (reprostack.cluster: Slurm, Kubernetes) read the same plan;
- `torchrun`: the argv + env that start DeepEP's test_ep.py and the drivers on one node or across nodes;
- `watchdog`: a foreground command under a time limit, its whole process group stopped (SIGTERM, then SIGKILL)
  and its output logged; `server`: a background engine process stopped the same way;
- `docker`: one node's container of a plan, its output logged, stopped at the timeout;
- `rendezvous`: the nodes of one run on a shared out folder: node 0 gathers every other node's rc and rank logs
  (bounded), marks its part done, and a serving worker runs until that mark.
"""
