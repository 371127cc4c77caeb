"""Gate 1's trials driver: DeepEP's own test_ep.py and the dense arm, K trials each, interleaved, in ONE launch.

Our own driver (reprostack), not upstream code; it runs upstream's test from the patched tree unchanged:
  python micro_trials.py --test-ep <deepep>/tests/elastic/test_ep.py --trials K --arms deepep,dense \
      [--dense-warmup W --dense-iters I --dense-seed S] -- <test_ep.py's own arguments>
(the `--` is optional: every argument this driver does not know goes to test_ep.py's own parser.)

How a trial is made (issue 16 item 1): one launch, K repetitions inside it, not K launches. A launch costs
the process start, the NCCL/ElasticBuffer set-up and the JIT build (the warm micro test takes ~50 s, the
kernels ~ms), so K launches would multiply that for nothing; and what is measured stays exactly upstream's:
this driver executes test_ep.py's own `__main__` (its argument parser and defaults, its
`torch.multiprocessing.spawn`), each rank runs upstream's `test_loop` (its `init_dist`, its ElasticBuffer,
its teardown), and only the module's `test_dispatch_combine(buffer, args)` is wrapped so that it is called
K times on the same buffer. Each call draws its own random routing and data (upstream's generator, seeded
once by init_dist) and runs its own bench_kineto (warm-up, 30 timed runs, L2 flushed) per phase. Trial 1
pays the JIT before its timed runs, never inside them.

One local rank (EP1, and each node of a torchrun launch with one GPU): that rank runs in this driver's own process
instead of a process `torch.multiprocessing.spawn` would start for it: a second interpreter importing torch again
cost ~5 s of each warm run on the H200 (py-spy, results/bench/), and nothing measured depends on which process
calls upstream's test_loop (same function, same arguments, same GPU, same kernels and timing). Two or more local
ranks are spawned exactly as upstream does.

Like for like (item 2): the dense arm (gates/drivers/dense_a2a.DenseRunner) runs in the SAME processes (the
ranks test_ep spawned, its default NCCL group), with the SAME sizes (test_ep's parsed --num-tokens,
--hidden, --num-topk, --num-experts; tokens per rank max(1, T - rank)), the same payload dtype as test_ep's
first EP mode (FP8 + scales when its use_fp8_dispatch is 1, from upstream's `enumerate_ep_modes()`) and the
same routing distribution (uniform top-k of distinct experts: test_ep's default --unbalanced-ratio 1; any
other routing option is refused, exit 2), interleaved with DeepEP trial by trial (A B A B ...,
`schedule`), so drift of the machine hits both arms alike and each trial gives one paired ratio.

Output lines (besides test_ep's own): `[micro_trials] {"event": "trial", "rank", "trial", "trials", "arm"}`
before each arm's trial on every rank, then after the last trial `[micro_trials] {"event": "nccl", "rank", "host",
"pid", "mapped", "deleted", "versions", "how", "loader", "runtime", "torch_built_with", "deep_ep"}` (the one-NCCL
evidence of the process that measured: every libnccl mapping of its /proc/self/maps, a deleted one too, read by
reprostack's src/reprostack/launch/procmaps.py, and ncclGetVersion of the one mapped; the gate judges it, issue 17: no
separate check process) and `[micro_trials] {"event": "done", "rank", "trials"}` at the end;
the dense arm's `[dense_a2a] ...` lines carry `"trial": k`. Parsed by reprostack.gates.parsers.micro_trials.
Pure-Python parts (arguments, schedule, checks) are tested on the CPU (tests/test_micro_trials.py).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import runpy
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dense_a2a  # noqa: E402  (pure Python at import time)

TAG = "[micro_trials] "
ARMS = ("deepep", "dense")


def emit(obj: dict) -> None:
    print(TAG + json.dumps(obj, sort_keys=True), flush=True)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """(this driver's options, test_ep.py's arguments). Raises SystemExit(2) with a message for a bad value."""
    ap = argparse.ArgumentParser(prog="micro_trials.py", description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--test-ep", required=True, help="path of DeepEP's tests/elastic/test_ep.py (patched tree)")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--arms", default="deepep")
    ap.add_argument("--dense-warmup", type=int, default=20)
    ap.add_argument("--dense-iters", type=int, default=100)
    ap.add_argument("--dense-seed", type=int, default=0)
    own, rest = ap.parse_known_args(argv)
    rest = [x for x in rest if x != "--"]
    arms = tuple(dict.fromkeys(a.strip() for a in own.arms.split(",") if a.strip()))
    if own.trials < 1:
        ap.error(f"--trials must be >= 1, not {own.trials}")
    if not arms or any(a not in ARMS for a in arms) or "deepep" not in arms:
        ap.error(f"--arms {own.arms!r}: a comma list of {', '.join(ARMS)} that includes deepep")
    if own.dense_warmup < 0 or own.dense_iters < 1:
        ap.error("--dense-warmup must be >= 0 and --dense-iters >= 1")
    own.arms = arms
    return own, rest


def schedule(trials: int, arms: tuple[str, ...]) -> list[tuple[int, str]]:
    """(trial, arm) in run order: every arm once per trial, in the given order (ABAB...)."""
    return [(k, a) for k in range(trials) for a in arms]


def check_like_for_like(ns: argparse.Namespace) -> str | None:
    """Why the dense arm cannot run test_ep's case `ns` like for like (None: it can): the dense arm routes
    uniformly (top-k of distinct experts), which is test_ep's routing only without unbalanced/precise/masked
    routing and without the pressure test."""
    bad = []
    if float(getattr(ns, "unbalanced_ratio", 1.0)) != 1.0:
        bad.append(f"--unbalanced-ratio {ns.unbalanced_ratio}")
    if getattr(ns, "precise_unbalanced_ratio", False):
        bad.append("--precise-unbalanced-ratio")
    if float(getattr(ns, "masked_ratio", 0.0)) > 0:
        bad.append(f"--masked-ratio {ns.masked_ratio}")
    if getattr(ns, "do_pressure_test", False):
        bad.append("--do-pressure-test")
    return (f"the dense arm routes uniformly; test_ep.py was given {', '.join(bad)}") if bad else None


def dense_options(ns: argparse.Namespace, own, fp8: bool) -> argparse.Namespace:
    """DenseRunner's options from test_ep's parsed arguments (the same sizes) and this driver's."""
    return argparse.Namespace(
        num_tokens=ns.num_tokens,
        hidden=ns.hidden,
        num_topk=ns.num_topk,
        num_experts=ns.num_experts,
        seed=own["dense_seed"],
        warmup=own["dense_warmup"],
        iters=own["dense_iters"],
        fp8_dispatch=int(bool(fp8)),
    )


PROCMAPS = Path(__file__).resolve().parents[2] / "src" / "reprostack" / "launch" / "procmaps.py"


def load_procmaps():
    """reprostack's maps reader (src/reprostack/launch/procmaps.py of this checkout, stdlib only), loaded by its path:
    reprostack itself is not importable in the test's Python. Raises OSError when the checkout has none."""
    if not PROCMAPS.is_file():
        raise OSError(f"no {PROCMAPS}: the one-NCCL record cannot be read")
    spec = importlib.util.spec_from_file_location("_reprostack_procmaps", PROCMAPS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def nccl_in_process() -> dict:  # pragma: no cover - needs torch + deep_ep loaded
    """This process's one-NCCL evidence (procmaps.record): every libnccl* mapping of /proc/self/maps counted, a
    deleted or replaced one too, each with its version and how it got there; ncclGetVersion of the mapped one when
    there is exactly one and it is still on disk; torch's compile-time NCCL; deep_ep's folder."""
    import torch
    import deep_ep

    rec = load_procmaps().record()
    runtime = None
    if len(rec["mapped"]) == 1 and not rec["deleted"]:
        v = ctypes.c_int()
        if ctypes.CDLL(rec["mapped"][0]).ncclGetVersion(ctypes.byref(v)) == 0:
            runtime = f"{v.value // 10000}.{v.value % 10000 // 100}.{v.value % 100}"
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),  # with the host: which NCCL INFO lines are this rank's (the gate's transport proof)
        **rec,
        "runtime": runtime,
        "torch_built_with": ".".join(map(str, torch.cuda.nccl.version())),
        "deep_ep": os.path.dirname(deep_ep.__file__),
    }


def load_test_ep(path: str):
    """test_ep.py as a module (its `__main__` block does not run)."""
    spec = importlib.util.spec_from_file_location("_reprostack_test_ep", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _child(local_rank: int, path: str, num_local_ranks: int, ns, own: dict):  # pragma: no cover - GPU
    """One rank (spawned like upstream's test_loop): upstream's test_loop with test_dispatch_combine
    called K times, the dense arm's trial after each when asked for."""
    mod = load_test_ep(path)
    upstream = mod.test_dispatch_combine
    fp8 = bool(next(iter(mod.enumerate_ep_modes()))[2])  # use_fp8_dispatch of the first EP mode

    def trials(buffer, args):
        import torch.distributed as dist

        rank, world = dist.get_rank(), dist.get_world_size()
        dense = None
        for k, arm in schedule(own["trials"], own["arms"]):
            emit({"event": "trial", "rank": rank, "trial": k, "trials": own["trials"], "arm": arm})
            if arm == "deepep":
                upstream(buffer, args)
                continue
            if dense is None:
                dense = dense_a2a.DenseRunner(dense_options(args, own, fp8), rank, world)
                if rank == 0:
                    dense_a2a.emit(dense.config())
            dense.trial(k)
        if dense is not None:
            dense_a2a.emit(
                {"event": "done", "rank": rank, "world": world, "check": "ok" if dense.check() else "mismatch"}
            )
        try:
            emit({"event": "nccl", "rank": rank, **nccl_in_process()})
        except Exception as e:  # the gate reports it; the trials' figures stay in the log
            emit({"event": "nccl", "rank": rank, "error": f"{type(e).__name__}: {e}"})
        emit({"event": "done", "rank": rank, "trials": own["trials"]})

    mod.test_dispatch_combine = trials
    mod.test_loop(local_rank, num_local_ranks, ns)


def main(argv=None) -> int:  # pragma: no cover - needs torch + a GPU; the device script runs it
    own, rest = parse_args(sys.argv[1:] if argv is None else argv)
    path = str(Path(own.test_ep).resolve())
    import torch.multiprocessing

    real_spawn = torch.multiprocessing.spawn
    opts = {
        "trials": own.trials,
        "arms": own.arms,
        "dense_warmup": own.dense_warmup,
        "dense_iters": own.dense_iters,
        "dense_seed": own.dense_seed,
    }

    def spawn(fn, args=(), nprocs=1, **kw):  # upstream's __main__ calls spawn(test_loop, (n, args), n)
        num_local_ranks, ns = args
        if "dense" in own.arms:
            why = check_like_for_like(ns)
            if why:
                print(f"micro_trials.py: {why}", file=sys.stderr)
                raise SystemExit(2)
        # by module name, not __main__ (runpy has replaced __main__ by test_ep.py's while it runs): the
        # spawned ranks import `micro_trials` from this folder (on sys.path, which spawn hands them)
        import micro_trials

        if nprocs == 1 and kw.get("join", True):  # one local rank: in this process (see the module doc)
            micro_trials._child(0, path, num_local_ranks, ns, opts)
            return None
        return real_spawn(micro_trials._child, args=(path, num_local_ranks, ns, opts), nprocs=nprocs, **kw)

    torch.multiprocessing.spawn = spawn
    sys.argv = [path, *rest]
    runpy.run_path(path, run_name="__main__")
    return 0


def leave(code: int) -> None:  # pragma: no cover - exits the process
    """Exit once test_ep's __main__ has returned: every record is printed, so flush and leave without Python's
    finalization (the atexit teardown of torch, NCCL and NVSHMEM after upstream's own destroy calls measures nothing;
    the gate counts nothing after the last record)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main())
