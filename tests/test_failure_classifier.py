"""Issue 40 item 9: the failure classifier names the field's common causes, each with a hint, on real log lines.

tests/data/failure_corpus.yaml holds real lines, each with its source (a public bug report's URL, or the upstream
file:line at the rev upstreams.lock pins); every line must classify as its kind (or as nothing, for the INFO lines
that are no failure). The multi-line cases are the orders real runs print: an out-of-memory line is the cause
whether a NCCL error comes before it (NCCL's `unhandled cuda error`, then the CUDA text) or after it.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from reprostack.gates.parsers import failure
from reprostack.gates.parsers.failure import _KINDS, classify_failure, evidence_kind
from reprostack.lock import load

REPO = Path(__file__).resolve().parent.parent
CORPUS = yaml.safe_load((REPO / "tests" / "data" / "failure_corpus.yaml").read_text())


def test_every_corpus_line_classifies_as_its_kind_and_names_its_source():
    lock = load(REPO / "upstreams.lock")
    pinned = {lock.upstreams[n].rev for n in ("nccl", "aws-ofi-nccl", "libfabric")}
    wrong = []
    for case in CORPUS:
        src = case["source"]
        assert src.startswith("https://github.com/") or any(rev in src for rev in pinned), src
        if (got := evidence_kind(case["line"])) != case["kind"]:
            wrong.append(f"{case['line'][:90]!r}: {got}, expected {case['kind']}")
    assert not wrong, "\n".join(wrong)
    kinds = {c["kind"] for c in CORPUS}
    assert {"oom", "cuda_invalid_device", "nccl_topology", "ofi_provider", "net_plugin"} <= kinds
    assert sum(c["source"].startswith("https://") for c in CORPUS) >= 10


def test_an_oom_line_is_the_cause_when_a_nccl_error_comes_first_or_after():
    # NVIDIA/nccl#1235: NCCL's WARN for the allocation, then torch's NCCL error on the same rank
    after = (
        "ng30903:3063028:3066152 [3] include/alloc.h:178 NCCL WARN Cuda failure 'out of memory'\n"
        "ng30903:3063028:3066152 [3] include/alloc.h:185 NCCL WARN Failed to CUDA calloc 6291456 bytes\n"
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1691, unhandled cuda error\n"
    )
    # the order torch prints it: the NCCL error first, NCCL's `Last error:` text on a later line
    before = (
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1691, unhandled cuda error (run with"
        " NCCL_DEBUG=INFO for details), NCCL version 2.30.4\nncclUnhandledCudaError: Call to CUDA function failed.\n"
        "Last error:\nCuda failure 'out of memory'\n"
    )
    for text, other_line in ((after, 3), (before, 1)):
        fc = classify_failure(text, 1, False)
        assert fc.kind == "oom", fc
        assert f"then nccl_error at line {other_line}" in fc.detail or other_line == 3
        assert "out of memory" in fc.first_line and fc.hint == failure.HINTS["oom"]
    # a watchdog kill after an OOM and a NCCL error still names the OOM as the earliest evidence
    fc = classify_failure(before, None, True)
    assert fc.kind == "timeout" and "earliest evidence: oom" in fc.detail


def test_each_kind_has_one_hint_and_the_reason_line_carries_it():
    documented = set(re.findall(r"^  (\w+)\s{2,}", _module_doc(), re.M))  # the module doc's list of kinds
    assert (
        len(documented) >= 14
        and documented - {"sigsegv"} <= set(failure.HINTS)
        and {k for k, _ in _KINDS} <= set(failure.HINTS)
    )
    text = "h0:1:1 [0] nccl_net_ofi_rdma_init:7978 NCCL WARN NET/OFI OFI fi_getinfo() call failed: No data available\n"
    fc = classify_failure(text, 1, False)
    assert fc.kind == "ofi_provider" and fc.to_dict()["hint"] == failure.HINTS["ofi_provider"]
    assert fc.line().startswith("ofi_provider: ") and "; hint: " in fc.line() and "\n" not in fc.line()
    assert classify_failure("nothing useful\n", 1, False).to_dict()["hint"] == failure.HINTS["unknown"]


def _module_doc() -> str:
    return failure.__doc__


def test_fuzz_the_corpus_never_raises_and_every_verdict_has_a_hint():
    """The classifier reads untrusted logs: 1,000 mutations of the corpus as one log (byte flips, truncation, dropped
    and repeated lines, hostile values) never raise, and each verdict is a known kind with its hint."""
    import random

    from test_fuzz_readers import mutate

    log = "".join(f"[rank{i % 4}]: {c['line']}\n" for i, c in enumerate(CORPUS)).encode()
    rng = random.Random(40)
    for _ in range(1000):
        text = mutate(log, rng, "yaml").decode("utf-8", errors="replace")
        fc = classify_failure(text, rng.choice([None, 0, 1, -9, -11, 134, 137]), rng.random() < 0.2)
        assert fc.kind in failure.HINTS and fc.hint and "\n" not in fc.line()
