"""kernels.jit: DeepEP's JIT kernels compiled before the test, into the folders DeepEP looks in (issue 17)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from reprostack.kernels import jit

# test vectors of DeepEP's get_hex_digest, from its csrc/utils/hash.hpp compiled with g++ (DeepEP b306af06)
DIGESTS = {
    b"": "ddd805b8cbc69b1ee220a8397b1dcdaf",
    b"abc": "6cb682c2bda63e59351d88a9dce78d10",
    "dispatch$$NVCC13.0$$-O3$$// x\né".encode(): "b24fbea3e69af037df18bb0d177b7ce7",
}


def code(impl: str = "barrier", args: str = "1, 8, true, 0, 132, 1") -> str:
    """A kernel.cu of the shape DeepEP's generators emit (csrc/kernels/elastic/*.hpp + LaunchRuntime::generate)."""
    return (
        "// Includes' hash value: 0123456789abcdef0123456789abcdef\n"
        f"\n#include <deep_ep/impls/{impl}.cuh>\n"
        "\nusing namespace deep_ep::elastic;\n"
        "\nstatic void __instantiate_kernel() {\n"
        f"    auto ptr = reinterpret_cast<void*>(&{impl}_impl<{args}>);\n"
        "}\n"
    )


FAKE_NVCC = """#!/bin/sh
# stands in for nvcc: `--version` as CUDA 13.0 says it; `SRC -cubin -o OUT FLAGS...` writes OUT from the source,
# the flags and the folder it ran in; a source holding FAIL is refused
if [ "$1" = "--version" ]; then echo "Cuda compilation tools, release 13.0, V13.0.88"; exit 0; fi
src=$1; out=$4
grep -q FAIL "$src" && { echo "kernel.cu(3): error: no instance of FAIL" >&2; exit 2; }
[ "$2 $3" = "-cubin -o" ] || exit 3
shift 4
{ echo "cubin"; cat "$src"; echo "flags: $*"; echo "cwd: $(pwd)"; } > "$out"
"""


@pytest.fixture
def setup(tmp_path):
    """A CUDA home with the fake nvcc, a built deep_ep whose envs.py persists the NCCL root and JIT cache (as
    DeepEP's setup.py writes it), and the test's environment."""
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    nvcc = cuda / "bin" / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    site = tmp_path / "build" / "site"
    (site / "deep_ep" / "include").mkdir(parents=True)
    nccl, cache = tmp_path / "nccl" / "build", tmp_path / "build" / "jit"
    (site / "deep_ep" / "envs.py").write_text(
        "# Pre-installed environment variables\npersistent_envs = dict()\n"
        f"persistent_envs['EP_JIT_CACHE_DIR'] = '{cache}'\npersistent_envs['EP_NCCL_ROOT_DIR'] = '{nccl}'\n"
    )
    env = {"PATH": os.environ["PATH"], "CUDA_HOME": str(cuda), "HOME": str(tmp_path)}
    return site, env, nccl, cache, nvcc


def test_hex_digest_is_deepeps():
    for data, want in DIGESTS.items():
        assert jit.hex_digest(data) == want


@pytest.mark.parametrize(
    "arch, release, want",
    [
        ("90", "13.0", "90a"),
        ("100", "13.0", "100f"),
        ("100", "12.8", "100a"),
        ("103", "12.9", "100f"),
        ("101", "13.0", "101a"),
    ],
)
def test_arch_suffix_as_compiler_hpp(arch, release, want):
    assert jit.deepep_arch(arch, release) == want


def test_context_has_deepeps_flags_and_folder(setup):
    site, env, nccl, cache, nvcc = setup
    ctx, why = jit.Context.of(site, env, "90")
    assert why == "" and ctx.nvcc == str(nvcc) and ctx.signature == "NVCC13.0" and ctx.cache_dir == cache
    assert ctx.flags == (
        "-std=c++20 --diag-suppress=39,161,174,177,186,940,3012 --ptxas-options=--register-usage-level=10"
        f" -I {nccl}/include -I{site}/deep_ep/include --gpu-architecture=sm_90a "
        "--compiler-options=-fPIC,-O3,-fconcepts,-Wno-deprecated-declarations,-Wno-abi "
        "-O3 --expt-relaxed-constexpr --expt-extended-lambda"
    )
    c = code()
    key = f"barrier$$NVCC13.0$${ctx.flags}$${c}".encode()
    assert ctx.folder("barrier", c) == cache / "cache" / f"kernel.barrier.{jit.hex_digest(key)}"
    # the test's environment wins over what the build persisted (deep_ep sets only what is unset)
    other = dict(env, EP_JIT_CACHE_DIR=str(site / "elsewhere"))
    assert jit.Context.of(site, other, "90")[0].cache_dir == site / "elsewhere"


@pytest.mark.parametrize(
    "change, why",
    [
        ({"EP_JIT_DEBUG": "1"}, "EP_JIT_DEBUG set: DeepEP's JIT flags differ"),
        ({"EP_NUM_TOPK_IDX_BITS": "32"}, "EP_NUM_TOPK_IDX_BITS set"),
        ({"EP_JIT_NVCC_COMPILER": "/usr/bin/true"}, "EP_JIT_NVCC_COMPILER set"),
        ({"EP_NCCL_ROOT_DIR": "/a b/nccl"}, "NCCL root path '/a b/nccl' is not plain"),
        ({"EP_JIT_CACHE_DIR": "/x;rm -rf ~"}, "JIT cache path '/x;rm -rf ~' is not plain"),
        ({"CUDA_HOME": "/nonexistent"}, "nvcc at '/nonexistent/bin/nvcc' did not run"),
    ],
)
def test_no_context_when_deepeps_flags_cannot_be_known(setup, change, why):
    site, env, *_ = setup
    ctx, reason = jit.Context.of(site, {**env, **change}, "90")
    assert ctx is None and why in reason


def test_no_context_when_the_build_persisted_a_flag_variable(setup):
    site, env, *_ = setup
    envs = site / "deep_ep" / "envs.py"
    envs.write_text(envs.read_text() + "persistent_envs['EP_NUM_TOPK_IDX_BITS'] = '32'\n")
    assert jit.Context.of(site, env, "90") == (
        None,
        "EP_NUM_TOPK_IDX_BITS set: DeepEP's JIT flags differ from the default ones",
    )
    envs.write_text("persistent_envs = dict()\n")
    assert jit.Context.of(site, env, "90")[1].startswith("no EP_NCCL_ROOT_DIR")


def test_prewarm_compiles_the_missing_kernels_into_deepeps_folders(setup):
    site, env, nccl, cache, nvcc = setup
    ctx, _ = jit.Context.of(site, env, "90")
    kernels = [("barrier", code()), ("dispatch", code("dispatch", "true, false, 132, 4, 28")), ("barrier", code())]
    res = jit.prewarm(ctx, kernels, env, jobs=4)
    assert res["kernels"] == 2 and res["compiled"] == 2 and res["present"] == 0 and res["failed"] == []
    for name, c in kernels[:2]:
        folder = ctx.folder(name, c)
        assert (folder / "kernel.cu").read_text() == c  # what DeepEP would write and hash
        cubin = (folder / "kernel.cubin").read_text()
        assert cubin.startswith("cubin\n" + c) and f"flags: {ctx.flags}\n" in cubin
        assert f"cwd: {cache / 'tmp'}\n" in cubin  # DeepEP's `cd <cache>/tmp && nvcc ...`
    assert os.listdir(cache / "tmp") == []  # nothing half-made left
    # a second prewarm (the warm run) compiles nothing; a folder DeepEP made is left as it is
    (ctx.folder("barrier", code()) / "kernel.cubin").write_text("DeepEP's own")
    again = jit.prewarm(ctx, kernels, env)
    assert (again["compiled"], again["present"]) == (0, 2)
    assert (ctx.folder("barrier", code()) / "kernel.cubin").read_text() == "DeepEP's own"
    assert jit.present(ctx) == {ctx.folder(n, c).name for n, c in kernels}


def test_a_kernel_nvcc_refuses_is_left_to_deepep(setup):
    site, env, *_ = setup
    ctx, _ = jit.Context.of(site, env, "90")
    bad = code("combine", "FAIL")
    res = jit.prewarm(ctx, [("combine", bad), ("barrier", code())], env)
    assert res["compiled"] == 1 and len(res["failed"]) == 1
    assert res["failed"][0].startswith("combine: nvcc exit 2: kernel.cu(3): error: no instance of FAIL")
    assert not ctx.folder("combine", bad).exists() and os.listdir(ctx.cache_dir / "tmp") == []


def test_record_keeps_what_it_reproduces(setup):
    site, env, *_ = setup
    ctx, _ = jit.Context.of(site, env, "90")
    good = [("barrier", code()), ("dispatch", code("dispatch", "true, false, 132"))]
    jit.prewarm(ctx, good, env)
    c = ctx.cache_dir / "cache"
    # a folder made with other flags (its digest is not this context's), one of another shape, one unreadable
    for name, text in (
        ("kernel.combine." + "0" * 32, code("combine", "1, 2")),
        ("kernel.engram_fetch." + "1" * 32, "#include <stdio.h>\n"),
        ("kernel.pp_send." + "2" * 32, None),
    ):
        (c / name).mkdir()
        if text is None:
            (c / name / "kernel.cu").symlink_to("/etc/passwd")
        else:
            (c / name / "kernel.cu").write_text(text)
    (c / "not-a-kernel").mkdir()
    manifest, counts = jit.record(ctx, deepep_tree="a" * 40, profile="h200-ep1", source="out/micro")
    assert counts == {"folders": 5, "kept": 2, "not_reproduced": 1, "unreadable": 1, "other_shape": 1}
    assert [(k["name"], k["code"]) for k in manifest["kernels"]] == sorted(good)
    assert manifest["arch"] == "90a" and manifest["deepep_tree"] == "a" * 40
    # what record writes is a manifest that loads and hits: a fresh cache gets the same folders
    p = site.parent / "h200-ep1.json"
    p.write_text(json.dumps(manifest))
    m = jit.load_manifest(p)
    fresh = dict(env, EP_JIT_CACHE_DIR=str(site.parent / "fresh"))
    ctx2, _ = jit.Context.of(site, fresh, "90")
    assert jit.prewarm(ctx2, m.kernels, fresh)["compiled"] == 2
    assert {x.replace("fresh", "jit") for x in map(str, ctx2.cache_dir.glob("cache/kernel.*"))} >= {
        str(ctx.folder(n, cd)) for n, cd in good
    }


def manifest_text(**change) -> str:
    d = {
        "schema": "reprostack.deepep-jit/1",
        "deepep_tree": "b" * 40,
        "arch": "90a",
        "profile": "h200-ep1",
        "recorded_from": "results/bench",
        "kernels": [{"name": "barrier", "code": code()}],
    }
    d.update(change)
    return json.dumps(d)


HOSTILE = [
    ("not json", b"{", "not JSON"),
    ("not utf-8", b'{"a": "\xff"}', "not JSON"),
    ("schema", manifest_text(schema="x").encode(), "schema: 'reprostack.deepep-jit/1' was expected"),
    ("tree", manifest_text(deepep_tree="HEAD").encode(), "deepep_tree: 'HEAD' does not match"),
    ("extra field", manifest_text(run="rm -rf /").encode(), "(top): Additional properties are not allowed"),
    ("name", manifest_text(kernels=[{"name": "../x", "code": code()}]).encode(), "kernels/0/name"),
    (
        "other include",
        manifest_text(kernels=[{"name": "x", "code": code().replace("deep_ep/impls/barrier", "/etc/passwd")}]).encode(),
        "kernels/0/code: not the shape of a DeepEP JIT kernel",
    ),
    (
        "more code",
        manifest_text(kernels=[{"name": "x", "code": code() + 'int main() { system("id"); }\n'}]).encode(),
        "kernels/0/code: not the shape",
    ),
    (
        "an expression argument",
        manifest_text(kernels=[{"name": "x", "code": code(args="1, (system(0), 2)")}]).encode(),
        "kernels/0/code: not the shape",
    ),
    ("too many", manifest_text(kernels=[{"name": "x", "code": code()}] * 300).encode(), "kernels: "),
    ("too big", b" " * (jit.MAX_MANIFEST_BYTES + 1), "over 1048576 bytes"),
]


@pytest.mark.parametrize("label, data, why", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_manifest_is_one_line_naming_file_and_field(tmp_path, label, data, why):
    p = tmp_path / "kernels" / "jit" / "h200-ep1.json"
    p.parent.mkdir(parents=True)
    p.write_bytes(data)
    with pytest.raises(jit.ManifestError) as e:
        jit.manifest_for(tmp_path, "h200-ep1")
    msg = str(e.value)
    assert msg.startswith(f"{p}: ") and why in msg and "\n" not in msg


def test_manifest_files_that_are_not_regular(tmp_path):
    d = tmp_path / "kernels" / "jit"
    d.mkdir(parents=True)
    assert jit.manifest_for(tmp_path, "h200-ep1") is None  # none: no prewarm, no error
    (d / "h200-ep1.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(jit.ManifestError, match="not a regular file"):
        jit.manifest_for(tmp_path, "h200-ep1")
    (d / "h200-ep1.json").unlink()
    os.mkfifo(d / "h200-ep1.json")
    with pytest.raises(jit.ManifestError, match="not a regular file"):
        jit.manifest_for(tmp_path, "h200-ep1")
    (d / "h200-ep1.json").unlink()
    (d / "h200-ep1.json").write_text(manifest_text())
    (d / "h200-ep1.json").chmod(0)
    if os.geteuid() != 0:
        with pytest.raises(jit.ManifestError, match="cannot read"):
            jit.manifest_for(tmp_path, "h200-ep1")
    (d / "h200-ep1.json").chmod(stat.S_IRUSR | stat.S_IWUSR)
    m = jit.manifest_for(tmp_path, "h200-ep1")
    assert m.kernels == (("barrier", code()),) and m.arch == "90a" and m.path == d / "h200-ep1.json"


def test_the_committed_manifests_load():
    root = Path(__file__).resolve().parents[1]
    for p in sorted((root / "kernels" / "jit").glob("*.json")):
        m = jit.load_manifest(p)
        assert m.profile == p.stem and m.kernels
