"""docs/p5en.md, read as a new operator of a 2 x p5en cluster would (issue 37 item 10): every step it needs is there
(driver, gdrdrv, enroot, the EFA security group, `nox -s images` before `build`, ECR login and push, the model's
pinned revision with HF_HUB_OFFLINE=1), its one answer on the default stack is the lock's, the model revision is the
one the published campaign's log shows, every `reprostack launch` line in it renders here as written (with a
digest in place of DIGEST), and every file it links exists."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from reprostack import cli
from reprostack.lock import load

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "p5en.md"
SERVE_LOG = ROOT / "tests" / "fixtures" / "published-2026-07" / "trtllm-shim" / "serve_log_head.log"


@pytest.fixture(scope="module")
def text():
    return DOC.read_text()


@pytest.mark.parametrize(
    "needle",
    [
        "R580 or newer",
        "gdrdrv >= 2.5",
        "/dev/gdrdrv",
        "enroot >= 4",
        "enroot 3.x",
        ".sqsh",
        "security group itself",
        "**inbound**",
        "**outbound**",
        "cluster placement group",
        "nox -s images          # FIRST",
        "aws ecr get-login-password --region REGION | docker login --username AWS --password-stdin",
        "$ENROOT_CONFIG_PATH/.credentials",
        "--enroot-import /fsx/enroot",
        "efa-hmem",
        "--push ACCOUNT.dkr.ecr.REGION.amazonaws.com/reprostack",
        "HF_HUB_OFFLINE=1",
        "srun --mpi=list",
        "mpi-operator/v0.8.0/deploy/v2beta1/mpi-operator.yaml",
    ],
)
def test_every_step_a_new_operator_needs_is_there(text, needle):
    assert needle in text


def test_the_images_base_step_comes_before_a_single_build(text):
    assert text.index("nox -s images") < text.index("reprostack build deepep")


def test_its_one_answer_on_the_default_stack_is_the_locks(text):
    """One stack: the campaign's NCCL (the nccl-wheel pin's version), GIN type 2 through the CPU proxy, no GDAKI."""
    lock = load(ROOT / "upstreams.lock")
    raw = yaml.safe_load((ROOT / "upstreams.lock").read_text())
    env = raw["stacks"]["campaign"]["env"]
    version = lock.get("nccl-wheel").version
    section = text.split("## The stack p5en runs by default", 1)[1].split("\n## ", 1)[0]
    assert f"NCCL **{version}**" in section and "the **campaign** stack" in section
    for k in ("NCCL_GIN_TYPE", "NCCL_GIN_ENABLE", "OFI_NCCL_GIN_GDAKI"):
        assert f"`{k}={env[k]}`" in section
    assert env["NCCL_GIN_TYPE"] == "2" and env["OFI_NCCL_GIN_GDAKI"] == "0" and "**no GDAKI**" in section
    assert len(re.findall(r"NCCL \*\*[0-9.]+\*\*", text)) == 1  # one NCCL answer in the whole page


def test_the_model_revision_is_the_one_the_published_campaign_served(text):
    revs = set(re.findall(r"\b[0-9a-f]{40}\b", text.split("## The model", 1)[1].split("\n## ", 1)[0]))
    assert len(revs) == 1
    rev = revs.pop()
    assert f"models--Qwen--Qwen3-30B-A3B-FP8/snapshots/{rev}/" in SERVE_LOG.read_text()
    assert f"--revision {rev}" in text and f"printf {rev} >" in text


def test_every_linked_file_exists(text):
    for link in re.findall(r"\]\(([^)#:]+)\)", text):
        assert (DOC.parent / link).exists(), link


def _launch_lines(text: str) -> list[list[str]]:
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    out = []
    for b in blocks:
        joined = re.sub(r"\\\n\s*", " ", b)
        for line in joined.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("reprostack launch "):
                out.append(shlex.split(line))
    return out


def test_every_launch_line_renders_here_as_written(text, tmp_path):
    lines = _launch_lines(text)
    assert {(a[2], a[3]) for a in lines} >= {
        ("slurm", "fabric"),
        ("k8s", "fabric"),
        ("slurm", "micro"),
        ("slurm", "vllm"),
    }
    digest = "sha256:" + "ab" * 32
    for i, argv in enumerate(lines):
        argv = [
            a.replace("ACCOUNT.dkr.ecr.REGION.amazonaws.com", "123456789012.dkr.ecr.us-east-2.amazonaws.com")
            .replace(".../reprostack/", "123456789012.dkr.ecr.us-east-2.amazonaws.com/reprostack/")
            .replace("sha256:DIGEST", digest)
            for a in argv[1:]
        ]
        for flag in ("--submit", "--apply"):  # rendered, never submitted or applied here
            if flag in argv:
                argv.remove(flag)
        if "--out" in argv:
            argv[argv.index("--out") + 1] = str(tmp_path / f"o{i}")
        else:
            argv += ["--out", str(tmp_path / f"o{i}")]
        assert cli.main(argv) == 0, argv
