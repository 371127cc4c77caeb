"""Where kernel cache entries are kept: an OCI registry (`oci://HOST/NAME`), a folder (a path or `file://`), or a
read-only web folder (`http(s)://...`, e.g. an S3 bucket behind HTTPS or `python3 -m http.server` over a folder).

Every store holds, per build key, the entry's signed envelope (the manifest inside it) and its files by sha256:
- folder / web: `<root>/<key>/envelope.json` and `<root>/<key>/blobs/<sha256>`;
- OCI (ORAS-style artifact, tag = the build key): an image manifest with `artifactType` ARTIFACT_TYPE, the envelope
  as its config blob (ENVELOPE_TYPE) and each file as a layer (FILE_TYPE, `org.opencontainers.image.title` = path).
The store is a carrier only: what an entry holds is what its signed manifest says (kernels.cache checks it).

Invariants: a read is bounded (MAX_ENVELOPE_BYTES; a blob by the size the manifest gives) and a blob is hashed on the
way (the caller gets it only whole and right); a folder entry is written into a temporary folder and renamed whole;
a missing entry is `None`, an unreachable or broken store is StoreError.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from ..digest import sha256_stream
from ..errors import ReprostackError
from ..lock.images import RegistryError
from . import oci

ARTIFACT_TYPE = "application/vnd.reprostack.kernels.v1"
ENVELOPE_TYPE = "application/vnd.dsse.envelope.v1+json"
FILE_TYPE = "application/vnd.reprostack.kernels.file.v1"
MAX_ENVELOPE_BYTES = 4 << 20
KEY = re.compile(r"^[0-9a-f]{64}$")
TITLE = "org.opencontainers.image.title"


class StoreError(ReprostackError):
    """A store could not be read or written (unreachable, refused, broken): names the store and why."""


class StoreRefused(StoreError):
    """What a store holds under a key is not a kernel cache entry (an envelope over the bound, an OCI manifest of
    another artifact type or config): the entry is refused, as a bad signature is."""


def _copy_hashed(src, dest, size: int, sha256: str, where: str) -> None:
    got, n = sha256_stream(src, dest, limit=size)
    if n > size:
        raise StoreError(f"{where}: more than the {size} bytes the manifest says")
    if n != size or got != sha256:
        raise StoreError(f"{where}: {n} bytes hashing to {got}, not the manifest's {size} bytes {sha256}")


class FolderStore:
    """A folder of entries (also what `file://PATH` names)."""

    def __init__(self, root: Path):
        self.root, self.url = Path(root), str(root)

    def envelope(self, key: str) -> bytes | None:
        p = self.root / key / "envelope.json"
        try:
            if not p.is_file():
                return None
            with open(p, "rb") as f:
                body = f.read(MAX_ENVELOPE_BYTES + 1)
        except OSError as e:
            raise StoreError(f"{p}: {e.strerror or e}") from None
        if len(body) > MAX_ENVELOPE_BYTES:
            raise StoreRefused(f"{p}: over {MAX_ENVELOPE_BYTES} bytes")
        return body

    def blob(self, key: str, sha256: str, size: int, dest) -> None:
        p = self.root / key / "blobs" / sha256
        try:
            with open(p, "rb") as f:
                _copy_hashed(f, dest, size, sha256, str(p))
        except OSError as e:
            raise StoreError(f"{p}: {e.strerror or e}") from None

    def put(self, key: str, envelope: bytes, files: list[tuple[Path, str, str, int]]) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", dir=self.root))
        try:
            (tmp / "blobs").mkdir()
            for src, _, sha, _ in files:
                if not (tmp / "blobs" / sha).exists():
                    shutil.copyfile(src, tmp / "blobs" / sha)
            (tmp / "envelope.json").write_bytes(envelope)
            os.chmod(tmp, 0o755)
            old = self.root / key
            if old.exists():
                shutil.rmtree(old)
            os.replace(tmp, old)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise StoreError(f"{self.root}: cannot write entry {key[:16]}: {e.strerror or e}") from None
        return str(self.root / key)

    def keys(self) -> list[str]:
        try:
            return sorted(p.name for p in self.root.iterdir() if KEY.match(p.name))
        except OSError:
            return []


class WebStore:
    """A read-only web folder laid out as FolderStore's."""

    def __init__(self, url: str, timeout: float = oci.TIMEOUT_S):
        self.url, self.timeout = url.rstrip("/"), timeout

    def _get(self, path: str):
        url = f"{self.url}/{path}"
        try:
            return urllib.request.urlopen(urllib.request.Request(url), timeout=self.timeout)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise StoreError(f"GET {url}: HTTP {e.code}") from None
        except (OSError, ValueError) as e:
            raise StoreError(f"GET {url}: {getattr(e, 'reason', None) or e}") from None

    def envelope(self, key: str) -> bytes | None:
        r = self._get(f"{key}/envelope.json")
        if r is None:
            return None
        with r:
            body = r.read(MAX_ENVELOPE_BYTES + 1)
        if len(body) > MAX_ENVELOPE_BYTES:
            raise StoreRefused(f"{self.url}/{key}/envelope.json: over {MAX_ENVELOPE_BYTES} bytes")
        return body

    def blob(self, key: str, sha256: str, size: int, dest) -> None:
        r = self._get(f"{key}/blobs/{sha256}")
        if r is None:
            raise StoreError(f"{self.url}/{key}/blobs/{sha256}: not found")
        with r:
            try:
                _copy_hashed(r, dest, size, sha256, f"{self.url}/{key}/blobs/{sha256}")
            except OSError as e:
                raise StoreError(f"{self.url}/{key}/blobs/{sha256}: {e}") from None

    def put(self, key: str, envelope: bytes, files) -> str:
        raise StoreError(f"{self.url}: a web folder is read-only here (push to a folder and serve that)")

    def keys(self) -> list[str]:
        raise StoreError(f"{self.url}: a web folder has no listing here; name the keys to pull")


class OciStore:
    """A repository of an OCI registry; an entry is the artifact tagged with its build key."""

    def __init__(self, url: str):
        try:
            self.repo = oci.Repo(url)
        except RegistryError as e:
            raise StoreError(str(e)) from None
        self.url = url

    def _manifest(self, key: str) -> dict | None:
        body = self.repo.get_manifest(key)
        if body is None:
            return None
        try:
            m = json.loads(body.decode("utf-8"))
        except (ValueError, RecursionError) as e:
            raise StoreRefused(f"{self.url}:{key}: the OCI manifest is not JSON ({type(e).__name__})") from None
        cfg = m.get("config") if isinstance(m, dict) else None
        if not isinstance(cfg, dict) or m.get("artifactType") != ARTIFACT_TYPE:
            raise StoreRefused(f"{self.url}:{key}: not a kernel cache artifact (artifactType is not {ARTIFACT_TYPE})")
        return m

    def envelope(self, key: str) -> bytes | None:
        try:
            m = self._manifest(key)
            if m is None:
                return None
            cfg = m["config"]
            size = cfg.get("size")
            if cfg.get("mediaType") != ENVELOPE_TYPE or not isinstance(size, int) or not 0 < size <= MAX_ENVELOPE_BYTES:
                raise StoreRefused(f"{self.url}:{key}: its config is not a signed envelope ({ENVELOPE_TYPE})")
            import io

            buf = io.BytesIO()
            self.repo.get_blob(str(cfg.get("digest")), size, buf)
            return buf.getvalue()
        except RegistryError as e:
            raise StoreError(str(e)) from None

    def blob(self, key: str, sha256: str, size: int, dest) -> None:
        try:
            self.repo.get_blob(f"sha256:{sha256}", size, dest)
        except RegistryError as e:
            raise StoreError(str(e)) from None

    def put(self, key: str, envelope: bytes, files: list[tuple[Path, str, str, int]]) -> str:
        env_digest = "sha256:" + hashlib.sha256(envelope).hexdigest()
        layers, seen = [], set()
        try:
            self.repo.push_blob(envelope, env_digest, len(envelope))
            for src, rel, sha, size in files:
                if sha not in seen:
                    self.repo.push_blob(src, f"sha256:{sha}", size)
                    seen.add(sha)
                layers.append(
                    {
                        "mediaType": FILE_TYPE,
                        "digest": f"sha256:{sha}",
                        "size": size,
                        "annotations": {TITLE: rel},
                    }
                )
            manifest = {
                "schemaVersion": 2,
                "mediaType": oci.MANIFEST_TYPE,
                "artifactType": ARTIFACT_TYPE,
                "config": {"mediaType": ENVELOPE_TYPE, "digest": env_digest, "size": len(envelope)},
                "layers": layers,
                "annotations": {"org.opencontainers.image.description": f"reprostack kernel build {key}"},
            }
            body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
            digest = self.repo.put_manifest(key, body)
        except RegistryError as e:
            raise StoreError(str(e)) from None
        return f"{self.url}:{key}@{digest}"

    def keys(self) -> list[str]:
        try:
            return [t for t in self.repo.tags() if KEY.match(t)]
        except RegistryError as e:
            raise StoreError(str(e)) from None


def open_store(url: str):
    """The store `url` names: `oci://HOST/NAME`, `http(s)://...`, `file://PATH` or a path."""
    if url.startswith("oci://"):
        return OciStore(url)
    if url.startswith(("http://", "https://")):
        return WebStore(url)
    if url.startswith("file://"):
        return FolderStore(Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)))
    if "://" in url:
        raise StoreError(f"{url}: not a kernel cache (oci://HOST/NAME, http(s)://URL, file://PATH or a folder)")
    return FolderStore(Path(url))
