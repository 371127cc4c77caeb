"""Container mode (reprostack.gates.container): a gate run inside an image on a real engine, CPU only.

End to end: the chain from the Debian test base (`reprostack-test/debian:12`, debootstrap + docker import, made by
the tests session's install step) -> containers/gate-selftest (reprostack's pinned deps + the pinned AIPerf from the
lock's wheel sets, built offline from the wheels the install step fetched into $REPROSTACK_TEST_TOOLS), then
`reprostack gate vllm --profile local-test --container`: the test server and AIPerf run inside the container, the
reports come back through the out mount and are read back as untrusted input. Also: the plan a GPU profile's
container gets, the one-line errors (no engine, --image without --container, a report that is not this run's)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import dockerd
from conftest import without_progress
from reprostack import cli
from reprostack.containers.engine import BuildOptions, build_images
from reprostack.errors import GateError
from reprostack.gates import registry
from reprostack.gates.container import container_plan, read_report
from reprostack.gates.options import GateOptions as GateArgs
from reprostack.launch.plan import docker_run_kwargs
from reprostack.lock import load
from reprostack.report import GateReport, Result, artifact_for, evaluate, utc_now, write_reports
from reprostack.sources import FetchOptions
from test_gate_serving import TOOLS, small_root

docker_client, test_base, debian_base = dockerd.docker_client, dockerd.test_base, dockerd.debian_base
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def lock():
    return load(REPO / "upstreams.lock")


@pytest.fixture(scope="session")
def gate_image(docker_client, debian_base, lock, tmp_path_factory):
    """containers/gate-selftest built once per session (offline: wheels from the install step's cache)."""
    opts = BuildOptions(
        root=REPO,
        lock=lock,
        fetch=FetchOptions.make(TOOLS, offline=True),
        offline=True,
        out_dir=tmp_path_factory.mktemp("build"),
        client=docker_client,
        show_progress=False,
    )
    (img,) = build_images(["gate-selftest"], opts)
    return img


def _cli(*args) -> int:
    return cli.main(["gate", *args])


def test_vllm_local_test_runs_in_its_container_end_to_end(docker_client, gate_image, tmp_path):
    root = small_root(tmp_path, "vllm")  # one cell (c4): the spec, the lock, AIPerf's constraints
    for d in ("containers", "patches"):  # the gate's recipe chain (its plan names the image); copies: the
        shutil.copytree(REPO / d, root / d)  # root is mounted into the container, a symlink would lead nowhere
    out = tmp_path / "out"
    (out / "vllm.json").parent.mkdir(parents=True)
    (out / "vllm.json").write_text('{"stale": true}')  # an earlier run's report is never taken for this one
    rc = _cli(
        "vllm",
        "--container",
        "--image",
        gate_image.tag,
        "--profile",
        "local-test",
        "--arm",
        "deepep",
        "--lock",
        str(root / "upstreams.lock"),
        "--out",
        str(out),
    )
    rep = json.loads((out / "vllm.json").read_text())
    assert rc == 3, rep["reason"]  # a local-test pass is never evidence: exit 3, as on the host
    assert rep["result"] == "pass" and rep["profile"] == "local-test" and rep["evidence"] is False
    ex = rep["provenance"]["execution"]
    assert ex["mode"] == "container" and ex["image"] == "gate-selftest"
    assert ex["image_id"] == gate_image.image_id == docker_client.images.get(gate_image.tag).id
    assert ex["lock_sha256"] == load(root / "upstreams.lock").sha256 and ex["container"]["exit_code"] == 3
    assert ex["inner"]["environment"]["executable"] == "/opt/reprostack/venv/bin/python3"  # ran in the image
    summary = (out / "summary.md").read_text()
    assert f"Ran in **container mode (gate-selftest {gate_image.image_id[:19]}…, lock " in summary
    # the raw server log, AIPerf's exports and the prefixed container log are in the out dir, as recorded
    paths = {a["path"] for a in rep["artifacts"]}
    assert "vllm/server.deepep.log" in paths and "vllm/deepep/c4/aiperf/profile_export_aiperf.json" in paths
    for a in rep["artifacts"]:
        assert artifact_for(out / a["path"]).sha256 == a["sha256"]
    log = (out / "logs" / "node-0.log").read_text().splitlines()
    assert (
        all(line.startswith("[node 0] ") for line in log)
        and "[node 0] vllm [local-test]: PASS (local-test, not evidence)" in log[-3]
        and log[-1].startswith("[node 0] unsigned: no key at ")  # the run's attestation line ends it
    )
    assert not docker_client.containers.list(all=True, filters={"id": ex["container"]["container_id"]})


def test_a_container_that_writes_no_report_is_the_gates_error(docker_client, gate_image, tmp_path):
    """The in-image runner refuses an unknown arm (its exit 2, no report): the gate is ERROR naming the exit
    code and the container's last line; an earlier report there is not read back as this run's."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "vllm.json").write_text('{"stale": true}')
    rc = _cli(
        "vllm", "--container", "--image", gate_image.tag, "--profile", "local-test", "--arm", "nope", "--out", str(out)
    )
    rep = json.loads((out / "vllm.json").read_text())
    assert rc == 1 and rep["result"] == "error"
    assert (
        rep["reason"].startswith(
            "the gate's container exited 2 without writing vllm.json (its last line: reprostack: error: "
        )
        and "nope" in rep["reason"]
    )
    assert rep["provenance"]["execution"]["image_id"] == gate_image.image_id


def test_an_image_the_engine_cannot_start_is_one_line_and_loses_nothing(docker_client, test_base, tmp_path, capsys):
    """The busybox base has no python3: the engine refuses the container; exit 2, the earlier report kept."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "vllm.json").write_text('{"earlier": true}')
    assert (
        _cli("vllm", "--container", "--image", "reprostack-test/base:1", "--profile", "local-test", "--out", str(out))
        == 2
    )
    err = without_progress(capsys.readouterr().err).strip().splitlines()
    assert len(err) == 1 and err[0].startswith("reprostack: error: gate vllm: the engine refused node 0's container")
    assert (out / "vllm.json").read_text() == '{"earlier": true}'


def test_gpu_profile_container_carries_gpus_efa_devices_and_ulimits(lock):
    g = registry.gate("vllm")
    a = GateArgs(out=Path("/tmp/out"), profile="p5en-efa-ep16", node_rank=1, master_addr="10.0.0.1")
    plan, prof = container_plan(g, a, lock, REPO, "reprostack/vllm:0123456789abcdef")
    assert prof.needs_gpu and plan.efa_devices_per_node == 16 and plan.gpus_per_node == 8
    efa = [f"/dev/infiniband/uverbs{i}" for i in range(16)]
    kw = docker_run_kwargs(plan, 1, efa_devices=efa)
    assert kw["image"] == "reprostack/vllm:0123456789abcdef"
    assert [(r["Count"], r["Capabilities"]) for r in kw["device_requests"]] == [(-1, [["gpu"]])]
    assert kw["devices"] == [f"{d}:{d}:rwm" for d in efa]
    assert {u["Name"]: (u["Soft"], u["Hard"]) for u in kw["ulimits"]} == {
        "memlock": (-1, -1),
        "stack": (67108864, 67108864),
    }
    assert kw["network_mode"] == "host" and kw["ipc_mode"] == "host" and kw["shm_size"] == "32g"
    argv = kw["command"]
    assert argv[:6] == ["python3", "-m", "reprostack", "gate", "vllm", "--no-container"]
    assert argv[argv.index("--profile") + 1] == "p5en-efa-ep16" and argv[argv.index("--node-rank") + 1] == "1"
    assert {m["Target"]: m["ReadOnly"] for m in kw["mounts"]} == {
        "/out": False,
        "/workspace": True,
        "/opt/reprostack/code/reprostack": True,
    } | ({"/models": True} if "/models" in {m["Target"] for m in kw["mounts"]} else {})


def test_container_without_an_engine_is_one_line_never_host_mode(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/nope.sock")
    out = tmp_path / "out"
    assert _cli("vllm", "--container", "--image", "x:1", "--profile", "local-test", "--out", str(out)) == 2
    err = without_progress(capsys.readouterr().err).strip().splitlines()
    assert len(err) == 1 and err[0].startswith("reprostack: error: --container: no Docker engine answers at unix://")
    assert "--no-container" in err[0] and not out.exists()


def test_container_needs_a_profile(tmp_path, capsys):
    assert _cli("vllm", "--container", "--out", str(tmp_path / "o")) == 2
    err = without_progress(capsys.readouterr().err).strip()
    assert err.startswith("reprostack: error: --container needs --profile (one of ") and "local-test" in err
    assert not (tmp_path / "o").exists()


def test_image_without_container_is_refused(tmp_path, capsys):
    assert _cli("vllm", "--image", "x:1", "--out", str(tmp_path / "o")) == 2
    assert (
        without_progress(capsys.readouterr().err).strip()
        == "reprostack: error: --image IMAGE needs --container (host mode runs no image)"
    )
    with pytest.raises(SystemExit):  # argparse: the two modes exclude each other
        cli.parser().parse_args(["gate", "vllm", "--container", "--no-container"])


def _written(out: Path, **kw) -> Path:
    (out / "vllm").mkdir(parents=True, exist_ok=True)
    (out / "vllm" / "server.log").write_text("ready\n")
    rep = GateReport(
        "vllm",
        "local-test",
        Result.PASS,
        "ok",
        checks=[evaluate("x", "", 1, ">=", 1)],
        artifacts=[artifact_for(out / "vllm" / "server.log", relative_to=out)],
        started=utc_now(),
        ended=utc_now(),
        duration_s=1.0,
    )
    for k, v in kw.items():
        setattr(rep, k, v)
    write_reports([rep], out)
    return out / "vllm.json"


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda p: p.write_text("{not json"), "is not JSON"),
        (
            lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "result": "great"})),
            "is not a gate report: result",
        ),
        (lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "gate": "sglang"})), "is for gate 'sglang'"),
        (
            lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "started": "2000-01-01T00:00:00Z"})),
            "not this run's report",
        ),
        (
            lambda p: p.write_text(
                json.dumps(
                    {
                        **json.loads(p.read_text()),
                        "artifacts": [{"path": "../outside.log", "sha256": "0" * 64, "bytes": 1}],
                    }
                )
            ),
            "names artifact '../outside.log', not a file",
        ),
        (lambda p: (p.parent / "vllm" / "server.log").write_text("changed\n"), "the file there has"),
    ],
)
def test_report_read_back_from_the_container_is_checked(tmp_path, damage, why):
    out = tmp_path / "out"
    before = utc_now()
    path = _written(out)
    assert read_report(path, "vllm", before, out).result == "pass"
    damage(path)
    with pytest.raises(GateError) as ei:
        read_report(path, "vllm", before, out)
    assert str(ei.value).startswith(f"{path}: the report the gate's container wrote ") and why in str(ei.value)


def test_prebuilt_aiperf_venv_must_carry_the_locks_marker(tmp_path, lock, monkeypatch):
    from reprostack.gates.aiperftool import ensure_aiperf

    venv = tmp_path / "aiperf"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "aiperf").write_text("")
    monkeypatch.setenv("REPROSTACK_AIPERF_VENV", str(venv))
    with pytest.raises(GateError, match=r"REPROSTACK_AIPERF_VENV=.*: no readable \.reprostack-verified\.json"):
        ensure_aiperf(lock, tmp_path / "cache", REPO)
    (venv / ".reprostack-verified.json").write_text(json.dumps({"version": "0.10.0", "sha256": "1" * 64}))
    with pytest.raises(GateError, match="names aiperf 0.10.0 sha256 1111"):
        ensure_aiperf(lock, tmp_path / "cache", REPO)
    sha = lock.get("aiperf").files[0].sha256
    (venv / ".reprostack-verified.json").write_text(json.dumps({"version": "0.10.0", "sha256": sha}))
    assert ensure_aiperf(lock, tmp_path / "cache", REPO).venv == venv
    assert not (tmp_path / "cache").exists()  # used as is: nothing built


def test_debian_base_records_what_it_holds(docker_client, debian_base):
    """The base is pinned by what it holds: every package's version and the Release date, in a file and labels."""
    import hashlib

    from reprostack.containers.debianbase import DEBIAN_BASE, L_DATE, L_PACKAGES, request_key

    labels = docker_client.images.get(DEBIAN_BASE).labels
    raw = docker_client.containers.run(
        DEBIAN_BASE, ["cat", "/etc/reprostack-debian-base.json"], remove=True, network_mode="none"
    )
    info = json.loads(raw)
    lines = "".join(f"{k} {v}\n" for k, v in sorted(info["packages"].items()))
    assert info["request"] == request_key() and info["release"]["codename"] == "bookworm"
    assert labels[L_PACKAGES] == info["packages_sha256"] == hashlib.sha256(lines.encode()).hexdigest()
    assert labels[L_DATE] == info["release"]["date"] and "python3" in info["packages"]


def test_an_engine_without_an_nvidia_runtime_gives_no_gpu_and_says_why():
    """Issue 26 item 5: `gate micro --container --profile h200-ep1` with the built deepep image on the CPU machine
    was refused by the engine (`could not select device driver "" with capabilities: [[gpu]]`), never reaching the
    in-image runner. An engine with no NVIDIA runtime now runs the container with no GPU request: the runner checks
    the image's kernels.json against the lock and ends SKIP (never PASS), `execution.no_gpus` saying why."""
    from reprostack.gates.container import _engine_gpu_runtime

    class Engine:
        def __init__(self, runtimes):
            self.runtimes = runtimes

        def info(self):
            return {"Runtimes": self.runtimes}

    why = _engine_gpu_runtime(Engine({"runc": {}, "io.containerd.runc.v2": {}}))
    assert why == "the engine has no NVIDIA runtime (runtimes: io.containerd.runc.v2, runc): no GPU to give"
    assert _engine_gpu_runtime(Engine({"runc": {}, "nvidia": {}})) is None


def test_an_images_nccl_from_the_release_wheel_is_named_in_the_skip_line(lock):
    """The deepep image takes NCCL from the `nccl` git pin's release wheel (no tree): the SKIP line said nothing of
    it and crashed on the git pin (`'GitPin' object has no attribute 'files'`); now it names where NCCL came from."""
    from types import SimpleNamespace

    from reprostack.gates.kernelprep import nccl_words

    pre = SimpleNamespace(components={"nccl": {"kind": "wheel"}})  # what kernels.prebuilt.check returned
    assert nccl_words(lock, {}, pre) == (
        "",
        "; NCCL is the image's copy of the pin's release wheel, checked against the lock by sha256",
    )
