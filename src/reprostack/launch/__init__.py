"""Launchers: one gate launch plan (`launch.plan`), rendered per engine (docker on one node; Slurm and
Kubernetes renderers read the same plan)."""
