"""run_micro end to end on the CPU with the GPU parts stood in for: host inventory, toolchain and kernel builds
are replaced (the one-NCCL check is real: it judges the ranks' records the stand-in log carries); the 'interpreter' is a shell script that prints a log per program
(the trials driver: K real H200 EP1 test_ep logs or EP2 logs built here, with the dense arm's fixture lines per
trial, tests/trialslog.py; test_intranode: the synthetic fixture).
Real: sources (local git repos), launch argv, watchdog, parsers, metrics, verdict, report files."""

from __future__ import annotations

import io
import json
import os
import socket
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

import gaterun
from gaterun import GateRun, run as run_gate_here

from reprostack.gates import kernelprep
from reprostack import hostinfo as kernelprep_hostinfo
from reprostack import ui
from reprostack.kernels import jit
from reprostack.lock import load
from reprostack.report import exit_code, validate_report, write_reports
from test_sources import make_stack, write_project
from reprostack.gates.parsers.micro_trials import markers
from trialslog import REAL_EP1_DC, marker, real_ep1_texts, trials_log

REPO_ROOT = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures" / "arms"
MARKS = (
    ("*", "dispatch", "copy"),
    ("-", "expanded dispatch", "copy"),
    ("#", "cached dispatch", "copy"),
    ("@", "combine", "reduce"),
    ("+", "reduced combine", "reduce"),
)


def ep2_log(shift: float = 0.0) -> str:
    """An EP2 test_ep.py output in its printed shapes (numbers invented; times + `shift`)."""
    out = [
        "Config:",
        " > Ranks: 1 x 2",
        " > Experts: 8/256",
        " > Tokens: 128 (max: 128), hidden: 7168",
        " > #SM: 132, #QPs: 129/129",
        "",
        "Running all test cases:",
        " > Testing with do_handle_copy=1, expert_alignment=128, use_fp8_dispatch=1, num_bias=0, "
        "with_previous_event=0, async_with_compute_stream=0, allocate_on_comm_stream=0 ...",
    ]
    for i, (m, phase, aux) in enumerate(MARKS):
        for r in range(2):
            out.append(
                f"   {m} EP: {r:3}/2 | {phase}: 0 GB/s (SO), {200 + 10 * i + r} GB/s (SU), "
                f"{20.0 + i + r + shift:.3f} us, 1500000 bytes | {aux}: 800 GB/s, 3.000 us"
            )
    return "\n".join(out) + "\n"


def stand_in_python(
    tmp_path: Path, trials_text: str, *, nccl_runtime: str | None = "2.30.4", mapped: list[str] | None = None
) -> str:
    """An 'interpreter' that prints `trials_text` for the trials driver (test_ep + dense arm in one launch) and
    the legacy fixture for test_intranode.py. Each rank that says `done` also leaves the driver's one-NCCL record
    (this host; `mapped`, default the stand-in build's libnccl.so.2, see gpu_host; ncclGetVersion `nccl_runtime`);
    none with nccl_runtime None."""
    lib = tmp_path / "builds" / "nccl" / "build" / "lib" / "libnccl.so.2"
    lib.parent.mkdir(parents=True, exist_ok=True)
    lib.write_bytes(b"stand-in libnccl")
    if nccl_runtime is not None:  # each rank's record just before its `done`, as the driver prints it
        lines = trials_text.split("\n")
        for no, m in reversed(markers(trials_text)):
            if m.get("event") == "done":
                lines.insert(
                    no - 1,
                    marker(
                        event="nccl",
                        rank=m.get("rank"),
                        host=socket.gethostname(),
                        runtime=nccl_runtime,
                        mapped=mapped if mapped is not None else [os.path.realpath(lib)],
                        deleted=[],
                        torch_built_with="2.28.9",
                        deep_ep="/x/deep_ep",
                    ),
                )
        trials_text = "\n".join(lines)
    log = tmp_path / "trials.log"
    log.write_text(trials_text)
    p = tmp_path / "py"
    p.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {tmp_path}/calls\n'
        'case "$*" in\n'
        f"  *micro_trials.py*) cat {log} ;;\n"
        f"  *test_intranode.py*) cat {FIX / 'legacy_ep8.log'} ;;\n"
        '  *) echo "unexpected: $*"; exit 9 ;;\n'
        "esac\n"
    )
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


def before_done(text: str, line: str, rank: int = 0) -> str:
    """`text` with `line` just before rank `rank`'s driver `done` (where the driver prints its one-NCCL record)."""
    lines = text.split("\n")
    at = next(no for no, m in markers(text) if m.get("event") == "done" and m.get("rank") == rank)
    return "\n".join(lines[: at - 1] + [line] + lines[at - 1 :])


@pytest.fixture
def gpu_host(tmp_path, monkeypatch):
    """Patch what needs a GPU; returns the host, a dict whose `gpu_count` a test may change (and `nccl_version`:
    the stand-in NCCL build's version, default 2.30.4)."""
    host = {"gpu_count": 1, "gpus": [], "efa_devices": []}

    def built(component: str) -> SimpleNamespace:
        out = tmp_path / "builds" / component
        (out / "build" / "lib").mkdir(parents=True, exist_ok=True)
        return SimpleNamespace(
            component=component,
            key=f"{component}-key",
            out=out,
            reused=True,
            origin="build",
            info={"seconds": 0.0, "version": host.get("nccl_version", "2.30.4")},
            log=out / "build.log",
        )

    monkeypatch.setattr(
        kernelprep_hostinfo,
        "collect",
        lambda: {
            **{k: v for k, v in host.items() if k != "nccl_version"},
            "gpus": [{"name": "NVIDIA H200"}] * host["gpu_count"],
        },
    )
    monkeypatch.setattr(
        kernelprep.toolchain,
        "detect",
        lambda py, arch=None, **k: SimpleNamespace(key_fields=lambda: {"arch": "90"}, arch="90"),
    )
    monkeypatch.setattr(kernelprep.kbuild, "build_nccl", lambda *a, **k: built("nccl"))
    monkeypatch.setattr(kernelprep.kbuild, "build_deepep", lambda *a, **k: built("deepep"))
    return host


def options(tmp_path: Path, python: str, *, threshold: str | None = None, **kw) -> GateRun:
    """run_micro's options on a project holding the real micro.yaml (the h200-ep1 bar's threshold replaced by
    `threshold` when given) and the real drivers."""
    stack = make_stack(tmp_path / "srv")
    root = tmp_path / "project"
    lock = load(write_project(root, stack))
    (root / "gates" / "drivers").mkdir(parents=True, exist_ok=True)
    yaml = (REPO_ROOT / "gates" / "micro.yaml").read_text()
    if threshold is not None:
        start = yaml.index("        baseline:\n", yaml.index("  h200-ep1:"))
        end = yaml.index("  h200-nvl-ep2:")
        yaml = yaml[:start] + f"        threshold: {threshold}\n" + yaml[end:]
    (root / "gates" / "micro.yaml").write_text(yaml)
    for d in ("dense_a2a.py", "micro_trials.py"):
        (root / "gates" / "drivers" / d).write_text((REPO_ROOT / "gates/drivers" / d).read_text())
    return gaterun.options(
        "micro",
        root=root,
        lock=lock,
        tmp=tmp_path,
        python=python,
        **kw,
    )


def test_a_deliberate_variation_is_named_and_never_evidence(tmp_path, gpu_host):
    """`--num-sms K` reaches test_ep and the report: its reason and data.deliberate name it, and even a pass is not
    evidence (printed "not evidence", exit 3; never an accepted baseline run)."""
    from reprostack.report import exit_code

    py = stand_in_python(tmp_path, trials_log(real_ep1_texts(3)))
    rep = run_gate_here(options(tmp_path, py, profile="h200-ep1", trials=3, num_sms=8))
    assert rep.data["command"][-2:] == ["--num-sms", "8"] and rep.data["deliberate"]["num_sms"] == 8
    assert rep.reason.startswith("deliberate variation (--num-sms 8): ") and rep.evidence is False
    assert rep.result == "pass" and rep.label() == "PASS (h200-ep1, not evidence)" and exit_code([rep]) == 3
    assert rep.data["bars"][0]["baseline"]["reference"] > 14.4  # judged on the baseline bar all the same


def test_ep1_k3_with_dense_arm_passes_on_the_interval_of_real_logs(tmp_path, gpu_host):
    text = trials_log(real_ep1_texts(3), dense_fixture=FIX / "dense_ep1.log", dense_scales=[1.0, 1.1, 0.9])
    py = stand_in_python(tmp_path, text)
    rep = run_gate_here(options(tmp_path, py, profile="h200-ep1", arms=("deepep", "dense"), trials=3))
    assert rep.result == "pass", rep.reason
    assert [c.metric for c in rep.checks] == [
        "ranks_x_phases_missing",
        "nccl_runtime",
        "dc_p50_us",
        "dense_arm_complete",
    ]
    st = rep.data["statistics"]
    assert st["dc_p50_us"]["samples"] == REAL_EP1_DC and st["dc_p50_us"]["n"] == 3
    lo, hi = st["dc_p50_us"]["ci95"]
    assert lo < 14.338 and 14.725 < hi < 15.6  # the whole interval clears the baseline bar (median x 1.07)
    bar = rep.checks[2]
    assert bar.value == pytest.approx(sum(REAL_EP1_DC) / 3) and not bar.inconclusive
    assert "95% CI [" in bar.note and "the whole interval clears the bar" in bar.note
    dense = [round(152.797 * s, 6) for s in (1.0, 1.1, 0.9)]  # dense_ep1.log: dispatch 104.17 + combine 48.627
    assert st["dense_dc_p50_us"]["samples"] == pytest.approx(dense, abs=2e-3)
    ratio = st["deepep_over_dense_dc"]["samples"]
    assert ratio == pytest.approx([a / b for a, b in zip(REAL_EP1_DC, st["dense_dc_p50_us"]["samples"])])
    values = {m["metric"]: m for m in rep.data["metrics"]}
    assert values["dc_p50_us"]["value"] == pytest.approx(sum(REAL_EP1_DC) / 3, abs=1e-6)
    assert values["dc_p50_us"]["note"].startswith("mean of 3 trial(s): mean 14.4743 us, 95% CI [")
    assert values["dispatch_su_gbs_p50"]["value"] == 113  # first trial's figure
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 1  # one launch: both arms, every trial
    assert (
        "micro_trials.py --num-processes 1 --test-ep " in calls[0]
        and "tests/elastic/test_ep.py --trials 3 "
        "--arms deepep,dense --dense-warmup 20 --dense-iters 100 --dense-seed 0 --num-tokens 128"
        in calls[0]
    )
    assert {a.path for a in rep.artifacts} >= {"micro/test_ep.log"}
    write_reports([rep], tmp_path / "out", required={"micro"})
    validate_report(json.loads((tmp_path / "out" / "micro.json").read_text()))
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| dc_p50_us | 3 | 14.4743 | 14.36 |" in md and "| deepep_over_dense_dc |" in md
    assert '<property name="dc_p50_us.ci95" value="' in (tmp_path / "out" / "junit.xml").read_text()
    assert exit_code([rep], {"micro"}) == 0


@pytest.mark.parametrize("threshold, result, inconclusive", [("14.5", "inconclusive", True), ("13.5", "fail", False)])
def test_ep1_bar_inside_or_below_the_interval(tmp_path, gpu_host, threshold, result, inconclusive):
    py = stand_in_python(tmp_path, trials_log(real_ep1_texts(3)))
    rep = run_gate_here(options(tmp_path, py, profile="h200-ep1", trials=3, threshold=threshold))
    bar = next(c for c in rep.checks if c.metric == "dc_p50_us")
    assert rep.result == result and not bar.passed and bar.inconclusive is inconclusive
    assert rep.reason.startswith(f"dc_p50_us = 14.474333 us (needs <= {threshold}): mean 14.4743 us, 95% CI [")
    write_reports([rep], tmp_path / "out", required={"micro"})
    junit = (tmp_path / "out" / "junit.xml").read_text()
    assert f'type="{result}"' in junit
    assert exit_code([rep], {"micro"}) == 1


def test_one_trial_is_inconclusive_never_pass(tmp_path, gpu_host):
    py = stand_in_python(tmp_path, trials_log(real_ep1_texts(1)))
    rep = run_gate_here(options(tmp_path, py, profile="h200-ep1", trials=1))
    assert rep.result == "inconclusive"
    assert "one trial: 14.36 us (no interval): one trial gives no interval (run --trials >= 2)" in rep.reason
    assert rep.data["statistics"] == {}  # n = 1: a single-sample report (contract item 1)
    write_reports([rep], tmp_path / "out", required={"micro"})
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["exit_code"] == 1


def test_nvl_ep2_is_detected_runs_every_arm_and_never_passes(tmp_path, gpu_host):
    gpu_host["gpu_count"] = 2
    text = trials_log([ep2_log(), ep2_log(0.5)], num_ranks=2, dense_fixture=FIX / "dense_ep2.log")
    py = stand_in_python(tmp_path, text)
    stream = io.StringIO()
    ui.configure(stream=stream)
    rep = run_gate_here(options(tmp_path, py, arms=("deepep", "dense"), legacy=True, trials=2))  # profile detected
    assert rep.profile == "h200-nvl-ep2"
    step = "test_ep [h200-nvl-ep2] x2 trial(s)"  # one plain line per trial, from rank 0's DeepEP markers only
    assert [x for x in stream.getvalue().splitlines() if x.startswith(f"  {step}")] == [
        f"  {step}: trial 1/2",
        f"  {step}: trial 2/2",
    ]
    assert f"{step}: started, first run, no estimate; full log " in stream.getvalue()
    assert rep.result == "fail" and rep.reason == "profile h200-nvl-ep2 has no measured bar yet; numbers reported"
    assert all(c.passed for c in rep.checks[:-1]) and rep.checks[-1].metric == "bars_status"
    assert [c.metric for c in rep.checks] == [
        "ranks_x_phases_missing",
        "nccl_runtime",
        "dense_arm_complete",
        "legacy_complete",
        "bars_status",
    ]
    assert rep.data["statistics"]["dispatch_p50_us"]["samples"] == [20.5, 21.0]
    values = {m["metric"]: m["value"] for m in rep.data["metrics"]}
    assert values["dispatch_p50_us"] == 20.75 and values["combine_su_gbs_p50"] == 230.5
    assert values["combine_su_nvlink_ratio"] == pytest.approx(230.5 / 450, abs=1e-6)
    assert values["legacy_dc_us"] == rep.data["legacy"]["parse"]["dc_us"] and values["dense_dc_p50_us"] > 0
    calls = (tmp_path / "calls").read_text().splitlines()
    assert "-m torch.distributed.run --nnodes=1 --nproc-per-node=1 --node-rank=0 --master-addr=127.0.0.1" in calls[0]
    assert "micro_trials.py --num-processes 2 --test-ep" in calls[0] and "--trials 2 --arms deepep,dense" in calls[0]
    assert "test_intranode.py --num-processes 2 --num-tokens 128" in calls[1]
    write_reports([rep], tmp_path / "out", required={"micro"})
    assert exit_code([rep], {"micro"}) == 1


def test_crash_in_the_second_trial_is_an_error_with_the_first_trial_kept(tmp_path, gpu_host):
    crash = (REPO_ROOT / "tests/fixtures/test_ep/real/h200-ep1-sigsegv-in-dispatch.log").read_text()
    text = trials_log([real_ep1_texts(1)[0], crash], dense_fixture=FIX / "dense_ep1.log", done=False)
    py = stand_in_python(tmp_path, text)
    rep = run_gate_here(options(tmp_path, py, profile="h200-ep1", arms=("deepep", "dense"), trials=2))
    assert rep.result == "error" and rep.reason.startswith("sigsegv")
    per = rep.data["trials"]["per_trial"]
    assert per[0]["deepep"]["complete"] and per[0]["deepep"]["dc_p50_us"] == 14.36 and not per[1]["deepep"]["complete"]
    assert "trial markers: rank 0 said done 0 time(s), expected once" in rep.data["trials"]["problems"]
    assert "dc_p50_us" not in rep.data["statistics"]  # not every DeepEP trial has a figure


def test_host_no_profile_fits_is_a_skip_naming_why(tmp_path, gpu_host):
    gpu_host["gpu_count"] = 3  # micro has EP1/2/4/8 profiles and the EFA EP16 one: none for 3 GPUs without EFA
    py = stand_in_python(tmp_path, trials_log(real_ep1_texts(1)))
    rep = run_gate_here(options(tmp_path, py))
    assert (rep.gate, rep.profile, rep.result, rep.checks) == ("micro", "-", "skip", [])
    assert "micro.yaml: no profile for this host (3 GPU(s), EFA: False); pass --profile (known: " in rep.reason
    assert not (tmp_path / "calls").exists()  # nothing was launched
    write_reports([rep], tmp_path / "out", required={"micro"})
    assert exit_code([rep], {"micro"}) == 3


@pytest.mark.parametrize(
    "case, why",
    [
        ("two", "rank 0: expected exactly one NCCL, the pinned build in"),
        ("foreign", "rank 0: expected exactly one NCCL, the pinned build in"),
        ("none", "no rank on this host"),
        ("other-host", "no rank on this host"),
        ("error", "rank 0: reading its NCCL failed: OSError: boom"),
        ("shape", "one-NCCL record without a list of mapped libraries"),
    ],
)
def test_the_one_nccl_check_is_judged_on_the_measuring_ranks_records(tmp_path, gpu_host, case, why):
    """No separate check process (issue 17): the ranks that measured say what they mapped; anything but exactly the
    pinned NCCL on every rank of this host is an ERROR naming the rank, even with every figure in the log."""
    text = trials_log(real_ep1_texts(3))
    kw: dict = {}
    if case == "two":
        kw["mapped"] = [str(tmp_path / "builds/nccl/build/lib/libnccl.so.2"), "/opt/torch/nvidia/nccl/lib/libnccl.so.2"]
    elif case == "foreign":
        kw["mapped"] = ["/opt/torch/nvidia/nccl/lib/libnccl.so.2"]
    elif case == "none":
        kw["nccl_runtime"] = None
    elif case == "other-host":
        kw["nccl_runtime"] = None
        text += (
            marker(
                event="nccl",
                rank=0,
                host=socket.gethostname() + "-other",
                runtime="2.30.4",
                mapped=[str(tmp_path / "builds/nccl/build/lib/libnccl.so.2")],
                deleted=[],
            )
            + "\n"
        )
    elif case == "error":
        kw["nccl_runtime"] = None
        text = before_done(text, marker(event="nccl", rank=0, host=socket.gethostname(), error="OSError: boom"))
    elif case == "shape":
        kw["nccl_runtime"] = None
        text = before_done(text, marker(event="nccl", rank=0, host=socket.gethostname(), mapped="libnccl.so.2"))
    rep = run_gate_here(options(tmp_path, stand_in_python(tmp_path, text, **kw), profile="h200-ep1", trials=3))
    assert rep.result == "error" and rep.reason.startswith("one-NCCL check: ") and why in rep.reason, rep.reason
    assert "\n" not in rep.reason
    assert {a.path for a in rep.artifacts} >= {"micro/test_ep.log"}  # the figures' log is kept as evidence


def test_the_ranks_nccl_version_must_be_the_pinned_one(tmp_path, gpu_host):
    rep = run_gate_here(
        options(
            tmp_path,
            stand_in_python(tmp_path, trials_log(real_ep1_texts(3)), nccl_runtime="2.28.9"),
            profile="h200-ep1",
            trials=3,
        )
    )
    assert rep.result == "fail" and "nccl_runtime" in rep.reason
    assert rep.data["nccl_check"].startswith("in the measuring process of rank(s) [0]")


def jit_project(tmp_path, monkeypatch):
    """A gate run whose built deep_ep persists its NCCL root (as DeepEP's setup.py writes envs.py), CUDA_HOME with
    the fake nvcc of test_jit, none of the variables that change DeepEP's JIT flags; returns (options, the
    project's kernels/jit/h200-ep1.json path, a manifest for this run's deepep tree without its kernels)."""
    from test_jit import FAKE_NVCC

    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text(FAKE_NVCC)
    (cuda / "bin" / "nvcc").chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(cuda))
    for v in jit.FLAG_VARS:
        monkeypatch.delenv(v, raising=False)
    site = tmp_path / "builds" / "deepep" / "site" / "deep_ep"
    site.mkdir(parents=True)
    (site / "envs.py").write_text(f"persistent_envs = dict()\npersistent_envs['EP_NCCL_ROOT_DIR'] = '{tmp_path}'\n")
    opts = options(tmp_path, stand_in_python(tmp_path, trials_log(real_ep1_texts(3))), profile="h200-ep1", trials=3)
    pin = opts.lock.get("deepep")
    man = opts.root / "kernels" / "jit" / "h200-ep1.json"
    man.parent.mkdir(parents=True, exist_ok=True)  # write_project copies the real kernels/ (with kernels/jit)
    doc = {"schema": jit.SCHEMA, "deepep_tree": pin.patched_tree or pin.tree, "arch": "90a", "profile": "h200-ep1"}
    return opts, man, doc


def test_jit_kernels_of_the_profiles_manifest_are_compiled_before_the_test(tmp_path, gpu_host, monkeypatch):
    """kernels/jit/<profile>.json: its kernels are compiled (in parallel, by the nvcc DeepEP will run) into DeepEP's
    JIT cache before test_ep starts; the report says how many and how long; the run writes its own manifest. A
    bad manifest stops the gate in one line before anything is built."""
    from test_jit import code

    opts, man, doc = jit_project(tmp_path, monkeypatch)
    tree = doc["deepep_tree"]
    dispatch = code("dispatch", ", ".join(["1"] * 15))  # dispatch_impl has 15 template arguments (kernels.jit.KERNELS)
    kernels = [{"name": "barrier", "code": code()}, {"name": "dispatch", "code": dispatch}]
    doc["kernels"] = kernels
    man.write_text(json.dumps(doc))
    stream = io.StringIO()
    ui.configure(stream=stream)
    rep = run_gate_here(opts)
    assert rep.result == "pass", rep.reason
    block = rep.data["jit"]
    assert block["manifest"] == str(man) and block["prewarm"]["compiled"] == 2 and block["before_test"] == 2
    assert block["compiled_in_test"] == 0 and rep.data["timings_s"]["jit_prewarm_s"] >= 0
    cache = tmp_path / "builds" / "deepep" / "jit" / "cache"
    assert len(list(cache.glob("kernel.barrier.*/kernel.cubin"))) == 1
    assert "JIT prewarm 2 DeepEP kernel(s)" in stream.getvalue()
    # the run's own manifest: the kernels in the cache whose folders it reproduces, ready to commit
    mine = json.loads((tmp_path / "out" / "micro" / "jit-kernels.json").read_text())
    assert mine["kernels"] == sorted(kernels, key=lambda k: (k["name"], k["code"])) and mine["deepep_tree"] == tree
    assert block["recorded"]["kept"] == 2 and "micro/jit-kernels.json" in {a.path for a in rep.artifacts}
    # another tree's manifest: nothing compiled, the report says why
    man.write_text(json.dumps({**doc, "deepep_tree": "c" * 40}))
    rep = run_gate_here(opts)
    assert rep.data["jit"]["prewarm"].startswith("none: the manifest was recorded for deepep tree cccccccccccc sm_90a")
    # a hostile manifest: one line, before any build
    man.write_text(json.dumps({**doc, "kernels": [{"name": "x", "code": "#include </etc/shadow>\n"}]}))
    monkeypatch.setattr(kernelprep.kbuild, "build_deepep", lambda *a, **k: pytest.fail("built despite a bad manifest"))
    with pytest.raises(jit.ManifestError, match=r"h200-ep1.json: kernels/0/code: not the shape of a DeepEP JIT kernel"):
        run_gate_here(opts)


def test_a_hostile_jit_cache_does_not_stop_the_gate(tmp_path, gpu_host, monkeypatch):
    """A `cache` folder in DeepEP's JIT cache that is a symlink (the cache is on a shared disk): the prewarm writes
    nothing through it, says so in `failed`, and the gate runs its test as it would without a manifest."""
    from test_jit import code

    opts, man, doc = jit_project(tmp_path, monkeypatch)
    man.write_text(json.dumps({**doc, "kernels": [{"name": "barrier", "code": code()}]}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "builds" / "deepep" / "jit").mkdir(parents=True)
    (tmp_path / "builds" / "deepep" / "jit" / "cache").symlink_to(elsewhere)
    rep = run_gate_here(opts)
    assert rep.result == "pass", rep.reason
    block = rep.data["jit"]
    assert block["prewarm"]["compiled"] == 0 and "is a symlink or not a folder" in block["prewarm"]["failed"][0]
    assert list(elsewhere.iterdir()) == [] and block["before_test"] == 0 and block["recorded"]["folders"] == 0


def test_a_run_on_other_hardware_than_its_profile_is_never_its_evidence(tmp_path, gpu_host, monkeypatch):
    """Issue 39: `--profile h200-ep1` forced on an H100 was reported `micro | h200-ep1 | PASS`, evidence true (the GPU
    model was checked only when the gate picked the profile itself). Now the run is judged and reported, but is not
    evidence for h200-ep1 (exit 3), its reason and provenance say why; nor can it be a baseline run of it."""
    from reprostack.report import exit_code

    monkeypatch.setattr(
        kernelprep_hostinfo,
        "collect",
        lambda: {"gpu_count": 1, "gpus": [{"name": "NVIDIA H100 80GB HBM3"}], "efa_devices": []},
    )
    py = stand_in_python(tmp_path, trials_log(real_ep1_texts(3)))
    rep = run_gate_here(options(tmp_path, py, profile="h200-ep1", trials=3))
    assert rep.result == "pass" and rep.evidence is False and exit_code([rep]) == 3
    assert rep.label() == "PASS (h200-ep1, not evidence)"
    why = "this host's GPUs are NVIDIA H100 80GB HBM3, the profile's H200"
    assert rep.provenance["hardware_mismatch"] == why
    assert rep.reason.startswith(f"not evidence for profile h200-ep1 ({why}): ")
