"""`reprostack bench` on the CPU with a real local git stack: gate micro cold (fresh cache) then warm gives SKIP twice
(no GPU here), the same verdict, and a JSON with both walls, per-stage seconds, host and lock sha256; `bench cpu`
fetches every mirrored pin cold and warm. Figures are written, never asserted as speeds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import median

import pytest

from reprostack.lock import load
from test_sources import make_stack, write_project

REPO = Path(__file__).resolve().parents[1]


def cli(cwd: Path, *args: str, **env) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("REPROSTACK_MIRRORS", "REPROSTACK_CACHE")}
    e.update(env)
    e["PYTHONPATH"] = str(REPO / "src")
    return subprocess.run(
        [sys.executable, "-m", "reprostack", *args], cwd=cwd, env=e, capture_output=True, text=True, timeout=600
    )


@pytest.fixture
def project(tmp_path):
    stack = make_stack(tmp_path / "srv")
    root = tmp_path / "project"
    lock = write_project(root, stack)
    return root, load(lock), stack


def test_bench_gate_micro_cold_then_warm_same_verdict(project, tmp_path):
    root, lock, _ = project
    (tmp_path / "house").mkdir()
    p = cli(
        root,
        "bench",
        "gate_micro",
        "--host",
        "cpu test",
        "--results",
        "res",
        "--work",
        "w",
        REPROSTACK_WHEELHOUSE=str(tmp_path / "house"),
        PATH="/usr/bin:/bin",
    )  # no nvidia-smi: SKIP
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"cold = fresh cache dir {root / 'w' / 'gate_micro' / 'cache'}; wheelhouse pre-seeded" in p.stdout
    res = json.loads((root / "res" / "gate_micro-cpu-test.json").read_text())
    assert res["lock_sha256"] == lock.sha256 and res["host"] == "cpu-test"
    assert res["verdict"] == {"cold": "skip", "warm": "skip", "same": True}
    assert res["cold_s"] > 0 and res["warm_s"] > 0
    assert not res["runs"]["cold"]["stages_s"] == {} and "sources_s" in res["runs"]["warm"]["stages_s"]
    assert res["runs"]["warm"]["report"].endswith("warm/micro.json")


def test_bench_names_a_run_that_wrote_no_report(project):
    root, _, _ = project
    p = cli(root, "bench", "gate_micro", "--results", "res", "--work", "w", "--", "--profile", "nope")
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "micro.json: the benched run wrote no readable report" in p.stderr and "no profile 'nope'" in p.stderr
    assert not (root / "res").exists()


def test_bench_cpu_fetches_mirrored_pins_cold_and_warm(project):
    root, lock, stack = project
    p = cli(
        root, "bench", "cpu", "--host", "h", "--results", "res", "--work", "w", "--mirror", f"{stack.srv}={stack.srv}"
    )
    assert p.returncode == 0, p.stderr
    res = json.loads((root / "res" / "cpu-h.json").read_text())
    assert res["pins_fetched"] == ["deepep", "nccl"] and res["pins_without_mirror"] == []
    assert {"fetch_cold_s", "fetch_warm_s", "lock_check_s", "cli_start_s"} <= set(res)
    assert res["lock_sha256"] == lock.sha256
    for key in ("lock_check", "cli_start"):  # every run recorded, the headline their median (never the best)
        s = res[key]
        assert len(s["samples"]) == s["n"] == 5 and res[f"{key}_s"] == s["median"] == round(median(s["samples"]), 2)
        assert s["min"] == min(s["samples"]) and s["max"] == max(s["samples"])


def test_bench_repeat_records_every_run_and_heads_with_the_median(project, tmp_path):
    """`--repeat 2`: two cold+warm pairs, each cold on its own fresh cache; every run in `repeats`, the headline the
    median with min, max and n; the project it benched (here no git checkout: no commit, with why); `--repeat 0` is
    one line, exit 2, nothing written."""
    root, lock, _ = project
    p = cli(
        root,
        "bench",
        "gate_micro",
        "--repeat",
        "2",
        "--host",
        "h",
        "--results",
        "res",
        "--work",
        "w",
        PATH="/usr/bin:/bin",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads((root / "res" / "gate_micro-h.json").read_text())
    assert res["n"] == 2 and len(res["repeats"]) == 2
    for i, r in enumerate(res["repeats"], 1):
        assert r["verdict"] == {"cold": "skip", "warm": "skip", "same": True}
        assert r["runs"]["cold"]["report"] == str(root / "w" / "gate_micro" / f"r{i}" / "cold" / "micro.json")
    colds = [r["cold_s"] for r in res["repeats"]]
    assert res["cold"]["samples"] == colds and res["cold"]["n"] == 2
    assert res["cold_s"] == res["cold"]["median"] == round(median(colds), 2)
    assert res["cold"]["min"] == min(colds) and res["cold"]["max"] == max(colds)
    assert res["project"]["commit"] is None and "not a git checkout" in res["project"]["why"]
    assert "bench gate_micro: n=2: cold median " in p.stdout
    p = cli(root, "bench", "gate_micro", "--repeat", "0", "--results", "res2", "--work", "w2")
    assert p.returncode == 2 and p.stderr.strip() == "reprostack: error: --repeat 0: at least 1"
    assert not (root / "res2").exists()


def test_bench_from_nothing_makes_a_venv_installs_and_runs_beside_the_seeded_cold(project):
    """`--from-nothing`: a fresh venv, this source checkout installed by pip (pip's configured index: no wheelhouse
    given), then the gate by that venv's Python on its own fresh cache; each step timed and the total reported
    beside the seeded cold run, never instead of it."""
    root, _, _ = project
    p = cli(
        root,
        "bench",
        "gate_micro",
        "--from-nothing",
        "--host",
        "h",
        "--results",
        "res",
        "--work",
        "w",
        PATH="/usr/bin:/bin",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads((root / "res" / "gate_micro-h.json").read_text())
    fn = res["repeats"][0]["from_nothing"]
    venv = root / "w" / "gate_micro" / "nothing-venv"
    assert (venv / "bin" / "reprostack").exists()  # installed, not borrowed from this interpreter
    assert fn["run"]["result"] == "skip" and fn["run"]["report"] == str(
        root / "w" / "gate_micro" / "nothing" / "run" / "micro.json"
    )
    assert fn["total_s"] == round(fn["venv_s"] + fn["install_s"] + fn["gate_s"], 2) and fn["install_s"] > 0
    assert fn["wheels_from"] == "pip's configured index"
    assert res["cold_from_nothing_s"] == fn["total_s"] and res["cold_from_nothing"]["n"] == 1
    assert res["cold_s"] == res["repeats"][0]["cold_s"]  # the seeded cold run is still there, beside it
    assert "bench gate_micro: from nothing " in p.stdout


def test_bench_runs_are_signed_with_their_transcripts_when_a_key_is_configured(project, tmp_path):
    """Each benched run signs its own folder; its cli.log, written by bench while the run signed, is signed after
    (reprostack attest's step): every file of each run folder is a subject."""
    import json as json_

    from reprostack import evidence
    from reprostack.evidence.attest.keys import entry_name

    root, _, _ = project
    signer = evidence.new_key(tmp_path / "k.pem")
    (tmp_path / "ring").mkdir()
    entry = evidence.public_entry(signer, "bencher")
    (tmp_path / "ring" / entry_name(entry)).write_text(json_.dumps(entry))
    (tmp_path / "house").mkdir()
    p = cli(
        root,
        *("bench", "gate_micro", "--host", "cpu", "--results", "res", "--work", "w"),
        REPROSTACK_WHEELHOUSE=str(tmp_path / "house"),
        REPROSTACK_SIGNING_KEY=str(tmp_path / "k.pem"),
        PATH="/usr/bin:/bin",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    for kind in ("cold", "warm"):
        c = evidence.check_folder(root / "w" / "gate_micro" / kind, evidence.Keyring.read(tmp_path / "ring"))
        assert c.ok and c.signed, c.problems
        assert [a["name"] for a in c.predicate["added_after"]] == ["cli.log"]
        assert f"bench gate_micro: {kind} attested: " in p.stdout


def test_bench_kernel_cache_lists_every_run_per_kind_and_merges_calls(project, tmp_path):
    """`--runs` (issue 41): each kind's runs as a list of seconds under its own key, merged across calls for the same
    lock, commit and host. On the CPU every run SKIPs (no GPU): no kernels came from anywhere, so the cold_miss and
    cold_hit runs are marked invalid (never a hit or a miss they were not), nothing is pushed, exit 1; a *_hit kind
    with no entry in the store and no cold_miss to make one is one line, exit 2."""
    root, lock, _ = project
    store = tmp_path / "kcache"
    args = ["bench", "gate_micro", "--host", "h", "--results", "res", "--work", "w", "--kernel-cache", str(store)]
    p = cli(root, *args, "--runs", "cold_miss,warm,cold_hit", "--repeat", "2", PATH="/usr/bin:/bin")
    assert p.returncode == 1, p.stdout + p.stderr
    res = json.loads((root / "res" / "kcache-h.json").read_text())
    assert [len(res[k]) for k in ("cold_miss", "warm", "cold_hit")] == [2, 2, 2]
    assert all(isinstance(x, float) and x > 0 for k in ("cold_miss", "warm", "cold_hit") for x in res[k])
    assert res["cold_miss_s"] == round(median(res["cold_miss"]), 2) and res["lock_sha256"] == lock.sha256
    assert len(res["invalid"]) == 4 and "cold_hit: kernels_from None, cache None, not cache/hit" in res["invalid"]
    assert res["verdicts"] == ["skip"] and "timeline_cold_hit" in res and "push_s" not in res
    assert not any(store.glob("*/envelope.json"))  # a SKIP built nothing: nothing pushed
    assert res["signing"]["key"].startswith("made for this bench") and (tmp_path / "kcache-keys").is_dir()
    p = cli(root, *args, "--runs", "cold_miss,warm", "--repeat", "1", PATH="/usr/bin:/bin")
    assert p.returncode == 1, p.stdout + p.stderr  # the merged record still holds the invalid runs
    res = json.loads((root / "res" / "kcache-h.json").read_text())
    assert len(res["warm"]) == 3 and len(res["cold_miss"]) == 3 and len(res["cold_hit"]) == 2
    assert len(res["calls"]) == 2 and len(res["invalid"]) == 5
    # a run that writes no report stops the call: one line, and what ran before it is written with the error
    p = cli(root, *args, "--runs", "cold_miss", "--results", "res3", "--", "--profile", "nope", PATH="/usr/bin:/bin")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "wrote no readable report" in p.stderr
    res = json.loads((root / "res3" / "kcache-h.json").read_text())
    assert res["calls"][0]["rounds_done"] == 0 and "wrote no readable report" in res["calls"][0]["error"]
    p = cli(root, *args, "--runs", "warm", "--results", "res2", PATH="/usr/bin:/bin")
    assert p.returncode == 2 and "needs cold_miss or cold_hit in the same call" in p.stderr
    p = cli(root, *args, "--runs", "cold_hit", "--results", "res2", PATH="/usr/bin:/bin")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "no entry to hit; measure cold_miss first" in p.stderr
    assert not (root / "res2").exists()


def test_a_later_kcache_call_keeps_the_earlier_calls_host_inventory(tmp_path):
    """The record a call merges into keeps the host inventory (and push time) of the calls before it: a call that
    measured only from_nothing_hit dropped it (results/bench/kcache-h100-2026-12-06-d.json, ce73115); another
    commit, lock or host starts a new record."""
    from reprostack.bench import _kcache_earlier

    inv = {"gpus": [{"name": "NVIDIA H100 80GB HBM3"}], "identity": {"machine_id": "m1"}}
    old = {"lock_sha256": "L", "host": "h100", "project": {"commit": "c1"}, "runs": {"cold_miss": [{"wall_s": 1}]}}
    path = tmp_path / "kcache-h100.json"
    path.write_text(json.dumps({**old, "host_inventory": inv, "push_s": 2.5, "calls": [{"kinds": ["cold_miss"]}]}))
    got = _kcache_earlier(path, "L", {"commit": "c1"}, "h100")
    assert got["host_inventory"] == inv and got["push_s"] == 2.5 and got["runs"] == old["runs"]
    assert "host_inventory" not in _kcache_earlier(path, "L", {"commit": "c2"}, "h100")
