"""The output contract (reprostack.launch.plan.Outputs, issue 25 item 1): where each node writes, who reports, and
the rc file node 0 reads back from every other node, an untrusted file on a shared folder."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from reprostack.launch import rendezvous
from reprostack.launch.plan import Outputs, read_rc, rc_text

REPO = Path(__file__).resolve().parents[1]


def test_the_contract_names_every_nodes_files_and_one_reporter():
    o = Outputs(2)
    assert (o.node_log(1), o.node_rc(1), o.leader_done()) == ("logs/node-1.log", "logs/node-1.rc", "logs/node-0.done")
    assert o.rank_log("micro", "test_ep", 1) == "micro/test_ep.node1.log"
    assert Outputs(1).rank_log("micro", "test_ep", 0) == "micro/test_ep.log"  # one node: the log of old
    assert o.writes_reports(0) and not o.writes_reports(1) and not o.writes_reports("${NODE_RANK}")


def test_an_rc_file_is_this_runs_or_it_is_none(tmp_path):
    p = tmp_path / "node-1.rc"
    assert read_rc(p, "74") is None  # absent: the node never got there
    p.write_text(rc_text(0, "74"))
    assert read_rc(p, "74") == 0
    assert read_rc(p, "75") is None  # an earlier job's rc on the shared folder is never this job's


@pytest.mark.parametrize(
    "text",
    ["", "0", "0 74 extra", "zero 74", "0\x0074", "1" * 300 + " 74", "\n".join(["0 74"] * 2), "\xff\xfe 74"],
    ids=["empty", "no-id", "three-words", "not-a-number", "nul", "huge", "two-lines", "binary"],
)
def test_a_malformed_rc_file_is_none_never_a_pass(tmp_path, text):
    p = tmp_path / "node-1.rc"
    p.write_bytes(text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text)
    assert read_rc(p, "74") is None


# --------------------------------------------------------------------------- the runtime's side (launch.rendezvous)


def state(tmp_path, node: int, *, wait_s: float = 1.0, run_id: str = "7"):
    """A real RunState of gate vllm's 2 x p5en profile on node `node`, its out dir `tmp_path/out`."""
    from reprostack.gates import registry
    from reprostack.gates.base import RunState
    from reprostack.gates.options import GateOptions
    from reprostack.gates import standin

    g = registry.gate("vllm")
    spec = g.load(REPO)
    opts = GateOptions(out=tmp_path / "out", nodes=2, node_rank=node, run_id=run_id)
    return RunState(
        g,
        opts,
        None,
        spec=spec,
        profile=spec.profile("p5en-efa-ep16"),
        standin=standin.from_env(REPO, {standin.ENV: f"h200,wait={wait_s:g}"}),
    )


def leave(st, node: int, rc: int | None, run_id: str = "7", rank_log: bool = True) -> None:
    """What node `node` leaves in the out dir: its rank log, its rc of run `run_id` (None: none)."""
    o, out = st.outputs, st.out_dir
    (out / "logs").mkdir(parents=True, exist_ok=True)
    (out / o.node_log(node)).write_text(f"node {node}\n")
    if rank_log:
        p = st.rank_log("server.deepep", node)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("ranks\n")
    if rc is not None:
        (out / o.node_rc(node)).write_text(rc_text(rc, run_id))


def gather(st, stems):
    return rendezvous.gather(st.node_run, stems, st.profile.nodes)


def test_node_0_gathers_every_node_or_names_the_one_missing(tmp_path):
    st = state(tmp_path, 0)
    assert st.reporter and not state(tmp_path, 1).reporter
    leave(st, 1, 0)
    why, nodes = gather(st, ["server.deepep"])
    assert why is None and nodes["1"] == {
        "rc": 0,
        "node_log": "logs/node-1.log",
        "rank_logs": ["vllm/server.deepep.node1.log"],
    }
    leave(st, 1, 1)
    why, _ = gather(st, ["server.deepep"])
    assert "node 1: exit 1; its log: " in why and why.endswith("(no verdict on fewer than the profile's 2 node(s))")
    leave(st, 1, 0, run_id="6")  # an earlier job's rc: waited for (bounded), then named as missing
    t = time.monotonic()
    why, nodes = gather(st, ["server.deepep"])
    assert "node 1: no rc of this run in 1 s" in why and nodes["1"]["rc"] is None and 0.9 < time.monotonic() - t < 10
    (st.out_dir / "vllm" / "server.deepep.node1.log").unlink()
    leave(st, 1, 0, rank_log=False)
    assert "node 1: exit 0 but no vllm/server.deepep.node1.log" in gather(st, ["server.deepep"])[0]


def test_a_serving_worker_serves_until_node_0_is_done(tmp_path):
    st = state(tmp_path, 1)
    log = st.rank_log("server.deepep")
    log.parent.mkdir(parents=True)
    serve = [sys.executable, "-c", "import time; print('serving', flush=True); time.sleep(60)"]

    def mark_after(s: float) -> None:
        time.sleep(s)
        rendezvous.mark_done(state(tmp_path, 0).node_run)  # node 0's done mark of the same run

    threading.Thread(target=mark_after, args=(1.0,), daemon=True).start()
    t = time.monotonic()
    ok, what = rendezvous.serve_until_done(st.node_run, serve, dict(os.environ), str(tmp_path), log, 30)
    assert ok and "until node 0 was done" in what and time.monotonic() - t < 15
    assert "serving" in log.read_text()
    # a worker whose engine dies first is a failure, named with its exit
    die = [sys.executable, "-c", "raise SystemExit(3)"]
    (st.out_dir / st.outputs.leader_done()).unlink()
    ok, what = rendezvous.serve_until_done(st.node_run, die, dict(os.environ), str(tmp_path), log, 30)
    assert not ok and "exited 3 before node 0 was done" in what
    # an earlier run's done mark is not this run's: the worker serves to its timeout and says so
    (st.out_dir / st.outputs.leader_done()).write_text("6\n")
    ok, what = rendezvous.serve_until_done(st.node_run, serve, dict(os.environ), str(tmp_path), log, 2)
    assert not ok and "still serving at its timeout of 2 s" in what
