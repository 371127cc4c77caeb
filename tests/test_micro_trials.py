"""The trials driver (gates/drivers/micro_trials.py) and its parser on the CPU.

The driver runs here end to end with the GPU pieces stood in for: a stand-in `torch` (spawn runs the rank in
this process after a pickle round trip of what it would send to the child, as multiprocessing's spawn does;
torch.distributed gives rank 0 of 1), a stand-in test_ep.py shaped like upstream's (its own argparse in
`__main__`, `torch.multiprocessing.spawn(test_loop, ...)`, `test_loop` calling `test_dispatch_combine(buffer,
args)`, `enumerate_ep_modes()`) that prints one real H200 log per call, and a stand-in DenseRunner. Real: the
driver's argument split, upstream-parser pass-through, the spawn interception, the wrapping of
test_dispatch_combine, the ABAB schedule, the markers; then parsers.micro_trials on what it printed.
"""

from __future__ import annotations

import importlib
import json
import pickle
import sys
import types
from pathlib import Path

import pytest

import gaterun
from gaterun import run as run_gate_here

from reprostack.gates.options import GateOptions
from reprostack.gates.parsers.micro_trials import parse_micro_trials
from trialslog import DENSE_FIX, REAL_EP1, REAL_EP1_DC, dense_records, marker, real_ep1_texts, trials_log

REPO_ROOT = Path(__file__).resolve().parents[1]
DRIVERS = REPO_ROOT / "gates" / "drivers"

FAKE_TEST_EP = """
import argparse
import torch

LOGS = {logs!r}
calls = []

def enumerate_ep_modes():
    for fp8 in (1, 0):
        yield (1, 128, fp8, 0, 0, 0, 0)

def test_dispatch_combine(buffer, args):
    print(open(LOGS[len(calls) % len(LOGS)]).read(), end="", flush=True)
    calls.append(args.num_tokens)

def test_loop(local_rank, num_local_ranks, args):
    test_dispatch_combine(object(), args)

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-processes", type=int, default=8)
    parser.add_argument("--num-tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--num-topk", type=int, default=6)
    parser.add_argument("--num-experts", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--unbalanced-ratio", type=float, default=1.0)
    parser.add_argument("--precise-unbalanced-ratio", action="store_true")
    parser.add_argument("--masked-ratio", type=float, default=0.0)
    parser.add_argument("--do-pressure-test", action="store_true")
    parser.add_argument("--test-first-only", action="store_true")
    parser.add_argument("--skip-check", action="store_true")
    args = parser.parse_args()
    torch.multiprocessing.spawn(test_loop, args=(args.num_processes, args), nprocs=args.num_processes)
"""


@pytest.fixture
def driver(monkeypatch):
    """The driver module imported by name (as the spawned ranks import it) with stand-in torch modules."""
    torch = types.ModuleType("torch")
    mp = types.ModuleType("torch.multiprocessing")
    dist = types.ModuleType("torch.distributed")

    def spawn(fn, args=(), nprocs=1, **kw):
        fn, args = pickle.loads(pickle.dumps((fn, args)))  # what multiprocessing's spawn sends to a child
        for i in range(nprocs):
            fn(i, *args)

    mp.spawn = spawn
    dist.get_rank, dist.get_world_size = (lambda: 0), (lambda: 1)
    torch.multiprocessing, torch.distributed = mp, dist
    for name, mod in (("torch", torch), ("torch.multiprocessing", mp), ("torch.distributed", dist)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.syspath_prepend(str(DRIVERS))
    for name in ("micro_trials", "dense_a2a"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    mt = importlib.import_module("micro_trials")
    yield mt
    for name in ("micro_trials", "dense_a2a"):
        sys.modules.pop(name, None)


class StandInDense:
    """DenseRunner's interface, printing the dense fixture's phase lines scaled by (1 + trial / 10)."""

    made: list = []

    def __init__(self, a, rank, world):
        self.a, self.rank, self.world = a, rank, world
        self.cfg, self.phases, _ = dense_records(DENSE_FIX / "dense_ep1.log")
        StandInDense.made.append(a)

    def config(self):
        return self.cfg

    def trial(self, k):
        import dense_a2a
        from trialslog import dense_trial

        for r in dense_trial(self.phases, k, 1 + k / 10):
            dense_a2a.emit(r)

    def check(self):
        return True


def run_driver(driver, tmp_path, monkeypatch, capsys, argv):
    test_ep = tmp_path / "test_ep.py"
    test_ep.write_text(FAKE_TEST_EP.format(logs=[str(p) for p in REAL_EP1]))
    StandInDense.made = []
    monkeypatch.setattr(sys.modules["dense_a2a"], "DenseRunner", StandInDense)
    monkeypatch.setattr(sys, "argv", ["micro_trials.py"])
    rc = driver.main(["--num-processes", "1", "--test-ep", str(test_ep), *argv])
    assert sys.modules["__main__"].__name__ == "__main__"  # runpy put it back
    return rc, capsys.readouterr().out


def test_driver_runs_k_trials_of_both_arms_abab_in_one_launch(driver, tmp_path, monkeypatch, capsys):
    rc, out = run_driver(
        driver,
        tmp_path,
        monkeypatch,
        capsys,
        [
            "--trials",
            "3",
            "--arms",
            "deepep,dense",
            "--dense-iters",
            "7",
            "--num-tokens",
            "128",
            "--hidden",
            "7168",
            "--num-topk",
            "8",
            "--num-experts",
            "256",
            "--test-first-only",
        ],
    )
    assert rc == 0
    order = [
        (m["trial"], m["arm"])
        for m in map(json.loads, (x.split("] ", 1)[1] for x in out.splitlines() if x.startswith("[micro_trials]")))
        if m["event"] == "trial"
    ]
    assert order == [(0, "deepep"), (0, "dense"), (1, "deepep"), (1, "dense"), (2, "deepep"), (2, "dense")]
    (a,) = StandInDense.made  # one runner, made in the rank after DeepEP's first trial, with test_ep's sizes
    assert (a.num_tokens, a.hidden, a.num_topk, a.num_experts, a.iters, a.fp8_dispatch) == (128, 7168, 8, 256, 7, 1)
    tp = parse_micro_trials(out, num_ranks=1, trials=3, arms=("deepep", "dense"))
    assert tp.complete and tp.dense_ok and tp.problems == []
    assert tp.figures["dc_p50_us"] == REAL_EP1_DC
    assert tp.figures["dense_dc_p50_us"] == pytest.approx([152.797, 168.077, 183.356], abs=2e-3)
    assert tp.figures["deepep_over_dense_dc"] == pytest.approx(
        [a / b for a, b in zip(REAL_EP1_DC, tp.figures["dense_dc_p50_us"])]
    )
    s = tp.summaries()["deepep_over_dense_dc"]
    assert s.n == 3 and s.ci95[0] < s.mean < s.ci95[1] and s.unit == "ratio"


def test_driver_deepep_only_passes_upstream_defaults_through(driver, tmp_path, monkeypatch, capsys):
    rc, out = run_driver(driver, tmp_path, monkeypatch, capsys, ["--trials", "2", "--", "--num-tokens", "64"])
    tp = parse_micro_trials(out, num_ranks=1, trials=2)
    assert rc == 0 and tp.complete and tp.figures["dc_p50_us"] == REAL_EP1_DC[:2] and StandInDense.made == []
    assert "[dense_a2a]" not in out


def test_driver_refuses_routing_the_dense_arm_cannot_copy(driver, tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as e:
        run_driver(driver, tmp_path, monkeypatch, capsys, ["--arms", "deepep,dense", "--unbalanced-ratio", "2"])
    assert e.value.code == 2
    assert "the dense arm routes uniformly; test_ep.py was given --unbalanced-ratio 2.0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--trials", "0"], "--trials must be >= 1"),
        (["--arms", "dense"], "that includes deepep"),
        (["--arms", "deepep,nccl"], "that includes deepep"),
        (["--dense-iters", "0"], "--dense-iters >= 1"),
    ],
)
def test_driver_bad_options_exit_2_in_one_line(driver, capsys, argv, msg):
    with pytest.raises(SystemExit) as e:
        driver.parse_args(["--test-ep", "x.py", *argv])
    assert e.value.code == 2 and msg in capsys.readouterr().err


def test_driver_option_split_and_schedule(driver):
    own, rest = driver.parse_args(
        [
            "--num-processes",
            "2",
            "--test-ep",
            "t.py",
            "--trials",
            "4",
            "--seed",
            "3",
            "--arms",
            "deepep,dense",
            "--num-tokens",
            "128",
        ]
    )
    assert (own.trials, own.arms, own.dense_seed) == (4, ("deepep", "dense"), 0)
    assert rest == ["--num-processes", "2", "--seed", "3", "--num-tokens", "128"]  # test_ep's --seed is its own
    assert driver.schedule(2, ("deepep",)) == [(0, "deepep"), (1, "deepep")]


def test_dense_payload_is_deepeps_bytes_per_token(driver):
    dense = sys.modules["dense_a2a"]
    # FP8: 7168 bytes + 56 float32 scales + 8 int64 ids + 8 float32 weights; bf16: 2 x 7168 + 96
    assert dense.payload_bytes_per_token(7168, 8, True) == 7168 + 224 + 64 + 32 == 7488
    assert dense.payload_bytes_per_token(7168, 8, False) == 14336 + 96
    # the real H200 EP1 log: 128 tokens dispatched, 958464 bytes = 128 x 7488 (test_ep's count_bytes)
    assert 958464 == 128 * dense.payload_bytes_per_token(7168, 8, True)


# ------------------------------------------------------------------------------------------- parser


def test_parser_on_concatenated_real_logs():
    tp = parse_micro_trials(trials_log(real_ep1_texts(5)), num_ranks=1, trials=5)
    assert tp.complete and tp.figures["dc_p50_us"] == REAL_EP1_DC + REAL_EP1_DC[:2]
    assert [p.phases["dispatch"].p50 for p in tp.deepep] == [8.472, 8.449, 8.669, 8.472, 8.449]
    assert set(tp.figures) == {"dc_p50_us", "dispatch_p50_us", "combine_p50_us"}
    st = tp.summaries()["dc_p50_us"]
    assert st.n == 5 and st.samples == tuple(REAL_EP1_DC + REAL_EP1_DC[:2])


def test_parser_flags_a_doubled_log_and_missing_markers():
    once = trials_log(real_ep1_texts(2))
    tp = parse_micro_trials(once + once, num_ranks=1, trials=2)
    assert not tp.complete
    assert "trial markers: rank 0 started 4 deepep trial(s), expected 2" in tp.problems
    assert any("printed more often than 2 trial(s) x 1 announced mode(s)" in p for p in tp.deepep[0].problems)
    bare = "".join(real_ep1_texts(2))  # plain test_ep output, no driver markers
    tp = parse_micro_trials(bare, num_ranks=1, trials=2)
    assert tp.deepep[1].complete and not tp.complete
    assert tp.problems == [
        "trial markers: rank 0 started 0 deepep trial(s), expected 2",
        "trial markers: rank 0 said done 0 time(s), expected once",
    ]


def test_parser_short_log_lacks_the_last_trial():
    tp = parse_micro_trials(trials_log(real_ep1_texts(2)), num_ranks=1, trials=3)
    assert tp.deepep[0].complete and tp.deepep[1].complete and not tp.deepep[2].complete
    assert (
        "dc_p50_us" not in tp.figures and "trial markers: rank 0 started 2 deepep trial(s), expected 3" in tp.problems
    )


def test_parser_bad_marker_and_bad_arguments():
    text = trials_log(real_ep1_texts(1)) + "[micro_trials] {not json\n" + marker(event="trial", rank=7, arm="x") + "\n"
    tp = parse_micro_trials(text, num_ranks=1, trials=1)
    assert any("[micro_trials] record not JSON" in p for p in tp.problems)
    assert "trial markers: unexpected rank/arm 7/'x'" in tp.problems
    with pytest.raises(ValueError, match="trials must be >= 1"):
        parse_micro_trials("", num_ranks=1, trials=0)


def test_parser_dense_trial_missing_is_not_ok():
    text = trials_log(real_ep1_texts(2), dense_fixture=DENSE_FIX / "dense_ep1.log")
    cut = "\n".join(line for line in text.splitlines() if '"trial": 1, "world"' not in line or "combine" not in line)
    tp = parse_micro_trials(cut, num_ranks=1, trials=2, arms=("deepep", "dense"))
    assert tp.complete and not tp.dense_ok and "dense_dc_p50_us" not in tp.figures
    assert tp.dense[1].problems == ["combine: rank(s) 0 missing of 1"]


# ------------------------------------------------------------------------------------------- CLI plumbing


@pytest.mark.parametrize(
    "value, msg",
    [("0", "argument --trials: 0: give K >= 1"), ("five", "argument --trials: 'five' is not a whole number")],
)
def test_cli_trials_bad_value_is_exit_2_in_one_line(capsys, value, msg):
    from reprostack.cli import main

    with pytest.raises(SystemExit) as e:
        main(["gate", "micro", "--trials", value])
    assert e.value.code == 2 and msg in capsys.readouterr().err


def test_cli_trials_reach_the_micro_gate_and_the_in_image_command(tmp_path, monkeypatch):
    from reprostack.gates import container, micro, runner
    from reprostack.gates.base import RunContext
    from reprostack.gates.registry import GATES

    seen = {}

    class Seen(Exception):
        pass

    def sources(self, st):  # the options the micro gate runs with, once it took them
        seen.update(opts=st.opts)
        raise Seen

    monkeypatch.setattr(micro.MicroGate, "sources", sources)
    g = next(g for g in GATES if g.name == "micro")
    ctx = RunContext(REPO_ROOT, None, types.SimpleNamespace(cache=None))
    with pytest.raises(Seen):
        runner.run_here(g, GateOptions(out=tmp_path, trials=3, arms=["deepep", "dense"]), ctx)
    assert (seen["opts"].trials, seen["opts"].arms) == (3, ("deepep", "dense"))
    with pytest.raises(Seen):
        runner.run_here(g, GateOptions(out=tmp_path), ctx)
    assert seen["opts"].trials == micro.DEFAULT_TRIALS == 5
    lock = types.SimpleNamespace(path="/x/upstreams.lock")
    argv = container.inner_argv(g, GateOptions(out=tmp_path, trials=4), lock)
    assert argv[argv.index("--trials") + 1] == "4"
    assert "--trials" not in container.inner_argv(g, GateOptions(out=tmp_path), lock)


def test_micro_refuses_a_bad_trial_count_before_anything_runs(tmp_path):
    from reprostack.errors import ReprostackError

    with pytest.raises(ReprostackError, match="--trials 0: give a whole number >= 1"):
        run_gate_here(gaterun.options("micro", root=tmp_path, lock=None, fetch=None, out_dir=tmp_path, trials=0))
