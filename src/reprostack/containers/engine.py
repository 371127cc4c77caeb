"""Stage `build` (images): recipes + lock + patched trees -> images on a Docker engine, via the docker SDK.

For each image, parent first (`recipe.build_order`):
1. resolve the FROM image: the parent's image id (built just before), a pinned registry base
   (`repo:tag@sha256:...` or `lock:PIN`, pulled by digest unless present or --offline), a `local:` image, or a
   local image substituted by an override; a registry base without a digest is an error naming the recipe.
   A registry base is used only when its `RepoDigests` name `repo@digest` (and its id is the lock's `id`, when
   pinned); offline, an image under the pin's `repo:tag` without that digest (a `docker load`ed copy) only when
   the lock pins its `id` and it matches; anything else is an error naming the pin's lock line
   (containers.baseimage); before any engine work, containers.preflight: recipes load, bases are pinned, no
   `unresolved` recipe or wheel pin, every wheel in the cache with the lock's sha256;
2. render the Dockerfile and build args from the lock (render.py) and check its rules;
3. write the context (context.py): the rendered Dockerfile, the recipe's `files:`, the patched trees
   of `sources:` (sources.prepare: fetched, patched and verified; tracked files only, no .git);
4. key = sha256 of (recipe folder digest, rendered Dockerfile, context tar sha256, FROM identity,
   build args, content labels); tag = `<namespace>/<image>:<key[:16]>`;
5. an image with that tag and key label exists -> reused, no build call; else build with
   network_mode="none", pull=False, the provenance labels, the full log in `<out>/logs/`; the operator sees one
   ui.step per built image (`build image NAME`: its ETA, the log's path, the engine's newest line summarised
   as the live line, every line with -v; `show_progress=False`: nothing).

SOURCE_DATE_EPOCH (tar mtimes, `org.opencontainers.image.created`): $SOURCE_DATE_EPOCH or the option
when set; else per image the newest committer time of the upstream revs it copies, and at least its
parent's; 0 for an image with neither. Deliberately not the lock file's commit time: that would
change every context on every lock commit and rebuild every image for a one-pin change.

Labels that describe the whole lock (`dev.reprostack.lock-sha256`) are not part of the key: an image
whose inputs did not change is reused under a newer lock and keeps the lock it was first built from;
the build summary (`<out>/images.json`) names the current lock and each image id.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from rich.console import Console

from .. import sources as sources_mod
from .. import ui
from ..atomicfile import write_text_atomic
from ..gitcmd import git
from ..fetch.wheels import fetch_wheels
from ..lock import GitPin, Lock, WheelPin, WheelsetPin, canonical_name
from . import render as R
from .context import Context
from .errors import ContainerError, EngineUnavailable, ImageBuildError, RecipeError
from .baseimage import BaseResolver
from .preflight import preflight, verify_wheels as verify_wheels  # verify_wheels: re-exported for cmd.build
from .recipe import Recipe, overrides_from_env

if TYPE_CHECKING:
    from docker import DockerClient

KEY_VERSION = 1
L_KEY = "dev.reprostack.key"
L_IMAGE = "dev.reprostack.image"
L_LOCK = "dev.reprostack.lock-sha256"
L_UPSTREAMS = "dev.reprostack.upstreams"
L_RECIPE = "dev.reprostack.recipe-sha256"
L_OVERRIDE = "dev.reprostack.base-override"
OCI = "org.opencontainers.image."
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
NOT_IN_KEY = (L_LOCK,)
API_LABELS = (L_LOCK, L_KEY)  # set through the build API, not the Dockerfile (not key inputs)


@dataclass(frozen=True)
class BuildOptions:
    """What `build_images` needs besides the image names.

    fetch: how to get the patched trees (sources.FetchOptions); required when a recipe has `sources:`.
    namespace: repository prefix of the tags (tests use their own).
    base_overrides: {recipe base (with or without digest): local image}; None reads $REPROSTACK_BASE_OVERRIDE.
    source_date_epoch: None reads $SOURCE_DATE_EPOCH, else the per-image default (module doc).
    """

    root: Path
    lock: Lock
    fetch: sources_mod.FetchOptions | None = None
    out_dir: Path = Path("out/build")
    namespace: str = "reprostack"
    offline: bool = False
    base_overrides: Mapping[str, str] | None = None
    source_date_epoch: int | None = None
    client: DockerClient | None = None
    console: Console | None = None
    show_progress: bool = True
    timeout_s: float = 6 * 3600
    wheelhouses: Sequence[Path] = ()


@dataclass(frozen=True)
class ImageResult:
    """One image of a build: `status` is "built" (a build ran) or "reused" (the tag existed: no build call)."""

    name: str
    tag: str
    image_id: str
    status: str
    seconds: float
    context_bytes: int
    context_sha256: str
    key: str
    from_ref: str
    epoch: int
    log: Path | None
    labels: dict = field(default_factory=dict)

    @property
    def reused(self) -> bool:
        return self.status == "reused"

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["log"] = str(self.log) if self.log else None
        return d


@dataclass
class _Plan:
    recipe: Recipe
    from_ref: str  # what FROM names (an image id)
    from_identity: str  # what the key hashes (parent id, pinned base ref, local image id)
    base_name: str  # for org.opencontainers.image.base.name
    epoch: int
    dockerfile: str
    instructions: list
    args: dict
    labels: dict
    context: Context
    upstreams: dict
    label_block: str = ""


def connect(timeout_s: float = 6 * 3600):
    """A docker SDK client for $DOCKER_HOST (or the default socket), checked with a ping."""
    import docker
    import docker.errors

    where = os.environ.get("DOCKER_HOST", "the default socket (unix:///var/run/docker.sock)")
    try:
        client = docker.from_env(timeout=int(timeout_s))
        client.ping()
    except (docker.errors.DockerException, OSError) as e:
        raise EngineUnavailable(
            f"no Docker engine answers at {where}: {e}. Start dockerd (README: Images) and set DOCKER_HOST"
        ) from None
    return client


def image_key(fields: Mapping) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def label_instruction(labels: Mapping[str, str]) -> str:
    """`LABEL "k"="v" ...` (sorted, one instruction) with quotes, backslashes and `$` escaped."""

    def q(x: str) -> str:
        if "\n" in x or "\r" in x:
            raise ContainerError(f"label value {x[:60]!r}... holds a newline")
        return '"' + x.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'

    body = " \\\n      ".join(f"{q(k)}={q(v)}" for k, v in sorted(labels.items()))
    return f"# ---- provenance labels, added by reprostack\nLABEL {body}\n"


def rfc3339(epoch: int) -> str:
    return datetime.fromtimestamp(int(epoch), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _env_epoch(opt: int | None) -> int | None:
    if opt is not None:
        return int(opt)
    v = os.environ.get("SOURCE_DATE_EPOCH")
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ContainerError(f"SOURCE_DATE_EPOCH={v!r} is not an integer (seconds since 1970)") from None


def render_recipe(recipe: Recipe, lock: Lock, *, from_ref: str, epoch: int = 0) -> tuple[str, dict, dict]:
    """Render `recipe`'s Dockerfile, build args and extra labels from `lock` (no engine, no trees).
    Returns (Dockerfile text, args, labels); raises RecipeError naming the file and line."""
    for i, s in enumerate(recipe.sources):
        pin = lock.upstreams.get(s.upstream)
        if not isinstance(pin, GitPin):
            what = "not in the lock" if pin is None else f"a {pin.kind} pin (only git pins have trees)"
            raise RecipeError(recipe.path, s.line, f"sources[{i}].upstream", f"{s.upstream!r} is {what}")
    for i, w in enumerate(recipe.wheels):
        pin = lock.upstreams.get(w.pin)
        if not isinstance(pin, (WheelPin, WheelsetPin)):
            what = "not in the lock" if pin is None else f"a {pin.kind} pin, not a wheel or wheelset"
            if pin is not None and lock.stacks and any(w.pin in st.wheel_of for st in lock.stacks.values()):
                stacks = sorted(n for n, st in lock.stacks.items() if w.pin in st.wheel_of)
                what += (
                    f" in stack {lock.stack} (the stacks that pin it as a wheel: {', '.join(stacks)}; "
                    f"`reprostack --stack {stacks[0]} build {recipe.name}`)"
                )
            raise RecipeError(recipe.path, w.line, f"wheels[{i}].pin", f"{w.pin!r} is {what}")
    if recipe.jit is not None and not isinstance(lock.upstreams.get(recipe.jit.upstream), GitPin):
        raise RecipeError(recipe.path, recipe.jit.line, "jit.upstream", f"{recipe.jit.upstream!r} is not a git pin")
    if recipe.source and recipe.source not in lock.upstreams:
        raise RecipeError(recipe.path, recipe.line("source"), "source", f"{recipe.source!r} is not in the lock")
    values = R.template_values(
        lock,
        image=recipe.name,
        from_ref=from_ref,
        epoch=epoch,
        source_dests={s.upstream: s.dest for s in recipe.sources},
        wheel_dests={w.pin: w.dest for w in recipe.wheels},
    )
    if "kernels." in recipe.dockerfile_text or any("kernels." in v for v in recipe.args.values()):
        values.update(R.kernel_values(recipe.dir.parent.parent))  # the project root of containers/<name>/
    text = R.render(recipe.dockerfile_text, values, recipe.dockerfile)
    R.check_dockerfile(recipe.dockerfile_text, text, recipe.dockerfile)
    args = {
        k: R.render_value(v, values, recipe.path, recipe.line("args", k), f"args.{k}") for k, v in recipe.args.items()
    }
    labels = {
        k: R.render_value(v, values, recipe.path, recipe.line("labels", k), f"labels.{k}")
        for k, v in recipe.labels.items()
    }
    return text, args, labels


def add_jit(ctx: Context, r: Recipe, tree: str, root: Path) -> dict:
    """Put the recipe's `jit:` into the context (kernels.jitimage compiles it in the image): under `dest`, the
    reprostack modules of `jitimage.MODULES` (this checkout's bytes, so the image key follows them and nothing else
    of reprostack), `manifests/<profile>.json` for every recorded manifest of `root`'s kernels/jit/ whose DeepEP tree
    is `tree` (the image's patched tree) and whose arch is the recipe's (`90` -> sm_90a), and `selection.json`
    naming the manifests left out and why. Each manifest is checked (jit.load_manifest) before it goes in: a bad
    one is one line before any engine work. Returns the selection."""
    import reprostack

    from ..kernels import jit, jitimage

    j = r.jit
    pkg = Path(reprostack.__file__).parent
    for mod in jitimage.MODULES:
        ctx.add_file(f"{j.dest}/reprostack/{mod}", pkg / mod, executable=False, origin=f"{r.path}: jit (reprostack)")
    picked, left_out = [], {}
    for p in sorted((Path(root) / "kernels" / "jit").glob("*.json")):
        m = jit.load_manifest(p)
        if m.deepep_tree != tree:
            left_out[m.profile] = f"recorded for deepep tree {m.deepep_tree}, the image's is {tree}"
        elif m.arch[:-1] != j.arch:
            left_out[m.profile] = f"recorded for sm_{m.arch}, the image is for compute capability {j.arch}"
        else:
            ctx.add_file(f"{j.dest}/manifests/{m.profile}.json", p, executable=False, origin=f"{r.path}: jit {p}")
            picked.append(m.profile)
    sel = {"arch": j.arch, "deepep_patched_tree": tree, "picked": picked, "left_out": left_out}
    ctx.add_bytes(
        f"{j.dest}/selection.json",
        (json.dumps(sel, indent=1, sort_keys=True) + "\n").encode(),
        origin=f"{r.path}: jit",
    )
    return sel


class _Builder:
    def __init__(self, opts: BuildOptions):
        self.o = opts
        self.client = opts.client or connect(opts.timeout_s)
        self.overrides = dict(overrides_from_env() if opts.base_overrides is None else opts.base_overrides)
        self.env_epoch = _env_epoch(opts.source_date_epoch)
        self.trees: dict[str, sources_mod.SourceTree] = {}
        self.done: dict[str, ImageResult] = {}
        self.epochs: dict[str, int] = {}
        self.ups: dict[str, dict] = {}
        self.console = opts.console or Console(stderr=True)
        fetch = opts.fetch
        if fetch is not None and opts.offline and not fetch.offline:
            fetch = dataclasses.replace(fetch, offline=True)
        self.fetch = fetch
        self.out = Path(opts.out_dir)
        self.bases = BaseResolver(self.client, opts.lock, self.overrides, opts.offline, self.console)

    # ------------------------------------------------------------------ FROM
    def _from(self, r: Recipe) -> tuple[str, str, str, str | None]:
        """(FROM ref, identity for the key, base name for labels, override note)."""
        if r.parent:
            parent = self.done[r.parent]
            return parent.image_id, parent.image_id, parent.tag, None
        return self.bases.resolve(r)

    # ------------------------------------------------------------------ plan
    def _tree(self, name: str) -> sources_mod.SourceTree:
        if name not in self.trees:
            if self.fetch is None:
                raise ContainerError(f"the recipes need the patched tree of {name!r}: no fetch options given")
            self.trees[name] = sources_mod.prepare(self.o.lock, name, self.fetch, self.o.root)
        return self.trees[name]

    def _epoch(self, r: Recipe) -> int:
        if self.env_epoch is not None:
            return self.env_epoch
        e = self.epochs.get(r.parent, 0) if r.parent else 0
        for s in r.sources:
            t = self._tree(s.upstream)
            try:
                e = max(e, int(git("show", "-s", "--format=%ct", t.pin.rev, cwd=t.path)))
            except Exception:
                pass  # a rev whose commit object is not at hand adds nothing
        return e

    def plan(self, r: Recipe) -> _Plan:
        from_ref, identity, base_name, note = self._from(r)
        epoch = self._epoch(r)
        text, args, extra_labels = render_recipe(r, self.o.lock, from_ref=from_ref, epoch=epoch)
        ctx = Context(epoch)
        ups = dict(self.ups.get(r.parent, {})) if r.parent else {}
        for s in r.sources:
            t = self._tree(s.upstream)
            ctx.add_git_tree(
                s.dest,
                t.path,
                origin=f"{r.path}: sources {s.upstream}",
                pinned_submodules=frozenset(sm.path for sm in t.pin.submodules),
            )
            ups[s.upstream] = {
                "url": t.pin.url,
                "rev": t.pin.rev,
                "tree": t.pin.tree,
                "patched-tree": t.tree,
                "patches": len(t.pin.patches),
                "submodules": {m.path: m.rev for m in t.pin.submodules},
            }
        for w in r.wheels:
            ups[w.pin] = self._add_wheels(ctx, r, w)
        for f in r.files:
            ctx.add_file(f.dest, r.dir / f.src, executable=f.executable or None, origin=f"{r.path}: files {f.src}")
        if r.jit is not None:
            add_jit(ctx, r, self._tree(r.jit.upstream).tree, self.o.root)
        labels = dict(extra_labels)
        labels.update(
            {
                OCI + "created": rfc3339(epoch),
                OCI + "base.name": base_name,
                OCI + "base.digest": identity if identity.startswith("sha256:") else identity.rpartition("@")[2],
                L_IMAGE: r.name,
                L_RECIPE: r.recipe_sha256,
                L_UPSTREAMS: json.dumps(ups, sort_keys=True, separators=(",", ":")),
                L_LOCK: self.o.lock.sha256,
            }
        )
        if r.description:
            labels.setdefault(OCI + "description", " ".join(r.description.split()))
        if r.source:
            pin = self.o.lock.get(r.source)
            labels[OCI + "source"] = getattr(pin, "url", "") or ""
            labels[OCI + "revision"] = getattr(pin, "rev", "") or getattr(pin, "version", "")
        elif not r.parent:
            labels[OCI + "source"] = r.base.name if r.base else ""
            labels[OCI + "revision"] = labels[OCI + "base.digest"]
        if note:
            labels[L_OVERRIDE] = note
        # One LABEL instruction for the labels that follow from the key's inputs (one build step, not one
        # per label as the API's `labels` would take); the lock's sha256 and the key go through the API.
        content = {k: v for k, v in labels.items() if k not in API_LABELS}
        block = label_instruction(content)
        ctx.add_bytes(
            "Dockerfile",
            (text if text.endswith("\n") else text + "\n").encode() + block.encode(),
            origin=str(r.dockerfile),
        )
        return _Plan(r, from_ref, identity, base_name, epoch, text, R.instructions(text), args, labels, ctx, ups, block)

    def _add_wheels(self, ctx: Context, r: Recipe, w) -> dict:
        """Put pin `w.pin`'s verified wheels under `w.dest`, with `requirements.txt` (name==version --hash=sha256,
        for `pip install --no-index --no-deps --require-hashes`) and `pins.json` ({name: version}, overrides
        marked) for the installed-vs-lock check; returns the pin's provenance for the upstreams label."""
        pin = self.o.lock.get(w.pin)
        where = f"{r.path}: wheels {w.pin}"
        wheels = fetch_wheels(
            self.o.lock,
            w.pin,
            cache_root=self.fetch.cache.root if self.fetch else None,
            wheelhouses=self.o.wheelhouses,
            offline=self.o.offline,
        )
        for lw in wheels:
            ctx.add_file(f"{w.dest}/{lw.filename}", lw.path, executable=False, origin=where, sha256=lw.sha256)
        ctx.add_bytes(
            f"{w.dest}/requirements.txt",
            "".join(f"{lw.name}=={lw.version} --hash=sha256:{lw.sha256}\n" for lw in wheels).encode(),
            origin=where,
        )
        overrides = sorted(canonical_name(o.split("==")[0]) for o in getattr(pin, "overrides", ()))
        pins = {  # the set's own identity only: the whole lock's sha256 here would rebuild the image on any lock edit
            "pin": w.pin,
            "packages": {lw.name: lw.version for lw in wheels},
            "overrides": overrides,
        }
        ctx.add_bytes(f"{w.dest}/pins.json", (json.dumps(pins, indent=1, sort_keys=True) + "\n").encode(), origin=where)
        return {
            "kind": pin.kind,
            "wheels": len(wheels),
            "sha256": hashlib.sha256("".join(lw.sha256 for lw in wheels).encode()).hexdigest(),
        }

    # ------------------------------------------------------------------ build
    def image(self, r: Recipe) -> ImageResult:
        import docker.errors

        t0 = time.monotonic()
        p = self.plan(r)
        tmp_dir = self.out / "tmp"
        tmp_dir.mkdir(parents=True, exist_ok=True)
        fd, ctx_path = tempfile.mkstemp(prefix=f"{r.name}-", suffix=".tar", dir=tmp_dir)
        os.close(fd)
        try:
            ctx_sha, ctx_size = p.context.write_tar(Path(ctx_path))
            fields = {
                "v": KEY_VERSION,
                "image": r.name,
                "recipe": r.recipe_sha256,
                "dockerfile": hashlib.sha256(p.dockerfile.encode()).hexdigest(),
                "context": ctx_sha,
                "from": p.from_identity,
                "args": p.args,
                "labels": {k: v for k, v in p.labels.items() if k not in NOT_IN_KEY},
            }
            key = image_key(fields)
            tag = f"{self.o.namespace}/{r.name}:{key[:16]}"

            def result(img, status: str, log: Path | None) -> ImageResult:
                self.epochs[r.name], self.ups[r.name] = p.epoch, p.upstreams
                return ImageResult(
                    r.name,
                    tag,
                    img.id,
                    status,
                    time.monotonic() - t0,
                    ctx_size,
                    ctx_sha,
                    key,
                    p.from_ref,
                    p.epoch,
                    log,
                    dict(img.labels or {}),
                )

            api_labels = {k: v for k, v in p.labels.items() if k in API_LABELS}
            api_labels[L_KEY] = key
            try:
                img = self.client.images.get(tag)
                if (img.labels or {}).get(L_KEY) == key:
                    return result(img, "reused", None)
            except docker.errors.ImageNotFound:
                pass
            log = self.out / "logs" / f"{r.name}-{key[:16]}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            # the operator's view (show_progress): `build image NAME: started, ETA ...; full log LOG`, the engine's
            # newest line summarised as the live line (-v: every line), `build image NAME: ok in ...`
            step = ui.step(f"build image {r.name}", log=log) if self.o.show_progress else contextlib.nullcontext()
            with step:
                image_id = self._run_build(r, p, Path(ctx_path), ctx_size, tag, api_labels, log, fields)
        finally:
            Path(ctx_path).unlink(missing_ok=True)
        return result(self.client.images.get(image_id), "built", log)

    def _run_build(
        self, r: Recipe, p: _Plan, ctx_path: Path, ctx_size: int, tag: str, labels: dict, log: Path, fields: dict
    ) -> str:
        import docker.errors

        step_n, step_text = 0, "(before the first step)"
        image_id = None
        line_buf = ""
        with open(log, "w", encoding="utf-8") as lf, open(ctx_path, "rb") as ctx:
            lf.write(
                f"# reprostack build of image {r.name} -> {tag}\n# recipe {r.path}\n"
                f"# context {ctx_size} bytes, SOURCE_DATE_EPOCH {p.epoch}\n"
                f"# key inputs {json.dumps(fields, sort_keys=True)}\n# ---- Dockerfile (rendered)\n"
            )
            lf.write("".join(f"#  {i:3d}  {l}\n" for i, l in enumerate(p.dockerfile.splitlines(), start=1)))
            lf.write("".join(f"#       {l}\n" for l in p.label_block.splitlines()))
            lf.write("# ---- engine output\n")
            lf.flush()

            def fail(detail: str):
                lf.flush()
                tail = _ANSI.sub("", "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
                raise ImageBuildError(r.name, self._step_name(r, p, step_n, step_text), log, detail.strip(), tail=tail)

            try:
                stream = self.client.api.build(
                    fileobj=ctx,
                    custom_context=True,
                    tag=tag,
                    buildargs=p.args,
                    labels=labels,
                    network_mode="none",
                    pull=False,
                    rm=True,
                    forcerm=True,
                    decode=True,
                    dockerfile="Dockerfile",
                )
                for ev in stream:
                    if "stream" in ev:
                        s = ev["stream"]
                        lf.write(s)
                        line_buf += s
                        while "\n" in line_buf:
                            line, line_buf = line_buf.split("\n", 1)
                            if line.startswith("Step ") and " : " in line:
                                head, step_text = line.split(" : ", 1)
                                try:
                                    step_n = int(head.split()[1].split("/")[0])
                                except (IndexError, ValueError):
                                    pass
                    elif "aux" in ev and isinstance(ev["aux"], dict) and "ID" in ev["aux"]:
                        image_id = ev["aux"]["ID"]
                    elif "error" in ev:
                        lf.write(f"\n# ERROR: {ev['error']}\n")
                        fail(ev["error"])
                    elif "status" in ev:
                        lf.write(f"{ev['status']}\n")
                    lf.flush()
            except docker.errors.APIError as e:
                lf.write(f"\n# ERROR: {e.explanation or e}\n")
                fail(str(e.explanation or e))
            except (docker.errors.DockerException, OSError) as e:  # engine went away mid-build
                lf.write(f"\n# ERROR: {e}\n")
                fail(f"engine connection: {e}")
            if image_id is None:
                fail("the engine reported no image id")
        return image_id

    @staticmethod
    def _step_name(r: Recipe, p: _Plan, n: int, text: str) -> str:
        if 1 <= n <= len(p.instructions):
            ins = p.instructions[n - 1]
            return f"{n}/{len(p.instructions)} `{ins.short()}` ({r.dockerfile}:{ins.line})"
        if n > len(p.instructions):
            return f"{n} `{text}` (labels added by reprostack)"
        return "0 (sending the context / parsing the Dockerfile)"


def build_images(names: Sequence[str] | None, opts: BuildOptions) -> list[ImageResult]:
    """Build `names` (default: every recipe under containers/) and their parents, parent first.

    Returns one ImageResult per image in build order; writes `<out>/images.json` (lock sha256 and the
    results). Raises RecipeError (a recipe or Dockerfile is wrong; names file:line), ImageBuildError
    (a step failed; names the image, the step and the log), ContainerError, EngineUnavailable,
    FetchError/PatchError (a source tree could not be prepared).
    """
    recipes, order = preflight(
        names, opts.root, opts.lock, overrides_from_env() if opts.base_overrides is None else opts.base_overrides
    )
    b = _Builder(opts)
    results: list[ImageResult] = []
    for n in order:
        res = b.image(recipes[n])
        b.done[n] = res
        results.append(res)  # one result line per image is the caller's to print (`reprostack build`: stdout)
    b.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(
        b.out / "images.json",
        json.dumps(
            {"lock": str(opts.lock.path), "lock_sha256": opts.lock.sha256, "images": [r.as_dict() for r in results]},
            indent=2,
            sort_keys=True,
        )
        + "\n",
    )
    return results
