"""gates.parsers.nccl_tests: nccl-tests output + NCCL_DEBUG=INFO lines -> header, rows, cycles, footer, per-rank transport.

Real inputs: tests/fixtures/nccl-tests/ (the pinned binaries run here, no GPU; README there) and the published
campaign's p5en NCCL INFO log (tests/fixtures/published-2026-07, Apache-2.0). Table rows: printed by `table()` below
with nccl-tests v2.19.6's own formats (src/util.cu), because no real table is committed yet (the fixtures README says
why); the lead's H200 output goes into tests/fixtures/nccl-tests/real/ and `test_real_outputs` reads it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from reprostack.gates.parsers import nccl_tests
from reprostack.gates.parsers.nccl_tests import NONE_ONE_NODE, parse_nccl_tests

from nccltestsout import GIB, header, info, table

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "nccl-tests"
P5EN_LOG = ROOT / "tests" / "fixtures" / "published-2026-07" / "trtllm-shim" / "serve_log_head.log"


SIZES = [8 << i for i in range(28)]  # -b 8 -e 1G -f 2


def one_gpu_run(cycles=5, **kw) -> str:
    return header() + table(SIZES, lambda s, c: 100.0 + c * 0.5 + s / GIB, cycles=cycles, **kw)


# --------------------------------------------------------------------------- real outputs


@pytest.mark.parametrize("program", ["all_reduce_perf", "alltoall_perf"])
def test_the_pinned_binaries_without_a_gpu(program):
    p = parse_nccl_tests((FIX / "cpu-no-gpu" / f"{program}.log").read_text())
    assert (p.program, p.version, p.nccl_headers, p.nccl_library) == (program, "2.19.6", 23004, 23004)
    assert p.config == {
        "n_threads": 1,
        "n_gpus": 1,
        "min_bytes": 8,
        "max_bytes": GIB,
        "step": 2,
        "step_kind": "factor",
        "warmup_iters": 5,
        "iters": 20,
        "validation": 1,
    }
    assert p.rows == () and p.cycles == 0 and not p.concluded and p.out_of_bounds is None
    assert "Test CUDA failure util.cu:674 'CUDA driver version is insufficient" in p.failures[0]
    assert p.transports == () and p.problems == () and p.wrong_total is None and p.nodes == 0


def test_a_binary_that_cannot_load_libnccl():
    p = parse_nccl_tests((FIX / "cpu-no-gpu" / "no-libnccl.log").read_text())
    assert p.version is None and "libnccl.so.2: cannot open shared object file" in p.failures[0]


def test_the_published_p5en_log_gives_16_ranks_over_efa():
    p = parse_nccl_tests(P5EN_LOG.read_text())
    assert [t.rank for t in p.transports] == list(range(16)) and p.nodes == 2
    assert {t.transport for t in p.transports} == {"NET/OFI efa"}
    assert {(t.net_plugin, t.provider, t.fabric, t.network) for t in p.transports} == {
        ("Libfabric (v12)", "efa", "efa-direct", "Libfabric")
    }
    t11 = p.transports[11]
    assert (t11.host, t11.pid, t11.device) == ("deepep-efa-bench-1", 81187, 3)
    assert "Using network Libfabric" in t11.why  # this head of the log has no connection lines
    assert set(p.nccl_versions.values()) == {"2.30.4+cuda13.2"} and len(p.nccl_versions) == 16


def test_one_process_falling_back_to_sockets_is_named():
    """The real p5en log with one process (rank 11's) given what NCCL prints without the plugin's EFA provider."""
    lines = []
    for line in P5EN_LOG.read_text().splitlines():
        if line.startswith("deepep-efa-bench-1:81187:"):
            if "Selected provider is" in line or "NET/Plugin: Loaded net plugin" in line:
                continue
            line = line.replace("Using network Libfabric", "Using network Socket")
        lines.append(line)
    p = parse_nccl_tests("\n".join(lines))
    assert p.transports[11].transport == "Socket" and p.transports[11].provider is None
    assert [t.rank for t in p.transports if t.transport != "NET/OFI efa"] == [11]


@pytest.mark.parametrize("log", sorted((FIX / "real").glob("*.log")) if (FIX / "real").is_dir() else [], ids=str)
def test_real_outputs(log):
    """tests/fixtures/nccl-tests/real/<name>.log against its <name>.expect.json (README there)."""
    want = json.loads(log.with_suffix(".expect.json").read_text())
    p = parse_nccl_tests(log.read_text(errors="replace"))
    assert p.program == want["program"] and p.problems == ()
    for key, got in (
        ("ranks", len(p.transports) or len(p.ranks)),
        ("nodes", p.nodes),
        ("cycles", p.cycles),
        ("wrong_total", p.wrong_total),
        ("out_of_bounds", p.out_of_bounds),
        ("nccl_library", p.nccl_library),
    ):
        if key in want:
            assert got == want[key], key
    if "rows_per_cycle" in want:
        assert all(sum(r.cycle == c for r in p.rows) == want["rows_per_cycle"] for c in range(p.cycles))
    if "transport" in want:
        assert {t.transport for t in p.transports} == {want["transport"]}
    for size, bw in want.get("busbw_at", {}).items():
        assert p.rows_at(int(size))[0].out_of_place.busbw_gbs == pytest.approx(bw, abs=0.01)


# --------------------------------------------------------------------------- the table (v2.19.6 formats)


def test_a_one_gpu_run_with_five_cycles():
    p = parse_nccl_tests(one_gpu_run(cycles=5))
    assert p.problems == () and p.cycles == 5 and len(p.rows) == 5 * 28 and p.concluded
    assert p.columns[:5] == ("size", "count", "type", "redop", "root") and p.columns.count("#wrong") == 2
    at = p.rows_at(GIB)
    assert [r.cycle for r in at] == [0, 1, 2, 3, 4]
    assert [r.out_of_place.busbw_gbs for r in at] == [101.0, 101.5, 102.0, 102.5, 103.0]
    assert at[0].in_place.busbw_gbs == 101.0 and at[0].root == -1 and at[0].redop == "sum" and at[0].type == "float"
    assert p.wrong_total == 0 and p.out_of_bounds == 0 and p.out_of_bounds_ok is True
    want = sum(100.0 + c * 0.5 + s / GIB for c in range(5) for s in SIZES) / (5 * 28)
    assert p.avg_busbw_gbs == pytest.approx(want, abs=0.001)
    (t,) = p.transports
    assert (t.rank, t.host, t.pid, t.device, t.transport) == (0, "vm", 4242, 0, NONE_ONE_NODE)
    assert "no connection (one rank)" in t.why and p.nodes == 1


def test_without_the_check_wrong_is_n_a_and_no_total():
    p = parse_nccl_tests(one_gpu_run(cycles=1, wrong=None))
    assert p.problems == () and p.rows[0].out_of_place.wrong is None and p.wrong_total is None


def test_wrong_elements_are_counted():
    p = parse_nccl_tests(one_gpu_run(cycles=1, wrong=3))
    assert p.wrong_total == 3 * 2 * 28 and p.out_of_bounds == 3 and p.out_of_bounds_ok is False


def test_older_releases_error_column_and_no_root():
    text = (
        "#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error\n"
        "#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n"
        "     1048576        262144   float     sum   1035.3    1.01    1.90  5e-07    643.4    1.63    3.06  5e-07\n"
    )
    p = parse_nccl_tests(text)
    assert p.problems == () and p.rows[0].root is None and p.rows[0].out_of_place.wrong == pytest.approx(5e-7)
    assert p.rows[0].in_place.busbw_gbs == 3.06


def test_launcher_prefixes_are_stripped():
    text = "".join(f"[1,0]<stdout>:{line}\n" for line in one_gpu_run(cycles=1).splitlines())
    p = parse_nccl_tests(text)
    assert p.problems == () and len(p.rows) == 28 and p.version == "2.19.6"


def test_timestamps_after_rows_are_allowed():
    text = "\n".join(
        line + ("  2026-12-03 10:11:12" if line[:1] == " " else "") for line in one_gpu_run(cycles=1).splitlines()
    )
    assert len(parse_nccl_tests(text).rows) == 28


# --------------------------------------------------------------------------- transports (NCCL 2.30.4's formats)


def two_nodes(net: str, provider: str | None, plugin: str | None) -> str:
    """2 nodes x 1 GPU, one process per rank (MPI), NCCL INFO as 2.30.4 prints it (init.cc, transport/net.cc)."""
    ranks = (("node-a", 100, 0), ("node-b", 200, 0))
    out = [header(ranks=ranks)]
    for r, (host, pid, dev) in enumerate(ranks):
        out.append(info(host, pid, dev, "NCCL version 2.30.4+cuda13.0"))
        if plugin:
            out.append(info(host, pid, dev, f"NET/Plugin: Loaded net plugin {plugin} (v12)"))
        else:
            out.append(info(host, pid, dev, "NET/Plugin: Could not find: libnccl-net.so"))
        if provider:
            out.append(
                info(host, pid, dev, f"NET/OFI Selected provider is {provider}, fabric is efa-direct (found 16 nics)")
            )
        out.append(info(host, pid, dev, f"Using network {net}"))
        out.append(
            info(
                host,
                pid,
                dev,
                f"[Rank {r}] ncclCommInitRankConfig comm 0x55aa{r}0 rank {r} nranks 2 cudaDev {dev} "
                f"nvmlDev {dev} busId 18000 commId 0x1234 - Init START",
            )
        )
        out.append(info(host, pid, dev, f"comm 0x55aa{r}0 rank {r} nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0"))
        peer = 1 - r
        out.append(info(host, pid, dev, f"Channel 00/0 : {r}[0] -> {peer}[0] [send] via NET/{net}/0/GDRDMA"))
        out.append(info(host, pid, dev, f"Channel 00/0 : {peer}[0] -> {r}[0] [receive] via NET/{net}/0/GDRDMA"))
    return "\n".join(out) + "\n" + table([GIB], lambda s, c: 40.0, nranks=2)


@pytest.mark.parametrize(
    "net, provider, plugin, want",
    [
        ("Libfabric", "efa", "Libfabric", "NET/OFI efa"),
        ("AWS Libfabric", "efa", "AWS Libfabric", "NET/OFI efa"),  # the plugin's name before v1.14
        ("Libfabric", "tcp", "Libfabric", "NET/OFI tcp"),
        ("Socket", None, None, "Socket"),
        ("IB", None, None, "IB"),
    ],
)
def test_two_nodes_transport_from_the_connection_lines(net, provider, plugin, want):
    p = parse_nccl_tests(two_nodes(net, provider, plugin))
    assert p.problems == () and p.nodes == 2
    assert [t.transport for t in p.transports] == [want, want]
    t = p.transports[1]
    assert t.connections == {f"NET/{net}": 2} and t.provider == provider
    assert t.net_plugin == (f"{plugin} (v12)" if plugin else "internal (no external net plugin)")


def test_one_node_eight_gpus_over_nvlink_is_no_network():
    ranks = tuple(("h200-box", 77, d) for d in range(8))
    lines = [header(gpus=8, ranks=ranks), info("h200-box", 77, 0, "Using network Socket")]
    for r in range(8):
        lines.append(
            info("h200-box", 77, r, f"Channel 00/0 : {r}[{r}] -> {(r + 1) % 8}[{(r + 1) % 8}] via P2P/CUMEM/read")
        )
    p = parse_nccl_tests("\n".join(lines) + "\n" + table([GIB], lambda s, c: 300.0, nranks=8))
    assert {t.transport for t in p.transports} == {NONE_ONE_NODE} and len(p.transports) == 8
    assert p.transports[3].connections == {"P2P": 1} and "NCCL chose network Socket" in p.transports[3].why


def test_no_nccl_info_on_two_nodes_is_unknown():
    ranks = (("node-a", 1, 0), ("node-b", 2, 0))
    p = parse_nccl_tests(header(ranks=ranks) + table([GIB], lambda s, c: 40.0, nranks=2))
    assert [t.transport.split(":")[0] for t in p.transports] == ["unknown", "unknown"]


# --------------------------------------------------------------------------- hostile input


def test_missing_rows_duplicates_and_rows_out_of_order():
    lines = one_gpu_run(cycles=2).splitlines()
    rows = [i for i, line in enumerate(lines) if line[:1] == " "]
    # cycle 1 loses its 1 GiB row; a row is doubled in cycle 2; cycle 2's first two rows swap places
    dup = lines[rows[30]]
    lines[rows[28]], lines[rows[29]] = lines[rows[29]], lines[rows[28]]
    del lines[rows[27]]
    lines.insert(rows[30], dup)
    p = parse_nccl_tests("\n".join(lines))
    assert [r.cycle for r in p.rows_at(GIB)] == [2]  # cycle 0 has none; the swap started a third cycle
    assert p.cycles == 3
    assert any("a second row for size" in x for x in p.problems)


def test_duplicate_ranks_with_other_facts_are_a_problem():
    text = header(ranks=(("a", 1, 0), ("b", 2, 0)))
    text = text.replace("#  Rank  1 Group", "#  Rank  0 Group", 1)
    p = parse_nccl_tests(text)
    assert len(p.ranks) == 1 and p.ranks[0].host.strip() == "a"
    assert any("rank 0 listed twice" in x for x in p.problems)


@pytest.mark.parametrize(
    "row, problem",
    [
        (
            "  1073741824     268435456     float     sum      -1   abc  1.00  1.00  0  1.0  1.00  1.00  0",
            "are not numbers",
        ),
        (
            "  1073741824     268435456     float     sum      -1   1.0  1.00  1.00  -3  1.0  1.00  1.00  0",
            "is not a count",
        ),
        (
            "  1073741824     268435456     float     sum      -1   1.0  -1.0  1.00  0  1.0  1.00  1.00  0",
            "negative figure",
        ),
        ("  1073741824     268435456     float     sum      -1   1.0  1.00  1.00  0", "a row of 9 fields"),
        (
            "  1073741824x    268435456     float     sum      -1   1.0  1.00  1.00  0  1.0  1.00  1.00  0",
            "not integers",
        ),
        ("  99999999999999999999999  1  float  sum  -1  1.0  1.00  1.00  0  1.0  1.00  1.00  0", None),
    ],
)
def test_bad_rows_are_problems_never_values(row, problem):
    text = header() + table([8], lambda s, c: 1.0)
    good = next(line for line in text.splitlines() if line.startswith("           8 "))
    p = parse_nccl_tests(text.replace(good, row, 1))
    if problem:
        assert any(problem in x for x in p.problems), p.problems
        assert p.rows == ()
    else:  # a size beyond 64 bits is still an int (Python's), never a crash
        assert p.rows[0].size == 99999999999999999999999 and p.problems == ()


def test_nan_and_inf_figures_are_kept_and_named():
    text = one_gpu_run(cycles=1)
    first = next(line for line in text.splitlines() if line[:1] == " ")
    f = first.split()
    f[7], f[11] = "nan", "inf"
    p = parse_nccl_tests(text.replace(first, "  ".join(f), 1))
    assert math.isnan(p.rows[0].out_of_place.busbw_gbs) and math.isinf(p.rows[0].in_place.busbw_gbs)
    assert sum("non-finite" in x for x in p.problems) == 2


def test_a_row_before_the_column_header_and_a_header_of_another_shape():
    p = parse_nccl_tests("   8  2  float  sum  -1  1.0  0.00  0.00  0  1.0  0.00  0.00  0\n")
    assert p.rows == () and "before the table's column header" in p.problems[0]
    p = parse_nccl_tests("# size count type redop root algbw busbw time #wrong x y z\n")
    assert "unknown shape" in p.problems[0]


def test_huge_lines_long_output_and_many_problems_are_bounded(monkeypatch):
    huge = "#  Rank  0 Group  0 Pid 1 on " + "h" * 5_000_000 + " device 0 [0] x\n"
    p = parse_nccl_tests(huge + one_gpu_run(cycles=1))
    assert len(p.rows) == 28 and p.ranks[0].host == "vm" and "1 line(s) over 4096" in p.problems[-1]
    bad = "# size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n" + "1 x\n" * 10_000
    p = parse_nccl_tests(bad)
    assert len(p.problems) == nccl_tests.MAX_PROBLEMS + 1 and p.problems[-1] == "... and 9950 more problem(s)"
    monkeypatch.setattr(nccl_tests, "MAX_CHARS", 1000)
    p = parse_nccl_tests(one_gpu_run(cycles=1))
    assert "over 1000 characters" in p.problems[0] and len(p.rows) < 28
    monkeypatch.setattr(nccl_tests, "MAX_ROWS", 3)
    monkeypatch.setattr(nccl_tests, "MAX_CHARS", 64 << 20)
    p = parse_nccl_tests(one_gpu_run(cycles=1))
    assert len(p.rows) == 3 and "more than 3 rows" in p.problems[-1]


@pytest.mark.parametrize("junk", [None, b"bytes", 42, "", "\x00\xff" * 100, "NCCL INFO\n" * 3])
def test_anything_that_is_not_output_parses_to_nothing(junk):
    p = parse_nccl_tests(junk)
    assert p.rows == () and p.transports == () and p.program is None


def test_many_fake_ranks_in_info_lines_are_bounded():
    lines = [
        info("h", 1, 0, f"comm 0x1 rank {r} nranks 9999999 cudaDev 0 nvmlDev 0 - Init START") for r in range(20_000)
    ]
    lines += [info("h", 1, 0, f"Channel 00/0 : {r}[0] -> 1[0] via P2P/IPC") for r in range(20_000)]
    lines += [info(f"h{i}", i, 0, "Using network Socket") for i in range(10_000)]
    p = parse_nccl_tests("\n".join(lines))
    assert len(p.transports) <= nccl_tests.MAX_RANKS


def test_a_flood_of_forged_processes_never_drops_a_known_process_s_lines():
    lines = [
        header(ranks=(("real", 1, 0),)).rstrip("\n"),
        info("real", 1, 0, "NET/Plugin: Loaded net plugin Libfabric (v12)"),
    ]
    lines += [info(f"forged{i}", i + 2, 0, "Using network Socket") for i in range(nccl_tests.MAX_RANKS + 10)]
    lines.append(info("real", 1, 0, "NET/OFI Selected provider is efa, fabric is efa-direct (found 16 nics)"))
    (t,) = parse_nccl_tests("\n".join(lines)).transports
    assert (t.net_plugin, t.provider) == ("Libfabric (v12)", "efa")
