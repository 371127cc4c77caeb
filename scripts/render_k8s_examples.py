"""Render docs/examples/k8s/: the manifests of the published 2 x p5en runs (every gate's p5en profile, Indexed
Job + headless Service, the fabric gate's an MPIJob; the vLLM gate also as a JobSet and a LeaderWorkerSet).

    python3 scripts/render_k8s_examples.py [DEST]     (default: docs/examples/k8s)

No gate image of the campaign is published, so no digest is known: the files name the image as
`REGISTRY/reprostack/<recipe>@sha256:DIGEST-OF-YOUR-PUSH`, which no registry resolves and `kubectl apply` refuses
(never a made-up digest); render your own with `--image REPO@sha256:<digest of your push>`. The node
paths are where an EKS cluster with FSx for Lustre at /fsx would hold the project and the model cache.
tests/test_launch_k8s.py re-renders them and requires the committed files byte for byte.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# rendered with a syntactically valid stand-in (the renderer takes digests only), then written as FILL_IN
STAND_IN = "registry.invalid/reprostack/{recipe}@sha256:" + "0" * 64
FILL_IN = "REGISTRY/reprostack/{recipe}@sha256:DIGEST-OF-YOUR-PUSH"
COMMON = [
    "--host-path",
    "project=/fsx/reprostack",
    "--host-path",
    "models=/fsx/huggingface",
    "--node-selector",
    "node.kubernetes.io/instance-type=p5en.48xlarge",
]


def examples(root: Path) -> list[tuple[str, str, str, str]]:
    """(folder, gate, image recipe, variant) of every example: each gate the renderers render (the gate registry's
    `rendered`: its published profile) as an Indexed Job, and the first gate that serves a model also as a JobSet and
    a LeaderWorkerSet."""
    from reprostack.gates import registry

    gates = registry.rendered(root)
    out = [(g.name, g.name, g.load(root).image, "job") for g in gates]
    serving = next((g for g in gates if g.serves), None)
    if serving is not None:
        image = serving.load(root).image
        out += [(f"{serving.name}-{v}", serving.name, image, v) for v in ("jobset", "lws")]
    return out


def argv(dest: Path, folder: str, gate: str, recipe: str, variant: str) -> list[str]:
    return [
        "launch",
        "k8s",
        gate,
        "--variant",
        variant,
        "--out",
        str(dest / folder),
        "--lock",
        str(ROOT / "upstreams.lock"),
        "--image",
        STAND_IN.format(recipe=recipe),
        "--name",  # a fixed name for the committed files; without --name every rendering names a new Job
        f"rs-{gate}-p5en-efa-ep16",
        *COMMON,
    ]


def render_all(dest: Path) -> int:
    from reprostack import cli

    for ex in examples(ROOT):
        rc = cli.main(argv(dest, *ex))
        if rc:
            return rc
        recipe = ex[2]
        for f in sorted((dest / ex[0]).glob("*.yaml")):
            text = f.read_text()
            f.write_text(text.replace(STAND_IN.format(recipe=recipe), FILL_IN.format(recipe=recipe)))
    return 0


if __name__ == "__main__":
    sys.exit(render_all(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "examples" / "k8s"))
