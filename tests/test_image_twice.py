"""scripts/image_twice.py: an image's two builds compared (layers, files, ELF sections of the files that matter), on
small fabricated records, on real ELF files of this machine, and `record` on the local test base image."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import dockerd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import image_twice  # noqa: E402

docker_client, test_base = dockerd.docker_client, dockerd.test_base  # session fixtures (tests/dockerd.py)


def rec(image_id: str, diff_ids: list[str], files: dict, keys: dict | None = None, **kw) -> dict:
    r = {
        "kind": "image-build",
        "image": "reprostack/x:1",
        "image_id": image_id,
        "project_commit": "a" * 40,
        "lock_sha256": "b" * 64,
        "layers": [{"step": f"RUN step {i}", "diff_id": d} for i, d in enumerate(diff_ids)],
        "files": files,
        "key_files": keys or {},
    }
    r.update(kw)
    return r


def test_identical_builds_compare_identical():
    files = {"/opt/a": "1" * 64, "/opt/b": "2" * 64}
    keys = {"/opt/a": {"sha256": "1" * 64, "elf_sections": {".text": "t"}}}
    out = image_twice.compare(
        rec("sha256:i1", ["d1", "d2"], files, keys), rec("sha256:i2", ["d1", "d2"], files, keys), "x", "how"
    )
    assert out["layers_identical"] == "2 of 2" and out["files_identical"] and out["key_files_identical"]
    assert out["differences"] == [] and out["image_ids"] == ["sha256:i1", "sha256:i2"] and out["files"] == 2


def test_a_differing_layer_file_and_elf_section_are_named():
    a = rec(
        "i1",
        ["d1", "d2"],
        {"/opt/a": "1" * 64, "/opt/only-a": "3" * 64},
        {"/opt/a": {"sha256": "1" * 64, "elf_sections": {".text": "t", ".note.gnu.build-id": "n1"}}},
    )
    b = rec(
        "i2",
        ["d1", "dX"],
        {"/opt/a": "9" * 64, "/opt/only-b": "4" * 64},
        {"/opt/a": {"sha256": "9" * 64, "elf_sections": {".text": "t", ".note.gnu.build-id": "n2"}}},
    )
    out = image_twice.compare(a, b, "x", "how")
    assert out["layers_identical"] == "1 of 2" and [x["identical"] for x in out["layers"]] == [True, False]
    assert out["files_differ"] == ["/opt/a"] and out["files_only_in"] == [["/opt/only-a"], ["/opt/only-b"]]
    assert out["key_files"] == [
        {
            "path": "/opt/a",
            "sha256": ["1" * 64, "9" * 64],
            "identical": False,
            "sections_differ": [".note.gnu.build-id"],
        }
    ]
    assert out["differences"] == [
        "layer `RUN step 1`: diff ids differ",
        "file /opt/a: sha256 differs",
        "file /opt/only-a: only in build 1",
        "file /opt/only-b: only in build 2",
    ]


def test_records_of_other_inputs_or_of_another_shape_are_one_line(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(rec("i1", ["d"], {})))
    b.write_text(json.dumps(rec("i2", ["d"], {}, lock_sha256="c" * 64)))
    out = tmp_path / "out.json"
    assert image_twice.main(["compare", str(a), str(b), "--image", "x", "--how", "h", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"image_twice: {b}: lock_sha256: ") and "not of the same inputs" in err
    for bad in ("[]", "{", json.dumps({"kind": "image-build", "image_id": 3})):
        b.write_text(bad)
        assert image_twice.main(["compare", str(a), str(b), "--image", "x", "--how", "h", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err and str(b) in err
    assert not out.exists()
    b.write_text(json.dumps(rec("i2", ["d"], {})))
    assert image_twice.main(["compare", str(a), str(b), "--image", "x", "--how", "h", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["files_identical"] is True


def test_elf_sections_of_a_real_binary_and_of_non_elf_bytes():
    data = Path(sys.executable).resolve().read_bytes()
    secs = image_twice.elf_sections(data)
    assert ".text" in secs and len(secs[".text"]) == 64 and secs[".bss"].startswith("nobits:")
    assert image_twice.elf_sections(b"#!/bin/sh\n") is None
    with pytest.raises(image_twice.Bad, match="out of the file"):
        image_twice.elf_sections(data[:4096])


def test_layer_steps_skip_the_steps_that_make_no_layer():
    made = [
        "debsbase",
        "/bin/sh -c #(nop)  ENV A=1",
        "/bin/sh -c #(nop) COPY dir:abc in / ",
        "/bin/sh -c make",
        "/bin/sh -c #(nop)  LABEL x=y",
    ]
    assert image_twice.layer_steps(made, 3) == ["debsbase", "COPY dir:abc in /", "RUN make"]
    assert image_twice.layer_steps(made, 4) == ["", "debsbase", "COPY dir:abc in /", "RUN make"]


def test_record_lists_every_file_and_the_key_files_sections(docker_client, test_base, tmp_path, monkeypatch):
    """`record` on the local busybox test base: every regular file by sha256, the engine's per-container files left
    out, a key file (busybox itself, an ELF) with its sections; no container left behind."""
    if not shutil.which("docker"):
        pytest.skip("no docker CLI")
    made = []  # the containers record creates (other tests on other workers make their own meanwhile)
    real = image_twice._docker

    def spy(*args, **kw):
        out = real(*args, **kw)
        if args[0] == "create":
            made.append(out.decode().strip())
        return out

    monkeypatch.setattr(image_twice, "_docker", spy)
    monkeypatch.chdir(REPO)
    r = image_twice.record(test_base, ["*/busybox"], None)
    assert r["image_id"] == test_base and r["layers"] and all(x["diff_id"].startswith("sha256:") for x in r["layers"])
    assert "/etc/hosts" not in r["files"] and any(p.endswith("/busybox") for p in r["files"])
    (path, key), *_ = r["key_files"].items()
    assert key["sha256"] == r["files"][path] and ".text" in key["elf_sections"]
    assert len(made) == 1 and made[0] not in {c.id for c in docker_client.containers.list(all=True)}
    assert (
        r["project_commit"]
        == subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    )


def test_chain_downloads_are_read_from_the_lock_and_the_verified_cache(tmp_path, monkeypatch):
    """scripts/image_chain.py's downloads: the base's .debs by count and bytes from the lock, each wheel pin an image
    copies by count from the lock and bytes from the cache's files (None while one is missing, never a guess)."""
    import image_chain

    from reprostack import lock as lockmod

    lock = lockmod.load(REPO / "upstreams.lock")
    monkeypatch.setenv("REPROSTACK_CACHE", str(tmp_path / "cache"))
    pin = lock.get("substrate-wheels-cp311")
    for i, f in enumerate(pin.files):
        p = tmp_path / "cache" / "wheels" / f.sha256 / f.filename
        p.parent.mkdir(parents=True)
        p.write_bytes(b"x" * (i + 1))
    out = image_chain.downloads(lock, ["cuda-toolkit", "substrate"], REPO)
    debs = lock.get("debian-12-build").files
    assert out["debs"] == {"pin": "debian-12-build", "files": len(debs), "bytes": sum(f.size for f in debs)}
    n = len(pin.files)
    assert out["wheels"] == [
        {
            "image": "cuda-toolkit",
            "pin": "cuda-13-0-toolkit",
            "files": len(lock.get("cuda-13-0-toolkit").files),
            "bytes": None,
        },
        {"image": "substrate", "pin": "substrate-wheels-cp311", "files": n, "bytes": n * (n + 1) // 2},
    ]


def test_a_gate_image_that_cannot_build_is_a_failed_step_naming_what_stops_it(tmp_path, monkeypatch):
    """scripts/image_chain.py's gate images: one that `reprostack build` refuses (nemo-rl, `unresolved` in its recipe)
    is a step with status failed, its seconds and the build's own error line, never a crash or a missing record;
    naming only gate images is refused (an empty `reprostack build` would build every recipe)."""
    import image_chain

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    step = image_chain.build_gate("nemo-rl", tmp_path / "out")
    assert step["step"] == "build nemo-rl" and step["status"] == "failed" and step["exit"] == 2
    assert step["error"].startswith(f"reprostack: error: {REPO}/containers/nemo-rl/image.yaml:")
    assert "unresolved: image nemo-rl cannot be built yet" in step["error"] and step["seconds"] >= 0
    assert not (tmp_path / "out" / "images.json").exists()
    with pytest.raises(SystemExit) as e:
        image_chain.main(["--images", "vllm", "megatron"])
    assert e.value.code == 2


def test_a_gate_image_is_not_built_on_an_engine_short_of_disk(tmp_path, monkeypatch, docker_client):
    """The machine and its engine are shared: under --min-free-gb free on the engine's data root (read from the real
    engine and its file system), a gate image is a `skipped` step saying how much was free, and no build is asked."""
    import image_chain

    root, free = image_chain.engine_free_bytes()
    assert Path(root).is_dir() and free > 0
    monkeypatch.setenv("PATH", str(Path(shutil.which("docker")).parent))  # docker, but no `reprostack` to call
    step = image_chain.build_gate("vllm", tmp_path / "out", min_free_gb=1e9)
    assert step["step"] == "build vllm" and step["status"] == "skipped" and step["seconds"] == 0.0
    assert step["reason"].endswith(f"GB free on the engine's disk ({root}), under --min-free-gb 1e+09")
    assert not (tmp_path / "out").exists()
