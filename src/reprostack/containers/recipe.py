"""Image recipes: `containers/<image>/image.yaml` + `containers/<image>/Dockerfile` (a template).

image.yaml (schema: schemas/container.schema.json; errors name `FILE:LINE: field`):

    description: what the image is for
    parent: substrate                  # another recipe, built first; or, exactly one of the two:
    base: nvcr.io/nvidia/cuda:13.0.0-devel-ubuntu22.04@sha256:<64 hex>   # pinned registry image
    # base: local:reprostack-test/base:1   # an image made on this machine (never pulled)
    # base: lock:cuda-13-devel             # an image pin of upstreams.lock (its repo:tag@digest)
    unresolved: why                    # an input not pinned yet: `build` stops naming this line, never builds it
    source: deepep                     # the pin this image builds: OCI source/revision labels
    args: {NCCL_REV: "{{ upstreams.nccl.rev }}"}       # build args, rendered from the lock
    sources: [{upstream: nccl, dest: src/nccl}]        # patched trees into the context (no .git)
    wheels: [{pin: substrate-wheels, dest: wheels}]    # pinned wheels + requirements.txt (--hash) + pins.json
    files: [{src: check.sh, dest: files/check.sh}]     # files of this folder into the context; `../deepep/x.py`:
                                                       # a sibling recipe's file, shared instead of copied
    jit: {upstream: deepep, arch: "90", dest: root/jit/opt/reprostack/jit-build}   # DeepEP's recorded JIT
                                                       # manifests for this arch + the reprostack modules that
                                                       # compile them (kernels.jitimage), into the context
    labels: {org.opencontainers.image.title: DeepEP}   # extra labels (templates too)

Invariants:
- a registry base is pinned by digest; a tag alone is mutable and is an error, unless an override
  (`REPROSTACK_BASE_OVERRIDE` / `base_overrides`) substitutes a local image for it (tests, CPU machines);
- `recipe_sha256` covers every file of the recipe folder and every sibling recipe's file it names in `files`, so
  any edit there changes the image key; a `files` entry is a regular file of this folder or `../<recipe>/<file>`
  of another recipe folder, never a path anywhere else.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ..yamlsrc import line_of, validate
from ..yamlsrc import load as load_yaml
from .errors import RecipeError
from .. import schemas

CONTAINERS_DIR = "containers"
OVERRIDE_ENV = "REPROSTACK_BASE_OVERRIDE"
LOCAL_PREFIX = "local:"
LOCK_PREFIX = "lock:"
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class BaseRef:
    """A FROM image named by a recipe. kind: "registry" (repo[:tag][@digest]), "local" (an image of this engine) or
    "lock" (`lock:PIN`, an image pin of upstreams.lock; `resolve_lock_bases` turns it into the pinned registry ref)."""

    text: str
    kind: str
    name: str  # repo[:tag] (registry) or the local image reference
    digest: str | None  # sha256:<64 hex> when pinned
    pin: str | None = None  # the lock's image pin it came from (`base: lock:PIN`)
    image_id: str | None = None  # that pin's `id` (what a loaded copy must be), when pinned

    @property
    def pinned(self) -> bool:
        return self.kind == "local" or self.digest is not None


def parse_base(text: str) -> BaseRef:
    """Split a recipe's `base:` into its parts. Raises ValueError for a malformed digest."""
    if text.startswith(LOCAL_PREFIX):
        return BaseRef(text, "local", text[len(LOCAL_PREFIX) :], None)
    if text.startswith(LOCK_PREFIX):
        return BaseRef(text, "lock", text[len(LOCK_PREFIX) :], None)
    name, _, digest = text.partition("@")
    if digest and not _DIGEST.match(digest):
        raise ValueError(f"{digest!r} is not a digest (sha256:<64 lowercase hex>)")
    return BaseRef(text, "registry", name, digest or None)


@dataclass(frozen=True)
class SourceSpec:
    upstream: str
    dest: str
    line: int | None


@dataclass(frozen=True)
class WheelsSpec:
    pin: str
    dest: str
    line: int | None


@dataclass(frozen=True)
class FileSpec:
    src: str
    dest: str
    executable: bool
    line: int | None


@dataclass(frozen=True)
class JitSpec:
    upstream: str  # the git pin whose patched tree the manifests must be recorded for (deepep)
    arch: str  # compute capability ("90"): a manifest's DeepEP arch ("90a") must be this one
    dest: str
    line: int | None


@dataclass(frozen=True)
class Recipe:
    """One image recipe, loaded and validated (nothing about the lock or the engine is checked here)."""

    name: str
    dir: Path
    path: Path  # image.yaml
    dockerfile: Path
    dockerfile_text: str
    parent: str | None
    base: BaseRef | None
    source: str | None
    args: Mapping[str, str]
    sources: tuple[SourceSpec, ...]
    files: tuple[FileSpec, ...]
    labels: Mapping[str, str]
    wheels: tuple[WheelsSpec, ...] = ()
    description: str = ""
    unresolved: str | None = None  # why this image cannot be built yet (`build` stops naming it)
    jit: JitSpec | None = None  # DeepEP's JIT kernels compiled into the image (containers.engine, kernels.jitimage)
    recipe_sha256: str = ""
    lines: dict = field(default_factory=dict, repr=False, compare=False)

    def line(self, *path) -> int | None:
        return line_of(self.lines, tuple(path))


def _schema() -> dict:
    return schemas.load("container")


def recipe_names(root: Path) -> list[str]:
    """Names of every recipe under `<root>/containers/` (folders holding an image.yaml), sorted."""
    d = Path(root) / CONTAINERS_DIR
    return sorted(p.parent.name for p in d.glob("*/image.yaml")) if d.is_dir() else []


def load_recipe(root: Path, name: str) -> Recipe:
    """Read and validate `<root>/containers/<name>/`. Raises RecipeError naming file, line and field."""
    rdir = Path(root) / CONTAINERS_DIR / name
    path = rdir / "image.yaml"
    if not path.is_file():
        known = ", ".join(recipe_names(root)) or "none"
        raise RecipeError(path, None, "(file)", f"no recipe {name!r} (known: {known})")
    data, lines = load_yaml(path, RecipeError)
    if not isinstance(data, dict):
        raise RecipeError(path, 1, "(root)", "a recipe is a mapping")
    validate(data, lines, _schema(), str(path), RecipeError)
    if ("parent" in data) == ("base" in data):
        raise RecipeError(
            path,
            line_of(lines, ("parent",)) or line_of(lines, ("base",)),
            "parent/base",
            "give exactly one of `parent` (another recipe) or `base` (a pinned image)",
        )
    dockerfile = rdir / "Dockerfile"
    if not dockerfile.is_file():
        raise RecipeError(dockerfile, None, "(file)", "every recipe has a Dockerfile (template) next to image.yaml")
    base = None
    if "base" in data:
        try:
            base = parse_base(data["base"])
        except ValueError as e:
            raise RecipeError(path, line_of(lines, ("base",)), "base", str(e)) from None
    if data.get("parent") == name:
        raise RecipeError(path, line_of(lines, ("parent",)), "parent", "an image cannot be its own parent")

    sources = tuple(
        SourceSpec(s["upstream"], s.get("dest", f"src/{s['upstream']}"), line_of(lines, ("sources", i)))
        for i, s in enumerate(data.get("sources") or ())
    )
    wheels = tuple(
        WheelsSpec(w["pin"], w.get("dest", f"wheels/{w['pin']}"), line_of(lines, ("wheels", i)))
        for i, w in enumerate(data.get("wheels") or ())
    )
    files = _file_specs(rdir, path, data.get("files") or (), lines)
    return Recipe(
        name=name,
        dir=rdir,
        path=path,
        dockerfile=dockerfile,
        dockerfile_text=dockerfile.read_bytes().decode("utf-8"),
        parent=data.get("parent"),
        base=base,
        source=data.get("source"),
        args=dict(data.get("args") or {}),
        sources=sources,
        files=files,
        labels=dict(data.get("labels") or {}),
        wheels=wheels,
        description=data.get("description", ""),
        unresolved=data.get("unresolved"),
        jit=(
            JitSpec(data["jit"]["upstream"], data["jit"]["arch"], data["jit"]["dest"], line_of(lines, ("jit",)))
            if "jit" in data
            else None
        ),
        recipe_sha256=recipe_digest(rdir, [f.src for f in files if f.src.startswith("../")]),
        lines=lines,
    )


def _file_specs(rdir: Path, path: Path, entries, lines: dict) -> tuple[FileSpec, ...]:
    """The recipe's `files:`: each `src` a regular file (no symlink) of `rdir`, or `../<recipe>/<file>` of another
    recipe folder (one holding an image.yaml, not through a symlink); RecipeError at the entry's line."""
    files = []
    for i, f in enumerate(entries):
        src = rdir / f["src"]
        parts = Path(f["src"]).parts
        shared = (
            len(parts) == 3 and parts[0] == ".." and parts[1] not in ("", ".", "..") and parts[2] not in ("", ".", "..")
        )
        if (
            (".." in parts and not shared)
            or Path(f["src"]).is_absolute()
            or not src.is_file()
            or src.is_symlink()
            or (shared and (src.parent.is_symlink() or not (src.parent / "image.yaml").is_file()))
        ):
            raise RecipeError(
                path,
                line_of(lines, ("files", i, "src")),
                f"files[{i}].src",
                f"{f['src']} is not a regular file of {rdir} or ../<recipe>/<file> of another recipe",
            )
        files.append(
            FileSpec(
                f["src"],
                f.get("dest", f"files/{f['src']}"),
                bool(f.get("executable", False)),
                line_of(lines, ("files", i)),
            )
        )
    return tuple(files)


def recipe_digest(rdir: Path, shared: list[str] | tuple = ()) -> str:
    """sha256 over (relative path, mode class, sha256 of bytes) of every file in the recipe folder, sorted, then of
    each sibling recipe's file it shares (`../<recipe>/<file>`)."""
    entries = []
    for p in sorted(rdir.rglob("*")):
        if "__pycache__" in p.parts or p.is_dir():
            continue
        rel = p.relative_to(rdir).as_posix()
        if p.is_symlink():
            entries.append([rel, "symlink", os.readlink(p)])
        else:
            entries.append([rel, "x" if os.access(p, os.X_OK) else "f", hashlib.sha256(p.read_bytes()).hexdigest()])
    for rel in sorted(set(shared)):
        p = rdir / rel
        entries.append([rel, "x" if os.access(p, os.X_OK) else "f", hashlib.sha256(p.read_bytes()).hexdigest()])
    return hashlib.sha256(json.dumps(entries, separators=(",", ":")).encode()).hexdigest()


def load_all(root: Path, names: list[str] | None = None) -> dict[str, Recipe]:
    """Load `names` (default: every recipe) and all their ancestors. Unknown parent -> RecipeError."""
    todo = list(names) if names else recipe_names(root)
    out: dict[str, Recipe] = {}
    while todo:
        n = todo.pop(0)
        if n in out:
            continue
        r = load_recipe(root, n)
        out[n] = r
        if r.parent:
            if not (Path(root) / CONTAINERS_DIR / r.parent / "image.yaml").is_file():
                raise RecipeError(
                    r.path,
                    r.line("parent"),
                    "parent",
                    f"no recipe {r.parent!r} (known: {', '.join(recipe_names(root))})",
                )
            todo.append(r.parent)
    return out


def build_order(recipes: Mapping[str, Recipe], names: list[str]) -> list[str]:
    """`names` and their ancestors, every parent before its children (ties by name). Cycles -> RecipeError."""
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(n: str, chain: list[str]) -> None:
        if state.get(n) == "done":
            return
        if state.get(n) == "active":
            cyc = chain[chain.index(n) :] + [n]
            r = recipes[n]
            raise RecipeError(r.path, r.line("parent"), "parent", f"parent cycle: {' -> '.join(cyc)}")
        state[n] = "active"
        p = recipes[n].parent
        if p:
            visit(p, chain + [n])
        state[n] = "done"
        order.append(n)

    for n in sorted(names):
        visit(n, [])
    return order


def resolve_lock_bases(recipes: Mapping[str, Recipe], lock) -> dict[str, Recipe]:
    """`recipes` with each `base: lock:PIN` replaced by the lock's image pin as `repo:tag@digest` (a registry base,
    so overrides on `repo:tag` still apply). Raises RecipeError naming the recipe's `base` line when PIN is not
    an image pin of the lock or has no digest."""
    from dataclasses import replace

    from ..lock import ImagePin

    out = {}
    for n, r in recipes.items():
        b = r.base
        if b is not None and b.kind == "lock":
            pin = lock.upstreams.get(b.name)
            if not isinstance(pin, ImagePin):
                known = ", ".join(sorted(k for k, p in lock.upstreams.items() if isinstance(p, ImagePin))) or "none"
                raise RecipeError(
                    r.path,
                    r.line("base"),
                    "base",
                    f"{b.text!r}: {lock.path} has no image pin {b.name!r} (image pins: {known})",
                )
            if not pin.digest:
                raise RecipeError(
                    r.path,
                    r.line("base"),
                    "base",
                    f"{b.text!r}: image pin {b.name!r} has no digest yet (`nox -s lock -- images "
                    f"{b.name}` resolves it from the registry)",
                )
            r = replace(r, base=BaseRef(pin.ref, "registry", f"{pin.repo}:{pin.tag}", pin.digest, b.name, pin.id))
        out[n] = r
    return out


def parse_overrides(text: str | None) -> dict[str, str]:
    """`REF=IMAGE[,REF=IMAGE...]` -> {REF: IMAGE}. REF is a recipe's base with or without its digest."""
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        ref, sep, image = part.partition("=")
        if not sep or not ref.strip() or not image.strip():
            raise RecipeError(f"${OVERRIDE_ENV}", None, part, "expected RECIPE_BASE=LOCAL_IMAGE")
        out[ref.strip()] = image.strip()
    return out


def overrides_from_env() -> dict[str, str]:
    return parse_overrides(os.environ.get(OVERRIDE_ENV))


def override_for(base: BaseRef, overrides: Mapping[str, str]) -> str | None:
    """The local image that replaces `base`, matched on its full text or on repo:tag without the digest."""
    for key in (base.text, base.name, f"{LOCAL_PREFIX}{base.name}" if base.kind == "local" else None):
        if key and key in overrides:
            return overrides[key]
    return None


def missing_digest(r: Recipe) -> RecipeError:
    """The error for a registry base given by tag only (no digest), naming the recipe line."""
    b = r.base
    return RecipeError(
        r.path,
        r.line("base"),
        "base",
        f"{b.text!r} has no digest: a tag is mutable, so it is not a pin. Write it as {b.name}@sha256:<digest> "
        f"(the registry's digest; `nox -s lock -- images` resolves an image pin of the lock, then `base: lock:PIN`), or substitute a local image: "
        f"{OVERRIDE_ENV}='{b.name}=<local image>'",
    )


def check_bases(recipes: Mapping[str, Recipe], overrides: Mapping[str, str]) -> None:
    """Every registry base is pinned by digest or overridden; raises RecipeError for the first that is not
    (before any engine work, so the error comes first whatever else is wrong)."""
    for name in sorted(recipes):
        r = recipes[name]
        if (
            r.base is not None
            and r.base.kind == "registry"
            and r.base.digest is None
            and override_for(r.base, overrides) is None
        ):
            raise missing_digest(r)
