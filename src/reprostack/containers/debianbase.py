"""The Debian test base: a real userland (python3, venv) from Debian's own packages, imported into the local engine.

CI has a Docker engine but no registry. An image that needs a real userland (a gate's python, a compiler) builds
on this base instead of a pulled one: `debootstrap --variant=minbase --include=PACKAGES SUITE DIR MIRROR` into a
temporary folder, then `docker import` of that folder as `reprostack-test/debian:12` (recipes name it as
`base: local:reprostack-test/debian:12`). busybox-static (reprostack.containers.testbase) stays the tiny base of
the fast tests.

Pinning: Debian's mirror serves the suite's current point release (snapshot.debian.org is not reachable from this
project's machines), so the base is pinned by what it holds, recorded when it is made: the Release file's
`Date` and `Version`, and every installed package's exact version (`dpkg-query -W`), in
`/etc/reprostack-debian-base.json` inside the image and as labels (`dev.reprostack.debian-release-date`,
`dev.reprostack.debian-packages-sha256`: sha256 of the sorted `name version` lines).

Invariants:
- reuse is keyed by the request (suite, variant, packages, mirror; label `dev.reprostack.debian-request`): an
  image under the tag with that label is reused as is (no network, stable image id, so the images built on it
  stay cached); anything else under the tag is replaced;
- nothing is imported from a debootstrap that failed: a failure is one ContainerError line naming the step and
  the tail of debootstrap's log; the temporary root filesystem is always removed;
- needs root (debootstrap chroots) and the debootstrap package: their absence is a ContainerError saying so.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .errors import ContainerError
from .testbase import labelled_image

DEBIAN_BASE = "reprostack-test/debian:12"
SUITE = "bookworm"  # Debian 12: the CI machine's release
PACKAGES = ("python3", "python3-venv")  # python3-venv: ensurepip, so `python3 -m venv` gives a venv with pip
MIRROR_ENV = "REPROSTACK_DEBIAN_MIRROR"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
L_REQUEST = "dev.reprostack.debian-request"
L_DATE = "dev.reprostack.debian-release-date"
L_PACKAGES = "dev.reprostack.debian-packages-sha256"
MANIFEST = "etc/reprostack-debian-base.json"
TIMEOUT_S = 1800


def request_key(suite: str = SUITE, packages=PACKAGES, mirror: str | None = None) -> str:
    mirror = mirror or os.environ.get(MIRROR_ENV) or DEFAULT_MIRROR
    req = {"suite": suite, "variant": "minbase", "packages": sorted(packages), "mirror": mirror}
    return hashlib.sha256(json.dumps(req, sort_keys=True).encode()).hexdigest()


def _release(rootfs: Path) -> dict:
    """Date / Version / Suite of the Release file debootstrap left under var/lib/apt/lists."""
    out = {}
    for f in sorted((rootfs / "var/lib/apt/lists").glob("*_Release")):
        for line in f.read_text(errors="replace").splitlines():
            k, _, v = line.partition(": ")
            if k in ("Date", "Version", "Suite", "Codename") and k.lower() not in out:
                out[k.lower()] = v.strip()
    return out


def manifest(rootfs: Path, key: str, mirror: str) -> dict:
    """What the root filesystem holds: the Release's date/version and every package's exact version."""
    r = subprocess.run(
        ["dpkg-query", f"--admindir={rootfs}/var/lib/dpkg", "-W", "-f", "${Package} ${Version}\\n"],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise ContainerError(f"dpkg-query in {rootfs}: {r.stderr.strip()[-300:]}")
    lines = sorted(line for line in r.stdout.splitlines() if line.strip())
    return {
        "request": key,
        "mirror": mirror,
        "release": _release(rootfs),
        "packages": dict(line.split(" ", 1) for line in lines),
        "packages_sha256": hashlib.sha256("".join(f"{x}\n" for x in lines).encode()).hexdigest(),
    }


def _debootstrap(rootfs: Path, suite: str, packages, mirror: str, log: Path) -> None:
    if not shutil.which("debootstrap"):
        raise ContainerError("debootstrap not found: install Debian's debootstrap (apt-get install -y debootstrap)")
    if os.geteuid() != 0:
        raise ContainerError("debootstrap needs root (it chroots into the new root filesystem)")
    argv = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(rootfs), mirror]
    with open(log, "wb") as f:
        try:
            rc = subprocess.run(
                argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=TIMEOUT_S
            ).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    if rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise ContainerError(f"debootstrap {suite} from {mirror} failed ({rc}): " + " | ".join(tail))


def ensure_debian_base(
    client,
    tag: str = DEBIAN_BASE,
    *,
    suite: str = SUITE,
    packages=PACKAGES,
    mirror: str | None = None,
    workdir: Path | None = None,
) -> str:
    """Make (once) the Debian base image `tag` (see the module docstring); returns its image id."""
    import docker.errors

    mirror = mirror or os.environ.get(MIRROR_ENV) or DEFAULT_MIRROR
    key = request_key(suite, packages, mirror)
    have = labelled_image(client, tag, L_REQUEST, key)
    if have:
        return have
    tmp = Path(tempfile.mkdtemp(prefix="rs-debian-", dir=workdir))
    try:
        rootfs, log = tmp / "rootfs", tmp / "debootstrap.log"
        _debootstrap(rootfs, suite, packages, mirror, log)
        info = manifest(rootfs, key, mirror)
        (rootfs / MANIFEST).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
        # what the image does not need: downloaded .debs and index files (the manifest keeps the versions)
        for d in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (rootfs / d).glob("*"):
                if p.is_file():
                    p.unlink()
        tar = tmp / "rootfs.tar"
        r = subprocess.run(
            [
                "tar",
                "-C",
                str(rootfs),
                "--numeric-owner",
                "--exclude=./dev/*",
                "--exclude=./proc/*",
                "--exclude=./sys/*",
                "-cf",
                str(tar),
                ".",
            ],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            raise ContainerError(f"tar of the Debian root filesystem failed: {r.stderr.strip()[-300:]}")
        repo, _, t = tag.rpartition(":")
        labels = {L_REQUEST: key, L_DATE: info["release"].get("date", ""), L_PACKAGES: info["packages_sha256"]}
        changes = [f"LABEL {k}={json.dumps(v)}" for k, v in labels.items()]
        changes += [
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV LANG=C.UTF-8",
            'CMD ["/bin/bash"]',
        ]
        try:
            client.api.import_image_from_file(str(tar), repository=repo, tag=t, changes=changes)
        except docker.errors.APIError as e:
            raise ContainerError(f"docker import of the Debian base {tag} failed: {e.explanation or e}") from None
        return client.images.get(tag).id
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m reprostack.containers.debianbase`: make (or reuse) the base on $DOCKER_HOST, print its id."""
    import sys
    import time

    from .engine import connect

    t0 = time.monotonic()
    try:
        image_id = ensure_debian_base(connect())
    except ContainerError as e:
        print(f"reprostack: error: {e}", file=sys.stderr)
        return 2
    print(f"{DEBIAN_BASE} {image_id} ({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
