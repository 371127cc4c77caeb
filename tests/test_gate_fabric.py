"""gates.fabric on the CPU: its functions, and the FabricGate's staged run on a stood-in one-GPU host.

Inputs: the committed spec; the published p5en NCCL INFO log (real, tests/fixtures/published-2026-07); the pinned
binaries' real output here (tests/fixtures/nccl-tests/cpu-no-gpu); tables printed with nccl-tests v2.19.6's own
formats (tests/nccltestsout.py) where a table is needed. The gate's run starts real processes (shell scripts in place
of the binaries) under the real watchdog.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from reprostack.errors import GateError
import gaterun
from reprostack.evidence.judge import fabric as fjudge
from reprostack.evidence.rederive.fabric import rederive_fabric
from reprostack.gates import fabric, profiles, registry
from reprostack.gates.fabric_spec import load_fabric_spec
from reprostack.gates.parsers.nccl_tests import NONE_ONE_NODE
from reprostack.gates.spec import NoProfileForHost

from nccltestsout import GIB, header, info, table

FABRIC = registry.gate("fabric")

ROOT = Path(__file__).resolve().parents[1]
P5EN_LOG = ROOT / "tests" / "fixtures" / "published-2026-07" / "trtllm-shim" / "serve_log_head.log"
SIZES = [8 << i for i in range(28)]


@pytest.fixture(scope="module")
def spec():
    return load_fabric_spec(ROOT)


def h200(n: int, efa: bool = False, name: str = "NVIDIA H200") -> dict:
    return {
        "gpu_count": n,
        "gpus": [{"name": name}] * n,
        "efa_devices": [{"name": f"rdmap{i}"} for i in range(16)] if efa else [],
    }


# --------------------------------------------------------------------------- profile and commands


def test_choose_profile_by_host(spec):
    """The one profile rule (gates.profiles.resolve) on fabric's spec."""
    assert profiles.resolve(spec, None, h200(1)).name == "h200-ep1"
    assert profiles.resolve(spec, None, h200(8)).name == "h200-nvl-ep8"
    assert profiles.resolve(spec, None, h200(8, efa=True)).name == "p5en-efa-ep16"
    assert profiles.resolve(spec, "p5en-efa-ep16", h200(1)).name == "p5en-efa-ep16"  # named: no host check
    for host in (h200(4), h200(1, name="NVIDIA A100-SXM4-80GB"), {}):
        with pytest.raises(NoProfileForHost, match="no profile for this host"):
            profiles.resolve(spec, None, host, FABRIC.no_fit)
    with pytest.raises(GateError, match="no profile 'p5'"):
        profiles.resolve(spec, "p5", h200(1))


def test_node_commands_of_one_gpu(spec):
    ar, a2a = fabric.node_commands(spec, spec.profile("h200-ep1"), "/b")
    assert ar.argv == (
        "/b/all_reduce_perf",
        *("-b", "8", "-e", "1G", "-f", "2", "-n", "20", "-w", "5", "-c", "1"),
        *("-g", "1", "-N", "5"),
    )
    assert a2a.argv[0] == "/b/alltoall_perf" and a2a.test == "alltoall" and a2a.binary == "alltoall_perf"
    assert ar.env == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_NVLS_ENABLE": "0"}
    assert (ar.launcher, ar.nodes, ar.node_rank, ar.gpus_per_node, ar.timeout_s, ar.needs) == (
        "local",
        1,
        0,
        1,
        900.0,
        (),
    )


def test_node_commands_of_two_p5en_nodes_need_mpi(spec):
    p = spec.profile("p5en-efa-ep16")
    cmds = fabric.node_commands(spec, p, "/b", node_rank=1, master_addr="10.0.0.1")
    assert [c.argv[-4:] for c in cmds] == [("-g", "1", "-N", "5")] * 2  # one MPI rank per GPU, as operators run it
    c = cmds[0]
    assert (c.launcher, c.nodes, c.node_rank, c.master_addr) == ("mpi", 2, 1, "10.0.0.1")
    assert c.env["FI_PROVIDER"] == "efa" and c.env["NCCL_DEBUG"] == "INFO" and c.env["NCCL_GIN_TYPE"] == "2"
    assert "MPI=1" in c.needs[0] and "srun --mpi=pmix" in c.needs[1] and "MPIJob" in c.needs[1]
    # the plan and the run get the same commands
    assert fabric.node_commands(spec, p, "/b", node_rank=1, master_addr="10.0.0.1") == cmds
    with pytest.raises(GateError, match="is 2 node\\(s\\), not 3"):
        fabric.node_commands(spec, p, "/b", nodes=3)
    with pytest.raises(GateError, match="node rank 2 is not one of 0..1"):
        fabric.node_commands(spec, p, "/b", node_rank=2)


def test_a_multi_node_profile_without_mpi_is_refused(spec):
    import dataclasses

    p = dataclasses.replace(spec.profile("p5en-efa-ep16"), launcher="local")
    with pytest.raises(GateError, match="its launcher must be mpi"):
        fabric.node_commands(spec, p, "/b")


def test_nccl_version_code():
    assert fjudge.nccl_version_code("2.30.4") == 23004 and fjudge.nccl_version_code("2.32.3") == 23203
    assert fjudge.nccl_version_code("x") is None and fjudge.nccl_version_code(None) is None


# --------------------------------------------------------------------------- checks


def one_gpu(busbw=lambda s, c: 300.0 + c + s / GIB, **kw) -> str:
    return header(**kw) + table(SIZES, busbw, cycles=5)


def by_metric(checks):
    return {c.metric: c for c in checks}


def test_a_whole_one_gpu_run_passes_every_check_but_has_no_bar(spec):
    from reprostack.gates.fabric_spec import resolve_bars

    prof, why = resolve_bars(ROOT, spec.profile("h200-ep1"))  # no accepted run committed yet: unmeasured
    assert not prof.measured and why.startswith("no measured bar yet: all_reduce.algbw_gbs")
    unresolved = by_metric(fjudge.checks(spec, spec.profile("h200-ep1"), fjudge.parse({})))
    assert unresolved["all_reduce.algbw_gbs"].passed is False  # a bar not made from its runs never passes
    parsed = fjudge.parse({"all_reduce": one_gpu(), "alltoall": one_gpu(program="alltoall_perf")})
    cs = by_metric(fjudge.checks(spec, prof, parsed, nccl_version="2.30.4"))
    assert list(cs) == [
        "all_reduce.rows",
        "all_reduce.wrong_total",
        "all_reduce.out_of_bounds",
        "all_reduce.nccl_library",
        "alltoall.rows",
        "alltoall.wrong_total",
        "alltoall.out_of_bounds",
        "alltoall.nccl_library",
        "transport",
    ]
    assert all(c.passed for c in cs.values()), [c.describe() for c in cs.values() if not c.passed]
    assert cs["all_reduce.rows"].value == 140 and cs["transport"].value == NONE_ONE_NODE
    assert "one GPU, no peer" in cs["transport"].note
    figs = fjudge.figures(spec, prof, parsed)
    st = figs[f"all_reduce.busbw_gbs@{GIB}"]["statistics"]
    assert figs[f"all_reduce.busbw_gbs@{GIB}"]["samples"] == [301.0, 302.0, 303.0, 304.0, 305.0]
    assert st["n"] == 5 and st["mean"] == 303.0 and st["ci95"][0] < 303.0 < st["ci95"][1]
    assert set(figs) >= {f"alltoall.busbw_gbs@{1 << 20}", f"alltoall.busbw_gbs@{64 << 20}", "alltoall.transports"}
    assert figs["alltoall.transports"][0]["transport"] == NONE_ONE_NODE


def test_another_nccl_loaded_fails_its_check(spec):
    parsed = fjudge.parse({"all_reduce": one_gpu(library=22809), "alltoall": one_gpu()})
    cs = by_metric(fjudge.checks(spec, spec.profile("h200-ep1"), parsed, nccl_version="2.30.4"))
    assert not cs["all_reduce.nccl_library"].passed and cs["alltoall.nccl_library"].passed


def test_wrong_elements_a_short_run_and_no_output_fail(spec):
    text = header() + table(SIZES, lambda s, c: 1.0, cycles=5, wrong=2)
    short = header() + table(SIZES, lambda s, c: 1.0, cycles=4)
    cs = by_metric(fjudge.checks(spec, spec.profile("h200-ep1"), fjudge.parse({"all_reduce": text, "alltoall": short})))
    assert not cs["all_reduce.wrong_total"].passed and cs["all_reduce.wrong_total"].value == 2 * 2 * 28 * 5
    assert not cs["all_reduce.out_of_bounds"].passed
    assert not cs["alltoall.rows"].passed and "4 cycle(s)" in cs["alltoall.rows"].note
    cs = by_metric(fjudge.checks(spec, spec.profile("h200-ep1"), fjudge.parse({})))
    assert not cs["all_reduce.rows"].passed and cs["all_reduce.rows"].note == "no output for this test"
    assert not cs["transport"].passed and cs["transport"].value == "no test output"


def test_the_real_no_gpu_output_fails_with_its_reason(spec):
    fix = ROOT / "tests" / "fixtures" / "nccl-tests" / "cpu-no-gpu"
    parsed = fjudge.parse({t: (fix / f"{t}_perf.log").read_text() for t in ("all_reduce", "alltoall")})
    cs = by_metric(fjudge.checks(spec, spec.profile("h200-ep1"), parsed, nccl_version="2.30.4"))
    assert cs["all_reduce.nccl_library"].passed and not cs["all_reduce.rows"].passed
    assert "CUDA driver version is insufficient" in cs["all_reduce.rows"].note
    assert not cs["transport"].passed and "rank(s) 0 not in the output" in cs["transport"].value


def p5en_run(busbw: float, *, socket_rank: int | None = None, ranks: int = 16) -> str:
    """16 ranks, one MPI process per node driving 8 GPUs (NCCL 2.30.4's INFO lines, v2.19.6's table)."""
    procs = {0: ("node-a", 100), 1: ("node-b", 200)}
    rank_lines = [(procs[r // 8][0], procs[r // 8][1], r % 8) for r in range(ranks)]
    out = [header(gpus=8, ranks=rank_lines)]
    for node, (host, pid) in procs.items():
        out.append(info(host, pid, 0, "NET/Plugin: Loaded net plugin Libfabric (v12)"))
        out.append(info(host, pid, 0, "NET/OFI Selected provider is efa, fabric is efa-direct (found 16 nics)"))
    for r in range(ranks):
        host, pid, dev = rank_lines[r]
        net = "Socket" if r == socket_rank else "Libfabric"
        out.append(
            info(
                host,
                pid,
                dev,
                f"comm 0x7f{r:02d} rank {r} nranks 16 cudaDev {dev} nvmlDev {dev} busId 18000 commId 0x1 - Init COMPLETE",
            )
        )
        out.append(
            info(host, pid, dev, f"comm 0x7f{r:02d} rank {r} nRanks 16 nNodes 2 localRanks 8 localRank {dev} MNNVL 0")
        )
        peer = (r + 8) % 16
        out.append(
            info(host, pid, dev, f"Channel 00/0 : {r}[{dev}] -> {peer}[{dev}] [send] via NET/{net}/{dev}/GDRDMA")
        )
        out.append(
            info(
                host,
                pid,
                dev,
                f"Channel 00/0 : {r}[{dev}] -> {(r + 1) % 8 + 8 * (r // 8)}[{(dev + 1) % 8}] via P2P/CUMEM/read",
            )
        )
    return "\n".join(out) + "\n" + table(SIZES, lambda s, c: busbw + (c - 2) * 0.5, cycles=5, nranks=16)


@pytest.mark.parametrize(
    "busbw, passed, inconclusive",
    [(440.0, True, False), (300.0, False, False), (349.56, False, True)],
)
def test_p5en_bars_are_judged_on_the_interval_of_the_cycles(spec, busbw, passed, inconclusive):
    p = spec.profile("p5en-efa-ep16")
    parsed = fjudge.parse({"all_reduce": p5en_run(busbw), "alltoall": p5en_run(80.0)})
    cs = by_metric(fjudge.checks(spec, p, parsed, nccl_version="2.30.4"))
    bar = cs["all_reduce.busbw_gbs"]
    assert (bar.passed, bar.inconclusive, bar.threshold, bar.op) == (passed, inconclusive, 349.56, ">=")
    assert "at 1 GiB (1073741824 B), out-of-place; 436.95 GB/s published x (1 - 0.2)" in bar.note
    assert "awsome-distributed-training" in bar.note and "n=5" in bar.note
    assert cs["alltoall.busbw_gbs"].passed and cs["transport"].passed
    assert cs["transport"].value == "NET/OFI efa" and cs["transport"].note.startswith("32 rank(s) over 2 test(s)")


def test_p5en_rank_on_sockets_fails_the_transport_naming_it(spec):
    p = spec.profile("p5en-efa-ep16")
    parsed = fjudge.parse({"all_reduce": p5en_run(440.0, socket_rank=11), "alltoall": p5en_run(80.0)})
    t = fjudge.transport_check(p, parsed)
    assert not t.passed and t.threshold == "NET/OFI efa"
    assert t.value.startswith("all_reduce: rank 11 (node-b) Socket")


def test_p5en_missing_ranks_fail_the_transport(spec):
    parsed = fjudge.parse({"all_reduce": p5en_run(440.0, ranks=12), "alltoall": p5en_run(80.0)})
    t = fjudge.transport_check(spec.profile("p5en-efa-ep16"), parsed)
    assert not t.passed and "all_reduce: rank(s) 12-15 not in the output" in t.value


def test_the_published_p5en_log_passes_the_transport_check(spec):
    """The campaign's real INFO lines: 16 ranks, the plugin's efa provider (no connection lines in this head)."""
    parsed = fjudge.parse({"all_reduce": P5EN_LOG.read_text()})
    t = fjudge.transport_check(spec.profile("p5en-efa-ep16"), parsed)
    assert t.passed and t.value == "NET/OFI efa" and t.note == "16 rank(s) over 1 test(s)"
    # ... and the same log with one process falling back to sockets fails naming that rank and host
    lines = []
    for line in P5EN_LOG.read_text().splitlines():
        if line.startswith("deepep-efa-bench-1:81187:"):  # rank 11's process
            if "Selected provider is" in line:
                continue
            line = line.replace("Using network Libfabric", "Using network Socket")
        lines.append(line)
    t = fjudge.transport_check(spec.profile("p5en-efa-ep16"), fjudge.parse({"all_reduce": "\n".join(lines)}))
    assert not t.passed and t.value.startswith("all_reduce: rank 11 (deepep-efa-bench-1) Socket [")


def test_eight_gpus_on_one_node_over_net_fail_the_nvlink_profile(spec):
    ranks = [("box", 7, d) for d in range(8)]
    lines = [header(gpus=8, ranks=ranks)]
    for r in range(8):
        lines.append(
            info("box", 7, r, f"Channel 00/0 : {r}[{r}] -> {(r + 1) % 8}[{(r + 1) % 8}] [send] via NET/Socket/0")
        )
    parsed = fjudge.parse({"all_reduce": "\n".join(lines) + "\n" + table(SIZES, lambda s, c: 1.0, cycles=5, nranks=8)})
    t = fjudge.transport_check(spec.profile("h200-nvl-ep8"), parsed)
    assert not t.passed and "rank 0 (box) Socket" in t.value


# --------------------------------------------------------------------------- the one-node runner


def fake_bin(d: Path, outputs: dict, rc: int = 0) -> Path:
    """Executables in place of the nccl-tests binaries: each prints its canned output, its args and the library
    path it got, and exits `rc` (real processes, started by the real watchdog)."""
    d.mkdir(parents=True, exist_ok=True)
    for name, text in outputs.items():
        (d / f"{name}.out").write_text(text)
        script = d / name
        script.write_text(
            f'#!/bin/sh\ncat "{d / (name + ".out")}"\necho "# args: $*"\necho "# LD_LIBRARY_PATH=$LD_LIBRARY_PATH"\nexit {rc}\n'
        )
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return d


@pytest.fixture
def one_h200(monkeypatch):
    """The fabric gate on a stood-in one-GPU H200: the host inventory says so; the sources and the kernel builds are
    stood in (the build is tested in test_nccltests_build.py): `prepare` points at the executables of `bins`."""
    from reprostack import hostinfo
    from reprostack.gates.fabric import FabricGate, FabricState

    monkeypatch.setattr(hostinfo, "collect", lambda **kw: h200(1))
    bins = {}

    def sources(self, st):
        st.prov = {"lock_sha256": st.ctx.lock.sha256, "gate_spec_sha256": st.spec.sha256, "host": st.host}

    def prepare(self, st):
        if st.profile.launcher != "local":
            return FabricGate.real_prepare(self, st)
        own = FabricState.of(st)
        own.bin_dir, own.nccl_lib, own.nccl_version = bins["dir"], Path("/pinned/nccl/lib"), "2.30.4"

    monkeypatch.setattr(FabricGate, "real_prepare", FabricGate.prepare, raising=False)
    monkeypatch.setattr(FabricGate, "sources", sources)
    monkeypatch.setattr(FabricGate, "prepare", prepare)
    return bins


def run_fabric(tmp_path: Path, **kw):
    from reprostack import sources
    from reprostack.fetch import Cache
    from reprostack.lock import load

    lock, fetch = load(ROOT / "upstreams.lock"), sources.FetchOptions(cache=Cache(tmp_path / "cache"))
    return gaterun.run(gaterun.options("fabric", root=ROOT, lock=lock, fetch=fetch, out_dir=tmp_path / "out", **kw))


def test_the_gate_runs_its_plans_commands_and_judges_them(spec, tmp_path, one_h200):
    one_h200["dir"] = fake_bin(
        tmp_path / "bin", {"all_reduce_perf": one_gpu(), "alltoall_perf": one_gpu(program="alltoall_perf")}
    )
    rep = run_fabric(tmp_path)  # the profile this host fits: h200-ep1
    assert rep.gate == "fabric" and rep.profile == "h200-ep1"
    assert rep.result == "fail" and rep.reason == "profile h200-ep1 has no measured bar yet; numbers reported"
    assert [c.metric for c in rep.checks if not c.passed] == ["bars_status"]  # every other check passed
    log = (tmp_path / "out" / "fabric" / "all_reduce.log").read_text()
    assert "# args: -b 8 -e 1G -f 2 -n 20 -w 5 -c 1 -g 1 -N 5" in log and "# LD_LIBRARY_PATH=/pinned/nccl/lib" in log
    assert rep.data["runs"]["alltoall"]["command"][0] == str(one_h200["dir"] / "alltoall_perf")
    assert rep.data["figures"][f"all_reduce.busbw_gbs@{GIB}"]["statistics"]["n"] == 5
    assert rep.data["statistics"][f"all_reduce.busbw_gbs@{GIB}"]["n"] == 5
    assert {a.path for a in rep.artifacts} == {"fabric/all_reduce.log", "fabric/alltoall.log"}


def test_a_test_that_exits_non_zero_is_an_error_with_its_failure_line(spec, tmp_path, one_h200):
    fix = ROOT / "tests" / "fixtures" / "nccl-tests" / "cpu-no-gpu"
    outputs = {f"{t}_perf": (fix / f"{t}_perf.log").read_text() for t in ("all_reduce", "alltoall")}
    one_h200["dir"] = fake_bin(tmp_path / "bin", outputs, rc=2)
    rep = run_fabric(tmp_path, profile="h200-ep1")
    assert rep.result == "error" and rep.reason.startswith("all_reduce exit 2: vm: Test CUDA failure util.cu:674")


def test_an_mpi_profile_is_an_error_saying_what_it_needs(tmp_path, one_h200, monkeypatch):
    from reprostack import hostinfo

    monkeypatch.setattr(hostinfo, "collect", lambda **kw: h200(8, efa=True))
    rep = run_fabric(tmp_path)
    assert rep.profile == "p5en-efa-ep16" and rep.result == "error"
    assert "cannot be launched by this runner: the deepep image's nccl-tests built with MPI=1" in rep.reason


def write_launched(out: Path, outputs: dict, rcs: dict, run_id: str = "4242") -> Path:
    """What the rendered sbatch's MPI steps leave in the out dir: <test>.log (every rank) and <test>.rc."""
    d = out / "fabric-mpi"
    d.mkdir(parents=True, exist_ok=True)
    for test, text in outputs.items():
        (d / f"{test}.log").write_text(text)
    for test, rc in rcs.items():
        (d / f"{test}.rc").write_text(f"{rc} {run_id}\n")
    return d


def test_the_mpi_launchs_logs_are_judged_by_the_runner(tmp_path, monkeypatch):
    """Issue 37 item 9: the 2 x p5en profile, started by MPI (srun --mpi=pmix / an MPIJob), judged by node 0's runner
    from the files the launch wrote (--launched-logs): the published bars on the interval of the cycles, the pinned
    NCCL (the nccl-wheel the deepep image installs), the transport of all 16 ranks; nothing is fetched or built."""
    from reprostack import hostinfo

    monkeypatch.setattr(hostinfo, "collect", lambda **kw: h200(8, efa=True))
    out = tmp_path / "out"
    d = write_launched(
        out, {"all_reduce": p5en_run(440.0), "alltoall": p5en_run(80.0)}, {"all_reduce": 0, "alltoall": 0}
    )
    rep = run_fabric(tmp_path, profile="p5en-efa-ep16", launched_logs=str(d), run_id="4242")
    assert rep.profile == "p5en-efa-ep16" and rep.result == "pass", rep.reason
    cs = by_metric(rep.checks)
    assert cs["all_reduce.busbw_gbs"].passed and cs["all_reduce.busbw_gbs"].threshold == 349.56
    assert cs["all_reduce.nccl_library"].passed and cs["transport"].value == "NET/OFI efa"
    assert {a.path for a in rep.artifacts} == {"fabric-mpi/all_reduce.log", "fabric-mpi/alltoall.log"}
    assert rep.data["launch"]["ranks"] == 16 and "sources_reused" not in rep.data
    # verify-report re-derives it from the launch's logs, where the rendered steps wrote them
    import yaml

    got = rederive_fabric(rep.to_dict(), out, yaml.safe_load((ROOT / "gates" / "fabric.yaml").read_text()), "fabric")
    assert got.values["all_reduce.rows"] == 140 and got.figures[f"all_reduce.busbw_gbs@{GIB}"][:1] == [439.0]
    # a test whose step left no rc of this run (another job's, or none) is an ERROR naming the file, never a verdict
    d = write_launched(out, {}, {"alltoall": 0}, run_id="1111")
    rep = run_fabric(tmp_path, profile="p5en-efa-ep16", launched_logs=str(d), run_id="4242")
    assert rep.result == "error" and rep.reason.startswith("alltoall no rc of this run in ")
    # ... and a rank on sockets fails the transport naming it
    write_launched(out, {"all_reduce": p5en_run(440.0, socket_rank=11)}, {"all_reduce": 0, "alltoall": 0})
    rep = run_fabric(tmp_path, profile="p5en-efa-ep16", launched_logs=str(d), run_id="4242")
    assert rep.result == "fail" and by_metric(rep.checks)["transport"].value.startswith("all_reduce: rank 11")


def test_a_host_no_profile_fits_is_a_skip(tmp_path, one_h200, monkeypatch):
    from reprostack import hostinfo

    monkeypatch.setattr(hostinfo, "collect", lambda **kw: h200(3))
    rep = run_fabric(tmp_path)
    assert rep.result == "skip" and "no profile for this host (3 GPU(s), EFA: False)" in rep.reason


def test_the_cli_plans_every_profile_and_refuses_a_bad_one(tmp_path, capsys):
    from reprostack import cli

    for profile in load_fabric_spec(ROOT).profiles:
        assert cli.main(["gate", "fabric", "--plan", "--profile", profile, "--out", str(tmp_path / "o")]) == 0
        text = capsys.readouterr().out
        assert f"launch plan: gate fabric [{profile}] (nothing was run)" in text and "all_reduce_perf" in text
    assert not (tmp_path / "o").exists()
    assert cli.main(["gate", "fabric", "--profile", "nope", "--out", str(tmp_path / "o")]) == 2
    assert "no profile 'nope'" in capsys.readouterr().err


# --------------------------------------------------------------------------- the device script


@pytest.mark.parametrize(
    "have, message",
    [
        ((), "no NCCL 2.30.4 wheel in .cache/wheelhouse: seed it first"),
        (
            (".cache/wheelhouse/nvidia_nccl_cu13-2.30.4-py3-none-manylinux_2_18_x86_64.whl",),
            "missing .carry/sources.tar",
        ),
    ],
)
def test_the_device_script_names_what_is_missing(tmp_path, have, message):
    import shutil
    import subprocess

    root = tmp_path / "root"
    (root / "scripts" / "device").mkdir(parents=True)
    for s in ("gate_fabric.sh", "seed_wheelhouse.sh"):
        shutil.copy(ROOT / "scripts" / "device" / s, root / "scripts" / "device" / s)
    for f in have:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_bytes(b"")
    r = subprocess.run(
        ["bash", "scripts/device/gate_fabric.sh"],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "OUT": str(tmp_path / "out"), "REPROSTACK_CACHE": str(tmp_path / "c")},
    )
    assert r.returncode == 2 and r.stderr.startswith(message) and r.stderr.count("\n") == 1


# --------------------------------------------------------------------------- the one-GPU bar per GPU model


def baseline_run(
    root: Path, name: str, *, gpu="NVIDIA H200", profile="h200-ep1", algbw=2100.0, result="fail", extra_fail=False
):
    """A report as `reprostack gate fabric` writes it (the keys evidence.bars.baseline reads): a one-GPU run whose one failed
    check is bars_status (the profile's first runs), its algbw statistics at 1 GiB and its host's GPUs."""
    import json

    checks = [{"metric": "all_reduce.rows", "pass": True}, {"metric": "transport", "pass": True}]
    checks += [{"metric": "bars_status", "pass": result == "pass"}] + [
        {"metric": "alltoall.rows", "pass": not extra_fail}
    ]
    stats = {f"{t}.algbw_gbs@{GIB}": {"mean": algbw, "n": 5} for t in ("all_reduce", "alltoall")}
    doc = {
        "gate": "fabric",
        "profile": profile,
        "result": result,
        "checks": checks,
        "data": {"statistics": stats, "bars_status": "measured" if result == "pass" else "unmeasured"},
        "provenance": {"stack": "campaign", "host": {"gpus": [{"name": gpu}]}},
    }
    d = root / "results" / "gate_fabric" / "baseline" / profile / name
    d.mkdir(parents=True)
    (d / "fabric.json").write_text(json.dumps(doc))


def test_one_gpu_bar_is_measured_from_the_committed_runs_of_its_gpu_model(tmp_path):
    """Issue 37 item 9: on one GPU the gate could only FAIL ("no measured bar yet"). Its bar is now the median of the
    accepted runs committed under the profile's runs-from, of that profile's GPU model only (an H100 run never makes
    an H200 bar), x (1 - 0.1); fewer than 3 runs: still no measured bar, saying what is missing."""
    from reprostack.gates.fabric_spec import resolve_bars

    root = tmp_path / "root"
    (root / "gates").mkdir(parents=True)
    (root / "gates" / "fabric.yaml").write_text((ROOT / "gates" / "fabric.yaml").read_text())
    spec = load_fabric_spec(root)
    prof, why = resolve_bars(root, spec.profile("h200-ep1"))
    assert not prof.measured and prof.bars == () and "0 accepted H200 run(s) of 3" in why
    baseline_run(root, "a", algbw=2000.0)
    baseline_run(root, "b", algbw=2100.0)
    baseline_run(root, "h100", gpu="NVIDIA H100 80GB HBM3", algbw=900.0)  # another GPU model: never taken
    baseline_run(root, "broken", algbw=10.0, extra_fail=True)  # another failed check: never an accepted run
    prof, why = resolve_bars(root, spec.profile("h200-ep1"))
    assert not prof.measured and "2 accepted H200 run(s) of 3" in why
    baseline_run(root, "c", algbw=2200.0, result="pass")
    prof, why = resolve_bars(root, spec.profile("h200-ep1"))
    assert prof.measured and why == ""
    bar = prof.bars[0]
    assert (bar.metric, bar.published, bar.threshold) == ("all_reduce.algbw_gbs", 2100.0, 1890.0)
    assert (
        "baseline: median 2100 GB/s of 3 accepted run(s)" in bar.source
        and "baseline/h200-ep1/c/fabric.json" in bar.source
    )
    # judged like any bar: the local copy's algbw at 1 GiB on the interval of the run's cycles
    good = fjudge.parse({t: one_gpu(lambda s, c: 2050.0 + c) for t in ("all_reduce", "alltoall")})
    slow = fjudge.parse({t: one_gpu(lambda s, c: 1500.0 + c) for t in ("all_reduce", "alltoall")})
    cs = by_metric(fjudge.checks(spec, prof, good, nccl_version="2.30.4"))
    assert (
        cs["all_reduce.algbw_gbs"].passed
        and "measured (median of the accepted runs)" in cs["all_reduce.algbw_gbs"].note
    )
    assert not by_metric(fjudge.checks(spec, prof, slow, nccl_version="2.30.4"))["alltoall.algbw_gbs"].passed
    # the H100 profile's bar comes from H100 runs only: the H200 runs above make none
    prof, why = resolve_bars(root, spec.profile("h100-ep1"))
    assert not prof.measured and "0 accepted H100 run(s) of 3 under results/gate_fabric/baseline/h100-ep1" in why


def test_the_device_script_makes_the_runs_a_bar_is_made_of(tmp_path):
    """scripts/device/gate_fabric.sh picks the profile of the GPU model nvidia-smi names (H100 -> h100-ep1) and runs the
    gate FABRIC_RUNS times, each into its own folder under $OUT/baseline/<profile>/ (what the bar's runs-from reads).
    The GPU and the gate are stood in here: nvidia-smi and the python that runs `reprostack gate` are scripts that
    record what they were asked."""
    import shutil
    import subprocess

    root = tmp_path / "root"
    (root / "scripts" / "device").mkdir(parents=True)
    for s in ("gate_fabric.sh", "seed_wheelhouse.sh"):
        shutil.copy(ROOT / "scripts" / "device" / s, root / "scripts" / "device" / s)
    for f in (".cache/wheelhouse/nvidia_nccl_cu13-2.30.4-py3-none-manylinux_2_18_x86_64.whl", ".carry/sources.tar"):
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_bytes(b"")
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 580.65.06, 9.0'\n")
    (stub / "py").write_text(
        '#!/bin/sh\n[ "$1" = -c ] && exit 0\nwhile [ $# -gt 0 ]; do [ "$1" = --out ] && o=$2; '
        '[ "$1" = --profile ] && p=$2; shift; done\necho "{\\"profile\\": \\"$p\\"}" > "$o/fabric.json"; exit 1\n'
    )
    for f in stub.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"), "FABRIC_RUNS": "2"}
    env.update(REPROSTACK_TORCH_PYTHON=str(stub / "py"), REPROSTACK_CACHE=str(tmp_path / "c"))
    r = subprocess.run(["bash", "scripts/device/gate_fabric.sh"], cwd=root, capture_output=True, text=True, env=env)
    assert r.returncode == 1, r.stderr  # the gate's: FAIL (no measured bar yet), the worst of the runs
    runs = sorted((tmp_path / "out" / "baseline" / "h100-ep1").iterdir())
    assert [p.name.endswith(f"-h100-run{i}") for i, p in enumerate(runs, 1)] == [True, True]
    assert all((p / "fabric.json").read_text().strip() == '{"profile": "h100-ep1"}' for p in runs)
