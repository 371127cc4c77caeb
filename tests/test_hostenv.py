"""Host mode fingerprint and wheelset drift (reprostack.hostenv), on real interpreters and the real lock."""

import sys
import venv
from pathlib import Path

from reprostack.gates.base import RunContext
from reprostack.gates.options import GateOptions
from reprostack import hostenv
from reprostack.lock import load

ROOT = Path(__file__).resolve().parents[1]


def test_fingerprint_of_this_interpreter_names_its_distributions():
    fp = hostenv.fingerprint(sys.executable)
    assert "error" not in fp
    assert fp["python"] == ".".join(map(str, sys.version_info[:3]))
    assert fp["installed"]["pyyaml"] == __import__("yaml").__version__
    assert len(fp["freeze_sha256"]) == 64 and fp["distributions"] == len(fp["installed"])
    assert hostenv.fingerprint(sys.executable)["freeze_sha256"] == fp["freeze_sha256"]  # stable


def test_fingerprint_changes_with_the_distributions(tmp_path):
    venv.create(tmp_path / "a", with_pip=False)
    a = hostenv.fingerprint(str(tmp_path / "a" / "bin" / "python"))
    meta = next((tmp_path / "a" / "lib").glob("python*/site-packages"))
    d = meta / "torch-2.11.0.dist-info"
    d.mkdir()
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\n")
    b = hostenv.fingerprint(str(tmp_path / "a" / "bin" / "python"))
    assert a["freeze_sha256"] != b["freeze_sha256"]
    assert b["key"] == {"torch": "2.11.0"} and "torch" not in a["key"]


def test_a_missing_interpreter_gives_an_error_and_no_drift(tmp_path):
    fp = hostenv.fingerprint(str(tmp_path / "nope"))
    assert "error" in fp and "installed" not in fp
    assert hostenv.drift(fp, {"torch": "2.11.0"}) is None
    ex = hostenv.host_execution(load(ROOT / "upstreams.lock"), str(tmp_path / "nope"))
    assert ex["mode"] == "host" and ex["wheelset_drift"] is None and "environment unreadable" in hostenv.describe(ex)


def test_drift_against_the_locked_wheelsets_layers():
    lock = load(ROOT / "upstreams.lock")
    sub = hostenv.locked_wheelset(lock, "substrate-wheels")
    vllm = hostenv.locked_wheelset(lock, "vllm-wheels-cp311")
    assert sub["torch"] == "2.11.0" and sub["nvidia-nccl-cu13"] == "2.30.4"
    assert vllm["torch"] == "2.11.0" and "vllm" in vllm and len(vllm) > len(sub)  # installed-on layer included
    assert vllm["cuda-bindings"] == hostenv.locked_wheelset(lock, "substrate-wheels-cp311")["cuda-bindings"]
    host = {"installed": {**sub, "nvidia-nccl-cu13": "2.28.9"}}
    del host["installed"]["triton"]
    d = hostenv.drift(host, sub)
    assert d == [
        {"name": "nvidia-nccl-cu13", "locked": "2.30.4", "installed": "2.28.9"},
        {"name": "triton", "locked": sub["triton"], "installed": None},
    ]


def test_host_execution_on_this_interpreter_reports_mode_and_drift():
    ex = hostenv.host_execution(load(ROOT / "upstreams.lock"), sys.executable)
    assert ex["mode"] == "host" and "installed" not in ex["environment"]
    assert any(d["name"] == "torch" and d["installed"] is None for d in ex["wheelset_drift"])
    assert ex["wheelset_drift_count"] == len(ex["wheelset_drift"])
    assert hostenv.describe(ex).startswith("host mode (python ")
    unknown = hostenv.host_execution(load(ROOT / "upstreams.lock"), sys.executable, wheelset="nope")
    assert unknown["wheelset_drift"] is None and "no such pin" in unknown["wheelset_error"]


def test_gate_reports_that_ran_say_host_mode(monkeypatch, tmp_path):
    from reprostack.gates import registry, runner
    from reprostack.report import GateReport, write_reports
    from reprostack.report.model import evaluate

    lock = load(ROOT / "upstreams.lock")
    results = iter(["pass", "skip"])
    g = registry.gate("micro")
    monkeypatch.setattr(
        g,
        "run",
        lambda opts, ctx: GateReport(
            g.report_name, "h200-ep1", next(results), "why", checks=[evaluate("dc_p50_us", "us", 14.7, "<=", 30)]
        ),
    )
    args, ctx = GateOptions(out=tmp_path, python=sys.executable), RunContext(ROOT, lock, None)
    ran = runner.run_gate(g, args, ctx)
    assert ran.provenance["execution"]["mode"] == "host"
    assert ran.provenance["execution"]["environment"]["executable"]
    skipped = runner.run_gate(g, args, ctx)
    assert "execution" not in skipped.provenance  # nothing ran: no environment to vouch for
    md = write_reports([ran], tmp_path)["summary.md"].read_text()
    assert "Ran in **host mode (python " in md
