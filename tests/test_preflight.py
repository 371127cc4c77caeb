"""`reprostack preflight`: real multi-process runs on this machine (N processes, one shared out dir), each with
its own PATH (stub nvidia-smi / fi_info executables stand in for the node's GPUs and libfabric), the real gate
specs and lock (reprostack.cluster.preflight)."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reprostack.launch.torchrun import free_port

ROOT = Path(__file__).resolve().parents[1]


PF = ROOT / "tests" / "fixtures" / "preflight"  # real tool output (tests/fixtures/preflight/README.md)


def stubs(tmp_path, name, *, gpus=0, fi_info="efa", nvlink="up", xid=False, pingpong="ok", hmem=True) -> str:
    """A bin folder of stand-ins that print real output (tests/fixtures/preflight): nvidia-smi listing `gpus`
    H200s for --query-gpu, the real 8x H100 `nvidia-smi -q` excerpt for -q, the real `nvidia-smi nvlink -s` of
    two GPUs with every link up (`nvlink="down"`: the whole capture, its third GPU's links all inactive); fi_info
    with the real one-device `fi_info -p efa` (or the real `fi_getinfo: -61`); nvcc that is absent (the image's CUDA
    then comes from $CUDA_VERSION); dmesg (empty, or real Xid lines); fi_pingpong that prints the real two-node
    tables (server: once the client said it connected, through $STUB_DIR; `pingpong="fail"`: the client prints the
    real `fi_getinfo: -61` and exits 1)."""
    d = tmp_path / f"bin-{name}"
    d.mkdir()
    rows = "".join(f"{i}, NVIDIA H200, 580.65.06, 143771, 00000000:{i:02X}:00.0\\n" for i in range(gpus))
    nvl = f"cat {PF / 'nvlink-s-a6000x3.txt'}" if nvlink == "down" else f"head -n 10 {PF / 'nvlink-s-a6000x3.txt'}"
    (d / "nvidia-smi").write_text(
        "#!/bin/sh\n"
        f'case "$1" in\n  -q) cat {PF / "nvidia-smi-q-h100x8.txt"} ;;\n  nvlink) {nvl} ;;\n'
        f'  *) printf "{rows}" ;;\nesac\n'
    )
    no_hmem = (  # `-c FI_HMEM` when the efa provider serves no GPU memory: libfabric v2.6.0 util/info.c (exit 61)
        f'case "$*" in *FI_HMEM*) printf "%s (No data available)\\n" "$(cat {PF / "fi_getinfo-61.txt"})" >&2; '
        "exit 61 ;; esac\n"
        if not hmem
        else ""
    )
    (d / "fi_info").write_text(
        "#!/bin/sh\n"
        + no_hmem
        + (
            f"cat {PF / 'fi_info-efa-1dev.txt'}\n"
            if fi_info == "efa"
            else f"cat {PF / 'fi_getinfo-61.txt'} >&2; exit 1\n"
        )
    )
    (d / "nvcc").write_text("#!/bin/sh\nexit 127\n")
    dmesg = {  # util-linux dmesg under kernel.dmesg_restrict=1 without CAP_SYSLOG (sys-utils/dmesg.c: err(...))
        "denied": "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1\n",
        True: f"cat {PF / 'xid-kernel-log.txt'}\n",
    }.get(xid, "exit 0\n")
    (d / "dmesg").write_text("#!/bin/sh\n" + dmesg)
    client = (
        f"cat {PF / 'fi_getinfo-61.txt'}; exit 1"
        if pingpong == "fail"
        else f'touch "$STUB_DIR/connected"; sed "s/^\\[rank 1\\] //" {PF / "fi_pingpong-efa-client.txt"}'
    )
    (d / "fi_pingpong").write_text(
        "#!/bin/sh\n"
        'echo "$*" >> "$STUB_DIR/pp-ran"\n'
        'for a in "$@"; do last="$a"; done\n'
        'case "$last" in\n'
        f"  [0-9]*.*) {client} ;;\n"
        '  *) i=0; while [ ! -e "$STUB_DIR/connected" ]; do i=$((i+1)); [ $i -gt 100 ] && exit 1; sleep 0.1; done\n'
        f'     sed "s/^\\[rank 0\\] //" {PF / "fi_pingpong-efa-server.txt"} ;;\n'
        "esac\n"
    )
    for f in d.iterdir():
        f.chmod(0o755)
    return str(d)


def start(tmp_path, gate, node, nodes, *, profile, bin_dir=None, lock=None, timeout=60, port, env=None):
    e = {k: v for k, v in os.environ.items() if k not in ("FI_PROVIDER", "REPROSTACK_IMAGE", "MASTER_ADDR")}
    e["PATH"] = f"{bin_dir or stubs(tmp_path, f'n{node}')}:{e['PATH']}"
    e["CUDA_VERSION"] = "12.4.0"  # an image on NVIDIA's cuda:12.4.0 base (its env); the real H100 driver says 12.7
    e["STUB_DIR"] = str(tmp_path)
    e["MASTER_ADDR"] = "127.0.0.1"
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
    needless = (
        "driver, ecc, efa, efa-devices, efa-hmem, efa-module, fabricmanager, gdrdrv, gpus, hugepages, image, memlock, "
    )
    assert f"not needed by this profile: {needless}nvlink, pcie, provider, smoke, xid" in res[1][1]
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


def test_gpu_nodes_pass_and_a_kernel_log_they_cannot_read_is_named_never_passed(tmp_path):
    """Two 8-GPU nodes whose tools print the real H100 output (driver CUDA 12.7 >= the image's 12.4, fabric
    Completed, every link up, no ECC error, x16): every node check passes, except that dmesg is refused and there
    is no /var/log/kern.log: `xid` is `unreadable` on both nodes and the pass line says so."""
    if Path("/var/log/kern.log").exists():
        pytest.skip("this machine has /var/log/kern.log: the unreadable-log case cannot be shown here")
    port = free_port()
    res = finish(
        [
            start(
                tmp_path,
                "micro",
                n,
                2,
                profile="h200-nvl-ep8",
                port=port,
                bin_dir=stubs(tmp_path, f"d{n}", gpus=8, xid="denied"),
            )
            for n in (1, 0)
        ]
    )
    assert [rc for rc, _, _ in res] == [0, 0], res
    v = verdict(tmp_path)
    status = {(r["check"], r["node"]): r["status"] for r in v["checks"]}
    for n in (0, 1):
        assert status[("xid", n)] == "unreadable"
        for check in ("driver", "fabricmanager", "nvlink", "ecc", "pcie"):
            assert status[(check, n)] == "pass", (check, n)
    assert "not readable here: xid" in res[1][1] and "preflight: pass: 2 node(s)" in res[1][1]


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
    assert "fi_info -p efa: exit 1: fi_getinfo: -61" in detail[("provider", 1)]
    assert "FI_PROVIDER=tcp" in detail[("provider", 2)]
    if not list(Path("/dev/infiniband").glob("uverbs*")):  # this CPU machine: no EFA device on any node
        assert {("efa", n) for n in range(3)} <= set(bad)


def test_efa_without_fi_hmem_fails_the_node_in_one_line(tmp_path):
    """issue 37 item 2: on node 1 libfabric's efa provider offers no FI_HMEM (`fi_info -p efa -c FI_HMEM` prints
    `fi_getinfo: -61 (No data available)`, exit 61: libcudart not loadable): its `efa-hmem` row fails naming the
    command's answer, node 0's passes, and both nodes' one error line says so; nothing runs."""
    port = free_port()
    procs = [
        start(
            tmp_path,
            "micro",
            n,
            2,
            profile="p5en-efa-ep16",
            port=port,
            bin_dir=stubs(tmp_path, f"hm{n}", gpus=8, hmem=n == 0),
            env={"FI_PROVIDER": "efa"},
        )
        for n in (1, 0)
    ]
    res = finish(procs)
    assert [rc for rc, _, _ in res] == [2, 2]
    v = verdict(tmp_path)
    rows = {(r["check"], r["node"]): r for r in v["checks"]}
    assert rows[("efa-hmem", 0)]["status"] == "pass"
    r = rows[("efa-hmem", 1)]
    assert r["status"] == "fail" and r["detail"].startswith(
        "fi_info -p efa -c FI_HMEM: exit 61: fi_getinfo: -61 (No data available): libfabric's efa provider offers no "
        "FI_HMEM"
    ), r
    for _, _, err in res:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "node 1: efa-hmem: fi_info -p efa -c FI_HMEM: exit 61" in lines[0], err
        assert "Traceback" not in err


def _smoke_run(tmp_path, pingpong):
    port = free_port()
    procs = [
        start(
            tmp_path,
            "micro",
            n,
            2,
            profile="p5en-efa-ep16",
            port=port,
            bin_dir=stubs(tmp_path, f"pp{n}", gpus=8, pingpong=pingpong if n else "ok"),
            env={"FI_PROVIDER": "efa"},
        )
        for n in (1, 0)
    ]
    res = finish(procs)
    v = verdict(tmp_path)
    return res, v, {(r["check"], r["node"]): r for r in v["checks"]}


def test_efa_smoke_node_0_with_each_node_reports_its_bandwidth(tmp_path):
    """Node 0 serves `fi_pingpong -p efa -e rdm`, node 1 is the client once node 0 wrote its turn (the stand-ins
    print the real two-node tables); the MB/s of the largest size is in the row and in verdict["smoke"]."""
    res, v, rows = _smoke_run(tmp_path, "ok")
    assert rows[("smoke", 1)]["status"] == "pass", rows[("smoke", 1)]
    assert rows[("smoke", 1)]["detail"] == "fi_pingpong -p efa node 0 <-> node 1: 196.92 MB/s at 4096 B"
    assert v["smoke"]["1"]["mb_s"] == 196.92 and v["smoke"]["1"]["server_rc"] == v["smoke"]["1"]["client_rc"] == 0
    assert rows[("smoke", 0)]["status"] == "pass"
    client = json.loads((tmp_path / "run" / "preflight" / "smoke" / "node-1.json").read_text())
    assert (client["rc"], client["mb_s"], client["bytes"]) == (0, 215.58, 4096)
    assert "Traceback" not in res[0][2] + res[1][2]


def test_efa_smoke_that_cannot_reach_a_node_names_it(tmp_path):
    """Node 1's fi_pingpong finds no EFA device (the real `fi_getinfo: -61`, exit 1): its smoke row fails naming
    node 1, both exit codes and the client's first line; the server gives up after its bound."""
    res, v, rows = _smoke_run(tmp_path, "fail")
    assert [rc for rc, _, _ in res] == [2, 2]
    r = rows[("smoke", 1)]
    assert r["status"] == "fail" and "node 0 <-> node 1 failed" in r["detail"], r
    assert "client exit 1" in r["detail"] and "fi_getinfo: -61" in r["detail"]
    assert ("smoke", 1) in failed(v)


def test_a_forged_smoke_turn_never_runs_the_client(tmp_path):
    """A turn file planted on the shared disk with another run's nonce, or with this run's nonce and an address
    fi_pingpong would read as an option (`-Sall`), is ignored: node 1 never starts fi_pingpong, writes no result."""
    d = tmp_path / "run" / "preflight"
    (d / "smoke").mkdir(parents=True)
    turn = d / "smoke" / "turn-1.json"
    turn.write_text(json.dumps({"nonce": "a" * 32, "addr": "127.0.0.1", "port": 47592}))
    p1 = start(tmp_path, "micro", 1, 2, profile="p5en-efa-ep16", port=free_port(), env={"FI_PROVIDER": "efa"})
    try:
        for _ in range(400):
            if (d / "node-1.json").exists():
                break
            time.sleep(0.05)
        nonce = json.loads((d / "node-1.json").read_text())["nonce"]
        time.sleep(1.5)  # a heartbeat with the other run's turn
        turn.write_text(json.dumps({"nonce": nonce, "addr": "-Sall", "port": 47592}))
        time.sleep(2.5)  # two more heartbeats with this run's nonce and the option-like address
    finally:
        p1.kill()
        p1.communicate()
    assert not (tmp_path / "pp-ran").exists() and not (d / "smoke" / "node-1.json").exists()


@pytest.mark.parametrize("flag,value", [("--smoke-timeout", "nan"), ("--smoke-timeout", "-1"), ("--timeout", "1e9")])
def test_a_wait_that_is_not_a_sane_number_of_seconds_is_one_line(tmp_path, flag, value):
    argv = [sys.executable, "-m", "reprostack", "preflight", "vllm", "--out", str(tmp_path / "run"), "--nodes", "2"]
    argv += ["--node-rank", "1", "--profile", "local-test", flag, value]
    p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert f"{flag} " in p.stderr and "is not a number of seconds in (0, 3600]" in p.stderr
    assert not (tmp_path / "run" / "preflight").exists()


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


@pytest.mark.parametrize("nodes", ["1000000000", "0", "-3"])
def test_an_absurd_node_count_is_one_line_before_any_work(tmp_path, nodes):
    """issue 25 item 4: `preflight --nodes 1000000000` ran for minutes and grew past 2 GB; now one line, exit 2."""
    t = time.monotonic()
    p = start(tmp_path, "vllm", 0, nodes, profile="local-test", port=free_port(), timeout=5)
    o, e = p.communicate(timeout=60)
    assert p.returncode == 2 and e.strip().count("\n") == 0 and f"--nodes {nodes}: not in 1..1024" in e, e
    assert time.monotonic() - t < 30 and not (tmp_path / "run" / "preflight").exists()
