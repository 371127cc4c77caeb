"""reprostack.ui on real files and real streams: plain lines off a terminal (and under NO_COLOR / CI), `-v`,
ETAs from the stored durations (per host and step), a gate run's own folder and `latest` (reprostack.runs, through
the CLI), and a hostile timings file in the cache: read bounded, ignored with one warning line, never a traceback."""

from __future__ import annotations

import io
import json
import re
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

import noxmod

from reprostack import cli, ui
from reprostack.cmd import gate as cmd_gate
from reprostack.gates import runner
from reprostack.report import GateReport, evaluate


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def plain(tmp_path, verbose=0) -> io.StringIO:
    s = io.StringIO()
    ui.configure(verbose=verbose, cache=tmp_path / "cache", stream=s)
    return s


# --------------------------------------------------------------------------- plain output, -v


def test_plain_lines_off_a_terminal(tmp_path):
    s = plain(tmp_path)
    assert not ui.live_display()
    with ui.step("build nccl"):
        ui.detail("hidden without -v")
    lines = s.getvalue().splitlines()
    assert lines[0] == "build nccl: started, first run, no estimate"
    assert lines[1].startswith("build nccl: ok in ") and len(lines) == 2
    assert "\x1b[" not in s.getvalue()  # no escape codes in a log


@pytest.mark.parametrize("env", [{"NO_COLOR": "1"}, {"CI": "true"}, {"TERM": "dumb"}])
def test_no_live_display_under_no_color_or_ci(monkeypatch, env, tmp_path):
    for k in ("NO_COLOR", "CI", "TERM"):
        monkeypatch.delenv(k, raising=False)
    ui.configure(stream=Tty(), cache=tmp_path)
    monkeypatch.setattr("sys.stdout", Tty())
    assert ui.live_display()  # both streams are terminals
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert not ui.live_display()


def test_live_display_on_a_terminal_still_names_the_log(tmp_path):
    t = Tty()
    ui.configure(stream=t, cache=tmp_path, live=True)
    log = tmp_path / "b.log"
    log.write_text("nvcc -c src/device/all_reduce.cu -o x.o\n")
    with ui.step("build deepep", log=log) as s:
        s.update("compiling")
    assert f"full log {log}" in t.getvalue() and "build deepep" in t.getvalue()


def test_verbose_shows_details_and_every_log_line(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("$ make -j2\n/usr/local/cuda/bin/nvcc -O3 -c src/transport/net.cc -o build/obj/net.o\n")
    s = plain(tmp_path)
    with ui.step("build nccl", log=log):
        pass
    quiet = s.getvalue()
    assert f"build nccl: started, first run, no estimate; full log {log}" in quiet
    assert "nvcc" not in quiet  # quiet: the compiler lines stay in the log
    s = plain(tmp_path, verbose=1)
    with ui.step("build nccl", log=log):
        ui.detail("a detail")
    lines = s.getvalue().splitlines()
    assert "a detail" in lines and "  build nccl: $ make -j2" in lines
    assert "  build nccl: nvcc src/transport/net.cc" in lines  # summarised: the tool and its source


def test_cli_takes_v_before_and_after_the_subcommand():
    assert cli.parser().parse_args(["-v", "lock", "check"]).verbose == 1
    assert cli.parser().parse_args(["fetch", "-v", "deepep"]).verbose == 1
    assert cli.parser().parse_args(["gate", "micro"]).verbose == 0


def test_summarise_compiler_lines():
    assert ui.summarise("g++ -O2 -fPIC -c csrc/deep_ep.cpp -o build/deep_ep.o") == "g++ csrc/deep_ep.cpp"
    assert ui.summarise("  plain   words  ") == "plain words"
    assert len(ui.summarise("x" * 500)) == 100
    assert ui.summarise("\x1b[1m\x1b[32mStep 3/9 : RUN make\x1b[0m") == "Step 3/9 : RUN make"  # no colour codes


def test_advance_is_one_plain_line_per_item_never_the_logs_newest_line(tmp_path):
    log = tmp_path / "t.log"
    log.write_text("noise from the command\n")
    s = plain(tmp_path)
    with ui.step("test_ep", total=3, unit="trial", log=log) as st:
        st.update("the log's newest line")
        st.advance()
        st.advance(text="(dense)")
    lines = s.getvalue().splitlines()
    assert lines[1:3] == ["  test_ep: trial 1/3", "  test_ep: trial 2/3 (dense)"] and len(lines) == 4
    s = plain(tmp_path)
    with ui.step("fetch", total=2) as st:
        st.advance(2)
    assert "  fetch: 2/2" in s.getvalue().splitlines()


def test_line_counter_counts_matching_lines_up_to_the_total(tmp_path):
    s = plain(tmp_path)
    with ui.step("runs", total=2, unit="run") as st:
        on_line = ui.line_counter(st, lambda line: line.startswith("go"))
        for line in ("go 1", "other", "go 2", "go 2 again (a doubled output)", "go 3"):
            on_line(line)
    assert [x for x in s.getvalue().splitlines() if x.startswith("  ")] == ["  runs: run 1/2", "  runs: run 2/2"]
    assert st.done == 2


# --------------------------------------------------------------------------- ETAs


def test_eta_from_the_last_run_on_this_host(tmp_path, monkeypatch):
    s = plain(tmp_path)
    ui.record("build nccl", 192.4)
    with ui.step("build nccl"):
        pass
    assert s.getvalue().splitlines()[0] == "build nccl: started, ETA 3 min 12 s (last run)"
    stored = json.loads((tmp_path / "cache" / "timings.json").read_text())
    assert stored["version"] == 1 and stored["hosts"][ui.host()]["build nccl"] < 5  # this run's, replacing 192.4
    monkeypatch.setattr(ui, "host", lambda: "another-host")
    assert ui.eta_text("build nccl") == "first run, no estimate"  # keyed by host


def test_failed_step_is_not_stored(tmp_path):
    s = plain(tmp_path)
    ui.record("test_ep", 50.0)
    with pytest.raises(RuntimeError):
        with ui.step("test_ep"):
            raise RuntimeError("x")
    assert s.getvalue().splitlines()[-1].startswith("test_ep: failed after ")
    assert ui.estimate("test_ep") == 50.0


@pytest.mark.parametrize(
    "content, why",
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe\x00garbage", "not JSON"),
        (b"[" * 200_000 + b"]" * 200_000, "larger than"),
        (b"[" * 100_000, "not JSON"),
        (b'{"version": 1, "hosts": []}', "not a timings file"),
        (b'["version", 1]', "not a timings file"),
        (b'{"version": 99, "hosts": {}}', "not a timings file"),
    ],
)
def test_hostile_timings_file_is_ignored_with_one_warning(tmp_path, content, why):
    s = plain(tmp_path)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "timings.json").write_bytes(content)
    with ui.step("fetch deepep"):
        pass
    with ui.step("fetch nccl"):
        pass
    warnings = [ln for ln in s.getvalue().splitlines() if "warning" in ln]
    assert len(warnings) == 1 and why in warnings[0] and str(tmp_path / "cache" / "timings.json") in warnings[0]
    assert "Traceback" not in s.getvalue()
    doc = json.loads((tmp_path / "cache" / "timings.json").read_text())  # rewritten whole and valid
    assert set(doc["hosts"][ui.host()]) == {"fetch deepep", "fetch nccl"}


def test_bad_entries_are_ignored_the_good_ones_kept(tmp_path):
    s = plain(tmp_path)
    (tmp_path / "cache").mkdir()
    h = ui.host()
    (tmp_path / "cache" / "timings.json").write_text(
        '{"version": 1, "hosts": {"%s": {"a": 12, "b": NaN, "c": -1, "d": "9", "e": true, "f": 1e300}, "x": 5}}' % h
    )
    assert ui.load_timings() == {h: {"a": 12.0}}
    assert "6 entries not a number of seconds" in s.getvalue()


def test_timings_read_is_bounded(tmp_path):
    """/dev/zero as the timings file: an endless file is read up to the bound, then refused."""
    s = plain(tmp_path)
    (tmp_path / "cache").mkdir()
    os.symlink("/dev/zero", tmp_path / "cache" / "timings.json")
    assert ui.load_timings() == {}
    assert f"larger than {ui.MAX_TIMINGS_BYTES} bytes" in s.getvalue()


def test_a_fifo_as_the_timings_file_never_blocks_a_step(tmp_path):
    """hostile-input trial (session 4): a FIFO planted on the shared cache disk would block open() forever."""
    s = plain(tmp_path)
    (tmp_path / "cache").mkdir()
    os.mkfifo(tmp_path / "cache" / "timings.json")
    with ui.step("fetch deepep"):
        pass
    assert "a FIFO, not a file; no step estimates" in s.getvalue() and "fetch deepep: ok in" in s.getvalue()
    assert ui.load_timings()[ui.host()].keys() == {"fetch deepep"}  # replaced by a whole file


def test_unreadable_or_unwritable_timings_never_stop_a_step(tmp_path):
    s = plain(tmp_path)
    (tmp_path / "cache" / "timings.json").mkdir(parents=True)  # a folder where the file should be
    with ui.step("patch deepep"):
        pass
    assert "patch deepep: ok in" in s.getvalue() and "cannot read" in s.getvalue()


STAND_IN_LOCK = SimpleNamespace(stack="campaign")  # the gate runs are faked; the CLI records the lock's stack
LOCAL_TEST = "PASS (local-test, not evidence)"  # report.model.GateReport.label of a self-test profile's pass


def _fake_local_test_pass(g, opts, ctx):
    return GateReport(
        g.stem,
        "local-test",
        "pass",
        "1 check(s) passed",
        evidence=False,
        checks=[evaluate("deepep.c4.errors", "requests", 0, "==", 0)],
    )


def test_gate_runs_get_their_own_folder_and_latest(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner, "run_here", _fake_local_test_pass)
    monkeypatch.setattr(cmd_gate, "load_lock", lambda args: (STAND_IN_LOCK, tmp_path))
    monkeypatch.setattr(
        cmd_gate, "fetch_options", lambda args: type("O", (), {"cache": type("C", (), {"root": tmp_path})})
    )
    monkeypatch.setattr("reprostack.hostenv.host_execution", lambda lock, python: {"mode": "host"})
    assert cli.main(["gate", "vllm", "--profile", "local-test"]) == 3
    first = (tmp_path / "out" / "gate_vllm" / "latest").resolve()
    assert cli.main(["gate", "vllm", "--profile", "local-test"]) == 3
    second = (tmp_path / "out" / "gate_vllm" / "latest").resolve()
    assert first != second and first.parent == second.parent == tmp_path / "out" / "gate_vllm"
    for d in (first, second):  # each run whole in its own folder, nothing of one in the other
        assert sorted(p.name for p in d.iterdir()) == ["junit.xml", "summary.json", "summary.md", "vllm.json"]
    out, err = capsys.readouterr()
    # the local-test pass is labelled wherever it is printed: the CLI's line, the progress line, the reports
    assert "vllm [local-test]: PASS (local-test, not evidence) — 1 check(s) passed" in out
    assert "gate vllm: PASS (local-test, not evidence) in " in err
    summary = json.loads((second / "summary.json").read_text())
    assert summary["gates"][0]["label"] == LOCAL_TEST
    assert f"| {LOCAL_TEST} |" in (second / "summary.md").read_text()
    assert f"{LOCAL_TEST}: 1 check(s) passed" in (second / "junit.xml").read_text()
    # an explicit --out is used as given (shared between the nodes of one run)
    assert cli.main(["gate", "vllm", "--profile", "local-test", "--out", str(tmp_path / "given")]) == 3
    assert (tmp_path / "given" / "summary.json").is_file() and not (tmp_path / "given" / "latest").exists()


def _one_good_vllm_run(tmp_path, monkeypatch) -> tuple[Path, str]:
    """(out/gate_vllm, the run `latest` names) after one local-test pass of gate vllm in `tmp_path`."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner, "run_here", _fake_local_test_pass)
    monkeypatch.setattr(cmd_gate, "load_lock", lambda args: (STAND_IN_LOCK, tmp_path))
    monkeypatch.setattr(
        cmd_gate, "fetch_options", lambda args: type("O", (), {"cache": type("C", (), {"root": tmp_path})})
    )
    monkeypatch.setattr("reprostack.hostenv.host_execution", lambda lock, python: {"mode": "host"})
    assert cli.main(["gate", "vllm", "--profile", "local-test"]) == 3
    base = tmp_path / "out" / "gate_vllm"
    good = os.readlink(base / "latest")
    return base, good


def test_a_run_that_died_at_its_fetch_says_so_in_latest(tmp_path, monkeypatch, capsys):
    """Issue 40 item 2: a failed fetch left `latest` on the previous run, whose summary was then read as this run's
    verdict. Now the run that died writes an ERROR report saying so (never evidence) and `latest` names it; the
    earlier run is untouched; exit 2 with the fetch's line."""
    from reprostack.errors import SourceUnreachable

    base, good = _one_good_vllm_run(tmp_path, monkeypatch)

    def unreachable(g, opts, ctx):
        raise SourceUnreachable("nccl: cannot fetch 1933fdd6360a from https://github.com/NVIDIA/nccl: no network")

    monkeypatch.setattr(runner, "run_here", unreachable)
    capsys.readouterr()
    assert cli.main(["gate", "vllm", "--profile", "local-test"]) == 2
    assert "reprostack: error: nccl: cannot fetch 1933fdd6360a" in capsys.readouterr().err
    died = os.readlink(base / "latest")
    assert died != good
    summary = json.loads((base / died / "summary.json").read_text())
    (g,) = summary["gates"]
    assert (g["gate"], g["result"], g["evidence"]) == ("vllm", "error", False) and summary["exit_code"] != 0
    assert g["reason"].startswith("the run died before the gate ran: nccl: cannot fetch 1933fdd6360a")
    assert json.loads((base / good / "summary.json").read_text())["gates"][0]["result"] == "pass"  # untouched


def test_bad_input_leaves_no_run_folder_and_latest_as_it_was(tmp_path, monkeypatch, capsys):
    base, good = _one_good_vllm_run(tmp_path, monkeypatch)

    def bad_input(g, opts, ctx):
        from reprostack.errors import ReprostackError

        raise ReprostackError("gates/vllm.yaml:3: no profile 'nope'")

    monkeypatch.setattr(runner, "run_here", bad_input)
    assert cli.main(["gate", "vllm", "--profile", "nope"]) == 2
    assert os.readlink(base / "latest") == good and sorted(p.name for p in base.iterdir()) == [good, "latest"]
    from conftest import without_progress

    assert without_progress(capsys.readouterr().err).splitlines()[-1] == (
        "reprostack: error: gates/vllm.yaml:3: no profile 'nope'"
    )


def test_several_nodes_need_one_shared_out(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cmd_gate, "load_lock", lambda args: (STAND_IN_LOCK, tmp_path))
    monkeypatch.setattr(cmd_gate, "fetch_options", lambda args: None)
    assert cli.main(["gate", "micro", "--node-rank", "1", "--master-addr", "10.0.0.1"]) == 2
    assert "needs --out DIR, the same folder on every node" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_nox_gate_session_reads_this_runs_summary_only(tmp_path, monkeypatch):
    """noxfile._gate without --out reads out/gate_<G>/latest/summary.json, which the CLI points at this run's
    folder once its summary is written: a run that crashed leaves `latest` where it was, and the session says this
    run wrote no summary, never reading the earlier run's verdict (issue 40)."""
    noxfile = noxmod.load()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("REPROSTACK_TORCH_PYTHON", "python3")
    monkeypatch.setattr(runner, "run_here", _fake_local_test_pass)
    monkeypatch.setattr(cmd_gate, "load_lock", lambda args: (STAND_IN_LOCK, tmp_path))
    monkeypatch.setattr(cmd_gate, "fetch_options", lambda args: None)
    monkeypatch.setattr("reprostack.hostenv.host_execution", lambda lock, python: {"mode": "host"})

    class Session:
        posargs = ["--profile", "local-test"]

        def run(self, prog, *args, success_codes=(0,)):
            assert prog == "reprostack"
            cli.main(list(args))

        def error(self, msg):
            raise RuntimeError(msg)

    rc, lines = noxfile._gate(Session(), "gate", "vllm")
    assert rc == 3 and lines == ["vllm: PASS (local-test, not evidence) — 1 check(s) passed"]

    def crash(*a):
        raise KeyError("a crash of the tool itself")

    monkeypatch.setattr(runner, "run_here", crash)
    with pytest.raises(RuntimeError, match="this run wrote no summary: .* not this one's verdict"):
        noxfile._gate(Session(), "gate", "vllm")
    assert len([p for p in (tmp_path / "out" / "gate_vllm").iterdir()]) == 3  # two runs + latest; the first intact


# ------------------------------------------------- issue 29 item 10: quiet installs, one wheelhouse list for all


def _noxfile():
    return noxmod.load()


def test_wheelhouse_folders_joined_by_colon_reach_pip_as_one_find_links_each(tmp_path, monkeypatch):
    """Issue 29 item 10: REPROSTACK_WHEELHOUSE=A:B (as the device scripts set it) reached pip in the nox session and
    in the AIPerf venv as one `--find-links A:B`, a folder that does not exist, which pip ignores: `No matching
    distribution found`. Now every reader takes the same list, one --find-links per folder; a real pip installs a
    wheel from A whose dependency is only in B."""
    import subprocess
    import sys

    from wheelindex import make_wheel

    from reprostack.fetch.wheels import pip_find_links, wheelhouses_from_env

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    make_wheel(a, "rs-top", "1.0", requires=("rs-dep==2.0",))
    make_wheel(b, "rs-dep", "2.0")
    joined = f"{a}{os.pathsep}{b}"
    monkeypatch.setenv("REPROSTACK_WHEELHOUSE", joined)
    want = ["--no-index", "--find-links", str(a), "--find-links", str(b)]
    assert pip_find_links(wheelhouses_from_env()) == want
    assert _noxfile().find_links(joined) == want and _noxfile().find_links(None) == []
    from reprostack.gates import aiperftool

    log = tmp_path / "pip.log"
    aiperftool._pip(Path(sys.executable), ["install", "--target", str(tmp_path / "site"), "rs-top==1.0"], log)
    assert (tmp_path / "site" / "rs_dep" / "__init__.py").is_file(), log.read_text()
    assert f"--find-links {a} --find-links {b}" in log.read_text()
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--target", str(tmp_path / "t2"), *want, "rs-top==1.0"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr


def test_nox_installs_quietly_from_every_wheelhouse_folder(tmp_path, monkeypatch):
    """Issue 29 item 10: the nox sessions printed pip's every line (`silent=False`); now pip's output shows only when
    it fails or under `nox -v` (nox's silent), one log line says what happens, and the wheelhouse list is split."""
    nf = _noxfile()
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    monkeypatch.setenv("REPROSTACK_WHEELHOUSE", f"/w/one{os.pathsep}/w/two")
    calls, logs = [], []

    class Session:
        virtualenv = SimpleNamespace(location=str(tmp_path / "venv"))
        venv_backend = "virtualenv"
        env: dict = {}

        def install(self, *args, **kw):
            calls.append((args, kw))

        def log(self, msg):
            logs.append(msg)

    (tmp_path / "venv").mkdir()
    nf._install(Session(), "[test]")
    ((args, kw),) = calls
    assert kw == {"silent": True}
    assert args == ("--no-index", "--find-links", "/w/one", "--find-links", "/w/two", ".[test]")
    assert logs and "pip's output on failure or with nox -v" in logs[0]


def test_project_license_is_an_spdx_expression():
    """Issue 29 item 10: `license = {text = "Apache-2.0"}` made setuptools 80 warn that a TOML table for
    `project.license` is deprecated on every install; it is now an SPDX expression (PEP 639), checked with packaging's
    own SPDX reader."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    from packaging.licenses import canonicalize_license_expression

    lic = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["license"]
    assert isinstance(lic, str) and canonicalize_license_expression(lic) == lic == "Apache-2.0"


def _progress_lines(tmp_path, every_s: str, files: dict, *args: str) -> list[str]:
    """The `[progress]` lines of a real `pytest -q` run (plugin tests/progress.py) over `files` (name: sleeping tests)
    in tmp_path, with `args` (xdist's)."""
    import subprocess
    import sys

    for name, (n, sleep_s) in files.items():
        (tmp_path / name).write_text(
            "import time\n" + "".join(f"def test_{i}():\n    time.sleep({sleep_s})\n" for i in range(n))
        )
    env = {**os.environ, "REPROSTACK_TEST_PROGRESS_S": every_s, "PYTHONPATH": str(Path(__file__).parent)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "progress", "-p", "no:cacheprovider", *args, *files]
    r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return [l for l in r.stdout.splitlines() if l.startswith("[progress] ")]


def test_a_long_test_file_shows_progress_under_q(tmp_path):
    """Issue 29 item 11: under `pytest -q` a file of slow tests printed one dot per test, minutes apart, nothing else.
    The plugin tests/progress.py (conftest loads it) prints one line every $REPROSTACK_TEST_PROGRESS_S seconds in a
    file: which file, how many of its tests, time in it and in all. A real pytest run of slow real tests."""
    lines = _progress_lines(tmp_path, "0.5", {"test_slow_here.py": (4, 0.3)})
    assert lines and all(
        re.match(r"\[progress\] test_slow_here\.py: [1-4] of 4 tests, \d+ s in this file, ", l) for l in lines
    )


def test_progress_under_xdist_keeps_each_files_count_and_time(tmp_path):
    """`nox -s tests` runs files on 2 pytest-xdist workers: the controller gets the reports of two files interleaved.
    The old plugin kept one "current file" (its time reset on every switch) and knew no counts there (`1 of ?`): each
    line now names its file's own count (from the workers' collection) and the time since that file's first test."""
    files = {"test_slow_a.py": (5, 0.4), "test_slow_b.py": (5, 0.4)}
    lines = _progress_lines(tmp_path, "0.3", files, "-n", "2", "--dist", "loadfile")
    got = [re.match(r"\[progress\] (test_slow_[ab]\.py): ([1-5]) of 5 tests, (\d+) s in this file, ", l) for l in lines]
    assert len(lines) >= 2 and all(got), lines  # `of 5`: the old plugin said `of ?` under xdist
    assert max(int(m.group(3)) for m in got) >= 1, lines  # a file's time runs on across the other's reports


def test_a_gate_session_exits_non_zero_unless_the_gate_passed(monkeypatch):
    """Issue 39: `nox -s gate_micro` on a host with no profile SKIPped and nox exited 0. Now a SKIP (the summary's
    exit code 3) ends nox with exit 3, a failure with nox's error (exit 1), a pass returns."""
    noxfile = _noxfile()
    said = []

    class Session:
        def warn(self, msg):
            said.append(msg)

        def error(self, msg):
            raise RuntimeError(msg)

        def skip(self, msg):  # what it did on 8bb97a9: nox then exits 0
            raise AssertionError(f"a skipped session makes nox exit 0: {msg}")

    monkeypatch.setattr(noxfile, "_install", lambda session: None)
    for rc, line in ((3, "micro: SKIP — no profile for this host"), (1, "micro: FAIL — dc_p50_us"), (0, "micro: PASS")):
        monkeypatch.setattr(noxfile, "_gate", lambda session, *c, rc=rc, line=line: (rc, [line]))
        if rc == 3:
            with pytest.raises(SystemExit) as e:
                noxfile._one_gate(Session(), "micro")
            assert e.value.code == 3 and said[-1] == "not a pass (SKIP, exit 3): micro: SKIP — no profile for this host"
        elif rc == 1:
            with pytest.raises(RuntimeError, match="gate failed: micro: FAIL"):
                noxfile._one_gate(Session(), "micro")
        else:
            assert noxfile._one_gate(Session(), "micro") is None
