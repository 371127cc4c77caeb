"""Tests of run_with_watchdog: exit codes pass through, output reaches the log, nothing survives a timeout."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from reprostack.launch.watchdog import WATCHDOG_TAG, run_with_watchdog


def gone(pid: int) -> bool:
    """True when pid no longer runs: no such process, or a zombie waiting for its (new) parent to reap it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2 :].split()[0] in ("Z", "X")


def run_py(tmp_path: Path, code: str, **kw):
    kw.setdefault("timeout_s", 10)
    kw.setdefault("grace_s", 0.5)
    return run_with_watchdog(
        [sys.executable, "-c", code],
        env=dict(os.environ),
        cwd=tmp_path,
        log_path=tmp_path / "logs" / "run.log",
        echo=False,
        **kw,
    )


def test_exit_code_and_output_pass_through(tmp_path, capsys):
    code = "import sys\nprint('hello', flush=True)\nprint('to stderr', file=sys.stderr)\nsys.exit(3)"
    out = run_with_watchdog(
        [sys.executable, "-c", code],
        env=None,
        cwd=tmp_path,
        timeout_s=10,
        log_path=tmp_path / "logs" / "run.log",
        echo=True,
    )
    assert (out.returncode, out.timed_out, out.signal_name, out.killed_pids, out.note) == (3, False, None, (), None)
    log = out.log_path.read_text()
    assert "hello\n" in log and "to stderr\n" in log and WATCHDOG_TAG not in log
    assert "hello" in capsys.readouterr().out


def test_stdin_is_devnull_and_cwd_env_apply(tmp_path):
    env = dict(os.environ, REPRO_X="42")
    code = "import os,sys\nprint(repr(sys.stdin.read()), os.getcwd(), os.environ['REPRO_X'])"
    out = run_with_watchdog(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, timeout_s=10, log_path=tmp_path / "run.log", echo=False
    )
    assert out.returncode == 0
    assert out.log_path.read_text().strip() == f"'' {tmp_path} 42"


def test_signal_death_is_named(tmp_path):
    out = run_py(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert out.returncode == -signal.SIGSEGV and out.signal_name == "SIGSEGV" and not out.timed_out


def test_timeout_kills_group_that_ignores_sigterm(tmp_path):
    code = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = os.fork()
if child == 0:
    while True:
        time.sleep(1)
print(f"pids {os.getpid()} {child}", flush=True)
sys.stdout.write("partial line without newline")
sys.stdout.flush()
while True:
    time.sleep(1)
"""
    t0 = time.monotonic()
    out = run_py(tmp_path, code, timeout_s=1.0, grace_s=0.5)
    assert time.monotonic() - t0 < 8
    assert out.timed_out and out.returncode == -signal.SIGKILL and out.signal_name == "SIGKILL"
    log = out.log_path.read_text()
    leader, child = (int(x) for x in log.split("pids ")[1].split()[:2])
    assert gone(leader) and gone(child)
    assert {leader, child} <= set(out.killed_pids)
    last = log.splitlines()[-1]
    assert last == f"{WATCHDOG_TAG} timeout after 1 s: SIGTERM to pgid {leader}, SIGKILL after 0.5 s"
    assert "partial line without newline\n" in log and out.note == last


def test_timeout_polite_process_needs_no_sigkill(tmp_path):
    out = run_py(tmp_path, "import time\nprint('up', flush=True)\ntime.sleep(60)", timeout_s=1.0, grace_s=5)
    assert out.timed_out and out.returncode == -signal.SIGTERM
    assert out.log_path.read_text().splitlines()[-1].endswith("group gone within 5 s, no SIGKILL")


def test_leftover_group_members_after_normal_exit_are_reaped(tmp_path):
    code = """
import os, time
child = os.fork()
if child == 0:
    os.close(1); os.close(2)  # let the log pipe close
    time.sleep(60)
    os._exit(0)
print(f"child {child}", flush=True)
"""
    out = run_py(tmp_path, code, grace_s=2)
    assert out.returncode == 0 and not out.timed_out
    child = int(out.log_path.read_text().split("child ")[1].split()[0])
    assert gone(child) and child in out.killed_pids
    assert "left in pgid" in out.note


# setsid escapes (issue 14 item 12): a grandchild in its own session and process group, sleeping forever


def _grandchild(out) -> int:
    return int(out.log_path.read_text().split("grandchild ")[1].split()[0])


def test_timeout_kills_a_setsid_grandchild_while_its_parent_lives(tmp_path):
    code = """
import os, time
gc = os.fork()
if gc == 0:
    os.setsid()  # own session, own process group: killpg of the run's group no longer reaches it
    os.close(1); os.close(2)
    while True:
        time.sleep(1)
print(f"grandchild {gc}", flush=True)
while True:
    time.sleep(1)
"""
    out = run_py(tmp_path, code, timeout_s=1.5, grace_s=0.5)
    gc = _grandchild(out)
    assert out.timed_out and gone(gc) and gc in out.killed_pids


def test_timeout_kills_an_orphaned_setsid_grandchild(tmp_path):
    """The child double-forks (setsid grandchild) and its middle process exits: the grandchild is orphaned. We
    are a subreaper, so it is re-parented to us; the cookie in its environment marks it as the run's."""
    code = """
import os, sys, time
mid = os.fork()
if mid == 0:
    gc = os.fork()
    if gc == 0:
        os.setsid()
        os.close(1); os.close(2)
        while True:
            time.sleep(1)
    print(f"grandchild {gc}", flush=True)
    os._exit(0)  # the middle process exits: gc is an orphan in its own session
os.waitpid(mid, 0)
while True:
    time.sleep(1)
"""
    out = run_py(tmp_path, code, timeout_s=1.5, grace_s=0.5)
    gc = _grandchild(out)
    assert out.timed_out and gone(gc) and gc in out.killed_pids
    with pytest.raises(ChildProcessError):  # reaped by us: no zombie left
        os.waitpid(gc, os.WNOHANG)


def test_daemonized_grandchild_left_after_a_normal_exit_is_killed(tmp_path):
    """A command that starts a daemon (fork, setsid, parent exits) and exits 0: the daemon does not outlive the run."""
    code = """
import os, time
gc = os.fork()
if gc == 0:
    os.setsid()
    os.close(1); os.close(2)
    while True:
        time.sleep(1)
print(f"grandchild {gc}", flush=True)
"""
    out = run_py(tmp_path, code, grace_s=0.5)
    gc = _grandchild(out)
    assert out.returncode == 0 and not out.timed_out
    assert gone(gc) and gc in out.killed_pids and "left in pgid" in out.note


def test_other_processes_of_ours_are_left_alone(tmp_path):
    """A process we started outside the run (no cookie, not below the leader) survives the run's kill."""
    import subprocess

    bystander = subprocess.Popen([sys.executable, "-c", "import time\ntime.sleep(60)"], start_new_session=True)
    try:
        out = run_py(tmp_path, "import time\ntime.sleep(60)", timeout_s=1.0, grace_s=0.5)
        assert out.timed_out and bystander.poll() is None and bystander.pid not in out.killed_pids
    finally:
        bystander.kill()
        bystander.wait()


def test_server_stop_kills_a_setsid_worker(tmp_path):
    from reprostack.launch.server import ServerProcess

    code = """
import os, time
gc = os.fork()
if gc == 0:
    os.setsid()
    while True:
        time.sleep(1)
print(f"grandchild {gc}", flush=True)
while True:
    time.sleep(1)
"""
    srv = ServerProcess([sys.executable, "-c", code], env=dict(os.environ), cwd=tmp_path, log_path=tmp_path / "srv.log")
    deadline = time.monotonic() + 10
    while "grandchild" not in (tmp_path / "srv.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    gc = int((tmp_path / "srv.log").read_text().split("grandchild ")[1].split()[0])
    assert srv.stop(grace_s=0.5) is None
    assert gone(gc)


# --------------------------------------------------------------------------- on_line: progress from the output

FAKE_TRIALS_DRIVER = r"""
import json, sys
def emit(prefix, **kw):  # the trials driver's marker (gates/drivers/micro_trials.py emit), behind a launcher prefix
    print(prefix + "[micro_trials] " + json.dumps(kw, sort_keys=True), flush=True)
K = 3
for k in range(K):
    for arm in ("deepep", "dense"):
        for rank, prefix in ((1, "[default1]:"), (0, "[default0]:")):
            emit(prefix, event="trial", rank=rank, trial=k, trials=K, arm=arm)
        print(f"body of trial {k} {arm}", flush=True)
print('[micro_trials] {"event": "trial", "rank": "0", "arm": "deepep"}')   # rank as text: not rank 0
print('[micro_trials] {"event": "trial", "rank": 0, "arm": "deepep"')      # not JSON
print('[default0]:[micro_trials] {"event": "trial", "rank": false, "arm": "deepep"}')
emit("", event="done", rank=0, trials=K)
"""


def test_on_line_advances_a_step_per_rank0_deepep_trial_as_the_output_comes(tmp_path):
    """A fake trials driver (real subprocess) prints the driver's markers for 2 ranks and both arms: the ui
    stream gets `trial 1/3`, `2/3`, `3/3` in order, each before the body of its trial reached the log reader."""
    import io

    from reprostack import ui
    from reprostack.gates.parsers.micro_trials import deepep_trial_started

    stream = io.StringIO()
    ui.configure(stream=stream, cache=tmp_path / "cache")
    seen = []
    driver = tmp_path / "fake_driver.py"
    driver.write_text(FAKE_TRIALS_DRIVER)
    with ui.step("test_ep [p] x3 trial(s)", total=3, unit="trial", log=tmp_path / "t.log") as st:
        count = ui.line_counter(st, deepep_trial_started)

        def on_line(line: str) -> None:
            count(line)
            if line.startswith("body of trial"):
                seen.append((line, [x for x in stream.getvalue().splitlines() if ": trial " in x][-1]))

        out = run_with_watchdog(
            [sys.executable, str(driver)],
            env=dict(os.environ),
            cwd=tmp_path,
            timeout_s=30,
            log_path=tmp_path / "t.log",
            echo=False,
            on_line=on_line,
        )
    assert out.returncode == 0
    progress = [x for x in stream.getvalue().splitlines() if x.startswith("  ")]
    assert progress == [f"  test_ep [p] x3 trial(s): trial {k}/3" for k in (1, 2, 3)]
    assert seen[0] == ("body of trial 0 deepep", "  test_ep [p] x3 trial(s): trial 1/3")
    assert seen[5] == ("body of trial 2 dense", "  test_ep [p] x3 trial(s): trial 3/3")
    assert seen[2][1].endswith("trial 2/3") and len(seen) == 6
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("test_ep [p] x3 trial(s): started, ") and lines[-1].startswith(
        "test_ep [p] x3 trial(s): ok in "
    )


def test_on_line_that_raises_is_dropped_with_one_warning_and_the_log_is_whole(tmp_path):
    import io

    from reprostack import ui

    stream = io.StringIO()
    ui.configure(stream=stream, cache=tmp_path / "cache")
    calls = []

    def broken(line: str) -> None:
        calls.append(line)
        raise KeyError("boom")

    out = run_py(tmp_path, "for i in range(5):\n    print('line', i, flush=True)", on_line=broken)
    assert out.returncode == 0 and calls == ["line 0"]
    assert out.log_path.read_text() == "".join(f"line {i}\n" for i in range(5))
    warnings = [x for x in stream.getvalue().splitlines() if "warning" in x]
    assert len(warnings) == 1 and "output stopped: KeyError" in warnings[0]
