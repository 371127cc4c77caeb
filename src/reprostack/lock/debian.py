"""Debian's archive formats, read as untrusted input: deb822 stanzas (a `Packages` index, a `Release` file), package
relations (`Depends: a (>= 1) | b`), dpkg's version order, and a `.deb`'s control file (ar + control.tar).

Used by `reprostack lock debs` (lock.debs: which .debs a `kind: debs` pin holds, read from the archive's signed
index) and by the image stage (containers.debsbase: a local apt repository made from the verified .debs).

Invariants:
- every reader is bounded (bytes, stanzas, fields, line length) and raises DebianError with one line naming the
  file (and stanza or field) for anything it cannot read: never another exception, never a partial result;
- a value that later becomes part of a path or a command (package name, version, pool filename, architecture) is
  checked against Debian policy's character set here (PACKAGE, VERSION, POOL_PATH): `..`, `/`, spaces, control
  characters and leading `-` never get through;
- `version_compare` is dpkg's algorithm (epoch, then upstream and revision compared by dpkg's verrevcmp: `~` sorts
  before everything, letters before non-letters, digit runs numerically); `relation_holds` applies it to the
  relation operators dpkg knows (<<, <=, =, >=, >>; the obsolete < and > mean <= and >=).
"""

from __future__ import annotations

import io
import lzma
import gzip
import re
import tarfile
from dataclasses import dataclass

from ..errors import ReprostackError

MAX_INDEX_BYTES = 256 << 20  # an uncompressed Packages index (bookworm main amd64: 50 MB)
MAX_STANZAS = 400_000
MAX_FIELD_BYTES = 1 << 20  # one field value (Description can be long; Depends lines are short)
MAX_CONTROL_BYTES = 4 << 20  # a .deb's control.tar, uncompressed
MAX_DEB_MEMBERS = 16

PACKAGE = re.compile(r"[a-z0-9][a-z0-9.+-]{0,127}")
VERSION = re.compile(r"(?:[0-9]{1,9}:)?[0-9A-Za-z][0-9A-Za-z.+~-]{0,127}")
ARCH = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
SHA256 = re.compile(r"[0-9a-f]{64}")
# pool/<component>/<prefix>/<source>/<file>.deb: the archive's own layout (dak), no `..`, no leading `-`
POOL_PATH = re.compile(
    r"pool/[a-z0-9][a-z0-9-]{0,31}/(?:lib)?[a-z0-9]/[a-z0-9][a-z0-9.+-]{0,127}/"
    r"[a-z0-9][a-z0-9.+-]{0,127}_[0-9A-Za-z.+~-]{1,128}_[a-z0-9-]{1,32}\.deb"
)
_FIELD = re.compile(r"([!-9;-~][!-9;-~]*):(.*)")  # deb822 field name: printable, no colon, no space
_REL = re.compile(
    r"\s*([a-z0-9][a-z0-9.+-]*)(?::([a-z0-9-]+))?\s*(?:\(\s*(<<|<=|=|>=|>>|<|>)\s*([^\s)]+)\s*\))?\s*"
    r"(?:\[[^\]]*\])?\s*(?:<[^>]*>\s*)*"
)


class DebianError(ReprostackError):
    """An archive file (Release, Packages, .deb) that is not one, or one that breaks a rule: one line naming it."""


@dataclass(frozen=True)
class Relation:
    """One alternative of a dependency: a package name, an optional arch qualifier, an optional (op, version)."""

    name: str
    arch: str | None = None
    op: str | None = None
    version: str | None = None

    def __str__(self) -> str:
        q = f":{self.arch}" if self.arch else ""
        return f"{self.name}{q}" + (f" ({self.op} {self.version})" if self.op else "")


def parse_stanzas(text: str, where: str, *, max_stanzas: int = MAX_STANZAS) -> list[dict[str, str]]:
    """The deb822 stanzas of `text` (paragraphs separated by blank lines; `Field: value`, continuation lines start
    with a space or tab, kept joined by newlines). Raises DebianError `where: stanza N: ...` for a line that is
    neither, a field given twice in one stanza, a field over MAX_FIELD_BYTES, or too many stanzas."""
    out: list[dict[str, str]] = []
    cur: dict[str, str] = {}
    last: str | None = None
    start = 1
    for n, line in enumerate(text.split("\n"), start=1):
        if line.endswith("\r"):
            line = line[:-1]
        if not line.strip():
            if cur:
                out.append(cur)
                if len(out) > max_stanzas:
                    raise DebianError(f"{where}: more than {max_stanzas} stanzas")
            cur, last, start = {}, None, n + 1
            continue
        if line[0] in " \t":
            if last is None:
                raise DebianError(f"{where}:{n}: a continuation line outside a field")
            cur[last] += "\n" + line[1:]
            if len(cur[last]) > MAX_FIELD_BYTES:
                raise DebianError(f"{where}:{n}: field {last} over {MAX_FIELD_BYTES} bytes")
            continue
        if line.startswith("#"):
            continue
        m = _FIELD.fullmatch(line)
        if not m:
            raise DebianError(f"{where}:{n}: not a `Field: value` line (stanza starting at line {start})")
        key = m.group(1)
        if key in cur:
            raise DebianError(f"{where}:{n}: field {key} given twice in one stanza (starting at line {start})")
        cur[key], last = m.group(2).strip(), key
    if cur:
        out.append(cur)
    return out


def parse_relations(value: str, where: str) -> list[list[Relation]]:
    """`Depends`-style value -> [[alternative, ...], ...]. Raises DebianError naming `where` for a clause that is
    not `name[:arch] [(op version)] [| ...]`."""
    out = []
    for clause in value.replace("\n", " ").split(","):
        if not clause.strip():
            continue
        alts = []
        for alt in clause.split("|"):
            m = _REL.fullmatch(alt)
            if not m:
                raise DebianError(f"{where}: {alt.strip()[:80]!r} is not a package relation")
            name, arch, op, ver = m.groups()
            if not PACKAGE.fullmatch(name) or (ver is not None and not VERSION.fullmatch(ver)):
                raise DebianError(f"{where}: {alt.strip()[:80]!r} is not a package relation")
            op = {"<": "<=", ">": ">="}.get(op, op)
            alts.append(Relation(name, arch, op, ver))
        out.append(alts)
    return out


def _order(c: str) -> int:
    if c.isdigit():
        return 0
    if c == "~":
        return -1
    if c.isalpha():
        return ord(c)
    return ord(c) + 256


def _verrevcmp(a: str, b: str) -> int:
    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) else 0
            bc = _order(b[j]) if j < len(b) else 0
            if ac != bc:
                return ac - bc
            i += 1
            j += 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first_diff:
                first_diff = ord(a[i]) - ord(b[j])
            i += 1
            j += 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first_diff:
            return first_diff
    return 0


def _split(v: str) -> tuple[int, str, str]:
    epoch, _, rest = v.rpartition(":") if ":" in v else ("0", "", v)
    upstream, dash, rev = rest.rpartition("-")
    if not dash:
        upstream, rev = rest, ""
    return int(epoch or 0), upstream, rev


def version_compare(a: str, b: str) -> int:
    """dpkg's order of two versions: < 0, 0 or > 0 (dpkg --compare-versions)."""
    ea, ua, ra = _split(a)
    eb, ub, rb = _split(b)
    if ea != eb:
        return -1 if ea < eb else 1
    c = _verrevcmp(ua, ub)
    if c:
        return c
    return _verrevcmp(ra, rb)


def relation_holds(have: str, op: str | None, want: str | None) -> bool:
    """Whether version `have` satisfies `(op want)` (always, without an operator)."""
    if op is None:
        return True
    c = version_compare(have, want)
    return {"<<": c < 0, "<=": c <= 0, "=": c == 0, ">=": c >= 0, ">>": c > 0}[op]


@dataclass(frozen=True)
class Stanza:
    """One binary package of a Packages index, its fields checked (module doc)."""

    name: str
    version: str
    arch: str
    filename: str
    size: int
    sha256: str
    priority: str
    depends: tuple  # ((Relation, ...), ...): Pre-Depends then Depends
    provides: tuple  # (Relation, ...)
    essential: bool
    fields: dict


def package_stanza(s: dict, where: str) -> Stanza:
    """A Packages stanza checked field by field (name, version, architecture, pool filename, size, sha256, relations).
    Raises DebianError naming `where` and the package."""
    name = s.get("Package", "")
    if not PACKAGE.fullmatch(name):
        raise DebianError(f"{where}: Package {name[:80]!r} is not a Debian package name")
    at = f"{where}: {name}"
    for key in ("Version", "Architecture", "Filename", "Size", "SHA256"):
        if key not in s:
            raise DebianError(f"{at}: no {key} field")
    if not VERSION.fullmatch(s["Version"]):
        raise DebianError(f"{at}: Version {s['Version'][:80]!r} is not a Debian version")
    if not ARCH.fullmatch(s["Architecture"]):
        raise DebianError(f"{at}: Architecture {s['Architecture'][:40]!r} is not an architecture")
    if not POOL_PATH.fullmatch(s["Filename"]) or "/../" in s["Filename"]:
        raise DebianError(f"{at}: Filename {s['Filename'][:120]!r} is not a pool/ path of a .deb")
    if not re.fullmatch(r"[0-9]{1,12}", s["Size"]):
        raise DebianError(f"{at}: Size {s['Size'][:40]!r} is not a byte count")
    if not SHA256.fullmatch(s["SHA256"]):
        raise DebianError(f"{at}: SHA256 {s['SHA256'][:80]!r} is not 64 hex")
    deps = []
    for key in ("Pre-Depends", "Depends"):
        if key in s:
            deps += [tuple(c) for c in parse_relations(s[key], f"{at}: {key}")]
    provides = []
    if "Provides" in s:
        for clause in parse_relations(s["Provides"], f"{at}: Provides"):
            if len(clause) != 1 or clause[0].op not in (None, "="):
                raise DebianError(f"{at}: Provides: {clause[0]} is not a provided name [(= version)]")
            provides.append(clause[0])
    return Stanza(
        name=name,
        version=s["Version"],
        arch=s["Architecture"],
        filename=s["Filename"],
        size=int(s["Size"]),
        sha256=s["SHA256"],
        priority=s.get("Priority", "optional"),
        depends=tuple(deps),
        provides=tuple(provides),
        essential=s.get("Essential", "no") == "yes",
        fields=s,
    )


def read_packages(data: bytes, where: str, architecture: str) -> dict[str, Stanza]:
    """{name: Stanza} of a Packages index's packages of `architecture` and `all`; a package listed at several versions
    (the archive does that for a few, e.g. linux-doc) is its highest, as apt takes it. Raises DebianError for
    anything unreadable, and for one version of a package listed twice with other bytes."""
    if len(data) > MAX_INDEX_BYTES:
        raise DebianError(f"{where}: over {MAX_INDEX_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DebianError(f"{where}: not UTF-8 (byte {e.start})") from None
    out: dict[str, Stanza] = {}
    for i, raw in enumerate(parse_stanzas(text, where), start=1):
        st = package_stanza(raw, f"{where}: stanza {i}")
        if st.arch not in (architecture, "all"):
            continue
        prev = out.get(st.name)
        if prev is not None:  # the archive lists some packages at two versions (linux-*): apt takes the highest
            c = version_compare(st.version, prev.version)
            if c == 0 and (st.sha256, st.filename) != (prev.sha256, prev.filename):
                raise DebianError(
                    f"{where}: stanza {i}: {st.name} {st.version} is given twice with other bytes "
                    f"({prev.filename} sha256 {prev.sha256}, {st.filename} sha256 {st.sha256})"
                )
            if c <= 0:
                continue
        out[st.name] = st
    if not out:
        raise DebianError(f"{where}: no package of architecture {architecture} or all")
    return out


@dataclass(frozen=True)
class Release:
    """The fields of a (signed) Release file that `lock debs` uses."""

    suite: str
    codename: str
    version: str
    date: str
    architectures: tuple[str, ...]
    components: tuple[str, ...]
    sha256: dict  # {path: (sha256, size)}
    valid_until: str | None


def read_release(text: str, where: str) -> Release:
    """A Release file (the signed part of InRelease): Suite/Codename/Date, Architectures, Components and its SHA256
    list. Raises DebianError for a missing field or a malformed SHA256 line."""
    stanzas = parse_stanzas(text, where, max_stanzas=1)
    if len(stanzas) != 1:
        raise DebianError(f"{where}: a Release file is one stanza")
    s = stanzas[0]
    for key in ("Date", "Architectures", "Components", "SHA256"):
        if key not in s:
            raise DebianError(f"{where}: no {key} field")
    if "Suite" not in s and "Codename" not in s:
        raise DebianError(f"{where}: no Suite or Codename field")
    sums = {}
    for line in s["SHA256"].split("\n"):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 3 or not SHA256.fullmatch(parts[0]) or not parts[1].isdigit():
            raise DebianError(f"{where}: SHA256: {line.strip()[:100]!r} is not `sha256 size path`")
        if ".." in parts[2].split("/") or parts[2].startswith("/"):
            raise DebianError(f"{where}: SHA256: {parts[2][:100]!r} is not a path under the suite")
        sums[parts[2]] = (parts[0], int(parts[1]))
    return Release(
        suite=s.get("Suite", ""),
        codename=s.get("Codename", ""),
        version=s.get("Version", ""),
        date=s["Date"],
        architectures=tuple(s["Architectures"].split()),
        components=tuple(s["Components"].split()),
        sha256=sums,
        valid_until=s.get("Valid-Until"),
    )


def decompress(data: bytes, name: str, where: str, limit: int = MAX_INDEX_BYTES) -> bytes:
    """`data` uncompressed by the suffix of `name` (.xz, .gz, none), at most `limit` bytes. Raises DebianError."""
    try:
        if name.endswith(".xz"):
            d = lzma.LZMADecompressor()
            out = d.decompress(data, max_length=limit + 1)
        elif name.endswith(".gz"):
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
                out = f.read(limit + 1)
        else:
            out = data
    except (lzma.LZMAError, OSError, EOFError) as e:
        raise DebianError(f"{where}: cannot decompress {name}: {e}") from None
    if len(out) > limit:
        raise DebianError(f"{where}: {name} decompresses to over {limit} bytes")
    return out


def deb_control(data: bytes, where: str) -> dict[str, str]:
    """The `control` stanza of a .deb (ar archive: debian-binary, control.tar[.xz|.gz], data.tar...). Raises
    DebianError for anything else (not an ar archive, no control member, a zstd control, a control over
    MAX_CONTROL_BYTES, a control that is not one stanza)."""
    text = deb_control_text(data, where)
    stanzas = parse_stanzas(text, f"{where}: control", max_stanzas=1)
    if len(stanzas) != 1:
        raise DebianError(f"{where}: control is not one stanza")
    return stanzas[0]


def deb_member_mtime(data: bytes, name_prefix: str, where: str) -> int:
    """The ar header mtime of the first member whose name starts with `name_prefix` (dpkg-deb writes the package's
    SOURCE_DATE_EPOCH there: the date of its changelog entry). Raises DebianError."""
    if not data.startswith(b"!<arch>\n"):
        raise DebianError(f"{where}: not a .deb (no ar magic)")
    pos = 8
    for _ in range(MAX_DEB_MEMBERS):
        head = data[pos : pos + 60]
        if len(head) < 60 or head[58:60] != b"`\n":
            break
        name = head[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            mtime, size = int(head[16:28].decode("ascii").strip()), int(head[48:58].decode("ascii").strip())
        except ValueError:
            raise DebianError(f"{where}: ar member {name[:16]!r} has no mtime or size") from None
        if name.startswith(name_prefix):
            return mtime
        pos += 60 + size + (size & 1)
    raise DebianError(f"{where}: no ar member {name_prefix}*")


def deb_control_text(data: bytes, where: str) -> str:
    """The `./control` file of a .deb as text (deb_control's checks on the container; the stanza is not parsed)."""
    if not data.startswith(b"!<arch>\n"):
        raise DebianError(f"{where}: not a .deb (no ar magic)")
    pos, members = 8, {}  # type: int, dict[str, bytes]
    while pos < len(data) and len(members) < MAX_DEB_MEMBERS:
        head = data[pos : pos + 60]
        if len(head) < 60 or head[58:60] != b"`\n":
            raise DebianError(f"{where}: truncated or malformed ar member header at byte {pos}")
        name = head[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(head[48:58].decode("ascii").strip())
        except ValueError:
            raise DebianError(f"{where}: ar member {name[:16]!r} has no size") from None
        body = data[pos + 60 : pos + 60 + size]
        if len(body) != size:
            raise DebianError(f"{where}: ar member {name[:16]!r} is truncated")
        members[name] = body
        pos += 60 + size + (size & 1)
    if members.get("debian-binary", b"").strip() != b"2.0":
        raise DebianError(f"{where}: not a version 2.0 .deb (debian-binary)")
    ctl = next((n for n in ("control.tar.xz", "control.tar.gz", "control.tar") if n in members), None)
    if ctl is None:
        other = ", ".join(sorted(n for n in members if n.startswith("control")))[:80] or "none"
        raise DebianError(f"{where}: no control.tar[.xz|.gz] member (has {other})")
    raw = decompress(members[ctl], ctl, where, MAX_CONTROL_BYTES)
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as t:
            m = next((m for m in t.getmembers() if m.name in ("./control", "control")), None)
            if m is None or not m.isreg() or m.size > MAX_FIELD_BYTES:
                raise DebianError(f"{where}: {ctl} holds no regular ./control file")
            text = t.extractfile(m).read().decode("utf-8")
    except (tarfile.TarError, UnicodeDecodeError, EOFError, OSError) as e:
        raise DebianError(f"{where}: {ctl}: {e}") from None
    return text
