"""The image chain's base from pinned .debs alone: no container registry, no network during the build.

`build_base(lock, PIN)` makes the base of a `kind: debs` pin (lock.debs: debootstrap minbase + `include`, every .deb
pinned by sha256):
1. every .deb of the pin, verified against the lock (fetch.debs: cache, debhouse, or the archive);
2. a local apt repository of exactly those files: `pool/...` as the archive lays it out, a `Packages` index written
   from each .deb's own control file plus its pinned Filename/Size/SHA256, a `Release` listing the index's sha256;
3. `debootstrap --variant=minbase --include=INCLUDE --no-check-gpg SUITE ROOTFS file://REPO` (the signature was
   checked when the pin was resolved; every .deb was checked against the lock just now, and debootstrap checks each
   one again against that index), run in a new network namespace (`unshare --net`) where `unshare` is there, with
   SOURCE_DATE_EPOCH set;
4. what differs from run to run is removed or fixed (NONDETERMINISTIC: logs, ld.so's aux-cache, apt's binary caches
   and lists, dpkg/debconf `-old` backups, the host's hostname and resolv.conf, the file:// sources.list, which is
   replaced by the pin's archive), a manifest written (`etc/reprostack-debs-base.json`: the pin, its package list
   sha256, SOURCE_DATE_EPOCH);
5. one layer: `tar --sort=name --mtime=@SOURCE_DATE_EPOCH --numeric-owner --format=gnu` (every mtime the same,
   stable order, no user names); the image: a config whose `created` is SOURCE_DATE_EPOCH, written as a
   `docker save` archive and `docker load`ed. So the image id (sha256 of the config) and the layer's diff id are
   functions of the pinned bytes: two builds from scratch give the same ids or the record names what differs.

SOURCE_DATE_EPOCH of the base: the newest `debian-binary` ar-member mtime of the pinned .debs (dpkg-deb writes the
package's own SOURCE_DATE_EPOCH there, its changelog date), i.e. a function of the pins, never the clock.

Invariants:
- nothing is loaded from a debootstrap that failed: one ContainerError line naming the step and the tail of its log;
  the temporary folders are always removed (unless `keep` is given);
- needs root (debootstrap chroots) and debootstrap; their absence is one ContainerError line saying so;
- the image's labels carry the pin and its package-list sha256; every call builds (about 3 minutes on 2 cores) and
  `docker load` replaces the tag: the same pins give the same image id, so images built on it stay cached.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ReprostackError
from ..fetch.debs import LocalDeb, fetch_debs
from ..lock import DebsPin, Lock
from ..lock import debian
from .errors import ContainerError

DEBS_BASE = "reprostack/debian-12-build"
MANIFEST = "etc/reprostack-debs-base.json"
L_PIN = "dev.reprostack.debs-pin"
L_PACKAGES = "dev.reprostack.debs-packages-sha256"
L_EPOCH = "dev.reprostack.source-date-epoch"
TIMEOUT_S = 3600
ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8")
# paths (relative to the root filesystem, glob patterns) whose bytes differ from run to run and that an image does
# not need: removed after debootstrap
NONDETERMINISTIC = (
    "var/log/**/*",
    "var/cache/ldconfig/aux-cache",
    "var/cache/apt/*.bin",
    "var/cache/apt/archives/*.deb",
    "var/cache/apt/archives/partial/*",
    "var/lib/apt/lists/*",
    "var/lib/dpkg/*-old",
    "var/cache/debconf/*-old",
    "etc/hostname",
    "etc/ssh/ssh_host_*",  # openssh-server's install makes random host keys; an MPI worker makes its own at start
    "etc/resolv.conf",
    "root/.bash_history",
)


@dataclass(frozen=True)
class BaseBuild:
    """What one base build made, and how long each step took (seconds)."""

    tag: str
    image_id: str
    layer_diff_id: str
    layer_bytes: int
    source_date_epoch: int
    packages_sha256: str
    packages: int
    steps: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)  # {path in the rootfs: sha256} of every regular file


def packages_sha256(pin: DebsPin) -> str:
    """sha256 of the sorted `name version sha256` lines of the pin's files: what the base is made of."""
    lines = sorted(f"{f.name} {f.version} {f.sha256}\n" for f in pin.files)
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def source_date_epoch(debs: list[LocalDeb]) -> int:
    """The newest `debian-binary` ar-member mtime of `debs` (module doc)."""
    out = 0
    for d in debs:
        with open(d.path, "rb") as f:
            head = f.read(4096)
        try:
            out = max(out, debian.deb_member_mtime(head, "debian-binary", str(d.path)))
        except debian.DebianError as e:
            raise ContainerError(str(e)) from None
    return out


def _xz(data: bytes) -> bytes:
    return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=6)


def write_repo(repo: Path, pin: DebsPin, debs: list[LocalDeb], epoch: int) -> None:
    """A local apt repository of exactly `debs` under `repo` (module doc, 2)."""
    stanzas = []
    for d in sorted(debs, key=lambda d: d.name):
        dest = repo / d.filename
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(d.path, dest)
        except OSError:
            shutil.copyfile(d.path, dest)
        try:
            text = debian.deb_control_text(d.path.read_bytes(), str(d.path))
        except debian.DebianError as e:
            raise ContainerError(str(e)) from None
        body = "\n".join(ln for ln in text.rstrip("\n").split("\n") if ln.strip())
        stanzas.append(f"{body}\nFilename: {d.filename}\nSize: {d.size}\nSHA256: {d.sha256}\n")
    # every stanza ends with a blank line, the last one too (debootstrap's pkgdetails reads a stanza at its blank line)
    packages = "".join(s + "\n" for s in stanzas).encode()
    idx = f"{pin.component}/binary-{pin.architecture}"
    dists = repo / "dists" / pin.suite
    (dists / idx).mkdir(parents=True, exist_ok=True)
    files = {f"{idx}/Packages": packages, f"{idx}/Packages.xz": _xz(packages)}
    for rel, data in files.items():
        (dists / rel).write_bytes(data)
    date = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%a, %d %b %Y %H:%M:%S UTC")
    sums = "".join(f" {hashlib.sha256(b).hexdigest()} {len(b)} {rel}\n" for rel, b in sorted(files.items()))
    (dists / "Release").write_text(
        f"Origin: reprostack\nLabel: {pin.name}\nSuite: {pin.suite}\nCodename: {pin.suite}\nDate: {date}\n"
        f"Architectures: {pin.architecture}\nComponents: {pin.component}\nSHA256:\n{sums}"
    )


def _run_logged(argv: list[str], log: Path, env: dict, what: str) -> None:
    with open(log, "ab") as f:
        f.write(("$ " + " ".join(argv) + "\n").encode())
        f.flush()
        try:
            rc = subprocess.run(
                argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, timeout=TIMEOUT_S
            ).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    if rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise ContainerError(f"{what} failed ({rc}): " + " | ".join(tail) + f" (log: {log})")


def debootstrap(rootfs: Path, repo: Path, pin: DebsPin, epoch: int, log: Path) -> bool:
    """Module doc, 3. Returns whether it ran without a network (`unshare --net`)."""
    if not shutil.which("debootstrap"):
        raise ContainerError("debootstrap not found: install Debian's debootstrap (apt-get install -y debootstrap)")
    if os.geteuid() != 0:
        raise ContainerError("debootstrap needs root (it chroots into the new root filesystem)")
    argv = [
        "debootstrap",
        "--variant=minbase",
        "--no-check-gpg",
        f"--arch={pin.architecture}",
        f"--components={pin.component}",
    ]
    if pin.include:
        argv.append(f"--include={','.join(pin.include)}")
    argv += [pin.suite, str(rootfs), f"file://{repo}"]
    offline = False
    if shutil.which("unshare"):
        probe = subprocess.run(["unshare", "--net", "true"], capture_output=True)
        if probe.returncode == 0:
            argv, offline = ["unshare", "--net", *argv], True
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "SOURCE_DATE_EPOCH": str(epoch),
        "DEBIAN_FRONTEND": "noninteractive",
        "TZ": "UTC",
    }
    _run_logged(argv, log, env, f"debootstrap {pin.suite} from the {len(pin.files)} pinned .debs of {pin.name}")
    return offline


def normalize(rootfs: Path, lock: Lock, name: str, epoch: int) -> dict:
    """Module doc, 4: remove NONDETERMINISTIC paths, fix sources.list, write the manifest. Returns the manifest."""
    pin = lock.get(name)
    for pattern in NONDETERMINISTIC:
        for p in sorted(rootfs.glob(pattern), reverse=True):
            if p.is_symlink() or p.is_file():
                p.unlink()
    (rootfs / "etc/apt/sources.list").write_text(f"deb {pin.archive} {pin.suite} {pin.component}\n")
    info = {
        "pin": name,
        "archive": pin.archive,
        "suite": pin.suite,
        "packages": len(pin.files),
        "packages_sha256": packages_sha256(pin),
        "source_date_epoch": epoch,
    }
    (rootfs / MANIFEST).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    return info


def layer_tar(rootfs: Path, dest: Path, epoch: int) -> str:
    """Module doc, 5: the layer; returns its sha256 (the diff id)."""
    argv = [
        "tar",
        "-C",
        str(rootfs),
        "--sort=name",
        f"--mtime=@{epoch}",
        "--numeric-owner",
        "--format=gnu",
        "--exclude=./dev/*",
        "--exclude=./proc/*",
        "--exclude=./sys/*",
        "-cf",
        str(dest),
        ".",
    ]
    r = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
    if r.returncode != 0:
        raise ContainerError(f"tar of the base's root filesystem failed: {r.stderr.strip()[-300:]}")
    h = hashlib.sha256()
    with open(dest, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def file_hashes(rootfs: Path) -> dict:
    """{relative path: sha256} of every regular file of the root filesystem (what the byte comparison reads)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(rootfs):
        rel = Path(dirpath).relative_to(rootfs)
        if rel.parts[:1] in (("dev",), ("proc",), ("sys",)):
            dirnames[:] = []
            continue
        dirnames.sort()
        for fn in sorted(filenames):
            p = Path(dirpath, fn)
            if p.is_symlink() or not p.is_file():
                continue
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for b in iter(lambda: f.read(1 << 20), b""):
                    h.update(b)
            out[(rel / fn).as_posix()] = h.hexdigest()
    return out


def image_archive(layer: Path, diff_id: str, dest: Path, tag: str, labels: dict, epoch: int) -> str:
    """A `docker save` archive of one layer with a config made only of the inputs (module doc, 5); returns the image
    id (sha256 of the config bytes)."""
    created = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {"Env": list(ENV), "Cmd": ["/bin/bash"], "Labels": labels},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        "history": [{"created": created, "created_by": f"reprostack debs base ({labels[L_PIN]})"}],
    }
    cbytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    image_id = hashlib.sha256(cbytes).hexdigest()
    manifest = [{"Config": f"{image_id}.json", "RepoTags": [tag], "Layers": [f"{diff_id}/layer.tar"]}]
    with tarfile.open(dest, "w", format=tarfile.GNU_FORMAT) as t:

        def add(name: str, data: bytes | None = None, path: Path | None = None) -> None:
            ti = tarfile.TarInfo(name)
            ti.mtime, ti.mode, ti.uid, ti.gid = epoch, 0o644, 0, 0
            if path is not None:
                ti.size = path.stat().st_size
                with open(path, "rb") as f:
                    t.addfile(ti, f)
            else:
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))

        add(f"{image_id}.json", cbytes)
        add(f"{diff_id}/layer.tar", path=layer)
        add("manifest.json", json.dumps(manifest, separators=(",", ":")).encode())
    return f"sha256:{image_id}"


def build_base(
    lock: Lock,
    name: str,
    *,
    client=None,
    tag: str = DEBS_BASE,
    cache_root: Path | None = None,
    debhouses=(),
    offline: bool = False,
    workdir: Path | None = None,
    keep: Path | None = None,
    progress=print,
) -> BaseBuild:
    """Make the base of debs pin `name` (module doc) and, with a docker `client`, load it as `tag`. `keep`: a folder
    that receives the layer and image archives (for a byte comparison); otherwise they are removed."""
    pin = lock.get(name)
    if not isinstance(pin, DebsPin):
        raise ContainerError(f"{lock.where('upstreams', name)}: is kind {pin.kind}, not a debs pin")
    steps = {}
    t0 = time.monotonic()
    try:
        debs = fetch_debs(lock, name, cache_root=cache_root, debhouses=debhouses, offline=offline)
    except ReprostackError as e:
        raise ContainerError(str(e)) from None
    steps["fetch"] = round(time.monotonic() - t0, 1)
    epoch = source_date_epoch(debs)
    progress(
        f"[base] {len(debs)} .debs verified against {lock.path.name} ({steps['fetch']} s); SOURCE_DATE_EPOCH={epoch}"
    )
    tmp = Path(tempfile.mkdtemp(prefix="rs-debsbase-", dir=workdir))
    try:
        repo, rootfs, log = tmp / "repo", tmp / "rootfs", tmp / "debootstrap.log"
        t = time.monotonic()
        write_repo(repo, pin, debs, epoch)
        steps["repository"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        progress(f"[base] debootstrap {pin.suite} minbase + {len(pin.include)} included, from the local repository")
        no_net = debootstrap(rootfs, repo, pin, epoch, log)
        steps["debootstrap"] = round(time.monotonic() - t, 1)
        progress(
            f"[base] debootstrap done ({steps['debootstrap']} s, network namespace: {'none' if no_net else 'host'})"
        )
        info = normalize(rootfs, lock, name, epoch)
        files = file_hashes(rootfs)
        t = time.monotonic()
        layer = tmp / "layer.tar"
        diff_id = layer_tar(rootfs, layer, epoch)
        labels = {L_PIN: name, L_PACKAGES: info["packages_sha256"], L_EPOCH: str(epoch)}
        archive = tmp / "image.tar"
        image_id = image_archive(layer, diff_id, archive, tag, labels, epoch)
        steps["layer"] = round(time.monotonic() - t, 1)
        layer_bytes = layer.stat().st_size
        if client is not None:
            t = time.monotonic()
            _load(client, archive, tag, image_id)
            steps["load"] = round(time.monotonic() - t, 1)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for p in (layer, archive, log):
                shutil.move(str(p), keep / p.name)
        return BaseBuild(
            tag=tag,
            image_id=image_id,
            layer_diff_id=f"sha256:{diff_id}",
            layer_bytes=layer_bytes,
            source_date_epoch=epoch,
            packages_sha256=info["packages_sha256"],
            packages=len(debs),
            steps=steps,
            files=files,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load(client, archive: Path, tag: str, image_id: str) -> None:
    """`docker load` the image archive into `client`'s engine; the image under `tag` must be the archive's config."""
    import docker.errors

    try:
        with open(archive, "rb") as f:
            client.images.load(f)
        got = client.images.get(tag).id
    except docker.errors.APIError as e:
        raise ContainerError(f"docker load of the base {tag} failed: {e.explanation or e}") from None
    if got != image_id:
        raise ContainerError(f"docker load of {tag} gave image {got}, the archive's config is {image_id}")


def _tool_version(argv: list[str]) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "not found"
    return (r.stdout or r.stderr).strip().splitlines()[0] if (r.stdout or r.stderr).strip() else f"rc {r.returncode}"


def files_sha256(files: dict) -> str:
    """sha256 of the sorted `sha256  path` lines of a build's regular files (one value to compare two builds by)."""
    return hashlib.sha256("".join(f"{h}  {p}\n" for p, h in sorted(files.items())).encode()).hexdigest()


def compare(a: BaseBuild, b: BaseBuild) -> dict:
    """What differs between two builds: image id, layer diff id, and every file whose bytes differ or that only one
    holds (sorted, at most 200 named)."""
    diff = sorted(p for p in set(a.files) | set(b.files) if a.files.get(p) != b.files.get(p))
    return {
        "identical": a.image_id == b.image_id and a.layer_diff_id == b.layer_diff_id and not diff,
        "image_id_equal": a.image_id == b.image_id,
        "layer_diff_id_equal": a.layer_diff_id == b.layer_diff_id,
        "differing_files": len(diff),
        "differing_files_named": diff[:200],
    }


def record(lock: Lock, name: str, builds: list[BaseBuild]) -> dict:
    """The results/images/ record of one or more builds of the base (no wall-clock date: the times are durations)."""
    pin = lock.get(name)
    out = {
        "kind": "debs-base",
        "pin": name,
        "lock_sha256": lock.sha256,
        "archive": f"{pin.archive} {pin.suite}/{pin.component} {pin.architecture}",
        "packages": len(pin.files),
        "packages_bytes": sum(f.size for f in pin.files),
        "packages_sha256": packages_sha256(pin),
        "include": list(pin.include),
        "source_date_epoch": builds[0].source_date_epoch,
        "tools": {
            "debootstrap": _tool_version(["dpkg-query", "-W", "-f", "${Version}", "debootstrap"]),
            "tar": _tool_version(["tar", "--version"]),
        },
        "builds": [
            {
                "tag": b.tag,
                "image_id": b.image_id,
                "layer_diff_id": b.layer_diff_id,
                "layer_bytes": b.layer_bytes,
                "files": len(b.files),
                "files_sha256": files_sha256(b.files),
                "seconds": b.steps,
            }
            for b in builds
        ],
    }
    if len(builds) == 2:
        out["comparison"] = compare(*builds)
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m reprostack.containers.debsbase [PIN] [--tag T] [--twice] [--record FILE] [--offline]`: make the base
    of debs pin PIN (default: the lock's first debs pin) on $DOCKER_HOST; `--twice`: build it a second time from
    scratch (fresh folders, nothing reused but the verified .debs) and compare; `--record`: write the record."""
    import argparse
    import sys

    from ..atomicfile import write_text_atomic
    from ..errors import ReprostackError
    from ..lock import load
    from .engine import connect

    p = argparse.ArgumentParser(prog="python -m reprostack.containers.debsbase", description=main.__doc__)
    p.add_argument("pin", nargs="?")
    p.add_argument("--lock", default="upstreams.lock")
    p.add_argument("--tag", default=f"{DEBS_BASE}:12")
    p.add_argument("--twice", action="store_true")
    p.add_argument("--record", type=Path)
    p.add_argument("--offline", action="store_true", help="never download a .deb (cache and debhouses only)")
    args = p.parse_args(argv)
    try:
        lock = load(Path(args.lock))
        name = args.pin or next((n for n, x in lock.upstreams.items() if isinstance(x, DebsPin)), None)
        if name is None:
            raise ContainerError(f"{lock.path}: no kind: debs pin")
        from ..fetch.debs import debhouses_from_env

        client = connect()
        builds = []
        for i in range(2 if args.twice else 1):
            tag = args.tag if i == 0 else f"{args.tag}-again"
            t0 = time.monotonic()
            b = build_base(lock, name, client=client, tag=tag, debhouses=debhouses_from_env(), offline=args.offline)
            print(
                f"{tag} {b.image_id} layer {b.layer_diff_id} ({b.layer_bytes / 1e6:.0f} MB, {len(b.files)} files, "
                f"{time.monotonic() - t0:.0f} s)"
            )
            builds.append(b)
        rec = record(lock, name, builds)
        if "comparison" in rec:
            c = rec["comparison"]
            print(
                "two builds from scratch: "
                + ("identical (image id, layer diff id, every file)" if c["identical"] else f"DIFFER: {c}")
            )
        if args.record:
            args.record.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(args.record, json.dumps(rec, indent=1, sort_keys=True) + "\n")
            print(f"record: {args.record}")
    except ReprostackError as e:
        print(f"reprostack: error: {e}", file=sys.stderr)
        return 2
    return 0 if rec.get("comparison", {"identical": True})["identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
