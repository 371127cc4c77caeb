"""gates.fabric_spec: the committed fabric spec loads; every bad spec is one `FILE:LINE: field: problem` line."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from reprostack.errors import GateError
from reprostack.gates.fabric_spec import SPEC_STEM, load_fabric_spec, size_bytes
from reprostack.gates.spec import GateSpecError

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "gates" / f"{SPEC_STEM}.yaml"


def test_the_committed_spec():
    s = load_fabric_spec(ROOT)
    assert (s.gate, s.image, s.kernels, s.trials) == ("fabric", "deepep", ("nccl", "nccl-tests"), 5)
    assert s.sha256 == hashlib.sha256(SPEC.read_bytes()).hexdigest() and s.path == SPEC
    assert {n: t.binary for n, t in s.tests.items()} == {"all_reduce": "all_reduce_perf", "alltoall": "alltoall_perf"}
    assert s.tests["all_reduce"].sizes() == tuple(8 << i for i in range(28))  # -b 8 -e 1G -f 2
    assert "-c" in s.tests["alltoall"].args and s.report_sizes == (1 << 20, 64 << 20, 1 << 30)
    assert s.env["NCCL_DEBUG"] == "INFO" and s.env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    p5en = s.profile("p5en-efa-ep16")
    assert (p5en.nodes, p5en.gpus_per_node, p5en.needs_efa, p5en.launcher, p5en.measured) == (2, 8, True, "mpi", True)
    assert p5en.env["FI_PROVIDER"] == "efa" and p5en.env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert [(b.metric, b.size, b.threshold) for b in p5en.bars] == [
        ("all_reduce.busbw_gbs", 1 << 30, 349.56),
        ("alltoall.busbw_gbs", 1 << 30, 62.18),
    ]
    assert all("github.com" in b.source and len(b.source) > 100 for b in p5en.bars)
    for gpu in ("H200", "H100"):  # one GPU: a measured bar per GPU model, from that model's committed runs
        ep1 = s.profile(f"{gpu.lower()}-ep1")
        assert (ep1.nodes, ep1.gpus_per_node, ep1.needs_efa, ep1.gpu_model) == (1, 1, False, gpu)
        assert [(b.metric, b.size, b.threshold) for b in ep1.bars] == [
            ("all_reduce.algbw_gbs", 1 << 30, None),
            ("alltoall.algbw_gbs", 1 << 30, None),
        ]
        assert {b.baseline.runs_from for b in ep1.bars} == {f"results/gate_fabric/baseline/{gpu.lower()}-ep1"}
    assert s.profile("h200-nvl-ep8").gpus_per_node == 8
    with pytest.raises(GateError, match=r"no profile 'p5' \(known: h100-ep1, h200-ep1, h200-nvl-ep8, p5en-efa-ep16\)"):
        s.profile("p5")


@pytest.mark.parametrize(
    "v, want", [(8, 8), ("8", 8), ("64K", 65536), ("1M", 1 << 20), ("1G", 1 << 30), (0, 0), ("0G", 0)]
)
def test_sizes_are_nccl_tests_own(v, want):
    assert size_bytes(v) == want


@pytest.mark.parametrize("v", ["1T", "1.5G", "-1", "", "1 G", True, None, -4, 1.0])
def test_what_is_no_size(v):
    with pytest.raises(ValueError):
        size_bytes(v)


def edited(tmp_path: Path, old: str, new: str) -> Path:
    root = tmp_path / "root"
    (root / "gates" / "fabric").mkdir(parents=True)
    text = SPEC.read_text()
    assert old in text, old
    (root / "gates" / f"{SPEC_STEM}.yaml").write_text(text.replace(old, new, 1))
    return root


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize(
    "old, new, field, message",
    [
        ("trials: 5", "trials: 0", "trials", "minimum"),
        ("gate: fabric", "gate: micro", "gate", "'fabric' was expected"),
        ("image: deepep", "image: Deep_EP", "image", "does not match"),
        (
            "  - metric: alltoall.busbw_gbs",
            "  - metric: all_gather.busbw_gbs",
            "profiles.p5en-efa-ep16.bars[1].metric",
            "no test 'all_gather'",
        ),
        (
            '        size: 1G\n        op: ">="\n        published: 77.73',
            '        size: 3G\n        op: ">="\n        published: 77.73',
            "profiles.p5en-efa-ep16.bars[1].size",
            "3221225472 B is not a size the alltoall sweep prints",
        ),
        ("        published: 436.95", "        published: .nan", "(yaml)", "'.nan' is not a finite number"),
        (
            "        tolerance: 0.2\n        unit: GB/s\n        source: >-\n          2x p5.48xlarge, all_reduce",
            "        tolerance: 0.95\n        unit: GB/s\n        source: >-\n          2x p5.48xlarge, all_reduce",
            "profiles.p5en-efa-ep16.bars[0].tolerance",
            "maximum",
        ),
        (
            'args: [-b, "8", -e, 1G, -f, "2", -n, "20", -w, "5", -c, "1"]\n  alltoall',
            'args: [-b, "8", -e, 1G, -g, "8", -c, "1"]\n  alltoall',
            "tests.all_reduce.args[4]",
            "'-g': the gate sets GPUs per process",
        ),
        (
            'args: [-b, "8", -e, 1G, -f, "2", -n, "20", -w, "5", -c, "1"]\n  alltoall',
            'args: [-b, "8", -e, 1T, -c, "1"]\n  alltoall',
            "tests.all_reduce.args[3]",
            "'1T' is not a size",
        ),
        (
            'args: [-b, "8", -e, 1G, -f, "2", -n, "20", -w, "5", -c, "1"]\n  alltoall',
            'args: [-b, "8", "--run_cycles=3"]\n  alltoall',
            "tests.all_reduce.args[2]",
            "the gate sets cycles",
        ),
        (
            "    bars-status: unmeasured\n    bars: []\n",
            "    bars: []\n",
            "profiles.h200-nvl-ep8.bars",
            "",
        ),
        (  # issue 37: every published figure cites where it was read
            "          (https://github.com/crazyguitar/aws-gpu-communication-benchmark/blob/",
            "          (github.com/crazyguitar/aws-gpu-communication-benchmark/blob/",
            "profiles.p5en-efa-ep16.bars[1].source",
            "a published figure cites where it was read (an https:// address)",
        ),
        (  # a bar is published or measured, never both
            "        baseline:\n          runs-from: results/gate_fabric/baseline/h100-ep1",
            "        published: 2000\n        baseline:\n          runs-from: results/gate_fabric/baseline/h100-ep1",
            "profiles.h100-ep1.bars[0]",
            "",
        ),
        ("    launcher: mpi", "    launcher: torchrun", "profiles.p5en-efa-ep16.launcher", ""),
        ("timeout-s: 900", "timeout-s: 900\nextra: 1", "extra", "unknown key"),
    ],
)
def test_a_bad_spec_is_one_located_line(tmp_path, old, new, field, message):
    root = edited(tmp_path, old, new)
    with pytest.raises(GateSpecError) as ei:
        load_fabric_spec(root)
    msg = str(ei.value)
    path = root / "gates" / f"{SPEC_STEM}.yaml"
    assert msg.startswith(f"{path}:"), msg
    assert f": {field}: " in msg, msg
    assert message in msg, msg
    assert "\n" not in msg and "Traceback" not in msg


def test_the_located_line_is_the_bad_one(tmp_path):
    root = edited(tmp_path, "  - metric: alltoall.busbw_gbs", "  - metric: all_gather.busbw_gbs")
    with pytest.raises(GateSpecError) as ei:
        load_fabric_spec(root)
    text = (root / "gates" / f"{SPEC_STEM}.yaml").read_text()
    assert ei.value.line == line_of(text, "metric: all_gather.busbw_gbs")


def test_a_missing_spec_names_the_file(tmp_path):
    with pytest.raises(GateSpecError, match=r"gates/fabric\.yaml"):
        load_fabric_spec(tmp_path)


def test_the_spec_moves_with_its_stem(tmp_path):
    """The registry's change moves the file to gates/fabric.yaml: the loader reads it there with stem 'fabric'."""
    (tmp_path / "gates").mkdir()
    shutil.copy(SPEC, tmp_path / "gates" / "fabric.yaml")
    assert load_fabric_spec(tmp_path, "fabric").trials == 5
