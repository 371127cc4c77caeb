"""`reprostack lock images`: resolve each `kind: image` pin's `repo:tag` to its manifest digest, then fill or check.

How a pin is resolved: the registry's own HTTP API v2 (the Docker Registry / OCI distribution spec), no engine
needed: `HEAD /v2/<name>/manifests/<tag>` with an Accept header that takes an OCI image index, a Docker manifest
list, an OCI image manifest and a Docker schema-2 manifest, and the digest is the `Docker-Content-Digest` header.
That is the digest `docker pull repo:tag` records in `RepoDigests` (for a multi-arch image: the index's, so the
pin stays valid on every architecture). A registry that sends no such header is asked with GET and the body is
hashed. Anonymous bearer tokens (`WWW-Authenticate: Bearer realm=...`, as nvcr.io and Docker Hub use for public
images) are fetched when the registry asks for them.

Registry host: the first component of `repo` when it holds a `.` or `:` or is `localhost`, else Docker Hub
(`registry-1.docker.io`, one-component names under `library/`). HTTPS always, except for loopback hosts
(`localhost`, 127.0.0.0/8, ::1), which are spoken to over plain HTTP, as dockerd treats them as insecure registries.

A tag the registry does not know, an unreachable registry or an answer without a valid digest is an error naming
`FILE:LINE: upstreams.PIN.tag` and the reference, never a placeholder.

The image id: the manifest is then read by that digest (for an index or manifest list, its linux/amd64 entry's
manifest), every manifest body hashed against the digest it was asked by, and its `config.digest` is the `id` a
pulled or `docker load`ed copy of the image has on linux/amd64 (the build's check of a loaded base uses it).

Fill (default): only the `digest:` and `id:` lines of each resolved pin are rewritten (or appended to the pin when
it has none); every other byte of the lockfile stays as it is. The new text is loaded and validated again and
written atomically; on any error nothing is written.
Check (`--check`): the lock's digest must be exactly the registry's, and its `id`, when pinned, the registry's
linux/amd64 config digest; each difference is reported as `FILE:LINE: upstreams.PIN.FIELD: problem`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..errors import LockError, ReprostackError
from . import fill as lockfill
from .. import lock as lockmod  # the pin model's public face (lock.model, lock.pins)
from .pins import split_repo

MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


PLATFORM = ("linux", "amd64")  # the platform whose image id (config digest) a pin's `id` records


@dataclass(frozen=True)
class Resolved:
    pin: str
    digest: str
    id: str | None = None  # the config digest of the PLATFORM image the manifest (or index) names


class RegistryError(ReprostackError):
    pass


def is_loopback(host: str) -> bool:
    h = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    h = h.strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def manifest_url(repo: str, tag: str) -> str:
    host, name = split_repo(repo)
    scheme = "http" if is_loopback(host) else "https"
    return f"{scheme}://{host}/v2/{name}/manifests/{urllib.parse.quote(tag, safe='')}"


def bearer_token(challenge: str, timeout: float) -> str | None:
    """An anonymous token for a `Bearer realm="...",service="...",scope="..."` challenge, None if not Bearer."""
    if not challenge.lower().startswith("bearer "):
        return None
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", None)
    if not realm:
        return None
    url = realm + ("&" if "?" in realm else "?") + urllib.parse.urlencode(params)
    with urllib.request.urlopen(urllib.request.Request(url), timeout=timeout) as r:
        body = json.loads(r.read().decode("utf-8"))
    return body.get("token") or body.get("access_token")


def _request(url: str, method: str, token: str | None, timeout: float):
    headers = {"Accept": ", ".join(MANIFEST_TYPES)}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return urllib.request.urlopen(urllib.request.Request(url, method=method, headers=headers), timeout=timeout)


def error_text(e: urllib.error.HTTPError) -> str:
    try:
        body = e.read().decode("utf-8", "replace")
        errs = json.loads(body).get("errors") or []
        detail = "; ".join(f"{x.get('code')}: {x.get('message')}" for x in errs)
    except Exception:  # noqa: BLE001 - an unreadable error body only loses detail
        detail = ""
    return f"HTTP {e.code}" + (f" ({detail})" if detail else "")


def _fetch(url: str, method: str, timeout: float):
    """(headers, body) of `method url`; an anonymous bearer token is fetched once when the registry asks."""
    token = None
    while True:
        try:
            with _request(url, method, token, timeout) as r:
                return r.headers, (r.read() if method == "GET" else b"")
        except urllib.error.HTTPError as e:
            if e.code == 401 and token is None:
                try:
                    token = bearer_token(e.headers.get("WWW-Authenticate", ""), timeout)
                except (OSError, ValueError) as te:
                    raise RegistryError(f"{url}: could not get an anonymous token: {te}") from None
                if token:
                    continue
            detail = error_text(e) if method == "GET" else f"HTTP {e.code} {e.reason}"
            raise RegistryError(f"{method} {url}: {detail}") from None
        except (OSError, ValueError) as e:
            raise RegistryError(f"{method} {url}: {getattr(e, 'reason', None) or e}") from None


def registry_digest(repo: str, tag: str, timeout: float = 60.0) -> str:
    """The manifest digest the registry serves for `repo:tag`. Raises RegistryError with the reason."""
    url = manifest_url(repo, tag)
    headers, _ = _fetch(url, "HEAD", timeout)
    digest = headers.get("Docker-Content-Digest")
    if digest and _DIGEST.match(digest):
        return digest
    headers, body = _fetch(url, "GET", timeout)  # no usable header: hash the manifest itself
    computed = "sha256:" + hashlib.sha256(body).hexdigest()
    sent = headers.get("Docker-Content-Digest")
    if sent and sent != computed:
        raise RegistryError(f"GET {url}: Docker-Content-Digest {sent} but the manifest hashes to {computed}")
    return computed


def registry_image_id(repo: str, digest: str, timeout: float = 60.0) -> str:
    """The image id (config digest) that `repo@digest` has on PLATFORM once pulled: for an index or manifest list
    the PLATFORM entry's manifest is read, then its `config.digest`. Every manifest read is hashed and must be the
    digest it was asked by. Raises RegistryError."""

    def manifest(d: str) -> dict:
        url = manifest_url(repo, d)
        _, body = _fetch(url, "GET", timeout)
        got = "sha256:" + hashlib.sha256(body).hexdigest()
        if got != d:
            raise RegistryError(f"GET {url}: the manifest hashes to {got}, not {d}")
        try:
            return json.loads(body.decode("utf-8"))
        except ValueError as e:
            raise RegistryError(f"GET {url}: not a JSON manifest ({e})") from None

    m = manifest(digest)
    if "manifests" in m:
        entry = next(
            (
                e
                for e in m["manifests"]
                if (e.get("platform") or {}).get("os") == PLATFORM[0]
                and (e.get("platform") or {}).get("architecture") == PLATFORM[1]
            ),
            None,
        )
        if entry is None or not _DIGEST.match(str(entry.get("digest", ""))):
            raise RegistryError(f"{repo}@{digest}: the index has no {'/'.join(PLATFORM)} manifest")
        m = manifest(entry["digest"])
    cfg = (m.get("config") or {}).get("digest", "")
    if not _DIGEST.match(str(cfg)):
        raise RegistryError(f"{repo}@{digest}: the manifest names no config digest")
    return cfg


def _where(lock: lockmod.Lock, name: str, *path) -> str:
    return lock.where("upstreams", name, *path)


def _image_pin(lock: lockmod.Lock, name: str) -> lockmod.ImagePin:
    pin = lock.get(name)
    if not isinstance(pin, lockmod.ImagePin):
        raise LockError(
            str(lock.path),
            lock.line_of(("upstreams", name)),
            f"upstreams.{name}",
            f"is kind {pin.kind}, `lock images` takes image pins",
        )
    return pin


def resolve_pin(lock: lockmod.Lock, name: str, timeout: float = 60.0) -> Resolved:
    pin = _image_pin(lock, name)
    try:
        digest = registry_digest(pin.repo, pin.tag, timeout)
        return Resolved(name, digest, registry_image_id(pin.repo, digest, timeout))
    except RegistryError as e:
        raise ReprostackError(f"{_where(lock, name, 'tag')}: {pin.repo}:{pin.tag} does not resolve: {e}") from None


def image_names(lock: lockmod.Lock, names: list[str]) -> list[str]:
    if names:
        for n in names:
            _image_pin(lock, n)
        return list(names)
    return [n for n, p in lock.upstreams.items() if isinstance(p, lockmod.ImagePin)]


def check(lock: lockmod.Lock, resolved: list[Resolved]) -> list[str]:
    """Every difference between the lock's digests and the registry's, as `FILE:LINE: field: problem`."""
    problems = []
    for r in resolved:
        pin = _image_pin(lock, r.pin)
        if not pin.digest:
            problems.append(
                f"{_where(lock, r.pin)}: no digest pinned (the registry serves {r.digest} for "
                f"{pin.repo}:{pin.tag}; run `reprostack lock images {r.pin}`)"
            )
        elif pin.digest != r.digest:
            problems.append(
                f"{_where(lock, r.pin, 'digest')}: lock has {pin.digest}, the registry serves "
                f"{r.digest} for {pin.repo}:{pin.tag}"
            )
        elif r.id and pin.id and pin.id != r.id:
            problems.append(
                f"{_where(lock, r.pin, 'id')}: lock has {pin.id}, the registry's {'/'.join(PLATFORM)} "
                f"image of {pin.repo}@{pin.digest} is {r.id}"
            )
    return problems


def _field_line(text: str, name: str, field: str = "digest") -> tuple[int, int, bool]:
    """(line, key column, has_field), 0-based: the `FIELD:` line of the pin, or the pin's last line (the new
    line goes after it) when it has none."""
    pin_node = lockfill.pin_node(text, name)
    if not isinstance(pin_node, yaml.MappingNode) or pin_node.flow_style:
        raise ReprostackError(f"upstreams.{name}: an image pin must be a block mapping to be filled")
    col = pin_node.value[0][0].start_mark.column
    try:
        key, val = lockfill.child(pin_node, field)
    except KeyError:
        last = max(
            v.end_mark.line - (1 if v.end_mark.column == 0 and v.end_mark.line > v.start_mark.line else 0)
            for _, v in pin_node.value
        )
        return last, col, False
    if val.end_mark.line != key.start_mark.line:
        raise ReprostackError(f"upstreams.{name}.{field}: spans several lines; write it on one line")
    return key.start_mark.line, col, True


def fill_text(text: str, resolved: list[Resolved]) -> str:
    """`text` with the `digest:` (then `id:`) line of each resolved pin replaced (or appended after the pin's last
    line); nothing else changes."""
    for r in resolved:
        for field, value in (("digest", r.digest), ("id", r.id)):
            if value is None:
                continue
            lines = text.splitlines(keepends=True)
            line, col, has = _field_line(text, r.pin, field)
            if has:
                old = lines[line]
                m = re.match(rf"^(\s*{field}:\s*)(\"[^\"]*\"|'[^']*'|[^\s#]*)(.*?)(\r?\n)?$", old, re.S)
                if not m:
                    raise ReprostackError(f"upstreams.{r.pin}.{field}: cannot rewrite line {line + 1}: {old!r}")
                lines[line] = m.group(1) + value + m.group(3) + (m.group(4) or "")
            else:
                if not lines[line].endswith("\n"):
                    lines[line] += "\n"
                lines.insert(line + 1, f"{' ' * col}{field}: {value}\n")
            text = "".join(lines)
    return text


def run(lock_path: Path, names: list[str], do_check: bool, out=print, timeout: float = 60.0) -> int:
    """Fill or check image pins (see reprostack.lock.fill.run); `timeout` per registry request, seconds."""

    def describe(lock: lockmod.Lock, r: Resolved) -> str:
        pin = lock.get(r.pin)
        return f"{pin.repo}:{pin.tag} -> {r.digest}" + (f" (image id {r.id})" if r.id else "")

    kind = lockfill.PinKind(
        what="image",
        field="digest",
        source="the registry",
        names=image_names,
        resolve=lambda lock, n: resolve_pin(lock, n, timeout),
        describe=describe,
        check=check,
        fill_text=fill_text,
    )
    return lockfill.run(kind, lock_path, names, do_check, out)
