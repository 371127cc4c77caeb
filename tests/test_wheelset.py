"""Wheel sets (`kind: wheelset`): resolved by real pip against a loopback index of real wheels, fetched into
the cache by sha256, and checked installed-vs-lock by containers/substrate/check-pins.py on a real install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reprostack import cli
from reprostack.errors import FetchError, LockError
from reprostack.fetch.wheels import fetch_wheels
from reprostack.lock import load
from lockfiles import lock_head
from wheelindex import Index, make_wheel, sha256

REPO_ROOT = Path(__file__).resolve().parents[1]
CHECK_PINS = REPO_ROOT / "containers" / "substrate" / "check-pins.py"


@pytest.fixture
def index(tmp_path, monkeypatch):
    """app 1.0 needs lib==1.0; lib 1.0 and 2.0; tool 1.0 needs lib (any) and helper; helper 1.0."""
    src = tmp_path / "built"
    src.mkdir()
    wheels = {
        "app": make_wheel(src, "app", "1.0", ("lib==1.0",)),
        "lib1": make_wheel(src, "lib", "1.0"),
        "lib2": make_wheel(src, "lib", "2.0"),
        "tool": make_wheel(src, "tool", "1.0", ("lib", "helper")),
        "helper": make_wheel(src, "helper", "1.0"),
    }
    idx = Index(tmp_path / "www", list(wheels.values()))
    for k, v in {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DEFAULT_TIMEOUT": "10",
        "PIP_RETRIES": "0",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }.items():
        monkeypatch.setenv(k, v)
    for k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_CONSTRAINT"):
        monkeypatch.delenv(k, raising=False)
    yield idx, wheels
    idx.close()


def _lock(tmp_path: Path, url: str, base_overrides: str = "[lib==2.0]") -> Path:
    p = tmp_path / "upstreams.lock"
    target = f"""\
    index: {url}
    python-version: "3.11"
    platform-tags: [manylinux_2_17_x86_64]
"""
    p.write_text(
        lock_head()
        + f"""\
  base-set:
    kind: wheelset
{target}    requirements: [app==1.0]
    overrides: {base_overrides}
  top-set:   # a layer: only what base-set lacks
    kind: wheelset
    installed-on: base-set
{target}    requirements: [tool==1.0]
# footer
"""
    )
    return p


def test_fill_resolves_the_closure_applies_overrides_and_layers(tmp_path, index, capsys):
    idx, w = index
    p = _lock(tmp_path, idx.url)
    before = p.read_text()
    assert cli.main(["lock", "wheels", "--lock", str(p), "base-set"]) == 0
    assert cli.main(["lock", "wheels", "--lock", str(p), "top-set"]) == 0
    lock = load(p)  # strict: both sets filled
    base, top = lock.get("base-set"), lock.get("top-set")
    # app's own lib==1.0 was replaced by the override lib 2.0
    assert [(f.name, f.version, f.filename, f.sha256) for f in base.files] == [
        ("app", "1.0", w["app"].name, sha256(w["app"])),
        ("lib", "2.0", w["lib2"].name, sha256(w["lib2"])),
    ]
    # the layer holds only what the base set lacks: lib stays the base's
    assert [(f.name, f.version) for f in top.files] == [("helper", "1.0"), ("tool", "1.0")]
    after = p.read_text()
    strip = lambda t: [ln for ln in t.splitlines() if not ln.startswith(("    files:", "      - name:", "        "))]
    assert strip(after) == strip(before) and after.endswith("# footer\n")
    # --check agrees; a changed hash is named with its line
    assert cli.main(["lock", "wheels", "--lock", str(p), "--check"]) == 0
    bad = after.replace(sha256(w["lib2"]), "f" * 64)
    p.write_text(bad)
    capsys.readouterr()
    assert cli.main(["lock", "wheels", "--lock", str(p), "--check", "base-set"]) == 2
    err = capsys.readouterr().err
    line = next(i for i, ln in enumerate(bad.splitlines(), 1) if "name: lib" in ln)
    assert f"{p}:{line}: upstreams.base-set.files[1]: lock has {w['lib2'].name} sha256 {'f' * 64}" in err


def test_override_that_replaces_nothing_and_unresolved_base_are_errors(tmp_path, index, capsys):
    idx, _ = index
    p = _lock(tmp_path, idx.url, base_overrides="[helper==1.0]")
    before = p.read_text()
    assert cli.main(["lock", "wheels", "--lock", str(p), "base-set"]) == 2
    assert "upstreams.base-set.overrides[0]: helper==1.0: replaces nothing" in capsys.readouterr().err
    assert cli.main(["lock", "wheels", "--lock", str(p), "top-set"]) == 2
    assert "base-set has no files yet: resolve it first" in capsys.readouterr().err
    assert p.read_text() == before  # nothing written


def test_lock_rejects_inconsistent_sets(tmp_path):
    p = tmp_path / "upstreams.lock"
    p.write_text(
        lock_head()
        + f"""\
  s:
    kind: wheelset
    python-version: "3.11"
    platform-tags: [any]
    requirements: [app==1.0]
    files:
      - {{name: app, version: "2.0", filename: app-2.0-py3-none-any.whl, sha256: {"a" * 64}}}
"""
    )
    with pytest.raises(LockError) as ei:
        load(p)
    assert (
        str(ei.value)
        == f"{p}:13: upstreams.s.requirements[0]: app==1.0 but `files` pins app==2.0 (run `reprostack lock wheels s`)"
    )


def test_fetch_wheels_from_a_wheelhouse_the_index_or_not_at_all(tmp_path, index):
    idx, w = index
    p = _lock(tmp_path, idx.url)
    cli.main(["lock", "wheels", "--lock", str(p), "base-set"])
    cli.main(["lock", "wheels", "--lock", str(p), "top-set"])
    lock = load(p)
    # offline with nothing at hand: an error naming the pin and the files
    with pytest.raises(FetchError) as ei:
        fetch_wheels(lock, "base-set", cache_root=tmp_path / "c1", offline=True)
    assert "upstreams.base-set: 2 wheel(s) not in the cache or a wheelhouse" in str(ei.value)
    # a wheelhouse file with other bytes under the pinned name is refused
    house = tmp_path / "house"
    house.mkdir()
    (house / w["app"].name).write_bytes(w["lib1"].read_bytes())
    with pytest.raises(FetchError, match="sha256 .*but .*pins"):
        fetch_wheels(lock, "base-set", cache_root=tmp_path / "c1", wheelhouses=[house], offline=True)
    # from the index (pip download --require-hashes), then from the cache with no index at all
    got = fetch_wheels(lock, "base-set", cache_root=tmp_path / "c2")
    assert [(x.name, sha256(x.path)) for x in got] == [("app", sha256(w["app"])), ("lib", sha256(w["lib2"]))]
    # a cached wheel whose bytes changed on a (shared) disk is re-hashed, removed and fetched again
    tampered = got[0].path
    tampered.write_bytes(tampered.read_bytes() + b"\0")
    fixed = fetch_wheels(lock, "base-set", cache_root=tmp_path / "c2")
    assert sha256(fixed[0].path) == got[0].sha256 == sha256(w["app"])
    idx.close()
    again = fetch_wheels(lock, "base-set", cache_root=tmp_path / "c2", offline=True)
    assert [x.path for x in again] == [x.path for x in got]
    # ... and offline, with no other source, it is an error naming the removed copy, never a wrong wheel
    tampered.write_bytes(b"not a wheel")
    bad = sha256(tampered)
    with pytest.raises(FetchError) as ei:
        fetch_wheels(lock, "base-set", cache_root=tmp_path / "c2", offline=True)
    assert "upstreams.base-set: 1 wheel(s) not in the cache" in str(ei.value)
    assert str(ei.value).endswith(f"the cached {tampered.name} had sha256 {bad} (removed)")
    assert not tampered.exists()


def _pip(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True, text=True, env=env
    )


def test_check_pins_on_a_real_install_names_the_chain(tmp_path, index):
    """Install the set as an image does (--no-index --no-deps --require-hashes), check; then let a later
    install replace a pinned version (as an engine's dependencies would) and the check names who needs it."""
    idx, w = index
    p = _lock(tmp_path, idx.url)
    cli.main(["lock", "wheels", "--lock", str(p), "base-set"])
    cli.main(["lock", "wheels", "--lock", str(p), "top-set"])
    lock = load(p)
    import json

    wheels_dir = tmp_path / "ctx"
    wheels_dir.mkdir()
    pins = []
    for name in ("base-set", "top-set"):
        got = fetch_wheels(lock, name, cache_root=tmp_path / "cache")
        for x in got:
            (wheels_dir / x.filename).write_bytes(x.path.read_bytes())
        req = wheels_dir / f"{name}.txt"
        req.write_text("".join(f"{x.name}=={x.version} --hash=sha256:{x.sha256}\n" for x in got))
        pf = tmp_path / f"{name}.json"
        pf.write_text(json.dumps({"pin": name, "packages": {x.name: x.version for x in got}}))
        pins.append(str(pf))
        cp = _pip(
            "install",
            "--no-index",
            "--find-links",
            str(wheels_dir),
            "--no-deps",
            "--require-hashes",
            "--target",
            str(tmp_path / "site"),
            "--upgrade",
            "-r",
            str(req),
        )
        assert cp.returncode == 0, cp.stderr
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    ok = subprocess.run([sys.executable, "-S", str(CHECK_PINS), *pins], capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    assert "check-pins: base-set: 2 distributions at their pinned versions" in ok.stdout
    # lib 1.0 over the pinned 2.0
    cp = _pip("install", "--no-index", "--no-deps", "--target", str(tmp_path / "site"), "--upgrade", str(w["lib1"]))
    assert cp.returncode == 0, cp.stderr
    bad = subprocess.run([sys.executable, "-S", str(CHECK_PINS), *pins], capture_output=True, text=True, env=env)
    assert bad.returncode == 1
    assert "check-pins: base-set: lib: lock 2.0, installed 1.0" in bad.stderr
    assert "(required by app)" in bad.stderr


def _skew_lock(tmp_path: Path, engine_files: list[tuple[str, str]]) -> Path:
    """A base set pinning torch 2.11.0, its cu13 NCCL and the CUDA 13 runtime; an engine set installed on it
    holding `engine_files` ((name, version), filled as `lock wheels` would write them)."""

    def files(pairs):
        return "".join(
            f'      - {{name: {n}, version: "{v}", filename: {n.replace("-", "_")}-{v}-py3-none-any.whl, '
            f"sha256: {'a' * 64}}}\n"
            for n, v in pairs
        )

    target = '    python-version: "3.10"\n    platform-tags: [manylinux_2_28_x86_64]\n'
    p = tmp_path / "upstreams.lock"
    p.write_text(
        lock_head()
        + "  substrate-wheels:\n    kind: wheelset\n"
        + target
        + "    requirements: [torch==2.11.0]\n    files:\n"
        + files([("nvidia-cuda-runtime", "13.0.96"), ("nvidia-nccl-cu13", "2.30.4"), ("torch", "2.11.0")])
        + "  vllm-wheels:\n    kind: wheelset\n    installed-on: substrate-wheels\n"
        + target
        + f"    requirements: [{engine_files[0][0]}=={engine_files[0][1]}]\n    files:\n"
        + files(engine_files)
    )
    return p


@pytest.mark.parametrize(
    "engine, says",
    [
        (
            [("vllm", "0.24.0"), ("torch", "2.9.0")],
            "upstreams.vllm-wheels.files[1].version: torch==2.9.0 re-pins torch==2.11.0 of substrate-wheels "
            "(installed-on)",
        ),
        (
            [("vllm", "0.24.0"), ("nvidia-nccl-cu12", "2.27.3")],
            "upstreams.vllm-wheels.files[1].name: nvidia-nccl-cu12==2.27.3 adds a second nvidia-nccl next to "
            "nvidia-nccl-cu13==2.30.4 of substrate-wheels (installed-on)",
        ),
        (
            [("vllm", "0.24.0"), ("nvidia-cuda-runtime-cu12", "12.8.90")],
            "adds a second nvidia-cuda-runtime next to nvidia-cuda-runtime==13.0.96 of substrate-wheels",
        ),
        (
            [("cupy-cuda12x", "13.6.0"), ("cupy-cuda13x", "13.6.0")],
            "upstreams.vllm-wheels.files[0].name: cupy-cuda12x==13.6.0 adds a second cupy next to "
            "cupy-cuda13x==13.6.0 of this set",
        ),
    ],
)
def test_lock_check_offline_refuses_an_engine_set_that_skews_its_base(tmp_path, capsys, engine, says):
    """Issue 29 item 3: `lock check` alone (no index, no network) catches an engine wheelset whose files replace the
    base's torch or bring another CUDA build of a native library next to the base's (a second NCCL)."""
    p = _skew_lock(tmp_path, engine)
    with pytest.raises(LockError) as ei:
        load(p)
    assert says in str(ei.value) and str(ei.value).startswith(f"{p}:"), str(ei.value)
    assert cli.main(["lock", "check", "--lock", str(p)]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_a_re_pin_two_levels_down_is_refused(tmp_path, capsys):
    """Issue 39 item 6: a set installed on a set installed on the base (vllm -> middle -> substrate) re-pinning the
    base's torch: the whole `installed-on` chain is read, not only the set right below."""
    p = _skew_lock(tmp_path, [("vllm", "0.24.0"), ("torchvision", "0.26.0")])
    text = p.read_text().replace("    installed-on: substrate-wheels\n", "    installed-on: middle-wheels\n")
    target = '    python-version: "3.10"\n    platform-tags: [manylinux_2_28_x86_64]\n'
    middle = (
        "  middle-wheels:\n    kind: wheelset\n    installed-on: substrate-wheels\n"
        + target
        + "    requirements: [aiperf==0.10.0]\n    files:\n"
        + f'      - {{name: aiperf, version: "0.10.0", filename: aiperf-0.10.0-py3-none-any.whl, sha256: {"b" * 64}}}\n'
    )
    top = text.index("  vllm-wheels:\n")
    p.write_text(text[:top] + middle + text[top:] + f"      - {{name: torch, version: \"2.9.0\", filename: "
                 f"torch-2.9.0-py3-none-any.whl, sha256: {'c' * 64}}}\n")  # fmt: skip
    with pytest.raises(LockError) as ei:
        load(p)
    says = "upstreams.vllm-wheels.files[2].version: torch==2.9.0 re-pins torch==2.11.0 of substrate-wheels"
    assert says in str(ei.value) and str(ei.value).startswith(f"{p}:"), str(ei.value)
    assert cli.main(["lock", "check", "--lock", str(p)]) == 2
    assert says in capsys.readouterr().err


def test_an_engine_set_that_only_adds_is_accepted(tmp_path):
    p = _skew_lock(tmp_path, [("vllm", "0.24.0"), ("torchvision", "0.26.0"), ("nvidia-cutlass-dsl-libs-cu13", "4.3")])
    assert [f.name for f in load(p).get("vllm-wheels").files] == ["vllm", "torchvision", "nvidia-cutlass-dsl-libs-cu13"]


def test_a_requirement_edited_by_hand_is_refilled_by_lock_wheels(tmp_path, index, capsys):
    """`lock wheels PIN` after a requirement is added or moved by hand: its own load takes the stale `files`
    (the strict load names the requirement's line and this command), the fill pins what the requirement says."""
    idx, w = index
    p = _lock(tmp_path, idx.url)
    assert cli.main(["lock", "wheels", "--lock", str(p), "base-set"]) == 0
    assert cli.main(["lock", "wheels", "--lock", str(p), "top-set"]) == 0
    assert [(f.name, f.version) for f in load(p).get("base-set").files] == [("app", "1.0"), ("lib", "2.0")]
    p.write_text(p.read_text().replace("requirements: [app==1.0]", "requirements: [app==1.0, tool==1.0]"))
    with pytest.raises(LockError, match=r"upstreams\.base-set\.requirements\[1\]: tool==1\.0 but `files` pins nothing"):
        load(p)
    capsys.readouterr()
    assert cli.main(["lock", "wheels", "--lock", str(p), "base-set"]) == 0, capsys.readouterr().err
    assert [(f.name, f.version, f.sha256) for f in load(p).get("base-set").files] == [
        ("app", "1.0", sha256(w["app"])),
        ("helper", "1.0", sha256(w["helper"])),
        ("lib", "2.0", sha256(w["lib2"])),
        ("tool", "1.0", sha256(w["tool"])),
    ]
