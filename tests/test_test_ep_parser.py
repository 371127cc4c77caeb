"""Tests of the DeepEP test_ep.py output parser and the failure classifier (synthetic fixtures + published summary)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reprostack.gates.parsers.test_ep import (
    PHASES,
    PhaseStats,
    classify_failure,
    classify_test_ep_failure,
    dispatch_plus_combine_p50,
    finished_cleanly,
    parse_test_ep,
)

FIX = Path(__file__).parent / "fixtures"
TEP = FIX / "test_ep"
PUBLISHED = FIX / "published-2026-07" / "micro" / "test_ep_ep16_summary.json"

LINE = "   * EP: {r:3}/{n} | dispatch: 5 GB/s (SO), 123 GB/s (SU), {us} us, 1234567 bytes | copy: 88 GB/s, 12.345 us"


def log(name: str) -> str:
    return (TEP / name).read_text()


def test_published_dc_is_sum_of_phase_p50s():
    pub = json.loads(PUBLISHED.read_text())
    assert dispatch_plus_combine_p50(pub["phases_us"]) == pytest.approx(pub["dc_p50_us"], abs=1e-9)
    assert pub["dc_p50_us"] == pytest.approx(185.4 + 258.2)
    assert pub["dc_p50_us"] <= pub["contract_us"]


def test_ep16_two_node_complete_matches_published_summary():
    pub = json.loads(PUBLISHED.read_text())
    p = parse_test_ep(log("ep16_two_node_complete.log"), num_ranks=16)
    assert p.complete and p.ok, p.problems
    assert p.config == {
        "ranks": "2 x 8",
        "scaleout_ranks": 2,
        "scaleup_ranks": 8,
        "topk": 8,
        "experts": 256,
        "tokens": 128,
        "max_tokens": 128,
        "hidden": 7168,
        "sms": 4,
        "qps": 6,
        "allocated_qps": 6,
    }
    assert p.config["experts"] == pub["config"]["num_experts"] and p.config["sms"] == pub["config"]["num_sms"]
    assert len(p.modes) == 1 and p.modes[0].settings.startswith("do_handle_copy=1, expert_alignment=128")
    assert set(p.phases) == set(PHASES)
    for phase, st in pub["phases_us"].items():
        got = p.phases[phase]
        assert got.n == st["n"] == 16
        assert round(got.p50, 1) == st["p50"] and round(got.mean, 1) == st["mean"]
        assert got.min == st["min"] and got.max == st["max"]
    assert round(p.dc_p50_us, 1) == pub["dc_p50_us"] == 443.6
    assert p.completed_line is not None and p.teardown_lines == []
    assert set(p.modes[0].samples["combine"]) == set(range(16))
    d = p.to_dict()
    assert json.loads(json.dumps(d))["phases_us"]["dispatch"]["n"] == 16


def test_median_of_even_count_is_mean_of_middle_pair():
    text = "\n".join(LINE.format(r=r, n=4, us=us) for r, us in enumerate([10.0, 40.0, 20.0, 30.0]))
    st = PhaseStats.of(parse_test_ep(text, num_ranks=4).modes[0].samples["dispatch"].values())
    assert (st.n, st.p50, st.mean, st.min, st.max) == (4, 25.0, 25.0, 10.0, 40.0)


def test_teardown_noise_after_finish_is_not_a_failure():
    text = log("ep16_teardown_noise.log")
    assert finished_cleanly(text, num_ranks=16)
    p = parse_test_ep(text, num_ranks=16)
    assert p.ok and len(p.teardown_lines) == 2 and "gin_host.cc" in p.teardown_lines[0][1]
    assert all(no > p.completed_line for no, _ in p.teardown_lines)
    # With the parse's help the classifier ignores them; without it the gin line is the first evidence.
    assert classify_test_ep_failure(text, 1, False, num_ranks=16).kind == "unknown"
    assert "teardown" in classify_test_ep_failure(text, 1, False, num_ranks=16).detail
    assert classify_failure(text, 1, False).kind == "nccl_error"


def test_ep8_all_modes():
    text = log("ep8_all_modes.log")
    p = parse_test_ep(text, num_ranks=8, modes="all")
    assert p.ok, p.problems
    assert [m.index for m in p.modes] == [0, 1, 2]
    assert len({m.settings for m in p.modes}) == 3
    assert p.phases["dispatch"].n == 24 and p.phases["reduced combine"].n == 24
    first = parse_test_ep(text, num_ranks=8)
    assert first.phases["dispatch"].n == 8 and first.ok
    # The upstream enumeration has 144 settings: a caller that expects them all sees the shortfall.
    short = parse_test_ep(text, num_ranks=8, modes="all", expected_modes=144)
    assert not short.complete and "modes: 3 seen, 144 expected" in short.problems


def test_missing_rank():
    text = log("ep16_missing_rank.log")
    p = parse_test_ep(text, num_ranks=16)
    assert not p.complete and not finished_cleanly(text, num_ranks=16)
    assert p.problems == ["dispatch: ranks 3, 11 missing of 16"]
    assert p.phases["dispatch"].n == 14 and p.phases["combine"].n == 16


def test_truncated_log():
    text = log("ep16_truncated.log")
    p = parse_test_ep(text, num_ranks=16)
    assert not p.complete and p.completed_line is None
    assert any(x.startswith("combine: ranks ") for x in p.problems)
    assert "reduced combine: phase missing (no rank printed it)" in p.problems
    assert any("malformed phase line" in x for x in p.problems)
    assert "reduced combine" not in p.phases and p.phases["combine"].n < 16
    fc = classify_failure(text, -9, True)
    assert fc.kind == "timeout" and "watchdog" in fc.first_line and fc.line_no == len(text.splitlines())


def test_torchrun_prefixes_interleaving_and_glued_records():
    text = log("ep16_torchrun_interleaved.log")
    p = parse_test_ep(text, num_ranks=16, modes="all")
    assert p.ok, p.problems
    assert len(p.modes) == 2 and p.config["tokens"] == 128 and p.config["ranks"] == "2 x 8"
    for m in p.modes:
        for phase in PHASES:
            assert set(m.samples[phase]) == set(range(16))
    # rank 13's mode-0 lines arrive after mode 1 was announced, yet belong to mode 0 (per-rank order).
    announce_1 = next(i for i, ln in enumerate(text.splitlines(), 1) if "allocate_on_comm_stream=1 ..." in ln)
    assert p.modes[0].samples["dispatch"][13].line > announce_1
    assert p.modes[0].samples["dispatch"][13].line < p.modes[1].samples["dispatch"][13].line
    # two records on one line: both parsed
    glued = [ln for ln in text.splitlines() if ln.count(" EP: ") == 2]
    assert len(glued) == 1
    line_no = text.splitlines().index(glued[0]) + 1
    assert sum(s.line == line_no for m in p.modes for s in m.samples["dispatch"].values()) == 2


@pytest.mark.parametrize(
    "prefix",
    [
        "[rank3]: ",
        "[default3]:",
        "3: ",
        "2026-07-06T22:54:01.123Z ",
        "[1,3]<stdout>:",
        "2026-07-06 22:54:01,123 [rank3]:",
    ],
)
def test_launcher_prefixes(prefix):
    text = "\n".join(prefix + LINE.format(r=r, n=2, us=100.0 + r) for r in range(2))
    p = parse_test_ep(text, num_ranks=2)
    assert set(p.modes[0].samples["dispatch"]) == {0, 1}
    assert p.modes[0].samples["dispatch"][1].us == 101.0


def test_duplicates_and_wrong_size_and_malformed():
    base = [LINE.format(r=0, n=2, us="100.000"), LINE.format(r=1, n=2, us="101.000")]
    dup = parse_test_ep("\n".join(base + [base[0]]), num_ranks=2)
    assert any("rank 0 duplicate of line 1" in x for x in dup.problems)
    assert dup.modes[0].samples["dispatch"][0].line == 1
    text = "\n".join([" > Testing with a=1 ...", *base, LINE.format(r=0, n=2, us="99.000")])
    surplus = parse_test_ep(text, num_ranks=2)
    assert any("more often than the 1 announced mode" in x for x in surplus.problems)
    wrong = parse_test_ep(LINE.format(r=0, n=8, us="1.0"), num_ranks=2)
    assert any("rank 0/8, expected /2" in x for x in wrong.problems)
    bad_marker = parse_test_ep(LINE.format(r=0, n=2, us="1.0").replace("*", "@", 1), num_ranks=2)
    assert any("malformed" in x for x in bad_marker.problems)
    nan = parse_test_ep(LINE.format(r=0, n=2, us="nan"), num_ranks=2)
    assert any("unusable numbers" in x for x in nan.problems) and not nan.modes[0].samples["dispatch"]


def test_empty_log_and_bad_arguments():
    p = parse_test_ep("", num_ranks=16)
    assert not p.complete and p.dc_p50_us is None and p.phases == {}
    assert any("no `Config:` block" in x for x in p.problems)
    assert any("no phase lines at all" in x for x in p.problems)
    with pytest.raises(ValueError):
        parse_test_ep("", num_ranks=0)
    with pytest.raises(ValueError):
        parse_test_ep("", num_ranks=2, modes="some")


def test_config_mismatch_between_nodes():
    text = "Config:\n > Ranks: 2 x 8\n > #SM: 4, #QPs: 6/6\nConfig:\n > Ranks: 2 x 8\n > #SM: 8, #QPs: 6/6\n"
    p = parse_test_ep(text, num_ranks=16)
    assert any(x.startswith("config differs between nodes: sms: 4 vs 8") for x in p.problems)
    assert any("is not the expected 8 ranks" in x for x in parse_test_ep(text, num_ranks=8).problems)


def test_sigsegv_with_faulthandler_innermost_frame():
    text = log("ep1_sigsegv_faulthandler.log")
    for rc in (1, -11, 139):
        fc = classify_failure(text, rc, False)
        assert fc.kind == "sigsegv"
        assert fc.first_line == "line 11: Fatal Python error: Segmentation fault" and fc.line_no == 11
        assert "innermost Python frame: /work/src/deepep/deep_ep/buffers/elastic.py:811 in dispatch" in fc.detail
    p = parse_test_ep(text, num_ranks=1)
    assert not p.complete and p.config["ranks"] == "1 x 1"


@pytest.mark.parametrize(
    "text,rc,kind,needle",
    [
        (
            "start\n[rank2]: RuntimeError: CUDA runtime exception (csrc/x.hpp:10): 700 (cudaErrorIllegalAddress, an illegal "
            "memory access was encountered)\n[rank5]: torch.distributed.DistBackendError: NCCL error in: x\n",
            1,
            "cuda_error",
            "(rank 2)",
        ),
        (
            "DeepEP Gin barrier timeout, tag: 0, scaleout: 1, scaleup: 3, thread: 0, signal: 1, target: 2\n"
            "Segmentation fault (core dumped)\n",
            139,
            "gin_barrier_timeout",
            "Gin barrier timeout",
        ),
        (
            'Traceback (most recent call last):\n  File "t.py", line 3, in <module>\n    f()\n'
            "RuntimeError: Assertion exception (csrc/elastic/buffer.hpp:478): num_sms <= 132\n",
            1,
            "ep_assertion",
            "Assertion",
        ),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n", 1, "oom", "out of memory"),
        ("RuntimeError: CUDA error: out of memory\n", 1, "oom", "out of memory"),
        (
            "x\nterminate called after throwing an instance of 'EPException'\n  what():  NCCL exception (csrc/a.hpp:9): 6 (remote)\n"
            "Aborted (core dumped)\n",
            134,
            "nccl_error",
            "uncaught C++ exception: NCCL exception",
        ),
        (
            "terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc\n",
            -6,
            "sigabrt",
            "bad_alloc",
        ),
        (
            "[rank0]:[E1106 ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout: WorkNCCL(OpType=ALLREDUCE)\n",
            1,
            "nccl_error",
            "rank 0",
        ),
        (
            "RuntimeError: Dispatch CPU wait exception (csrc/elastic/buffer.hpp:1000): info\n",
            1,
            "ep_timeout",
            "CPU wait",
        ),
        (
            "Assertion failed: deep_ep/impls/dispatch.cuh:120, condition: slot < n\n",
            1,
            "ep_assertion",
            "Assertion failed",
        ),
    ],
)
def test_classify_failure_kinds(text, rc, kind, needle):
    fc = classify_failure(text, rc, False)
    assert fc.kind == kind, fc
    assert needle in (fc.first_line or "") + fc.detail


def test_classify_earliest_evidence_wins():
    # rank 3 crashes first; its peers then report NCCL errors: the crash is the cause.
    text = (
        "[rank3]: Fatal Python error: Segmentation fault\n[rank3]: Current thread 0x1 (most recent call first):\n"
        '[rank3]:   File "/x/elastic.py", line 811 in dispatch\n'
        "[rank0]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356\n"
    )
    fc = classify_failure(text, 1, False)
    assert fc.kind == "sigsegv" and "(rank 3)" in fc.detail and "/x/elastic.py:811 in dispatch" in fc.detail


def test_classify_python_exception_last_line_of_chain():
    text = (
        '[rank1]: Traceback (most recent call last):\n[rank1]:   File "a.py", line 1, in f\n[rank1]:     g()\n'
        "[rank0]: unrelated output\n[rank1]: KeyError: 'x'\n[rank1]: \n"
        "[rank1]: During handling of the above exception, another exception occurred:\n[rank1]: \n"
        '[rank1]: Traceback (most recent call last):\n[rank1]:   File "a.py", line 9, in h\n'
        "[rank1]: ValueError: bad config\n[rank0]: done\n"
    )
    fc = classify_failure(text, 1, False)
    assert fc.kind == "python_exception" and fc.line_no == 11
    assert fc.detail.startswith("ValueError: bad config") and "(rank 1)" in fc.detail


def test_classify_without_text_evidence():
    assert classify_failure("", -11, False).kind == "sigsegv"
    assert classify_failure("ok\n", 137, False).kind == "sigkill"
    assert classify_failure("ok\n", -15, False).kind == "signal"
    assert classify_failure("last words\n", 2, False).detail.endswith("line 1: last words")
    assert classify_failure("last words\n", 2, False).kind == "unknown"
    fc = classify_test_ep_failure(log("ep16_missing_rank.log"), 0, False, num_ranks=16)
    assert fc.kind == "incomplete_output" and "dispatch: ranks 3, 11 missing of 16" in fc.detail
    t = classify_failure("NCCL INFO fine\n", None, True)
    assert t.kind == "timeout" and t.first_line is None
    t2 = classify_failure("DeepEP Gin barrier timeout, tag: 1\n", -9, True)
    assert t2.kind == "timeout" and "gin_barrier_timeout" in t2.detail and t2.line_no == 1


def test_faulthandler_under_timestamps_and_rank_prefixes():
    src = log("ep1_sigsegv_faulthandler.log").splitlines()
    stamped = [f"2026-07-06T22:54:{i % 60:02d}.{i:06d}Z [rank0]: {ln}" for i, ln in enumerate(src)]
    noise = '2026-07-06T22:54:59.000000Z [rank1]:   File "/other.py", line 1 in elsewhere'
    stamped.insert(stamped.index(next(x for x in stamped if "Current thread" in x)) + 1, noise)
    fc = classify_failure("\n".join(stamped), 1, False)
    assert fc.kind == "sigsegv" and "(rank 0)" in fc.detail
    assert "elastic.py:811 in dispatch" in fc.detail


REAL = sorted((TEP / "real").glob("*.log")) if (TEP / "real").is_dir() else []


@pytest.mark.skipif(not REAL, reason="no real captured logs in tests/fixtures/test_ep/real/ yet")
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_logs(path):
    """Each real log needs a sidecar `<name>.expect.json` (format: fixtures/test_ep/README.md)."""
    exp = json.loads(path.with_suffix(".expect.json").read_text())
    text = path.read_text(errors="replace")
    p = parse_test_ep(text, num_ranks=exp["num_ranks"], modes=exp.get("modes", "first"))
    if "complete" in exp:
        assert p.complete is exp["complete"], p.problems
    if "dc_p50_us" in exp:
        assert round(p.dc_p50_us, 1) == exp["dc_p50_us"]
    for phase, p50 in exp.get("phases_p50", {}).items():
        assert round(p.phases[phase].p50, 1) == p50
    for needle in exp.get("problems_contain", []):
        assert any(needle in x for x in p.problems), p.problems
    if "failure" in exp:
        f = exp["failure"]
        fc = classify_test_ep_failure(text, f.get("returncode"), f.get("timed_out", False), num_ranks=exp["num_ranks"])
        assert fc.kind == f["kind"], fc
