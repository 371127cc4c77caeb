"""`reprostack lock wheels`: real pip against a real PEP 503 index served on loopback, real wheels built here.

No internet: the index is an http.server on 127.0.0.1 in a thread; pip's config files are switched off.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import threading
from functools import partial
from pathlib import Path

import pytest

from reprostack import cli
from reprostack.lock import load
from lockfiles import lock_head
from wheelindex import make_wheel


def _wheel(dest: Path, name: str, version: str, tag: str = "py3-none-any") -> Path:
    return make_wheel(dest, name, version, tag=tag)


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def index(tmp_path, monkeypatch):
    """Serve tmp/www: /simple/<name>/ with #sha256= fragments, /nohash/<name>/ without; yields (url, wheels)."""
    www = tmp_path / "www"
    files = www / "files"
    files.mkdir(parents=True)
    wheels = {
        "demo": _wheel(files, "demo-pkg", "1.0"),
        "demo2": _wheel(files, "demo-pkg", "2.0"),
        "linux": _wheel(files, "plat-pkg", "3.1", "cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64"),
        "win": _wheel(files, "plat-pkg", "3.1", "cp311-cp311-win_amd64"),
    }
    for simple, frag in (("simple", True), ("nohash", False)):
        for proj in ("demo-pkg", "plat-pkg"):
            d = www / simple / proj
            d.mkdir(parents=True)
            links = "".join(
                f'<a href="../../files/{w.name}{"#sha256=" + _sha(w) if frag else ""}">{w.name}</a><br>\n'
                for w in wheels.values()
                if w.name.startswith(proj.replace("-", "_") + "-")
            )
            (d / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(www)))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "10")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    for k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(k, raising=False)
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", wheels
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(10)


REV = "b306af06afd412c88e51e71802951606e40b7358"
TREE = "186344a19c36d5dceb2c386fb0b6b0a2f08e9e75"


def _lock(tmp_path: Path, url: str, version: str = "1.0", simple: str = "simple") -> Path:
    p = tmp_path / "upstreams.lock"
    p.write_text(
        lock_head(REV, TREE)
        + f"""\
  # the demo wheel, resolved by `reprostack lock wheels`
  demo:
    kind: wheel
    name: demo-pkg
    version: "{version}"
    index: {url}/{simple}/
    files:
      - filename: demo_pkg-{version}-py2-none-any.whl  # stale (another tag of the pinned version): rewritten
        sha256: {"a" * 64}
    # comment after files stays
  plat:
    kind: wheel
    name: plat-pkg
    version: "3.1"
    index: {url}/{simple}/
    python-version: "3.11"
    platforms: [manylinux2014_x86_64, win_amd64]
# footer comment
"""
    )
    return p


def _lines_without_files(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if "filename:" not in ln and "sha256:" not in ln and ln.strip() != "files:"]


def test_fill_then_check(tmp_path, index, capsys):
    url, wheels = index
    p = _lock(tmp_path, url)
    before = p.read_text()
    assert cli.main(["lock", "wheels", "--lock", str(p)]) == 0
    after = p.read_text()
    lock = load(p)  # the strict load: every wheel pin is filled
    demo, plat = lock.get("demo"), lock.get("plat")
    assert [(f.filename, f.sha256) for f in demo.files] == [(wheels["demo"].name, _sha(wheels["demo"]))]
    assert sorted((f.filename, f.sha256) for f in plat.files) == sorted(
        (wheels[k].name, _sha(wheels[k])) for k in ("linux", "win")
    )
    # every line outside the files blocks is byte for byte the same, comments included
    assert _lines_without_files(after) == _lines_without_files(before)
    assert "    # comment after files stays\n  plat:" in after
    assert after.endswith("# footer comment\n")
    assert f"    files:\n      - filename: {wheels['demo'].name}\n        sha256: {_sha(wheels['demo'])}\n" in after

    capsys.readouterr()
    assert cli.main(["lock", "wheels", "--check", "--lock", str(p)]) == 0
    assert "2 wheel pin(s) match the index" in capsys.readouterr().out
    assert cli.main(["lock", "wheels", "--lock", str(p)]) == 0  # idempotent
    assert p.read_text() == after


def test_check_names_line_and_pin_on_a_tampered_hash(tmp_path, index, capsys):
    url, wheels = index
    p = _lock(tmp_path, url)
    assert cli.main(["lock", "wheels", "--lock", str(p)]) == 0
    good = _sha(wheels["demo"])
    tampered = p.read_text().replace(good, "f" * 64)
    p.write_text(tampered)
    line = next(i for i, ln in enumerate(tampered.splitlines(), 1) if "f" * 64 in ln)
    capsys.readouterr()
    assert cli.main(["lock", "wheels", "--check", "--lock", str(p), "demo"]) == 2
    err = capsys.readouterr().err
    assert (
        f"{p}:{line}: upstreams.demo.files[0].sha256: {wheels['demo'].name}: lock has {'f' * 64}, the index serves {good}"
        in err
    )
    assert p.read_text() == tampered  # --check writes nothing


def test_check_of_the_stale_lock_fails(tmp_path, index, capsys):
    url, wheels = index
    p = _lock(tmp_path, url)
    before = p.read_bytes()
    assert cli.main(["lock", "wheels", "--check", "--lock", str(p)]) == 2
    err = capsys.readouterr().err
    assert f"{p}:16: upstreams.demo.files[0].filename: demo_pkg-1.0-py2-none-any.whl is not what pip resolves" in err
    assert f"upstreams.demo.files: {wheels['demo'].name}" in err and "missing from the lock" in err
    assert f"{p}:19: upstreams.plat: no files pinned" in err
    assert p.read_bytes() == before


def test_unknown_version_is_an_error_and_nothing_is_written(tmp_path, index, capsys):
    url, _ = index
    p = _lock(tmp_path, url, version="9.9")
    before = p.read_bytes()
    assert cli.main(["lock", "wheels", "--lock", str(p)]) == 2
    err = capsys.readouterr().err
    assert f"{p}:13: upstreams.demo.version: demo-pkg==9.9: pip found no matching wheel" in err
    assert p.read_bytes() == before


def test_index_without_hashes_downloads_and_hashes(tmp_path, index):
    url, wheels = index
    p = _lock(tmp_path, url, version="2.0", simple="nohash")
    assert cli.main(["lock", "wheels", "--lock", str(p), "demo"]) == 0
    demo = load(p, allow_unfilled=True).get("demo")
    assert [(f.filename, f.sha256) for f in demo.files] == [(wheels["demo2"].name, _sha(wheels["demo2"]))]
    assert not load(p, allow_unfilled=True).get("plat").files  # only the named pin was touched


def test_lock_check_rejects_an_unfilled_wheel_pin(tmp_path, index, capsys):
    url, _ = index
    p = _lock(tmp_path, url)
    assert cli.main(["lock", "check", "--lock", str(p)]) == 2
    assert f"{p}:19: upstreams.plat: 'files' is a required property" in capsys.readouterr().err


@pytest.mark.parametrize(
    "tail",
    [
        "..%2F..%2Fevil-1.0-py3-none-any.whl",
        "sub%2Fevil-1.0-py3-none-any.whl",
        "evil.whl",
        "..%5Cevil-1.0-py3-none-any.whl",
    ],
)
def test_a_wheel_filename_from_a_pip_report_must_be_a_bare_wheel_filename(tail):
    """An index's URL decides the filename the lock records and the cache writes: a quoted `/`, `\\` or `..`, or
    a name that is not NAME-VER-PY-ABI-PLAT.whl, is refused (issue 14 item 10)."""
    from reprostack.lock import pip
    from reprostack.errors import ReprostackError

    item = {"metadata": {"name": "evil", "version": "1.0"}, "download_info": {"url": f"https://idx.invalid/p/{tail}"}}
    with pytest.raises(
        ReprostackError,
        match=r"^upstreams.lock:3: upstreams.x: evil==1.0 resolves to .*(not a bare "
        r"file name|not a wheel filename)",
    ):
        pip.report_wheel(item, "upstreams.lock:3: upstreams.x")


def test_an_unresolved_pin_loads_and_lock_wheels_fills_it_dropping_the_mark(tmp_path, index, capsys):
    """`unresolved: WHERE` is the explicit form of a pin whose sha256 cannot be had here (TRT-LLM's wheel): the
    strict load accepts it (files empty, the reason kept); with `files` too it is an error naming the line;
    `lock wheels` fills it from the index and drops the mark, every other line unchanged."""
    url, wheels = index
    p = _lock(tmp_path, url)
    text = p.read_text().replace(
        "    platforms: [manylinux2014_x86_64, win_amd64]\n",
        "    platforms: [manylinux2014_x86_64, win_amd64]\n"
        "    unresolved: where the index is reachable  # kept until filled\n",
    )
    p.write_text(text)
    lock = load(p)
    plat = lock.get("plat")
    assert plat.files == () and plat.unresolved == "where the index is reachable"
    assert cli.main(["lock", "check", "--lock", str(p)]) == 0
    assert cli.main(["lock", "wheels", "plat", "--lock", str(p)]) == 0
    after = p.read_text()
    assert "unresolved" not in after
    assert sorted(f.filename for f in load(p).get("plat").files) == sorted(wheels[k].name for k in ("linux", "win"))
    assert [l for l in _lines_without_files(after)] == [l for l in _lines_without_files(text) if "unresolved" not in l]
    # both `files` and `unresolved`: refused, naming the pin
    p.write_text(after.replace('    python-version: "3.11"\n', '    python-version: "3.11"\n    unresolved: stale\n'))
    capsys.readouterr()
    assert cli.main(["lock", "check", "--lock", str(p)]) == 2
    err = capsys.readouterr().err
    line = next(i for i, l in enumerate(p.read_text().splitlines(), 1) if "unresolved: stale" in l)
    assert err.strip() == (
        f"reprostack: error: {p}:{line}: upstreams.plat.unresolved: a pin with `files` is resolved: "
        "drop `unresolved` (`lock wheels` does when it fills)"
    )
