"""The "dense" comparison arm of gate 1: MoE dispatch and combine with torch.distributed.all_to_all_single.

Our own driver (reprostack), not upstream code. One process per GPU, started by torchrun (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR/PORT from it); runs at any world size, 1 included (NCCL with one rank).

Token layout = DeepEP tests/elastic/test_ep.py's case (gates/micro.yaml): rank r holds max(1, T - r) tokens
(test_ep.py: `num_tokens = max(1, args.num_tokens - rank)`), hidden H in bf16, top-k of E experts. Routing
is ours, from a fixed seed, so every rank can compute every rank's routing without communication: token t
of rank r picks `random.Random(seed * 1_000_003 + r).sample(range(E), k)` (k distinct experts, uniform, as
top-k of i.i.d. scores). Expert e lives on rank e // (E / world). A token is sent once to each distinct
rank among its experts (DeepEP's non-expanded dispatch does the same), in ascending rank order.

Phases, each timed with CUDA events per iteration (after `--warmup` untimed ones; a barrier before each):
- dispatch: pack rows (index_select), all_to_all_single of the per-rank counts, the counts to the host
  (the sizes the payload exchange needs), all_to_all_single of the bf16 rows and of the routing metadata
  (top-k ids and weights, float32 [rows, 2k]);
- cached dispatch: pack + all_to_all_single of the rows with the counts known (layout reused);
- combine: all_to_all_single of the rows back (expert compute = identity) and a float32 index_add per
  source token, cast to bf16.
Output, rank by rank, one JSON object per line after the tag `[dense_a2a] `: {"event": "config", ...},
{"event": "phase", "rank", "world", "phase", "p50_us", "mean_us", "min_us", "max_us", "iters",
"send_rows", "recv_rows", "recv_bytes"} per phase, {"event": "done", "rank", "check": "ok"} at the end
(after the correctness check: received counts = the routing's, combined rows = x x distinct ranks).
Parsed by reprostack.gates.parsers.dense_a2a.

The routing math below is pure Python (no torch), tested on the CPU (tests/test_dense_arm.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys

TAG = "[dense_a2a] "
PHASES = ("dispatch", "cached dispatch", "combine")
BF16_BYTES = 2


def tokens_of_rank(num_tokens: int, rank: int) -> int:
    """Tokens rank `rank` dispatches: max(1, num_tokens - rank), as DeepEP test_ep.py does."""
    return max(1, num_tokens - rank)


def route(num_tokens: int, num_experts: int, topk: int, seed: int, rank: int) -> list[list[int]]:
    """Top-k expert ids of each of rank `rank`'s tokens: [tokens_of_rank][topk], distinct ids in 0..E-1.

    Deterministic for (seed, rank) on every machine (random.Random). Raises ValueError when topk is not
    in 1..num_experts or num_tokens < 1."""
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, not {num_tokens}")
    if not 1 <= topk <= num_experts:
        raise ValueError(f"topk must be in 1..num_experts ({num_experts}), not {topk}")
    rng = random.Random(seed * 1_000_003 + rank)
    return [rng.sample(range(num_experts), topk) for _ in range(tokens_of_rank(num_tokens, rank))]


def dest_ranks(topk_ids: list[list[int]], num_experts: int, world: int) -> list[list[int]]:
    """Per token, the sorted distinct ranks holding its experts (expert e -> rank e // (E / world)).

    Raises ValueError when num_experts is not a multiple of world or an id is outside 0..E-1."""
    if world < 1 or num_experts % world:
        raise ValueError(f"num_experts ({num_experts}) must be a positive multiple of the world size ({world})")
    per = num_experts // world
    out = []
    for i, ids in enumerate(topk_ids):
        bad = [e for e in ids if not 0 <= e < num_experts]
        if bad:
            raise ValueError(f"token {i}: expert id(s) {bad} outside 0..{num_experts - 1}")
        out.append(sorted({e // per for e in ids}))
    return out


def send_plan(dests: list[list[int]], world: int) -> tuple[list[int], list[int]]:
    """(pack order, send counts): the token indices in the order they are sent (grouped by destination
    rank ascending, token index ascending within a rank; a token appears once per destination) and the
    number of rows for each destination rank ([world], sums to len(pack order))."""
    order: list[int] = []
    counts = [0] * world
    for dst in range(world):
        for t, ds in enumerate(dests):
            if dst in ds:
                order.append(t)
                counts[dst] += 1
    return order, counts


def count_matrix(num_tokens: int, num_experts: int, topk: int, seed: int, world: int) -> list[list[int]]:
    """[src][dst] rows rank src sends to rank dst; column dst is what dst receives (its recv counts)."""
    return [send_plan(dest_ranks(route(num_tokens, num_experts, topk, seed, r), num_experts, world), world)[1]
            for r in range(world)]


def summarize_us(samples_ms: list[float]) -> dict:
    """p50 (statistics.median), mean, min, max in microseconds of CUDA event times given in ms."""
    us = [x * 1000.0 for x in samples_ms]
    return {"p50_us": round(statistics.median(us), 3), "mean_us": round(statistics.fmean(us), 3),
            "min_us": round(min(us), 3), "max_us": round(max(us), 3), "iters": len(us)}


def emit(obj: dict) -> None:
    """One machine-readable line on stdout."""
    print(TAG + json.dumps(obj, sort_keys=True), flush=True)


def _args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-tokens", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--num-topk", type=int, default=8)
    ap.add_argument("--num-experts", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--iters", type=int, default=100)
    return ap.parse_args(argv)


def main(argv=None) -> int:  # pragma: no cover - needs torch + a GPU; the device script runs it
    """Run the three phases on this rank and print their lines (see the module doc)."""
    a = _args(argv)  # before torch: --help and bad arguments need no GPU stack
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    ids = route(a.num_tokens, a.num_experts, a.num_topk, a.seed, rank)
    order, send_counts = send_plan(dest_ranks(ids, a.num_experts, world), world)
    recv_counts = [row[rank] for row in count_matrix(a.num_tokens, a.num_experts, a.num_topk, a.seed, world)]
    if rank == 0:
        emit({"event": "config", "world": world, "tokens": a.num_tokens, "hidden": a.hidden, "topk": a.num_topk,
              "experts": a.num_experts, "dtype": "bfloat16", "seed": a.seed, "warmup": a.warmup, "iters": a.iters,
              "torch": torch.__version__})
    n = len(ids)
    gen = torch.Generator(device=dev).manual_seed(a.seed * 1_000_003 + rank)
    x = torch.randn(n, a.hidden, dtype=torch.bfloat16, device=dev, generator=gen)
    meta = torch.cat([torch.tensor(ids, dtype=torch.float32), torch.full((n, a.num_topk), 1.0 / a.num_topk)], 1).to(dev)
    pack = torch.tensor(order, dtype=torch.long, device=dev)
    counts_in = torch.tensor(send_counts, dtype=torch.int64, device=dev)
    counts_out = torch.empty_like(counts_in)
    rows_in, rows_out = len(order), sum(recv_counts)
    recv = torch.empty(rows_out, a.hidden, dtype=torch.bfloat16, device=dev)
    recv_meta = torch.empty(rows_out, 2 * a.num_topk, dtype=torch.float32, device=dev)
    back = torch.empty(rows_in, a.hidden, dtype=torch.bfloat16, device=dev)
    acc = torch.empty(n, a.hidden, dtype=torch.float32, device=dev)
    seen = {}

    def dispatch():
        send = x.index_select(0, pack)
        dist.all_to_all_single(counts_out, counts_in)
        splits = counts_out.tolist()  # host sync: the payload exchange needs the sizes
        dist.all_to_all_single(recv, send, splits, send_counts)
        dist.all_to_all_single(recv_meta, meta.index_select(0, pack), splits, send_counts)
        seen["counts"] = splits

    def cached_dispatch():
        dist.all_to_all_single(recv, x.index_select(0, pack), recv_counts, send_counts)

    def combine():
        dist.all_to_all_single(back, recv, send_counts, recv_counts)
        acc.zero_().index_add_(0, pack, back.float())
        seen["y"] = acc.to(torch.bfloat16)

    for phase, fn in zip(PHASES, (dispatch, cached_dispatch, combine)):
        for _ in range(a.warmup):
            fn()
        times = []
        for _ in range(a.iters):
            dist.barrier()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        emit({"event": "phase", "rank": rank, "world": world, "phase": phase, **summarize_us(times),
              "send_rows": rows_in, "recv_rows": rows_out,
              "recv_bytes": (rows_out if phase != "combine" else rows_in) * a.hidden * BF16_BYTES})
    ok = seen["counts"] == recv_counts
    per_token = torch.bincount(pack, minlength=n).to(torch.float32).unsqueeze(1)
    ok = ok and torch.allclose(seen["y"].float(), (x.float() * per_token).to(torch.bfloat16).float(), rtol=2e-2, atol=2e-2)
    emit({"event": "done", "rank": rank, "world": world, "check": "ok" if ok else "mismatch"})
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
