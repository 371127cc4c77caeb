"""scripts/device/engine_carry.py (through seed_engine.sh): an engine's wheels split here into parts, carried one part
per call, joined on the device only when every wheel's sha256 is the lock's, installed with --no-index --no-deps
beside an interpreter it never writes to, the AIPerf venv made with the marker gates/aiperftool.py accepts.
Real small wheels, a real lock read by reprostack, real bash and pip, parts of 3000 bytes."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from reprostack.lock import load

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = ("seed_engine.sh", "engine_carry.py")


def wheel(dest: Path, name: str, version: str, size: int = 2500, script: str | None = None) -> Path:
    """A real installable wheel of `name==version` with `size` bytes of incompressible data (and a console script)."""
    mod = name.replace("-", "_")
    di = f"{mod}-{version}.dist-info"
    files = {
        f"{mod}/__init__.py": f"VERSION = {version!r}\ndef main():\n    print('{name} ' + VERSION)\n",
        f"{mod}/blob.bin": os.urandom(size).hex()[:size],
        f"{di}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{di}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    if script:
        files[f"{di}/entry_points.txt"] = f"[console_scripts]\n{script} = {mod}:main\n"
    record = [
        f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(t.encode())}"
        for n, t in files.items()
    ] + [f"{di}/RECORD,,"]
    files[f"{di}/RECORD"] = "\n".join(record) + "\n"
    path = dest / f"{mod}-{version}-py3-none-any.whl"
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for n, t in files.items():
            z.writestr(zipfile.ZipInfo(n, (2020, 1, 1, 0, 0, 0)), t)
    return path


def wheelset(pin: str, wheels: list[tuple[str, str, Path]], on: str | None = None) -> str:
    text = f"  {pin}:\n    kind: wheelset\n" + (f"    installed-on: {on}\n" if on else "")
    text += '    python-version: "3.12"\n    platform-tags: [manylinux_2_28_x86_64]\n'
    text += f"    requirements: [{wheels[0][0]}=={wheels[0][1]}]\n"
    text += "    files:\n"
    for name, version, path in wheels:
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        text += f'      - name: {name}\n        version: "{version}"\n        filename: {path.name}\n'
        text += f"        sha256: {sha}\n"
    return text


RECIPE = """# test recipe
pin eng-wheels site
pin tool-wheels aiperf
have eng-wheels packaging 26.4 -- this interpreter has it
omit eng-wheels bigdep -- never imported
"""


@pytest.fixture
def project(tmp_path):
    """(here, device, house): a project root with a lock of three wheelset pins and the recipe, and an empty
    device copy of it (scripts + lock + recipe, no wheels)."""
    house = tmp_path / "house"
    base = [("pyyaml", "6.0.3", wheel(tmp_path / "base", "pyyaml", "6.0.3", 10))]
    eng = [
        ("enga", "1.0", wheel(house, "enga", "1.0", 5000)),
        ("engb", "2.0", wheel(house, "engb", "2.0", 7000)),
        ("shared", "1.0", wheel(house, "shared", "1.0", 1200)),
        ("packaging", "26.4", wheel(tmp_path / "not-carried", "packaging", "26.4", 10)),
        ("bigdep", "9.0", wheel(tmp_path / "not-carried", "bigdep", "9.0", 10)),
    ]
    tool = [("aiperf", "0.10.0", wheel(house, "aiperf", "0.10.0", 3000, script="aiperf")), eng[2]]
    lock = "lockfile-version: 1\nupstreams:\n" + wheelset("base-wheels", base)
    lock += wheelset("eng-wheels", eng, on="base-wheels") + wheelset("tool-wheels", tool)
    here = tmp_path / "here"
    for root in (here, tmp_path / "device"):
        (root / "scripts" / "device" / "carry").mkdir(parents=True)
        for s in SCRIPTS:
            shutil.copy(REPO / "scripts" / "device" / s, root / "scripts" / "device" / s)
        (root / "upstreams.lock").write_text(lock)
        (root / "scripts" / "device" / "carry" / "eng.txt").write_text(RECIPE)
    (here / "src").symlink_to(REPO / "src")
    load(here / "upstreams.lock")  # a lock reprostack itself accepts
    return here, tmp_path / "device", house


def sh(root: Path, *args: str, **env) -> subprocess.CompletedProcess:
    e = {**os.environ, "PYTHON": sys.executable, "REPROSTACK_TORCH_PYTHON": sys.executable, **env}
    return subprocess.run(
        ["bash", "scripts/device/seed_engine.sh", *args], cwd=root, env=e, capture_output=True, text=True, timeout=300
    )


def split(here: Path, house: Path, tmp: Path) -> dict:
    p = sh(here, "split", "eng", "--part-bytes", "3000", "--record", str(tmp / "rec.json"), "--cache", str(tmp / "c"),
           REPROSTACK_WHEELHOUSE=str(house))  # fmt: skip
    assert p.returncode == 0, p.stderr
    return json.loads((tmp / "rec.json").read_text())


def carry(here: Path, dev: Path, i: int) -> subprocess.CompletedProcess:
    shutil.copytree(here / f".e{i}", dev / f".e{i}")
    p = sh(dev, "receive")
    shutil.rmtree(dev / f".e{i}")  # the next call carries only the next part
    return p


def test_parts_travel_one_per_call_join_checked_and_install_beside_the_interpreter(project, tmp_path):
    here, dev, house = project
    rec = split(here, house, tmp_path)
    sizes = {p.name: p.stat().st_size for p in house.iterdir()}
    assert rec["wheels"] == 4 and rec["bytes"] == sum(sizes.values())  # shared carried once; have/omit not at all
    assert rec["have"] == ["packaging==26.4"] and rec["omitted"] == 1 and rec["base"] == ["base-wheels"]
    parts = sorted(here.glob(".e*"), key=lambda p: int(p.name[2:]))
    assert len(parts) == rec["parts"] >= 3 and all((p / "part").stat().st_size <= 3000 for p in parts)
    for i in range(1, len(parts) + 1):
        p = carry(here, dev, i)
        assert p.returncode == 0, p.stderr
        if i < len(parts):
            assert f"still missing part(s) {' '.join(str(k) for k in range(i + 1, len(parts) + 1))}" in p.stdout
    assert "joined" in p.stdout and "each sha256 as upstreams.lock pins" in p.stdout
    wh = dev / ".cache" / "wheelhouse"
    assert sorted(x.name for x in wh.iterdir()) == sorted(sizes)
    for f in wh.iterdir():
        assert f.read_bytes() == (house / f.name).read_bytes()
    site, venv = tmp_path / "site", tmp_path / "aipv"
    p = sh(dev, "install", "eng", str(site), str(venv))
    assert p.returncode == 0, p.stderr
    assert "4 wheels re-hashed: each as upstreams.lock pins" in p.stdout
    assert sorted(d.name for d in site.glob("*.dist-info")) == [
        "enga-1.0.dist-info",
        "engb-2.0.dist-info",
        "shared-1.0.dist-info",
    ]
    marker = json.loads((venv / ".reprostack-verified.json").read_text())
    assert marker["version"] == "0.10.0" and marker["wheel"] == "aiperf-0.10.0-py3-none-any.whl"
    out = subprocess.run([str(venv / "bin" / "aiperf")], capture_output=True, text=True)
    assert out.stdout.strip() == "aiperf 0.10.0"
    from reprostack.gates import aiperftool

    pin = load(dev / "upstreams.lock").get("tool-wheels")
    tool = aiperftool._prebuilt(venv, type("P", (), {"version": "0.10.0"})(), {f.sha256: f.filename for f in pin.files})
    assert tool.sha256 == marker["sha256"]


def test_a_torn_part_a_forged_plan_or_a_wheel_not_the_locks_is_one_line_and_places_nothing(project, tmp_path):
    here, dev, house = project
    split(here, house, tmp_path)
    shutil.copytree(here / ".e1", dev / ".e1")
    with open(dev / ".e1" / "part", "r+b") as f:
        f.write(b"X")
    p = sh(dev, "receive")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "/.e1/part: sha256 differs from its meta" in p.stderr
    shutil.rmtree(dev / ".e1")
    shutil.copytree(here / ".e1", dev / ".e1")
    (dev / ".e1" / "plan.json").write_text((dev / ".e1" / "plan.json").read_text().replace("enga", "engz"))
    p = sh(dev, "receive")
    assert p.returncode == 2 and "/.e1/plan.json: sha256 is not the carry id" in p.stderr
    shutil.rmtree(dev / ".e1")
    # the device's lock pins other bytes for enga: the join stops at it, nothing of the carry is placed
    lock = (dev / "upstreams.lock").read_text()
    sha = hashlib.sha256((house / "enga-1.0-py3-none-any.whl").read_bytes()).hexdigest()
    (dev / "upstreams.lock").write_text(lock.replace(sha, "0" * 64))
    for i in range(1, len(list(here.glob(".e*"))) + 1):
        p = carry(here, dev, i)
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert f"the plan says sha256 {sha}, upstreams.lock pins {'0' * 64}" in p.stderr
    assert not list((dev / ".cache" / "wheelhouse").glob("enga*"))


def test_a_forged_carry_id_and_plan_or_a_bad_meta_are_refused(project, tmp_path):
    here, dev, house = project
    split(here, house, tmp_path)
    shutil.copytree(here / ".e1", dev / ".e1")
    plan = json.loads((dev / ".e1" / "plan.json").read_text())
    plan["wheels"][0]["filename"] = "../../escape.whl"
    text = (json.dumps(plan) + "\n").encode()
    cid = hashlib.sha256(text).hexdigest()
    (dev / ".e1" / "plan.json").write_bytes(text)
    meta = (dev / ".e1" / "meta").read_text().split()
    (dev / ".e1" / "meta").write_text(f"{cid} {meta[1]} {meta[2]} {meta[3]}\n")
    p = sh(dev, "receive")
    assert p.returncode == 2 and "not a carry plan (bad wheel entry '../../escape.whl')" in p.stderr
    for bad in (f"{cid} 0 1 {meta[3]}", f"{cid} 2 3 {meta[3]}", "x y z", f"{cid} 01 1 {meta[3]}"):
        (dev / ".e1" / "meta").write_text(bad + "\n")
        p = sh(dev, "receive")
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and "/.e1/meta: " in p.stderr, bad
    assert not (dev / ".cache" / "wheelhouse").exists() or not list((dev / ".cache" / "wheelhouse").iterdir())


def test_install_rehashes_and_checks_what_it_counts_on_before_pip(project, tmp_path):
    here, dev, house = project
    split(here, house, tmp_path)
    for i in range(1, len(list(here.glob(".e*"))) + 1):
        assert carry(here, dev, i).returncode == 0
    wh = dev / ".cache" / "wheelhouse" / "engb-2.0-py3-none-any.whl"
    good = wh.read_bytes()
    wh.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    p = sh(dev, "install", "eng", str(tmp_path / "site"), str(tmp_path / "v"))
    assert p.returncode == 2 and f"{wh}: sha256 " in p.stderr and "upstreams.lock pins" in p.stderr
    assert not (tmp_path / "site").exists()
    wh.write_bytes(good)
    recipe = dev / "scripts" / "device" / "carry" / "eng.txt"
    plan_dir = next((dev / ".cache" / "engine-parts").iterdir())
    plan = json.loads((plan_dir / "plan.json").read_text())
    plan["have"][0]["version"] = "1.0"  # what the interpreter does not have
    (plan_dir / "plan.json").write_text(json.dumps(plan))
    p = sh(dev, "install", "eng", str(tmp_path / "site"), str(tmp_path / "v"))
    assert p.returncode == 2 and "has packaging 26.4, the carry assumed 1.0" in p.stderr, p.stderr
    assert recipe.is_file() and not (tmp_path / "site").exists()


@pytest.mark.parametrize(
    "line, says",
    [
        ("frobnicate eng-wheels x", ":6: not a directive"),
        ("omit eng-wheels bigdep", ":6: not a directive"),  # no reason
        ("omit other-wheels x -- why", ":6: pin 'other-wheels' has no `pin` line above"),
        ("omit eng-wheels nosuch -- why", "omit eng-wheels nosuch: nosuch is not a distribution of eng-wheels"),
        ("have eng-wheels enga 0.9 -- said so", "have eng-wheels enga 0.9: eng-wheels pins enga 1.0"),
        ("have tool-wheels aiperf 0.10.0 -- x", "only a `site` pin can count on the torch venv's packages"),
    ],
)
def test_a_bad_recipe_line_is_one_line_naming_it(project, tmp_path, line, says):
    here, _, house = project
    recipe = here / "scripts" / "device" / "carry" / "eng.txt"
    recipe.write_text(RECIPE + line + "\n")
    p = sh(here, "split", "eng", "--part-bytes", "3000", "--cache", str(tmp_path / "c"),
           REPROSTACK_WHEELHOUSE=str(house))  # fmt: skip
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and says in p.stderr, p.stderr
    assert not list(here.glob(".e*"))


def test_the_vllm_recipe_names_only_distributions_of_its_pins():
    lock = load(REPO / "upstreams.lock")
    sys.path.insert(0, str(REPO / "scripts" / "device"))
    try:
        import engine_carry
    finally:
        sys.path.pop(0)
    recipe = engine_carry.read_recipe(REPO / "scripts" / "device" / "carry" / "vllm.txt")
    carried, omitted, have, base = engine_carry.select(lock, recipe)
    assert {o["name"] for o in omitted} >= {"flashinfer-cubin", "flashinfer-python", "opencv-python-headless"}
    assert {h["name"] for h in have} == {"torchvision", "torchaudio", "safetensors", "tiktoken"}
    names = {w["name"] for w in carried}
    assert {"vllm", "aiperf", "transformers", "xgrammar", "pyarrow"} <= names and "torch" not in names
    assert {b["name"] for b in base} >= {"torch", "triton", "nvidia-nccl-cu13"}
    assert len({w["sha256"] for w in carried}) == len(carried)
