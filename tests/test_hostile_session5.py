"""Hostile input against what session 5 changed (docs/reliability.md, 'Hostile-input trial (session 5)'): forged
one-NCCL records in the trials driver's log, the toolchain probe cache, the bytecode prewarm, the progress hook."""

from __future__ import annotations

import os
import socket

import pytest

from gaterun import run as run_gate_here

from reprostack.gates import micro
from test_gate_micro_flow import before_done, gpu_host, options, stand_in_python  # noqa: F401 (gpu_host: a fixture)
from trialslog import marker, real_ep1_texts, trials_log


def _lib(tmp_path) -> str:
    return os.path.realpath(tmp_path / "builds/nccl/build/lib/libnccl.so.2")


def _nccl(tmp_path, **kw) -> str:
    rec = dict(event="nccl", host=socket.gethostname(), runtime="2.30.4", mapped=[_lib(tmp_path)], deleted=[])
    rec.update(kw)
    return marker(**rec)


def _run(tmp_path, text: str, **kw):
    return run_gate_here(options(tmp_path, stand_in_python(tmp_path, text, **kw), profile="h200-ep1", trials=3))


@pytest.mark.parametrize(
    "case, why",
    [
        ("ghost-rank", "rank 5: a one-NCCL record out of its place"),
        ("dup-disagree", "rank 0: 2 one-NCCL records"),
        ("dup-same", "rank 0: 2 one-NCCL records"),
        ("rank-list", "rank [0]: a one-NCCL record out of its place"),
        ("rank-str", "rank '0': a one-NCCL record out of its place"),
        ("huge-mapped", "rank 0: expected exactly one NCCL"),
        ("runtime-dict", "rank 0: ncclGetVersion gave no version string"),
        ("runtime-nan", "rank 0: ncclGetVersion gave no version string"),
        ("host-list", "no rank on this host"),
        ("deep-json", "[micro_trials] record not JSON: nested too deeply"),
        ("mimic-in-test-ep", "rank 0: a one-NCCL record out of its place"),
        ("after-done", "rank 0: a one-NCCL record out of its place"),
    ],
)
def test_forged_one_nccl_records_never_pass(tmp_path, gpu_host, case, why):
    text = trials_log(real_ep1_texts(3))
    kw: dict = {}
    (tmp_path / "builds/nccl/build/lib").mkdir(parents=True, exist_ok=True)
    if case == "ghost-rank":
        text = before_done(text, _nccl(tmp_path, rank=5))
    elif case == "dup-disagree":
        text = before_done(text, _nccl(tmp_path, rank=0, runtime="2.30.5"))
    elif case == "dup-same":
        text = before_done(text, _nccl(tmp_path, rank=0))
    elif case == "rank-list":
        kw["nccl_runtime"] = None
        text = before_done(text, _nccl(tmp_path, rank=[0]))
    elif case == "rank-str":
        kw["nccl_runtime"] = None
        text = before_done(text, _nccl(tmp_path, rank="0"))
    elif case == "huge-mapped":
        kw["mapped"] = [_lib(tmp_path)] + ["/x" * 1000] * 2000
    elif case == "runtime-dict":
        kw["nccl_runtime"] = None
        text = before_done(text, _nccl(tmp_path, rank=0, runtime={"v": "2.30.4"}))
    elif case == "runtime-nan":
        kw["nccl_runtime"] = None
        text = before_done(text, _nccl(tmp_path, rank=0).replace('"2.30.4"', "NaN"))
    elif case == "host-list":
        kw["nccl_runtime"] = None
        text = before_done(text, _nccl(tmp_path, rank=0, host=[socket.gethostname()]))
    elif case == "deep-json":
        text = before_done(text, "[micro_trials] " + "[" * 200000)
    elif case == "mimic-in-test-ep":
        # a rank that never left its own record, and a line of test_ep's output that mimics the tag
        kw["nccl_runtime"] = None
        t = real_ep1_texts(3)
        t[1] = t[1] + "\n" + "some test_ep text " + _nccl(tmp_path, rank=0)
        text = trials_log(t)
    elif case == "after-done":
        kw["nccl_runtime"] = None
        text += _nccl(tmp_path, rank=0) + "\n"
    rep = _run(tmp_path, text, **kw)
    assert rep.result in ("error", "fail") and why in rep.reason, rep.reason[:500]
    assert "\n" not in rep.reason and len(rep.reason) < 2000


def _kern(tmp_path, accept_sha256=None):
    from types import SimpleNamespace

    lib = tmp_path / "lib"
    lib.mkdir(exist_ok=True)
    (lib / "libnccl.so.2").write_bytes(b"pinned")
    return SimpleNamespace(nccl_lib=lib, accept_sha256=accept_sha256, nccl_version="2.30.4")


def _rec(rank, mapped, **kw):
    return {"event": "nccl", "rank": rank, "host": "h", "runtime": "2.30.4", "mapped": mapped, "deleted": [], **kw}


def test_one_nccl_every_local_rank_once_and_in_range(tmp_path):
    from reprostack.errors import BuildError

    kern = _kern(tmp_path)
    lib = str((tmp_path / "lib/libnccl.so.2").resolve())
    ok = micro.one_nccl_of_ranks([_rec(0, [lib]), _rec(1, [lib])], kern, "h", num_ranks=2, all_local=True)
    assert ok["ranks"] == [0, 1]
    for recs, why in [
        ([_rec(0, [lib])], "rank 1: no one-NCCL record"),  # a rank that left none, on one node
        ([_rec(0, [lib]), _rec(1, [lib]), _rec(2, [lib])], "rank 2: a one-NCCL record for no rank of this run"),
        ([_rec(0, [lib]), _rec(True, [lib])], "rank True: a one-NCCL record for no rank"),
        ([_rec(0, [lib]), _rec(1, [lib], runtime="2.30.5")], "different NCCL versions: {0: '2.30.4', 1: '2.30.5'}"),
    ]:
        with pytest.raises(BuildError, match=None) as e:
            micro.one_nccl_of_ranks(recs, kern, "h", num_ranks=2, all_local=True)
        assert why in str(e.value), str(e.value)


def test_one_nccl_a_fifo_or_device_named_by_a_record_is_never_read(tmp_path):
    """With accept_sha256 (a prebuilt image's copy), a mapped path is hashed: a FIFO or /dev/zero would never end."""
    import hashlib
    from reprostack.errors import BuildError

    kern = _kern(tmp_path, accept_sha256=hashlib.sha256(b"pinned").hexdigest())
    fifo = tmp_path / "libnccl.so.2"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero"):
        with pytest.raises(BuildError, match="rank 0: expected exactly one NCCL"):
            micro.one_nccl_of_ranks([_rec(0, [path])], kern, "h", num_ranks=1, all_local=True)
    copy = tmp_path / "copy.so"
    copy.write_bytes(b"pinned")  # a real copy with the pinned bytes is still accepted
    assert micro.one_nccl_of_ranks([_rec(0, [str(copy)])], kern, "h", num_ranks=1, all_local=True)["ranks"] == [0]


# -- the toolchain probe cache (kernels.toolchain._cached_probe) ---------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "unreadable", "symlink-to-good", "dangling"])
def test_a_cache_file_that_is_no_regular_file_is_probed_again_never_read(tmp_path, monkeypatch, kind):
    """A FIFO would block the read forever, /dev/zero would never end; a symlink (even to a good probe elsewhere on
    the shared disk) is not the file the tool wrote. Each is probed again, never trusted, never a hang."""
    from test_toolchain_probe import _runs, _world

    from reprostack.kernels import toolchain

    py, _, count = _world(tmp_path, monkeypatch)
    cache = tmp_path / "cache"
    toolchain.detect(py, arch="90", cache=cache)
    (f,) = (cache / "toolchain").iterdir()
    good = tmp_path / "good.json"
    good.write_bytes(f.read_bytes())
    f.unlink()
    if kind == "fifo":
        os.mkfifo(f)
    elif kind == "dev-zero":
        f.symlink_to("/dev/zero")
    elif kind == "directory":
        f.mkdir()
    elif kind == "unreadable":
        f.write_bytes(good.read_bytes())
        f.chmod(0)
        if os.access(f, os.R_OK):
            pytest.skip("running as root: a mode-0 file is readable")
    elif kind == "symlink-to-good":
        f.symlink_to(good)
    elif kind == "dangling":
        f.symlink_to(tmp_path / "nowhere")
    tc = toolchain.detect(py, arch="90", cache=cache)
    assert _runs(count) == 2 and tc.torch == "2.11.0+cu130"


def test_a_read_only_cache_dir_is_probed_every_time(tmp_path, monkeypatch):
    from test_toolchain_probe import _runs, _world

    from reprostack.kernels import toolchain

    py, _, count = _world(tmp_path, monkeypatch)
    cache = tmp_path / "cache"
    (cache / "toolchain").mkdir(parents=True)
    (cache / "toolchain").chmod(0o555)
    try:
        toolchain.detect(py, arch="90", cache=cache)
        toolchain.detect(py, arch="90", cache=cache)
    finally:
        (cache / "toolchain").chmod(0o755)
    assert _runs(count) == 2 or os.geteuid() == 0


@pytest.mark.parametrize(
    "field, value",
    [
        ("stdlib", "relative/lib"),
        ("stdlib", "/usr/lib/python3.12\n/etc"),
        ("torch", "2.11.0\x00"),
    ],
)
def test_a_cached_probe_with_odd_paths_is_probed_again(tmp_path, monkeypatch, field, value):
    """A forged probe whose witness matches (the attacker can stat the same files) may still not carry a path that
    is not absolute, or holds a control character: what the build and the prewarm do with it is probed, not read."""
    import json

    from test_toolchain_probe import _runs, _world

    from reprostack.kernels import toolchain

    py, _, count = _world(tmp_path, monkeypatch)
    cache = tmp_path / "cache"
    toolchain.detect(py, arch="90", cache=cache)
    (f,) = (cache / "toolchain").iterdir()
    d = json.loads(f.read_text())
    d["probe"][field] = value
    d["witness"] = toolchain._probe_witness(py, d["probe"])  # the witness still matches
    f.write_text(json.dumps(d))
    tc = toolchain.detect(py, arch="90", cache=cache)
    assert _runs(count) == 2 and getattr(tc, field) != value


# -- the bytecode prewarm (kernels.bytecode) -----------------------------------------------------------------------


def _written(root) -> set[str]:
    return {str(p) for p in root.rglob("*.pyc")}


def test_a_path_holding_the_old_map_syntax_never_redirects_writes_outside_the_prefix(tmp_path, monkeypatch):
    """The maps were once `SRC=>DEST` / `SRC!NAME` arguments split on those tokens: a stdlib dir named
    `/evil=>../../../victim` (a forged probe cache) sent the .pycs of /evil's files to a relative DEST, which the
    prefix's cache_from_source joins to the cwd, `..` and all: outside the prefix. Now JSON: the name is a name."""
    import sys

    from test_bytecode import _site

    from reprostack.kernels import bytecode, runtime

    site, lib, std = _site(tmp_path)
    overlay = runtime.make_overlay(site, lib, tmp_path / "build" / "overlay")
    prefix = tmp_path / "cache" / "pycache"
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "payload.py").write_text("P = 1\n")
    victim = tmp_path / "victim"
    up = "../" * (len(tmp_path.parts) + 8)
    weird = tmp_path / "x=>y!torch\nz"
    (weird / "pkg").mkdir(parents=True)
    (weird / "pkg" / "odd.py").write_text("Q = 1\n")
    monkeypatch.chdir(tmp_path)
    got = bytecode.start(
        sys.executable,
        prefix,
        site,
        overlay,
        jobs=1,
        stdlib_dirs=[f"{evil}=>{up}{str(victim).lstrip('/')}", str(std), str(weird)],
    ).finish()
    assert got["compiled"] and not got["cut"], got
    everything = {str(p) for p in tmp_path.rglob("*.pyc")}
    assert everything == _written(prefix), everything - _written(prefix)  # nothing outside the prefix
    assert not victim.exists()
    assert any(p.endswith("odd.cpython-%d%d.pyc" % sys.version_info[:2]) for p in everything)


def test_a_fifo_a_device_and_a_symlink_loop_in_the_site_never_hang_the_prewarm(tmp_path):
    import sys

    from test_bytecode import _site

    from reprostack.kernels import bytecode, runtime

    site, lib, std = _site(tmp_path)
    overlay = runtime.make_overlay(site, lib, tmp_path / "build" / "overlay")
    os.mkfifo(site / "torch" / "fifo.py")
    (site / "torch" / "zero.py").symlink_to("/dev/zero")
    (site / "otherpkg" / "loop").symlink_to(site / "otherpkg")
    (site / "torch" / "nn" / "self").symlink_to("..")
    got = bytecode.start(sys.executable, tmp_path / "pyc", site, overlay, jobs=1, stdlib_dirs=[str(std)]).finish(
        bound_s=120
    )
    assert got["cut"] is False and got["compiled"] >= 5, got  # finished by itself: nothing waited on the FIFO


def test_a_prefix_that_cannot_be_made_is_no_prewarm_never_a_broken_build(tmp_path):
    import sys

    from test_bytecode import _site

    from reprostack.kernels import bytecode, runtime

    site, lib, std = _site(tmp_path)
    overlay = runtime.make_overlay(site, lib, tmp_path / "build" / "overlay")
    afile = tmp_path / "afile"
    afile.write_text("")
    got = bytecode.start(sys.executable, afile / "pycache", site, overlay, jobs=1, stdlib_dirs=[str(std)]).finish()
    assert got["compiled"] is None and got["note"].startswith("no prewarm: "), got
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        got = bytecode.start(sys.executable, ro, site, overlay, jobs=1, stdlib_dirs=[str(std)]).finish()
    finally:
        ro.chmod(0o755)
    assert got["cut"] is False and got["compiled"] is not None  # each file that cannot be written is skipped


# -- the progress hook (run_with_watchdog(on_line=), ui.line_counter, deepep_trial_started) -------------------------


def test_output_without_newlines_reaches_the_callback_in_bounded_pieces_and_the_log_whole(tmp_path):
    """A binary dump of 5 MiB without a newline, a marker glued to its end, a flood of 10,000 markers, garbage
    bytes: the log gets every byte; the callback never holds more than 1 MiB, never sees the glued marker as a line
    start, and the counter stops at its total."""
    from test_watchdog import run_py

    from reprostack import ui
    from reprostack.gates.parsers.micro_trials import deepep_trial_started

    mark = '[micro_trials] {"event": "trial", "arm": "deepep", "rank": 0, "trial": 0}'
    code = (
        "import sys\n"
        "w = sys.stdout.buffer.write\n"
        "w(b'\\xff\\xfe\\x00garbage' * (5 * 2**20 // 10))\n"
        f"w({mark!r}.encode() + b'\\n')\n"
        f"w(({mark!r} + '\\n').encode() * 10000)\n"
        "w(b'\\x1b[31m' + b'\\xc3' * 5000 + b'\\n')\n"
    )
    sizes: list[int] = []
    st = ui.Step("t", "t", 3, "trial")
    count = ui.line_counter(st, deepep_trial_started)

    def on_line(line: str) -> None:
        sizes.append(len(line))
        count(line)

    out = run_py(tmp_path, code, on_line=on_line, timeout_s=60)
    assert out.returncode == 0
    assert (tmp_path / "logs" / "run.log").stat().st_size == 5 * 2**20 // 10 * 10 + (len(mark) + 1) * 10001 + 5006
    assert max(sizes) <= 1 << 20 and len(sizes) == 1 + 10000 + 1
    assert st.done == 3


def test_markers_with_unhashable_or_mixed_ranks_are_problems_never_a_traceback():
    from reprostack.gates.parsers.micro_trials import parse_micro_trials

    text = "".join(
        marker(event=e, rank=r, arm=a, trial=0) + "\n"
        for e, r, a in [
            ("trial", [0], "deepep"),
            ("trial", "x", "deepep"),
            ("trial", 5, ["deepep"]),
            ("done", {"r": 0}, None),
            ("nccl", [1], None),
        ]
    )
    tp = parse_micro_trials(text, num_ranks=1, trials=1)
    assert not tp.complete and any("unexpected rank/arm '[0]'/'deepep'" in p for p in tp.problems), tp.problems
    assert tp.nccl_misplaced and tp.nccl_misplaced[0][1] == [1]


def test_the_real_h200_logs_records_are_in_their_place():
    """The order rule (a record after the rank's last trial, before its done) holds on the driver's real output."""
    from pathlib import Path

    from reprostack.gates.parsers.micro_trials import parse_micro_trials

    log = Path(__file__).resolve().parents[1] / "results/gate_micro/2026-12-02-h200-ep1-k5-gin-gdaki/micro/test_ep.log"
    tp = parse_micro_trials(log.read_text(errors="replace"), num_ranks=1, trials=5, arms=("deepep", "dense"))
    assert tp.complete and len(tp.nccl) == 1 and tp.nccl_misplaced == []
