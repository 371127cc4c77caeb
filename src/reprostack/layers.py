"""The package's layers, lowest first: a module may import from its own layer and the layers below, never above.

tests/test_layers.py reads every module's imports (scripts/import_graph.py, with `ast`) and fails on an import cycle
or an import from a lower layer to a higher one; docs/architecture.md (## Layers) is rendered from this table
(`python3 scripts/import_graph.py --docs`).

Invariants:
- Written down once: this table is the only statement of the layering; the test and the docs read it.
- Each entry names module prefixes under `reprostack.`; a module belongs to the layer of its longest matching
  prefix; every module of the package belongs to exactly one layer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layer:
    name: str
    modules: tuple[str, ...]  # prefixes under reprostack. (a package holds its submodules)
    what: str  # one line: what the layer is


LAYERS: tuple[Layer, ...] = (
    Layer(
        "base",
        (
            "__init__",
            "layers",
            "errors",
            "atomicfile",
            "digest",
            "paths",
            "yamlsrc",
            "jsonsrc",
            "schemas",
            "ui",
            "gitcmd",
            "hostinfo",
            "project",
            "runs",
        ),
        "utilities every stage uses: located errors, atomic writes, digests, paths, YAML/JSON readers with line "
        "numbers, schemas, terminal output, run folders, git and host probes, the project's commit, this table",
    ),
    Layer(
        "evidence",
        ("evidence",),
        "the evidence that needs no gate: signed run attestations (evidence.attest), bars and the statistics they "
        "are judged on (evidence.bars), the report readers re-derivation shares (evidence.rederive), the Evidence a "
        "gate kind declares (evidence.kind)",
    ),
    Layer(
        "process",
        ("launch",),
        "process tools: the LaunchPlan data, watchdog, torchrun argv, server start/stop, the docker runner; "
        "they never import gates",
    ),
    Layer(
        "lock",
        ("lock",),
        "upstreams.lock: the pin model, its stacks, and the commands that fill wheel files and image digests",
    ),
    Layer(
        "sources",
        ("fetch", "patch", "sources"),
        "pinned sources: fetch and verify git pins and wheels, apply patch series into patched trees",
    ),
    Layer(
        "build",
        ("kernels", "containers"),
        "what is built from the sources: kernels (NCCL, DeepEP, plugins), container images",
    ),
    Layer(
        "report",
        ("report", "hostenv"),
        "gate reports: the model, statistics, the writers and the exit code; hostenv: what a host-mode run ran on "
        "and its drift from the locked wheelset",
    ),
    Layer(
        "gates",
        (
            "gates",
            "evidence.judge",
            "evidence.rederive.micro",
            "evidence.rederive.serving",
            "evidence.rederive.fabric",
            "evidence.rederive.megatron",
        ),
        "the gates: specs, registry, log parsers, the runner that turns a spec and a host into a report; each kind's "
        "judge (evidence.judge) and re-derivation from its raw logs (evidence.rederive.<kind>), which read the kind's "
        "parsers and spec and are declared by its gate",
    ),
    Layer(
        "cluster",
        ("cluster",),
        "cluster renderers above the gates: Slurm scripts, Kubernetes manifests, the cross-node preflight",
    ),
    Layer(
        "commands",
        ("bump", "history", "evidence.verify", "bench", "stacks", "cmd", "cli", "__main__"),
        "what the operator runs: bump, history, verification of claims and report folders (evidence.verify: "
        "`reprostack verify`, `verify-report`), bench, stacks, one module per CLI command, the CLI table",
    ),
)
