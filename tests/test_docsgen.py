"""`reprostack docs` (reprostack.report.docsgen, evidence.bars.benchstats): the committed docs' generated blocks are what
results/ gives (CI fails otherwise); a changed result makes `--check` name the block; broken markers are one line;
bench summaries are every run's median with min/max and n, a copy counted once, machines named only by recorded
identity."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from reprostack import cli
from reprostack.evidence.bars.benchstats import bench_runs, machine, spread, summary
from reprostack.report.docsgen import DocsError, generate

ROOT = Path(__file__).resolve().parents[1]
K5 = "results/gate_micro/2026-12-02-h200-ep1-k5"


def test_the_committed_docs_are_what_results_give(capsys, monkeypatch):
    """CI: `reprostack docs --check` over this repository exits 0 (a figure typed into a generated block, or a
    result committed without `nox -s docs`, fails here)."""
    monkeypatch.chdir(ROOT)
    assert cli.main(["docs", "--check"]) == 0, capsys.readouterr().out
    status, bench = (ROOT / "docs" / "status.md").read_text(), (ROOT / "docs" / "bench.md").read_text()
    history = (ROOT / "docs" / "history.md").read_text()
    assert "| `results/gate_micro/2026-12-02-h200-ep1-k5/micro.json` | micro [h200-ep1] | campaign | PASS |" in status
    assert "| every committed run (code versions mixed) |" in bench
    assert "$ reprostack history --no-plots --db /tmp/h.sqlite3   # on the committed results/\nhistory: " in history
    assert "| nccl-tests | https://github.com/NVIDIA/nccl-tests |" in (ROOT / "README.md").read_text()


def project(tmp_path: Path, block: str) -> Path:
    root = tmp_path / "proj"
    (root / "docs").mkdir(parents=True)
    shutil.copy(ROOT / "upstreams.lock", root / "upstreams.lock")
    shutil.copytree(ROOT / K5, root / K5)
    (root / "README.md").write_text(f"# t\n\n{block}\n\ntail\n")
    (root / "docs" / "stacks.md").write_text("# stacks\n")
    (root / "docs" / "architecture.md").write_text("# architecture\n")
    return root


OPEN = "<!-- generated: {} (reprostack docs; from results/, never typed) -->\n<!-- end generated: {} -->"


def test_a_changed_result_makes_check_name_the_block_and_docs_write_it(tmp_path, capsys, monkeypatch):
    root = project(tmp_path, OPEN.format("results", "results") + "\n\n" + OPEN.format(f"compare {K5}", "compare"))
    monkeypatch.chdir(root)
    before = (root / "README.md").read_text()
    assert cli.main(["docs", "--check"]) == 1
    out = capsys.readouterr().out
    assert "README.md: block `results` differs from what results/ gives (run `nox -s docs`)" in out
    assert f"README.md: block `compare {K5}` differs" in out
    assert (root / "README.md").read_text() == before  # --check wrote nothing
    assert cli.main(["docs"]) == 0 and cli.main(["docs", "--check"]) == 0
    text = (root / "README.md").read_text()
    assert "dc_p50_us 14.41 [14.37, 14.44] n=5 us (<= 30)" in text and text.endswith("\n\ntail\n")
    assert "| D+C p50 (us), mean [95% CI] n | 14.41 [14.37, 14.44] n=5 |" in text
    p = root / K5 / "micro.json"
    doc = json.loads(p.read_text())
    doc["data"]["statistics"]["dc_p50_us"]["mean"] = 13.0  # a result changed after the docs were made
    p.write_text(json.dumps(doc))
    capsys.readouterr()
    assert cli.main(["docs", "--check"]) == 1
    out = capsys.readouterr().out
    assert "block `results` differs" in out and f"block `compare {K5}` differs" in out
    typed = text.replace("14.41 [14.37, 14.44] n=5 |", "14.2 [14.1, 14.3] n=5 |")  # a figure typed over
    p.write_text(
        json.dumps(
            {
                **doc,
                "data": {
                    **doc["data"],
                    "statistics": json.loads((ROOT / K5 / "micro.json").read_text())["data"]["statistics"],
                },
            }
        )
    )
    (root / "README.md").write_text(typed)
    assert cli.main(["docs", "--check"]) == 1 and "block `compare" in capsys.readouterr().out


@pytest.mark.parametrize(
    "block, why",
    [
        (
            OPEN.format("nonesuch", "nonesuch"),
            "README.md: block `nonesuch`: no such generator (results, bench, history-bench, compare, images, mirrors, suite, kcache, history, gates)",
        ),
        (OPEN.format("compare", "compare"), "block `compare` names no report folder"),
        (OPEN.format("compare results/nope", "compare"), "block `compare`: results/nope: no micro.json"),
        (OPEN.format("results", "results").split("\n")[0] + "\nno end", "a `<!-- generated:` marker without its end"),
    ],
)
def test_a_broken_marker_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, block, why):
    root = project(tmp_path, block)
    monkeypatch.chdir(root)
    before = (root / "README.md").read_text()
    assert cli.main(["docs"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and why in err[0], err
    assert (root / "README.md").read_text() == before
    with pytest.raises(DocsError):
        generate(root, check=True)


def bench_file(path: Path, **kw) -> Path:
    doc = {"bench": "gate_micro", "date": "2026-12-03T00:00:00Z", "cold_s": 100.0, "warm_s": 20.0}
    doc["verdict"] = {"cold": "pass", "warm": "pass", "same": True}
    doc.update(kw)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def test_bench_runs_are_every_run_once_grouped_by_recorded_code(tmp_path):
    b = tmp_path / "results" / "bench"
    reps = [
        {"cold_s": c, "warm_s": w, "verdict": {"cold": "pass", "warm": "pass"}}
        for c, w in ((120, 25), (110, 27), (130, 26))
    ]
    reps[1]["from_nothing"] = {"total_s": 300.0}
    reps[0]["runs"] = {"cold": {"stages_s": {"test_s": 30.0, "deepep_build_s": 70.0, "bad": "x"}}}
    proj = {"commit": "a" * 40, "dirty": False}
    bench_file(b / "x" / "gate_micro-h200.json", repeats=reps, project=proj, cold_s=120, warm_s=26)
    shutil.copy(b / "x" / "gate_micro-h200.json", b / "gate_micro-h200.json")  # the latest, kept at the top: once
    bench_file(b / "y" / "gate_micro-h200.json", cold_s=90.0)
    (b / "z").mkdir()
    (b / "z" / "gate_micro-h200.json").write_text("[1]")
    skipped: list = []
    runs = bench_runs(b, skipped)
    assert skipped == ["results/bench/z/gate_micro-h200.json"]
    assert [(r.group, r.cold_s) for r in runs] == [
        ("project aaaaaaaa", 120.0),
        ("project aaaaaaaa", 110.0),
        ("project aaaaaaaa", 130.0),
        ("results/bench/y", 90.0),
    ]
    assert spread([r.cold_s for r in runs if r.group.startswith("project")]) == "120 [110, 130] n=3"
    assert [r.from_nothing_s for r in runs] == [None, 300.0, None, None]  # measured only where the run did it
    assert runs[0].stages == (("cold", {"test_s": 30.0, "deepep_build_s": 70.0}),)
    assert [r.stages for r in runs][-1] == ()  # a run without stage times shows none, never zeros
    assert summary([]) is None and spread([None]) == "—"


def test_a_machine_is_named_only_by_its_recorded_identity():
    ident = {"machine_id": "0123456789abcdef", "boot_id": "fedcba98-7654", "gpu_uuids": ["GPU-0c1d2e3f-aaaa-bbbb"]}
    assert machine({"identity": ident}) == "machine-id 01234567, boot fedcba98, GPU GPU-0c1d2e3f"
    old = {"hostname": "vm", "gpus": [{"pci_bus_id": "00000000:00:06.0"}]}
    assert machine(old) == "not recorded (host name vm, GPU bus 00000000:00:06.0)"
    assert machine("junk").startswith("not recorded")


def test_images_block_is_the_chain_record_and_the_twice_records(tmp_path):
    """The images block: each step's seconds, image id, size and context from results/images/chain.json, the total,
    the downloads, one line per `*-twice.json`; no record is a line saying so, never a crash."""
    from reprostack.report.docsgen import gen_images

    root = tmp_path / "p"
    d = root / "results" / "images"
    d.mkdir(parents=True)
    assert gen_images(root, []).startswith("(no image chain record: results/images/chain.json: ")
    chain = {
        "kind": "image-chain",
        "project_commit": "c" * 40,
        "from_scratch": True,
        "steps": [
            {"step": "base debian-12-build (debsbase)", "seconds": 181.2},
            {
                "step": "build substrate",
                "seconds": 1234.4,
                "image_id": "sha256:" + "ab" * 32,
                "size_bytes": 9_100_000_000,
                "context_bytes": 2_800_000_000,
            },
            {"step": "build deepep", "status": "reused", "seconds": 0.4, "image_id": "sha256:" + "cd" * 32},
            {"step": "build vllm", "status": "built", "seconds": 25.0, "cached_steps": 21},
            {"step": "build megatron", "status": "failed", "seconds": 2.5, "error": "reprostack: error: x.yaml:3: `y`"},
            {"step": "build sglang", "status": "skipped", "seconds": 0.0, "reason": "3.2 GB free on the engine's disk"},
        ],
        "seconds_total": 1415.7,
        "downloads": {
            "debs": {"pin": "debian-12-build", "files": 217, "bytes": 164_259_320},
            "wheels": [{"pin": "substrate-wheels-cp311", "files": 29, "bytes": 2_747_700_658}],
        },
    }
    (d / "chain.json").write_text(json.dumps(chain))
    (d / "substrate-twice.json").write_text(
        json.dumps({"image": "substrate", "layers_identical": "9 of 10", "files_identical": True, "files": 5})
    )
    (d / "cuda-toolkit-twice.json").write_text(
        json.dumps({"image": "cuda-toolkit", "project_commit": "e" * 40, "layers_identical": "4 of 4", "files": 2})
    )
    (d / "deepep-twice.json").write_text("{")
    out = gen_images(root, [])
    assert "commit cccccccccccc, from scratch" in out and "1416 s in all" in out
    assert "| build substrate | 1234 | abababababab | 9,100 MB | 2,800 MB |" in out
    # a reused or failed step says so; a failed one's error line follows the table (a gate image the chain stops)
    assert (
        "| build deepep (reused) | 0.4 | cdcdcdcdcdcd |  |  |" in out
        and "| build vllm (21 steps from the layer cache) | 25 |" in out
        and "| build megatron (failed) | 2.5 |  |  |  |" in out
    )
    assert "- build megatron: stopped by `reprostack: error: x.yaml:3: 'y'`" in out
    assert (
        "| build sglang (skipped) | 0 |" in out
        and "- build sglang: not built here: 3.2 GB free on the engine's disk" in out
    )
    assert "217 .debs of pin debian-12-build (164 MB); 29 wheels of pin substrate-wheels-cp311 (2,748 MB)" in out
    # issue 39: "from scratch" and the machine are said only where a record measured them, never typed
    assert "- substrate: built twice, layers identical 9 of 10, files identical True (5 files)" in out
    assert "2-core" not in out and "commit cccccccccccc, from scratch (its machine not recorded): 1416 s" in out
    assert "- results/images/deepep-twice.json: cannot be read" in out
    # a twice record names the commit it was built at (the chain's table may be of a later one)
    assert "- cuda-toolkit: built twice at project commit eeeeeeeeeeee, layers identical 4 of 4" in out
    chain["host"] = {"cpus": 16, "machine": "x86_64"}
    (d / "chain.json").write_text(json.dumps(chain))
    (d / "cuda-toolkit-twice.json").write_text(
        json.dumps({"image": "cuda-toolkit", "project_commit": "c" * 40, "layers_identical": "4 of 4", "files": 2})
    )
    (d / "substrate-twice.json").write_text(json.dumps({"image": "substrate", "second_from_scratch": True, "files": 5}))
    out = gen_images(root, [])
    assert "from scratch, on a 16-CPU machine: 1416 s in all" in out
    assert (
        "- cuda-toolkit: built twice from scratch (chain.json of that commit: no step from the layer cache) at " in out
    )
    assert "- substrate: built twice from scratch, layers identical 0 of 0" in out
    # files that differ are named, with the ELF sections where they differ (never a bare "files identical False")
    so = "/opt/venv/x/_C.so"
    (d / "deepep-twice.json").write_text(json.dumps({
        "image": "deepep", "layers_identical": "24 of 26", "files_identical": False, "files": 9,
        "files_differ": ["/opt/reprostack/kernels.json", so],
        "key_files": [{"path": so, "sections_differ": [".strtab"]}, {"path": "/x", "sections_differ": []}],
    }))  # fmt: skip
    assert (
        "- deepep: built twice, layers identical 24 of 26, files identical False (9 files; differ: "
        f"`/opt/reprostack/kernels.json`, `{so}` (sections .strtab))" in gen_images(root, [])
    )


def test_suite_block_lists_every_timing_run_with_its_load_and_the_median(tmp_path):
    """Issue 29 item 11: the README said the suite was "kept under 15 minutes", typed. The `suite` block is made from
    results/bench/suite-*.json (scripts/bench_suite.py): what was timed, the commit, workers, every run with its load
    average before it, and the median; a record that is not one is one line naming it."""
    from reprostack.report.docsgen import DocsError, gen_suite

    b = tmp_path / "results" / "bench"
    b.mkdir(parents=True)
    run = {"wall_s": 600.5, "tests": 1600, "failed": 0, "errors": 0, "loadavg_before": [0.12, 0.3, 0.2]}
    doc = {
        "bench": "suite",
        "what": ".ci/run",
        "project": {"commit": "abcdef0123456789", "dirty": False},
        "cpus": 2,
        "test_workers": "2",
        "runs": [run, {**run, "wall_s": 660.0, "failed": 1}],
        "headline": {"median_wall_s": 630.25},
    }
    (b / "suite-vm-2026-12-03T180000Z.json").write_text(json.dumps(doc))
    out = gen_suite(tmp_path, [])
    row = out.splitlines()[2]
    assert row.startswith("| `results/bench/suite-vm-2026-12-03T180000Z.json` | .ci/run | abcdef01 | 2 | 2 |"), row
    assert "600.5 (0.12), 660 (0.12)" in row and "1600 (0), 1600 (1)" in row and "630.2 s (10.5 min)" in row, row
    (b / "suite-bad.json").write_text('{"bench": "suite"}')
    with pytest.raises(DocsError, match=r"block `suite`: results/bench/suite-bad\.json: not a suite record"):
        gen_suite(tmp_path, [])


def test_cubins_md_names_its_image_where_a_record_holds_it():
    """Issue 39: results/images/cubins.md cited the deepep image of `chain.json` after chain.json had been made again
    with another image. Each image id it cites is in the current chain.json, or in the chain.json of the commit it
    names (`as committed in C`)."""
    import re
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    text = (repo / "results" / "images" / "cubins.md").read_text()
    current = (repo / "results" / "images" / "chain.json").read_text()
    for m in re.finditer(r"image id\s+`(sha256:[0-9a-f]{64})`", text):
        if m.group(1) in current:
            continue
        at = re.search(r"as committed in ([0-9a-f]{7,40})", text[m.end() : m.end() + 300])
        assert at, f"cubins.md cites {m.group(1)[:19]}, which the current chain.json does not hold, and names no commit"
        old = subprocess.run(
            ["git", "-C", str(repo), "show", f"{at.group(1)}:results/images/chain.json"], capture_output=True, text=True
        ).stdout
        assert m.group(1) in old, f"{m.group(1)[:19]} is not in chain.json of {at.group(1)}"


def test_generated_tables_show_no_absolute_developer_path():
    """Issue 40 item 7: the results table showed `/work/main/gates/nemo_rl.yaml` (a report's reason, recorded on the
    developer's machine). Every generated block now shows such a path from the project folder or the cache."""
    from reprostack.report.docsgen import doc_files, scrub

    assert scrub("/work/main/gates/nemo_rl.yaml: no profile") == "gates/nemo_rl.yaml: no profile"
    assert (
        scrub("frame: /tmp/reprostack-cache/builds/deepep-f6/site/x.py:3")
        == "frame: <cache>/builds/deepep-f6/site/x.py:3"
    )
    assert scrub("see results/gate_micro/a.json and 1/2 ratio") == "see results/gate_micro/a.json and 1/2 ratio"
    files = doc_files(ROOT)
    assert files[0] == "README.md" and "docs/status.md" in files and "docs/history.md" in files
    for rel in files:
        text = (ROOT / rel).read_text()
        for block in re.findall(r"<!-- generated: .*?<!-- end generated", text, re.S):
            assert not re.search(r"\| [^|]*(/work/|/home/|/root/|/tmp/reprostack-cache)", block), rel


def test_a_headline_from_statistics_shows_a_check_value_that_says_otherwise():
    """Issue 39: the results block's headline of a check judged on an interval is made from data.statistics, so an
    edited check value (the verdict's input) left the block, and `docs --check`, unchanged. Now it shows."""
    from reprostack.report.docsgen import headline

    src = Path(__file__).resolve().parents[1] / "results" / "gate_micro" / "2026-12-02-h200-ep1-k5" / "micro.json"
    doc = json.loads(src.read_text())
    before = headline(doc)
    assert "check value" not in before
    next(c for c in doc["checks"] if c["metric"] == "dc_p50_us")["value"] = 9.5
    after = headline(doc)
    assert after != before and "[check value 9.5, not the mean]" in after


def test_kcache_block_lists_every_run_the_median_and_whether_it_meets_its_goal(tmp_path):
    """Issue 41: the kernel cache's figures in docs come from results/bench/kcache-*.json, each kind's every run, the
    median, the goal the record names and whether the median meets it (never typed); a file that is not JSON is one
    line naming it."""
    from reprostack.report.docsgen import DocsError, gen_kcache

    b = tmp_path / "results" / "bench"
    b.mkdir(parents=True)
    doc = {
        "bench": "kcache_gate_micro",
        "project": {"commit": "f91999c05379de31", "dirty": False},
        "host_inventory": {"gpus": [{"name": "NVIDIA H100 80GB HBM3", "driver_version": "580.159.04"}]},
        "targets_s": {"cold_hit": 45.0, "from_nothing_hit": 75.0},
        "cold_hit": [58.03, 60.98, 57.82],
        "from_nothing_hit": [67.98, 68.99, 66.67],
        "runs": {"cold_hit": [{"stages_s": {"deepep_build_s": 4.13, "test_s": 45.54, "total_s": 56.16}}]},
    }
    (b / "kcache-h100-2026-12-06-b.json").write_text(json.dumps(doc))
    rows = gen_kcache(tmp_path, []).splitlines()
    assert rows[2] == (
        "| `results/bench/kcache-h100-2026-12-06-b.json` | NVIDIA H100 80GB HBM3, driver 580.159.04 | f91999c0 | "
        "cold_hit | 58.03, 60.98, 57.82 | 58.03 | 45 | no |"
    )
    assert rows[3].endswith("| from_nothing_hit | 67.98, 68.99, 66.67 | 67.98 | 75 | yes |")
    assert "| cold_hit | — | — | 4.13 | — | 45.54 | 56.16 |" in rows[-2]
    (b / "kcache-bad.json").write_text("{not json")
    with pytest.raises(DocsError, match=r"block `kcache`: results/bench/kcache-bad\.json: not JSON"):
        gen_kcache(tmp_path, [])


def test_kcache_block_takes_the_gpu_from_the_device_scripts_gpu_txt_when_the_record_has_no_inventory(tmp_path):
    """A record whose calls merged without a host inventory (the from_nothing_hit call of ce73115 kept none:
    results/bench/kcache-h100-2026-12-06-d.json) names its GPU from the gpu.txt lines the device script wrote beside
    its run folders, said as such; lines that disagree, or none, give `?`, never a guess."""
    from reprostack.report.docsgen import gen_kcache

    b = tmp_path / "results" / "bench"
    (b / "kcache-h100-x" / "call-1").mkdir(parents=True)
    (b / "kcache-h100-x" / "call-2").mkdir()
    doc = {"bench": "kcache_gate_micro", "project": {"commit": "ce7311582669"}, "cold_hit": [38.26]}
    (b / "kcache-h100-x.json").write_text(json.dumps(doc))
    for call in ("call-1", "call-2"):
        (b / "kcache-h100-x" / call / "gpu.txt").write_text("NVIDIA H100 80GB HBM3, 580.159.04, 9.0\n")
    row = gen_kcache(tmp_path, []).splitlines()[2]
    assert "| NVIDIA H100 80GB HBM3, driver 580.159.04 (gpu.txt) | ce731158 | cold_hit |" in row
    (b / "kcache-h100-x" / "call-2" / "gpu.txt").write_text("NVIDIA H200, 580.159.04, 9.0\n")
    assert "| ?, driver ? | ce731158 |" in gen_kcache(tmp_path, []).splitlines()[2]
