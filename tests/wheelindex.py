"""Tiny real wheels and a PEP 503 index on loopback for the wheel-set tests (no internet)."""

from __future__ import annotations

import base64
import hashlib
import http.server
import threading
import zipfile
from functools import partial
from pathlib import Path


def make_wheel(dest: Path, name: str, version: str, requires: tuple[str, ...] = (), tag: str = "py3-none-any") -> Path:
    """A minimal valid wheel of `name==version`: one module, METADATA (with Requires-Dist), WHEEL, RECORD."""
    mod = name.replace("-", "_")
    path = Path(dest) / f"{mod}-{version}-{tag}.whl"
    di = f"{mod}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    files = {
        f"{mod}/__init__.py": f"VERSION = {version!r}\n",
        f"{di}/METADATA": meta,
        f"{di}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: {'true' if tag.endswith('any') else 'false'}\nTag: {tag}\n",
    }
    record = []
    for n, t in files.items():
        d = base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{n},sha256={d},{len(t.encode())}")
    record.append(f"{di}/RECORD,,")
    files[f"{di}/RECORD"] = "\n".join(record) + "\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, t in files.items():
            z.writestr(zipfile.ZipInfo(n, (2020, 1, 1, 0, 0, 0)), t)
    return path


def sha256(p: Path) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


class Index:
    """Serve `wheels` as /simple/<project>/ (with #sha256 fragments) on 127.0.0.1; `url` is the /simple/ URL."""

    def __init__(self, www: Path, wheels: list[Path]):
        files = www / "files"
        files.mkdir(parents=True, exist_ok=True)
        projects: dict[str, list[Path]] = {}
        for w in wheels:
            target = files / w.name
            if w.resolve() != target.resolve():
                target.write_bytes(w.read_bytes())
            projects.setdefault(w.name.split("-")[0].replace("_", "-").lower(), []).append(target)
        for proj, ws in projects.items():
            d = www / "simple" / proj
            d.mkdir(parents=True, exist_ok=True)
            links = "".join(f'<a href="../../files/{w.name}#sha256={sha256(w)}">{w.name}</a><br>\n' for w in ws)
            (d / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")

        class Quiet(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(www)))
        self.thread = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/simple/"

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()
        self.thread.join(10)
