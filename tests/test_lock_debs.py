"""`reprostack lock debs` and the .debs fetch on a real archive made in the test (tests/debarchive.py: dpkg-deb,
dpkg-scanpackages, xz, a gpg key of the test signing InRelease), read back with gpgv; hostile archive files fuzzed."""

from __future__ import annotations

import hashlib
import random
import subprocess
from pathlib import Path

import pytest
import yaml

from reprostack import cli
from reprostack.errors import FetchError, ReprostackError
from reprostack.fetch.debs import fetch_debs
from reprostack.lock import DebsPin, load
from reprostack.lock import debian
from reprostack.lock.debs import closure, roots

import debarchive

pytestmark = pytest.mark.skipif(debarchive.why_no_tools() is not None, reason=str(debarchive.why_no_tools()))

WANT = ["apt", "base-files", "dpkg", "gpgv", "libc6", "libtool-1", "mawk", "tool", "usr-is-merged"]


@pytest.fixture
def archive(tmp_path):
    a = debarchive.Archive(tmp_path / "archive")
    debarchive.minimal(a)
    a.publish()
    yield a
    a.close()


def _lock(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "upstreams.lock"
    p.write_text(text)
    return p


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_fill_resolves_debootstraps_set_then_check_passes(tmp_path, archive, capsys):
    lock = _lock(tmp_path, archive.lock_text(include=["tool"]))
    before = lock.read_text()
    rc, out, err = _run(capsys, "lock", "debs", "--lock", str(lock))
    assert rc == 0, err
    assert "9 .debs" in out and archive.fpr in out
    text = lock.read_text()
    # only the files block was added and the `unresolved:` line dropped: every other line byte for byte
    kept = [ln for ln in before.splitlines(True) if not ln.strip().startswith("unresolved:")]
    assert text.startswith("".join(kept))
    pin = load(lock).get("base")
    assert isinstance(pin, DebsPin)
    # debootstrap's minbase: Priority required + usr-is-merged + apt, then the first alternative of each dependency
    # (gpgv, not gpgv2; mawk, not gawk; usrmerge never: excluded, usr-is-merged satisfies `usrmerge | usr-is-merged`)
    assert [f.name for f in pin.files] == WANT
    for f in pin.files:
        deb = archive.debs[f.name]
        assert f.sha256 == hashlib.sha256(deb.read_bytes()).hexdigest() and f.size == deb.stat().st_size
        assert f.filename == deb.relative_to(archive.www).as_posix()
    assert "# read by `reprostack lock debs` from" in text and archive.fpr in text and "InRelease" in text
    rc, out, err = _run(capsys, "lock", "debs", "--check", "--lock", str(lock))
    assert rc == 0, err
    assert "match the archive's signed index" in out
    rc, out, _ = _run(capsys, "lock", "debs", "--lock", str(lock))
    assert rc == 0 and "unchanged" in out


def test_check_names_the_line_of_a_tampered_sha256_and_a_moved_archive(tmp_path, archive, capsys):
    lock = _lock(tmp_path, archive.lock_text(include=["tool"]))
    assert _run(capsys, "lock", "debs", "--lock", str(lock))[0] == 0
    text = lock.read_text()
    sha = load(lock).get("base").file("tool").sha256
    lock.write_text(text.replace(sha, "a" * 64))
    rc, _, err = _run(capsys, "lock", "debs", "--check", "--lock", str(lock))
    assert rc == 2
    line = next(i for i, ln in enumerate(lock.read_text().splitlines(), 1) if "name: tool," in ln)
    assert f"upstreams.lock:{line}: upstreams.base.files[7]: lock has pool/main/t/tool/tool_1.0-1_amd64.deb" in err
    lock.write_text(text)
    # the archive moves on (a point release): tool 1.0-2 replaces 1.0-1
    archive.debs.pop("tool").unlink()
    archive.deb("tool", "1.0-2", depends="libtool-1 (= 1.0-1)", source="tool")
    archive.publish()
    rc, _, err = _run(capsys, "lock", "debs", "--check", "--lock", str(lock))
    assert rc == 2 and "tool_1.0-2_amd64.deb" in err and "1 debs pin problem(s)" in err


def _fill_fails(tmp_path, capsys, text: str, *needles: str) -> str:
    lock = _lock(tmp_path, text)
    rc, _, err = _run(capsys, "lock", "debs", "--lock", str(lock))
    assert rc == 2, err
    assert lock.read_text() == text, "nothing may be written"
    assert err.count("\n") == 1, err
    for n in needles:
        assert n in err, err
    return err


def test_a_signature_by_another_key_is_refused(tmp_path, archive, capsys):
    other = archive.new_key("someone else <x@test.invalid>", tmp_path / "other.gpg")
    archive.write_release(sign_with=other)
    keyring = tmp_path / "both.gpg"
    keyring.write_bytes(archive.keyring.read_bytes() + (tmp_path / "other.gpg").read_bytes())
    _fill_fails(
        tmp_path,
        capsys,
        archive.lock_text(include=["tool"], keyring=keyring),
        "no good signature by a key of signed-by",
        f"good signatures by: {other}",
    )


def test_a_changed_release_or_text_outside_the_signature_is_refused(tmp_path, archive, capsys):
    inrel = archive.dists / "InRelease"
    signed = inrel.read_text()
    inrel.write_text(signed.replace("Codename: bookworm", "Codename: bookwurm"))
    _fill_fails(tmp_path, capsys, archive.lock_text(include=["tool"]), "BAD signature")
    # a Release line appended after the signature is never read: the signed text has no such component
    inrel.write_text(signed.replace("Components: main", "Components: nonfree") + "Components: main\n")
    _fill_fails(tmp_path, capsys, archive.lock_text(include=["tool"]), "BAD signature")
    inrel.write_text(signed + "\nSHA256:\n 00 1 main/binary-amd64/Packages.xz\n")
    lock = _lock(tmp_path, archive.lock_text(include=["tool"]))
    assert _run(capsys, "lock", "debs", "--lock", str(lock))[0] == 0


def test_another_suites_signed_release_is_refused(tmp_path, archive, capsys):
    archive.write_release(codename="trixie")
    _fill_fails(
        tmp_path,
        capsys,
        archive.lock_text(include=["tool"]),
        "is signed for suite 'oldstable' codename 'trixie', not 'bookworm'",
    )


def test_an_index_with_other_bytes_than_the_release_lists_is_refused(tmp_path, archive, capsys):
    xz = archive.dists / "main/binary-amd64/Packages.xz"
    xz.write_bytes(xz.read_bytes()[:-1] + b"\0")
    _fill_fails(tmp_path, capsys, archive.lock_text(include=["tool"]), "Packages.xz:", "the signed Release lists")


def test_an_expired_release_is_refused(tmp_path, archive, capsys):
    archive.write_release(extra="Valid-Until: Sun, 12 Jul 2026 10:16:37 UTC\n")
    _fill_fails(tmp_path, capsys, archive.lock_text(include=["tool"]), "Valid-Until", "has passed")


def test_an_unsatisfiable_set_and_a_virtual_include_are_errors(tmp_path, archive, capsys):
    # `awk` first: a virtual name debootstrap drops, so nothing in its set satisfies `awk2 | gawk`
    archive.deb("needs-awk", "1", depends="awk2 | gawk (>= 9)")
    archive.publish()
    _fill_fails(
        tmp_path,
        capsys,
        archive.lock_text(include=["needs-awk"]),
        "leaves 1 dependency(ies) unsatisfied",
        "needs-awk 1: awk2 | gawk (>= 9)",
    )
    _fill_fails(tmp_path, capsys, archive.lock_text(include=["awk"]), "awk: not a package of the index")


def test_lock_check_refuses_a_filename_that_is_not_the_packages_own(tmp_path, archive, capsys):
    lock = _lock(tmp_path, archive.lock_text(include=["tool"]))
    assert _run(capsys, "lock", "debs", "--lock", str(lock))[0] == 0
    text = lock.read_text()
    for old, new, needle in (
        (
            "pool/main/t/tool/tool_1.0-1_amd64.deb",
            "pool/main/t/tool/tool_1.0-2_amd64.deb",
            "is not the pool file of tool 1.0-1",
        ),
        ("pool/main/t/tool/tool_1.0-1_amd64.deb", "pool/main/t/../../../../etc/x_1_amd64.deb", "does not match"),
        ("{name: usr-is-merged,", "{name: tool,", "tool is pinned twice"),
        (
            "arch: amd64, filename: pool/main/t/tool/",
            "arch: arm64, filename: pool/main/t/tool/",
            "is not the pool file",
        ),
    ):
        lock.write_text(text.replace(old, new, 1))
        rc, _, err = _run(capsys, "lock", "check", "--lock", str(lock))
        assert rc == 2 and needle in err and err.count("\n") == 1, err
        assert "upstreams.lock:" in err


def test_fetch_debs_verifies_every_file_from_archive_house_and_cache(tmp_path, archive, capsys):
    lock_p = _lock(tmp_path, archive.lock_text(include=["tool"]))
    assert _run(capsys, "lock", "debs", "--lock", str(lock_p))[0] == 0
    lock = load(lock_p)
    cache = tmp_path / "cache"
    got = fetch_debs(lock, "base", cache_root=cache)
    assert [d.name for d in got] == WANT
    for d in got:
        assert d.path == cache / "debs" / d.sha256 / Path(d.filename).name
        assert hashlib.sha256(d.path.read_bytes()).hexdigest() == d.sha256
    # a cached copy changed on a shared disk is removed and fetched again (never used)
    tool = next(d for d in got if d.name == "tool").path
    tool.write_bytes(b"tampered")
    again = fetch_debs(lock, "base", cache_root=cache)
    assert (
        hashlib.sha256(next(d for d in again if d.name == "tool").path.read_bytes()).hexdigest()
        == lock.get("base").file("tool").sha256
    )
    # offline with nothing cached: one line naming the pin and what is missing
    with pytest.raises(FetchError, match=r"9 \.deb\(s\) not in the cache or a debhouse .* --offline forbids"):
        fetch_debs(lock, "base", cache_root=tmp_path / "empty", offline=True)
    # a debhouse file with other bytes is an error, never used
    house = tmp_path / "house"
    house.mkdir()
    (house / "tool_1.0-1_amd64.deb").write_bytes(b"not the pinned bytes")
    with pytest.raises(FetchError, match=r"tool_1.0-1_amd64.deb: 20 bytes sha256 .* pins tool_1.0-1_amd64.deb as"):
        fetch_debs(lock, "base", cache_root=tmp_path / "c2", debhouses=[house], offline=True)
    # the archive serving other bytes under the pinned name: refused, nothing cached
    archive.debs["tool"].write_bytes(archive.debs["tool"].read_bytes() + b"x")
    with pytest.raises(FetchError, match=r"gave \d+ bytes sha256 .* the lock pins"):
        fetch_debs(lock, "base", cache_root=tmp_path / "c3")
    assert not list((tmp_path / "c3").glob("debs/*/tool_*"))


def test_version_order_is_dpkgs(tmp_path):
    rnd = random.Random(26)
    parts = ["0", "1", "2", "10", "a", "b", "~", "~~", ".", "+", "-", "z", "09", "1a", "~rc1", "+b1", "deb12u1"]
    versions = ["1.0", "1.0-1", "1:0.9", "1.0~rc1", "1.0+b1", "1.0-1.1", "2.36-9", "1:2.39.5-.", "1:2.39.5-0+deb12u3"]
    for _ in range(300):
        v = rnd.choice("0123456789") + "".join(rnd.choice(parts) for _ in range(rnd.randint(0, 5)))
        if rnd.random() < 0.3:
            v = f"{rnd.randint(0, 3)}:{v}"
        if rnd.random() < 0.5 and not v.endswith("-"):
            v += "-" + rnd.choice("0123456789") + "".join(rnd.choice(parts[:-4]) for _ in range(rnd.randint(0, 3)))
        if not debian.VERSION.fullmatch(v) or v.endswith("-"):
            continue
        versions.append(v)
    for _ in range(300):
        a, b = rnd.choice(versions), rnd.choice(versions)
        c = debian.version_compare(a, b)
        lt = subprocess.run(["dpkg", "--compare-versions", a, "lt", b], capture_output=True).returncode == 0
        eq = subprocess.run(["dpkg", "--compare-versions", a, "eq", b], capture_output=True).returncode == 0
        assert (c < 0) == lt and (c == 0) == eq, (a, b, c)


def test_control_of_a_real_deb_is_what_dpkg_deb_reads(archive):
    for name, deb in archive.debs.items():
        ctl = debian.deb_control(deb.read_bytes(), str(deb))
        for field in ("Package", "Version", "Architecture", "Depends", "Provides", "Priority"):
            r = subprocess.run(["dpkg-deb", "--field", str(deb), field], capture_output=True, text=True)
            assert ctl.get(field, "") == r.stdout.strip(), (name, field)


def test_resolution_roots_and_closure_on_the_index(archive):
    data = (archive.dists / "main/binary-amd64/Packages").read_bytes()
    index = debian.read_packages(data, "Packages", "amd64")
    pin = DebsPin("x", archive.url, "bookworm", "main", "amd64", "k", ("F" * 40,), "minbase", ("tool",), ())
    assert roots(index, pin) == ["base-files", "dpkg", "libc6", "mawk", "usr-is-merged", "apt", "tool"]
    assert closure(index, roots(index, pin), "w") == WANT


def _mutations(data: bytes, rnd: random.Random, n: int):
    lines = data.split(b"\n")
    for _ in range(n):
        k = rnd.randrange(8)
        if k == 0:
            i = rnd.randrange(len(data))
            yield data[:i] + bytes([rnd.randrange(256)]) + data[i + 1 :]
        elif k == 1:
            yield data[: rnd.randrange(len(data))]
        elif k == 2 and len(lines) > 1:
            i = rnd.randrange(len(lines))
            yield b"\n".join(lines[:i] + lines[i + 1 :])
        elif k == 3:
            i = rnd.randrange(len(lines))
            yield b"\n".join(lines[:i] + [lines[i]] * rnd.randint(2, 5) + lines[i + 1 :])
        elif k == 4:
            i = rnd.randrange(len(lines))
            junk = rnd.choice(
                [
                    b"../../etc/passwd",
                    b"-rf",
                    b"\x00\xff",
                    b"A" * 5000,
                    b"1e999",
                    b"(>= ",
                    b"| |",
                    b"pool/main/x/x/x_1_amd64.deb",
                    b" continuation",
                    b":",
                    b"\r",
                    "\u202e".encode(),
                ]
            )
            yield b"\n".join(lines[:i] + [lines[i][: rnd.randrange(len(lines[i]) + 1)] + junk] + lines[i + 1 :])
        elif k == 5:
            yield bytes(rnd.randrange(256) for _ in range(rnd.randrange(200)))
        elif k == 6:
            yield b""
        else:
            i = rnd.randrange(len(data))
            yield data[:i] + data[i:][::-1][: rnd.randrange(64)] + data[i:]


def test_fuzz_hostile_packages_release_and_debs_never_traceback(archive):
    rnd = random.Random(20261203)
    packages = (archive.dists / "main/binary-amd64/Packages").read_bytes()
    release = (archive.dists / "Release").read_bytes()
    deb = archive.debs["dpkg"].read_bytes()
    counts = {"packages": 0, "release": 0, "deb": 0, "relations": 0, "xz": 0}
    for m in _mutations(packages, rnd, 1000):
        try:
            for st in debian.read_packages(m, "Packages", "amd64").values():
                assert debian.PACKAGE.fullmatch(st.name) and debian.POOL_PATH.fullmatch(st.filename)
                assert ".." not in st.filename.split("/")
        except debian.DebianError as e:
            assert "\n" not in str(e).strip()
        counts["packages"] += 1
    for m in _mutations(release, rnd, 1000):
        try:
            r = debian.read_release(m.decode("utf-8", "replace"), "Release")
            assert all(".." not in p.split("/") and not p.startswith("/") for p in r.sha256)
        except debian.DebianError:
            pass
        counts["release"] += 1
    for m in _mutations(deb, rnd, 1000):
        try:
            debian.deb_control(m, "x.deb")
        except debian.DebianError:
            pass
        counts["deb"] += 1
    for m in _mutations(b"libc6 (>= 2.34), gpgv | gpgv2:any (<< 3), awk [amd64] <!nocheck>", rnd, 1000):
        try:
            debian.parse_relations(m.decode("utf-8", "replace"), "Depends")
        except debian.DebianError:
            pass
        counts["relations"] += 1
    xz = (archive.dists / "main/binary-amd64/Packages.xz").read_bytes()
    for m in _mutations(xz, rnd, 1000):
        try:
            debian.decompress(m, "Packages.xz", "x", limit=1 << 20)
        except debian.DebianError:
            pass
        counts["xz"] += 1
    assert all(v == 1000 for v in counts.values()), counts


def test_an_xz_bomb_and_a_huge_control_are_bounded():
    bomb = subprocess.run(["xz", "-c"], input=b"\0" * (8 << 20), capture_output=True, check=True).stdout
    with pytest.raises(debian.DebianError, match="decompresses to over 1048576 bytes"):
        debian.decompress(bomb, "Packages.xz", "x", limit=1 << 20)
    with pytest.raises(debian.DebianError, match="more than 3 stanzas"):
        debian.parse_stanzas("A: 1\n\nA: 2\n\nA: 3\n\nA: 4\n\nA: 5\n", "x", max_stanzas=3)


def test_lock_debs_refuses_another_kind_and_an_unknown_pin(tmp_path, archive, capsys):
    lock = _lock(tmp_path, archive.lock_text(include=["tool"]))
    rc, _, err = _run(capsys, "lock", "debs", "nope", "--lock", str(lock))
    assert rc == 2 and "no such pin" in err
    with pytest.raises(ReprostackError):
        from reprostack.lock.debs import resolve_pin

        resolve_pin(load(lock, allow_unfilled=True), "nope")
    assert yaml.safe_load(lock.read_text())["upstreams"]["base"]["unresolved"]
