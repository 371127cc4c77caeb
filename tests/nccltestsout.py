"""nccl-tests v2.19.6 output printed with its own formats (src/util.cu), for the parser tests while no real table is
committed (tests/fixtures/nccl-tests/README.md says why), and NCCL's INFO line prefix (src/debug.cc)."""

from __future__ import annotations

GIB = 1 << 30


def _float(value: float, width: int) -> str:
    """util.cu getFloatStr: %.2f, else %.1f, else %.0f, else an exponent, whichever fits `width`."""
    for fmt in ("{:>{w}.2f}", "{:>{w}.1f}", "{:>{w}.0f}"):
        s = fmt.format(value, w=width)
        if len(s) <= width:
            return s
    return "{:>{w}.1e}".format(value, w=width) if width >= 7 else "{:>{w}.0e}".format(value, w=width)


def _g(v: float) -> str:
    return f"{v:g}"


def header(program="all_reduce_perf", *, gpus=1, ranks=(("vm", 4242, 0),), max_bytes=GIB, library=23004) -> str:
    lines = [
        f"# nccl-tests version 2.19.6 nccl-headers=23004 nccl-library={library}",
        f"# Collective test starting: {program}",
        f"# nThread 1 nGpus {gpus} minBytes 8 maxBytes {max_bytes} step: 2(factor) warmup iters: 5 iters: 20 "
        "agg iters: 1 validation: 1 graph: 0 unalign: 0",
        "#",
        "# Using devices",
    ]
    for r, (host, pid, dev) in enumerate(ranks):
        lines.append(
            f"#  Rank {r:2d} Group {0:2d} Pid {pid:6d} on {host:>10s} device {dev:2d} [0000:{0x18 + dev:02x}:00] NVIDIA H200"
        )
    return "\n".join(lines) + "\n"


def table(sizes, busbw, *, cycles=1, wrong=0, redop="sum", root=-1, type_="float", nranks=1) -> str:
    """writeResultHeader + one row per size per cycle + writeResultFooter; busbw(size, cycle) -> GB/s."""
    cols = (
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong",
    )
    units = ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "")
    fmt = "# {:>10s}  {:>12s}  {:>8s}  {:>6s}  {:>6s}  {:>7s}  {:>6s}  {:>6s}  {:>6s}  {:>7s}  {:>6s}  {:>6s}  {:>6s} "
    out = [
        "#",
        "# {:>10s}  {:>12s}  {:>8s}  {:>6s}  {:>6s}           out-of-place                       in-place          ".format(
            *[""] * 5
        ),
    ]
    out += [fmt.format(*cols), fmt.format(*units)]
    total, n = 0.0, 0
    for c in range(cycles):
        for size in sizes:
            bw = busbw(size, c)
            alg = bw * nranks / max(1, 2 * (nranks - 1)) if nranks > 1 else bw
            t = size / 1e3 / alg if alg else 0.0
            w = "   N/A" if wrong is None else f"{_g(wrong):>6s}"
            row = f"{size:12d}  {size // 4:12d}  {type_:>8s}  {redop:>6s}  {root:6d}"
            for _ in range(2):
                row += f"  {_float(t, 7)}  {_float(alg, 6)}  {_float(bw, 6)}  {w}"
            out.append(row)
            total, n = total + 2 * bw, n + 2
    out.append(f"# {'Out of bounds values':<20s} : {0 if not wrong else wrong} {'FAILED' if wrong else 'OK'}")
    out.append(f"# {'Avg bus bandwidth':<20s} : {_g(total / max(1, n))} ")
    out += ["#", "# Collective test concluded: all_reduce_perf", ""]
    return "\n".join(out)


def info(host, pid, dev, msg, tid=None) -> str:
    """NCCL's INFO line prefix (src/debug.cc): HOST:PID:TID [DEV] NCCL INFO MSG."""
    return f"{host}:{pid}:{tid or pid} [{dev}] NCCL INFO {msg}"
