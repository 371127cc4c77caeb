"""Typed pins from a schema-valid `upstreams` mapping (lock.model.load's second half): each `kind:` into its
lock.pins dataclass, with the checks a JSON schema cannot state.

Invariants:
- every refusal is a LockError naming `FILE:LINE: field` of the value at fault (the stack-relative lines a caller
  passes in `lines`), never a traceback;
- a submodule path, a URL (gitcmd.url_problem), a patch file (path under patches/, sha256 of its bytes), a
  cherry-pick (not the rev itself, not picked twice), a wheel filename (bare, of the pinned distribution and
  version when `strict`), a deb pool filename and architecture are checked before a pin is returned;
- across pins: `installed-on` names another wheelset of the same target, and no set re-pins a distribution or
  adds a second CUDA build of a native library that a set below it pins.
"""

from __future__ import annotations

from pathlib import Path

from packaging.utils import parse_wheel_filename

from ..errors import LockError
from ..gitcmd import url_problem
from ..yamlsrc import dotted as _dotted, line_of as _line
from .pins import (
    DebFile,
    DebsPin,
    GitPin,
    ImagePin,
    PatchEntry,
    PatchFileError,
    Policy,
    Submodule,
    WheelFile,
    WheelPin,
    WheelsetFile,
    WheelsetPin,
    canonical_name,
    library_family,
    patch_path,
    read_patch_file,
    submodule_path_problem,
    wheel_filename_problem,
)


def type_pins(ups: dict, path: Path, root: Path, lines: dict, others: dict | None = None, strict: bool = True) -> dict:
    """Typed pins of a schema-valid `upstreams` mapping (`others`: typed pins it may refer to by `installed-on`);
    LockError naming FILE:LINE."""
    upstreams: dict[str, GitPin | WheelPin | WheelsetPin | ImagePin | DebsPin] = {}
    for name, u in ups.items():
        if u["kind"] == "git":
            upstreams[name] = _git_pin(name, u, path, root, lines)
        elif u["kind"] == "wheelset":
            _check_wheel_filenames(name, u, path, lines, strict)
            upstreams[name] = _wheelset_pin(name, u, path, lines, strict)
        elif u["kind"] == "debs":
            upstreams[name] = _debs_pin(name, u, path, lines)
        elif u["kind"] == "image":
            upstreams[name] = ImagePin(
                name=name, repo=u["repo"], tag=str(u["tag"]), digest=u.get("digest"), id=u.get("id")
            )
        else:
            _check_wheel_filenames(name, u, path, lines, strict)
            upstreams[name] = WheelPin(
                name=u["name"],
                version=str(u["version"]),
                index=u.get("index"),
                files=tuple(WheelFile(f["filename"], f["sha256"]) for f in u.get("files", ())),
                python_version=u.get("python-version"),
                platforms=tuple(u.get("platforms", ())),
                unresolved=u.get("unresolved"),
            )
    for name, pin in upstreams.items():
        if isinstance(pin, WheelsetPin) and pin.installed_on is not None:
            base = upstreams.get(pin.installed_on, (others or {}).get(pin.installed_on))
            if not isinstance(base, WheelsetPin) or pin.installed_on == name:
                at = ("upstreams", name, "installed-on")
                raise LockError(
                    str(path), _line(lines, at), _dotted(at), f"{pin.installed_on!r} is not another wheelset pin"
                )
            if (base.python_version, base.platform_tags) != (pin.python_version, pin.platform_tags):
                at = ("upstreams", name, "python-version")
                raise LockError(
                    str(path),
                    _line(lines, at),
                    _dotted(at),
                    f"differs from the target of {pin.installed_on!r} (python-version and platform-tags must match)",
                )
    for name, pin in upstreams.items():
        if isinstance(pin, WheelsetPin):
            _check_skew(name, pin, {**(others or {}), **upstreams}, path, lines)
    return upstreams


def _check_skew(name: str, pin: WheelsetPin, pins: dict, path: Path, lines: dict) -> None:
    """A wheelset's files against the sets it is installed on (`installed-on`, its whole chain): none re-pins a
    distribution a base pins at another version (installed on top with --no-deps, it would replace the base's torch),
    and none adds a second family of a native library (another CUDA build: nvidia-nccl-cu12 next to the base's cu13
    NCCL, a second CUDA runtime), nor does one set hold two of one family. LockError at the file's line."""
    below: list[tuple[str, WheelsetFile]] = []
    seen, cur = {name}, pin
    while cur.installed_on and cur.installed_on not in seen and isinstance(pins.get(cur.installed_on), WheelsetPin):
        seen.add(cur.installed_on)
        cur = pins[cur.installed_on]
        below += [(cur.name, f) for f in cur.files]
    by_name = {f.name: (b, f) for b, f in below}
    for i, f in enumerate(pin.files):
        if f.name in by_name and by_name[f.name][1].version != f.version:
            b, g = by_name[f.name]
            at = ("upstreams", name, "files", i, "version")
            raise LockError(
                str(path),
                _line(lines, at),
                _dotted(at),
                f"{f.name}=={f.version} re-pins {g.name}=={g.version} of {b} (installed-on): installed on top of it "
                f"this set would replace what {b} pins; keep the base's version (resolve again: `reprostack lock "
                f"wheels {name}`) or move the base",
            )
    families: dict[str, list[tuple[str, WheelsetFile]]] = {}  # family -> its files, bases first (one pass: linear)
    for b, g in [*below, *((name, g) for g in pin.files)]:
        families.setdefault(library_family(g.name), []).append((b, g))
    for i, f in enumerate(pin.files):
        fam = library_family(f.name)
        other = next(((b, g) for b, g in families[fam] if g.name != f.name and g is not f), None)
        if other is not None:
            b, g = other
            at = ("upstreams", name, "files", i, "name")
            where = "this set" if b == name else f"{b} (installed-on)"
            raise LockError(
                str(path),
                _line(lines, at),
                _dotted(at),
                f"{f.name}=={f.version} adds a second {fam} next to {g.name}=={g.version} of {where}: two CUDA builds "
                f"of one native library end in one process (a second NCCL or CUDA runtime); pin the base's "
                f"build only",
            )


def _check_wheel_filenames(name: str, u: dict, path: Path, lines: dict, strict: bool = True) -> None:
    """Each file is a bare wheel filename; `strict` (every load but `lock wheels`' own, which refills them): of the
    distribution and version the pin says (a wheel pin's `name`/`version`, a wheelset file's own fields), so a
    `version:` moved by hand (a bump's tied wheel) without `lock wheels` never passes with the old release's files."""
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    for i, f in enumerate(u.get("files", ())):
        at = ("upstreams", name, "files", i, "filename")
        problem = wheel_filename_problem(f["filename"])
        if problem:
            raise LockError(str(path), _line(lines, at), _dotted(at), problem)
        if not strict:
            continue
        dist, version = (u["name"], u["version"]) if u.get("kind") == "wheel" else (f["name"], f["version"])
        got_name, got_version, _, _ = parse_wheel_filename(f["filename"])
        try:
            same = canonicalize_name(got_name) == canonicalize_name(str(dist)) and got_version == Version(str(version))
        except InvalidVersion:
            same = False
        if not same:
            raise LockError(
                str(path),
                _line(lines, at),
                _dotted(at),
                f"{f['filename']} is {got_name} {got_version}, the pin says {dist} {version}: run `reprostack lock "
                f"wheels {name}` (it resolves the files of the pinned version)",
            )


def _git_pin(name: str, u: dict, path: Path, root: Path, lines: dict) -> GitPin:
    for sp in u.get("submodules") or {}:
        problem = submodule_path_problem(sp)
        if problem:
            at: tuple = ("upstreams", name, "submodules", sp)
            raise LockError(str(path), _line(lines, at), _dotted(at), problem)
    urls = [
        (("upstreams", name, "url"), u["url"]),
        *((("upstreams", name, "submodules", sp, "url"), s["url"]) for sp, s in (u.get("submodules") or {}).items()),
    ]
    for at, url in urls:  # a URL git could read as an option or a transport helper never reaches git
        why = url_problem(url)
        if why:
            raise LockError(str(path), _line(lines, at), _dotted(at), f"{url!r} {why}")
    subs = tuple(
        Submodule(path=sp, url=s["url"], rev=s["rev"], tree=s.get("tree"), fetch_refs=tuple(s.get("fetch-refs", ())))
        for sp, s in (u.get("submodules") or {}).items()
    )
    patches: list[PatchEntry] = []
    for i, p in enumerate(u.get("patches") or (), start=1):
        kind = next(k for k in ("cherry-pick", "mbox", "diff") if k in p)
        at = ("upstreams", name, "patches", i - 1)
        if kind == "cherry-pick" and "sha256" in p:
            raise LockError(
                str(path),
                _line(lines, at + ("sha256",)),
                _dotted(at + ("sha256",)),
                "only a patch file (mbox/diff) has a sha256; a cherry-pick is named by its commit id",
            )
        if kind == "cherry-pick":
            _check_pick(name, p[kind], u["rev"], [e for e in patches if e.kind == "cherry-pick"], at, path, lines)
        sha_at = at + ("sha256",) if "sha256" in p else at
        entry = PatchEntry(
            kind=kind,
            value=p[kind],
            upstream_status=p["upstream-status"],
            ref=p.get("ref"),
            description=p.get("description"),
            tree=p.get("tree"),
            index=i,
            sha256=p.get("sha256"),
            where=f"{path}:{_line(lines, sha_at)}",
        )
        if kind != "cherry-pick":
            try:
                patch_path(root, p[kind])
            except PatchFileError as e:
                raise LockError(str(path), _line(lines, at + (kind,)), _dotted(at + (kind,)), str(e)) from None
            if not (root / p[kind]).is_file():
                raise LockError(
                    str(path),
                    _line(lines, at + (kind,)),
                    _dotted(at + (kind,)),
                    f"patch file {p[kind]} not found under {root}",
                )
            try:
                read_patch_file(root, entry)
            except PatchFileError as e:
                raise LockError(str(path), _line(lines, sha_at), _dotted(sha_at), str(e)) from None
        patches.append(entry)
    if patches and patches[-1].tree and patches[-1].tree != u["patched-tree"]:
        at = ("upstreams", name, "patched-tree")
        raise LockError(
            str(path), _line(lines, at), _dotted(at), f"differs from the last series entry's tree {patches[-1].tree}"
        )
    return GitPin(
        name=name,
        url=u["url"],
        rev=u["rev"],
        tree=u["tree"],
        original=u.get("original"),
        fetch_refs=tuple(u.get("fetch-refs", ())),
        submodules=subs,
        patches=tuple(patches),
        patched_tree=u.get("patched-tree"),
        policy=Policy(**u["policy"]) if "policy" in u else None,
    )


def _check_pick(name: str, value: str, rev: str, earlier: list, at: tuple, path: Path, lines: dict) -> None:
    """A cherry-pick of the pinned rev itself (empty: the base holds it) or of a commit an earlier entry picks is
    refused naming the pin and the entry (git's own words were `multiple updates for ref`, naming neither)."""
    where = (str(path), _line(lines, at + ("cherry-pick",)), _dotted(at + ("cherry-pick",)))
    if value.lower() == str(rev).lower():
        raise LockError(
            *where,
            f"{value} is the pinned rev of {name} itself: the base already holds it, so this cherry-pick would be empty; "
            f"drop the entry, or pin `rev` at its parent to apply it as a patch",
        )
    for e in earlier:
        if e.value.lower() == value.lower():
            raise LockError(*where, f"{value} is also picked by entry {e.label} of {name}: a commit is picked once")


def _debs_pin(name: str, u: dict, path: Path, lines: dict) -> DebsPin:
    files = tuple(
        DebFile(f["name"], str(f["version"]), f["arch"], f["filename"], int(f["size"]), f["sha256"])
        for f in u.get("files", ())
    )
    seen: dict[str, int] = {}
    for i, f in enumerate(files):
        at = ("upstreams", name, "files", i)
        if f.name in seen:
            raise LockError(
                str(path),
                _line(lines, at + ("name",)),
                _dotted(at + ("name",)),
                f"{f.name} is pinned twice (also files[{seen[f.name]}]): a debs pin holds one version of a package",
            )
        seen[f.name] = i
        # the pool filename says which package, version and arch it is (the version without its epoch)
        want = f"{f.name}_{f.version.split(':', 1)[-1]}_{f.arch}.deb"
        if f.basename != want or ".." in f.filename.split("/"):
            raise LockError(
                str(path),
                _line(lines, at + ("filename",)),
                _dotted(at + ("filename",)),
                f"{f.filename!r} is not the pool file of {f.name} {f.version} ({f.arch}): its name would be {want}",
            )
        if f.arch not in (u["architecture"], "all"):
            raise LockError(
                str(path),
                _line(lines, at + ("arch",)),
                _dotted(at + ("arch",)),
                f"{f.arch!r}: the pin is for {u['architecture']} (and `all`)",
            )
    return DebsPin(
        name=name,
        archive=u["archive"].rstrip("/"),
        suite=u["suite"],
        component=u["component"],
        architecture=u["architecture"],
        keyring=u["keyring"],
        signed_by=tuple(u["signed-by"]),
        variant=u["variant"],
        include=tuple(u.get("include", ())),
        files=files,
        unresolved=u.get("unresolved"),
    )


def _wheelset_pin(name: str, u: dict, path: Path, lines: dict, strict: bool = True) -> WheelsetPin:
    """The typed pin; LockError at the line of a distribution pinned twice and, when `strict` (every load but `lock
    wheels`' own, which refills `files` from the requirements), of a requirement or override `files` disagrees with:
    a requirement edited by hand is refilled by `lock wheels PIN`, never refused by the load that command needs."""
    files = tuple(WheelsetFile(f["name"], str(f["version"]), f["filename"], f["sha256"]) for f in u.get("files", ()))
    seen: dict[str, int] = {}
    for i, f in enumerate(files):
        if f.name in seen:
            at: tuple = ("upstreams", name, "files", i, "name")
            raise LockError(
                str(path),
                _line(lines, at),
                _dotted(at),
                f"{f.name} is pinned twice (also files[{seen[f.name]}]): a wheelset has one wheel per distribution",
            )
        seen[f.name] = i
    by_name = {f.name: f for f in files}  # one lookup per requirement (a wheelset pins ~200 of each)
    for key in ("requirements", "overrides"):
        for i, req in enumerate(u.get(key, ())):
            dist, version = req.split("==", 1)
            have = by_name.get(canonical_name(dist))
            if strict and files and (have is None or have.version != version):
                at = ("upstreams", name, key, i)
                got = f"{have.name}=={have.version}" if have else "nothing"
                raise LockError(
                    str(path),
                    _line(lines, at),
                    _dotted(at),
                    f"{req} but `files` pins {got} (run `reprostack lock wheels {name}`)",
                )
    return WheelsetPin(
        name=name,
        requirements=tuple(u["requirements"]),
        python_version=str(u["python-version"]),
        platform_tags=tuple(u["platform-tags"]),
        files=files,
        overrides=tuple(u.get("overrides", ())),
        index=u.get("index"),
        installed_on=u.get("installed-on"),
        unresolved=u.get("unresolved"),
    )
