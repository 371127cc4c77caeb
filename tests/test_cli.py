"""`reprostack` CLI, called in-process (reprostack.cli.main): exit codes 0 / 2 / 3 and what it prints.

The stack's lock names public-looking URLs (https://example.invalid/org/...) and every fetch goes through
`--mirror URL=PATH` to local server folders, as an operator behind a mirror would run it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
from pathlib import Path

import pytest
import yaml

import noxmod
from conftest import without_progress
from reprostack.cli import main
from reprostack import sources
from reprostack.lock import load
from test_sources import make_stack, take_servers_away, write_project

REPO_ROOT = Path(__file__).resolve().parents[1]
BASE_URL = "https://example.invalid/org"


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """No env mirrors, a default cache inside tmp_path, and a PATH without nvidia-smi (only git)."""
    monkeypatch.delenv("REPROSTACK_MIRRORS", raising=False)
    monkeypatch.delenv("REPROSTACK_CUDA_ARCH", raising=False)
    monkeypatch.setenv("REPROSTACK_CACHE", str(tmp_path / "default-cache"))
    bin_dir = tmp_path / "bin-no-gpu"
    bin_dir.mkdir()
    os.symlink(shutil.which("git"), bin_dir / "git")
    monkeypatch.setenv("PATH", str(bin_dir))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """Exit code, stdout, and stderr without the progress lines."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, without_progress(err)


@pytest.fixture
def world(tmp_path):
    """(stack, lock path, common args: --lock, --cache, --mirror)."""
    stack = make_stack(tmp_path / "srv")
    lock = write_project(tmp_path / "project", stack, base=BASE_URL)
    args = ["--lock", str(lock), "--cache", str(tmp_path / "cache"), "--mirror", f"{BASE_URL}={stack.srv}"]
    return stack, lock, args


# --------------------------------------------------------------------------- lock check


def test_lock_check_real_lock(capsys):
    lock = REPO_ROOT / "upstreams.lock"
    code, out, err = run(capsys, "lock", "check", "--lock", str(lock))
    assert code == 0 and err == ""
    n = len(yaml.safe_load(lock.read_text())["upstreams"])
    assert out.strip() == f"{lock}: ok ({n} pins, sha256 {hashlib.sha256(lock.read_bytes()).hexdigest()})"


def test_lock_check_finds_the_project_root(tmp_path, monkeypatch, capsys):
    (tmp_path / "proj" / "sub" / "dir").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "upstreams.lock", tmp_path / "proj" / "upstreams.lock")
    shutil.copytree(REPO_ROOT / "patches", tmp_path / "proj" / "patches")  # the lock names its patch files
    monkeypatch.chdir(tmp_path / "proj" / "sub" / "dir")
    code, out, _ = run(capsys, "lock", "check")
    assert code == 0 and out.startswith(f"{tmp_path / 'proj' / 'upstreams.lock'}: ok (")


def test_lock_check_bad_lock(tmp_path, capsys):
    text = (REPO_ROOT / "upstreams.lock").read_text()
    line = next(i for i, l in enumerate(text.splitlines(), 1) if "rev: 1933fdd6" in l)
    bad = tmp_path / "upstreams.lock"
    bad.write_text(text.replace("rev: 1933fdd6360a8bfccaa0166bd71bce363d32e5b6", "rev: refs/tags/v2.30.4-1"))
    code, out, err = run(capsys, "lock", "check", "--lock", str(bad))
    assert code == 2 and out == ""
    assert err.startswith(f"reprostack: error: {bad}:{line}: upstreams.nccl.rev: 'refs/tags/v2.30.4-1' does not match")
    assert "a mutable ref or short id is not a pin" in err


def test_error_lines_show_control_characters_escaped(tmp_path, capsys):
    """hostile-input trial (session 4): a value quoted into an error (here a path with a terminal title escape,
    a clear-screen and a CR) never reaches the terminal raw."""
    bad = tmp_path / "x\x1b]0;owned\x07\x1b[2J\rupstreams.lock"
    assert main(["lock", "check", "--lock", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", err), err
    assert "x\\x1b]0;owned\\x07\\x1b[2J\\x0dupstreams.lock" in err


def test_usage_error_is_argparse_exit_2(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["lock", "verify"])
    assert ei.value.code == 2
    assert "invalid choice: 'verify'" in capsys.readouterr().err


# --------------------------------------------------------------------------- fetch / patch / bundle / gate


def test_fetch_patch_bundle_then_gate_offline(world, tmp_path, capsys):
    stack, lock, args = world

    code, out, err = run(capsys, "fetch", *args)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"deepep: {stack.rev} tree {stack.tree} ok (1 submodule(s))",
        f"nccl: {stack.nccl_rev} tree {stack.nccl_tree} ok (0 submodule(s))",
    ]

    code, out, err = run(capsys, "patch", "deepep", *args)
    trees = tmp_path / "cache" / "trees"
    assert (code, err) == (0, "")
    key = sources.tree_key(load(lock).git("deepep"))
    assert out.strip() == f"deepep: {trees / key} tree {stack.patched}"
    code, out, _ = run(capsys, "patch", "deepep", *args)
    assert code == 0 and out.strip().endswith("(reused)")

    archive = tmp_path / "carry" / "sources.tar"
    code, out, err = run(capsys, "bundle", "-o", str(archive), *args)
    assert (code, err) == (0, "")
    assert out.strip() == f"{archive}: {archive.stat().st_size} bytes (deepep, nccl)"
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {"manifest.json", "deepep.bundle", "deepep--third-party+fmt.bundle", "nccl.bundle"} <= names

    # a node without network: servers gone, a fresh cache, only the bundle
    take_servers_away(stack)
    out_dir = tmp_path / "reports"
    code, out, err = run(
        capsys,
        "gate",
        "micro",
        "--lock",
        str(lock),
        "--cache",
        str(tmp_path / "node-cache"),
        "--offline",
        "--bundle",
        str(archive),
        "--out",
        str(out_dir),
    )
    assert code == 3, err
    assert out.splitlines()[0].startswith("micro [-]: SKIP — no GPU on this host")
    doc = json.loads((out_dir / "micro.json").read_text())
    assert doc["result"] == "skip" and "no GPU" in doc["reason"]
    assert doc["provenance"]["upstreams"]["deepep"]["patched_tree"] == stack.patched
    assert json.loads((out_dir / "summary.json").read_text())["exit_code"] == 3
    assert "<skipped" in (out_dir / "junit.xml").read_text()
    assert sorted(os.listdir(tmp_path / "node-cache" / "trees")) == [key, f"nccl-{stack.nccl_tree}"]


def test_all_gates_without_gpu_is_not_a_pass(tmp_path, capsys):
    from test_gate_training import training_project

    root, _ = training_project(tmp_path)
    shutil.copy(REPO_ROOT / "gates" / "micro.yaml", root / "gates" / "micro.yaml")
    args = ["--lock", str(root / "upstreams.lock"), "--cache", str(tmp_path / "cache")]
    code, out, _ = run(capsys, "all-gates", *args, "--out", str(tmp_path / "reports"))
    assert code == 3 and "micro [-]: SKIP" in out
    # in dependency order after micro, and never a pass: megatron requires micro, nemo-rl requires megatron
    assert "megatron [-]: NOT-RUN — not run: required gate micro did not pass (SKIP)\n" in out
    assert "nemo-rl [-]: NOT-RUN — not run: required gate megatron was not run either (root cause: gate micro)" in out
    assert out.index("micro [-]") < out.index("megatron [-]") < out.index("nemo-rl [-]")
    # issue 29 item 9: one short line per gate, the gate named as it is typed, micro's reason said once
    lines = out.splitlines()
    assert len(lines) == 5 and "nemo_rl [" not in out and out.count("no GPU") == 1, out
    assert lines[-1].startswith("unsigned: no key at ") or lines[-1].startswith("attested: ")  # the run's last line
    assert max(len(l) for l in lines[1:3]) < 120


def test_offline_empty_cache_no_bundle_says_how_to_get_sources(world, tmp_path, capsys):
    _, _, args = world
    for cmd in (["fetch"], ["patch"], ["gate", "micro", "--out", str(tmp_path / "reports")]):
        code, out, err = run(capsys, *cmd, *args, "--offline")
        assert code == 2, cmd
        assert re.match(
            r"reprostack: error: (deepep|nccl): https://example\.invalid/org/\1 @ [0-9a-f]{12} is not in "
            r"the cache ",
            err,
        ), err
        assert "is not in the cache" in err and "no bundle was given" in err
        assert "run `reprostack fetch`, then `reprostack bundle`" in err and "pass it with --bundle" in err
    # the gate's run died at its fetch: its folder holds only an ERROR report saying so (issue 40 item 2: `latest` is
    # never an earlier run's verdict), never evidence
    rep = json.loads((tmp_path / "reports" / "micro.json").read_text())
    assert rep["result"] == "error" and rep["evidence"] is False
    assert rep["reason"].startswith("the run died before the gate ran: ") and "is not in the cache" in rep["reason"]


def test_without_mirror_the_public_url_is_unreachable(world, tmp_path, capsys):
    _, lock, _ = world
    code, _, err = run(
        capsys,
        "fetch",
        "nccl",
        "--lock",
        str(lock),
        "--cache",
        str(tmp_path / "c"),
        "--mirror",
        "https://example.invalid/other/=/nonexistent/",
    )
    assert code == 2 and err.startswith("reprostack: error: nccl: cannot fetch ")
    assert "https://example.invalid/org/nccl" in err
    assert "hint: without access to the upstream hosts" in err and "--offline --bundle FILE" in err


def test_mirror_prefix_with_trailing_slash(world, tmp_path, capsys):
    stack, lock, _ = world
    code, _, err = run(
        capsys,
        "fetch",
        "nccl",
        "--lock",
        str(lock),
        "--cache",
        str(tmp_path / "c"),
        "--mirror",
        f"{BASE_URL}/={stack.srv}/",
    )
    assert (code, err) == (0, "")


def test_bad_mirror_argument(world, capsys):
    _, lock, _ = world
    code, _, err = run(capsys, "fetch", "--lock", str(lock), "--mirror", "no-equals-sign")
    assert code == 2 and err.strip() == "reprostack: error: --mirror 'no-equals-sign': expected URL=PATH"


def test_unknown_pin(world, capsys):
    _, lock, args = world
    code, _, err = run(capsys, "fetch", "deep-ep", *args)
    assert (
        code == 2 and err.strip() == f"reprostack: error: {lock}: upstreams.deep-ep: no such pin (known: deepep, nccl)"
    )


def test_typo_profile_is_an_error_even_without_gpu(world, tmp_path, capsys):
    _, _, args = world
    out = tmp_path / "reports"
    code, _, err = run(capsys, "gate", "micro", *args, "--profile", "nosuch", "--out", str(out))
    assert (
        code == 2
        and "no profile 'nosuch' (known: h100-ep1, h200-ep1, h200-nvl-ep2, h200-nvl-ep4, h200-nvl-ep8, p5en-efa-ep16)"
        in err
    )
    assert not (out / "summary.json").exists()


@pytest.mark.parametrize(
    "extra,msg",
    [
        (["--arm", "dense"], "--arm 'dense': give a comma list of deepep, dense that includes deepep"),
        (["--arm", "deepep,sparse"], "(unknown: sparse)"),
        (["--profile", "h200-ep1", "--legacy"], "--legacy: tests/legacy/test_intranode.py runs at EP 2, 4, 8 only"),
        (["--profile", "p5en-efa-ep16", "--legacy"], "is intranode only; profile p5en-efa-ep16 spans 2 nodes"),
    ],
)
def test_impossible_arm_requests_are_errors_before_anything_runs(world, tmp_path, capsys, extra, msg):
    _, _, args = world
    out = tmp_path / "reports"
    code, _, err = run(capsys, "gate", "micro", *args, *extra, "--out", str(out))
    assert code == 2 and msg in err, err
    assert not (out / "summary.json").exists()


def test_internal_error_is_exit_2_never_1(world, tmp_path, capsys, monkeypatch):
    """A crash of the tool must not look like a gate verdict (1 = a gate failed)."""
    from reprostack import sources

    _, _, args = world

    def crash(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(sources, "fetch", crash)
    code, _, err = run(capsys, "fetch", *args)
    assert code == 2 and "internal error" in err and "Traceback" in err


def test_a_named_bundle_is_checked_even_with_a_warm_cache(world, tmp_path, capsys):
    _, _, args = world
    assert run(capsys, "fetch", *args)[0] == 0  # warm: every pin verified in the cache
    archive = tmp_path / "sources.tar"
    assert run(capsys, "bundle", *args, "-o", str(archive))[0] == 0
    assert run(capsys, "fetch", *args, "--offline", "--bundle", str(archive))[0] == 0
    code, _, err = run(capsys, "fetch", *args, "--offline", "--bundle", str(tmp_path / "nope.tar"))
    assert code == 2 and f"bundle {tmp_path / 'nope.tar'}: cannot read the archive" in err
    assert "hint:" not in err  # not a network problem
    raw = bytearray(archive.read_bytes())
    with tarfile.open(archive) as t:
        m = t.getmember("deepep.bundle")
    raw[m.offset_data + 40] ^= 0xFF
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(raw))
    code, _, err = run(capsys, "fetch", *args, "--offline", "--bundle", str(bad))
    assert code == 2 and "deepep.bundle is corrupted" in err


# --------------------------------------------------------------------------- untrusted lock: URLs git could run


@pytest.mark.parametrize("where", ["url", "submodule"])
@pytest.mark.parametrize("url", ['"--upload-pack=touch {m}"', '"ext::sh -c touch% {m}"', "-oProxyCommand=x"])
def test_lock_url_git_would_read_as_an_option_is_refused(world, tmp_path, capsys, where, url):
    """`lock check`, `outdated`, `fetch` and `bump` refuse the lock with FILE:LINE, exit 2; nothing is run."""
    stack, lock, args = world
    marker = tmp_path / "ran"
    text = lock.read_text()
    if where == "url":
        text = text.replace(f"url: {BASE_URL}/nccl", f"url: {url.format(m=marker)}")
        field = "upstreams.nccl.url"
    else:
        text = text.replace(f"url: {BASE_URL}/fmt", f"url: {url.format(m=marker)}")
        field = r"upstreams.deepep.submodules.third-party/fmt.url"
    lock.write_text(text)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if str(marker) in ln or "-oProxyCommand" in ln)
    for argv in (
        ["lock", "check", "--lock", str(lock)],
        ["outdated", *args],
        ["fetch", *args],
        ["bump", "nccl", "--no-commit", *args],
    ):
        code, out, err = run(capsys, *argv)
        assert code == 2, argv
        assert re.fullmatch(
            rf"reprostack: error: {re.escape(str(lock))}:{line}: {field}: .*(starts with '-'|"
            rf"transport helper|whitespace).*\n",
            err,
        ), (argv, err)
    assert not marker.exists()


def test_git_timeout_option(world, capsys, monkeypatch):
    stack, lock, args = world
    code, out, err = run(capsys, "fetch", "nccl", *args, "--git-timeout", "soon")
    assert code == 2 and err == "reprostack: error: --git-timeout: 'soon' is not a number of seconds from 1 to 86400\n"
    monkeypatch.setenv("REPROSTACK_GIT_TIMEOUT", "-1")
    code, out, err = run(capsys, "fetch", "nccl", *args)
    assert (
        code == 2
        and err == "reprostack: error: REPROSTACK_GIT_TIMEOUT: '-1' is not a number of seconds from 1 to 86400\n"
    )
    for raw in ("1e300", "1e-300", "nan", "inf"):  # an overflow of the subprocess timer or a timeout no git meets
        code, out, err = run(capsys, "fetch", "nccl", *args, "--git-timeout", raw)
        assert (
            code == 2
            and err == f"reprostack: error: --git-timeout: '{raw}' is not a number of seconds from 1 to 86400\n"
        )
    code, out, err = run(capsys, "fetch", "nccl", *args, "--git-timeout", "120")  # the option wins over the env
    assert code == 0, err


@pytest.mark.parametrize(
    "argv",
    [
        ["gate", "micro", "--out", "{file}"],
        ["all-gates", "--out", "{file}"],
        ["gate", "micro", "--out", "{file}/sub"],
        ["verify", "{fixtures}", "--out", "{file}"],
        ["bundle", "-o", "{dir}", "nccl"],
        ["fetch", "nccl", "--cache", "{file}"],
    ],
)
def test_careless_paths_are_one_line_not_a_traceback(argv, tmp_path, capsys):
    """An --out that is a file, a bundle onto a folder, a cache that is a file: one line naming the path, exit 2."""
    f = tmp_path / "afile"
    f.write_text("x")
    fixtures = Path(__file__).resolve().parent / "fixtures" / "published-2026-07"
    argv = [a.format(file=f, dir=tmp_path, fixtures=fixtures) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("reprostack: error: ") and "Traceback" not in err[0], err
    assert str(f) in err[0] or str(tmp_path) in err[0]


# --------------------------------------------------------------- issue 29 item 5: one line, the right advice


def test_a_cherry_pick_equal_to_the_rev_names_the_pin_and_entry(world, capsys):
    """Issue 29 item 5: a cherry-pick of the pinned rev itself ended in git's `fatal: multiple updates for ref
    'refs/reprostack/<sha>' not allowed`, naming neither the pin nor the entry. Now `lock check` and `patch` refuse it
    offline, at the entry's line, before any git runs; a commit picked twice likewise."""
    stack, lock, args = world
    text = lock.read_text()
    lock.write_text(text.replace(f"- cherry-pick: {stack.pick}", f"- cherry-pick: {stack.rev}"))
    line = next(i for i, l in enumerate(lock.read_text().splitlines(), 1) if "- cherry-pick: " in l)
    for argv in (["lock", "check", "--lock", str(lock)], ["patch", "deepep", *args]):
        code, out, err = run(capsys, *argv)
        assert (code, out) == (2, ""), err
        assert err.strip() == (
            f"reprostack: error: {lock}:{line}: upstreams.deepep.patches[0].cherry-pick: {stack.rev} is the pinned "
            f"rev of deepep itself: the base already holds it, so this cherry-pick would be empty; drop the entry, "
            f"or pin `rev` at its parent to apply it as a patch"
        )
    assert not (Path(args[3]) / "git").exists()  # nothing fetched
    twice = text.replace(
        "    patched-tree:",
        f"      - cherry-pick: {stack.pick}\n        upstream-status: Pending\n    patched-tree:",
    )
    lock.write_text(twice)
    code, _, err = run(capsys, "lock", "check", "--lock", str(lock))
    assert code == 2 and "patches[1].cherry-pick: " in err
    assert (
        f"{stack.pick} is also picked by entry #1 cherry-pick {stack.pick[:12]} of deepep: a commit is picked once"
        in err
    )


def _chown_tree(top: Path, uid: int) -> None:
    for d, dirs, files in os.walk(top):
        for n in [d, *(os.path.join(d, x) for x in dirs + files)]:
            os.lchown(n, uid, uid)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving the cache to another uid needs root")
def test_a_cache_owned_by_another_uid_says_what_works_with_reprostack(world, tmp_path, capsys):
    """Issue 29 item 5: a cache repository owned by another uid ended in git's own text, `To add an exception for
    this directory, call: git config --global --add safe.directory ...`, which cannot work: reprostack runs git
    without the global config. Now one line names the folder, both uids and what works."""
    stack, lock, args = world
    assert run(capsys, "patch", "deepep", *args)[0] == 0
    cache = Path(args[3])
    _chown_tree(cache, 65534)
    try:
        code, out, err = run(capsys, "patch", "deepep", *args)
    finally:
        _chown_tree(cache, 0)
    assert (code, out) == (2, "")
    (line,) = err.strip().splitlines()
    assert "is owned by uid 65534 (nobody), not by uid 0 (root) who runs reprostack, so git refuses it" in line
    assert "use a cache of your own (--cache DIR or REPROSTACK_CACHE=DIR), run as its owner, or chown -R 0 it" in line
    assert "safe.directory` advice cannot help (reprostack ignores the global git config)" in line
    assert "To add an exception" not in line and str(cache / "git") in line


def test_all_gates_lines_say_a_shared_reason_once_and_name_gates_as_typed(tmp_path):
    """Issue 29 item 9: fabric and micro failing on the same fetch printed the same 200-character reason twice, and
    every NOT-RUN gate repeated micro's reason again (five times in all); the report's `nemo_rl` was printed where
    the operator types `nemo-rl`. Now one short line per gate, a shared reason said once, the CLI's name; the nox
    session's lines likewise."""
    from reprostack.cmd.gate import result_lines
    from reprostack.report import not_run
    from reprostack.report.model import GateReport, Result

    why = "nccl: cannot fetch 1933fdd6360a from https://github.com/NVIDIA/nccl: fatal: unable to access"
    fabric = GateReport("fabric", "-", Result.ERROR, why)
    micro = GateReport("micro", "-", Result.ERROR, why)
    vllm, megatron = not_run("vllm", micro), not_run("megatron", micro)
    nemo = not_run("nemo_rl", megatron)
    lines = result_lines([fabric, micro, vllm, megatron, nemo])
    assert lines == [
        f"fabric [-]: ERROR — {why}",
        "micro [-]: ERROR — same reason as fabric",
        "vllm [-]: NOT-RUN — not run: required gate micro did not pass (ERROR)",
        "megatron [-]: NOT-RUN — same reason as vllm",
        "nemo-rl [-]: NOT-RUN — not run: required gate megatron was not run either (root cause: gate micro)",
    ]
    noxfile = noxmod.load()
    rows = [{"gate": r.gate, "result": str(r.result), "label": r.label(), "reason": r.reason} for r in (micro, nemo)]
    rows.insert(0, {"gate": "fabric", "result": "error", "label": "ERROR", "reason": why})
    assert noxfile.gate_lines(rows) == [
        f"fabric: ERROR — {why}",
        "micro: ERROR — same reason as fabric",
        "nemo-rl: NOT-RUN — not run: required gate megatron was not run either (root cause: gate micro)",
    ]
