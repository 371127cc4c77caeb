"""The test base image: a tiny root filesystem (Debian's static busybox) imported into the local engine.

It stands in for the CUDA base on machines without a registry or GPU: the `selftest` recipes name it
as `base: local:reprostack-test/base:1`, and a real recipe's base can be replaced by it with
`REPROSTACK_BASE_OVERRIDE="<recipe base>=reprostack-test/base:1"`. The rootfs tar is deterministic; the
image carries its sha256 as a label, so an existing image made from the same busybox is reused (stable
image id, so images built on it stay cached).
"""

from __future__ import annotations

import hashlib
import io
import shutil
import struct
import subprocess
import tarfile
from pathlib import Path

from .errors import ContainerError

TEST_BASE = "reprostack-test/base:1"
ROOTFS_LABEL = "dev.reprostack.test-rootfs-sha256"
_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox", "/usr/sbin/busybox")


def labelled_image(client, tag: str, label: str, value: str) -> str | None:
    """The id of image `tag` on the engine when its label `label` is `value` (the same input made it), else None:
    the reuse rule of the images made here (this busybox base, containers.debianbase)."""
    import docker.errors

    try:
        img = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    return img.id if (img.labels or {}).get(label) == value else None


def is_static_elf(path: Path) -> bool:
    """True for an ELF executable without a PT_INTERP program header (needs no dynamic loader)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit only
            return False
        (phoff,) = struct.unpack_from("<Q", head, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        f.seek(phoff)
        ph = f.read(phentsize * phnum)
    return all(struct.unpack_from("<I", ph, i * phentsize)[0] != 3 for i in range(phnum))


def find_busybox() -> Path:
    """A statically linked busybox on this machine. Raises ContainerError saying which package to install."""
    seen = []
    for c in (*_CANDIDATES, shutil.which("busybox")):
        if c and Path(c).is_file():
            p = Path(c).resolve()
            if is_static_elf(p):
                return p
            seen.append(str(p))
    why = f" ({', '.join(seen)} is dynamically linked)" if seen else ""
    raise ContainerError(
        f"no static busybox found{why}: install Debian's busybox-static (apt-get install -y busybox-static)"
    )


def rootfs_tar(busybox: Path) -> bytes:
    """A minimal root filesystem: /bin/busybox, one symlink per applet, /etc/passwd, empty /tmp /root."""
    applets = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True).stdout.split()
    data = Path(busybox).read_bytes()
    files = {"etc/passwd": b"root:x:0:0:root:/root:/bin/sh\n", "etc/group": b"root:x:0:\n"}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:

        def add(name, kind, mode, payload=None, link=""):
            ti = tarfile.TarInfo(name)
            ti.type, ti.mode, ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = kind, mode, 0, 0, 0, "", ""
            ti.linkname = link
            if payload is not None:
                ti.size = len(payload)
            t.addfile(ti, io.BytesIO(payload) if payload is not None else None)

        for d in ("bin", "etc", "root", "tmp", "usr", "usr/bin", "var"):
            add(d, tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755)
        add("bin/busybox", tarfile.REGTYPE, 0o755, data)
        for a in sorted(set(applets) - {"busybox"}):
            add(f"bin/{a}", tarfile.SYMTYPE, 0o777, link="busybox")
        for name, payload in sorted(files.items()):
            add(name, tarfile.REGTYPE, 0o644, payload)
    return buf.getvalue()


def ensure_test_base(client, tag: str = TEST_BASE) -> str:
    """Import the busybox rootfs as `tag` unless an image made from the same rootfs has that tag; returns its id."""
    tar = rootfs_tar(find_busybox())
    digest = hashlib.sha256(tar).hexdigest()
    have = labelled_image(client, tag, ROOTFS_LABEL, digest)
    if have:
        return have
    repo, _, t = tag.rpartition(":")
    client.api.import_image_from_data(
        tar,
        repository=repo,
        tag=t,
        changes=[f"LABEL {ROOTFS_LABEL}={digest}", "ENV PATH=/bin:/usr/bin", 'CMD ["/bin/sh"]'],
    )
    return client.images.get(tag).id
