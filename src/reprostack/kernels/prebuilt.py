"""Kernels prebuilt in an image: the manifest the deepep image writes, read as untrusted input and checked
against the lock and this checkout's kernel recipes before a gate uses them (container mode: no fetch, no build).

The manifest (`/opt/reprostack/kernels.json`, MANIFEST) is written at image build time by
containers/deepep/record-kernels.py (the deepep recipe records nccl and deepep, the megatron recipe adds its
megatron-lm source tree). Format (schemas/kernels-manifest.schema.json, version 1):

    {"manifest_version": 1, "image": "deepep",
     "components": {NAME: {"pin": NAME, "kind": "kernel"|"source", "rev": hex40, "patched_tree": hex40,
                           "paths": {"src": ..., ...},
                           kernel only: "recipe" (Recipe.digest of kernels/NAME.yaml, the same value the host
                           build key holds), "nccl_version" (nccl: its nccl.h; deepep: the NCCL it was built
                           against), "cuda_version" (nvcc release), "arch" (["90"]), "files" {path: sha256}}}}

DeepEP's JIT kernels compiled into the image (reprostack.kernels.jitimage, the recipe's `jit:`) are the top-level
`jit`: {"cache_dir" (the image's EP_JIT_CACHE_DIR), "arch" ("90a"), "signature" ("NVCC13.0"), "deepep_patched_tree",
"profiles" {profile: {manifest_sha256, kernels}}, "left_out" {profile: why}, "kernels" [{name, folder
(kernel.<name>.<digest>), code_sha256, cubin_sha256 (of the folder's kernel.cu and kernel.cubin), profiles}]}.

An NCCL taken from a pinned wheel (a stack whose `nccl` is a wheel pin, e.g. gin-gdaki, or the release wheel of an
unpatched `nccl` git pin, kernels/nccl.yaml `wheel:`; the deepep and deepep-gin-gdaki recipes pass record-kernels.py
`nccl.wheel_pin=...`) is a component of kind "wheel": no rev, tree or recipe, but
"wheel_pin" (the lock's shared wheel pin), "wheel" (its filename), "wheel_sha256", "nccl_version" (its nccl.h),
"paths" {include, lib, wheel} and "files" {libnccl.so.2: sha256}.

Invariants:
- the manifest is read bounded (reprostack.jsonsrc: size, depth, numbers) and validated against the schema
  before any field is used; a hostile one is one PrebuiltError line naming the file and the field;
- `check` compares each asked-for component with the lock's pin (rev; patched tree = the tree after the patch
  series, or the tree without one) and, for kernels, with this checkout's recipe digest and the NCCL the
  gate needs; a component whose lock pin is a wheel (the selected stack's NCCL) must be of kind "wheel" and name
  the same wheel pin, one of its files with the lock's sha256, and its version; a git pin is matched by a wheel
  component only when that wheel is the pin's release wheel, the one the host build takes for it
  (`ncclwheel.choose`: an unpatched release whose kernels/<pin>.yaml names that `wheel:`; the deepep image's NCCL),
  checked the same way; every listed file must be a regular file whose sha256 is the recorded one, and every path a
  gate trusts is one of those hashed files or the folder of one (nccl: exactly one hashed libnccl file, its `lib`
  that file's folder; deepep: `extension` hashed, `package` its folder): the NCCL folder a gate uses is derived from
  the hashed file, never taken from a free field; the prebuilt JIT kernels (`jit`) must be for the deepep
  component's patched tree, each folder DeepEP's `kernel.<name>.<32 hex>` of its own name, its kernel.cu and
  kernel.cubin regular files with the recorded sha256. Any difference is one
  PrebuiltError line: `MANIFEST: components.C.FIELD: the image has X, <where> has Y` and what to do;
- nothing here fetches, builds or falls back to a host build: a caller that gets PrebuiltError reports it and
  has built nothing. A manifest names no whole lock (each component is its own pin's identity; manifests written
  before 2026-12-03 carry a `lock_sha256`, the lock of their first build, reported and never compared): an image
  whose pins did not change is reused under a newer lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import jsonsrc, schemas
from ..digest import sha256_file
from ..errors import BuildError, LocatedError
from ..lock import GitPin, Lock, WheelPin
from ..sources import SourceTree
from ..yamlsrc import validate
from . import ncclwheel, preflight
from .recipe import has_recipe, load_recipe

MANIFEST = "/opt/reprostack/kernels.json"
MAX_MANIFEST_BYTES = 1 << 20


class PrebuiltError(LocatedError, BuildError):
    """The image's kernels manifest is missing, malformed, or does not match the lock: one line."""

    def __init__(self, path, line, field, message):
        super().__init__(str(path), line, field, message)


def _bad(path: Path):
    def error(message: str) -> PrebuiltError:  # jsonsrc's messages already start with `FILE[:LINE]:`
        e = PrebuiltError(path, None, "(file)", message)
        e.args = (f"{message} (the image's kernels manifest)",)
        return e

    return error


@dataclass(frozen=True)
class Prebuilt:
    """A manifest that passed `check`: where it is, its sha256, and its checked components."""

    path: Path
    sha256: str
    image: str
    lock_sha256: str | None  # an older manifest's whole-lock sha256 (module doc); None in current ones
    components: dict
    jit: dict | None = None  # the image's prebuilt DeepEP JIT kernels (checked), None when it has none

    def jit_words(self) -> str:
        """`N prebuilt DeepEP JIT kernel(s) of P (sm_A) in DIR, checked by sha256` or "" (none in the image)."""
        if not self.jit:
            return ""
        j = self.jit
        return (
            f"{len(j['kernels'])} prebuilt DeepEP JIT kernel(s) of {', '.join(sorted(j['profiles'])) or 'no profile'} "
            f"(sm_{j['arch']}, {j['signature']}) in {j['cache_dir']}, checked by sha256"
        )

    def tree(self, lock: Lock, name: str) -> SourceTree:
        """The image's copy of pin `name`'s patched tree, as the gates use a fetched one."""
        c = self.components[name]
        if c["kind"] == "wheel":
            raise PrebuiltError(
                self.path, None, f"components.{name}", f"is NCCL from wheel {c['wheel']}: it has no tree"
            )
        pin = lock.get(name)
        return SourceTree(
            pin=pin, path=Path(c["paths"]["src"]), tree=c["patched_tree"], patched=bool(pin.patches), reused=True
        )

    def nccl_file(self) -> tuple[Path, str]:
        """(path, sha256) of the one hashed libnccl file of component nccl (`check` made sure there is exactly one):
        the NCCL the gate loads and the folder it trusts come from it, never from a free `paths` field."""
        return _nccl_file(self.path, self.components["nccl"])

    def provenance(self) -> dict:
        """`provenance.kernels_from` of a report: where the kernels came from (container.py adds the image id)."""
        return {
            "mode": "image",
            "manifest": str(self.path),
            "manifest_sha256": self.sha256,
            "image": self.image,
            **({"image_lock_sha256": self.lock_sha256} if self.lock_sha256 else {}),
            **(
                {
                    "jit": {
                        **{k: self.jit[k] for k in ("cache_dir", "arch", "signature", "profiles", "left_out")},
                        "kernels": {k["folder"]: k["cubin_sha256"] for k in self.jit["kernels"]},
                    }
                }
                if self.jit
                else {}
            ),
        }

    def kernels_provenance(self) -> dict:
        """`provenance.kernels` of a report, per component (host mode records build keys there instead)."""
        keep = (
            "rev",
            "patched_tree",
            "recipe",
            "nccl_version",
            "cuda_version",
            "arch",
            "files",
            "wheel_pin",
            "wheel",
            "wheel_sha256",
        )
        return {
            n: {"prebuilt": True, **{k: c[k] for k in keep if k in c}}
            for n, c in self.components.items()
            if c["kind"] in ("kernel", "wheel")
        }


def load(path: Path | str) -> tuple[dict, str]:
    """(manifest, sha256 of its bytes); PrebuiltError naming the file for a missing, oversized, non-JSON or
    schema-invalid manifest."""
    path = Path(path)
    if not path.exists():
        raise PrebuiltError(
            path,
            None,
            "(file)",
            "no kernels manifest: this image has no prebuilt kernels (an image "
            "built before the manifest existed, or not a deepep image): rebuild it (`reprostack build "
            "deepep`) or run the gate in host mode (--no-container), which builds them",
        )
    d = jsonsrc.load(path, _bad(path), max_bytes=MAX_MANIFEST_BYTES)
    schema = schemas.load("kernels-manifest")
    validate(d, {}, schema, str(path), PrebuiltError)
    for name, c in d["components"].items():
        if c["pin"] != name:
            raise PrebuiltError(path, None, f"components.{name}.pin", f"is {c['pin']!r}, the entry is {name!r}")
    return d, sha256_file(path)


def _mismatch(path: Path, name: str, field: str, have, where: str, want, todo: str) -> PrebuiltError:
    return PrebuiltError(path, None, f"components.{name}.{field}", f"the image has {have}, {where} has {want}: {todo}")


def check(
    path: Path | str,
    lock: Lock,
    root: Path,
    names: tuple[str, ...] | list[str],
    *,
    arch: str | None = None,
    hash_files: bool = True,
) -> Prebuilt:
    """Load the manifest at `path` and check components `names` against `lock` and `root`'s kernel recipes (see
    the module doc). `arch`: the GPU's compute capability ("90"), checked when given. Raises PrebuiltError."""
    path = Path(path)
    d, digest = load(path)
    rebuild = (
        "rebuild the image from this lock (`reprostack build deepep`, then its children) or run in host "
        "mode (--no-container)"
    )
    comps = {}
    for name in names:
        c = d["components"].get(name)
        if c is None:
            raise PrebuiltError(
                path,
                None,
                f"components.{name}",
                f"missing: the image has "
                f"{', '.join(sorted(d['components'])) or 'none'}; the gate needs {name}: {rebuild}",
            )
        _check_component(path, lock, root, name, c, rebuild, arch=arch, hash_files=hash_files)
        comps[name] = c
    if "nccl" in comps and "deepep" in comps:
        _check_nccl_of_deepep(path, root, comps, rebuild)
    jit_rec = d.get("jit")
    if jit_rec is not None and "deepep" in comps:
        _check_jit(path, jit_rec, comps["deepep"], rebuild, hash_files)
    return Prebuilt(path, digest, d["image"], d.get("lock_sha256"), comps, jit_rec if "deepep" in comps else None)


def _check_component(
    path: Path, lock: Lock, root: Path, name: str, c: dict, rebuild: str, *, arch: str | None, hash_files: bool
) -> None:
    """Component `name` of the manifest against the lock's pin: the stack's wheel, the release wheel of its git pin,
    or a build of the pinned rev and patched tree (and, for a kernel, this checkout's recipe and the GPU's arch);
    its files' sha256 when `hash_files`; its paths. Raises PrebuiltError."""
    pin = lock.upstreams.get(name)
    if isinstance(pin, WheelPin):  # the selected stack's NCCL is a wheel alone: the image must hold that wheel
        _check_wheel(path, lock, name, c, pin, rebuild)
        if hash_files:
            _hash_files(path, name, c, rebuild)
        _check_paths(path, name, c)
        return
    if not isinstance(pin, GitPin):
        raise PrebuiltError(path, None, f"components.{name}", f"the lock ({lock.path}) has no git pin {name!r}")
    if c["kind"] == "wheel":
        release = _release_wheel(root, lock, name, pin)
        if release is None or c["wheel_pin"] != release:
            raise _mismatch(
                path,
                name,
                "kind",
                f"{name} from wheel {c['wheel']} (pin {c['wheel_pin']})",
                f"the lock ({lock.path}, stack {lock.stack}: upstreams.{name})",
                f"git pin {pin.rev}" + (f" (its release wheel: pin {release})" if release else ""),
                "this image was built for another stack; " + rebuild,
            )
        _check_wheel(path, lock, name, c, lock.get(release), rebuild, want_pin=release)
        if hash_files:
            _hash_files(path, name, c, rebuild)
        _check_paths(path, name, c)
        return
    _check_built(path, lock, root, name, c, pin, rebuild, arch=arch, hash_files=hash_files)
    _check_paths(path, name, c)


def _check_built(
    path: Path,
    lock: Lock,
    root: Path,
    name: str,
    c: dict,
    pin: GitPin,
    rebuild: str,
    *,
    arch: str | None,
    hash_files: bool,
) -> None:
    """A component built from the git pin: its rev and patched tree are the lock's; a kernel's recipe digest is this
    checkout's and its arch list holds `arch`. Raises PrebuiltError."""
    where = f"the lock ({lock.path}: upstreams.{name})"
    if c["rev"] != pin.rev:
        raise _mismatch(path, name, "rev", c["rev"], where, pin.rev, rebuild)
    want_tree = pin.patched_tree or pin.tree
    if c["patched_tree"] != want_tree:
        raise _mismatch(
            path, name, "patched_tree", c["patched_tree"], where + " after its patch series", want_tree, rebuild
        )
    if has_recipe(root, name) and c["kind"] != "kernel":  # a component with a recipe is a kernel
        raise _mismatch(path, name, "kind", c["kind"], "the gate", "kernel", rebuild)
    if c["kind"] == "kernel":
        recipe = load_recipe(root, name)
        if c["recipe"] != recipe.digest:
            raise _mismatch(
                path,
                name,
                "recipe",
                c["recipe"],
                f"this checkout's {recipe.path}",
                recipe.digest,
                f"the recipe changed since the image was built; {rebuild}",
            )
        if arch and arch not in c["arch"]:
            raise _mismatch(
                path,
                name,
                "arch",
                ",".join(c["arch"]),
                "this host's GPU",
                arch,
                "the image's kernels hold no code for this GPU; rebuild with its CUDA_ARCH",
            )
        if hash_files:
            _hash_files(path, name, c, rebuild)


def _check_nccl_of_deepep(path: Path, root: Path, comps: dict, rebuild: str) -> None:
    """DeepEP was built against the image's NCCL, and that NCCL meets kernels/deepep.yaml's nccl-floor."""
    n, e = comps["nccl"]["nccl_version"], comps["deepep"]["nccl_version"]
    if n != e:
        raise _mismatch(
            path,
            "deepep",
            "nccl_version",
            e,
            "the image's nccl",
            n,
            "DeepEP was built against another NCCL than the one the image loads; " + rebuild,
        )
    floor = load_recipe(root, "deepep").nccl_floor
    if floor and preflight.parse_version(n) < preflight.parse_version(floor):
        raise _mismatch(path, "nccl", "nccl_version", n, "kernels/deepep.yaml (nccl-floor)", f">= {floor}", rebuild)


def _check_jit(path: Path, j: dict, deepep: dict, rebuild: str, hash_files: bool) -> None:
    """The image's prebuilt JIT kernels are for its DeepEP and are the recorded bytes (see the module doc)."""
    if j["deepep_patched_tree"] != deepep.get("patched_tree"):
        raise PrebuiltError(
            path,
            None,
            "jit.deepep_patched_tree",
            f"the JIT kernels were compiled for deepep tree {j['deepep_patched_tree']}, the image's deepep is "
            f"{deepep.get('patched_tree')}: {rebuild}",
        )
    for i, k in enumerate(j["kernels"]):
        if not k["folder"].startswith(f"kernel.{k['name']}."):
            raise PrebuiltError(path, None, f"jit.kernels[{i}].folder", f"{k['folder']} is not a folder of {k['name']}")
        if not hash_files:
            continue
        d = Path(j["cache_dir"]) / "cache" / k["folder"]
        for f, field in (("kernel.cu", "code_sha256"), ("kernel.cubin", "cubin_sha256")):
            fp = d / f
            try:
                got = sha256_file(fp) if fp.is_file() and not fp.is_symlink() and not d.is_symlink() else None
            except OSError:
                got = None
            if got != k[field]:
                raise PrebuiltError(
                    path,
                    None,
                    f"jit.kernels[{i}].{field}",
                    f"{fp} is {'not a regular file' if got is None else f'sha256 {got}'}, the manifest has "
                    f"{k[field]}: {rebuild}",
                )


def _nccl_file(path: Path, c: dict) -> tuple[Path, str]:
    """(path, sha256) of the one hashed file of an NCCL component named libnccl.so*; PrebuiltError otherwise."""
    libs = sorted((f, sha) for f, sha in c.get("files", {}).items() if _is_libnccl(f))
    if len(libs) != 1:
        raise PrebuiltError(
            path,
            None,
            "components.nccl.files",
            f"{len(libs)} hashed libnccl file(s) ({', '.join(f for f, _ in libs) or 'none'}): the NCCL the gate loads "
            f"must be exactly one of the hashed files (rebuild the image)",
        )
    return Path(libs[0][0]), libs[0][1]


def _is_libnccl(f: str) -> bool:
    name = Path(f).name
    return name == "libnccl.so" or name.startswith("libnccl.so.")


def _check_paths(path: Path, name: str, c: dict) -> None:
    """Every path of the manifest a gate trusts is a hashed file or the folder of one: nccl's `lib` is the folder of
    its one hashed libnccl file; deepep's `extension` is a hashed file and `package` its folder. PrebuiltError naming
    the field otherwise (a free field could point the gate at files nobody hashed)."""
    paths, files = c.get("paths", {}), c.get("files", {})
    if name == "nccl" and c["kind"] in ("kernel", "wheel"):
        lib, _ = _nccl_file(path, c)
        if "lib" in paths and Path(paths["lib"]) != lib.parent:
            raise PrebuiltError(
                path,
                None,
                "components.nccl.paths.lib",
                f"{paths['lib']} is not the folder of the hashed {lib}: the folder the gate trusts comes from a "
                f"hashed file (rebuild the image)",
            )
    if c["kind"] == "kernel" and "extension" in paths:
        if paths["extension"] not in files:
            raise PrebuiltError(
                path,
                None,
                f"components.{name}.paths.extension",
                f"{paths['extension']} is not one of the hashed files ({', '.join(sorted(files)) or 'none'})",
            )
        if "package" in paths and Path(paths["package"]) != Path(paths["extension"]).parent:
            raise PrebuiltError(
                path,
                None,
                f"components.{name}.paths.package",
                f"{paths['package']} is not the folder of the hashed extension {paths['extension']}",
            )


def _hash_files(path: Path, name: str, c: dict, rebuild: str) -> None:
    """Every file the component lists is a regular file with the recorded sha256, else one PrebuiltError line."""
    for f, sha in c["files"].items():
        fp = Path(f)
        if not fp.is_file():
            raise PrebuiltError(path, None, f"components.{name}.files", f"{f} is not a file in this image: {rebuild}")
        try:
            got = sha256_file(fp)
        except OSError as e:  # e.g. mode 0 on a shared image layer: one line, never a traceback
            raise PrebuiltError(
                path, None, f"components.{name}.files", f"{f} cannot be read: {e.strerror or e}: {rebuild}"
            ) from None
        if got != sha:
            raise _mismatch(
                path,
                name,
                f"files[{f}]",
                f"sha256 {sha}",
                "the file",
                f"sha256 {got}",
                "the built file was replaced after the manifest was written; " + rebuild,
            )


def _release_wheel(root: Path, lock: Lock, name: str, pin: GitPin) -> str | None:
    """The wheel pin that stands for the git pin `name` (the release wheel kernels/<name>.yaml names, used by the host
    build too: reprostack.kernels.ncclwheel.choose, with the release the pin is fetched from as its version), else
    None: a patched or unreleased pin, or a recipe without `wheel:`."""
    try:
        recipe = load_recipe(root, name)
        choice = ncclwheel.choose(lock, name, recipe.wheel, ncclwheel.release_of(pin), recipe_path=str(recipe.path))
    except (BuildError, LocatedError):
        return None
    return choice.wheel_pin if choice.kind == "wheel" else None


def _check_wheel(
    path: Path, lock: Lock, name: str, c: dict, pin: WheelPin, rebuild: str, want_pin: str | None = None
) -> None:
    """The component `name` of the image is the wheel the selected stack pins `name` as (or, for a git pin, its
    release wheel `want_pin`): kind "wheel", the same shared wheel pin, one of its files with the lock's sha256, its
    version. Else one PrebuiltError line."""
    if want_pin is None:
        want_pin = ncclwheel.wheel_alone(lock, name)
        where = f"the lock ({lock.path}, stack {lock.stack}: upstreams.{name} = wheel pin {want_pin})"
    else:
        where = f"the lock ({lock.path}, stack {lock.stack}: upstreams.{name}'s release wheel, pin {want_pin})"
    if c["kind"] != "wheel":
        raise _mismatch(
            path,
            name,
            "kind",
            f"{name} {c['kind']} from rev {c['rev']}",
            where,
            f"{pin.name} {pin.version} from its wheel alone",
            "this image was built for another stack; " + rebuild,
        )
    if c["wheel_pin"] != want_pin:
        raise _mismatch(path, name, "wheel_pin", c["wheel_pin"], where, want_pin, rebuild)
    files = {f.filename: f.sha256 for f in pin.files}
    if c["wheel"] not in files:
        raise _mismatch(path, name, "wheel", c["wheel"], where, " or ".join(sorted(files)), rebuild)
    if c["wheel_sha256"] != files[c["wheel"]]:
        raise _mismatch(
            path,
            name,
            "wheel_sha256",
            c["wheel_sha256"],
            where,
            files[c["wheel"]],
            "the image holds other bytes than the lock pins; " + rebuild,
        )
    if c["nccl_version"] != pin.version:
        raise _mismatch(path, name, "nccl_version", c["nccl_version"], where, pin.version, rebuild)
