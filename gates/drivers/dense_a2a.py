"""The "dense" comparison arm of gate 1: MoE dispatch and combine with torch.distributed.all_to_all_single.

Our own driver (reprostack), not upstream code. One process per GPU, started by torchrun (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR/PORT from it); runs at any world size, 1 included (NCCL with one rank).

Token layout = DeepEP tests/elastic/test_ep.py's case (gates/micro.yaml): rank r holds max(1, T - r) tokens
(test_ep.py: `num_tokens = max(1, args.num_tokens - rank)`), hidden H in bf16, top-k of E experts. Routing
is ours, from a fixed seed, so every rank can compute every rank's routing without communication: token t
of rank r picks `random.Random(seed * 1_000_003 + r).sample(range(E), k)` (k distinct experts, uniform, as
top-k of i.i.d. scores). Expert e lives on rank e // (E / world). A token is sent once to each distinct
rank among its experts (DeepEP's non-expanded dispatch does the same), in ascending rank order.

Payload = DeepEP's (like for like with test_ep's first EP mode, issue 16 item 2): with `--fp8-dispatch 1` (the
default; test_ep's first mode has use_fp8_dispatch=1) a token's row is FP8 e4m3 plus one float32 scale per 128
columns, else bf16; the top-k ids (int64) and weights (float32) travel with it, all in ONE byte row per token
(`payload_bytes_per_token`, what test_ep counts as bytes per dispatched token); combine sends bf16 rows back.

Phases, each timed with CUDA events per iteration (after `--warmup` untimed ones; a barrier before each):
- dispatch: pack rows (index_select), all_to_all_single of the per-rank counts, the counts to the host
  (the sizes the payload exchange needs), all_to_all_single of the packed token rows;
- cached dispatch: pack + all_to_all_single of the rows (no ids/weights) with the counts known (layout reused);
- combine: all_to_all_single of the bf16 expert outputs back (expert compute = identity, prepared untimed)
  and a float32 index_add per source token, cast to bf16.
What still differs from DeepEP's figures: test_ep times with kineto the dispatch/combine kernel only (mean of
30 runs, L2 flushed), this driver the whole phase with CUDA events (launches and the host sync included).
Output, rank by rank, one JSON object per line after the tag `[dense_a2a] `: {"event": "config", ...},
{"event": "phase", "rank", "world", "phase", "p50_us", "mean_us", "min_us", "max_us", "iters",
"send_rows", "recv_rows", "recv_bytes"[, "trial"]} per phase, {"event": "done", "rank", "check": "ok"} at the
end (after the correctness check: received counts = the routing's, combined rows = x x distinct ranks).
`DenseRunner` is the same code for this standalone driver (one pass, torchrun) and for the trials driver
(gates/drivers/micro_trials.py: K passes interleaved with DeepEP's, lines with "trial": k).
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
    return [
        send_plan(dest_ranks(route(num_tokens, num_experts, topk, seed, r), num_experts, world), world)[1]
        for r in range(world)
    ]


def summarize_us(samples_ms: list[float]) -> dict:
    """p50 (statistics.median), mean, min, max in microseconds of CUDA event times given in ms."""
    us = [x * 1000.0 for x in samples_ms]
    return {
        "p50_us": round(statistics.median(us), 3),
        "mean_us": round(statistics.fmean(us), 3),
        "min_us": round(min(us), 3),
        "max_us": round(max(us), 3),
        "iters": len(us),
    }


def emit(obj: dict) -> None:
    """One machine-readable line on stdout."""
    print(TAG + json.dumps(obj, sort_keys=True), flush=True)


def payload_bytes_per_token(hidden: int, topk: int, fp8: bool) -> int:
    """Bytes one dispatched token carries, as DeepEP's dispatch counts them (test_ep.py: count_bytes of
    recv_x, recv_topk_idx, recv_topk_weights per token): the row (FP8 e4m3: `hidden` bytes plus one float32
    scale per 128 columns; else bf16: 2 x hidden), the top-k ids (int64) and the top-k weights (float32)."""
    row = hidden + 4 * -(-hidden // 128) if fp8 else BF16_BYTES * hidden
    return row + 8 * topk + 4 * topk


def _args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-tokens", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--num-topk", type=int, default=8)
    ap.add_argument("--num-experts", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument(
        "--fp8-dispatch",
        type=int,
        choices=(0, 1),
        default=1,
        help="dispatch rows as FP8 e4m3 + per-128 float32 scales (test_ep's first mode) or bf16",
    )
    return ap.parse_args(argv)


class DenseRunner:  # pragma: no cover - needs torch + a GPU; tests/test_micro_trials.py stands in for it
    """The three phases on this rank of an initialised default process group, repeatable: `trial(k)` runs
    warmup + timed iterations of each phase and prints its phase lines (with `"trial": k` unless k is None);
    `check()` is the correctness check of the last trial. Every tensor's dtype and device are explicit: the
    trials driver runs this inside DeepEP's process, where torch's default dtype is bf16 and device cuda."""

    def __init__(self, a, rank: int, world: int):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.a, self.rank, self.world = torch, dist, a, rank, world
        dev = torch.device("cuda", torch.cuda.current_device())
        ids = route(a.num_tokens, a.num_experts, a.num_topk, a.seed, rank)
        self.order, self.send_counts = send_plan(dest_ranks(ids, a.num_experts, world), world)
        self.recv_counts = [row[rank] for row in count_matrix(a.num_tokens, a.num_experts, a.num_topk, a.seed, world)]
        n, h, k = len(ids), a.hidden, a.num_topk
        gen = torch.Generator(device=dev).manual_seed(a.seed * 1_000_003 + rank)
        self.x = torch.randn(n, h, dtype=torch.bfloat16, device=dev, generator=gen)
        topk_ids = torch.tensor(ids, dtype=torch.int64, device=dev)
        weights = torch.full((n, k), 1.0 / k, dtype=torch.float32, device=dev)
        if a.fp8_dispatch:  # per token, per 128 columns: amax / 448 as the float32 scale (e4m3's largest is 448)
            pad = -(-h // 128) * 128
            blocks = torch.nn.functional.pad(self.x.float(), (0, pad - h)).view(n, -1, 128)
            amax = blocks.abs().amax(dim=2).clamp(min=1e-4)
            row = (blocks * (448.0 / amax.unsqueeze(2))).to(torch.float8_e4m3fn).view(n, pad)[:, :h].contiguous()
            row_bytes = torch.cat([row.view(torch.uint8), (amax / 448.0).contiguous().view(torch.uint8)], 1)
        else:
            row_bytes = self.x.contiguous().view(torch.uint8)
        # one byte row per token: the dispatched row, then top-k ids and weights (DeepEP's payload)
        self.tokens = torch.cat([row_bytes, topk_ids.view(torch.uint8), weights.view(torch.uint8)], 1).contiguous()
        self.row_width = row_bytes.shape[1]
        assert self.tokens.shape[1] == payload_bytes_per_token(h, k, bool(a.fp8_dispatch))
        self.pack = torch.tensor(self.order, dtype=torch.long, device=dev)
        self.counts_in = torch.tensor(self.send_counts, dtype=torch.int64, device=dev)
        self.counts_out = torch.empty_like(self.counts_in)
        self.rows_in, self.rows_out = len(self.order), sum(self.recv_counts)
        self.recv = torch.empty(self.rows_out, self.tokens.shape[1], dtype=torch.uint8, device=dev)
        self.recv_rows = torch.empty(self.rows_out, self.row_width, dtype=torch.uint8, device=dev)
        self.expert_out = torch.empty(self.rows_out, h, dtype=torch.bfloat16, device=dev)
        self.back = torch.empty(self.rows_in, h, dtype=torch.bfloat16, device=dev)
        self.acc = torch.empty(n, h, dtype=torch.float32, device=dev)
        self.seen: dict = {}

    def dispatch(self):
        dist = self.dist
        send = self.tokens.index_select(0, self.pack)
        dist.all_to_all_single(self.counts_out, self.counts_in)
        splits = self.counts_out.tolist()  # host sync: the payload exchange needs the sizes
        dist.all_to_all_single(self.recv, send, splits, self.send_counts)
        self.seen["counts"] = splits

    def cached_dispatch(self):
        send = self.tokens[:, : self.row_width].index_select(0, self.pack)
        self.dist.all_to_all_single(self.recv_rows, send, self.recv_counts, self.send_counts)

    def combine(self):
        # expert compute = identity on the bf16 rows this rank received (bf16 back, as DeepEP's combine)
        self.dist.all_to_all_single(self.back, self.expert_out, self.send_counts, self.recv_counts)
        self.acc.zero_().index_add_(0, self.pack, self.back.float())
        self.seen["y"] = self.acc.to(self.torch.bfloat16)

    def trial(self, k: int | None = None) -> None:
        torch, dist, a = self.torch, self.dist, self.a
        # the rows each expert returns: the bf16 rows of the tokens routed here (identity expert)
        dist.all_to_all_single(self.expert_out, self.x.index_select(0, self.pack), self.recv_counts, self.send_counts)
        for phase, fn in zip(PHASES, (self.dispatch, self.cached_dispatch, self.combine)):
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
            row = self.tokens.shape[1] if phase != "combine" else self.x.shape[1] * BF16_BYTES
            rows = self.rows_out if phase != "combine" else self.rows_in
            if phase == "cached dispatch":
                row = self.row_width
            emit(
                {
                    "event": "phase",
                    "rank": self.rank,
                    "world": self.world,
                    "phase": phase,
                    **summarize_us(times),
                    "send_rows": self.rows_in,
                    "recv_rows": self.rows_out,
                    "recv_bytes": rows * row,
                    **({} if k is None else {"trial": k}),
                }
            )

    def check(self) -> bool:
        torch = self.torch
        ok = self.seen["counts"] == self.recv_counts
        per_token = torch.bincount(self.pack, minlength=self.x.shape[0]).to(torch.float32).unsqueeze(1)
        return ok and torch.allclose(
            self.seen["y"].float(), (self.x.float() * per_token).to(torch.bfloat16).float(), rtol=2e-2, atol=2e-2
        )

    def config(self) -> dict:
        a = self.a
        return {
            "event": "config",
            "world": self.world,
            "tokens": a.num_tokens,
            "hidden": a.hidden,
            "topk": a.num_topk,
            "experts": a.num_experts,
            "dtype": "float8_e4m3fn+scales" if a.fp8_dispatch else "bfloat16",
            "combine_dtype": "bfloat16",
            "bytes_per_token": self.tokens.shape[1],
            "seed": a.seed,
            "warmup": a.warmup,
            "iters": a.iters,
            "torch": self.torch.__version__,
        }


def main(argv=None) -> int:  # pragma: no cover - needs torch + a GPU; the device script runs it
    """Run the three phases on this rank and print their lines (see the module doc)."""
    a = _args(argv)  # before torch: --help and bad arguments need no GPU stack
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", local))
    runner = DenseRunner(a, rank, world)
    if rank == 0:
        emit(runner.config())
    runner.trial()
    ok = runner.check()
    emit({"event": "done", "rank": rank, "world": world, "check": "ok" if ok else "mismatch"})
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
