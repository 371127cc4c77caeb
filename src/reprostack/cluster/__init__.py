"""Cluster renderers, above the gates: the gate's launch plan (reprostack.gates.plan) as an operator runs it on a
cluster, and the check every node makes before it.

- `slurm`: one sbatch script (pyxis/enroot/docker/host), `--submit` follows the job;
- `k8s`: an Indexed Job + headless Service (or a JobSet / LeaderWorkerSet);
- `preflight`: what every node must have (same lock and image, GPUs, EFA, provider, clocks, port, and the node
  checks of `nodecheck`: driver vs the image's CUDA, fabric manager, NVLink, EFA devices and module, gdrdrv vs
  libgdrapi, memlock, hugepages, ECC / Xid, PCIe width) before a multi-node gate starts, and a two-node EFA smoke;
- `nodecheck`: the readers of those tools' output on one node (pure, bounded) and the collection that runs them.

They read gates through the Gate protocol (reprostack.gates.base) and the one options model
(reprostack.gates.options); the process tools they rely on live below the gates in reprostack.launch.
"""
