"""The output contract (reprostack.launch.plan.Outputs, issue 25 item 1): where each node writes, who reports, and
the rc file node 0 reads back from every other node, an untrusted file on a shared folder."""

from __future__ import annotations

import pytest

from reprostack.launch.plan import Outputs, read_rc, rc_text


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
