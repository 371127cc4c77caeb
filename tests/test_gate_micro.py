"""Gate 1 (micro) on the CPU: the gate spec, profile choice, launchers, and skip-is-not-pass on a GPU-less host
(sources are still fetched, patched and verified; the report is a SKIP and the exit code is 3)."""

from __future__ import annotations

import json
import os
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from reprostack import sources
from reprostack.errors import GateError, ReprostackError
from reprostack.fetch import Cache
from reprostack.launch import torchrun
from reprostack.gates import profiles, registry
import gaterun
from gaterun import run as run_gate_here
from reprostack.gates.spec import GateSpecError, load_spec
from reprostack.lock import load
from reprostack.report import exit_code, validate_report, write_reports
from test_sources import make_stack, take_servers_away, write_project

REPO_ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- spec


def test_real_spec():
    spec = load_spec(REPO_ROOT, "micro")
    assert spec.gate == "micro" and spec.script == "tests/elastic/test_ep.py"
    assert spec.kernels == ("nccl", "deepep") and spec.timeout_s == 1200.0
    assert "--test-first-only" in spec.args and spec.env["NCCL_NVLS_ENABLE"] == "0"
    assert set(spec.profiles) == {
        "p5en-efa-ep16",
        "h200-ep1",
        "h100-ep1",
        "h200-nvl-ep2",
        "h200-nvl-ep4",
        "h200-nvl-ep8",
    }

    ep16 = spec.profile("p5en-efa-ep16")
    assert (ep16.nodes, ep16.gpus_per_node, ep16.needs_efa, ep16.ep_size) == (2, 8, True, 16)
    assert ep16.args == ("--num-sms", "4", "--num-qps", "6") and ep16.env["FI_PROVIDER"] == "efa"
    (bar,) = ep16.bars
    assert (bar.metric, bar.op, bar.threshold, bar.unit) == ("dc_p50_us", "<=", 740, "us")
    assert "740" in bar.source

    ep1 = spec.profile("h200-ep1")
    assert (ep1.nodes, ep1.gpus_per_node, ep1.needs_efa, ep1.ep_size) == (1, 1, False, 1)
    assert ep1.env == {"EP_DISABLE_GIN": "1"}
    assert [(b.metric, b.op, b.threshold) for b in ep1.bars] == [("dc_p50_us", "<=", None)]  # a baseline bar
    assert ep1.bars[0].baseline.tolerance == 0.07 and len(ep1.bars[0].baseline.runs) == 15

    with pytest.raises(
        GateError,
        match=r"no profile 'ep8' \(known: h100-ep1, h200-ep1, h200-nvl-ep2, h200-nvl-ep4, "
        r"h200-nvl-ep8, p5en-efa-ep16\)",
    ):
        spec.profile("ep8")


def broken_spec(tmp_path: Path, old: str, new: str) -> tuple[Path, str]:
    text = (REPO_ROOT / "gates" / "micro.yaml").read_text()
    assert text.count(old) == 1, old
    text = text.replace(old, new)
    p = tmp_path / "gates" / "micro.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p, text


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def spec_error(tmp_path: Path) -> str:
    with pytest.raises(GateSpecError) as ei:
        load_spec(tmp_path, "micro")
    return str(ei.value)


def test_spec_unknown_key_names_file_and_line(tmp_path):
    p, text = broken_spec(tmp_path, "    needs-efa: true\n", "    needs-efa: true\n    nics-per-node: 16\n")
    msg = spec_error(tmp_path)
    assert msg.startswith(f"{p}:{line_of(text, 'nics-per-node')}: profiles.p5en-efa-ep16.nics-per-node: unknown key")


def test_spec_bar_without_source(tmp_path):
    old = '        source: "campaign 2026-07 contract: D+C p50 <= 740 us (measured 443.6 = dispatch 185.4 + combine 258.2)"\n'
    p, text = broken_spec(tmp_path, old, "")
    msg = spec_error(tmp_path)
    assert msg.startswith(f"{p}:{line_of(text, '- metric: dc_p50_us')}: profiles.p5en-efa-ep16.bars[0]: ")
    assert "'source' is a required property" in msg


def test_spec_duplicate_key_and_wrong_gate_name(tmp_path):
    p, text = broken_spec(tmp_path, "timeout-s: 1200\n", "timeout-s: 1200\ntimeout-s: 600\n")
    assert (
        spec_error(tmp_path)
        == f"{p}:{line_of(text, 'timeout-s: 600')}: timeout-s: duplicate key (first at line {line_of(text, 'timeout-s: 1200')})"
    )
    p, text = broken_spec(tmp_path, "gate: micro\n", "gate: macro\n")
    assert spec_error(tmp_path) == f"{p}:{line_of(text, 'gate: macro')}: gate: is 'macro', file name says 'micro'"


def test_spec_missing(tmp_path):
    assert spec_error(tmp_path) == f"{tmp_path / 'gates' / 'micro.yaml'}: (file): No such file or directory"


# --------------------------------------------------------------------------- profile choice


@pytest.fixture(scope="module")
def spec():
    return load_spec(REPO_ROOT, "micro")


EFA = [{"name": f"rdmap{i}s0", "pci": None, "ports": {}} for i in range(16)]


@pytest.mark.parametrize(
    "host,profile",
    [
        ({"gpu_count": 1, "efa_devices": []}, "h200-ep1"),
        ({"gpu_count": 8, "efa_devices": EFA}, "p5en-efa-ep16"),
        ({"gpu_count": 2, "efa_devices": []}, "h200-nvl-ep2"),
        ({"gpu_count": 4, "efa_devices": []}, "h200-nvl-ep4"),
        ({"gpu_count": 8, "efa_devices": []}, "h200-nvl-ep8"),  # 8 GPUs, no EFA: one host over NVLink, not EP16
        ({"gpu_count": 4, "efa_devices": [], "gpus": [{"name": "NVIDIA H200"}] * 4}, "h200-nvl-ep4"),
    ],
)
def test_choose_profile_by_host(spec, host, profile):
    assert profiles.resolve(spec, None, host).name == profile


@pytest.mark.parametrize(
    "host",
    [
        {"gpu_count": 3, "efa_devices": []},
        {"gpu_count": 16, "efa_devices": []},
        {"gpu_count": 4, "efa_devices": [], "gpus": [{"name": "NVIDIA A100-SXM4-80GB"}] * 4},  # H200 profiles only
        {"gpu_count": 1, "efa_devices": EFA},
        {},
    ],
)
def test_choose_profile_no_match_names_known_profiles(spec, host):
    with pytest.raises(ReprostackError) as ei:
        profiles.resolve(spec, None, host, registry.gate("micro").no_fit)
    msg = str(ei.value)
    assert msg.startswith(f"{spec.path}: no profile for this host ({host.get('gpu_count', 0)} GPU(s), EFA: ")
    assert "pass --profile (known: p5en-efa-ep16, h200-ep1, h100-ep1, h200-nvl-ep2, h200-nvl-ep4, h200-nvl-ep8)" in msg


def test_named_profile_wins_over_detection(spec):
    assert profiles.resolve(spec, "p5en-efa-ep16", {"gpu_count": 1, "efa_devices": []}).name == "p5en-efa-ep16"
    with pytest.raises(GateError, match="no profile 'ep4'"):
        profiles.resolve(spec, "ep4", {"gpu_count": 4})


# --------------------------------------------------------------------------- launchers


def test_local_launch():
    l = torchrun.local("/py", "/t/test_ep.py", ["--num-tokens", "128"], gpus=8, port=29511)
    assert l.argv == ["/py", "-X", "faulthandler", "/t/test_ep.py", "--num-processes", "8", "--num-tokens", "128"]
    assert l.env == {"WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}
    free = int(torchrun.local("/py", "s.py", [], gpus=1).env["MASTER_PORT"])
    assert 0 < free < 65536


def test_free_port_is_below_the_ephemeral_range_so_no_client_is_handed_it():
    """A rendezvous port from bind(0) lies in the ephemeral range, where srun's I/O sockets or any outgoing
    connection may be given the same number before the store binds it (CI at b444308: node 1 reached srun,
    "Insane message length", and the job exited 1)."""
    low, high = torchrun.ephemeral_range()
    ports = {torchrun.free_port() for _ in range(50)}
    assert all(torchrun.LOWEST <= p < low for p in ports), (sorted(ports), low, high)
    assert len(ports) > 1  # drawn, not one fixed number two runs on a node would share


def test_free_port_skips_a_port_in_use(monkeypatch):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        draws = iter([taken, taken, 20001])
        monkeypatch.setattr(torchrun.random, "randint", lambda a, b: next(draws))
        assert torchrun.free_port() == 20001  # `taken` (ephemeral, in use) was drawn twice and passed over


@pytest.mark.parametrize("text", ["", "abc", "60999 32768", "0 10", "32768", "1 2 3", "32768 70000"])
def test_ephemeral_range_falls_back_on_a_bad_file(tmp_path, text):
    f = tmp_path / "ip_local_port_range"
    f.write_text(text)
    assert torchrun.ephemeral_range(f) == (32768, 60999)
    assert torchrun.ephemeral_range(tmp_path / "absent") == (32768, 60999)
    f.write_text("40000\t50000\n")
    assert torchrun.ephemeral_range(f) == (40000, 50000)


def test_torchrun_launch():
    l = torchrun.torchrun(
        "/py",
        "/t/test_ep.py",
        ["--num-sms", "4"],
        gpus=8,
        nodes=2,
        node_rank=1,
        master_addr="10.0.0.1",
        master_port=29500,
    )
    assert l.argv == [
        "/py",
        "-X",
        "faulthandler",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=1",
        "--node-rank=1",
        "--master-addr=10.0.0.1",
        "--master-port=29500",
        "/t/test_ep.py",
        "--num-processes",
        "8",
        "--num-sms",
        "4",
    ]
    # torchrun itself sets WORLD_SIZE = nnodes x 1 and RANK = node rank (test_ep.py's contract)
    assert l.env == {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize("rank", [-1, 2, 5])
def test_torchrun_bad_node_rank(rank):
    with pytest.raises(ValueError, match=rf"node rank {rank} outside 0\.\.1"):
        torchrun.torchrun("/py", "s.py", [], gpus=8, nodes=2, node_rank=rank, master_addr="h", master_port=1)


# --------------------------------------------------------------------------- skip is not pass


def no_gpu_path(tmp_path: Path) -> str:
    """A PATH holding only git: no nvidia-smi whatever the machine has."""
    bin_dir = tmp_path / "bin-no-gpu"
    bin_dir.mkdir()
    os.symlink(shutil.which("git"), bin_dir / "git")
    return str(bin_dir)


@pytest.fixture
def gpu_less(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", no_gpu_path(tmp_path))
    monkeypatch.delenv("REPROSTACK_MIRRORS", raising=False)
    monkeypatch.delenv("REPROSTACK_CUDA_ARCH", raising=False)


@pytest.mark.parametrize("profile", [None, "h200-ep1"])
def test_micro_without_gpu_is_a_skip_and_exit_3(tmp_path, gpu_less, profile):
    stack = make_stack(tmp_path / "srv")
    root = tmp_path / "project"
    lock = load(write_project(root, stack))
    out = tmp_path / "out"
    opts = gaterun.options(
        "micro",
        root=root,
        lock=lock,
        fetch=sources.FetchOptions(cache=Cache(tmp_path / "cache")),
        out_dir=out,
        profile=profile,
    )

    rep = run_gate_here(opts)
    assert rep.gate == "micro" and rep.result == "skip" and rep.required is True
    assert rep.reason.startswith("no GPU on this host (nvidia-smi lists none): sources were verified and patched")
    assert f"deepep {stack.patched[:12]}" in rep.reason and f"nccl {stack.nccl_tree[:12]}" in rep.reason
    assert rep.profile == (profile or "-")
    assert rep.checks == []  # nothing was measured
    # the sources really were prepared, and the provenance says which
    assert rep.data["sources_reused"] == {"nccl": False, "deepep": False}
    prov = rep.provenance
    assert prov["lock_sha256"] == lock.sha256 and prov["gate_spec_sha256"] == load_spec(root, "micro").sha256
    assert prov["upstreams"]["deepep"]["patched_tree"] == stack.patched
    assert prov["upstreams"]["deepep"]["series"] == [f"cherry-pick {stack.pick} (Submitted [PR #612])"]
    assert prov["upstreams"]["nccl"]["rev"] == stack.nccl_rev and prov["host"]["gpu_count"] == 0
    trees = tmp_path / "cache" / "trees"
    assert sorted(os.listdir(trees)) == [sources.tree_key(lock.git("deepep")), f"nccl-{stack.nccl_tree}"]
    assert not (tmp_path / "cache" / "builds").exists()  # no kernel build was attempted

    written = write_reports([rep], out, required={"micro"})
    assert set(written) == {"micro.json", "summary.json", "summary.md", "junit.xml"}
    assert exit_code([rep], {"micro"}) == 3
    doc = json.loads((out / "micro.json").read_text())
    validate_report(doc)
    assert doc["result"] == "skip" and "no GPU" in doc["reason"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["exit_code"] == 3 and summary["gates"][0]["result"] == "skip"
    suite = ET.parse(out / "junit.xml").getroot()
    assert suite.get("skipped") == "1" and suite.get("failures") == "0" and suite.get("errors") == "0"
    (case,) = suite.findall("testcase")
    skipped = case.find("skipped")
    assert skipped is not None and "no GPU" in skipped.get("message")
    assert "| micro | " in (out / "summary.md").read_text() and "SKIP" in (out / "summary.md").read_text()


def test_micro_second_run_reuses_sources_offline(tmp_path, gpu_less):
    stack = make_stack(tmp_path / "srv")
    root = tmp_path / "project"
    lock = load(write_project(root, stack))
    cache = Cache(tmp_path / "cache")
    mo = dict(root=root, lock=lock, out_dir=tmp_path / "out")
    assert run_gate_here(gaterun.options("micro", fetch=sources.FetchOptions(cache=cache), **mo)).result == "skip"
    take_servers_away(stack)
    rep = run_gate_here(gaterun.options("micro", fetch=sources.FetchOptions(cache=cache, offline=True), **mo))
    assert rep.result == "skip" and rep.data["sources_reused"] == {"nccl": True, "deepep": True}


def test_micro_fetch_failure_is_an_operator_error_not_a_report(tmp_path, gpu_less):
    stack = make_stack(tmp_path / "srv")
    root = tmp_path / "project"
    lock = load(write_project(root, stack))
    opts = gaterun.options(
        "micro",
        root=root,
        lock=lock,
        out_dir=tmp_path / "out",
        fetch=sources.FetchOptions(cache=Cache(tmp_path / "cache"), offline=True),
    )
    with pytest.raises(ReprostackError, match="is not in the cache"):
        run_gate_here(opts)
    assert not (tmp_path / "out").exists()


def test_ep1_bars_hold_on_the_committed_h200_log():
    """A run of 2026-11-29 that is not among the baseline's runs (it predates trials) meets the h200-ep1 bar made from
    them (and the published EP16 contract bar must not be confused with it)."""
    from reprostack.gates.parsers.test_ep import parse_test_ep
    from reprostack.report import evaluate

    log = REPO_ROOT / "results/gate_micro/2026-11-29-h200-ep1-exclude-libs/micro/test_ep.log"
    parsed = parse_test_ep(log.read_text(), num_ranks=1)
    assert parsed.ok and round(parsed.dc_p50_us, 1) == 14.3
    from reprostack.gates.spec import resolve_bars

    spec = load_spec(REPO_ROOT, "micro")
    bars = resolve_bars(spec, spec.profile("h200-ep1"), root=REPO_ROOT).bars
    checks = [evaluate(b.metric, b.unit, parsed.dc_p50_us, b.op, b.threshold) for b in bars]
    assert checks and all(c.passed for c in checks)
