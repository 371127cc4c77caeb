"""Serving gates end to end on the CPU: the real pinned AIPerf (0.10.0, its own venv built from the locked wheel)
against reprostack.gates.testserver on loopback: PASS on a healthy server, FAIL naming the error counts with
injected HTTP 500s, ERROR with a dead server; spec validation; all-gates ordering (not-run, never pass).

The AIPerf venv is the gates' own: built once under <cache>/tools of $REPROSTACK_TEST_TOOLS, else of the reprostack
cache ($REPROSTACK_CACHE or the user cache dir, where `reprostack gate vllm` finds it too; ~2 min, ~1 GB)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from reprostack import cli, paths
from reprostack.cmd import gate as cmd_gate
from reprostack.errors import GateError
from reprostack.evidence.judge.serving import checks_of
from reprostack.gates import runner
from reprostack.gates.aiperftool import ensure_aiperf
import gaterun
from reprostack import sources
from reprostack.fetch import Cache
from reprostack.gates.spec import GateSpecError
from reprostack.gates.servingspec import load_serving_spec
from reprostack.lock import load
from reprostack.report import GateReport, exit_code, validate_report, write_reports

REPO = Path(__file__).resolve().parents[1]
TOOLS = Path(os.environ.get("REPROSTACK_TEST_TOOLS") or paths.cache_dir())


@pytest.fixture(scope="session")
def lock():
    return load(REPO / "upstreams.lock")


@pytest.fixture(scope="session")
def aiperf(lock):
    return ensure_aiperf(lock, TOOLS, REPO)


def small_root(tmp_path: Path, gate: str, cells: str = "    - {name: c4, concurrency: 4, requests: 40}\n") -> Path:
    """A project root whose gates/<gate>.yaml sweeps only the given cells, 32 output tokens a request instead of
    128 (keeps the FAIL/ERROR tests short; test_pass_on_a_healthy_server runs the real spec)."""
    text = (REPO / "gates" / f"{gate}.yaml").read_text()
    assert text.count("\n  osl: 128\n") == 1
    text = text.replace("\n  osl: 128\n", "\n  osl: 32\n")
    start = text.index("  cells:\n") + len("  cells:\n")
    end = text.index("backend-assertion:")
    text = text[:start] + cells + text[end:]
    for key in ("c8", "c32"):
        text = text.replace(f", {key}: ", ", x_" + key + ": ") if f"{key}:" not in cells else text
    text = text.replace("published: {c4: 200, x_c8: 400, x_c32: 1600}", "published: {c4: 200}")
    text = text.replace("requests: {c4: 8, x_c8: 16, x_c32: 32}", "requests: {c4: 8}")
    text = text.replace("published: {c4: 19.5, x_c8: 38.8, x_c32: 144.6}", "published: {c4: 19.5}")
    text = text.replace("published: {c4: 34.5, x_c8: 67.2, x_c32: 255.2}", "published: {c4: 34.5}")
    text = text.replace("published: {c4: 66.5, x_c8: 147.5, x_c32: 586.7}", "published: {c4: 66.5}")
    root = tmp_path / "root"
    (root / "gates").mkdir(parents=True)
    (root / "gates" / f"{gate}.yaml").write_text(text)
    shutil.copy(REPO / "gates" / "aiperf-constraints.txt", root / "gates")
    shutil.copy(REPO / "upstreams.lock", root)
    return root


def serve(gate, root, lock, out, **kw) -> GateReport:
    fetch = sources.FetchOptions(cache=Cache(TOOLS))
    return gaterun.run(
        gaterun.options(gate, root=root, lock=lock, fetch=fetch, out_dir=out, profile="local-test", **kw)
    )


# --------------------------------------------------------------------------- specs


@pytest.mark.parametrize("gate", ["vllm", "sglang", "trtllm"])
def test_real_specs(gate):
    s = load_serving_spec(REPO, gate)
    assert s.model == "Qwen/Qwen3-30B-A3B-FP8" and s.requires == ("micro",)
    assert [(c.name, c.concurrency, c.requests) for c in s.cells] == [("c4", 4, 40), ("c8", 8, 64), ("c32", 32, 128)]
    assert (s.aiperf["isl"], s.aiperf["osl"], s.aiperf["streaming"], s.aiperf["extra-inputs"]) == (
        120,
        128,
        True,
        ["ignore_eos:true"],
    )
    assert s.elastic_buffer["num-cpu-timeout-secs"] >= 600 and s.elastic_buffer["num-gpu-timeout-secs"] >= 600
    ep16 = s.profile("p5en-efa-ep16")
    assert (ep16.nodes, ep16.gpus_per_node, ep16.ep_size, ep16.needs_efa) == (2, 8, 16, True)
    published = {"vllm": (19.5, 38.8, 144.6), "sglang": (34.5, 67.2, 255.2), "trtllm": (66.5, 147.5, 586.7)}[gate]
    assert tuple(ep16.bars.published[c] for c in ("c4", "c8", "c32")) == published
    assert {a.role for a in s.arms.values()} == {"deepep", "alternative"}
    names = [r.name for r in s.required]
    assert names[:2] == ["ElasticBuffer construction", "Selected provider is efa"]
    assert ("AlltoallMethodType.DeepEP" in names) == (gate == "trtllm")
    env = s.server["env"]
    assert env["EP_BUFFER_DEBUG"] == "1" and env["NCCL_GIN_TYPE"] == "2" and env["FI_PROVIDER"] == "efa"
    if gate == "vllm":
        assert "${all2all_backend}" in s.server["leader"] and s.arms["deepep"].vars["all2all_backend"] == "deepep_v2"
        assert env["VLLM_USE_FLASHINFER_MOE_FP8"] == "0" and "--headless" in s.server["worker"]
    if gate == "sglang":
        assert env["SGLANG_DEEPEP_USE_V2"] == "1" and env["SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"] == "1024"
    if gate == "trtllm":
        assert (
            "worker" not in s.server
            and "enable_attention_dp: true" in (REPO / "gates" / "trtllm" / "extra_llm_api_options.yaml").read_text()
        )


@pytest.mark.parametrize(
    "old, new, match",
    [
        (
            "      tolerance: 0.15\n",
            "      tolerance: 1.5\n",
            r"vllm.yaml:\d+: profiles.p5en-efa-ep16.bars.tolerance: 1.5",
        ),
        (
            "  num-cpu-timeout-secs: 600",
            "  num-cpu-timeout-secs: 300",
            r"vllm.yaml:\d+: elastic-buffer.num-cpu-timeout-secs",
        ),
        (
            '--all2all-backend, "${all2all_backend}",\n           --data-parallel-address, "${leader_addr}", --data-parallel-rpc-port, "${rpc_port}"]\n  worker',
            '--all2all-backend, "${all2all_backend_typo}",\n           --data-parallel-address, "${leader_addr}", --data-parallel-rpc-port, "${rpc_port}"]\n  worker',
            r"vllm.yaml:\d+: server.leader.\d+: unknown template variable \$\{all2all_backend_typo\}",
        ),
        (
            "published: {c4: 19.5,",
            "published: {c5: 19.5, c4: 19.5,",
            r"vllm.yaml:\d+: profiles.p5en-efa-ep16.bars.published.c5: no such cell",
        ),
        (
            "pattern: 'NET/OFI Selected provider is efa\\b'",
            "pattern: 'NET/OFI (Selected'",
            r"vllm.yaml:\d+: backend-assertion.required\[1\].pattern: not a regex",
        ),
        ("    role: alternative\n", "    role: deepep\n", r"vllm.yaml:\d+: arms: exactly one arm"),
    ],
)
def test_bad_specs_name_file_and_line(tmp_path, old, new, match):
    text = (REPO / "gates" / "vllm.yaml").read_text()
    assert text.count(old) == 1, old
    (tmp_path / "gates").mkdir()
    (tmp_path / "gates" / "vllm.yaml").write_text(text.replace(old, new))
    with pytest.raises(GateSpecError, match=match):
        load_serving_spec(tmp_path, "vllm")


# --------------------------------------------------------------------------- the gate flow through AIPerf


def test_pass_on_a_healthy_server(aiperf, lock, tmp_path):
    out = tmp_path / "out"
    rep = serve("vllm", REPO, lock, out, arms=["deepep"])
    assert rep.result == "pass", rep.reason
    metrics = {c.metric: c for c in rep.checks}
    for cell, n in (("c4", 8), ("c8", 16), ("c32", 32)):
        assert metrics[f"deepep.{cell}.errors"].value == 0
        assert metrics[f"deepep.{cell}.completed_requests"].value == n
        assert metrics[f"deepep.{cell}.agg_tok_s"].passed
    assert metrics["deepep.backend.ElasticBuffer construction"].value == 2
    cells = rep.data["arms"]["deepep"]["cells"]
    assert [c["status"] for c in cells] == ["ok"] * 3 and cells[0]["layout"] == "1.3"
    assert rep.provenance["aiperf"] == {"version": "0.10.0", "wheel_sha256": lock.get("aiperf").files[0].sha256}
    written = write_reports([rep], out)
    validate_report(json.loads(written["vllm.json"].read_text()))
    assert any(a.path == "vllm/server.deepep.log" for a in rep.artifacts)
    # the local-test profile's pass is never evidence: labelled everywhere, and not a pass for the exit code
    assert rep.evidence is False and rep.label() == "PASS (local-test, not evidence)"
    assert rep.provenance["engine"]["name"] == "reprostack.gates.testserver"
    assert exit_code([rep]) == 3
    summary = json.loads(written["summary.json"].read_text())
    assert summary["exit_code"] == 3 and summary["gates"][0]["label"] == "PASS (local-test, not evidence)"
    assert "| PASS (local-test, not evidence) |" in written["summary.md"].read_text()
    assert 'skipped="1"' in written["junit.xml"].read_text()


def test_fresh_artifact_dir_per_cell(aiperf, lock, tmp_path):
    root = small_root(tmp_path, "sglang")
    out = tmp_path / "out"
    stale = out / "sglang" / "deepep" / "c4" / "aiperf"
    stale.mkdir(parents=True)
    shutil.copy(REPO / "tests/fixtures/published-2026-07/sglang/c4/profile_export_aiperf.json", stale)
    rep = serve("sglang", root, lock, out, arms=["deepep", "dense"])
    assert rep.result == "pass", rep.reason
    (cell,) = rep.data["arms"]["deepep"]["cells"]
    assert cell["requests_expected"] == 8 and cell["completed"] == 8  # not the published export's 40
    assert set(rep.data["ratios_deepep_over_alternative"]["dense"]) == {"c4"}
    assert 0.3 < rep.data["ratios_deepep_over_alternative"]["dense"]["c4"] < 3
    assert rep.data["ratio_intervals_deepep_over_alternative"] == {"dense": {}}  # one profile run: no interval
    assert not any(c.metric.startswith("dense.") and c.metric.endswith("agg_tok_s") for c in rep.checks)


def test_comparison_arm_alone_never_passes(aiperf, lock, tmp_path):
    root = small_root(tmp_path, "vllm")
    rep = serve("vllm", root, lock, tmp_path / "out", arms=["allgather"])
    assert rep.result == "skip", rep.reason  # was PASS: the allgather arm's own checks all passed
    assert rep.checks and all(c.passed and c.metric.startswith("allgather.") for c in rep.checks)
    assert rep.reason.startswith(
        "arm deepep (the gate's evidence) did not run: only allgather ran, comparison evidence only"
    )
    assert exit_code([rep], {"vllm"}) == 3
    validate_report(json.loads(write_reports([rep], tmp_path / "out")["vllm.json"].read_text()))


def test_fail_names_the_error_counts(aiperf, lock, tmp_path, monkeypatch):
    root = small_root(tmp_path, "vllm")
    monkeypatch.chdir(tmp_path)  # a relative --out (as nox passes it) must work: AIPerf runs in the cell folder
    rep = serve("vllm", root, lock, Path("out"), arms=["deepep"], server_args=["--fail-every=3"])
    assert rep.result == "fail", rep.reason
    assert "deepep.c4.errors = 2 requests (needs == 0)" in rep.reason
    assert "deepep.c4.completed_requests = 6 requests (needs == 8)" in rep.reason
    assert "Internal Server Error: 2" in rep.reason  # the error type from profile_export.jsonl


def test_error_with_a_dead_server(aiperf, lock, tmp_path):
    root = small_root(tmp_path, "trtllm")
    rep = serve("trtllm", root, lock, tmp_path / "out", arms=["deepep"], server_args=["--die-after=3"])
    assert rep.result == "error", rep.reason
    # which the gate sees first is a race (seen under -n 2 on the loaded CI machine): AIPerf's failed cell, or the
    # server's exit during the sweep; either way the error names the arm and the dead server's exit code
    assert rep.reason.startswith("arm deepep: ") and "server exited 70" in rep.reason, rep.reason
    assert "cell c4: aiperf exited 1" in rep.reason or "server exited 70 during the sweep" in rep.reason
    assert rep.data["arms"]["deepep"]["server_exit_before_stop"] == 70


def test_error_when_the_server_never_gets_ready(lock, tmp_path, aiperf):
    root = small_root(tmp_path, "vllm")
    text = (
        (root / "gates" / "vllm.yaml")
        .read_text()
        .replace(
            "probe: {path: /v1/models, timeout-s: 1800, interval-s: 5}",
            "probe: {path: /v1/models, timeout-s: 3, interval-s: 0.2}",
        )
    )
    (root / "gates" / "vllm.yaml").write_text(text)
    rep = serve("vllm", root, lock, tmp_path / "out", arms=["deepep"], server_args=["--ready-after-s=60"])
    assert rep.result == "error" and "server not ready at http://127.0.0.1:" in rep.reason and "HTTP 503" in rep.reason
    rep = serve("vllm", root, lock, tmp_path / "out2", arms=["deepep"], server_args=["--no-such-flag"])
    assert rep.result == "error" and "server process exited" in rep.reason


def test_skip_without_gpu_is_not_a_pass(lock, tmp_path, monkeypatch):
    monkeypatch.setattr("reprostack.hostinfo.collect", lambda **kw: {"gpu_count": 0, "efa_devices": []})
    opts = gaterun.options(
        "vllm", root=REPO, lock=lock, fetch=sources.FetchOptions(cache=Cache(TOOLS)), out_dir=tmp_path
    )
    rep = gaterun.run(opts)
    assert rep.result == "skip" and "--profile local-test" in rep.reason
    assert exit_code([rep]) == 3
    rep = gaterun.run(opts.with_(profile="p5en-efa-ep16"))
    assert rep.result == "skip" and "needs 8 GPU(s)" in rep.reason
    with pytest.raises(GateError, match="no profile 'nope'"):
        gaterun.run(opts.with_(profile="nope"))


def test_probe_pauses_start_short_and_double_up_to_the_interval(monkeypatch):
    """A server that answers 503 three times, then 200: seen at the 4th probe after pauses of 0.1, 0.2, 0.4 s
    (not 3 x the 5 s interval); the pauses never exceed the interval."""
    import http.server
    import threading

    from reprostack.gates import probe

    hits = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            hits.append(self.path)
            body = b'{"data": [{"id": "m"}]}'
            self.send_response(503 if len(hits) <= 3 else 200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    clock, pauses = [0.0], []

    def sleep(s):  # a clock of our own: the pauses are recorded, not slept
        pauses.append(s)
        clock[0] += s

    monkeypatch.setattr(probe.time, "sleep", sleep)
    monkeypatch.setattr(probe.time, "monotonic", lambda: clock[0])
    url = f"http://127.0.0.1:{srv.server_port}"
    try:
        r = probe.wait_ready(url, "/v1/models", timeout_s=600, interval_s=5)
        assert r.ready and r.attempts == 4 and r.models == ("m",)
        assert pauses == [0.1, 0.2, 0.4]
        hits.clear()
        pauses.clear()
        r = probe.wait_ready(url, "/health", timeout_s=1.0, interval_s=0.25)  # 503 for its first 3, then 200
    finally:
        srv.shutdown()
    assert pauses == [0.1, 0.2, 0.25] and r.ready  # doubling capped by the interval


# --------------------------------------------------------------------------- all-gates ordering


def test_all_gates_reports_later_gates_not_run_when_micro_fails(tmp_path, monkeypatch, lock):
    ran = []

    def fake_run(g, opts, ctx):
        ran.append(g.name)
        if g.name == "fabric":  # gate 0 on one H200: its numbers, no bar (micro needs it only on EFA profiles)
            return GateReport(g.stem, "h200-ep1", "fail", "profile h200-ep1 has no measured bar yet", checks=[])
        return GateReport(g.stem, "h200-ep1", "fail", "dc_p50_us = 99 us (needs <= 30)", checks=[])

    monkeypatch.setattr(runner, "run_gate", fake_run)
    monkeypatch.setattr(cmd_gate, "load_lock", lambda args: (lock, REPO))
    monkeypatch.setattr(cmd_gate, "fetch_options", lambda args: None)
    rc = cli.main(["all-gates", "--out", str(tmp_path)])
    assert rc == 1 and ran == ["fabric", "micro"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(g["gate"], g["result"]) for g in summary["gates"]] == [
        ("fabric", "fail"),
        ("micro", "fail"),
        ("vllm", "not-run"),
        ("sglang", "not-run"),
        ("trtllm", "not-run"),
        ("megatron", "not-run"),
        ("nemo_rl", "not-run"),
    ]
    assert summary["gates"][2]["reason"] == "not run: required gate micro did not pass (FAIL)"  # its reason: once
    assert "<skipped" in (tmp_path / "junit.xml").read_text()


def test_not_run_alone_is_never_a_pass(tmp_path):
    from reprostack.report import evaluate, not_run

    micro = GateReport("micro", "-", "pass", "1 check(s) passed", checks=[evaluate("dc_p50_us", "us", 14.3, "<=", 30)])
    blocked = not_run("vllm", GateReport("micro", "-", "skip", "no GPU"))
    assert blocked.result == "not-run" and exit_code([micro, blocked]) == 3
    write_reports([micro, blocked], tmp_path)  # schema-valid


def test_trials_are_aiperf_profile_runs_judged_on_their_interval(aiperf, lock, tmp_path):
    """--trials 2: the pinned AIPerf's --num-profile-runs 2 per cell; each run's export read, the tok/s bar judged
    on the runs' interval (evidence.bars.stats), errors / completed over every run."""
    from reprostack.evidence.bars.stats import interval_verdict, summarize
    import io

    from reprostack import ui
    from reprostack.gates.aiperfrun import profile_run_started

    root = small_root(tmp_path, "sglang")
    out = tmp_path / "out"
    stream = io.StringIO()
    ui.configure(stream=stream)
    rep = serve("sglang", root, lock, out, arms=["deepep"], trials=2)
    (cell,) = rep.data["arms"]["deepep"]["cells"]
    assert cell["status"] == "ok" and len(cell["samples"]) == 2 and len(cell["runs"]) == 2
    step = "sglang deepep c4: aiperf [local-test] x2 runs"  # `run k/K` from AIPerf's own line per profile run
    assert [x for x in stream.getvalue().splitlines() if x.startswith(f"  {step}")] == [
        f"  {step}: run 1/2",
        f"  {step}: run 2/2",
    ]
    log = (out / "sglang" / "deepep" / "c4" / "aiperf.out.log").read_text().splitlines()
    assert [x.split(" INFO ")[1].split("(")[0].strip() for x in log if profile_run_started(x)] == [
        "[v0 t0] Executing run_0001...",
        "[v0 t1] Executing run_0002...",
    ]
    assert all(r["completed"] == 8 and r["errors"] == 0 for r in cell["runs"])
    assert cell["completed"] == 8 and cell["errors"] == 0
    st = rep.data["statistics"]["deepep.c4.agg_tok_s"]
    assert st["n"] == 2 and st["samples"] == cell["samples"] and st["unit"] == "tokens/sec"
    bar = next(c for c in rep.checks if c.metric == "deepep.c4.agg_tok_s")
    want = interval_verdict(summarize(cell["samples"]), ">=", bar.threshold)
    assert (bar.passed, bar.inconclusive) == (want == "pass", want == "inconclusive")
    assert rep.result == {"pass": "pass", "inconclusive": "inconclusive", "fail": "fail"}[want]
    assert "95% CI [" in bar.note
    runs = {a.path for a in rep.artifacts if "profile_runs" in a.path}
    assert {
        "sglang/deepep/c4/aiperf/profile_runs/run_0001/profile_export_aiperf.json",
        "sglang/deepep/c4/aiperf/profile_runs/run_0002/profile_export_aiperf.json",
    } <= runs
    validate_report(json.loads(write_reports([rep], out)["sglang.json"].read_text()))


def test_profile_run_exports_read_and_a_missing_one_is_an_error(tmp_path):
    """aiperfrun's reading of `--num-profile-runs K` output, on real AIPerf 0.10.0 exports (the published
    campaign's sglang c4 cell) copied as run 1 and 2; without run 2 the cell is an error naming it."""
    from reprostack.gates.aiperfrun import CellResult, _read_runs
    from reprostack.gates.servingspec import Cell

    src = REPO / "tests/fixtures/published-2026-07/sglang/c4"
    art = tmp_path / "aiperf"
    for i in (1, 2):
        d = art / "profile_runs" / f"run_{i:04d}"
        d.mkdir(parents=True)
        for f in src.iterdir():
            shutil.copy(f, d)
    cell = Cell("c4", 4, 40)
    res = _read_runs(CellResult("deepep", cell, "error", tmp_path, tmp_path / "log"), art, 2)
    assert res.status == "ok" and len(res.samples) == 2 and res.samples[0] == res.samples[1] == res.agg_tok_s
    assert res.errors == 0 and res.completed == 40 and len(res.runs) == 2
    shutil.rmtree(art / "profile_runs" / "run_0002")
    res = _read_runs(CellResult("deepep", cell, "error", tmp_path, tmp_path / "log"), art, 2)
    assert res.status == "error" and res.detail.startswith("profile run 2 of 2 (")
    assert res.detail.endswith("run_0002): no profile_export_aiperf.json")


def test_one_run_on_a_gpu_profile_is_inconclusive_never_pass():
    """On a GPU profile the tok/s bar is judged on the runs' interval only: one AIPerf run (`--trials 1`) gives no
    interval, so the bar is INCONCLUSIVE however far above it the figure is; the default there is 3 runs."""
    from types import SimpleNamespace

    from reprostack.gates import serving

    spec = load_serving_spec(REPO, "vllm")
    profile = next(p for p in spec.profiles.values() if p.needs_gpu and p.bars.threshold("c4") is not None)
    deepep = next(a for a in spec.arms.values() if a.role == "deepep")
    cell = next(c for c in spec.cells if c.name == "c4")
    high = profile.bars.threshold("c4") * 10

    def run(samples):
        c = SimpleNamespace(
            cell=cell,
            errors=0,
            completed=cell.requests,
            error_types={},
            samples=samples,
            agg_tok_s=samples[0] if samples else None,
        )
        return SimpleNamespace(
            arm=SimpleNamespace(name=deepep.name, assert_backend=False), backend=None, cells=[c], transport_check=None
        )

    bar = next(c for c in checks_of(spec, profile, [run([high])]) if c.metric.endswith("c4.agg_tok_s"))
    assert bar.inconclusive and not bar.passed and "one trial gives no interval" in bar.note
    bar = next(
        c
        for c in checks_of(spec, profile, [run([high, high * 1.01, high * 0.99])])
        if c.metric.endswith("c4.agg_tok_s")
    )
    assert bar.passed and not bar.inconclusive
    bar = next(c for c in checks_of(spec, profile, [run([])]) if c.metric.endswith("c4.agg_tok_s"))
    assert not bar.passed and bar.value is None  # no figure at all: a failed bar, never a pass
    assert serving.DEFAULT_TRIALS == 3
