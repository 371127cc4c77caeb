"""scripts/cubins.py (issue 26 item 4): the device-code record of a build folder and the per-kernel comparison, on
real files: a JIT cache laid out as DeepEP writes it, and a shared object given a `.nv_fatbin` section by objcopy
(the cuobjdump extraction itself needs the CUDA toolkit and runs on the H200: scripts/device/cubins.sh)."""

from __future__ import annotations

import importlib.util
import hashlib
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("cubins", ROOT / "scripts" / "cubins.py")
cubins = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cubins)


def _cache(root: Path, kernels: dict) -> Path:
    for name, (cu, cubin) in kernels.items():
        d = root / "cache" / name
        d.mkdir(parents=True)
        (d / "kernel.cu").write_text(cu)
        (d / "kernel.cubin").write_bytes(cubin)
    return root


def test_record_and_compare_jit_cubins_per_kernel(tmp_path, capsys):
    a = _cache(tmp_path / "a", {"kernel.dispatch.1a": ("d", b"\x7fELF-d"), "kernel.combine.2b": ("c", b"\x7fELF-c")})
    # the same kernels in another folder (the digest hashes the flags, whose include paths differ): joined by code
    b = _cache(tmp_path / "b", {"kernel.dispatch.9f": ("d", b"\x7fELF-d"), "kernel.combine.8e": ("c", b"\x7fELF-X")})
    (b / "cache" / "kernel.barrier.3c").mkdir()
    (b / "cache" / "kernel.barrier.3c" / "kernel.cubin").write_bytes(b"b")
    for d, label in ((a, "host"), (b, "image")):
        assert cubins.main(["record", "--no-so", "--label", label, str(d)]) == 0
        (tmp_path / f"{label}.json").write_text(capsys.readouterr().out)
    rec = json.loads((tmp_path / "host.json").read_text())
    assert [j["key"] for j in rec["jit"]] == ["kernel.combine.2b", "kernel.dispatch.1a"]
    assert cubins.main(["compare", str(tmp_path / "host.json"), str(tmp_path / "image.json")]) == 0
    table = capsys.readouterr().out
    assert table.startswith("1 of 3 cubins identical (host vs image)")
    d, c = hashlib.sha256(b"d").hexdigest()[:16], hashlib.sha256(b"c").hexdigest()[:16]
    assert f"| `jit:dispatch:{d}` |" in table and "| identical |" in table
    assert f"`jit:combine:{c}`" in table and "| differs |" in table and "only in image" in table
    assert cubins.main(["record", "--no-so", "--label", "x", str(tmp_path / "nope")]) == 2


@pytest.mark.skipif(shutil.which("objcopy") is None or shutil.which("g++") is None, reason="needs binutils and g++")
def test_a_shared_object_is_found_by_its_nv_fatbin_section(tmp_path):
    src = tmp_path / "x.cpp"
    src.write_text("int f() { return 1; }\n")
    so = tmp_path / "_C.cpython-311-x86_64-linux-gnu.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    assert not cubins._has_fatbin(so)
    (tmp_path / "blob").write_bytes(b"\x50\xed\x55\xba" + b"\0" * 12)
    fat = tmp_path / "fat.so"
    subprocess.run(["objcopy", "--add-section", f".nv_fatbin={tmp_path / 'blob'}", str(so), str(fat)], check=True)
    assert cubins._has_fatbin(fat) and not cubins._has_fatbin(src)


def test_the_c_extension_of_two_cpythons_is_joined_by_kernel(tmp_path):
    """The host build is `_C.cpython-312-...so` (the H200's Python 3.12), the image's `_C.cpython-311-...so`
    (Debian 12's 3.11): the device code does not depend on the Python, so their cubins are joined by index and
    arch, not left as `only in` one build."""

    def rec(label, abi, sha):
        so = f"_C.cpython-{abi}-x86_64-linux-gnu"
        cub = {"arch": "sm_90", "cubin": f"{so}.1.sm_90.cubin", "key": f"{so}.so:{so}.1.sm_90.cubin", "sha256": sha}
        return {"label": label, "jit": [], "shared_objects": [{"path": f"{so}.so", "cubins": [cub], "ptx": []}]}

    table = cubins.compare(rec("h200-host", 312, "a" * 64), rec("image", 311, "a" * 64))
    assert table.startswith("1 of 1 cubins identical (h200-host vs image)")
    assert "`_C.cpython.so:_C.cpython.1.sm_90.cubin`" in table
    assert cubins.compare(rec("h", 312, "a" * 64), rec("i", 311, "b" * 64)).startswith("0 of 1 cubins identical")


def test_a_translation_units_path_hash_is_left_out_of_function_names():
    """nvcc hashes the source file's path into internal-linkage names (seen: the same kernel compiled in two folders
    gives `__nv_static_26__ebea7cf7_5_k2_cu_4536d6f1` and `__nv_static_26__0a694598_5_k2_cu_4536d6f1`), so the SASS
    comparison joins functions by the name without it."""
    a = "_ZN43_INTERNAL_71702da8_12_internode_cu_b3b04a8e16nvshmem_sync_allEv"
    b = "_ZN43_INTERNAL_0f0f0f0f_12_internode_cu_b3b04a8e16nvshmem_sync_allEv"
    assert (
        cubins._INTERNAL.sub(r"_\1", a)
        == cubins._INTERNAL.sub(r"_\1", b)
        == "_ZN43_INTERNAL_internode_cu16nvshmem_sync_allEv"
    )
    s1, s2 = "__nv_static_26__ebea7cf7_5_k2_cu_4536d6f1__Z1hi", "__nv_static_26__0a694598_5_k2_cu_4536d6f1__Z1hi"
    assert cubins._INTERNAL.sub(r"_\1", s1) == cubins._INTERNAL.sub(r"_\1", s2)


def test_the_host_jit_reproduction_takes_the_h200_runs_paths_from_its_build_log(tmp_path):
    """scripts/jit_host_repro.py: the deep_ep site and NCCL root of the committed H200 build log, whose JIT folder
    names they reproduce (kernels.jit's digest of the recorded barrier kernel, as cubins-h200-host.json has it)."""
    spec = importlib.util.spec_from_file_location("jit_host_repro", ROOT / "scripts" / "jit_host_repro.py")
    repro = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(repro)
    site, nccl = repro.host_paths(repro.BUILDLOGS)
    builds = "/tmp/reprostack-cubins-cache/builds"
    assert (site, nccl) == (f"{builds}/deepep-ce2e9948c096ef45/site", f"{builds}/nccl-4ac83166acf459e2/build")
    from reprostack.kernels import jit

    flags = (
        "-std=c++20 --diag-suppress=39,161,174,177,186,940,3012 --ptxas-options=--register-usage-level=10"
        f" -I {nccl}/include -I{site}/deep_ep/include --gpu-architecture=sm_90a "
        "--compiler-options=-fPIC,-O3,-fconcepts,-Wno-deprecated-declarations,-Wno-abi "
        "-O3 --expt-relaxed-constexpr --expt-extended-lambda"
    )  # what jit.Context.of builds for that site (tests/test_jit.py checks Context.of itself)
    name, code = jit.load_manifest(ROOT / "kernels" / "jit" / "h200-ep1.json").kernels[0]
    folder = jit.Context("nvcc", "NVCC13.0", flags, tmp_path, "90a").folder(name, code).name
    host = json.loads((ROOT / "results" / "images" / "cubins-h200-host.json").read_text())["jit"]
    assert folder in {j["key"] for j in host} and folder == "kernel.barrier.a8fe8c00385b24b5bdd26db1c31e88ff"
    with tarfile.open(tmp_path / "bad.tar", "w") as t:
        t.add(ROOT / "README.md", "buildlogs/deepep-0123456789abcdef.build.log")
    with pytest.raises(SystemExit, match="no EP_NCCL_ROOT_DIR line"):
        repro.host_paths(tmp_path / "bad.tar")
