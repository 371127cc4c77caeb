"""`reprostack preflight`: real multi-process runs on this machine (N processes, one shared out dir), each with
its own PATH (stub nvidia-smi / fi_info executables stand in for the node's GPUs and libfabric), the real gate
specs and lock (reprostack.cluster.preflight)."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stubs(tmp_path, name, *, gpus=0, fi_info="efa") -> str:
    """A bin folder: nvidia-smi listing `gpus` H200s; fi_info that finds the efa provider (or fails)."""
    d = tmp_path / f"bin-{name}"
    d.mkdir()
    rows = "".join(f"{i}, NVIDIA H200, 580.65.06, 143771, 00000000:{i:02X}:00.0\\n" for i in range(gpus))
    (d / "nvidia-smi").write_text(f'#!/bin/sh\nprintf "{rows}"\n')
    (d / "fi_info").write_text(
        "#!/bin/sh\n"
        + (
            "printf 'provider: efa\\n    fabric: efa\\n'\n"
            if fi_info == "efa"
            else "echo 'fi_getinfo: -61 (No data available)' >&2; exit 1\n"
        )
    )
    for f in d.iterdir():
        f.chmod(0o755)
    return str(d)


def start(tmp_path, gate, node, nodes, *, profile, bin_dir=None, lock=None, timeout=60, port, env=None):
    e = {k: v for k, v in os.environ.items() if k not in ("FI_PROVIDER", "REPROSTACK_IMAGE")}
    e["PATH"] = f"{bin_dir or stubs(tmp_path, f'n{node}')}:{e['PATH']}"
    e.update(env or {})
    argv = [
        sys.executable,
        "-m",
        "reprostack",
        "preflight",
        gate,
        "--out",
        str(tmp_path / "run"),
        "--nodes",
        str(nodes),
        "--node-rank",
        str(node),
        "--profile",
        profile,
        "--timeout",
        str(timeout),
        "--port",
        str(port),
    ]
    if lock:
        argv += ["--lock", str(lock)]
    return subprocess.Popen(argv, cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(procs):
    out = []
    for p in procs:
        o, e = p.communicate(timeout=120)
        out.append((p.returncode, o, e))
    return out


def verdict(tmp_path):
    return json.loads((tmp_path / "run" / "preflight" / "verdict.json").read_text())


def failed(v):
    return sorted((r["check"], r["node"]) for r in v["failures"])


def test_two_nodes_pass_and_a_cpu_profile_needs_no_gpu_efa_or_provider(tmp_path):
    port = free_port()
    res = finish([start(tmp_path, "vllm", n, 2, profile="local-test", port=port) for n in (1, 0)])
    assert [rc for rc, _, _ in res] == [0, 0], res
    v = verdict(tmp_path)
    assert v["result"] == "pass" and v["failures"] == [] and set(v["nonces"]) == {"0", "1"}
    status = {(r["check"], r["node"]): r["status"] for r in v["checks"]}
    for n in (0, 1):
        assert status[("gpus", n)] == status[("efa", n)] == status[("provider", n)] == "not-needed"
        assert status[("lock", n)] == status[("clock", n)] == "pass"
    assert status[("port", 0)] == "pass"
    assert "not needed by this profile: efa, gpus, image, provider" in res[1][1]
    facts = json.loads((tmp_path / "run" / "preflight" / "node-1.json").read_text())
    assert facts["node"] == 1 and facts["gpus"]["count"] == 0 and facts["lock_sha256"] == v["lock_sha256"]


def test_lock_mismatch_names_the_node_and_the_check(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    for d in ("gates", "containers", "patches", "kernels", "claims"):
        if (ROOT / d).exists():
            (other / d).symlink_to(ROOT / d)
    (other / "upstreams.lock").write_bytes((ROOT / "upstreams.lock").read_bytes() + b"\n# a different lock\n")
    port = free_port()
    res = finish(
        [
            start(tmp_path, "vllm", 0, 2, profile="local-test", port=port),
            start(tmp_path, "vllm", 1, 2, profile="local-test", port=port, lock=other / "upstreams.lock"),
        ]
    )
    assert [rc for rc, _, _ in res] == [2, 2]
    assert failed(verdict(tmp_path)) == [("lock", 1)]
    for _, _, err in res:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "node 1: lock: lock sha256" in lines[0] and "nothing was run" in lines[0]


def test_gpu_count_mismatch_names_the_node(tmp_path):
    port = free_port()
    res = finish(
        [
            start(tmp_path, "micro", 0, 2, profile="h200-nvl-ep8", port=port, bin_dir=stubs(tmp_path, "eight", gpus=8)),
            start(tmp_path, "micro", 1, 2, profile="h200-nvl-ep8", port=port, bin_dir=stubs(tmp_path, "seven", gpus=7)),
        ]
    )
    assert [rc for rc, _, _ in res] == [2, 2]
    v = verdict(tmp_path)
    assert failed(v) == [("gpus", 1)]
    assert "node 1: gpus: 7 GPU(s), the profile needs 8" in res[0][2]


def test_provider_not_efa_is_named_never_a_silent_fallback(tmp_path):
    port = free_port()
    procs = [
        start(
            tmp_path,
            "micro",
            0,
            3,
            profile="p5en-efa-ep16",
            port=port,
            bin_dir=stubs(tmp_path, "ok", gpus=8),
            env={"FI_PROVIDER": "efa"},
        ),
        start(
            tmp_path,
            "micro",
            1,
            3,
            profile="p5en-efa-ep16",
            port=port,
            bin_dir=stubs(tmp_path, "nofi", gpus=8, fi_info="none"),
        ),
        start(
            tmp_path,
            "micro",
            2,
            3,
            profile="p5en-efa-ep16",
            port=port,
            bin_dir=stubs(tmp_path, "tcp", gpus=8),
            env={"FI_PROVIDER": "tcp"},
        ),
    ]
    res = finish(procs)
    assert [rc for rc, _, _ in res] == [2, 2, 2]
    v = verdict(tmp_path)
    bad = failed(v)
    assert ("provider", 1) in bad and ("provider", 2) in bad and ("provider", 0) not in bad
    detail = {(r["check"], r["node"]): r["detail"] for r in v["failures"]}
    assert "fi_info -p efa: exit 1" in detail[("provider", 1)]
    assert "FI_PROVIDER=tcp" in detail[("provider", 2)]
    if not list(Path("/dev/infiniband").glob("uverbs*")):  # this CPU machine: no EFA device on any node
        assert {("efa", n) for n in range(3)} <= set(bad)


def test_a_node_that_never_comes_is_named_after_the_timeout(tmp_path):
    port = free_port()
    ((rc, _, err),) = finish([start(tmp_path, "vllm", 0, 2, profile="local-test", port=port, timeout=1)])
    assert rc == 2 and "node 1: arrival: no facts" in err and len(err.strip().splitlines()) == 1
    assert failed(verdict(tmp_path)) == [("arrival", 1)]


def test_a_node_without_node_0_gives_up(tmp_path):
    ((rc, _, err),) = finish([start(tmp_path, "vllm", 1, 2, profile="local-test", port=free_port(), timeout=1)])
    assert rc == 2 and "node 1: no verdict from node 0" in err and len(err.strip().splitlines()) == 1


def _oversized(p: Path):
    p.write_bytes(b'{"a": "' + b"x" * (1 << 20) + b'"}')


def _plant(kind):
    def write(p: Path):
        if kind == "fifo":
            os.mkfifo(p)
        elif kind == "oversized":
            _oversized(p)
        elif kind == "symlink-dev-zero":
            p.symlink_to("/dev/zero")
        else:
            tmp = p.with_suffix(".tmp")
            tmp.write_text(kind)
            tmp.rename(p)

    return write


@pytest.mark.parametrize(
    "kind,says",
    [
        ("{not json", "not JSON"),
        ("oversized", "more than 65536 bytes"),
        ("fifo", "not a regular file"),
        ("symlink-dev-zero", "not a regular file"),
        ('{"schema": "reprostack.preflight.node/1", "gpus": {"count": NaN}}', "not a number"),
        ("[1, 2]", "expected an object"),
        ("schema", "is not of type"),
        ("node", "node is 5, expected 1"),
    ],
)
def test_hostile_facts_file_is_one_line_naming_it(tmp_path, kind, says):
    port = free_port()
    if kind in ("schema", "node"):  # a well-formed facts file of node 1 (preflight.collect), one field made wrong
        from reprostack.cluster.preflight import collect
        from reprostack.lock import load

        facts = collect(
            gate="vllm",
            profile="local-test",
            nodes=2,
            node=1,
            nonce="0" * 32,
            port=port,
            lock_sha256=load(ROOT / "upstreams.lock").sha256,
            need_provider=False,
        )
        if kind == "schema":
            facts["gpus"]["count"] = "8"
        else:
            facts["node"] = 5
        kind = json.dumps(facts)
    p0 = start(tmp_path, "vllm", 0, 2, profile="local-test", port=port, timeout=20)
    d = tmp_path / "run" / "preflight"
    for _ in range(400):  # node 0 clears earlier runs' files when it starts: plant after that
        if (d / "node-0.json").exists():
            break
        time.sleep(0.05)
    _plant(kind)(d / "node-1.json")
    ((rc, _, err),) = finish([p0])
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert "node 1: facts:" in lines[0] and "node-1.json" in lines[0] and says in lines[0]
    assert failed(verdict(tmp_path)) == [("facts", 1)]
    assert "Traceback" not in err
    shutil.rmtree(tmp_path / "run", ignore_errors=True)


def test_a_forged_verdict_with_terminal_escapes_is_printed_escaped_on_one_line(tmp_path):
    """hostile-input trial (session 4): a verdict planted on the shared disk whose failure details hold a
    terminal title escape, a clear-screen, a CR and a newline: the node fails (never a pass) and its one error
    line shows them escaped."""
    d = tmp_path / "run" / "preflight"
    d.mkdir(parents=True)
    detail = "x\x1b]0;owned\x07\x1b[2J\rreprostack: preflight: pass\nreprostack: pass"
    (d / "verdict.json").write_text(
        json.dumps(
            {
                "schema": "reprostack.preflight.verdict/1",
                "result": "fail",
                "nonces": {},
                "written_utc": time.time() + 60,
                "failures": [{"node": 1, "check": "lock", "detail": detail}],
            }
        )
    )
    ((rc, out, err),) = finish([start(tmp_path, "vllm", 1, 2, profile="local-test", port=free_port(), timeout=5)])
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "\x1b" not in err and "\r" not in err and "\x07" not in err
    assert "node 1: lock: x\\x1b]0;owned\\x07\\x1b[2J reprostack: preflight: pass reprostack: pass" in err
