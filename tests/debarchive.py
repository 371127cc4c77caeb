"""A real Debian archive made in a test: .debs built with dpkg-deb, the Packages index written by dpkg-scanpackages,
Packages.xz by xz, a Release with the SHA256 of both, signed into InRelease by a gpg key made for the test.

    a = Archive(tmp_path)                       # gpg home, key, empty pool
    a.deb("libfoo1", "1.0-1", depends="libc6 (>= 2.0)", priority="required")
    a.publish()                                 # dists/<suite>/InRelease, Packages(.xz)
    a.lock_text("demo", include=["tool"])       # a lockfile with one debs pin naming it (file:// URL)

Nothing here is mocked: the archive is what dpkg-deb, dpkg-scanpackages, xz and gpg produce.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import textwrap
from pathlib import Path


def why_no_tools() -> str | None:
    for t in ("dpkg-deb", "dpkg-scanpackages", "gpg", "gpgv", "xz"):
        if shutil.which(t) is None:
            return f"{t} not found (apt-get install -y dpkg-dev gpg gpgv xz-utils)"
    return None


class Archive:
    def __init__(self, root: Path, suite: str = "bookworm", component: str = "main", arch: str = "amd64"):
        self.root = Path(root)
        self.www = self.root / "www"
        self.suite, self.component, self.arch = suite, component, arch
        self.gnupg = self.root / "gnupg"
        self.gnupg.mkdir(mode=0o700, parents=True)
        self.keyring = self.root / "keyring.gpg"
        self.fpr = self.new_key("reprostack test archive <archive@test.invalid>", self.keyring)
        self.debs: dict[str, Path] = {}

    def gpg(self, *args: str, home: Path | None = None) -> str:
        return subprocess.run(
            [
                "gpg",
                "--homedir",
                str(home or self.gnupg),
                "--batch",
                "--yes",
                "--pinentry-mode",
                "loopback",
                "--passphrase",
                "",
                *args,
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    def new_key(self, uid: str, keyring: Path) -> str:
        """A new ed25519 signing key in this gpg home; its public key exported to `keyring`; returns its fpr."""
        self.gpg("--quick-gen-key", uid, "ed25519", "sign", "never")
        fpr = [
            ln.split(":")[9]
            for ln in self.gpg("--with-colons", "--list-keys", uid).splitlines()
            if ln.startswith("fpr:")
        ][0]
        keyring.write_bytes(
            subprocess.run(
                ["gpg", "--homedir", str(self.gnupg), "--batch", "--export", fpr], check=True, capture_output=True
            ).stdout
        )
        return fpr

    def close(self) -> None:
        subprocess.run(["gpgconf", "--homedir", str(self.gnupg), "--kill", "gpg-agent"], capture_output=True)

    def deb(
        self,
        name: str,
        version: str,
        *,
        arch: str | None = None,
        priority: str = "optional",
        depends: str = "",
        pre_depends: str = "",
        provides: str = "",
        files: dict[str, str] | None = None,
        source: str | None = None,
    ) -> Path:
        """Build NAME_VERSION_ARCH.deb with dpkg-deb into pool/main/<x>/<source>/ (files: {path: content})."""
        arch = arch or self.arch
        src = source or name
        prefix = src[:4] if src.startswith("lib") else src[0]
        build = self.root / "build" / f"{name}-{version}"
        (build / "DEBIAN").mkdir(parents=True)
        ctl = [
            f"Package: {name}",
            f"Version: {version}",
            f"Architecture: {arch}",
            "Maintainer: test <t@test.invalid>",
            f"Priority: {priority}",
            "Section: misc",
        ]
        ctl += [f"Depends: {depends}"] if depends else []
        ctl += [f"Pre-Depends: {pre_depends}"] if pre_depends else []
        ctl += [f"Provides: {provides}"] if provides else []
        ctl += [f"Description: test package {name}", " made by tests/debarchive.py"]
        (build / "DEBIAN" / "control").write_text("\n".join(ctl) + "\n")
        for rel, content in (files or {f"usr/share/doc/{name}/README": f"{name} {version}\n"}).items():
            p = build / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(content)
        pool = self.www / "pool" / self.component / prefix / src
        pool.mkdir(parents=True, exist_ok=True)
        out = pool / f"{name}_{version.split(':', 1)[-1]}_{arch}.deb"
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(build), str(out)],
            check=True,
            capture_output=True,
            env={**os.environ, "SOURCE_DATE_EPOCH": "1700000000"},
        )
        shutil.rmtree(build)
        self.debs[name] = out
        return out

    @property
    def dists(self) -> Path:
        return self.www / "dists" / self.suite

    def publish(self, *, codename: str | None = None, extra_release: str = "", sign_with: str | None = None) -> None:
        """Packages (dpkg-scanpackages), Packages.xz, Release (+ SHA256 of both), InRelease (clearsigned)."""
        bdir = self.dists / self.component / f"binary-{self.arch}"
        bdir.mkdir(parents=True, exist_ok=True)
        pkgs = subprocess.run(
            ["dpkg-scanpackages", "--multiversion", "pool"], cwd=self.www, check=True, capture_output=True
        ).stdout
        (bdir / "Packages").write_bytes(pkgs)
        (bdir / "Packages.xz").write_bytes(
            subprocess.run(["xz", "-c"], input=pkgs, check=True, capture_output=True).stdout
        )
        self.write_release(codename=codename, extra=extra_release, sign_with=sign_with)

    def write_release(self, *, codename: str | None = None, extra: str = "", sign_with: str | None = None) -> None:
        lines = []
        for rel in (
            f"{self.component}/binary-{self.arch}/Packages",
            f"{self.component}/binary-{self.arch}/Packages.xz",
        ):
            data = (self.dists / rel).read_bytes()
            lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data):>9} {rel}")
        release = (
            textwrap.dedent(
                f"""\
            Origin: Test
            Suite: oldstable
            Version: 12.99
            Codename: {codename or self.suite}
            Date: Sat, 11 Jul 2026 10:16:37 UTC
            Architectures: all {self.arch}
            Components: {self.component}
            """
            )
            + extra
            + "SHA256:\n"
            + "\n".join(lines)
            + "\n"
        )
        (self.dists / "Release").write_text(release)
        self.gpg(
            "--local-user",
            sign_with or self.fpr,
            "--clearsign",
            "--digest-algo",
            "SHA256",
            "--output",
            str(self.dists / "InRelease"),
            str(self.dists / "Release"),
        )

    @property
    def url(self) -> str:
        return f"file://{self.www}"

    def lock_text(self, name: str = "base", include=(), signed_by=None, keyring: Path | None = None) -> str:
        return textwrap.dedent(
            f"""\
            # a debs pin on a test archive
            lockfile-version: 1
            upstreams:
              {name}:
                kind: debs   # trailing comment, kept
                archive: {self.url}
                suite: {self.suite}
                component: {self.component}
                architecture: {self.arch}
                keyring: {keyring or self.keyring}
                signed-by: [{", ".join(signed_by or [self.fpr])}]
                variant: minbase
                include: [{", ".join(include)}]
                unresolved: filled by the test
            """
        )


def minimal(a: Archive) -> None:
    """A small archive shaped like Debian's: required packages, apt, alternatives, a virtual name, a Provides."""
    a.deb("libc6", "2.36-9", priority="required", source="glibc")
    a.deb("base-files", "12.4", priority="required")
    a.deb("mawk", "1.3.4-1", priority="required", provides="awk")
    a.deb("dpkg", "1.21.22", priority="required", depends="libc6 (>= 2.34), awk", pre_depends="libc6 (>= 2.34)")
    a.deb("usr-is-merged", "37", priority="required")
    a.deb("usrmerge", "37", depends="libc6")
    a.deb("apt", "2.6.1", priority="important", depends="libc6 (>= 2.34), gpgv | gpgv2, base-files")
    a.deb("gpgv", "2.2.40-1", priority="important", depends="libc6")
    a.deb("gpgv2", "2.2.40-1", priority="optional", depends="libc6")
    a.deb("tool", "1.0-1", depends="libtool-1 (= 1.0-1), mawk | gawk, usrmerge | usr-is-merged", source="tool")
    a.deb("libtool-1", "1.0-1", depends="libc6 (>= 2.30)", source="tool")
    a.deb("gawk", "5.2-1", provides="awk")
    a.deb("unrelated", "9.9", depends="libc6")
