"""Stacks in the lock (reprostack.lock.stacks, lock.load(stack=...)), `reprostack --stack`, `reprostack stacks
[diff A B]`, the gate spec's per-stack env, and the GIN plugin chain (kernels.ginplugin): the rendered build
script and the export check on real shared objects compiled here with cc. Real files, real git repos, no network."""

from __future__ import annotations

import dataclasses

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gaterun import run as run_gate_here

from reprostack import cli
from reprostack.lock import stacks as lockstacks
from reprostack.bump.lockedit import PinEdit, edit_pin
from reprostack.cmd import git_names
from reprostack.errors import BuildError, GateError, LockError
from reprostack.gates.spec import GateSpecError, load_spec
from reprostack.kernels import ginplugin
from reprostack.lock import load

import gitrepos as gr
from test_gate_micro_flow import gpu_host  # noqa: F401 (a fixture)
from test_sources import lock_text, make_stack

REPO_ROOT = Path(__file__).resolve().parents[1]
H = "a" * 40
T = "b" * 40


@pytest.fixture(autouse=True)
def _no_selected_stack(monkeypatch):
    monkeypatch.setenv(lockstacks.ENV, "campaign")
    monkeypatch.delenv(lockstacks.ENV)  # absent here, and restored to what it was after the test


def test_cli_leaves_the_stack_variable_as_it_found_it(tmp_path):
    import os

    p = small_lock(tmp_path, GIN)
    assert cli.main(["--stack", "nope", "lock", "check", "--lock", str(p)]) == 2
    assert lockstacks.ENV not in os.environ


def small_lock(tmp_path: Path, stacks: str) -> Path:
    p = tmp_path / "upstreams.lock"
    p.write_text(
        f"""\
lockfile-version: 1
upstreams:
  nccl:
    kind: git
    url: https://example.invalid/nccl
    original: v2.30.4-1
    rev: {H}
    tree: {T}
    fetch-refs: [refs/tags/v2.30.4-1]
    policy: {{track: tag, pattern: "v*"}}
  deepep:
    kind: git
    url: https://example.invalid/deepep
    rev: {"c" * 40}
    tree: {"d" * 40}
    patches:
      - cherry-pick: {"e" * 40}
        upstream-status: "Backport [#630]"
    patched-tree: {"f" * 40}
"""
        + stacks
    )
    return p


GIN = f"""\
stacks:
  campaign:
    description: the campaign
    env: {{NCCL_GIN_TYPE: "2", OFI_NCCL_GIN_GDAKI: "0"}}
  gin:
    description: GPU-initiated
    extends: campaign
    env: {{NCCL_GIN_TYPE: "5"}}
    overrides:
      nccl:
        original: v2.30.7-1
        rev: "{"1" * 40}"
        tree: "{"2" * 40}"
"""


# --------------------------------------------------------------------------- the lock


def test_real_lock_default_stack_is_the_campaign_and_its_pins_are_the_shared_ones(tmp_path):
    lk = load(REPO_ROOT / "upstreams.lock")
    assert lk.stack == "campaign" and set(lk.stacks) >= {"campaign", "gin-gdaki"}
    text = (REPO_ROOT / "upstreams.lock").read_text()
    tmp = tmp_path / "upstreams.lock"
    tmp.write_text(text[: text.index("\nstacks:\n") + 1])  # the shared pins alone, as before stacks existed
    before = load(tmp, root=REPO_ROOT)
    assert before.upstreams == lk.upstreams  # the default stack's pins are unchanged
    assert before.stacks["campaign"].overrides == ()


def test_real_lock_gin_gdaki_overrides_nccl_and_the_plugin_and_shares_the_rest():
    camp, gin = load(REPO_ROOT / "upstreams.lock"), load(REPO_ROOT / "upstreams.lock", stack="gin-gdaki")
    assert gin.stack == "gin-gdaki" and set(gin.stacks["gin-gdaki"].overrides) == {"nccl", "aws-ofi-nccl"}
    assert gin.git("aws-ofi-nccl").original == "v1.21.1" and gin.git("aws-ofi-nccl").submodules == ()
    assert gin.get("nccl") == gin.get("nccl-wheel-2-32") and gin.get("nccl").version == "2.32.3"  # the wheel alone
    assert gin.stacks["gin-gdaki"].wheel_of == {"nccl": "nccl-wheel-2-32"}
    assert gin.get("nccl").files[0].sha256 == "1459723080ac889d73a26edfa3e04383a7928ab31ac8f0ec43b3ea9548b04ff3"
    assert camp.git("nccl").original == "v2.30.4-1" and camp.stacks["campaign"].wheel_of == {}
    assert git_names(gin, []) == [n for n in git_names(camp, []) if n != "nccl"]  # fetch/bundle: no nccl git
    for shared in ("deepep", "rdma-core", "libfabric", "gdrcopy", "substrate-wheels"):
        assert gin.upstreams[shared] == camp.upstreams[shared]
    assert gin.env["NCCL_GIN_TYPE"] == "5" and camp.env["NCCL_GIN_TYPE"] == "2"
    assert gin.sha256 == camp.sha256  # one file


def test_selected_stack_comes_from_the_environment(tmp_path, monkeypatch):
    p = small_lock(tmp_path, GIN)
    monkeypatch.setenv(lockstacks.ENV, "gin")
    lk = load(p)
    assert lk.stack == "gin" and lk.git("nccl").rev == "1" * 40
    assert lk.env == {"NCCL_GIN_TYPE": "5", "OFI_NCCL_GIN_GDAKI": "0"}  # extends campaign: its env, then its own


def test_moving_a_git_rev_drops_the_shared_series_and_trees(tmp_path):
    p = small_lock(
        tmp_path,
        f"""\
stacks:
  newer:
    description: DeepEP at another commit, no series
    overrides:
      deepep: {{rev: "{"3" * 40}", tree: "{"4" * 40}"}}
""",
    )
    pin = load(p, stack="newer").git("deepep")
    assert (pin.rev, pin.tree, pin.patches, pin.patched_tree) == ("3" * 40, "4" * 40, (), None)
    assert load(p).git("deepep").patches  # the default stack keeps it


# a stack `more` whose deepep carries one patch more than the campaign's series, on the same rev
ONE_MORE_PATCH = f"""\
stacks:
  more:
    description: one more patch
    overrides:
      deepep:
        patches:
          - {{cherry-pick: "{"e" * 40}", upstream-status: "Backport [#630]"}}
          - {{cherry-pick: "{"9" * 40}", upstream-status: Pending}}
        patched-tree: "{"8" * 40}"
"""


def test_a_series_override_on_the_same_rev_replaces_the_series(tmp_path):
    p = small_lock(tmp_path, ONE_MORE_PATCH)
    pin = load(p, stack="more").git("deepep")
    assert [x.value[0] for x in pin.patches] == ["e", "9"] and pin.patched_tree == "8" * 40 and pin.rev == "c" * 40


def _one_line(e: LockError) -> str:
    s = str(e)
    assert "\n" not in s
    return s


def test_unknown_stack_is_one_line_naming_the_known_ones(tmp_path):
    p = small_lock(tmp_path, GIN)
    with pytest.raises(LockError) as e:
        load(p, stack="nope")
    assert re.search(r"upstreams.lock:\d+: --stack: no such stack 'nope' \(known: campaign, gin\)$", _one_line(e.value))
    with pytest.raises(LockError, match="no such stack 'gin'"):  # a lock without stacks knows only the default
        load(small_lock(tmp_path, ""), stack="gin")


def test_override_of_a_pin_that_does_not_exist_names_its_line(tmp_path):
    p = small_lock(
        tmp_path,
        """\
stacks:
  x:
    description: typo
    overrides:
      ncc: {original: v2}
""",
    )
    with pytest.raises(LockError) as e:
        load(p)  # every stack validates, whichever is selected
    line = p.read_text().splitlines().index("      ncc: {original: v2}") + 1
    assert _one_line(e.value).startswith(f"{p}:{line}: stacks.x.overrides.ncc: overrides pin 'ncc'")


def test_extends_cycle_names_the_extends_line(tmp_path):
    p = small_lock(
        tmp_path,
        """\
stacks:
  a: {description: a, extends: b}
  b: {description: b, extends: a}
""",
    )
    with pytest.raises(LockError) as e:
        load(p)
    assert re.search(r":2[0-9]: stacks\.[ab]\.extends: cycle: (a -> b -> a|b -> a -> b)", _one_line(e.value))


def test_extends_an_unknown_stack_is_an_error(tmp_path):
    p = small_lock(tmp_path, "stacks:\n  a: {description: a, extends: zz}\n")
    with pytest.raises(LockError, match=r"stacks\.a\.extends: no such stack 'zz'"):
        load(p)


@pytest.mark.parametrize(
    "override, field, why",
    [
        ('{rev: "abc", tree: "' + "2" * 40 + '"}', "rev", "pattern|does not match|40"),
        ('{rev: "' + "1" * 40 + '"}', "", "tree"),  # a moved rev needs its own tree
        ('{url: "-oProxyCommand=x"}', "url", "-oProxyCommand"),
        ('{fetch-refs: ["refs/heads/a..b"]}', "fetch-refs[0]", "ref name"),
        ("{colour: red}", "colour", "unknown key"),
    ],
)
def test_a_bad_override_is_validated_like_a_pin_and_names_the_override(tmp_path, override, field, why):
    p = small_lock(tmp_path, f"stacks:\n  s:\n    description: s\n    overrides:\n      nccl: {override}\n")
    with pytest.raises(LockError) as e:
        load(p)
    msg = _one_line(e.value)
    line = len(p.read_text().splitlines())  # the override is the last line
    assert f"{p}:{line}: " in msg and (f"overrides.nccl.{field}" if field else "overrides.nccl") in msg
    assert re.search(why, msg), msg


def test_stacks_section_shape_is_checked_by_the_schema(tmp_path):
    with pytest.raises(LockError, match=r"stacks\.s: .*description"):
        load(small_lock(tmp_path, "stacks:\n  s: {env: {A: b}}\n"))
    with pytest.raises(LockError, match=r"stacks\.s\.env\.A"):
        load(small_lock(tmp_path, "stacks:\n  s: {description: d, env: {A: 1}}\n"))


def test_bump_lock_edit_keeps_the_stacks_section(tmp_path):
    p = small_lock(tmp_path, GIN)
    text = p.read_text()
    new = edit_pin(text, "nccl", PinEdit(rev="5" * 40, tree="6" * 40), str(p))
    assert new[new.index("stacks:") :] == text[text.index("stacks:") :]
    p.write_text(new)
    assert load(p).git("nccl").rev == "5" * 40 and load(p, stack="gin").git("nccl").rev == "1" * 40


# --------------------------------------------------------------------------- CLI


def test_cli_stacks_list_and_diff(tmp_path, capsys):
    p = small_lock(tmp_path, GIN)
    assert cli.main(["stacks", "--lock", str(p)]) == 0
    out = capsys.readouterr().out
    assert "campaign (default, selected): the campaign" in out and "nccl -> v2.30.7-1 111111111111" in out
    assert cli.main(["stacks", "diff", "campaign", "gin", "--lock", str(p)]) == 0
    out = capsys.readouterr().out
    assert (
        f"nccl.rev: campaign={H}  gin={'1' * 40}" in out and "nccl.original: campaign=v2.30.4-1  gin=v2.30.7-1" in out
    )
    assert "env NCCL_GIN_TYPE: campaign=2  gin=5" in out and "deepep" not in out
    assert cli.main(["stacks", "diff", "gin", "gin", "--lock", str(p)]) == 0
    assert "identical" in capsys.readouterr().out
    assert cli.main(["stacks", "diff", "campaign", "gin", "--json", "--lock", str(p)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["name"], r["field"]) for r in rows} == {
        ("nccl", "rev"),
        ("nccl", "tree"),
        ("nccl", "original"),
        ("NCCL_GIN_TYPE", "value"),
    }


def test_cli_diff_shows_patch_series_entry_by_entry(tmp_path, capsys):
    p = small_lock(tmp_path, ONE_MORE_PATCH)
    assert cli.main(["stacks", "diff", "campaign", "more", "--lock", str(p)]) == 0
    out = capsys.readouterr().out
    assert f"    + cherry-pick {'9' * 40} (Pending)   (more only)" in out and "deepep.patched-tree" in out


def test_cli_unknown_stack_is_one_line_exit_2(tmp_path, capsys):
    p = small_lock(tmp_path, GIN)
    assert cli.main(["--stack", "nope", "lock", "check", "--lock", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no such stack 'nope' (known: campaign, gin)" in err
    assert cli.main(["stacks", "diff", "campaign", "nope", "--lock", str(p)]) == 2
    assert cli.main(["stacks", "frobnicate", "--lock", str(p)]) == 2


def test_cli_stack_option_selects_the_stack_for_every_command(tmp_path, capsys, monkeypatch):
    p = small_lock(tmp_path, GIN)
    assert cli.main(["--stack", "gin", "stacks", "--lock", str(p)]) == 0
    assert "gin (selected): GPU-initiated" in capsys.readouterr().out


def test_cli_gate_reports_record_the_stack(tmp_path, monkeypatch):
    from reprostack.gates import runner
    from reprostack.report import GateReport

    p = small_lock(tmp_path, GIN)
    monkeypatch.setattr(runner, "run_gate", lambda g, opts, ctx: GateReport("micro", "h200-ep1", "skip", "x"))
    assert cli.main(["--stack", "gin", "gate", "micro", "--lock", str(p), "--out", str(tmp_path / "out")]) == 3
    assert json.loads((tmp_path / "out" / "micro.json").read_text())["provenance"]["stack"] == "gin"


# --------------------------------------------------------------------------- gate spec per stack


def test_gate_spec_stack_env_layers_over_the_lock_stack_env(tmp_path):
    spec = load_spec(REPO_ROOT, "micro")
    camp, gin = load(REPO_ROOT / "upstreams.lock"), load(REPO_ROOT / "upstreams.lock", stack="gin-gdaki")
    c = spec.with_stack(camp.stack, camp.env)
    assert c.env == spec.env and c.profiles == spec.profiles  # the campaign runs the spec as it is
    g = spec.with_stack(gin.stack, gin.env)
    assert g.env["NCCL_GIN_TYPE"] == "5" and g.env["NCCL_SYM_GIN_KERNELS_ENABLE"] == "0"
    p5 = g.profiles["p5en-efa-ep16"]
    assert p5.bars_status == "unmeasured" and p5.env["NCCL_DEBUG_SUBSYS"] == "INIT,ENV,NET"
    assert p5.env["EP_EFA_MAX_QPS"] == "6"  # the profile's own env stays under the stack's
    assert g.profiles["h200-ep1"] == spec.profiles["h200-ep1"]
    assert (c.image, g.image) == ("deepep", "deepep-gin-gdaki")


def test_gate_spec_stack_naming_an_unknown_profile_is_a_located_error(tmp_path):
    (tmp_path / "gates").mkdir()
    text = (
        (REPO_ROOT / "gates" / "micro.yaml")
        .read_text()
        .replace("      p5en-efa-ep16:\n        # aws", "      p5en-typo:\n        # aws")
    )
    (tmp_path / "gates" / "micro.yaml").write_text(text)
    with pytest.raises(GateSpecError, match=r"micro.yaml:\d+: stacks.gin-gdaki.profiles.p5en-typo: no such profile"):
        load_spec(tmp_path, "micro")
    with pytest.raises(GateError, match="no such profile"):
        spec = load_spec(REPO_ROOT, "micro")
        type(spec).with_stack(spec.__class__(**{**spec.__dict__, "stacks": {"s": {"profiles": {"zz": {}}}}}), "s")


@pytest.mark.parametrize("value", [r"a\0b", r"a\nexport X=1", r"a\e]0;x\a", r"a\rb"])
def test_an_env_value_with_a_control_character_is_refused_where_it_is_written(tmp_path, value):
    """hostile-input trial (session 4): a NUL (which the process launch would fail on with a traceback), a
    newline, a terminal escape or a CR in a stack's env (the lock) or a gate spec's env: one located line."""
    p = small_lock(tmp_path, f'stacks:\n  s:\n    description: s\n    env: {{A: "{value}"}}\n')
    with pytest.raises(LockError) as e:
        load(p)
    assert f"{p}:{len(p.read_text().splitlines())}: stacks.s.env.A: " in _one_line(e.value)
    (tmp_path / "gates").mkdir()
    text = (REPO_ROOT / "gates" / "micro.yaml").read_text()
    assert text.count("\nenv:\n") == 1
    (tmp_path / "gates" / "micro.yaml").write_text(text.replace("\nenv:\n", f'\nenv:\n  EVIL: "{value}"\n'))
    with pytest.raises(GateSpecError, match=r"micro.yaml:\d+: env.EVIL: "):
        load_spec(tmp_path, "micro")


def test_a_gate_spec_env_name_that_is_no_variable_name_is_refused(tmp_path):
    (tmp_path / "gates").mkdir()
    text = (REPO_ROOT / "gates" / "micro.yaml").read_text()
    (tmp_path / "gates" / "micro.yaml").write_text(text.replace("\nenv:\n", "\nenv:\n  'A=B; id': x\n"))
    with pytest.raises(GateSpecError, match=r"micro.yaml:\d+: env: 'A=B; id' does not match"):
        load_spec(tmp_path, "micro")


def test_micro_runs_the_stack_pins_and_env(tmp_path, gpu_host):
    """run_micro on the CPU with the selected stack: the stack's NCCL pin is fetched, verified and reported, the
    stack's env reaches the test, provenance names the stack (GPU parts stood in for, as in test_gate_micro_flow)."""
    from test_gate_micro_flow import FIX, options, stand_in_python
    from trialslog import real_ep1_texts, trials_log

    gpu_host["nccl_version"] = "2.30.7"
    py = stand_in_python(
        tmp_path,
        trials_log(real_ep1_texts(3), dense_fixture=FIX / "dense_ep1.log", dense_scales=[1.0, 1.1, 0.9]),
        nccl_runtime="2.30.7",
    )
    opts = options(tmp_path, py, profile="h200-ep1", arms=("deepep", "dense"), trials=3)
    nccl = tmp_path / "srv" / "nccl"
    rev = gr.commit_files(
        nccl, {"makefiles/version.mk": "NCCL_MAJOR   := 2\nNCCL_MINOR   := 30\nNCCL_PATCH   := 7\n"}, "nccl 2.30.7-1"
    )
    gr.tag(nccl, "v2.30.7-1", rev)
    lock_path = opts.root / "upstreams.lock"
    lock_path.write_text(
        lock_path.read_text()
        + f"""\
stacks:
  campaign: {{description: c, env: {{NCCL_GIN_TYPE: "2"}}}}
  gin-gdaki:
    description: g
    extends: campaign
    env: {{NCCL_GIN_TYPE: "5", NCCL_SYM_GIN_KERNELS_ENABLE: "0"}}
    overrides:
      nccl: {{original: v2.30.7-1, rev: "{rev}", tree: "{gr.tree_of(nccl, rev)}", fetch-refs: [refs/tags/v2.30.7-1]}}
"""
    )
    opts = dataclasses.replace(opts, ctx=dataclasses.replace(opts.ctx, lock=load(lock_path, stack="gin-gdaki")))
    rep = run_gate_here(opts)
    assert rep.result == "pass", rep.reason
    assert rep.provenance["stack"] == "gin-gdaki" and rep.provenance["upstreams"]["nccl"]["rev"] == rev
    assert rep.data["env"]["NCCL_GIN_TYPE"] == "5" and rep.data["env"]["NCCL_SYM_GIN_KERNELS_ENABLE"] == "0"
    opts = dataclasses.replace(opts, ctx=dataclasses.replace(opts.ctx, lock=load(lock_path)))  # the campaign's
    rep = run_gate_here(opts)
    assert rep.provenance["stack"] == "campaign" and rep.provenance["upstreams"]["nccl"]["rev"] != rev
    assert rep.data["env"]["NCCL_GIN_TYPE"] == "2" and "NCCL_SYM_GIN_KERNELS_ENABLE" not in rep.data["env"]


# --------------------------------------------------------------------------- the GIN plugin chain


def _sources(tmp_path: Path) -> dict:
    out = {}
    for i, n in enumerate(ginplugin.CHAIN):
        d = tmp_path / "trees" / n
        (d / ".git").mkdir(parents=True)
        (d / "README").write_text(n)
        if n in ginplugin.AUTOGEN:  # a stand-in autogen.sh: writes an executable configure that records its args
            (d / "autogen.sh").write_text(
                "#!/bin/sh\nprintf '#!/bin/sh\\necho \"$@\" > configured\\n' > configure\nchmod +x configure\n"
            )
            (d / "autogen.sh").chmod(0o755)
        out[n] = ginplugin.ChainSource(n, d, str(i) * 40, "f" * 40)
    return out


def test_render_script_builds_the_chain_in_order_with_the_pinned_flags(tmp_path):
    text = ginplugin.render_script(_sources(tmp_path), tmp_path / "w", tmp_path / "p", "/usr/local/cuda", 16)
    order = [
        text.index(f"STEP='{s}'")
        for s in (
            "copy rdma-core",
            "libfabric autogen",
            "aws-ofi-nccl autogen",
            "rdma-core cmake",
            "libfabric configure",
            "aws-ofi-nccl configure",
            "aws-ofi-nccl build",
            "record",
        )
    ]
    assert order == sorted(order)
    assert "-DENABLE_RESOLVE_NEIGH=0" in text and "-DNO_MAN_PAGES=1" in text and "--build" in text and "-j 16" in text
    assert f"--enable-efa={tmp_path / 'p'}" in text and "--with-cuda=/usr/local/cuda" in text
    assert "if [ -f /usr/local/cuda/include/nvml.h ]" in text and "--without-cuda" in text  # HMEM only with nvml.h
    assert f"--with-libfabric={tmp_path / 'p'}" in text and "--disable-tests" in text and "--disable-werror" in text
    assert f"--with-gdrcopy={tmp_path / 'w' / 'src' / 'gdrcopy'}" in text
    # aws-ofi-nccl's rev (index 3 of CHAIN), exported before its autogen.sh (m4/get_version.sh runs there too)
    assert text.index(f"export BRAZIL_PACKAGE_CHANGE_ID={'3' * 40}") < text.index("STEP='aws-ofi-nccl autogen'")
    assert "git clone" not in text and "curl" not in text and "wget" not in text
    # `set -e` ignores a failure of any but the last command of an && list: no build step hides in one
    assert not [
        ln
        for ln in text.splitlines()
        if "&&" in ln and re.search(r"\b(make|cmake|configure|autogen|cd|tar)\b", ln.split("&&")[0])
    ]
    built = json.loads(text.split("<<'JSON'\n", 1)[1].split("\nJSON\n", 1)[0])
    assert built["aws-ofi-nccl"]["rev"] == "3" * 40 and set(built) == set(ginplugin.CHAIN)


def test_render_script_refuses_a_missing_pin_or_no_jobs(tmp_path):
    s = _sources(tmp_path)
    with pytest.raises(BuildError, match="no source for libfabric"):
        ginplugin.render_script({k: v for k, v in s.items() if k != "libfabric"}, tmp_path, tmp_path, "/c", 1)
    with pytest.raises(BuildError, match="jobs"):
        ginplugin.render_script(s, tmp_path, tmp_path, "/c", 0)


def test_rendered_script_copies_trees_without_git_and_stops_naming_the_failed_step(tmp_path):
    """The rendered script, run for real up to its first tool: the copies carry no .git, and a failing step is
    named with the tail of its log (cmake is pointed at a tree with no CMakeLists.txt)."""
    if not shutil.which("cmake"):
        pytest.skip("cmake not installed")
    script = tmp_path / "b.sh"
    script.write_text(ginplugin.render_script(_sources(tmp_path), tmp_path / "w", tmp_path / "p", "/c", 1))
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert r.returncode != 0 and "[ginplugin] FAILED at: rdma-core cmake" in r.stderr
    assert "rdma-core.cmake.log" in r.stderr
    assert (tmp_path / "w" / "src" / "aws-ofi-nccl" / "README").read_text() == "aws-ofi-nccl"
    assert not (tmp_path / "w" / "src" / "aws-ofi-nccl" / ".git").exists()
    assert (tmp_path / "trees" / "aws-ofi-nccl" / ".git").is_dir()  # the verified tree is untouched
    assert not (tmp_path / "trees" / "aws-ofi-nccl" / "configure").exists()  # autogen ran in the copy
    assert (tmp_path / "w" / "src" / "aws-ofi-nccl" / ginplugin.STAMP).read_text() == f"{'3' * 40} {'f' * 40}\n"


def test_autogen_only_then_pregenerated_trees_are_used_only_when_their_stamp_matches(tmp_path):
    """Where autotools are missing (the lent H200), the generated build systems come from a host that has them:
    --autogen-only makes stamped trees; the full script takes them only if the stamp names the lock's rev and tree."""
    if not shutil.which("cmake"):
        pytest.skip("cmake not installed")
    srcs = _sources(tmp_path)
    gen = tmp_path / "gen.sh"
    gen.write_text(ginplugin.render_script(srcs, tmp_path / "g", tmp_path / "gp", "/c", 1, autogen_only=True))
    assert "rdma-core" not in gen.read_text() and "cmake" not in gen.read_text()
    subprocess.run(["bash", str(gen)], check=True, capture_output=True)
    pre = tmp_path / "g" / "src"
    assert sorted(x.name for x in pre.iterdir()) == ["aws-ofi-nccl", "libfabric"]
    for n in ginplugin.AUTOGEN:  # the source trees lose autogen.sh: the full script must not need it
        (srcs[n].path / "autogen.sh").unlink()
    script = tmp_path / "b.sh"
    script.write_text(ginplugin.render_script(srcs, tmp_path / "w", tmp_path / "p", "/c", 1))
    r = subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "GINPLUGIN_PREGEN": str(pre)},
    )
    assert "FAILED at: rdma-core cmake" in r.stderr, r.stderr  # past both autogen steps, with no autogen.sh
    (pre / "libfabric" / "README").write_text("changed after autogen")  # stamp right, a source file not
    r = subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "GINPLUGIN_PREGEN": str(pre)},
    )
    assert r.returncode == 2 and "libfabric differs from the verified tree of libfabric" in r.stderr, r.stderr
    (pre / "libfabric" / "README").write_text("libfabric")
    (pre / "libfabric" / ginplugin.STAMP).write_text(f"{'9' * 40} {'f' * 40}\n")  # made from another tree
    r = subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "GINPLUGIN_PREGEN": str(pre)},
    )
    assert r.returncode == 2 and "does not name libfabric 1111" in r.stderr and "cmake" not in r.stderr


def _so(tmp_path: Path, name: str, symbols: list[str]) -> Path:
    cc = shutil.which("cc")
    if not cc:
        pytest.skip("no C compiler")
    src = tmp_path / f"{name}.c"
    src.write_text(
        "".join(f'__attribute__((visibility("default"))) int {s}[4] = {{1}};\n' for s in symbols)
        + "static int hidden_ncclGinPlugin_v14 = 0;\nint use(void) { return hidden_ncclGinPlugin_v14; }\n"
    )
    out = tmp_path / "lib" / f"{name}.so"
    out.parent.mkdir(exist_ok=True)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return out


def test_export_check_finds_the_gdaki_table_in_a_real_shared_object(tmp_path):
    lib = _so(tmp_path, "libnccl-net-ofi", ["ncclGinPlugin_v14", "ncclGinPlugin_v13", "ncclNetPlugin_v10"])
    r = ginplugin.check_exports(lib.parent)
    assert r == {"library": str(lib), "gin": ["ncclGinPlugin_v13", "ncclGinPlugin_v14"], "net": ["ncclNetPlugin_v10"]}


def test_export_check_refuses_a_proxy_only_build(tmp_path):
    lib = _so(tmp_path, "libnccl-net-ofi", ["ncclGinPlugin_v13", "ncclNetPlugin_v10", "ncclRmaPlugin_v14"])
    with pytest.raises(
        BuildError, match=r"no plugin exports ncclGinPlugin_v14 .*libnccl-net-ofi.so: ncclGinPlugin_v13"
    ):
        ginplugin.check_exports(lib.parent)
    assert ginplugin.check_exports(lib.parent, "ncclGinPlugin_v13")["gin"] == ["ncclGinPlugin_v13"]


def test_export_check_needs_a_net_table_and_a_library(tmp_path):
    lib = _so(tmp_path, "libnccl-net-ofi", ["ncclGinPlugin_v14"])
    with pytest.raises(BuildError, match="with a ncclNetPlugin_v"):
        ginplugin.check_exports(lib.parent)
    (tmp_path / "empty").mkdir()
    with pytest.raises(BuildError, match="no libnccl-net"):
        ginplugin.check_exports(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "libnccl-net.so").write_text("not an ELF")
    with pytest.raises(BuildError, match="nm -D failed"):
        ginplugin.check_exports(tmp_path / "bad")


def test_cli_check_plugin(tmp_path, capsys):
    lib = _so(tmp_path, "libnccl-net-ofi", ["ncclGinPlugin_v14", "ncclNetPlugin_v10"])
    assert cli.main(["stacks", "check-plugin", str(lib.parent)]) == 0
    assert "exports ncclGinPlugin_v14 ncclNetPlugin_v10" in capsys.readouterr().out
    assert cli.main(["stacks", "check-plugin", str(tmp_path)]) == 2


def test_cli_plugin_render_only_uses_the_stack_pins_verified_trees(tmp_path, capsys):
    """`--stack S stacks plugin --render-only` on real local repos: each pin of the chain is fetched and verified,
    and the script copies from the verified trees of the stack's pins (here, S moves aws-ofi-nccl)."""
    srv = tmp_path / "srv"
    revs = {}
    for n in ginplugin.CHAIN:
        r = gr.init_repo(srv / n)
        revs[n] = gr.commit_files(r, {"README": f"{n} 1\n"}, f"{n} 1")
    newer = gr.commit_files(srv / "aws-ofi-nccl", {"README": "aws-ofi-nccl 2 (GDAKI)\n"}, "2")
    pins = "".join(
        f"""\
  {n}:
    kind: git
    url: {srv / n}
    rev: {revs[n]}
    tree: {gr.tree_of(srv / n, revs[n])}
"""
        for n in ginplugin.CHAIN
    )
    lock = tmp_path / "upstreams.lock"
    lock.write_text(f"""lockfile-version: 1\nupstreams:\n{pins}stacks:
  gin:
    description: newer plugin
    overrides:
      aws-ofi-nccl: {{rev: "{newer}", tree: "{gr.tree_of(srv / "aws-ofi-nccl", newer)}"}}
""")
    args = [
        "--stack",
        "gin",
        "stacks",
        "plugin",
        "--render-only",
        "--lock",
        str(lock),
        "--cache",
        str(tmp_path / "c"),
        "--out",
        str(tmp_path / "o"),
        "--jobs",
        "3",
        "--cuda",
        "/opt/cuda",
    ]
    assert cli.main(args) == 0, capsys.readouterr().err
    assert f"aws-ofi-nccl {newer[:12]}" in capsys.readouterr().out
    text = (tmp_path / "o" / "build-plugin.sh").read_text()
    assert f"export BRAZIL_PACKAGE_CHANGE_ID={newer}" in text and "-j 3" in text and "--with-cuda=/opt/cuda" in text
    tree = re.search(r"tar -C (\S+) --exclude=./.git -cf - . \| tar -C \S+/src/aws-ofi-nccl", text).group(1)
    assert (Path(tree) / "README").read_text() == "aws-ofi-nccl 2 (GDAKI)\n"


def test_make_stack_lock_loads_with_and_without_stacks(tmp_path):
    s = make_stack(tmp_path / "srv")
    p = tmp_path / "upstreams.lock"
    p.write_text(lock_text(s))
    assert load(p).stack == "campaign" and load(p).stacks["campaign"].line is None


def test_stack_image_recipe_takes_the_wheel_nccl_of_gin_gdaki_and_is_refused_under_the_campaign():
    """The gin-gdaki stack's NCCL is a wheel alone (no tree): its image recipe puts that wheel into the context
    (`wheels: nccl`) and the Dockerfile re-checks the lock's sha256 before unpacking it; under the campaign, whose
    `nccl` is a git pin, the render is refused in one line naming image.yaml's wheels entry and the stack to use."""
    from reprostack.containers.engine import render_recipe
    from reprostack.containers.errors import RecipeError
    from reprostack.containers.recipe import load_all

    recipe = load_all(REPO_ROOT)["deepep-gin-gdaki"]
    gin = load(REPO_ROOT / "upstreams.lock", stack="gin-gdaki")
    wheel = gin.get("nccl-wheel-2-32").files[0]
    text, args, labels = render_recipe(recipe, gin, from_ref="sha256:" + "ab" * 32)
    assert f'echo "{wheel.sha256}  {wheel.filename}" | sha256sum -c -' in text and "{{" not in text
    assert "COPY wheels/nccl /opt/reprostack/wheels/nccl" in text and "sources.nccl" not in recipe.dockerfile_text
    assert "wheel_pin=nccl-wheel-2-32" in text and f"wheel_sha256={wheel.sha256}" in text
    assert args["NCCL_VERSION"] == "2.32.3" and "NCCL_REV" not in args and "ENV NCCL_GIN_TYPE=5" in text
    assert labels["org.opencontainers.image.title"].startswith(
        "reprostack deepep-gin-gdaki (DeepEP V2, NCCL 2.32.3 wheel"
    )
    camp = load(REPO_ROOT / "upstreams.lock")
    with pytest.raises(RecipeError) as ei:
        render_recipe(recipe, camp, from_ref="sha256:" + "ab" * 32)
    msg = str(ei.value)
    assert "\n" not in msg and "deepep-gin-gdaki/image.yaml:" in msg and "wheels[0].pin: 'nccl' is a git pin" in msg
    assert "`reprostack --stack gin-gdaki build deepep-gin-gdaki`" in msg
    shared = {f.dest: f.src for f in recipe.files}  # one script, two recipes: the deepep recipe's own file
    assert shared["files/record-kernels.py"] == "../deepep/record-kernels.py"
    assert shared["files/check-one-nccl.sh"] == "../deepep/check-one-nccl.sh"


def test_stack_image_plugin_check_script_on_real_shared_objects(tmp_path):
    check = REPO_ROOT / "containers" / "deepep-gin-gdaki" / "check-gin-plugin-v14.sh"
    lib = _so(tmp_path, "libnccl-net-ofi", ["ncclGinPlugin_v13", "ncclNetPlugin_v10"])
    r = subprocess.run(["sh", str(check), str(lib.parent)], capture_output=True, text=True)
    assert r.returncode == 1 and "GDAKI not compiled in" in r.stderr
    _so(tmp_path, "libnccl-net-ofi", ["ncclGinPlugin_v14", "ncclNetPlugin_v10"])
    r = subprocess.run(["sh", str(check), str(lib.parent)], capture_output=True, text=True)
    assert r.returncode == 0 and "exports ncclGinPlugin_v14 and ncclNetPlugin_v10" in r.stdout


def test_device_script_is_valid_bash_and_runs_the_stack():
    script = REPO_ROOT / "scripts" / "device" / "stack_gdaki_micro.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "gate micro" in text and "--profile h200-ep1 --arm deepep,dense" in text and "check-plugin" in text
    assert "STACK=${STACK:-gin-gdaki}" in text and "GINPLUGIN_PREGEN" in text


def test_bump_of_a_pin_the_selected_stack_overrides_is_refused_in_one_line(tmp_path, capsys):
    p = small_lock(tmp_path, GIN)
    before = p.read_bytes()
    assert (
        cli.main(["--stack", "gin", "bump", "nccl", "--lock", str(p), "--no-commit", "--out", str(tmp_path / "b")]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "stack gin overrides pin nccl; bump moves the shared pin only" in err
    assert p.read_bytes() == before and not (tmp_path / "b").exists()


def test_plan_of_the_stack_shows_its_env(capsys):
    assert cli.main(["--stack", "gin-gdaki", "gate", "micro", "--plan", "--json", "--profile", "p5en-efa-ep16"]) == 0
    env = dict(json.loads(capsys.readouterr().out)["env"])
    assert env["NCCL_GIN_TYPE"] == "5" and env["NCCL_DEBUG_SUBSYS"] == "INIT,ENV,NET"
    assert cli.main(["gate", "micro", "--plan", "--json", "--profile", "p5en-efa-ep16"]) == 0
    env = dict(json.loads(capsys.readouterr().out)["env"])
    assert env["NCCL_GIN_TYPE"] == "2" and env["NCCL_DEBUG"] == "INFO"  # both stacks: the transport proof per rank


def test_gin_gdaki_takes_nccl_2_32_3_from_its_wheel_alone_and_the_campaign_the_2_30_4_wheel():
    """kernels/nccl.yaml's `wheel:` rule on the real lock: the campaign's nccl (v2.30.4-1, no patches) comes from the
    pinned nvidia-nccl-cu13 2.30.4 wheel; the gin-gdaki stack's nccl IS the 2.32.3 wheel pin (override `{wheel:
    nccl-wheel-2-32}`): that wheel alone, whatever the recipe's `wheel:` names and with no tree version."""
    from reprostack.kernels import ncclwheel
    from reprostack.kernels.recipe import load_recipe

    recipe = load_recipe(REPO_ROOT, "nccl")
    assert recipe.wheel == "nccl-wheel"
    camp, gin = load(REPO_ROOT / "upstreams.lock"), load(REPO_ROOT / "upstreams.lock", stack="gin-gdaki")
    assert gin.get("nccl-wheel").version == camp.get("nccl-wheel").version == "2.30.4"
    c = ncclwheel.choose(camp, recipe.source, recipe.wheel, "2.30.4")
    assert (c.kind, c.wheel_pin, c.version) == ("wheel", "nccl-wheel", "2.30.4")
    assert ncclwheel.needs_source(camp, "nccl") and not ncclwheel.needs_source(gin, "nccl")
    g = ncclwheel.choose(gin, recipe.source, recipe.wheel, None)
    assert (g.kind, g.wheel_pin, g.version) == ("wheel", "nccl-wheel-2-32", "2.32.3")
    assert g.why == (
        "stack gin-gdaki pins nccl as wheel nccl-wheel-2-32 (nvidia-nccl-cu13==2.32.3) alone; no git source"
    )


# --------------------------------------------------------------------------- an override `{wheel: W}`

WHEEL_PIN = """\
  nccl-wheel-9:
    kind: wheel
    name: nvidia-nccl-cu13
    version: "2.32.3"
    files:
      - filename: nvidia_nccl_cu13-2.32.3-py3-none-manylinux_2_27_x86_64.whl
        sha256: "9999999999999999999999999999999999999999999999999999999999999999"
"""


def wheel_lock(tmp_path: Path, override: str) -> Path:
    p = small_lock(
        tmp_path,
        f"""\
stacks:
  gdaki:
    description: NCCL from a wheel alone
    overrides:
      nccl: {override}
""",
    )
    text = p.read_text()
    p.write_text(text.replace("stacks:\n", WHEEL_PIN + "stacks:\n", 1))
    return p


def test_a_wheel_override_makes_the_pin_that_wheel_whole(tmp_path):
    p = wheel_lock(tmp_path, "{wheel: nccl-wheel-9}")
    lk = load(p, stack="gdaki")
    assert lk.get("nccl") == lk.get("nccl-wheel-9") and lk.get("nccl").kind == "wheel"
    assert lk.stacks["gdaki"].wheel_of == {"nccl": "nccl-wheel-9"} and git_names(lk, []) == ["deepep"]
    assert load(p).git("nccl").rev == H  # the default stack keeps the git pin


@pytest.mark.parametrize(
    "override, needle",
    [
        (
            "{wheel: deepep}",
            "stacks.gdaki.overrides.nccl.wheel: 'deepep' is not a `kind: wheel` pin of upstreams: "
            "(wheel pins: nccl-wheel-9)",
        ),
        ("{wheel: nope}", "stacks.gdaki.overrides.nccl.wheel: 'nope' is not a `kind: wheel` pin"),
        (
            "{wheel: nccl-wheel-9, rev: x}",
            "stacks.gdaki.overrides.nccl: an override with `wheel:` is that wheel pin, whole: drop rev",
        ),
    ],
)
def test_a_bad_wheel_override_is_one_line(tmp_path, capsys, override, needle):
    p = wheel_lock(tmp_path, override)
    assert cli.main(["lock", "check", "--lock", str(p)]) == 2  # every stack validates, whichever is selected
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{p}:" in err and needle in err, err


def test_stacks_diff_shows_the_nccl_wheel_of_gin_gdaki(capsys):
    assert cli.main(["stacks", "diff", "campaign", "gin-gdaki"]) == 0
    out = capsys.readouterr().out
    assert "nccl.kind: campaign=git  gin-gdaki=wheel" in out and "nccl.version: campaign=-  gin-gdaki=2.32.3" in out
    assert "+ nvidia_nccl_cu13-2.32.3-py3-none-manylinux_2_27_x86_64.whl 1459723080ac" in out
    assert cli.main(["stacks"]) == 0
    assert "nccl -> wheel nccl-wheel-2-32 (nvidia-nccl-cu13 2.32.3)" in capsys.readouterr().out


# --------------------------------------------------------------- issue 29 item 6: what a stack changes is shown


def test_stacks_shows_a_url_override(tmp_path, capsys):
    """Issue 29 item 6: an override that fetches a pin from another URL (a fork) was listed by its version and rev
    only, as if it came from the shared pin's upstream. Now `stacks` names the URL and the shared one."""
    fork = GIN.replace(
        "        original: v2.30.7-1\n", "        original: v2.30.7-1\n        url: https://example.invalid/fork/nccl\n"
    )
    p = small_lock(tmp_path, fork)
    assert cli.main(["stacks", "--lock", str(p)]) == 0
    out = capsys.readouterr().out
    assert (
        "nccl -> v2.30.7-1 111111111111 from https://example.invalid/fork/nccl (url overridden; shared: "
        "https://example.invalid/nccl)" in out
    )
    assert cli.main(["stacks", "--json", "--lock", str(p)]) == 0
    (gin,) = [r for r in json.loads(capsys.readouterr().out) if r["name"] == "gin"]
    assert "fork/nccl" in gin["overrides"]["nccl"]
    p = small_lock(tmp_path, GIN)  # the same URL: no mention
    assert cli.main(["stacks", "--lock", str(p)]) == 0
    assert "url overridden" not in capsys.readouterr().out


@pytest.mark.parametrize("var", ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT"])
def test_a_stack_env_cannot_set_a_loader_variable_unless_the_lock_says_why(tmp_path, capsys, var):
    """Issue 29 item 6: a stack's env could set LD_PRELOAD or LD_LIBRARY_PATH, which decide which NCCL every process
    of a gate loads, silently. Now `lock check` refuses it at its line unless the stack's `env-why` says why."""
    bad = GIN.replace('    env: {NCCL_GIN_TYPE: "5"}\n', f'    env: {{NCCL_GIN_TYPE: "5", {var}: /opt/x/lib}}\n')
    p = small_lock(tmp_path, bad)
    line = next(i for i, l in enumerate(p.read_text().splitlines(), 1) if var in l)
    assert cli.main(["lock", "check", "--lock", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"reprostack: error: {p}:{line}: stacks.gin.env.{var}: {var} is a loader variable: it decides which "
        f"libraries (which NCCL) every process of a gate loads; a stack sets it only with its reason under "
        f"`stacks.gin.env-why.{var}`"
    )
    why = bad.replace(
        "    extends: campaign\n", f"    extends: campaign\n    env-why: {{{var}: the fork's plugin lives there}}\n"
    )
    p = small_lock(tmp_path, why)
    assert cli.main(["lock", "check", "--lock", str(p)]) == 0
    capsys.readouterr()
    assert load(p, stack="gin").env[var] == "/opt/x/lib"
    assert cli.main(["stacks", "--lock", str(p)]) == 0
    assert f"  {var} (a loader variable) because: the fork's plugin lives there" in capsys.readouterr().out
    stray = GIN.replace("    extends: campaign\n", "    extends: campaign\n    env-why: {LD_PRELOAD: no reason}\n")
    with pytest.raises(LockError, match="stacks.gin.env-why.LD_PRELOAD: stack gin's env does not set LD_PRELOAD"):
        load(small_lock(tmp_path, stray))


def test_stacks_diff_without_two_stacks_lists_them(tmp_path, capsys):
    """Issue 29 item 9: `stacks diff` without arguments said only `expected stacks or stacks diff A B`; now it lists
    the stacks it can compare."""
    p = small_lock(tmp_path, GIN)
    for args in (["stacks", "diff"], ["stacks", "diff", "campaign"]):
        assert cli.main([*args, "--lock", str(p)]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"reprostack: error: {' '.join(args)}: name two stacks, `stacks diff A B` (stacks: campaign, gin)"


@pytest.mark.parametrize(
    "gate,anchor,indent",
    [
        ("micro", "\nenv:\n", "  "),  # top level
        ("micro", "  gin-gdaki:\n    description:", None),  # stacks.<name>.env (added)
        ("vllm", "    server:\n      port: 0\n      env:\n", "        "),  # a profile's server env
        ("megatron", "    needs-efa: true\n    env:\n", "      "),  # a profile's env
        ("fabric", "    env:  # docs/campaign.md common env (never IBGDA/GDAKI on EFA)\n", "      "),
    ],
)
def test_no_gate_spec_env_sets_a_loader_variable(tmp_path, gate, anchor, indent):
    """Issue 29 item 6: the lock refuses LD_* in a stack's env without its reason, but a gate spec's env (which goes
    over the lock stack's) could still set LD_PRELOAD anywhere: top level, a profile, a server, `stacks.<s>.env`.
    Every spec kind (micro, serving, training, fabric) now refuses it at its line, saying where it belongs."""
    from reprostack.gates.registry import gate as gate_of

    (tmp_path / "gates").mkdir()
    text = (REPO_ROOT / "gates" / f"{gate}.yaml").read_text()
    assert anchor in text, anchor  # gates/vllm.yaml has one per profile: the first (a profile's server env) will do
    if indent is None:  # a stack entry without env: give it one
        add = anchor.replace("description:", "env: {LD_PRELOAD: /tmp/libnccl.so.2}\n    description:")
    else:
        add = anchor + f"{indent}LD_PRELOAD: /tmp/libnccl.so.2\n"
    bad = text.replace(anchor, add, 1)
    (tmp_path / "gates" / f"{gate}.yaml").write_text(bad)
    line = next(i for i, l in enumerate(bad.splitlines(), 1) if "LD_PRELOAD: /tmp" in l)
    with pytest.raises(GateSpecError) as e:
        gate_of(gate).load(tmp_path)  # the gate's own loader (micro, serving, training, fabric)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'gates' / gate}.yaml:{line}: "), msg
    assert "env.LD_PRELOAD: LD_PRELOAD is a loader variable" in msg
    assert "upstreams.lock stack's env with its reason under `env-why`" in msg
