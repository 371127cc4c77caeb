"""The transport proof per rank (issue 25 item 6): gates.parsers.transport, the one reader of NCCL's per-process
lines, and gates.transport, the one judge, on the published campaign's real p5en log (16 ranks, 2 nodes), the lent
H200's real logs (one node, no network), and those real lines with one process edited into NCCL's own fallback
lines (tests/p5enlog.py); then the judge stage of micro, megatron and nemo-rl on an EFA profile."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest

import p5enlog
from reprostack.gates import transport
from reprostack.gates.nemo_rl import nemo_rl_checks
from reprostack.gates.parsers.training import parse_megatron, parse_nemo_rl
from reprostack.gates.parsers.transport import NONE_ONE_NODE, nccl_host, parse_transport
from reprostack.gates.spec import load_spec
from reprostack.evidence.judge.megatron import arm_checks
from reprostack.gates.training_spec import load_training_spec
from reprostack.report import decide
from test_gate_micro_flow import gpu_host  # noqa: F401  (fixture: the GPU parts stood in for)

REPO_ROOT = Path(__file__).resolve().parents[1]
H200_FABRIC = REPO_ROOT / "tests" / "fixtures" / "nccl-tests" / "real" / "h200-ep1-all_reduce.log"
H200_MEGATRON = REPO_ROOT / "results" / "gate_megatron" / "2026-11-29-h200-ep1" / "megatron"
H200_MICRO = REPO_ROOT / "results" / "gate_micro" / "2026-12-02-h200-ep1-k5" / "micro" / "test_ep.log"
NCCL_OK = {"runtime": "2.30.4", "pinned": "2.30.4", "mapped": ["/x/libnccl.so.2.30.4"]}


def p5en(**kw) -> str:
    return "\n".join(p5enlog.edited(**kw)) + "\n"


def micro_need(stack_env: dict | None = None):
    spec = load_spec(REPO_ROOT, "micro")
    prof = spec.profile("p5en-efa-ep16")
    return transport.need(prof, {**spec.env, **prof.env, **(stack_env or {})}, gin=True)


# --------------------------------------------------------------------------- the reader, on real logs


def test_the_published_p5en_log_gives_every_rank_its_plugin_provider_and_gin():
    p = parse_transport(p5en())
    assert [t.rank for t in p.ranks] == list(range(16)) and p.nranks == 16 and p.unattributed == ()
    assert p.hosts == {"deepep-efa-bench-0", "deepep-efa-bench-1"}
    assert {(t.transport, t.net_plugin, t.provider, t.fabric, t.networks, t.gin) for t in p.ranks} == {
        ("NET/OFI efa", "Libfabric (v12)", "efa", "efa-direct", ("Libfabric",), "Libfabric")
    }
    # NCCL 2.30.4 prints no GIN type (its `Assigned GIN plugin NAME to comm` has none), nor NCCL_GIN_TYPE (no ENV)
    assert {(t.gin_type, t.gin_type_env, t.gin_off) for t in p.ranks} == {(None, None, None)}
    assert (p.ranks[11].host, p.ranks[11].pid, p.ranks[11].device) == ("deepep-efa-bench-1", 81187, 3)


def test_the_h200_fabric_log_is_one_node_without_network_and_without_gin():
    p = parse_transport(H200_FABRIC.read_text())
    (t,) = p.ranks
    assert (t.rank, t.host, t.transport, t.networks) == (0, "vm", NONE_ONE_NODE, ("Socket",))
    assert t.gin is None and t.gin_off == "Failed to initialize any GIN plugin"


def test_the_h200_micro_and_megatron_logs_have_no_nccl_lines_at_all():
    """NCCL_DEBUG was not set on the lent H200 (one node, EP_DISABLE_GIN=1): nothing to read, nothing assumed."""
    for text in (H200_MICRO.read_text(), (H200_MEGATRON / "deepep.log").read_text()):
        p = parse_transport(text)
        assert p.ranks == () and p.unattributed == () and p.nranks is None


def test_a_rank_falling_back_to_sockets_is_named_with_its_host():
    p = parse_transport(p5en(socket=11))
    bad = {t.rank: t for t in p.ranks if t.transport != transport.EFA_TRANSPORT}
    assert list(bad) == [11] and bad[11].transport == "Socket" and bad[11].provider is None
    assert bad[11].networks == ("Socket",)


def test_ray_and_launcher_prefixes_before_the_nccl_line_are_skipped():
    """NeMo-RL's head log carries the workers' lines behind Ray's `(Actor pid=N, ip=A)`; torchrun's `[rank3]:`."""
    lines = p5enlog.nccl_lines()
    text = "\n".join(
        (f"(MegatronPolicyWorker pid={1000 + i}, ip=10.1.0.{i % 2}) " if i % 2 else f"[default{i % 8}]:") + ln
        for i, ln in enumerate(lines)
    )
    p = parse_transport(text)
    assert len(p.ranks) == 16 and {t.transport for t in p.ranks} == {transport.EFA_TRANSPORT}


def test_sub_group_communicators_never_take_a_global_rank():
    """Megatron and NeMo-RL processes also join TP/EP/DP groups: their init lines name sub-group ranks (0..7 of a
    node's group on node 1); only the widest communicator's ranks are the global ones."""
    lines = p5enlog.nccl_lines()
    where = p5enlog.ranks()
    for rank, (host, pid, dev) in where.items():  # NCCL's init line of an 8-rank sub-group, per process
        lines.append(
            f"{host}:{pid}:{pid} [{dev}] NCCL INFO [Rank {rank % 8}] ncclCommInitRankConfig comm 0x55aa{rank:02d} "
            f"rank {rank % 8} nranks 8 cudaDev {dev} nvmlDev {dev} busId 59000 commId 0x99 - Init START"
        )
    p = parse_transport("\n".join(lines))
    assert p.nranks == 16 and {t.rank: (t.host, t.pid) for t in p.ranks} == {r: w[:2] for r, w in where.items()}


def test_the_caller_s_records_place_a_rank_before_nccl_s_init_lines():
    """The trials driver's per-rank record (host, pid) names the rank; NCCL prints the host up to its first dot."""
    where = p5enlog.ranks()
    host, pid, _ = where[5]
    known = {5: (nccl_host(host + ".ec2.internal"), pid, None)}
    p = parse_transport(p5en(), known)
    assert (p.ranks[5].host, p.ranks[5].pid, p.ranks[5].device) == (host, pid, where[5][2])


@pytest.mark.parametrize(
    "line, gin, gin_type, off",
    [
        # NCCL v2.30.7-1 src/plugin/gin.cc:158 INFO(NCCL_INIT | NCCL_NET, "GIN/Plugin: Assigned plugin %s type %d to comm")
        ("GIN/Plugin: Assigned plugin Libfabric type 5 to comm", "Libfabric", 5, None),
        ("GIN/Plugin: Assigned plugin Libfabric type 2 to comm", "Libfabric", 2, None),
        # aws-ofi-nccl v1.21.1 src/rdma/gin/nccl_ofi_gin_gdaki.cpp:883 (NCCL_OFI_INFO prefixes `NET/OFI `)
        (
            "NET/OFI gin GDAKI: createContext done (nranks=16 rank=3 nSignals=20 nCounters=0 nContexts=6 "
            "num_rails=2 effective_rails=2)",
            "Libfabric",
            5,
            None,
        ),
        # v2.30.7-1 src/plugin/gin.cc:302
        (
            "GIN/Plugin: Failed to initialize any GIN plugin",
            None,
            None,
            "GIN/Plugin: Failed to initialize any GIN plugin",
        ),
    ],
)
def test_gin_lines_of_later_nccl_and_of_the_plugin(line, gin, gin_type, off):
    lines = [ln for ln in p5enlog.nccl_lines() if "GIN plugin" not in ln and "gin plugin" not in ln]
    host, pid, dev = p5enlog.ranks()[3]
    lines.append(f"{host}:{pid}:{pid} [{dev}] NCCL INFO {line}")
    t = parse_transport("\n".join(lines)).ranks[3]
    assert (t.gin, t.gin_type, t.gin_off) == (gin, gin_type, off)


def test_hostile_lines_never_raise_and_stay_bounded():
    assert parse_transport(None).problems == ("output is not text",)
    assert parse_transport(b"bytes").ranks == ()
    flood = "\n".join(f"h{i}:{i}:1 [0] NCCL INFO Using network Socket" for i in range(6000))
    p = parse_transport(flood + "\n" + "x" * 10_000 + "\n")
    assert len(p.unattributed) <= 4096 and p.problems == ("1 line(s) over 4096 characters skipped",)
    forged = "\n".join(
        f"h:1:1 [0] NCCL INFO comm 0x1 rank {r} nranks 99999 cudaDev {r} - Init START" for r in range(9000)
    )
    assert len(parse_transport(forged).ranks) <= 4096


# --------------------------------------------------------------------------- the judge


def test_what_each_profile_and_stack_needs():
    need = micro_need()
    assert (need.network, need.ranks, need.gin, need.gin_type, need.gpu_initiated) == (
        "NET/OFI efa",
        16,
        True,
        2,
        False,
    )
    gda = micro_need({"NCCL_GIN_TYPE": "5", "OFI_NCCL_GIN_GDAKI": "1"})  # the gin-gdaki stack's env (upstreams.lock)
    assert (gda.gin_type, gda.gpu_initiated) == (5, True)
    spec = load_spec(REPO_ROOT, "micro")
    one = spec.profile("h200-ep1")
    assert transport.need(one, {**spec.env, **one.env}, gin=True) is None
    assert transport.no_network(one).startswith("profile h200-ep1 is 1 node(s) without EFA (one GPU, no peer)")
    assert "8 GPUs over NVLink" in transport.no_network(spec.profile("h200-nvl-ep8"))


def test_the_published_log_passes_the_campaign_need_and_names_what_it_saw():
    c = transport.check("transport", micro_need(), parse_transport(p5en()))
    assert c.passed and c.value == "NET/OFI efa"
    assert "GIN Libfabric x16" in c.note and "provider efa x16" in c.note


@pytest.mark.parametrize(
    "edit, says",
    [
        ({"socket": 11}, "rank 11 (deepep-efa-bench-1) Socket ["),
        ({"gin_off": 3}, "rank 3 (deepep-efa-bench-0) GIN off: Failed to initialize any GIN plugin"),
    ],
)
def test_a_fallback_fails_naming_the_rank(edit, says):
    c = transport.check("transport", micro_need(), parse_transport(p5en(**edit)))
    assert not c.passed and says in c.value and c.value.count("rank ") == 1


def test_a_second_plugin_and_a_stray_process_fail():
    lines = p5enlog.nccl_lines()
    host, pid, dev = p5enlog.ranks()[7]
    lines.append(f"{host}:{pid}:{pid} [{dev}] NCCL INFO Assigned NET plugin IB to comm")
    lines.append("deepep-efa-bench-1:99999:99999 [0] NCCL INFO Using network Socket")  # no rank line names it
    c = transport.check("transport", micro_need(), parse_transport("\n".join(lines)))
    assert "rank 7 (deepep-efa-bench-0) took a second net plugin: Libfabric, IB" in c.value
    assert "process deepep-efa-bench-1:99999 (no rank line) Socket" in c.value and not c.passed


def test_missing_ranks_fail_never_shrink_the_expected_set():
    text = "\n".join(ln for ln in p5enlog.nccl_lines() if not ln.startswith("deepep-efa-bench-1:"))
    c = transport.check("transport", micro_need(), parse_transport(text))
    assert not c.passed and c.value == "rank(s) 8-15 not in the output"


def test_a_gpu_initiated_stack_needs_a_line_showing_its_gin_type():
    """gin-gdaki asks for type 5 (EFA-GDA): 2.30.4's untyped `Assigned GIN plugin` is not proof; the CPU proxy
    (type 2) is a fallback; aws-ofi-nccl's `gin GDAKI: createContext done` or NCCL's typed line is the proof."""
    need = micro_need({"NCCL_GIN_TYPE": "5"})
    c = transport.check("transport", need, parse_transport(p5en()))
    assert not c.passed and "rank 0 (deepep-efa-bench-0) no line shows GIN type 5 (EFA-GDA) ran" in c.value
    where = p5enlog.ranks()
    typed, proxy = p5enlog.nccl_lines(), p5enlog.nccl_lines()
    for rank, (host, pid, dev) in where.items():
        typed.append(f"{host}:{pid}:{pid} [{dev}] NCCL INFO GIN/Plugin: Assigned plugin Libfabric type 5 to comm")
        proxy.append(
            f"{host}:{pid}:{pid} [{dev}] NCCL INFO GIN/Plugin: Assigned plugin Libfabric type {5 if rank else 2} to comm"
        )
    assert transport.check("transport", need, parse_transport("\n".join(typed))).passed
    c = transport.check("transport", need, parse_transport("\n".join(proxy)))
    assert (
        not c.passed and c.value == "rank 0 (deepep-efa-bench-0) GIN type 2 (proxy) ran, the stack asks for 5 (EFA-GDA)"
    )


# --------------------------------------------------------------------------- megatron and nemo-rl judge stages


def megatron_arm(arm: str, nccl: str) -> str:
    """The real H200 arm log with both nodes' EFA counters and the 16 ranks' NCCL lines."""
    text = (
        (H200_MEGATRON / f"{arm}.log")
        .read_text()
        .replace(
            "transport: node=0 no EFA device", "transport: node=0 efa_tx_bytes=700000000 source=hw_counters devices=16"
        )
    )
    return text + "[megatron-moe] transport: node=1 efa_tx_bytes=600000000 source=hw_counters devices=16\n" + nccl


def megatron_checks(deepep: str, alltoall: str) -> list:
    spec = load_training_spec(REPO_ROOT, "megatron")
    prof = spec.profile("p5en-efa-ep16")
    checks = []
    for arm, text in (("deepep", deepep), ("alltoall", alltoall)):
        checks += arm_checks(spec, prof, arm, parse_megatron(text, expected_steps=spec.steps), {}, NCCL_OK)
    return checks


def test_megatron_rank_on_sockets_fails_the_deepep_arm_naming_it():
    """The campaign's provider line is in the log (15 ranks print it): the old judge took one line for the whole run
    and passed; per rank, rank 11's fall back to sockets fails the arm."""
    checks = megatron_checks(megatron_arm("deepep", p5en(socket=11)), megatron_arm("alltoall", p5en()))
    bad = {c.metric: c for c in checks if not c.passed}
    assert list(bad) == ["deepep.transport"] and "rank 11 (deepep-efa-bench-1) Socket" in bad["deepep.transport"].value
    assert decide(checks, ran_ok=True)[0] == "fail"


def test_megatron_gin_is_needed_by_the_deepep_arm_only():
    checks = megatron_checks(megatron_arm("deepep", p5en()), megatron_arm("alltoall", p5en(gin_off=4)))
    assert all(c.passed for c in checks), [c for c in checks if not c.passed]
    checks = megatron_checks(megatron_arm("deepep", p5en(gin_off=4)), megatron_arm("alltoall", p5en()))
    assert [c.metric for c in checks if not c.passed] == ["deepep.transport"]


def test_megatron_one_node_says_why_no_transport_is_checked():
    spec = load_training_spec(REPO_ROOT, "megatron")
    data: dict = {}
    parsed = parse_megatron((H200_MEGATRON / "deepep.log").read_text(), expected_steps=spec.steps)
    checks = arm_checks(spec, spec.profile("h200-ep1"), "deepep", parsed, data, NCCL_OK)
    assert not any(c.metric.endswith("transport") for c in checks)
    assert data["transport"] == {"checked": False, "why": transport.no_network(spec.profile("h200-ep1"))}


def test_nemo_rl_ranks_behind_ray_prefixes_are_judged():
    spec = load_training_spec(REPO_ROOT, "nemo_rl")
    prof = spec.profile("p5en-efa-2x8")
    grpo = (REPO_ROOT / "tests" / "fixtures" / "training" / "nemo_rl_grpo_3steps.log").read_text()

    def run(nccl: list[str]):
        text = grpo + "\n".join(
            f"(MegatronPolicyWorker pid=4{i:03d}, ip=10.1.0.{i % 2}) {ln}" for i, ln in enumerate(nccl)
        )
        return nemo_rl_checks(spec, prof, parse_nemo_rl(text, expected_steps=3))

    checks, m = run(p5enlog.edited())
    assert decide(checks, ran_ok=True)[0] == "pass" and m["transport"]["checked"] is True
    checks, _ = run(p5enlog.edited(socket=2))
    assert [c.metric for c in checks if not c.passed] == ["transport"]
    checks, _ = run([])  # no NCCL line at all: never assumed
    bad = [c for c in checks if not c.passed]
    assert [c.metric for c in bad] == ["transport"] and bad[0].value == "rank(s) 0-15 not in the output"


# --------------------------------------------------------------------------- micro, the gate's own run


def ep16_test_ep(shift: float = 0.0) -> str:
    """test_ep.py's output at EP16 in its printed shapes (figures invented; the transport is what is tested)."""
    from test_gate_micro_flow import MARKS

    out = [
        "Config:",
        " > Ranks: 2 x 8",
        " > Experts: 16/256",
        " > Tokens: 128 (max: 128), hidden: 7168",
        " > #SM: 4, #QPs: 6/6",
        "",
        "Running all test cases:",
        " > Testing with do_handle_copy=1, expert_alignment=128, use_fp8_dispatch=1, num_bias=0, "
        "with_previous_event=0, async_with_compute_stream=0, allocate_on_comm_stream=0 ...",
    ]
    for i, (m, phase, aux) in enumerate(MARKS):
        for r in range(16):
            out.append(
                f"   {m} EP: {r:3}/16 | {phase}: 25 GB/s (SO), {100 + i} GB/s (SU), "
                f"{200.0 + 10 * i + shift:.3f} us, 1500000 bytes | {aux}: 800 GB/s, 3.000 us"
            )
    return "\n".join(out) + "\n"


def micro_logs(tmp_path: Path, **edit) -> tuple[str, Path]:
    """(the stand-in interpreter that prints node 0's log, node 1's log in place): two trials of the 16 ranks,
    each rank's one-NCCL record with its host and pid, the real NCCL lines of its process (node 0's host name
    made this machine's, as the one-NCCL check reads this host's records)."""
    from trialslog import marker, trials_log

    me = nccl_host(socket.gethostname())
    lib = tmp_path / "builds" / "nccl" / "build" / "lib" / "libnccl.so.2"
    lib.parent.mkdir(parents=True, exist_ok=True)
    lib.write_bytes(b"stand-in libnccl")
    where = p5enlog.ranks()
    nccl = p5enlog.edited(hosts={"deepep-efa-bench-0": me}, **edit)
    body = trials_log([ep16_test_ep(), ep16_test_ep(1.0)], num_ranks=16).split("\n")
    at = next(i for i, ln in enumerate(body) if '"event": "done"' in ln)
    records = []
    for r in range(16):
        host, pid, _ = where[r]
        records.append(
            marker(
                event="nccl",
                rank=r,
                host=socket.gethostname() if r < 8 else host,
                pid=pid,
                runtime="2.30.4",
                mapped=[os.path.realpath(lib)],
                deleted=[],  # the driver's record since every mapping counts (issue 29 item 1)
                torch_built_with="2.30.4",
                deep_ep="/x/deep_ep",
            )
        )
    node0 = [ln for ln in nccl if ln.startswith(me + ":")]
    node1 = [ln for ln in nccl if not ln.startswith(me + ":")]
    log0 = tmp_path / "node0.log"
    log0.write_text("\n".join(node0 + body[:at] + records + body[at:]))
    run_dir = tmp_path / "out" / "micro"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "test_ep.node1.log").write_text("\n".join(node1) + "\n")
    # node 1's part done, as the output contract says (launch.plan.Outputs): node 0 judges only once it is there
    from reprostack.launch.plan import Outputs, rc_text

    rc = tmp_path / "out" / Outputs(2).node_rc(1)
    rc.parent.mkdir(parents=True, exist_ok=True)
    rc.write_text(rc_text(0, None))
    py = tmp_path / "py"
    py.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\ncat {log0}\n')
    py.chmod(py.stat().st_mode | stat.S_IXUSR)
    return str(py), run_dir


@pytest.fixture
def p5en_node(gpu_host):
    gpu_host.update(gpu_count=8, efa_devices=[f"uverbs{i}" for i in range(16)])
    return gpu_host


def run_micro_node0(tmp_path: Path, py: str):
    from gaterun import run as run_gate_here
    from test_gate_micro_flow import options

    return run_gate_here(
        options(
            tmp_path,
            py,
            profile="p5en-efa-ep16",
            nodes=2,
            node_rank=0,
            master_addr="127.0.0.1",
            master_port=29555,
            trials=2,
        )
    )


def test_micro_rank_on_sockets_fails_the_gate_naming_it(tmp_path, p5en_node):
    """Node 0 of the EP16 run judges both nodes' logs: rank 11 (node 1) fell back to sockets -> FAIL naming it."""
    py, _ = micro_logs(tmp_path, socket=11)
    rep = run_micro_node0(tmp_path, py)
    t = next(c for c in rep.checks if c.metric == "transport")
    assert rep.result == "fail" and not t.passed and "transport" in rep.reason
    assert t.value.startswith("rank 11 (deepep-efa-bench-1) Socket [") and t.value.count("rank ") == 1
    ranks = {r["rank"]: r for r in rep.data["transport"]["ranks"]}
    assert len(ranks) == 16 and ranks[11]["transport"] == "Socket" and ranks[0]["pid"] == p5enlog.ranks()[0][1]


def test_micro_every_rank_over_efa_passes_the_transport(tmp_path, p5en_node):
    py, _ = micro_logs(tmp_path)
    rep = run_micro_node0(tmp_path, py)
    t = next(c for c in rep.checks if c.metric == "transport")
    assert t.passed and t.value == "NET/OFI efa" and "16 rank(s) on 2 host(s)" in t.note, t
    assert rep.data["transport"]["need"] == {"network": "NET/OFI efa", "ranks": 16, "gin": True, "gin_type": 2}
    assert all(c.passed for c in rep.checks), [c for c in rep.checks if not c.passed]
    assert json.dumps(rep.data["transport"])  # JSON-ready


def test_micro_gin_off_on_one_rank_fails_the_gate(tmp_path, p5en_node):
    py, _ = micro_logs(tmp_path, gin_off=12)
    rep = run_micro_node0(tmp_path, py)
    t = next(c for c in rep.checks if c.metric == "transport")
    assert not t.passed and t.value == "rank 12 (deepep-efa-bench-1) GIN off: Failed to initialize any GIN plugin"


def test_micro_on_one_node_reports_why_no_network_is_checked(tmp_path, gpu_host):
    from gaterun import run as run_gate_here
    from test_gate_micro_flow import options, stand_in_python
    from trialslog import real_ep1_texts, trials_log

    rep = run_gate_here(options(tmp_path, stand_in_python(tmp_path, trials_log(real_ep1_texts(3))), trials=3))
    assert rep.profile == "h200-ep1" and not any(c.metric == "transport" for c in rep.checks)
    why = transport.no_network(load_spec(REPO_ROOT, "micro").profile("h200-ep1"))
    assert rep.data["transport"] == {"checked": False, "why": why}


# --- serving gates (vllm, sglang, trtllm): the arm that runs DeepEP ----------------------------------------------


def serving_checks(gate: str, text: str, profile: str = "p5en-efa-ep16"):
    """The deepep arm's checks as the serving gate's judge makes them (evidence.judge.serving.checks_of) from the server logs `text`:
    the backend assertion (parsers.servelog) and the transport proof (evidence.judge.serving.arm_transport), env as the plan's."""
    from types import SimpleNamespace

    from reprostack.evidence.judge.serving import arm_transport, checks_of
    from reprostack.gates.base import env_tuple
    from reprostack.gates.parsers.servelog import assert_backend
    from reprostack.gates.servingspec import load_serving_spec

    spec = load_serving_spec(REPO_ROOT, gate)
    prof = spec.profiles[profile]
    arm = next(a for a in spec.arms.values() if a.role == "deepep")
    env = dict(env_tuple((prof.server or spec.server).get("env", {}), prof.env, arm.env))  # as server_command
    required, forbidden, _ = spec.assertion(prof)
    backend = assert_backend(
        text,
        num_ranks=prof.ep_size,
        gpus_per_node=prof.gpus_per_node,
        required=list(required),
        forbidden=list(forbidden),
    )
    data, check = arm_transport(prof, env, arm.name, text)
    run = SimpleNamespace(arm=arm, backend=backend, cells=[], transport=data, transport_check=check, skipped=None)
    return {c.metric: c for c in checks_of(spec, prof, [run])}, data, arm.name


@pytest.mark.parametrize("gate", ["vllm", "sglang", "trtllm"])
def test_serving_deepep_arm_on_the_published_log_passes_the_transport(gate):
    checks, data, arm = serving_checks(gate, p5en())
    t = checks[f"{arm}.transport"]
    assert t.passed and t.value == "NET/OFI efa" and "16 rank(s) on 2 host(s)" in t.note, t
    assert data["need"] == {"network": "NET/OFI efa", "ranks": 16, "gin": True, "gin_type": 2}
    assert json.dumps(data)


def test_serving_gin_off_on_one_rank_fails_where_the_backend_assertion_passed():
    """Rank 12's comm got no GIN plugin (`Failed to initialize any GIN plugin`): every rank still printed `Selected
    provider is efa`, so the backend assertion alone (the serving gates' only check before) passed it."""
    checks, _, arm = serving_checks("vllm", p5en(gin_off=12))
    assert checks[f"{arm}.backend.Selected provider is efa"].passed  # what the old code judged: a pass
    t = checks[f"{arm}.transport"]
    assert not t.passed and t.value == "rank 12 (deepep-efa-bench-1) GIN off: Failed to initialize any GIN plugin"


def test_serving_rank_on_sockets_fails_the_transport_naming_it():
    checks, _, arm = serving_checks("sglang", p5en(socket=11))
    t = checks[f"{arm}.transport"]
    assert not t.passed and t.value.startswith("rank 11 (deepep-efa-bench-1) Socket [") and t.value.count("rank ") == 1


def test_serving_one_node_profile_says_why_no_transport_is_checked():
    from reprostack.gates.servingspec import load_serving_spec

    spec = load_serving_spec(REPO_ROOT, "vllm")
    one = next(n for n, p in spec.profiles.items() if p.nodes == 1 and not p.needs_efa)
    checks, data, arm = serving_checks("vllm", p5en(), profile=one)
    assert f"{arm}.transport" not in checks and data["checked"] is False
    assert "no per-rank transport is checked" in data["why"]
