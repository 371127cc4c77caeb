"""The dense comparison arm on the CPU: the driver's routing / send-count math (pure Python, no torch), the
parser of its output (synthetic fixtures, tests/fixtures/arms/README.md) and its metrics; its launch (inside the
trials driver) is tested in tests/test_micro_trials.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from reprostack.gates import metrics
from reprostack.launch import torchrun
from reprostack.gates.parsers.dense_a2a import parse_dense

REPO_ROOT = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures" / "arms"


def _driver():
    spec = importlib.util.spec_from_file_location("dense_a2a", REPO_ROOT / "gates" / "drivers" / "dense_a2a.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


drv = _driver()


# --------------------------------------------------------------------------- routing math


def test_driver_imports_without_torch():
    assert "torch" not in drv.__dict__  # torch is imported inside main() only


def test_tokens_per_rank_follow_test_ep():
    assert [drv.tokens_of_rank(128, r) for r in (0, 1, 7, 127, 200)] == [128, 127, 121, 1, 1]


def test_route_is_deterministic_distinct_and_seeded():
    a = drv.route(128, 256, 8, seed=0, rank=3)
    assert a == drv.route(128, 256, 8, seed=0, rank=3)
    assert len(a) == 125 and all(len(t) == 8 and len(set(t)) == 8 and all(0 <= e < 256 for e in t) for t in a)
    assert a != drv.route(128, 256, 8, seed=1, rank=3) and a != drv.route(128, 256, 8, seed=0, rank=4)


@pytest.mark.parametrize(
    "args,msg",
    [
        ((0, 256, 8, 0, 0), "num_tokens must be >= 1"),
        ((8, 4, 8, 0, 0), r"topk must be in 1\.\.num_experts \(4\), not 8"),
    ],
)
def test_route_bad_input(args, msg):
    with pytest.raises(ValueError, match=msg):
        drv.route(*args)


def test_dest_ranks_map_expert_to_rank_by_integer_division():
    # 256 experts over 8 ranks: 32 per rank; duplicates collapse, order is ascending
    assert drv.dest_ranks([[0, 31, 32, 255], [64, 65, 66, 67]], 256, 8) == [[0, 1, 7], [2]]
    assert drv.dest_ranks([[0, 255]], 256, 1) == [[0]]
    with pytest.raises(ValueError, match=r"num_experts \(256\) must be a positive multiple of the world size \(3\)"):
        drv.dest_ranks([[0]], 256, 3)
    with pytest.raises(ValueError, match=r"token 1: expert id\(s\) \[256\] outside 0\.\.255"):
        drv.dest_ranks([[0], [256]], 256, 8)


def test_send_plan_groups_by_destination_once_per_rank():
    order, counts = drv.send_plan([[0, 2], [1], [0], [2]], 3)
    assert order == [0, 2, 1, 0, 3] and counts == [2, 1, 2]


def test_world_one_sends_every_token_once_to_itself():
    assert drv.count_matrix(128, 256, 8, 0, 1) == [[128]]


@pytest.mark.parametrize("world", [2, 4, 8])
def test_count_matrix_is_consistent(world):
    m = drv.count_matrix(128, 256, 8, 0, world)
    assert len(m) == world and all(len(r) == world for r in m)
    for src in range(world):
        dests = drv.dest_ranks(drv.route(128, 256, 8, 0, src), 256, world)
        assert sum(m[src]) == sum(len(d) for d in dests)  # one row per (token, distinct rank)
        assert all(c <= drv.tokens_of_rank(128, src) for c in m[src])
    # a token with 8 experts reaches at most min(8, world) ranks and at least one
    assert all(
        drv.tokens_of_rank(128, s) <= sum(m[s]) <= min(8, world) * drv.tokens_of_rank(128, s) for s in range(world)
    )


def test_summarize_us_converts_ms_and_takes_the_median():
    assert drv.summarize_us([0.010, 0.030, 0.020, 0.040]) == {
        "p50_us": 25.0,
        "mean_us": 25.0,
        "min_us": 10.0,
        "max_us": 40.0,
        "iters": 4,
    }


# --------------------------------------------------------------------------- parser


def test_dense_ep8_complete():
    p = parse_dense((FIX / "dense_ep8.log").read_text(), world=8)
    assert p.ok, p.problems
    assert p.config["world"] == 8 and p.config["dtype"] == "bfloat16"
    assert set(p.phases) == {"dispatch", "cached dispatch", "combine"}
    d, c = p.phases["dispatch"], p.phases["combine"]
    assert d["n"] == c["n"] == 8
    ranks = [
        json.loads(ln.split("] ", 1)[1])
        for ln in (FIX / "dense_ep8.log").read_text().splitlines()
        if ln.startswith("[dense_a2a]") and '"phase": "dispatch"' in ln
    ]
    import statistics

    assert d["p50_us"] == pytest.approx(statistics.median(r["p50_us"] for r in ranks))
    assert d["p50_gbs"] == pytest.approx(statistics.median(r["recv_bytes"] / r["p50_us"] / 1e3 for r in ranks))
    assert p.dc_p50_us == pytest.approx(d["p50_us"] + c["p50_us"])
    assert json.loads(json.dumps(p.to_dict()))["per_rank_p50_us"]["combine"]["7"] > 0


def test_dense_ep1_is_complete_at_world_one():
    p = parse_dense((FIX / "dense_ep1.log").read_text(), world=1)
    assert p.ok and p.phases["dispatch"]["n"] == 1
    assert p.phases["dispatch"]["p50_gbs"] == pytest.approx(128 * 7168 * 2 / p.phases["dispatch"]["p50_us"] / 1e3)


def test_dense_missing_ranks_and_done():
    p = parse_dense((FIX / "dense_ep8_missing.log").read_text(), world=8)
    assert not p.complete and not p.ok
    assert "combine: rank(s) 5, 6 missing of 8" in p.problems
    assert "done: rank(s) 0, 1, 2, 3, 4, 5, 6, 7 did not finish" in p.problems
    assert p.phases["combine"]["n"] == 6


def test_dense_bad_lines_name_their_line():
    lines = (FIX / "dense_ep1.log").read_text().splitlines()
    lines.insert(2, "[dense_a2a] {not json")
    lines.append(lines[1])  # the dispatch record again
    lines.append('[default0]:[dense_a2a] {"event": "done", "rank": 0, "world": 1, "check": "mismatch"}')
    p = parse_dense("\n".join(lines), world=1)
    assert any(x.startswith("line 3: not JSON after [dense_a2a]") for x in p.problems)
    assert f"line {len(lines) - 1}: dispatch: rank 0 duplicate of line 2" in p.problems
    assert "rank 0: correctness check 'mismatch'" in p.problems and not p.ok


def test_dense_wrong_world():
    p = parse_dense((FIX / "dense_ep1.log").read_text(), world=2)
    assert "line 1: config world 1, expected 2" in p.problems and not p.complete
    with pytest.raises(ValueError, match="world must be >= 1"):
        parse_dense("", world=0)


def test_dense_metrics_and_ratio():
    p = parse_dense((FIX / "dense_ep8.log").read_text(), world=8)
    v = metrics.dense_metrics(p, deepep_dc_p50_us=100.0)
    assert v["dense_dc_p50_us"] == p.dc_p50_us
    assert v["deepep_over_dense_dc"] == pytest.approx(round(100.0 / p.dc_p50_us, 6))
    assert v["dense_cached_dispatch_p50_us"] == p.phases["cached dispatch"]["p50_us"]
    assert metrics.dense_metrics(p, None)["deepep_over_dense_dc"] is None


# --------------------------------------------------------------------------- launch + runner plumbing


def test_torchrun_workers_launch():
    one = torchrun.torchrun_workers("/py", "/r/gates/drivers/dense_a2a.py", ["--iters", "5"], gpus=1, master_port=29555)
    assert one.argv == [
        "/py",
        "-X",
        "faulthandler",
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc-per-node=1",
        "--node-rank=0",
        "--master-addr=127.0.0.1",
        "--master-port=29555",
        "/r/gates/drivers/dense_a2a.py",
        "--iters",
        "5",
    ]
    assert one.env == {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555", "PYTHONFAULTHANDLER": "1"}
    two = torchrun.torchrun_workers("/py", "d.py", [], gpus=8, nodes=2, node_rank=1, master_addr="h", master_port=7)
    assert two.argv[5:10] == ["--nnodes=2", "--nproc-per-node=8", "--node-rank=1", "--master-addr=h", "--master-port=7"]
    with pytest.raises(ValueError, match="2 nodes need a master address and port"):
        torchrun.torchrun_workers("/py", "d.py", [], gpus=8, nodes=2)


def test_real_h200_ep1_dense_log_gives_the_committed_report():
    """The dense driver's output captured on the lent H200 (results/gate_micro/2026-11-29-h200-ep1-dense-arm)
    parses to the figures of the report committed with it."""
    p = parse_dense((FIX / "real" / "h200-ep1-dense.log").read_text(), world=1)
    assert p.ok and p.complete
    report = json.loads((REPO_ROOT / "results/gate_micro/2026-11-29-h200-ep1-dense-arm/micro.json").read_text())
    values = {c["metric"]: c["value"] for c in report["checks"]}
    measured = {m["metric"]: m["value"] for m in report["data"]["metrics"]}
    assert values["dense_arm_complete"] is True and report["result"] == "pass"
    assert p.phases["dispatch"]["p50_us"] == pytest.approx(260.528)
    assert p.phases["combine"]["p50_us"] == pytest.approx(138.208)
    assert p.dc_p50_us == pytest.approx(398.736)
    assert measured["dense_dc_p50_us"] == pytest.approx(p.dc_p50_us)
    assert measured["deepep_over_dense_dc"] == pytest.approx(round(measured["dc_p50_us"] / p.dc_p50_us, 6))
