"""The FROM image of a recipe without a parent (containers.engine's step 1): a local image (`local:` or a
base override) or a pinned registry base, found in the engine, pulled by digest, or (offline) a `docker load`ed
copy, and checked to be the pin.

Invariants:
- a registry base is used only when its `RepoDigests` name `repo@digest` (and its id is the lock's `id`, when
  pinned); offline, an image under the pin's `repo:tag` without that digest only when the lock pins its `id` and
  it matches; anything else is a ContainerError naming the pin's lock line (or the recipe's base line);
- a registry base without a digest is refused (recipe.missing_digest) before any pull; --offline never pulls;
- a local image the engine lacks is a RecipeError naming the recipe's base line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from rich.console import Console

from ..lock import Lock
from .errors import ContainerError, RecipeError
from .recipe import Recipe, missing_digest, override_for

if TYPE_CHECKING:
    from docker import DockerClient

PULL_HINT = (
    "; without that registry: `reprostack build --load FILE` (an images archive made where it is reachable) "
    "or, for a local test only, `--base-override BASE=IMAGE` / REPROSTACK_BASE_OVERRIDE (labelled on the image)"
)


def repo_of(name: str) -> str:
    """`repo[:tag]` -> repo (a ':' after the last '/' is the tag; a registry port is kept)."""
    head, slash, last = name.rpartition("/")
    return f"{head}{slash}{last.split(':', 1)[0]}"


@dataclass
class BaseResolver:
    """Resolves recipes' registry and local bases against one engine (`client`, a docker SDK client)."""

    client: DockerClient
    lock: Lock
    overrides: Mapping[str, str]
    offline: bool
    console: Console

    def resolve(self, r: Recipe) -> tuple[str, str, str, str | None]:
        """(FROM ref, identity for the key, base name for labels, override note) of a recipe without a parent."""
        import docker.errors

        base = r.base
        local = override_for(base, self.overrides)
        if local is None and base.kind == "local":
            local = base.name
        if local is not None:
            try:
                img = self.client.images.get(local)
            except docker.errors.ImageNotFound:
                hint = (
                    " (the test base: `reprostack build --test-base`, or the test suite, imports it)"
                    if local.startswith("reprostack-test/")
                    else ""
                )
                raise RecipeError(
                    r.path, r.line("base"), "base", f"local image {local!r} is not in this engine{hint}"
                ) from None
            note = None if (base.kind == "local" and local == base.name) else f"{base.text} -> {local} ({img.id})"
            return img.id, img.id, local, note
        if base.digest is None:
            raise missing_digest(r)
        repo = repo_of(base.name)
        pinned = f"{repo}@{base.digest}"
        try:
            img = self.client.images.get(pinned)
        except docker.errors.ImageNotFound:
            img = self._loaded_copy(r, base) if self.offline else None
            if img is None and self.offline:
                raise ContainerError(
                    f"{r.path}: base {base.text} is not in this engine and --offline forbids "
                    f"pulling it: `docker load` the images bundle first"
                ) from None
            if img is None:
                img = self._pull(r, repo, base.digest)
        self._check_base(r, base, img)
        return img.id, pinned, base.text, None

    def _where_pin(self, r: Recipe, base, field: str = "digest") -> str:
        """`LOCK:LINE: upstreams.PIN.FIELD` for a `base: lock:PIN`, else the recipe's base line."""
        if base.pin:
            return self.lock.where("upstreams", base.pin, field)
        return f"{r.path}:{r.line('base')}: base"

    def _loaded_copy(self, r: Recipe, base):
        """Offline: the image tagged `repo:tag` (a `docker load`ed copy carries no RepoDigests) when the lock pins
        its id and the ids match; None when no such tag exists. A different image under that tag is refused."""
        import docker.errors

        try:
            img = self.client.images.get(base.name)
        except docker.errors.ImageNotFound:
            return None
        if base.image_id and img.id == base.image_id:
            return img
        why = (
            f"the lock pins id {base.image_id}"
            if base.image_id
            else "the lock pins no `id` to check a loaded copy against"
        )
        raise ContainerError(
            f"{self._where_pin(r, base)}: {base.name} in this engine is {img.id}, which does not "
            f"carry the pinned digest {base.digest} and {why}: not the pinned image (remove it, "
            f"then pull {repo_of(base.name)}@{base.digest} or load the image that was pulled by it)"
        )

    def _check_base(self, r: Recipe, base, img) -> None:
        """The base found or pulled is the pin: its RepoDigests name `repo@digest` (or, for a loaded copy, its id is
        the lock's `id`), and when the lock pins an `id`, the id matches. Else ContainerError naming the pin."""
        from ..lock import split_repo

        want = split_repo(repo_of(base.name))
        digests = {
            (split_repo(d.rpartition("@")[0]), d.rpartition("@")[2]) for d in (img.attrs.get("RepoDigests") or [])
        }
        if base.image_id and img.id != base.image_id:
            raise ContainerError(
                f"{self._where_pin(r, base, 'id')}: {base.name}@{base.digest} in this engine is "
                f"{img.id}, the lock pins id {base.image_id}"
            )
        if (want, base.digest) not in digests and not (base.image_id and img.id == base.image_id):
            have = ", ".join(sorted(img.attrs.get("RepoDigests") or [])) or "none"
            raise ContainerError(
                f"{self._where_pin(r, base)}: the image the engine gives for "
                f"{repo_of(base.name)}@{base.digest} ({img.id}) does not carry that digest "
                f"(RepoDigests: {have})"
            )

    def _pull(self, r: Recipe, repo: str, digest: str):
        import docker.errors

        self.console.print(f"[bold]{r.name}[/]: pulling {repo}@{digest}")
        try:
            for ev in self.client.api.pull(repo, tag=digest, stream=True, decode=True):
                if "error" in ev:
                    raise ContainerError(f"{r.path}: pulling {repo}@{digest}: {ev['error']}{PULL_HINT}")
            return self.client.images.get(f"{repo}@{digest}")
        except docker.errors.APIError as e:
            raise ContainerError(f"{r.path}: pulling {repo}@{digest}: {e.explanation or e}{PULL_HINT}") from None
