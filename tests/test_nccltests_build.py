"""kernels.nccltests on the CPU: the committed recipe, and the keyed build with a small fake nccl-tests tree whose
src/Makefile has upstream's shape (`$(BUILDDIR)/<name>_perf` targets, NCCL_HOME, CUDA_HOME, NVCC_GENCODE, MPI), built
by real make and a real C compiler against a real shared libnccl.so.2 (SONAME libnccl.so.2, no libnccl.so link, as
in NVIDIA's wheel). The real build (nvcc 13.0, the v2.19.6 tree, the pinned 2.30.4 wheel) takes minutes on this
machine and is recorded in the branch report, not run here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from reprostack.errors import BuildError
from reprostack.kernels import nccltests
from reprostack.kernels.build import Built
from reprostack.kernels.recipe import load_recipe
from reprostack.kernels.toolchain import Toolchain

REPO_ROOT = Path(__file__).resolve().parents[1]
CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(shutil.which("make") is None or CC is None, reason="make and a C compiler needed")

FAKE_MAKEFILE = """\
BUILDDIR ?= ../build
MPI ?= 0
.PRECIOUS: $(BUILDDIR)/%.o
$(BUILDDIR)/%.o: %.c
\t@mkdir -p $(BUILDDIR)
\t$(CC) -c -o $@ $< -I$(NCCL_HOME)/include -DMPI=$(MPI)
$(BUILDDIR)/%_perf: $(BUILDDIR)/%.o
\t@echo 'NVCC_GENCODE=$(NVCC_GENCODE) MPI=$(MPI) CUDARTLIB=$(CUDARTLIB) CUDA_HOME=$(CUDA_HOME)' > $(BUILDDIR)/vars.txt
\t$(CC) -o $@ $< -L$(NCCL_HOME)/lib -lnccl
"""
PERF_C = '#include <stdio.h>\n#include "nccl.h"\nint ncclFakeVersion(void);\nint main(void){{printf("{name} %d\\n", ncclFakeVersion());return 0;}}\n'


def fake_tree(root: Path, *, makefile: str = FAKE_MAKEFILE, version: str = "2.19.6") -> Path:
    src = root / "nccl-tests-src"
    (src / "src").mkdir(parents=True)
    (src / "src" / "common.h").write_text(f'#pragma once\n#define NCCL_TESTS_VERSION "{version}"\n')
    (src / "src" / "Makefile").write_text(makefile)
    for name in ("all_reduce", "alltoall", "broadcast"):
        (src / "src" / f"{name}.c").write_text(PERF_C.format(name=name))
    return src


def fake_nccl(root: Path, key: str = "n" * 64, version: str = "2.30.4") -> Built:
    """An NCCL build as kernels.build/ncclwheel give it: <out>/build/include/nccl.h, <out>/build/lib/libnccl.so.2
    (a real shared library whose SONAME is libnccl.so.2; no libnccl.so, like the wheel)."""
    out = root / f"nccl-{key[:8]}"
    inc, lib = out / "build" / "include", out / "build" / "lib"
    inc.mkdir(parents=True)
    lib.mkdir(parents=True)
    major, minor, patch = version.split(".")
    (inc / "nccl.h").write_text(f"#define NCCL_MAJOR {major}\n#define NCCL_MINOR {minor}\n#define NCCL_PATCH {patch}\n")
    c = out / "nccl.c"
    c.write_text(f"int ncclFakeVersion(void) {{ return {major}{int(minor):02d}{int(patch):02d}; }}\n")
    subprocess.run(
        [CC, "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o", str(lib / "libnccl.so.2"), str(c)], check=True
    )
    return Built("nccl", key, out, False, 0.0, {})


def toolchain(**kw) -> Toolchain:
    tc = Toolchain(
        python=sys.executable,
        python_version="",
        torch="",
        torch_cuda=None,
        torch_site="",
        nvcc="/opt/fake-cuda/bin/nvcc",
        nvcc_version="13.0",
        cuda_home="/opt/fake-cuda",
        arch="90",
        nvshmem_root=None,
    )
    return replace(tc, **kw)


def recipe(tmp_path: Path, targets: str = "[all_reduce_perf, alltoall_perf]"):
    """The committed recipe, or a copy with other targets."""
    if targets == "[all_reduce_perf, alltoall_perf]":
        return load_recipe(REPO_ROOT, "nccl-tests")
    d = tmp_path / "r" / "kernels"
    d.mkdir(parents=True)
    text = (REPO_ROOT / "kernels" / "nccl-tests.yaml").read_text()
    (d / "nccl-tests.yaml").write_text(text.replace("targets: [all_reduce_perf, alltoall_perf]", f"targets: {targets}"))
    return load_recipe(d.parent, "nccl-tests")


def tree_files(src: Path) -> list[str]:
    return sorted(str(p.relative_to(src)) for p in src.rglob("*"))


def test_committed_recipe():
    r = load_recipe(REPO_ROOT, "nccl-tests")
    assert (r.component, r.source, r.needs) == ("nccl-tests", "nccl-tests", ("nccl",))
    assert r.make_targets == ("all_reduce_perf", "alltoall_perf") == nccltests.binaries(r)
    assert r.make_vars == {
        "MPI": "0",
        "NVCC_GENCODE": "-gencode=arch=compute_{arch},code=sm_{arch}",
        "CUDARTLIB": "cudart_static",
    }


@needs_cc
def test_builds_the_two_binaries_against_the_pinned_nccl_then_reuses(tmp_path):
    src, cache, nccl = fake_tree(tmp_path), tmp_path / "cache", fake_nccl(tmp_path)
    before = tree_files(src)
    b = nccltests.build_nccl_tests(src, "a" * 40, recipe(tmp_path), toolchain(), nccl, cache, jobs=2)
    assert b.reused is False and b.component == "nccl-tests"
    assert b.out == cache / "builds" / f"nccl-tests-{b.key[:16]}"
    assert sorted(os.listdir(b.out / "bin")) == ["all_reduce_perf", "alltoall_perf"]  # broadcast_perf not made
    assert tree_files(src) == before  # the verified tree is never written
    info = json.loads((b.out / "build.json").read_text())
    assert info["version"] == "2.19.6" and info["nccl_version"] == "2.30.4"
    assert info["fields"]["make_vars"] == {
        "MPI": "0",
        "NVCC_GENCODE": "-gencode=arch=compute_90,code=sm_90",
        "CUDARTLIB": "cudart_static",
    }
    assert info["fields"]["nccl"] == nccl.key and info["fields"]["binaries"] == ["all_reduce_perf", "alltoall_perf"]
    assert set(info["binaries"]) == {"all_reduce_perf", "alltoall_perf"}
    assert info["binaries"]["alltoall_perf"]["path"] == "bin/alltoall_perf"
    assert len(info["binaries"]["alltoall_perf"]["sha256"]) == 64
    log = b.log.read_text()
    assert f"NCCL_HOME={tmp_path}" in log and "CUDA_HOME=/opt/fake-cuda" in log and "MPI=0" in log
    # linked against the wheel's only library through the link folder; runs with the pinned lib on the path
    env = {**os.environ, "LD_LIBRARY_PATH": str(nccl.out / "build" / "lib")}
    run = subprocess.run([str(b.out / "bin" / "alltoall_perf")], capture_output=True, text=True, env=env, check=True)
    assert run.stdout == "alltoall 23004\n"
    if shutil.which("readelf"):
        dyn = subprocess.run(["readelf", "-d", str(b.out / "bin" / "all_reduce_perf")], capture_output=True, text=True)
        assert "[libnccl.so.2]" in dyn.stdout

    (src / "src" / "Makefile").write_text("%:\n\t@exit 9\n")  # a warm run builds nothing: no make at all
    again = nccltests.build_nccl_tests(src, "a" * 40, recipe(tmp_path), toolchain(), nccl, cache, jobs=2)
    assert again.reused is True and again.out == b.out and again.seconds == 0.0


@needs_cc
def test_key_covers_tree_arch_nvcc_and_the_nccl_build(tmp_path):
    src, cache, nccl = fake_tree(tmp_path), tmp_path / "cache", fake_nccl(tmp_path)
    r, tc = recipe(tmp_path), toolchain()
    first = nccltests.build_nccl_tests(src, "a" * 40, r, tc, nccl, cache)
    others = [
        nccltests.build_nccl_tests(src, "b" * 40, r, tc, nccl, cache),
        nccltests.build_nccl_tests(src, "a" * 40, r, replace(tc, arch="100"), nccl, cache),
        nccltests.build_nccl_tests(src, "a" * 40, r, replace(tc, nvcc_version="13.1"), nccl, cache),
        nccltests.build_nccl_tests(src, "a" * 40, r, tc, fake_nccl(tmp_path, "m" * 64), cache),
    ]
    assert len({first.key, *(o.key for o in others)}) == 5 and not any(o.reused for o in others)
    vars_100 = (others[1].out / "build.json").read_text()
    assert "-gencode=arch=compute_100,code=sm_100" in vars_100
    # where the toolkit lives is not part of the key
    assert nccltests.build_nccl_tests(src, "a" * 40, r, replace(tc, cuda_home="/else"), nccl, cache).reused


@needs_cc
def test_a_failing_make_names_the_step_and_leaves_no_output(tmp_path):
    mk = FAKE_MAKEFILE.replace(
        "\t$(CC) -o $@", "\t@echo 'nvcc fatal   : Unsupported gpu architecture'; exit 3\n\t$(CC) -o $@"
    )
    src, cache = fake_tree(tmp_path, makefile=mk), tmp_path / "cache"
    with pytest.raises(BuildError) as ei:
        nccltests.build_nccl_tests(src, "a" * 40, recipe(tmp_path), toolchain(), fake_nccl(tmp_path), cache)
    msg = str(ei.value)
    assert msg.startswith("nccl-tests: make: exit 2; log: ") and "Unsupported gpu architecture" in msg
    assert sorted(n for n in os.listdir(cache / "builds") if not n.endswith(".lock")) == ["logs"]  # no .partial
    assert Path(msg.split("log: ", 1)[1].splitlines()[0]).is_file()


@needs_cc
def test_make_that_outlives_its_timeout_is_stopped(tmp_path):
    mk = FAKE_MAKEFILE.replace("\t$(CC) -o $@", "\tsleep 60\n\t$(CC) -o $@")
    src, cache = fake_tree(tmp_path, makefile=mk), tmp_path / "cache"
    with pytest.raises(BuildError, match=r"^nccl-tests: make: timed out after 2 s; log: "):
        nccltests.build_nccl_tests(src, "a" * 40, recipe(tmp_path), toolchain(), fake_nccl(tmp_path), cache, timeout=2)
    assert sorted(n for n in os.listdir(cache / "builds") if not n.endswith(".lock")) == ["logs"]  # no .partial


@needs_cc
def test_a_binary_make_did_not_produce_is_named(tmp_path):
    mk = FAKE_MAKEFILE.replace("\t$(CC) -o $@ $< -L", "\ttouch $@ || $(CC) -o $@ $< -L")  # an empty file, not ELF
    src, cache = fake_tree(tmp_path, makefile=mk), tmp_path / "cache"
    with pytest.raises(BuildError, match=r"^nccl-tests: make gave no all_reduce_perf, alltoall_perf in "):
        nccltests.build_nccl_tests(src, "a" * 40, recipe(tmp_path), toolchain(), fake_nccl(tmp_path), cache)


def test_not_an_nccl_tests_tree_or_nccl_fails_before_make(tmp_path):
    with pytest.raises(BuildError, match="not an nccl-tests tree"):
        nccltests.build_nccl_tests(tmp_path, "a" * 40, recipe(tmp_path), toolchain(), None, tmp_path / "c")
    src = fake_tree(tmp_path)
    (src / "src" / "common.h").write_text("#define SOMETHING_ELSE 1\n")
    with pytest.raises(BuildError, match="no NCCL_TESTS_VERSION define"):
        nccltests.source_version(src)
    src = fake_tree(tmp_path / "b")
    nccl = Built("nccl", "k" * 64, tmp_path / "no-nccl", False, 0.0, {})
    with pytest.raises(BuildError, match="nccl.h: cannot read"):
        nccltests.build_nccl_tests(src, "a" * 40, recipe(tmp_path), toolchain(), nccl, tmp_path / "c")
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("targets", ["[../evil]", "[all_reduce_perf, 'a b']", "[]"])
def test_recipe_targets_must_be_binary_names(tmp_path, targets):
    with pytest.raises(BuildError, match="make.targets must name binaries"):
        nccltests.binaries(recipe(tmp_path, targets))
