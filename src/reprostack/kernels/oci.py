"""A small OCI distribution (registry API v2) client for the kernel cache: blobs and manifests by digest, over HTTP(S)
with the standard library (the ORAS idea: an artifact is an OCI image manifest whose `artifactType` says what it is,
its config and layers are plain blobs).

What it speaks (the OCI distribution spec 1.1, which Docker's distribution 2.x, ECR, GHCR and Harbor serve):
`HEAD/GET /v2/<name>/blobs/<digest>`, a monolithic upload (`POST /v2/<name>/blobs/uploads/` then `PUT <location>
?digest=`), `PUT/GET /v2/<name>/manifests/<tag>`, `GET /v2/<name>/tags/list`. Loopback hosts are spoken to over plain
HTTP (as dockerd treats them), every other host over HTTPS. Auth: an anonymous bearer token when the registry asks
for one (lock.images does the same for pins), or Basic credentials from $REPROSTACK_REGISTRY_USER /
$REPROSTACK_REGISTRY_PASSWORD (ECR: user `AWS`, password `aws ecr get-login-password`), sent to the token realm
when there is one, else to the registry.

Invariants: every body read is bounded (MAX_MANIFEST_BYTES for a manifest, the descriptor's own size for a blob) and
hashed against the digest it was asked by before a caller sees it; a failure is RegistryError with the method, the
URL and the registry's own error text, never a traceback.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from ..digest import sha256_stream
from ..lock.images import RegistryError, bearer_token, error_text, is_loopback

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
MAX_MANIFEST_BYTES = 4 << 20  # the spec's suggested limit for a manifest a registry accepts
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_NAME = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
TIMEOUT_S = 120.0


def _basic() -> str | None:
    user, pw = os.environ.get("REPROSTACK_REGISTRY_USER"), os.environ.get("REPROSTACK_REGISTRY_PASSWORD")
    if user and pw is not None:
        return "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()
    return None


class Repo:
    """One repository of a registry: `oci://HOST[:PORT]/NAME` (NAME may hold slashes)."""

    def __init__(self, url: str, timeout: float = TIMEOUT_S):
        rest = url[len("oci://") :] if url.startswith("oci://") else url
        host, _, name = rest.partition("/")
        if not host or not _NAME.match(name):
            raise RegistryError(f"{url}: not an OCI repository (oci://HOST[:PORT]/NAME, NAME lowercase)")
        scheme = "http" if is_loopback(host) else "https"
        self.url, self.base, self.timeout = url, f"{scheme}://{host}/v2/{name}", timeout
        self._auth: str | None = None

    def _open(self, method: str, url: str, *, data=None, headers: dict | None = None):
        """The response of `method url` (the caller closes it); a 401 is answered once with a token or Basic
        credentials. Raises RegistryError; a 404 as RegistryError with `.status` 404."""
        headers = dict(headers or {})
        for attempt in (0, 1):
            if self._auth:
                headers["Authorization"] = self._auth
            req = urllib.request.Request(url, method=method, data=data, headers=headers)
            try:
                return urllib.request.urlopen(req, timeout=self.timeout)
            except urllib.error.HTTPError as e:
                if e.code == 401 and attempt == 0 and self._login(e.headers.get("WWW-Authenticate", "")):
                    if hasattr(data, "seek"):
                        data.seek(0)
                    continue
                err = RegistryError(f"{method} {url}: {error_text(e) if method != 'HEAD' else f'HTTP {e.code}'}")
                err.status = e.code
                raise err from None
            except (OSError, ValueError) as e:
                raise RegistryError(f"{method} {url}: {getattr(e, 'reason', None) or e}") from None
        raise RegistryError(f"{method} {url}: HTTP 401 (no credentials accepted)")

    def _login(self, challenge: str) -> bool:
        basic = _basic()
        if challenge.lower().startswith("basic"):
            self._auth = basic
            return basic is not None
        if basic:  # a bearer realm with credentials: ask the realm with them (ECR, Harbor)
            params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
            realm = params.pop("realm", "")
            if realm:
                q = realm + ("&" if "?" in realm else "?") + urllib.parse.urlencode(params)
                try:
                    with urllib.request.urlopen(
                        urllib.request.Request(q, headers={"Authorization": basic}), timeout=self.timeout
                    ) as r:
                        body = json.loads(r.read(1 << 20).decode())
                    tok = body.get("token") or body.get("access_token")
                    self._auth = f"Bearer {tok}" if tok else None
                    return tok is not None
                except (OSError, ValueError):
                    return False
        try:
            tok = bearer_token(challenge, self.timeout)
        except (OSError, ValueError):
            return False
        self._auth = f"Bearer {tok}" if tok else None
        return tok is not None

    def has_blob(self, digest: str) -> bool:
        try:
            self._open("HEAD", f"{self.base}/blobs/{digest}").close()
            return True
        except RegistryError as e:
            if getattr(e, "status", None) == 404:
                return False
            raise

    def push_blob(self, src: Path | bytes, digest: str, size: int) -> None:
        """Upload one blob (monolithic: POST then PUT ?digest=), unless the registry has it already."""
        if self.has_blob(digest):
            return
        with self._open("POST", f"{self.base}/blobs/uploads/", data=b"", headers={"Content-Length": "0"}) as r:
            loc = r.headers.get("Location") or ""
        if not loc:
            raise RegistryError(f"POST {self.base}/blobs/uploads/: no Location in the answer")
        loc = urllib.parse.urljoin(self.base + "/", loc)
        url = loc + ("&" if "?" in loc else "?") + urllib.parse.urlencode({"digest": digest})
        hdr = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        if isinstance(src, bytes):
            self._open("PUT", url, data=src, headers=hdr).close()
        else:
            with open(src, "rb") as f:
                self._open("PUT", url, data=f, headers=hdr).close()

    def put_manifest(self, tag: str, body: bytes) -> str:
        """PUT the manifest under `tag`; returns its digest."""
        if not _TAG.match(tag):
            raise RegistryError(f"{tag!r}: not an OCI tag")
        self._open("PUT", f"{self.base}/manifests/{tag}", data=body, headers={"Content-Type": MANIFEST_TYPE}).close()
        return "sha256:" + hashlib.sha256(body).hexdigest()

    def get_manifest(self, tag: str) -> bytes | None:
        """The manifest bytes under `tag` (None: the registry has no such tag); bounded, and when the registry
        names its digest, hashed against it."""
        if not _TAG.match(tag):
            raise RegistryError(f"{tag!r}: not an OCI tag")
        try:
            r = self._open("GET", f"{self.base}/manifests/{tag}", headers={"Accept": MANIFEST_TYPE})
        except RegistryError as e:
            if getattr(e, "status", None) == 404:
                return None
            raise
        with r:
            body = r.read(MAX_MANIFEST_BYTES + 1)
            sent = r.headers.get("Docker-Content-Digest")
        if len(body) > MAX_MANIFEST_BYTES:
            raise RegistryError(f"{self.url}:{tag}: manifest over {MAX_MANIFEST_BYTES} bytes")
        got = "sha256:" + hashlib.sha256(body).hexdigest()
        if sent and sent != got:
            raise RegistryError(f"{self.url}:{tag}: Docker-Content-Digest {sent} but the manifest hashes to {got}")
        return body

    def get_blob(self, digest: str, size: int, dest) -> None:
        """Write blob `digest` (at most `size` bytes) to the open binary file `dest`, hashed on the way. Raises
        RegistryError when it is longer, shorter or hashes to anything else (the caller discards `dest`)."""
        if not _DIGEST.match(digest):
            raise RegistryError(f"{digest!r}: not a sha256 digest")
        with self._open("GET", f"{self.base}/blobs/{digest}") as r:
            got, n = sha256_stream(r, dest, limit=size)
        if n > size:
            raise RegistryError(f"{self.url}@{digest}: more than the {size} bytes its descriptor says")
        if n != size or "sha256:" + got != digest:
            raise RegistryError(f"{self.url}@{digest}: {n} bytes hashing to sha256:{got}, not {digest}")

    def tags(self) -> list[str]:
        try:
            with self._open("GET", f"{self.base}/tags/list") as r:
                body = json.loads(r.read(MAX_MANIFEST_BYTES).decode("utf-8"))
        except RegistryError as e:
            if getattr(e, "status", None) == 404:
                return []
            raise
        except ValueError as e:
            raise RegistryError(f"GET {self.base}/tags/list: not JSON ({e})") from None
        tags = body.get("tags") if isinstance(body, dict) else None
        return sorted(t for t in (tags or []) if isinstance(t, str) and _TAG.match(t))
