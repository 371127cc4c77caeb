"""Stage `kernels` on the CPU: recipes, preflight checks, the keyed build cache (with a fake NCCL tree built
by real `make`), the one-NCCL overlay, and the ELF check of a statically linked libstdc++ (with real g++)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from reprostack.errors import BuildError
from reprostack.kernels import build, preflight, runtime
from reprostack.kernels.elfcheck import LOCALE_ID, check_private_libstdcxx, libstdcxx_exposure
from reprostack.kernels.recipe import load_recipe, render
from reprostack.kernels.toolchain import Toolchain

REPO_ROOT = Path(__file__).resolve().parents[1]

VERSION_MK = (
    "##### version\nNCCL_MAJOR   := 2\nNCCL_MINOR   := 30\nNCCL_PATCH   := 4\nNCCL_SUFFIX  :=\nPKG_REVISION := 1\n"
)


def nccl_h(version: str = "2.30.4") -> str:
    major, minor, patch = version.split(".")
    return (
        f'#define NCCL_MAJOR {major}\n#define NCCL_MINOR {minor}\n#define NCCL_PATCH {patch}\n#define NCCL_SUFFIX ""\n'
    )


def toolchain(tmp_path: Path, **kw) -> Toolchain:
    tc = Toolchain(
        python=sys.executable,
        python_version="3.11.9",
        torch="2.11.0",
        torch_cuda="13.0",
        torch_site=str(tmp_path / "site"),
        nvcc="/nonexistent/bin/nvcc",
        nvcc_version="13.0",
        cuda_home="/opt/fake-cuda",
        arch="90",
        nvshmem_root=None,
    )
    return replace(tc, **kw)


# --------------------------------------------------------------------------- recipes


def test_real_recipes():
    nccl = load_recipe(REPO_ROOT, "nccl")
    assert (nccl.component, nccl.source, nccl.needs) == ("nccl", "nccl", ())
    assert nccl.make_targets == ("src.build",)
    assert nccl.make_vars == {"NVCC_GENCODE": "-gencode=arch=compute_{arch},code=sm_{arch}"}
    assert nccl.text == (REPO_ROOT / "kernels" / "nccl.yaml").read_text()
    assert nccl.path == REPO_ROOT / "kernels" / "nccl.yaml" and nccl.nccl_floor is None

    dp = load_recipe(REPO_ROOT, "deepep")
    assert (dp.component, dp.source, dp.needs, dp.nccl_floor) == ("deepep", "deepep", ("nccl",), "2.30.4")
    assert dp.make_targets == () and dp.make_vars == {}
    assert dp.env["TORCH_CUDA_ARCH_LIST"] == "{arch_dotted}"
    # the fix the elfcheck error message points operators at
    assert "-Wl,--exclude-libs,ALL" in dp.env["LDFLAGS"].split()
    # nvcc's temporary file names (with its process id) stay out of _C's symbols: two builds, the same bytes
    assert dp.env["NVCC_APPEND_FLAGS"].split() == ["--objdir-as-tempdir"]


def write_recipe(root: Path, component: str, text: str) -> Path:
    p = root / "kernels" / f"{component}.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(textwrap.dedent(text))
    return p


@pytest.mark.parametrize(
    "text,needle",
    [
        (
            "component: nccl\nsource: nccl\nmake:\n  targets: [src.build]\nflags: [-O3]\n",
            "unknown key(s) ['flags']; allowed: ",
        ),
        ("component: deepep\nsource: nccl\n", "component is 'deepep', file name says 'nccl'"),
        ("component: nccl\n", "`source` (a string) is required"),
        ("- component: nccl\n", "a recipe is a mapping"),
        ("component: nccl\nsource: [nccl\n", "cannot read recipe"),
    ],
)
def test_bad_recipes_name_file_and_problem(tmp_path, text, needle):
    p = write_recipe(tmp_path, "nccl", text)
    with pytest.raises(BuildError) as ei:
        load_recipe(tmp_path, "nccl")
    msg = str(ei.value)
    assert re.match(rf"{re.escape(str(p))}(:\d+)?: ", msg) and needle in msg


def test_missing_recipe(tmp_path):
    with pytest.raises(BuildError, match=r"kernels/nccl\.yaml: cannot read recipe"):
        load_recipe(tmp_path, "nccl")


def test_env_values_are_strings(tmp_path):
    write_recipe(tmp_path, "deepep", "component: deepep\nsource: deepep\nenv:\n  MAX_JOBS: 8\n  FLAG: true\n")
    assert load_recipe(tmp_path, "deepep").env == {"MAX_JOBS": "8", "FLAG": "True"}


@pytest.mark.parametrize(
    "value,arch,out",
    [
        ("-gencode=arch=compute_{arch},code=sm_{arch}", "90", "-gencode=arch=compute_90,code=sm_90"),
        ("{arch_dotted}", "90", "9.0"),
        ("{arch_dotted}", "100", "10.0"),
        ("{arch}a", "90", "90a"),
        ("no placeholder", "90", "no placeholder"),
    ],
)
def test_render(value, arch, out):
    assert render(value, arch) == out


# --------------------------------------------------------------------------- preflight


def test_nccl_source_version(tmp_path):
    (tmp_path / "makefiles").mkdir()
    (tmp_path / "makefiles" / "version.mk").write_text(VERSION_MK)
    assert preflight.nccl_source_version(tmp_path) == "2.30.4"
    (tmp_path / "makefiles" / "version.mk").write_text("NCCL_MAJOR := 2\nNCCL_MINOR := 30\n")
    with pytest.raises(BuildError, match=r"version\.mk: NCCL_MAJOR/MINOR/PATCH not found"):
        preflight.nccl_source_version(tmp_path)
    with pytest.raises(BuildError, match=r"elsewhere/makefiles/version\.mk: cannot read NCCL version"):
        preflight.nccl_source_version(tmp_path / "elsewhere")


def test_nccl_header_version(tmp_path):
    (tmp_path / "nccl.h").write_text("/* NCCL */\n" + nccl_h("2.28.9") + "#define NCCL_VERSION_CODE 22809\n")
    assert preflight.nccl_header_version(tmp_path) == "2.28.9"
    (tmp_path / "nccl.h").write_text("#define NCCL_MAJOR 2\n")
    with pytest.raises(BuildError, match="defines not found"):
        preflight.nccl_header_version(tmp_path)
    with pytest.raises(BuildError, match=r"nope/nccl\.h: cannot read"):
        preflight.nccl_header_version(tmp_path / "nope")


def test_check_floor():
    with pytest.raises(BuildError) as ei:
        preflight.check_floor("/x/include/nccl.h", "2.28.9", "2.30.4")
    assert str(ei.value).startswith("/x/include/nccl.h is NCCL 2.28.9, DeepEP needs >= 2.30.4")
    for ok in ("2.30.4", "2.30.10", "2.31.0", "3.0.0"):  # numeric, not string, comparison
        preflight.check_floor("nccl.h", ok, "2.30.4")
    with pytest.raises(BuildError):
        preflight.check_floor("nccl.h", "2.30.3", "2.30.4")


def test_check_nvshmem_root(tmp_path):
    with pytest.raises(BuildError, match="no NVSHMEM found: install the pinned nvidia-nvshmem-cu13 wheel"):
        preflight.check_nvshmem_root(None)
    r = tmp_path / "nvshmem"
    (r / "lib").mkdir(parents=True)
    with pytest.raises(BuildError) as ei:
        preflight.check_nvshmem_root(str(r))
    assert str(ei.value) == (
        f"NVSHMEM root {r} lacks include/nvshmem.h, lib/libnvshmem_host.so*, lib/libnvshmem_device.a"
    )
    (r / "include").mkdir()
    (r / "include" / "nvshmem.h").write_text("")
    (r / "lib" / "libnvshmem_host.so.3").write_text("")
    with pytest.raises(BuildError) as ei:
        preflight.check_nvshmem_root(str(r))
    assert str(ei.value) == f"NVSHMEM root {r} lacks lib/libnvshmem_device.a"
    (r / "lib" / "libnvshmem_device.a").write_text("")
    assert preflight.check_nvshmem_root(str(r)) == r


# --------------------------------------------------------------------------- build_nccl with a fake tree + real make


FAKE_NCCL_MAKEFILE = """\
BUILDDIR ?= build
.PHONY: src.build
src.build:
\tmkdir -p $(BUILDDIR)/include $(BUILDDIR)/lib
\tprintf '{header}' > $(BUILDDIR)/include/nccl.h
\techo '$(NVCC_GENCODE)' > $(BUILDDIR)/gencode.txt
\techo "$$CUDA_HOME" > $(BUILDDIR)/cuda_home.txt
\techo built > $(BUILDDIR)/lib/libnccl.so.2.30.4
\tln -sf libnccl.so.2.30.4 $(BUILDDIR)/lib/libnccl.so.2
\tln -sf libnccl.so.2 $(BUILDDIR)/lib/libnccl.so
"""


def fake_nccl_tree(root: Path, *, header_version: str = "2.30.4", fail: bool = False) -> Path:
    src = root / "nccl-src"
    (src / "makefiles").mkdir(parents=True)
    (src / "makefiles" / "version.mk").write_text(VERSION_MK)
    mk = FAKE_NCCL_MAKEFILE.format(header=nccl_h(header_version).replace("\n", "\\n"))
    if fail:
        mk = mk.replace(
            "\tmkdir -p", "\t@echo 'nvcc fatal: Unsupported gpu architecture compute_90'; exit 7\n\tmkdir -p", 1
        )
    (src / "Makefile").write_text(mk)
    return src


needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make not installed")


def build_dirs(cache: Path) -> list[str]:
    """What a build left under builds/, less its per-key lock files (`.<component>-<key16>.lock`, kept: empty)."""
    return sorted(n for n in os.listdir(cache / "builds") if not n.endswith(".lock"))


@needs_make
def test_build_nccl_builds_then_reuses(tmp_path):
    src, cache = fake_nccl_tree(tmp_path), tmp_path / "cache"
    recipe, tc = load_recipe(REPO_ROOT, "nccl"), toolchain(tmp_path)

    b = build.build_nccl(src, "a" * 40, recipe, tc, cache, jobs=2)
    assert b.reused is False and b.component == "nccl"
    assert b.out == cache / "builds" / f"nccl-{b.key[:16]}" and len(b.key) == 64
    assert (b.out / "build" / "lib" / "libnccl.so.2").is_file()
    assert (b.out / "build" / "include" / "nccl.h").read_text() == nccl_h("2.30.4")
    assert preflight.nccl_header_version(b.out / "build" / "include") == "2.30.4"
    assert (b.out / "build" / "gencode.txt").read_text() == "-gencode=arch=compute_90,code=sm_90\n"
    assert (b.out / "build" / "cuda_home.txt").read_text() == "/opt/fake-cuda\n"
    info = json.loads((b.out / "build.json").read_text())
    assert info["key"] == b.key == build.build_key(info["fields"])
    assert info["fields"]["make_vars"] == {"NVCC_GENCODE": "-gencode=arch=compute_90,code=sm_90"}
    assert info["fields"]["tree"] == "a" * 40 and info["fields"]["arch"] == "90"
    assert info["version"] == "2.30.4" and info["lib"] == "build/lib/libnccl.so.2"
    log = b.log.read_text()
    assert log.startswith(f"$ make -C {src} -j2 src.build BUILDDIR=") and "NVCC_GENCODE=-gencode=arch=compute_90" in log
    assert build_dirs(cache) == ["logs", b.out.name]  # no temp dir left behind

    other = build.build_nccl(src, "a" * 40, recipe, replace(tc, arch="100"), cache, jobs=2)
    assert other.reused is False and other.key != b.key and other.out != b.out
    assert (other.out / "build" / "gencode.txt").read_text() == "-gencode=arch=compute_100,code=sm_100\n"

    (src / "Makefile").unlink()  # a second build with the same key must not run make at all
    again = build.build_nccl(src, "a" * 40, recipe, tc, cache, jobs=2)
    assert again.reused is True and again.key == b.key and again.out == b.out and again.seconds == 0.0
    assert again.info == info


@needs_make
def edited_recipe(tmp_path: Path, old: str, new: str):
    """The committed NCCL recipe with one text edit, loaded from a copy."""
    d = tmp_path / f"edit-{abs(hash((old, new)))}" / "kernels"
    d.mkdir(parents=True)
    text = (REPO_ROOT / "kernels" / "nccl.yaml").read_text()
    assert old in text
    (d / "nccl.yaml").write_text(text.replace(old, new, 1))
    return load_recipe(d.parent, "nccl")


def test_build_key_covers_tree_recipe_and_toolchain(tmp_path):
    src, cache = fake_nccl_tree(tmp_path), tmp_path / "cache"
    recipe, tc = load_recipe(REPO_ROOT, "nccl"), toolchain(tmp_path)
    keys = {
        build.build_nccl(src, "a" * 40, recipe, tc, cache).key,
        build.build_nccl(src, "b" * 40, recipe, tc, cache).key,
        build.build_nccl(src, "a" * 40, edited_recipe(tmp_path, "  NVCC_GENCODE:", "  NVCC_GENCODE_X:"), tc, cache).key,
        build.build_nccl(src, "a" * 40, recipe, replace(tc, nvcc_version="13.1"), cache).key,
    }
    assert len(keys) == 4
    # a comment or layout edit is not a content change: the build is reused
    assert (
        build.build_nccl(
            src, "a" * 40, edited_recipe(tmp_path, "component:", "# a comment\ncomponent:"), tc, cache
        ).reused
        is True
    )
    # where a tool lives is not part of the key
    assert build.build_nccl(src, "a" * 40, recipe, replace(tc, cuda_home="/elsewhere"), cache).reused is True
    assert build.build_key({"a": 1, "b": [2]}) == build.build_key({"b": [2], "a": 1})


def failing_build(tmp_path: Path, **tree) -> tuple[BuildError, Path]:
    src, cache = fake_nccl_tree(tmp_path, **tree), tmp_path / "cache"
    with pytest.raises(BuildError) as ei:
        build.build_nccl(src, "c" * 40, load_recipe(REPO_ROOT, "nccl"), toolchain(tmp_path), cache)
    return ei.value, cache


@needs_make
def test_failing_make_names_step_keeps_log_leaves_no_output(tmp_path):
    err, cache = failing_build(tmp_path, fail=True)
    msg = str(err)
    assert msg.startswith("nccl: make src.build: exit 2; log: ")
    assert "nvcc fatal: Unsupported gpu architecture compute_90" in msg  # the log's tail is in the message
    assert build_dirs(cache) == ["logs"]  # no output dir, no temp dir
    (kept,) = (cache / "builds" / "logs").iterdir()
    assert kept.name.startswith("nccl-") and kept.name.endswith(".log")
    assert "nvcc fatal: Unsupported gpu architecture" in kept.read_text()


@needs_make
def test_failing_make_message_names_a_log_that_exists(tmp_path):
    err, cache = failing_build(tmp_path, fail=True)
    named = Path(str(err).split("log: ", 1)[1].splitlines()[0])
    assert named.is_file(), named


@needs_make
def test_built_header_must_match_source_version(tmp_path):
    err, cache = failing_build(tmp_path, header_version="2.28.9")
    assert str(err) == "nccl: built nccl.h says 2.28.9, source version.mk says 2.30.4"
    assert build_dirs(cache) == ["logs"]


def test_not_an_nccl_tree_fails_before_make(tmp_path):
    with pytest.raises(BuildError, match="cannot read NCCL version"):
        build.build_nccl(tmp_path, "a" * 40, load_recipe(REPO_ROOT, "nccl"), toolchain(tmp_path), tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


# --------------------------------------------------------------------------- build_deepep preflight


def fake_nccl_built(tmp_path: Path, version: str) -> build.Built:
    out = tmp_path / "nccl-out"
    (out / "build" / "include").mkdir(parents=True)
    (out / "build" / "lib").mkdir()
    (out / "build" / "include" / "nccl.h").write_text(nccl_h(version))
    (out / "build" / "lib" / "libnccl.so.2").write_text("")
    return build.Built("nccl", "d" * 64, out, True, 0.0, {})


def fake_nvshmem(root: Path) -> Path:
    (root / "include").mkdir(parents=True)
    (root / "lib").mkdir()
    for f in ("include/nvshmem.h", "lib/libnvshmem_host.so.3", "lib/libnvshmem_device.a"):
        (root / f).write_text("")
    return root


def test_deepep_refuses_nccl_below_floor(tmp_path, monkeypatch):
    monkeypatch.delenv("EP_NVSHMEM_ROOT_DIR", raising=False)
    nccl = fake_nccl_built(tmp_path, "2.28.9")
    tc = toolchain(tmp_path, nvshmem_root=str(fake_nvshmem(tmp_path / "nvshmem")))
    with pytest.raises(BuildError) as ei:
        build.build_deepep(tmp_path, "e" * 40, load_recipe(REPO_ROOT, "deepep"), tc, nccl, tmp_path / "cache")
    assert str(ei.value).startswith(f"{nccl.out}/build/include/nccl.h is NCCL 2.28.9, DeepEP needs >= 2.30.4")
    assert not (tmp_path / "cache").exists()  # failed in preflight: nothing ran, nothing written


def test_deepep_names_missing_nvshmem_pieces(tmp_path, monkeypatch):
    nv = tmp_path / "nvshmem"
    (nv / "include").mkdir(parents=True)
    (nv / "include" / "nvshmem.h").write_text("")
    monkeypatch.setenv("EP_NVSHMEM_ROOT_DIR", str(nv))  # the override wins over the toolchain's wheel
    tc = toolchain(tmp_path, nvshmem_root=str(fake_nvshmem(tmp_path / "wheel-nvshmem")))
    with pytest.raises(BuildError) as ei:
        build.build_deepep(
            tmp_path,
            "e" * 40,
            load_recipe(REPO_ROOT, "deepep"),
            tc,
            fake_nccl_built(tmp_path, "2.30.4"),
            tmp_path / "cache",
        )
    assert str(ei.value) == f"NVSHMEM root {nv} lacks lib/libnvshmem_host.so*, lib/libnvshmem_device.a"


# --------------------------------------------------------------------------- runtime: the one-NCCL overlay


def fake_site(root: Path) -> Path:
    site = root / "site-packages"
    (site / "torch" / "lib").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    for pkg in ("cu13", "nccl", "nvshmem", "cublas"):
        (site / "nvidia" / pkg / "lib").mkdir(parents=True)
    (site / "nvidia" / "nccl" / "lib" / "libnccl.so.2").write_text("the image's NCCL")
    (site / "nvidia" / "__pycache__").mkdir()
    (site / "nvidia" / "__init__.py").write_text("")
    return site


def our_nccl_lib(root: Path) -> Path:
    lib = root / "build" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnccl.so.2.30.4").write_text("our NCCL")
    os.symlink("libnccl.so.2.30.4", lib / "libnccl.so.2")
    return lib


def test_make_overlay(tmp_path):
    site, lib = fake_site(tmp_path), our_nccl_lib(tmp_path)
    before = sorted(str(p) for p in site.rglob("*"))
    dest = runtime.make_overlay(site, lib, tmp_path / "overlay")
    assert dest == tmp_path / "overlay"
    assert sorted(os.listdir(dest)) == ["nvidia", "torch"]
    assert (dest / "torch").is_symlink() and Path(os.readlink(dest / "torch")) == site / "torch"
    nv = dest / "nvidia"
    assert sorted(os.listdir(nv)) == ["cu13", "cublas", "nccl", "nvshmem"]  # no __init__.py, no __pycache__
    for pkg in ("cu13", "cublas", "nvshmem"):
        assert (nv / pkg).is_symlink() and Path(os.readlink(nv / pkg)) == site / "nvidia" / pkg
    assert not (nv / "nccl").is_symlink() and not (nv / "nccl" / "lib").is_symlink()
    links = sorted(os.listdir(nv / "nccl" / "lib"))
    assert links == ["libnccl.so.2", "libnccl.so.2.30.4"]
    for name in links:  # each points (resolved) at our build, never at the image's NCCL
        assert Path(os.readlink(nv / "nccl" / "lib" / name)) == (lib / "libnccl.so.2.30.4").resolve()
    assert (nv / "nccl" / "lib" / "libnccl.so.2").read_text() == "our NCCL"
    # torch's preload of its CUDA wheels globs <sys.path entry>/nvidia/nccl/lib/libnccl.so.*[0-9] in path order:
    # with the runtime PYTHONPATH (overlay first, then the image's site) the first hit is our NCCL
    search = runtime.runtime_env(tmp_path, {})["PYTHONPATH"].split(os.pathsep) + [str(site)]
    assert search[0] == str(dest)
    hits = [h for entry in search for h in sorted(Path(entry).glob("nvidia/nccl/lib/libnccl.so.*[0-9]"))]
    assert hits[0].resolve() == (lib / "libnccl.so.2.30.4").resolve() and hits[0].read_text() == "our NCCL"
    assert sorted(str(p) for p in site.rglob("*")) == before  # the image's site-packages are never written
    assert (site / "nvidia" / "nccl" / "lib" / "libnccl.so.2").read_text() == "the image's NCCL"


def test_make_overlay_without_nccl_lib(tmp_path):
    site = fake_site(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(BuildError, match="no libnccl.so"):
        runtime.make_overlay(site, tmp_path / "empty", tmp_path / "overlay")


def test_runtime_env_is_overlay_then_site_only(tmp_path):
    out = tmp_path / "deepep-0123"
    base = {"PYTHONPATH": "/opt/extra", "HOME": "/root"}
    env = runtime.runtime_env(out, base)
    # the caller's PYTHONPATH (e.g. reprostack's own dependencies) never reaches the test process
    assert env["PYTHONPATH"].split(os.pathsep) == [str(out / "overlay"), str(out / "site")]
    assert env["HOME"] == "/root" and base["PYTHONPATH"] == "/opt/extra"  # base not modified
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"  # nothing written into the verified trees it runs from
    env = runtime.runtime_env(out, {"PYTHONPATH": ""})
    assert env["PYTHONPATH"] == os.pathsep.join([str(out / "overlay"), str(out / "site")])


def test_runtime_env_defaults_to_process_env(tmp_path, monkeypatch):
    monkeypatch.setenv("REPROSTACK_PROBE", "1")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    env = runtime.runtime_env(tmp_path)
    assert env["REPROSTACK_PROBE"] == "1" and env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path / "overlay")
    assert "PYTHONPATH" not in os.environ


# --------------------------------------------------------------------------- elfcheck with real g++


REGEX_CPP = """\
#include <regex>
#include <string>
extern "C" int rs_matches(const char* s) {
  return std::regex_match(std::string(s), std::regex("[a-z]+[0-9]*")) ? 1 : 0;
}
"""


def _libstdcxx_a() -> str | None:
    if not shutil.which("g++"):
        return None
    p = subprocess.run(["g++", "-print-file-name=libstdc++.a"], capture_output=True, text=True).stdout.strip()
    return p if os.path.isabs(p) and os.path.isfile(p) else None


needs_gxx = pytest.mark.skipif(_libstdcxx_a() is None, reason="g++ or a static libstdc++.a is not installed")
needs_readelf = pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) not installed")


@pytest.fixture(scope="module")
def regex_obj(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("elf")
    (d / "re.cpp").write_text(REGEX_CPP)
    subprocess.run(["g++", "-c", "-fPIC", "-O0", "re.cpp", "-o", "re.o"], cwd=d, check=True)
    return d / "re.o"


def link(obj: Path, name: str, *flags: str) -> Path:
    out = obj.parent / name
    subprocess.run(["g++", "-shared", *flags, str(obj), "-o", str(out)], check=True)
    return out


@needs_gxx
@needs_readelf
def test_elfcheck_static_libstdcxx_exporting_locale_is_refused(regex_obj):
    so = link(regex_obj, "static.so", "-static-libstdc++")
    info = libstdcxx_exposure(so)
    assert info["needs_libstdcxx"] is False and info["exports_locale_id"] is True
    with pytest.raises(BuildError) as ei:
        check_private_libstdcxx(so)
    msg = str(ei.value)
    assert msg.startswith(f"{so}: links libstdc++ statically and exports ")
    assert "std::locale::id::_M_id" in msg and "-Wl,--exclude-libs,ALL" in msg and "kernels/deepep.yaml LDFLAGS" in msg


@needs_gxx
@needs_readelf
@pytest.mark.parametrize(
    "name,flags,needs",
    [
        ("private.so", ("-static-libstdc++", "-Wl,--exclude-libs,ALL"), False),
        ("plain.so", (), True),
    ],
)
def test_elfcheck_private_or_shared_libstdcxx_passes(regex_obj, name, flags, needs):
    so = link(regex_obj, name, *flags)
    info = check_private_libstdcxx(so)
    assert info["checked"] is True and info["needs_libstdcxx"] is needs and info["exports_locale_id"] is False


MIX = """\
import ctypes, sys
ext = ctypes.CDLL(sys.argv[1])                 # the extension runs first (its own libstdc++ copy, if static)
assert ext.rs_matches(b"abc123") == 1
torch_like = ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_GLOBAL)  # then a user of the shared libstdc++.so.6
assert torch_like.rs_matches(b"abc123") == 1
assert ext.rs_matches(b"xyz9") == 1
print("ok", flush=True)
"""


@needs_gxx
def test_why_the_check_exists_static_libstdcxx_mixes_locale_facets(regex_obj, tmp_path):
    """What elfcheck guards against, on the CPU: an extension with an exported static libstdc++ next to a
    shared-libstdc++ user in one process gets the wrong locale facet (std::bad_cast with GCC 12 headers,
    SIGSEGV on the H200's GCC 13); the same code linked with --exclude-libs,ALL runs."""
    shared_user = link(regex_obj, "torch_like.so")
    script = tmp_path / "mix.py"
    script.write_text(MIX)
    bad = subprocess.run(
        [sys.executable, str(script), str(link(regex_obj, "mix-static.so", "-static-libstdc++")), str(shared_user)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "ok" not in bad.stdout, bad
    good = subprocess.run(
        [
            sys.executable,
            str(script),
            str(link(regex_obj, "mix-private.so", "-static-libstdc++", "-Wl,--exclude-libs,ALL")),
            str(shared_user),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (good.returncode, good.stdout) == (0, "ok\n"), good


def test_elfcheck_without_readelf(tmp_path, monkeypatch):
    import reprostack.kernels.elfcheck as elfcheck

    monkeypatch.setattr(elfcheck.shutil, "which", lambda name: None)
    assert elfcheck.libstdcxx_exposure(tmp_path / "x.so") is None
    assert elfcheck.check_private_libstdcxx(tmp_path / "x.so") == {"checked": False, "why": "readelf not found"}
    assert LOCALE_ID == "_ZNKSt6locale2id5_M_idEv"


# --------------------------------------------------------------------------- build_deepep end to end, fake pip


FAKE_PIP = """\
#!/bin/sh
# stands in for `python setup.py build --build-base BASE --build-lib DIR` run in the source copy: "compiles" _C by
# linking re.o as setuptools would, with the recipe's LDFLAGS, and records the environment it was given
[ "$1 $2" = "setup.py build" ] || { echo "unexpected argv: $*" >&2; exit 9; }
while [ $# -gt 0 ]; do
  case "$1" in --build-lib) target="$2"; shift;; --build-base) base="$2"; shift;; esac
  shift
done
mkdir -p "$target/deep_ep" "$base/temp.linux-x86_64-cpython-311"
printf '# ninja log v5\\n0\\t61000\\t0\\t/x/csrc/kernels/legacy/internode.o\\t1\\n10\\t9010\\t0\\t/x/csrc/python_api.o\\t2\\nnot a step\\n' \\
  > "$base/temp.linux-x86_64-cpython-311/.ninja_log"
echo "compiling"
env | sort > "$target/../build-env.txt"
exec g++ -shared -static-libstdc++ $LDFLAGS re.o -o "$target/deep_ep/_C.cpython-311-x86_64-linux-gnu.so"
"""


@needs_gxx
@needs_readelf
@pytest.mark.parametrize("with_ldflags", [True, False])
def test_build_deepep_with_static_libstdcxx_compiler(tmp_path, regex_obj, monkeypatch, with_ldflags):
    """The lent H200's compiler links libstdc++ statically: the recipe's LDFLAGS keep it private, and
    without them the build is refused (no output, log kept) instead of SIGSEGV-ing in the first dispatch."""
    monkeypatch.delenv("EP_NVSHMEM_ROOT_DIR", raising=False)
    root = tmp_path / "proj"
    text = (REPO_ROOT / "kernels" / "deepep.yaml").read_text()
    if not with_ldflags:
        text = "\n".join(l for l in text.splitlines() if "LDFLAGS" not in l) + "\n"
    write_recipe(root, "deepep", text)
    recipe = load_recipe(root, "deepep")
    src = tmp_path / "deepep-src"
    src.mkdir()
    shutil.copy(regex_obj, src / "re.o")
    fake_python = tmp_path / "bin" / "python"
    fake_python.parent.mkdir()
    fake_python.write_text(FAKE_PIP)
    fake_python.chmod(0o755)
    site = fake_site(tmp_path)
    tc = toolchain(
        tmp_path, python=str(fake_python), torch_site=str(site), nvshmem_root=str(fake_nvshmem(tmp_path / "nvshmem"))
    )
    cache = tmp_path / "cache"
    nccl = fake_nccl_built(tmp_path, "2.30.4")
    nccl_lib = nccl.out / "build" / "lib"

    if not with_ldflags:
        with pytest.raises(BuildError, match="exclude-libs"):
            build.build_deepep(src, "e" * 40, recipe, tc, nccl, cache, jobs=3)
        assert build_dirs(cache) == ["logs"]
        (kept,) = (cache / "builds" / "logs").iterdir()
        assert kept.name.startswith("deepep-") and "$ " + str(fake_python) in kept.read_text()
        return

    b = build.build_deepep(src, "e" * 40, recipe, tc, nccl, cache, jobs=3)
    assert b.reused is False and b.out.name == f"deepep-{b.key[:16]}"
    assert b.info["libstdcxx"]["checked"] is True and b.info["libstdcxx"]["exports_locale_id"] is False
    assert b.info["extension"] == "site/deep_ep/_C.cpython-311-x86_64-linux-gnu.so"
    env = dict(l.split("=", 1) for l in (b.out / "build-env.txt").read_text().splitlines() if "=" in l)
    assert env["TORCH_CUDA_ARCH_LIST"] == "9.0" and "-Wl,--exclude-libs,ALL" in env["LDFLAGS"]
    assert env["EP_NCCL_ROOT_DIR"] == str(nccl.out / "build") and env["MAX_JOBS"] == "3"
    assert env["EP_JIT_CACHE_DIR"] == str(b.out / "jit") and env["CUDA_HOME"] == "/opt/fake-cuda"
    # git in the source copy must not find the repository around the cache (DeepEP's version takes its HEAD)
    assert Path(env["GIT_CEILING_DIRECTORIES"]).parent == cache / "builds"
    assert env["PYTHONPYCACHEPREFIX"] == str(cache / "pycache")  # setup.py's torch import writes no image bytecode
    assert (b.out / "overlay" / "nvidia" / "nccl" / "lib" / "libnccl.so.2").resolve() == (
        nccl_lib / "libnccl.so.2"
    ).resolve()
    assert not (b.out / "src").exists()  # the build copy of the sources is removed
    # the compile steps' seconds from ninja's own log, longest first, kept in the build log
    steps = [ln for ln in b.log.read_text().splitlines() if ln.startswith("# ninja step")]
    assert steps == ["# ninja step     61.0 s  internode.o", "# ninja step      9.0 s  python_api.o"]
    # each line of the build's output after its seconds since the start (where the build's time went)
    assert re.search(r"(?m)^ +\d+\.\d compiling$", b.log.read_text())
    assert runtime.runtime_env(b.out, {})["PYTHONPATH"].split(os.pathsep) == [
        str(b.out / "overlay"),
        str(b.out / "site"),
    ]

    fake_python.unlink()  # same key: reused, nothing runs
    again = build.build_deepep(src, "e" * 40, recipe, tc, nccl, cache, jobs=3)
    assert again.reused is True and again.out == b.out


def test_runtime_env_with_a_cache_keeps_bytecode_out_of_the_trees_and_reuses_it(tmp_path):
    """With cache_root, a process importing modules from a source tree (the verified deepep tree, the overlay) writes
    no __pycache__ there: its bytecode lands under <cache>/pycache, and the next process loads it from there instead
    of compiling the sources again (the warm test's start-up on the H200). Inductor's cache sits in the build."""
    import subprocess
    import sys

    out, tree, cache = tmp_path / "build", tmp_path / "tree", tmp_path / "cache"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "__init__.py").write_text("VALUE = 42\n")
    env = runtime.runtime_env(
        out, {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"}, cache_root=cache
    )
    assert "PYTHONDONTWRITEBYTECODE" not in env
    assert env["PYTHONPYCACHEPREFIX"] == str(cache / "pycache")
    # torch.compile's caches live in the build, beside DeepEP's jit/, so a kernel cache entry carries them
    assert (env["TORCHINDUCTOR_CACHE_DIR"], env["TORCHINDUCTOR_COMPILE_THREADS"]) == (str(out / "inductor"), "1")
    assert env["TRITON_CACHE_DIR"] == str(out / "triton")
    env["PYTHONPATH"] = str(tree) + os.pathsep + env["PYTHONPATH"]
    probe = (
        "import importlib.util, pkg, sys; spec = importlib.util.find_spec('pkg');"
        "print(pkg.VALUE, spec.loader.get_code.__qualname__, importlib.util.cache_from_source(spec.origin))"
    )
    first = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    pyc = Path(first.stdout.split()[-1])
    assert first.stdout.startswith("42 ") and pyc.is_file() and pyc.is_relative_to(cache / "pycache")
    assert not list(tree.rglob("__pycache__")), "bytecode written into the source tree"
    before = pyc.stat().st_mtime_ns
    subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert pyc.stat().st_mtime_ns == before  # read, not rewritten: the second process compiled nothing


def test_run_logged_stamps_lines_and_kills_the_whole_group_at_its_timeout(tmp_path):
    """A build step's output lines carry their seconds; at the timeout the step and what it started (a compiler
    that pip or ninja left running) are killed, and the error names the step and the log."""
    log = tmp_path / "b.log"
    build.run_logged(
        ["sh", "-c", "echo one; echo two"], cwd=tmp_path, env=dict(os.environ), log=log, step="s", timeout=30
    )
    assert [l.split(None, 1)[1] for l in log.read_text().splitlines()[1:]] == ["one", "two"]
    pid_file = tmp_path / "child.pid"
    t0 = time.monotonic()
    with pytest.raises(BuildError, match=r"^slow: timed out after 1 s; log: "):
        build.run_logged(
            ["sh", "-c", f"sleep 60 & echo $! > {pid_file}; echo started; wait"],
            cwd=tmp_path,
            env=dict(os.environ),
            log=log,
            step="slow",
            timeout=1,
        )
    assert time.monotonic() - t0 < 30
    child = int(pid_file.read_text())
    for _ in range(50):
        if not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the step's child outlived its timeout")
    with pytest.raises(BuildError, match=r"^s: exit 3; log: "):
        build.run_logged(["sh", "-c", "exit 3"], cwd=tmp_path, env=dict(os.environ), log=log, step="s", timeout=30)


def test_a_build_runs_in_a_folder_named_by_its_key_and_one_builder_per_key(tmp_path):
    """nvcc writes the build folder's path into the device code (a hash of it in every internal-linkage name), and
    the build folder was a random temp folder: two H200 builds of one key gave different DeepEP cubins
    (results/images/cubins.md). Now a key always builds in `.<component>-<key16>.partial` of its cache, and two
    builders of one key run one build: the second waits and reuses it."""
    import threading

    seen, calls = [], []

    def make(tmp: Path, log: Path) -> dict:
        seen.append(tmp)
        calls.append(1)
        time.sleep(0.3)
        (tmp / "out.txt").write_text("x")
        return {}

    fields = {"component": "demo", "tree": "a" * 40}
    b1 = build.reuse_or_build(tmp_path, "demo", fields, make)
    shutil.rmtree(b1.out)  # gone: built again, in the same folder
    b2 = build.reuse_or_build(tmp_path, "demo", fields, make)
    assert seen[0] == seen[1] == tmp_path / "builds" / f".demo-{b1.key[:16]}.partial"
    assert b2.out == b1.out and (b2.out / "out.txt").read_text() == "x" and not seen[0].exists()
    shutil.rmtree(b2.out)
    calls.clear()
    got = []
    ts = [
        threading.Thread(target=lambda: got.append(build.reuse_or_build(tmp_path, "demo", fields, make))) for _ in "ab"
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(calls) == 1 and sorted(b.reused for b in got) == [False, True]


def test_a_moved_build_never_reads_the_paths_its_envs_py_recorded(tmp_path, monkeypatch):
    """Seen on the H100 (issue 41's bench, cold hit): a DeepEP build pulled from the kernel cache carries deep_ep/envs.py
    with the EP_NCCL_ROOT_DIR and EP_JIT_CACHE_DIR of the folder it was built in, and deep_ep's import asserted "No
    libnccl.so found in <that folder>/lib/". The gate's test environment names this run's NCCL and jit/ folder; DeepEP's
    own rule (deep_ep/__init__.py: a persistent env only where the variable is unset) then keeps them."""
    import subprocess
    import sys

    from reprostack.gates import kernelprep

    out = tmp_path / "node-b" / "deepep-0123"
    pkg = out / "site" / "deep_ep"
    pkg.mkdir(parents=True)
    (pkg / "envs.py").write_text(
        "persistent_envs = dict()\n"
        "persistent_envs['EP_JIT_CACHE_DIR'] = '/elsewhere/node-a/deepep-0123/jit'\n"
        "persistent_envs['EP_NCCL_ROOT_DIR'] = '/elsewhere/node-a/nccl-4ac8/build'\n"
    )
    (pkg / "__init__.py").write_text(  # the lines of DeepEP's own __init__ that apply envs.py (pinned rev)
        "import os\nfrom .envs import persistent_envs\nfor key, value in persistent_envs.items():\n"
        "    if key not in os.environ:\n        os.environ[key] = value\n"
    )
    nccl = type("N", (), {"out": tmp_path / "node-b" / "nccl-4ac8", "info": {"version": "2.30.4"}, "log": None})()
    deepep = type("D", (), {"out": out, "log": None})()
    monkeypatch.setattr(kernelprep, "build_kernels", lambda *a, **k: (type("T", (), {"arch": "9.0"})(), nccl, deepep))
    ctx = type("Ctx", (), {"cache_root": tmp_path / "node-b" / "cache"})()
    kern = kernelprep.setup_kernels(None, ctx, {}, {}, {})
    probe = "import deep_ep, os; print(os.environ['EP_NCCL_ROOT_DIR']); print(os.environ['EP_JIT_CACHE_DIR'])"
    got = subprocess.run([sys.executable, "-c", probe], env=kern.env, capture_output=True, text=True, check=True)
    # this run's folders, named through their stable views (kernels.runtime.stable_view)
    assert [Path(p).resolve() for p in got.stdout.split()] == [(nccl.out / "build").resolve(), (out / "jit").resolve()]
