"""Backend assertion on the campaign's real TRT-LLM serve log (tests/fixtures/published-2026-07/trtllm-shim) and on
broken variants of it: missing provider lines, a legacy Buffer line, a Gin barrier timeout after a rank died."""

from __future__ import annotations

from pathlib import Path

import pytest

from reprostack.gates.parsers.servelog import assert_backend
from reprostack.gates.servingspec import load_serving_spec

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "fixtures" / "published-2026-07" / "trtllm-shim"
REAL = (FIX / "serve_log_head.log").read_text()
# DeepEP's own ElasticBuffer line (EP_BUFFER_DEBUG=1, deep_ep/buffers/elastic.py:179 at b306af06), one per rank: the
# campaign ran without EP_BUFFER_DEBUG, so its log has none; the gate sets it.
ELASTIC = "".join(f"Initializing EP elastic buffer with 2147483648 bytes at rank EP {r}/16\n" for r in range(16))


@pytest.fixture(scope="module")
def spec():
    return load_serving_spec(REPO, "trtllm")


def check(spec, text):
    return assert_backend(
        text, num_ranks=16, gpus_per_node=8, required=list(spec.required), forbidden=list(spec.forbidden)
    )


def by_name(results, name):
    return next(r for r in results if r.name == name)


def test_real_log_as_published_lacks_elasticbuffer_evidence(spec):
    rep = check(spec, REAL)
    efa = by_name(rep.required, "Selected provider is efa")
    assert efa.ok and efa.total == 16 and efa.per_rank == {r: 1 for r in range(16)}
    a2a = by_name(rep.required, "AlltoallMethodType.DeepEP")
    assert a2a.ok and a2a.per_rank == {0: 1} and "line 404:" in a2a.examples[0]
    eb = by_name(rep.required, "ElasticBuffer construction")
    assert not eb.ok and eb.total == 0 and eb.missing_ranks == list(range(16))
    assert rep.problems == ["required `ElasticBuffer construction`: no line in the server log"]
    assert rep.first_dead_rank is None and rep.symptoms == []


def test_real_log_ranks_from_nccl_comm_lines(spec):
    # deepep-efa-bench-1 pid 81112 is rank 8 by its own ncclCommInitRankConfig line (serve_log_head.log:1744)
    rep = check(spec, REAL)
    efa = by_name(rep.required, "Selected provider is efa")
    assert any(e.startswith("line 1305: deepep-efa-bench-1:81112") for e in efa.examples)
    assert set(efa.per_rank) == set(range(16))


def test_real_log_with_debug_lines_passes(spec):
    rep = check(spec, REAL + ELASTIC)
    assert rep.ok, rep.problems
    assert by_name(rep.required, "ElasticBuffer construction").per_rank == {r: 1 for r in range(16)}
    assert all(f.total == 0 for f in rep.forbidden)


def test_provider_evidence_log_alone(spec):
    rep = check(spec, (FIX / "provider_evidence.log").read_text() + ELASTIC)
    assert rep.ok, rep.problems  # 16 provider lines attributed by host order x 8 + device, one AlltoallMethodType


def test_missing_provider_lines_name_the_ranks(spec):
    text = "\n".join(
        line
        for line in (REAL + ELASTIC).splitlines()
        if not (
            "deepep-efa-bench-1:" in line
            and "Selected provider is efa" in line
            and (" [3] " in line or " [4] " in line)
        )
    )
    rep = check(spec, text)
    assert rep.problems == ["required `Selected provider is efa`: ranks 11-12 missing (14 of 16 ranks printed it)"]
    assert by_name(rep.required, "Selected provider is efa").missing_ranks == [11, 12]


def test_no_provider_line_at_all(spec):
    text = "\n".join(x for x in (REAL + ELASTIC).splitlines() if "Selected provider is efa" not in x)
    rep = check(spec, text)
    assert rep.problems == ["required `Selected provider is efa`: no line in the server log"]


def test_legacy_buffer_line_is_forbidden(spec):
    legacy = "deepep-efa-bench-0:70124:70124 [4] WARNING: destroy() was not called before DeepEP buffer destruction, which can leak resources.\n"
    rep = check(spec, REAL + ELASTIC + legacy)
    assert not rep.ok
    (p,) = rep.problems
    assert p.startswith("forbidden `legacy Buffer destroy warning`: 1 line(s), first line ")
    rep2 = check(
        spec,
        REAL
        + ELASTIC
        + '  File "/venv/lib/python3.10/site-packages/deep_ep/buffers/legacy.py", line 40, in __init__\n',
    )
    assert [f.total for f in rep2.forbidden] == [0, 1]


def test_gin_barrier_timeout_is_a_symptom_and_the_first_dead_rank_is_named(spec):
    tail = (
        "[1,13]<stderr>:Traceback (most recent call last):\n"
        "[1,13]<stderr>:RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "[1,2]<stdout>:DeepEP Gin barrier timeout, tag: 3, scaleout: 0, scaleup: 2, thread: 13, signal: 4, target: 5\n"
        "[1,5]<stdout>:DeepEP Gin barrier timeout, tag: 3, scaleout: 0, scaleup: 5, thread: 13, signal: 4, target: 5\n"
    )
    rep = check(spec, REAL + ELASTIC + tail)
    assert rep.ok  # the backend assertion itself holds; the death is reported separately
    assert rep.first_dead_rank == 13 and "cuda_error" in rep.death
    assert len(rep.symptoms) == 2 and "Gin barrier timeout" in rep.symptoms[0]


def test_gin_barrier_timeout_without_a_death_line_points_at_the_waited_peer(spec):
    tail = "".join(
        f"[1,{r}]<stdout>:DeepEP Gin barrier timeout, tag: 3, scaleout: 0, scaleup: {r % 8}, thread: 9, "
        f"signal: 4, target: 5\n"
        for r in (1, 2, 3)
    )
    rep = check(spec, REAL + ELASTIC + tail)
    assert rep.first_dead_rank == 9
    assert "wait on peer(s) 9" in rep.death


@pytest.mark.parametrize(
    "line, rank",
    [
        ("(EngineCore_DP5 pid=4242) ERROR 07-07 06:57:28 [core.py:1] CUDA error: out of memory", 5),
        ("[2026-07-07 06:57:28 DP3 TP3 EP3] Scheduler hit an exception: NCCL error: remote process exited", 3),
        ("[rank6]: RuntimeError: CUDA error: an illegal memory access was encountered", 6),
    ],
)
def test_rank_attribution_of_engine_prefixes(spec, line, rank):
    rep = check(spec, REAL + ELASTIC + line + "\n")
    assert rep.first_dead_rank == rank
