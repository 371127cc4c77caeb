"""The base image from pinned .debs (reprostack.containers.debsbase): the local repository made from the verified
.debs is one debootstrap resolves to exactly the pinned set (debootstrap itself reads it, `--print-debs`), and the
layer and the image are functions of the files (two root filesystems made in other orders, at other times, give the
same diff id and image id; the engine's `docker load` gives that id). The full base (217 real .debs, debootstrap,
about 3 minutes per build) is built twice by `python -m reprostack.containers.debsbase --twice`; its record is
results/images/base-debian-12-build.json."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import debarchive
import dockerd
from reprostack import cli
from reprostack.containers import debsbase
from reprostack.fetch.debs import fetch_debs
from reprostack.lock import load

docker_client = dockerd.docker_client

pytestmark = pytest.mark.skipif(debarchive.why_no_tools() is not None, reason=str(debarchive.why_no_tools()))


@pytest.fixture
def pinned(tmp_path, capsys):
    """A real archive (tests/debarchive.py) whose last package by name is reached only as a dependency, and a lock
    whose debs pin `lock debs` filled from it."""
    a = debarchive.Archive(tmp_path / "archive")
    debarchive.minimal(a)
    a.deb("zz-last", "1", depends="libc6")  # sorts last in the index; only `tool2` pulls it in
    a.deb("tool2", "1", depends="zz-last")
    a.publish()
    lock = tmp_path / "upstreams.lock"
    lock.write_text(a.lock_text(include=["tool", "tool2"]))
    assert cli.main(["lock", "debs", "--lock", str(lock)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    yield load(lock)
    a.close()


@pytest.mark.skipif(shutil.which("debootstrap") is None or os.geteuid() != 0, reason="needs debootstrap and root")
def test_the_local_repository_is_one_debootstrap_resolves_to_exactly_the_pinned_set(tmp_path, pinned):
    pin = pinned.get("base")
    debs = fetch_debs(pinned, "base", cache_root=tmp_path / "cache")
    repo = tmp_path / "repo"
    debsbase.write_repo(repo, pin, debs, debsbase.source_date_epoch(debs))
    r = subprocess.run(
        [
            "debootstrap",
            "--print-debs",
            "--variant=minbase",
            "--no-check-gpg",
            "--arch=amd64",
            "--components=main",
            f"--include={','.join(pin.include)}",
            pin.suite,
            str(tmp_path / "target"),
            f"file://{repo}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(r.stdout.split()) == sorted(f.name for f in pin.files)
    assert "zz-last" in r.stdout.split()  # the index's last stanza is read (it ends with a blank line)


def test_source_date_epoch_is_the_newest_package_date(tmp_path, pinned):
    debs = fetch_debs(pinned, "base", cache_root=tmp_path / "cache")
    epochs = []
    for d in debs:  # what binutils' ar says of the member's date
        out = subprocess.run(
            ["ar", "tv", str(d.path)], capture_output=True, text=True, check=True, env={**os.environ, "TZ": "UTC"}
        ).stdout
        line = next(ln for ln in out.splitlines() if ln.endswith(" debian-binary"))
        when = datetime.datetime.strptime(" ".join(line.split()[-5:-1]), "%b %d %H:%M %Y").replace(tzinfo=datetime.UTC)
        epochs.append(when.timestamp())
    got = debsbase.source_date_epoch(debs)
    assert got - got % 60 == max(epochs) > 0  # ar prints minutes


def _rootfs(root: Path, order: list[str], when: float) -> Path:
    files = {"etc/os-release": "ID=debian\n", "usr/bin/tool": "#!/bin/sh\necho tool\n", "usr/lib/x/a.so": "x" * 5000}
    for rel in order:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(files[rel])
        os.utime(p, (when, when))
    (root / "usr/bin/tool").chmod(0o755)
    os.symlink("usr/bin", root / "bin")
    (root / "dev").mkdir()
    (root / "dev/junk").write_text("not in the layer")
    return root


def test_layer_and_image_are_functions_of_the_files(tmp_path, docker_client):
    epoch = 1783019100
    a = _rootfs(tmp_path / "a", ["etc/os-release", "usr/bin/tool", "usr/lib/x/a.so"], time.time())
    b = _rootfs(tmp_path / "b", ["usr/lib/x/a.so", "usr/bin/tool", "etc/os-release"], 1_000_000)
    da = debsbase.layer_tar(a, tmp_path / "a.tar", epoch)
    db = debsbase.layer_tar(b, tmp_path / "b.tar", epoch)
    assert da == db
    assert debsbase.file_hashes(a) == debsbase.file_hashes(b) and "dev/junk" not in debsbase.file_hashes(a)
    labels = {debsbase.L_PIN: "base", debsbase.L_PACKAGES: "0" * 64, debsbase.L_EPOCH: str(epoch)}
    ia = debsbase.image_archive(
        tmp_path / "a.tar", da, tmp_path / "ia.tar", "reprostack-test/debsbase:a", labels, epoch
    )
    ib = debsbase.image_archive(
        tmp_path / "b.tar", db, tmp_path / "ib.tar", "reprostack-test/debsbase:b", labels, epoch
    )
    assert ia == ib
    # another epoch is another image (the date is part of the config), the same layer bytes otherwise
    assert debsbase.layer_tar(a, tmp_path / "c.tar", epoch + 1) != da
    with open(tmp_path / "ia.tar", "rb") as f:
        docker_client.images.load(f)
    img = docker_client.images.get("reprostack-test/debsbase:a")
    assert img.id == ia and img.labels == labels
    assert img.attrs["RootFS"]["Layers"] == [f"sha256:{da}"]
    assert img.attrs["Created"].startswith("2026-07-02T19:05:00")
    docker_client.images.remove("reprostack-test/debsbase:a", force=True)


def test_the_committed_record_says_two_builds_from_scratch_are_identical():
    rec = json.loads((Path(__file__).resolve().parents[1] / "results/images/base-debian-12-build.json").read_text())
    lock = load(Path(__file__).resolve().parents[1] / "upstreams.lock")
    pin = lock.get(rec["pin"])
    assert rec["packages"] == len(pin.files) and rec["packages_sha256"] == debsbase.packages_sha256(pin)
    a, b = rec["builds"]
    assert rec["comparison"]["identical"] and a["image_id"] == b["image_id"]
    assert a["layer_diff_id"] == b["layer_diff_id"] and a["files_sha256"] == b["files_sha256"]


def test_a_pin_that_is_no_debs_pin_or_a_missing_deb_is_one_line_and_builds_nothing(
    tmp_path, pinned, capsys, docker_client, monkeypatch
):
    lock = str(pinned.path)
    assert debsbase.main(["nope", "--lock", lock]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    # offline with an empty cache: the fetch names what is missing, no debootstrap runs, nothing is loaded
    monkeypatch.setenv("REPROSTACK_CACHE", str(tmp_path / "empty-cache"))
    assert debsbase.main(["base", "--lock", lock, "--offline", "--tag", "reprostack-test/debsbase:no"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not in the cache or a debhouse" in err and "--offline forbids" in err
    assert not docker_client.images.list(name="reprostack-test/debsbase")
