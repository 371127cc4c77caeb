"""`reprostack lock debs`: resolve each `kind: debs` pin from its archive's signed Packages index, then fill or check.

How a pin is resolved (nothing but the archive's own signed metadata):
1. `<archive>/dists/<suite>/InRelease` is read (at most MAX_RELEASE_BYTES) and verified with `gpgv --keyring
   <keyring>`: at least one VALIDSIG whose key or primary key fingerprint is one of the pin's `signed-by`, and no
   BADSIG; only the signed text gpgv writes out (`--output`) is read from then on (text outside the signature is
   never seen). Its Suite or Codename must be the pin's suite (another suite's signed file is refused), the pin's
   architecture and component must be in it, and a `Valid-Until` in the past is refused.
2. `<component>/binary-<arch>/Packages.xz` (or `.gz`, or plain) is fetched and must have the size and sha256 the
   signed Release lists; decompressed, it must have the uncompressed Packages' sha256 when the Release lists it.
3. The package set is debootstrap's `--variant=minbase` (debootstrap 1.0.128, scripts/debian-common): every
   `Priority: required` package, `usr-is-merged` on bookworm, `apt`, and the pin's `include`; closed under
   Depends and Pre-Depends the way debootstrap resolves them (the first alternative of each dependency, version and
   arch qualifiers dropped, a name that is not a real package dropped, `usrmerge` never pulled in). So a
   debootstrap from a repository of exactly these .debs installs exactly these packages. The set must then satisfy
   every dependency with versions (an alternative or a Provides in the set): a set dpkg could not configure is an
   error naming the package and the clause, never a pin.
4. Each package: name, version, arch, pool filename, size and sha256, as that index says.

Fill (default): only the pin's `files:` block is rewritten (or appended), with a comment saying where it was read
(the InRelease URL, its Version and Date, the signing key, the index file and its sha256); every other byte stays;
the result is loaded and validated again and written atomically; on any error nothing is written.
Check (`--check`): the lock's files must be exactly the resolved ones; each difference is `FILE:LINE: field: problem`.

Invariants: every archive file is untrusted (lock.debian reads them bounded and checked); a URL is only ever the
pin's `archive` (schema: http, https or file) joined with paths the signed Release or the checked index names;
gpgv is run with an argument vector (no shell) and a fresh home folder.
"""

from __future__ import annotations

import datetime
import email.utils
import hashlib
import re
import subprocess
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..errors import LockError, ReprostackError
from . import debian
from . import fill as lockfill
from .. import lock as lockmod  # the pin model's public face (lock.model, lock.pins)

MAX_RELEASE_BYTES = 4 << 20
TIMEOUT_S = 120.0
VARIANT_ROOTS = ("apt",)  # debootstrap minbase: `base="apt"`
EXCLUDE_DEPENDENCY = ("usrmerge",)  # debootstrap on bookworm and later never pulls usrmerge in


@dataclass(frozen=True)
class Source:
    """Where a resolution was read: the signed Release and the index file."""

    inrelease_url: str
    version: str
    date: str
    signer: str
    index: str
    index_sha256: str


@dataclass(frozen=True)
class Resolved:
    pin: str
    files: tuple  # (DebFile, ...) sorted by name
    source: Source


def fetch_url(url: str, limit: int, what: str, timeout: float = TIMEOUT_S) -> bytes:
    """The body of `url` (http, https or file), at most `limit` bytes. Raises ReprostackError `what: ...`."""
    if not re.match(r"^(https?|file)://", url):
        raise ReprostackError(f"{what}: {url!r} is not an http(s) or file URL")
    try:
        with urllib.request.urlopen(urllib.request.Request(url), timeout=timeout) as r:
            data = r.read(limit + 1)
    except urllib.error.HTTPError as e:
        raise ReprostackError(f"{what}: GET {url}: HTTP {e.code} {e.reason}") from None
    except (OSError, ValueError) as e:
        raise ReprostackError(f"{what}: GET {url}: {getattr(e, 'reason', None) or e}") from None
    if len(data) > limit:
        raise ReprostackError(f"{what}: GET {url}: over {limit} bytes")
    return data


def keyring_path(lock: lockmod.Lock, pin: lockmod.DebsPin) -> Path:
    """The pin's keyring: an absolute path as is, a relative one under the lock's folder."""
    p = Path(pin.keyring)
    return p if p.is_absolute() else lock.path.resolve().parent / p


def verify_inrelease(data: bytes, keyring: Path, signed_by: tuple[str, ...], where: str) -> tuple[str, str]:
    """(the signed text, the fingerprint that vouches for it) of an InRelease file, verified with gpgv against
    `keyring`; raises ReprostackError naming `where` unless a VALIDSIG of a key in `signed_by` is there and no
    BADSIG is."""
    if not keyring.is_file():
        raise ReprostackError(
            f"{where}: keyring {keyring} is not a file (Debian's: apt-get install debian-archive-keyring)"
        )
    with tempfile.TemporaryDirectory(prefix="reprostack-gpgv-") as tmp:
        src, out = Path(tmp, "InRelease"), Path(tmp, "Release")
        src.write_bytes(data)
        home = Path(tmp, "home")
        home.mkdir(mode=0o700)
        try:
            cp = subprocess.run(
                [
                    "gpgv",
                    "--homedir",
                    str(home),
                    "--status-fd",
                    "1",
                    "--keyring",
                    str(keyring),
                    "--output",
                    str(out),
                    str(src),
                ],
                capture_output=True,
                text=True,
                errors="replace",
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError:
            raise ReprostackError(f"{where}: gpgv not found (apt-get install gpgv)") from None
        except subprocess.TimeoutExpired:
            raise ReprostackError(f"{where}: gpgv did not finish in 60 s") from None
        status = [ln.split() for ln in cp.stdout.splitlines() if ln.startswith("[GNUPG:] ")]
        if any(s[1] == "BADSIG" for s in status if len(s) > 1):
            raise ReprostackError(f"{where}: a BAD signature (the file was changed after it was signed)")
        valid = [s for s in status if len(s) > 2 and s[1] == "VALIDSIG"]
        want = set(signed_by)
        signer = next((f for s in valid for f in (s[2], s[-1]) if f in want), None)
        if signer is None:
            have = ", ".join(sorted({s[-1] for s in valid})) or "none"
            tail = " | ".join(cp.stderr.strip().splitlines()[-2:])
            raise ReprostackError(
                f"{where}: no good signature by a key of signed-by ({', '.join(signed_by)}); "
                f"good signatures by: {have}" + (f" ({tail})" if tail else "")
            )
        try:
            text = out.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ReprostackError(f"{where}: gpgv wrote no readable signed text: {e}") from None
    return text, signer


def _check_valid_until(value: str | None, where: str) -> None:
    if not value:
        return
    try:
        until = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        raise ReprostackError(f"{where}: Valid-Until {value[:60]!r} is not a date") from None
    if until.tzinfo is None:
        until = until.replace(tzinfo=datetime.timezone.utc)
    if until < datetime.datetime.now(datetime.timezone.utc):
        raise ReprostackError(f"{where}: Valid-Until {value} has passed (a stale or replayed Release)")


def read_index(lock: lockmod.Lock, name: str) -> tuple[dict, Source]:
    """({package: Stanza}, Source) of pin `name`: its signed Release, then its Packages index (module doc, 1-2)."""
    pin = lock.get(name)
    where = lock.where("upstreams", name, "archive")
    url = f"{pin.archive}/dists/{pin.suite}/InRelease"
    signed, signer = verify_inrelease(
        fetch_url(url, MAX_RELEASE_BYTES, where), keyring_path(lock, pin), pin.signed_by, f"{where}: {url}"
    )
    try:
        rel = debian.read_release(signed, url)
    except debian.DebianError as e:
        raise ReprostackError(f"{where}: {e}") from None
    if pin.suite not in (rel.suite, rel.codename):
        raise ReprostackError(
            f"{where}: {url} is signed for suite {rel.suite!r} codename {rel.codename!r}, not {pin.suite!r}"
        )
    if pin.architecture not in rel.architectures or pin.component not in rel.components:
        raise ReprostackError(
            f"{where}: {url} has no {pin.component}/{pin.architecture} (components {' '.join(rel.components)}; "
            f"architectures {' '.join(rel.architectures)})"
        )
    _check_valid_until(rel.valid_until, f"{where}: {url}")
    base = f"{pin.component}/binary-{pin.architecture}/Packages"
    listed = next((base + s for s in (".xz", ".gz", "") if base + s in rel.sha256), None)
    if listed is None:
        raise ReprostackError(f"{where}: {url} lists no {base}[.xz|.gz] in its SHA256")
    sha, size = rel.sha256[listed]
    iurl = f"{pin.archive}/dists/{pin.suite}/{listed}"
    data = fetch_url(iurl, min(size, debian.MAX_INDEX_BYTES), where)
    got = hashlib.sha256(data).hexdigest()
    if len(data) != size or got != sha:
        raise ReprostackError(
            f"{where}: {iurl}: {len(data)} bytes sha256 {got}, the signed Release lists {size} bytes sha256 {sha}"
        )
    try:
        raw = debian.decompress(data, listed, iurl)
        if listed != base and base in rel.sha256:
            usha, usize = rel.sha256[base]
            if len(raw) != usize or hashlib.sha256(raw).hexdigest() != usha:
                raise debian.DebianError(f"{iurl}: uncompressed, it is not the {base} the signed Release lists")
        index = debian.read_packages(raw, iurl, pin.architecture)
    except debian.DebianError as e:
        raise ReprostackError(f"{where}: {e}") from None
    return index, Source(url, rel.version, rel.date, signer, listed, sha)


def _provided(index: dict) -> dict[str, list]:
    """{virtual name: [(providing package, Relation)]}."""
    out: dict[str, list] = {}
    for st in index.values():
        for p in st.provides:
            out.setdefault(p.name, []).append((st.name, p))
    return out


def roots(index: dict, pin: lockmod.DebsPin) -> list[str]:
    """debootstrap minbase's package list before dependencies: Priority required, usr-is-merged on bookworm, apt,
    then `include` (each must be a real package of the index)."""
    out = sorted(n for n, st in index.items() if st.priority == "required")
    if pin.suite == "bookworm" and "usr-is-merged" in index and "usr-is-merged" not in out:
        out.append("usr-is-merged")
    return out + [n for n in (*VARIANT_ROOTS, *pin.include) if n not in out]


def closure(index: dict, start: list[str], where: str) -> list[str]:
    """`start` closed under Depends/Pre-Depends as debootstrap resolves them (module doc, 3)."""
    missing = [n for n in start if n not in index]
    if missing:
        raise ReprostackError(
            f"{where}: {', '.join(missing)}: not a package of the index (a virtual name? name the real package)"
        )
    have = set(start)
    todo = list(start)
    while todo:
        n = todo.pop()
        for clause in index[n].depends:
            first = clause[0].name
            if first in EXCLUDE_DEPENDENCY or first not in index or first in have:
                continue
            have.add(first)
            todo.append(first)
    return sorted(have)


def unsatisfied(index: dict, names: list[str]) -> list[str]:
    """Each dependency clause of a package in `names` that no package of `names` satisfies (version relations
    and Provides included): `pkg: Depends clause`."""
    chosen = {n: index[n] for n in names}
    provided = _provided(chosen)
    out = []
    for n, st in sorted(chosen.items()):
        for clause in st.depends:
            ok = False
            for alt in clause:
                real = chosen.get(alt.name)
                if real is not None and debian.relation_holds(real.version, alt.op, alt.version):
                    ok = True
                    break
                for _, prov in provided.get(alt.name, ()):
                    if alt.op is None or (prov.op == "=" and debian.relation_holds(prov.version, alt.op, alt.version)):
                        ok = True
                        break
                if ok:
                    break
            if not ok:
                out.append(f"{n} {st.version}: {' | '.join(str(a) for a in clause)}")
    return out


def resolve_pin(lock: lockmod.Lock, name: str) -> Resolved:
    """Resolve debs pin `name` (module doc). Raises ReprostackError naming the pin's line."""
    pin = _debs_pin(lock, name)
    index, source = read_index(lock, name)
    where = lock.where("upstreams", name, "include")
    names = closure(index, roots(index, pin), where)
    bad = unsatisfied(index, names)
    if bad:
        raise ReprostackError(
            f"{where}: debootstrap's resolution (first alternatives) leaves {len(bad)} dependency(ies) unsatisfied: "
            + "; ".join(bad[:5])
            + (" ..." if len(bad) > 5 else "")
            + ": add the package that satisfies each to `include`"
        )
    files = tuple(
        lockmod.DebFile(st.name, st.version, st.arch, st.filename, st.size, st.sha256)
        for st in (index[n] for n in names)
    )
    return Resolved(name, files, source)


def _debs_pin(lock: lockmod.Lock, name: str) -> lockmod.DebsPin:
    pin = lock.get(name)
    if not isinstance(pin, lockmod.DebsPin):
        raise LockError(
            str(lock.path),
            lock.line_of(("upstreams", name)),
            f"upstreams.{name}",
            f"is kind {pin.kind}, `lock debs` takes debs pins",
        )
    return pin


def debs_names(lock: lockmod.Lock, names: list[str]) -> list[str]:
    if names:
        for n in names:
            _debs_pin(lock, n)
        return list(names)
    return [n for n, p in lock.upstreams.items() if isinstance(p, lockmod.DebsPin)]


def check(lock: lockmod.Lock, resolved: list[Resolved]) -> list[str]:
    """Every difference between the lock's files and the resolved ones, as `FILE:LINE: field: problem`."""
    problems = []
    for r in resolved:
        pin = _debs_pin(lock, r.pin)
        if not pin.files:
            problems.append(
                f"{lock.where('upstreams', r.pin)}: no files pinned (the index resolves {len(r.files)} packages; "
                f"run `reprostack lock debs {r.pin}`)"
            )
            continue
        have = {f.name: (i, f) for i, f in enumerate(pin.files)}
        for f in r.files:
            if f.name not in have:
                problems.append(
                    f"{lock.where('upstreams', r.pin, 'files')}: {f.name} {f.version} is in the resolved set and "
                    f"missing from the lock"
                )
                continue
            i, g = have[f.name]
            if g != f:
                problems.append(
                    f"{lock.where('upstreams', r.pin, 'files', i)}: lock has {g.filename} ({g.size} bytes, sha256 "
                    f"{g.sha256}), {r.source.index} of {r.source.inrelease_url} has {f.filename} ({f.size} bytes, "
                    f"sha256 {f.sha256})"
                )
        want = {f.name for f in r.files}
        for n, (i, g) in have.items():
            if n not in want:
                problems.append(
                    f"{lock.where('upstreams', r.pin, 'files', i, 'name')}: {n} {g.version} is not in the resolved set"
                )
    return problems


def _q(s: str) -> str:
    return '"' + s + '"'


def render_files(r: Resolved, col: int) -> list[str]:
    import textwrap

    ind = " " * col
    s = r.source
    note = (
        f"read by `reprostack lock debs` from {s.inrelease_url} (Version {s.version or '-'}, Date {s.date}; gpgv: "
        f"good signature by {s.signer}) and its {s.index} (sha256 {s.index_sha256}, as the signed Release lists "
        f"it): each .deb's name, version, pool filename, size and sha256 as that index says"
    )
    out = [f"{ind}files:\n"] + [f"{ind}  # {ln}\n" for ln in textwrap.wrap(note, 116 - col, break_on_hyphens=False)]
    for f in r.files:
        sha = f.sha256 if any(c.isalpha() for c in f.sha256) else _q(f.sha256)
        out.append(
            f"{ind}  - {{name: {f.name}, version: {_q(f.version)}, arch: {f.arch}, filename: {f.filename}, "
            f"size: {f.size}, sha256: {sha}}}\n"
        )
    return out


def _span(text: str, name: str) -> tuple[int, int, int, bool]:
    """(first line, last line, key column, has_files) of the pin's `files:` block (0-based, inclusive); without one:
    the line after the pin's last line and False."""
    node = lockfill.pin_node(text, name)
    if not isinstance(node, yaml.MappingNode) or node.flow_style:
        raise ReprostackError(f"upstreams.{name}: a debs pin must be a block mapping to be filled")
    col = node.value[0][0].start_mark.column

    def last(n) -> int:
        end = n.end_mark
        if isinstance(n, yaml.ScalarNode) or getattr(n, "flow_style", False):
            return end.line if end.column > 0 or end.line == n.start_mark.line else end.line - 1
        kids = [v for kv in n.value for v in (kv if isinstance(kv, tuple) else (kv,))]
        return max([last(k) for k in kids] or [n.start_mark.line])

    try:
        key, val = lockfill.child(node, "files")
    except KeyError:
        end = max(last(v) for _, v in node.value)
        return end + 1, end, col, False
    return key.start_mark.line, max(key.start_mark.line, last(val)), col, True


def fill_text(text: str, resolved: list[Resolved]) -> str:
    """`text` with each resolved pin's `files:` block replaced (or appended) and its `unresolved:` line dropped."""
    for r in resolved:
        text = lockfill.drop_unresolved(text, r.pin)
        span = _span(text, r.pin)
        text = lockfill.put_block(text, span, render_files(r, span[2]))
    return text


def _describe(lock: lockmod.Lock, r: Resolved) -> str:
    total = sum(f.size for f in r.files)
    return (
        f"{len(r.files)} .debs ({total / 1e6:.1f} MB) from {r.source.index} of {r.source.inrelease_url} "
        f"(Version {r.source.version or '-'}, {r.source.date}, signed by {r.source.signer})"
    )


KIND = lockfill.PinKind(
    what="debs",
    field="files",
    source="the archive's signed index",
    names=debs_names,
    resolve=resolve_pin,
    describe=_describe,
    check=check,
    fill_text=fill_text,
)


def run(lock_path: Path, names: list[str], do_check: bool, out=print) -> int:
    """Fill or check debs pins (see reprostack.lock.fill.run)."""
    return lockfill.run(KIND, lock_path, names, do_check, out)
