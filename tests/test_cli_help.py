"""Issue 40 item 8: every help text a new user reads, and `reprostack --version`.

Every (sub)command's `--help` is rendered: none may show a stray `%` (argparse prints a description's `%%` as is),
raw JSON, or a default that is not the option's own; `--trials` states the defaults the gates use;
`preflight --help` names every check it runs (cluster.preflight.CHECKS); `--version` names the version and the
project commit of the code, and whether its tree is dirty.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from reprostack import cli, project
from reprostack.cluster.preflight import CHECKS

REPO = Path(__file__).resolve().parent.parent


def _parsers(p: argparse.ArgumentParser, path: tuple[str, ...] = ("reprostack",)):
    yield path, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield from _parsers(sp, (*path, name))


def _stated_default(help_text: str) -> str | None:
    m = re.search(r"\(default:? ([^;,)\s]+)", help_text)
    return m.group(1) if m else None


def test_every_help_has_no_stray_percent_no_raw_json_and_no_stale_default():
    bad = []
    seen = 0
    for path, p in _parsers(cli.parser()):
        seen += 1
        text = p.format_help()
        where = " ".join(path)
        if "%" in text.replace("95%", "").replace("% ", ""):  # a percentage reads `95%` or `5% `; `%%` never
            bad.append(f"{where}: a stray % in {re.search(r'.{0,30}%.{0,10}', text).group()!r}")
        if re.search(r"[{\[]\s*['\"]", text):
            bad.append(f"{where}: raw JSON in the help")
        for a in p._actions:
            if not a.help or a.help == argparse.SUPPRESS or a.default in (None, False, True, [], argparse.SUPPRESS):
                continue
            shown = p._get_formatter()._expand_help(a)
            stated = _stated_default(shown)
            if stated is None:
                continue
            try:
                ok = float(stated) == float(a.default)
            except (TypeError, ValueError):
                ok = not any(ch in stated for ch in "/_.-") or stated == str(a.default)
            if not ok:
                bad.append(f"{where} {a.option_strings}: help says default {stated}, the option's is {a.default!r}")
    assert seen >= 18 and not bad, "\n".join(bad)


def test_every_subcommand_help_exits_0_and_prints_its_usage(capsys):
    import pytest

    for path, _p in _parsers(cli.parser()):
        with pytest.raises(SystemExit) as e:
            cli.main([*path[1:], "--help"])
        out = capsys.readouterr().out
        assert e.value.code == 0 and out.startswith(f"usage: {' '.join(path)}"), path


def test_trials_help_states_the_defaults_the_gates_use():
    from reprostack.gates import micro, serving

    sp = next(p for path, p in _parsers(cli.parser()) if path == ("reprostack", "gate"))
    text = " ".join(sp.format_help().split())
    assert f"(default {micro.DEFAULT_TRIALS};" in text  # the micro gate's trials in one launch
    assert f"(default {serving.DEFAULT_TRIALS} on a GPU profile, 1 on local-test" in text  # it said 1: AIPerf ran 3


def test_preflight_help_names_every_check():
    r = subprocess.run([sys.executable, "-m", "reprostack", "preflight", "--help"], capture_output=True, text=True)
    text = " ".join(r.stdout.split())
    assert r.returncode == 0
    missing = [c for c in CHECKS if f" {c} (" not in text]
    assert not missing, missing
    assert "fi_pingpong" in text and "gdrdrv" in text and "hugepages" in text and "fabricmanager" in text


def test_nodes_help_says_what_the_number_is():
    sp = next(p for path, p in _parsers(cli.parser()) if path == ("reprostack", "gate"))
    text = " ".join(sp.format_help().split())
    assert "--nodes N how many nodes the run spans (default: the gate profile's node count" in text


def test_version_names_the_version_and_the_project_commit():
    r = subprocess.run([sys.executable, "-m", "reprostack", "--version"], capture_output=True, text=True, cwd="/")
    st = project.state(REPO)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    line = r.stdout.strip()
    assert line.startswith("reprostack 0.") and "\n" not in line
    if st.get("commit"):
        assert f"project commit {st['commit']}, " in line
        assert line.endswith("clean)") if st["dirty"] is False else "dirty: " in line
    else:
        assert "project commit unknown: " in line
