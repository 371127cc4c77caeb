"""One NCCL, fail closed (issue 29 item 1): every mapping of a libnccl in a measured process counts (a library deleted
or replaced on disk too), the serving gates read their server's processes and the training gate its ranks while they
run, and an NCCL that shadows the pinned one is named with its file, version and how it got there, before anything
starts where the environment shows it.

Real processes and real shared libraries (tests/fakenccl.py: g++-built libraries whose bytes say their NCCL version),
real /proc/<pid>/maps; the gates run as the CLI runs them (tests/gaterun.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fakenccl import make_libnccl, make_wheel_site
from reprostack.errors import BuildError
from reprostack.kernels import runtime
from reprostack.launch import procmaps
from reprostack.launch.watchdog import run_with_watchdog
from test_gate_micro import gpu_less  # noqa: F401  (a fixture)
from test_gate_micro_flow import gpu_host  # noqa: F401  (a fixture)

REPO = Path(__file__).resolve().parents[1]
DRIVERS = REPO / "gates" / "drivers"


@pytest.fixture
def libs(tmp_path):
    """The pinned build (2.30.4) in its own folder, torch's older wheel (2.28.9) in a site-packages, and a copy of
    an NCCL in a folder whose name holds a space."""
    pinned = make_libnccl(tmp_path / "pinned" / "lib", "2.30.4")
    wheel = make_wheel_site(tmp_path / "torch-venv" / "site-packages", "2.28.9")
    return pinned, wheel


def _hold(*paths, unlink=()) -> subprocess.Popen:
    """A process that maps `paths` (ctypes), removes `unlink` from disk, says `ready` and waits."""
    code = (
        "import ctypes, os, sys, time\n"
        f"libs = [ctypes.CDLL(p) for p in {[str(p) for p in paths]!r}]\n"
        f"for p in {[str(p) for p in unlink]!r}: os.unlink(p)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_the_trials_drivers_record_counts_a_deleted_nccl_next_to_the_pinned_one(libs, tmp_path):
    """The rank's own record (the trials driver reads its maps with launch.procmaps): the old reader took the maps
    line's last word, `(deleted)`, as the file and dropped the library, so the pinned one looked alone."""
    pinned, _ = libs
    foreign = make_libnccl(tmp_path / "a folder" / "lib", "2.28.9")
    code = (
        "import ctypes, json, os, sys\n"
        f"sys.path.insert(0, {str(DRIVERS)!r})\n"
        "import micro_trials\n"
        f"keep = [ctypes.CDLL({str(pinned)!r}), ctypes.CDLL({str(foreign)!r})]\n"
        f"os.unlink({str(foreign)!r})\n"
        "print(json.dumps(micro_trials.load_procmaps().record()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    assert rec["mapped"] == sorted([str(pinned), str(foreign)]) and rec["deleted"] == [str(foreign)]
    with pytest.raises(BuildError) as e:
        runtime.judge_one_nccl(rec, pinned.parent, pinned_version="2.30.4")
    msg = str(e.value)
    assert "was deleted or replaced on disk after it was loaded" in msg and str(foreign) in msg
    if os.geteuid() == 0:  # root reads the mapped bytes of a deleted file (/proc/PID/map_files)
        assert "(NCCL 2.28.9, " in msg
    # without the deletion the same two are two NCCLs, the older one named as shadowing the pinned
    rec2 = dict(rec, deleted=[])
    with pytest.raises(BuildError, match=r"the older NCCL 2\.28\.9 \(.*a folder.*\) shadows the pinned 2\.30\.4"):
        runtime.judge_one_nccl(rec2, pinned.parent, pinned_version="2.30.4")


def test_a_record_without_its_deleted_list_is_refused(libs):
    pinned, _ = libs
    with pytest.raises(BuildError, match="without the list of its deleted libraries"):
        runtime.judge_one_nccl({"mapped": [str(pinned)], "runtime": "2.30.4"}, pinned.parent)
    for forged in ([str(pinned) + "x"], "x", [1]):  # a deleted entry that is not a mapped path: refused too
        with pytest.raises(BuildError, match="without the list"):
            runtime.judge_one_nccl({"mapped": [str(pinned)], "deleted": forged}, pinned.parent)
    assert runtime.judge_one_nccl({"mapped": [str(pinned)], "deleted": []}, pinned.parent)["mapped"]


def test_maps_lines_are_read_whole(tmp_path):
    text = (
        "7f00-7f10 r-xp 00000000 fd:01 123 /opt/a b/libnccl.so.2\n"
        "7f10-7f20 r--p 00000000 fd:01 124 /opt/torch/nvidia/nccl/lib/libnccl.so.2 (deleted)\n"
        "7f20-7f30 rw-p 00000000 00:00 0 \n"
        "7f30-7f40 rw-p 00000000 00:00 0 [heap]\n"
        "7f40-7f50 r-xp 00000000 fd:01 125 /usr/lib/libc.so.6\n"
    )
    mapped, deleted, _ = procmaps.nccl_maps(text)
    assert mapped == ["/opt/a b/libnccl.so.2", "/opt/torch/nvidia/nccl/lib/libnccl.so.2"]
    assert deleted == ["/opt/torch/nvidia/nccl/lib/libnccl.so.2"]


def test_preflight_names_an_older_nccl_put_first_by_ld_preload_or_ld_library_path(libs):
    """The H200 case: LD_PRELOAD of the torch venv's own NCCL 2.28.9 made gate micro end in an ImportError on
    ncclCommQueryProperties; the preflight names the file, its version and how, before anything starts."""
    pinned, wheel = libs
    with pytest.raises(BuildError) as e:
        runtime.preflight({"LD_PRELOAD": str(wheel)}, pinned.parent, "2.30.4")
    msg = str(e.value)
    assert msg.startswith("the environment would load another NCCL than the pinned one (nothing was started): ")
    assert f"LD_PRELOAD loads {wheel} (NCCL 2.28.9, LD_PRELOAD, the file of wheel nvidia_nccl_cu13 2.28.9)" in msg
    assert "ahead of the pinned NCCL 2.30.4" in msg
    with pytest.raises(BuildError, match=r"LD_LIBRARY_PATH entry .* holds .*libnccl\.so\.2 \(NCCL 2\.28\.9, "):
        runtime.preflight({"LD_LIBRARY_PATH": f"/nonexistent:{wheel.parent}"}, pinned.parent, "2.30.4")
    # the pinned build first on the path, a plugin beside it, nothing set: no shadow
    make_libnccl(pinned.parent, "2.30.4", "libnccl-net-ofi.so")
    runtime.preflight({"LD_LIBRARY_PATH": str(pinned.parent), "LD_PRELOAD": str(pinned)}, pinned.parent, "2.30.4")
    runtime.preflight({}, pinned.parent, "2.30.4")
    # a prebuilt image's copy of the pinned build (its sha256) is the pinned NCCL wherever it lies
    from reprostack.digest import sha256_file

    runtime.preflight({"LD_PRELOAD": str(wheel)}, pinned.parent, "2.30.4", accept_sha256=sha256_file(wheel))


def test_an_undefined_nccl_symbol_is_read_as_an_older_nccl_first():
    text = "ImportError: /x/deep_ep/_C.so: undefined symbol: ncclCommQueryProperties"
    hint = runtime.older_nccl_hint(text, "2.30.4")
    assert "undefined symbol ncclCommQueryProperties: an NCCL older than the pinned 2.30.4 was loaded" in hint
    assert runtime.older_nccl_hint("ImportError: No module named deep_ep", "2.30.4") == ""


def test_the_ranks_of_a_watched_run_are_read_while_they_run(libs, tmp_path):
    """The training gate's check of its ranks: run_with_watchdog's `watch` hands the run's pids (a rank that calls
    setsid included) to launch.procmaps.sample; an older NCCL in any of them is named with its pid."""
    pinned, wheel = libs
    rank = (
        "import ctypes, os, sys, time\n"
        "lib = ctypes.CDLL(sys.argv[1])\n"
        "if sys.argv[2] == 'setsid': os.setsid()\n"
        "time.sleep(2.5)\n"
    )
    script = tmp_path / "rank.py"
    script.write_text(rank)
    launcher = tmp_path / "launch.sh"
    launcher.write_text(
        f"#!/bin/sh\n{sys.executable} {script} {pinned} stay &\n{sys.executable} {script} {wheel} setsid &\nwait\n"
    )
    launcher.chmod(0o755)
    seen: dict = {}
    out = run_with_watchdog(
        [str(launcher)],
        env=dict(os.environ),
        cwd=tmp_path,
        timeout_s=60,
        log_path=tmp_path / "ranks.log",
        watch=lambda pids: runtime.merge_samples(seen, procmaps.sample(pids)),
        watch_every_s=0.2,
    )
    assert out.returncode == 0 and len(seen) == 2
    with pytest.raises(BuildError) as e:
        runtime.judge_processes(seen, "arm deepep's ranks", nccl_lib=pinned.parent, pinned_version="2.30.4")
    msg = str(e.value)
    assert msg.startswith("arm deepep's ranks: process ") and f"{wheel} (NCCL 2.28.9, the file of wheel" in msg
    only_pinned = {p: r for p, r in seen.items() if r["mapped"] == [str(pinned)]}
    one = runtime.judge_processes(only_pinned, "ranks", nccl_lib=pinned.parent, pinned_version="2.30.4")
    assert one == {"processes": 1, "mapped": str(pinned), "version": "2.30.4"}
    with pytest.raises(BuildError, match="no process of the run was seen mapping an NCCL"):
        runtime.judge_processes({}, "ranks", nccl_lib=pinned.parent)


def test_a_server_process_whose_library_was_deleted_fails_closed(libs, tmp_path):
    """Read from outside (the serving gates read their server's processes): a deleted library is never accepted,
    whichever version it was."""
    pinned, _ = libs
    copy = make_libnccl(tmp_path / "copy", "2.30.4")
    p = _hold(copy, unlink=[copy])
    try:
        seen = procmaps.sample([p.pid, 999999999])  # a pid that is gone is left out
    finally:
        p.kill()
        p.wait()
    assert list(seen) == [p.pid] and seen[p.pid]["deleted"] == [str(copy)]
    with pytest.raises(BuildError, match=r"process \d+: the NCCL mapped from .*copy/libnccl\.so\.2 .*was deleted"):
        runtime.judge_processes(seen, "server of arm deepep", pinned_version="2.30.4")


def test_shadows_never_read_a_fifo_named_by_ld_preload(tmp_path):
    fifo = tmp_path / "libnccl.so.2"
    os.mkfifo(fifo)
    t = time.monotonic()
    found = procmaps.shadows({"LD_PRELOAD": str(fifo)}, lambda p: False, "2.30.4")
    assert time.monotonic() - t < 5 and "NCCL version unknown" in found[0]


# --------------------------------------------------------------------------- through the gates


def test_gate_micro_refuses_an_ld_preload_of_torchs_nccl_before_the_test(tmp_path, gpu_host, libs, monkeypatch):
    from gaterun import run as run_gate_here
    from test_gate_micro_flow import options, stand_in_python
    from trialslog import real_ep1_texts, trials_log

    _, wheel = libs
    py = stand_in_python(tmp_path, trials_log(real_ep1_texts(1)))
    monkeypatch.setenv("LD_PRELOAD", str(wheel))
    rep = run_gate_here(options(tmp_path, py, profile="h200-ep1", trials=1))
    assert rep.result == "error" and rep.reason.startswith("one-NCCL preflight: the environment would load"), rep.reason
    assert (
        f"LD_PRELOAD loads {wheel} (NCCL 2.28.9, LD_PRELOAD, the file of wheel nvidia_nccl_cu13 2.28.9)" in rep.reason
    )
    assert "ahead of the pinned NCCL 2.30.4" in rep.reason
    assert not (tmp_path / "calls").exists()  # the test never started


def test_gate_micro_reads_an_undefined_nccl_symbol_as_an_older_nccl(tmp_path, gpu_host):
    from gaterun import run as run_gate_here
    from test_gate_micro_flow import options, stand_in_python
    from trialslog import marker

    text = (
        marker(event="trial", rank=0, trial=0, trials=1, arm="deepep")
        + '\nTraceback (most recent call last):\n  File "test_ep.py", line 9, in <module>\n    import deep_ep\n'
        "ImportError: /x/deep_ep/_C.cpython-312-x86_64-linux-gnu.so: undefined symbol: ncclCommQueryProperties\n"
    )
    rep = run_gate_here(
        options(tmp_path, stand_in_python(tmp_path, text, nccl_runtime=None), profile="h200-ep1", trials=1)
    )
    assert rep.result == "error" and "ncclCommQueryProperties" in rep.reason, rep.reason
    assert "an NCCL older than the pinned 2.30.4 was loaded before it" in rep.reason and "\n" not in rep.reason


def test_gate_megatron_reads_its_ranks_maps(tmp_path, libs, monkeypatch, gpu_less):
    """The training gate's ranks (a rank that maps torch's 2.28.9 besides the pinned 2.30.4): ERROR naming the
    process, the file and its version, although every step of the arm's log is complete."""
    from types import SimpleNamespace

    import gaterun
    from reprostack import sources
    from reprostack.fetch import Cache
    from reprostack.gates import training
    from reprostack.lock import load
    from test_gate_training import real, training_project

    pinned, wheel = libs
    monkeypatch.setattr(
        "reprostack.hostinfo.collect",
        lambda **kw: {"gpu_count": 1, "efa_devices": [], "gpus": [{"name": "NVIDIA H200"}]},
    )

    def kernels(self, st):
        training.MegatronState.of(st).kern = SimpleNamespace(
            nccl_lib=pinned.parent, nccl_version="2.30.4", accept_sha256=None
        )
        st.data["nccl"] = {
            "runtime": "2.30.4",
            "pinned": "2.30.4",
            "mapped": [str(pinned)],
            "torch_built_with": "2.28.9",
        }
        return {}

    monkeypatch.setattr(training.MegatronGate, "_kernels", kernels)
    root, _ = training_project(tmp_path)
    logs = {arm: tmp_path / f"{arm}.txt" for arm in ("deepep", "alltoall")}
    for arm, p in logs.items():
        p.write_text(real(arm))
    rank = tmp_path / "rank.py"
    rank.write_text(
        "import ctypes, sys, time\n"
        "keep = [ctypes.CDLL(p) for p in sys.argv[2:]]\n"
        "time.sleep(1.5)\n"
        "print(open(sys.argv[1]).read(), flush=True)\n"
    )
    py = tmp_path / "py"
    py.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        f"  *deepep*) exec {sys.executable} {rank} {logs['deepep']} {pinned} {wheel} ;;\n"
        f"  *) exec {sys.executable} {rank} {logs['alltoall']} {pinned} ;;\n"
        "esac\n"
    )
    py.chmod(0o755)
    opts = gaterun.options(
        "megatron",
        root=root,
        lock=load(root / "upstreams.lock"),
        out_dir=tmp_path / "out",
        fetch=sources.FetchOptions(cache=Cache(tmp_path / "cache")),
        python=str(py),
    )
    rep = gaterun.run(opts)
    assert rep.result == "error", rep.reason
    assert "deepep arm: one_nccl: one-NCCL check of the ranks: arm deepep's ranks: process " in rep.reason
    assert f"{wheel} (NCCL 2.28.9, the file of wheel nvidia_nccl_cu13 2.28.9)" in rep.reason
    assert "alltoall" not in rep.reason.split(" — ")[0].split("deepep arm:")[0]


def test_serving_gate_reads_its_servers_processes_before_any_request(tmp_path, libs):
    """A server (the local-test stand-in, mapping torch's NCCL 2.28.9 as an engine maps its own) is judged on its
    processes' maps once it answers, before AIPerf sends a request: ERROR naming the process, file, version, how."""
    from reprostack.lock import load
    from test_gate_serving import serve, small_root

    _, wheel = libs
    root = small_root(tmp_path, "vllm")
    spec = root / "gates" / "vllm.yaml"
    text = spec.read_text()
    assert text.count('--ranks, "${ep}",') == 1
    spec.write_text(text.replace('--ranks, "${ep}",', f'--ranks, "${{ep}}", --load, "{wheel}",'))
    rep = serve("vllm", root, load(REPO / "upstreams.lock"), tmp_path / "out")
    assert rep.result == "error", rep.reason
    assert "arm deepep: one-NCCL check: server of arm deepep: process " in rep.reason
    assert f"{wheel} (NCCL 2.28.9, the file of wheel nvidia_nccl_cu13 2.28.9)" in rep.reason
    assert "the older NCCL 2.28.9" in rep.reason and "shadows the pinned 2.30.4" in rep.reason
    assert rep.data["arms"]["deepep"]["cells"] == []  # no request was sent
    # the pinned release's NCCL (the same version) in the server: the check holds, the sweep runs on
    pinned = make_wheel_site(tmp_path / "engine" / "site-packages", "2.30.4")
    spec.write_text(text.replace('--ranks, "${ep}",', f'--ranks, "${{ep}}", --load, "{pinned}",'))
    rep = serve("vllm", root, load(REPO / "upstreams.lock"), tmp_path / "out2", arms=("deepep",))
    assert rep.data["nccl"]["server of arm deepep"]["version"] == "2.30.4", rep.reason
    assert rep.data["arms"]["deepep"]["cells"]


def test_serving_gate_refuses_an_ld_preload_before_the_server_starts(tmp_path, libs, monkeypatch):
    from reprostack.lock import load
    from test_gate_serving import serve, small_root

    _, wheel = libs
    root = small_root(tmp_path, "vllm")
    monkeypatch.setenv("LD_PRELOAD", str(wheel))
    rep = serve("vllm", root, load(REPO / "upstreams.lock"), tmp_path / "out", arms=("deepep",))
    assert rep.result == "error" and "arm deepep: one-NCCL preflight: LD_PRELOAD loads " in rep.reason, rep.reason
    assert "(NCCL 2.28.9, LD_PRELOAD, the file of wheel nvidia_nccl_cu13 2.28.9) ahead of the pinned NCCL 2.30.4" in (
        rep.reason
    )
    assert not (tmp_path / "out" / "vllm" / "server.deepep.log").exists()  # never started
