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
    good = [("barrier", code()), ("dispatch", code("dispatch", ", ".join(["1"] * 15)))]
    jit.prewarm(ctx, good, env)
    c = ctx.cache_dir / "cache"
    # a folder made with other flags (its digest is not this context's), one of another shape, one unreadable
    for name, text in (
        ("kernel.combine." + "0" * 32, code("combine", ", ".join(["1"] * 12))),
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


# hostile input (docs/reliability.md, "DeepEP JIT manifest and cache"): each is one line naming file and field


def kernel(**k) -> bytes:
    return manifest_text(kernels=[{"name": "barrier", "code": code(), **k}]).encode()


MORE_HOSTILE = [
    ("nested arrays", b"[" * 100_000, "not JSON: nested too deep"),
    ("nested objects", b'{"a":' * 100_000, "not JSON: nested too deep"),
    (
        "duplicate key",
        b'{"deepep_tree": "HEAD", ' + manifest_text().encode()[1:],
        "not JSON: duplicate key 'deepep_tree'",
    ),
    ("NaN", manifest_text(arch=float("nan")).encode(), "arch: nan is not of type 'string'"),
    ("huge number", b'{"arch": ' + b"9" * 5000 + b"}", "not JSON: Exceeds the limit"),
    ("1e999", manifest_text(arch="X").replace('"X"', "1e999").encode(), "arch: inf is not of type 'string'"),
    ("BOM", b"\xef\xbb\xbf" + manifest_text().encode(), "not JSON: Unexpected UTF-8 BOM"),
    ("NUL in a code", kernel(code=code() + "\x00"), "kernels/0/code: not the shape"),
    ("CRLF code", kernel(code=code().replace("\n", "\r\n")), "kernels/0/code: not the shape"),
    ("trailing space", kernel(code=code() + " "), "kernels/0/code: not the shape"),
    ("name ending in a newline", kernel(name="barrier\n"), "kernels/0/name: 'barrier\\n' does not match"),
    ("tree ending in a newline", manifest_text(deepep_tree="b" * 40 + "\n").encode(), "deepep_tree: 'bbbb"),
    ("arch ending in a newline", manifest_text(arch="90a\n").encode(), "arch: '90a\\n' does not match"),
    ("profile ending in a newline", manifest_text(profile="h200-ep1\n").encode(), "profile: 'h200-ep1\\n' does"),
    ("lookalike name", kernel(name="b\u0430rrier"), "kernels/0/name"),
    ("lookalike include", kernel(code=code("b\u0430rrier")), "kernels/0/code: not the shape"),
    ("unicode digits", kernel(code=code(args="\u0661, 8")), "kernels/0/code: not the shape"),
    ("fullwidth digits", kernel(code=code(args="\uff11, 8")), "kernels/0/code: not the shape"),
    ("code over 4096", kernel(code=code(args=", ".join(["1" * 99] * 41))), "kernels/0/code: "),
    ("code not a string", kernel(code=7), "kernels/0/code: 7 is not of type 'string'"),
    ("name not a string", kernel(name=["barrier"]), "kernels/0/name: ['barrier'] is not of type 'string'"),
    ("newline in arguments", kernel(code=code(args="1,\n8")), "kernels/0/code: not the shape"),
    ("leading ::", kernel(code=code(args="::system, 1")), "kernels/0/code: not the shape"),
    ("empty :: segment", kernel(code=code(args="std::::x")), "kernels/0/code: not the shape"),
    ("trailing ::", kernel(code=code(args="deep_ep::")), "kernels/0/code: not the shape"),
    ("42 arguments", kernel(code=code(args=", ".join(["1"] * 42))), "kernels/0/code: not the shape"),
    ("two instantiations", kernel(code=code().replace("}\n", code().splitlines(True)[-2] + "}\n")), "not the shape"),
    ("include with ..", kernel(code=code("../barrier")), "kernels/0/code: not the shape"),
    ("a macro argument", kernel(code=code(args="1, __FILE__(2)")), "kernels/0/code: not the shape"),
    ("a string argument", kernel(code=code(args='"id"')), "kernels/0/code: not the shape"),
    ("a negative and a cast", kernel(code=code(args="-1, (int)2")), "kernels/0/code: not the shape"),
]


@pytest.mark.parametrize("label, data, why", MORE_HOSTILE, ids=[h[0] for h in MORE_HOSTILE])
def test_more_hostile_manifests_are_one_line(tmp_path, label, data, why):
    test_a_hostile_manifest_is_one_line_naming_file_and_field(tmp_path, label, data, why)


def test_a_folder_or_dangling_symlink_at_the_manifest_path(tmp_path):
    d = tmp_path / "kernels" / "jit"
    (d / "h200-ep1.json").mkdir(parents=True)
    with pytest.raises(jit.ManifestError, match=r"h200-ep1.json: not a regular file$"):
        jit.manifest_for(tmp_path, "h200-ep1")
    (d / "h200-ep1.json").rmdir()
    (d / "h200-ep1.json").symlink_to(tmp_path / "nowhere")
    with pytest.raises(jit.ManifestError, match=r"h200-ep1.json: not a regular file$"):
        jit.manifest_for(tmp_path, "h200-ep1")


def test_the_longest_accepted_code_is_still_one_include_and_one_instantiation(tmp_path):
    # the regex's edge: 41 arguments, namespaced identifiers, negative literals; the schema's 4096 characters
    args = ", ".join(["deep_ep::elastic::kNone", "-1", "true"] + ["0"] * 38)
    c = code(args=args)
    assert jit.CODE.fullmatch(c)
    assert c.count("#include") == 1 and c.count("reinterpret_cast") == 1 and c.count(";") == 2
    p = tmp_path / "m.json"  # the shape holds, the kernel does not: barrier_impl has 6 template arguments
    p.write_text(manifest_text(kernels=[{"name": "barrier", "code": c}]))
    with pytest.raises(jit.ManifestError, match="barrier_impl with 41 template argument"):
        jit.load_manifest(p)


def _files(root: Path) -> set:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("sub", ["cache", "tmp"])
def test_a_symlinked_cache_or_tmp_folder_is_not_written_through(setup, tmp_path, sub):
    site, env, nccl, cache, nvcc = setup
    ctx, _ = jit.Context.of(site, env, "90")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cache.mkdir(parents=True)
    (cache / sub).symlink_to(elsewhere)
    res = jit.prewarm(ctx, [("barrier", code()), ("dispatch", code("dispatch"))], env)
    assert res["compiled"] == 0 and len(res["failed"]) == 2
    assert res["failed"][0].startswith("barrier: ") and "is a symlink or not a folder" in res["failed"][0]
    assert _files(elsewhere) == set()
    if sub == "cache":
        (elsewhere / ctx.folder("barrier", code()).name).mkdir()
        assert jit.present(ctx) == set()  # not counted, not recorded
        assert jit.record(ctx, deepep_tree="a" * 40, profile="p", source="x")[1]["folders"] == 0


def test_a_cache_folder_that_is_a_file_or_unwritable_is_a_failure_not_a_crash(setup):
    site, env, nccl, cache, nvcc = setup
    ctx, _ = jit.Context.of(site, env, "90")
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text("not a folder")
    res = jit.prewarm(ctx, [("barrier", code())], env)
    assert res["compiled"] == 0 and res["failed"][0].startswith("barrier: ") and "\n" not in res["failed"][0]
    cache.unlink()
    (cache / "cache").mkdir(parents=True)
    cache.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.geteuid() != 0:
            res = jit.prewarm(ctx, [("barrier", code())], env)
            assert res["compiled"] == 0 and "Permission denied" in res["failed"][0]
    finally:
        cache.chmod(0o755)
    assert jit.prewarm(ctx, [("barrier", code())], env)["compiled"] == 1


def test_a_kernel_folder_that_is_a_file_or_a_symlink_is_left_as_it_is(setup, tmp_path):
    site, env, nccl, cache, nvcc = setup
    ctx, _ = jit.Context.of(site, env, "90")
    a, b, c = code(), code("dispatch"), code("combine")
    (cache / "cache").mkdir(parents=True)
    ctx.folder("barrier", a).write_text("a file")
    target = tmp_path / "target"
    target.mkdir()
    ctx.folder("dispatch", b).symlink_to(target)
    ctx.folder("combine", c).symlink_to(tmp_path / "dangling")
    res = jit.prewarm(ctx, [("barrier", a), ("dispatch", b), ("combine", c)], env)
    assert res["compiled"] == 0 and len(res["failed"]) == 3
    assert all("is not a folder (left as it is)" in f for f in res["failed"])
    assert ctx.folder("barrier", a).read_text() == "a file" and _files(target) == set()
    assert not (tmp_path / "dangling").exists() and not (cache / "tmp").exists()


def test_record_reads_no_fifo_no_huge_file_no_symlinked_folder(setup, tmp_path):
    site, env, nccl, cache, nvcc = setup
    ctx, _ = jit.Context.of(site, env, "90")
    jit.prewarm(ctx, [("barrier", code())], env)
    c = cache / "cache"
    fifo, huge, linked = (c / f"kernel.{n}.{d * 32}" for n, d in (("combine", "0"), ("dispatch", "1"), ("x", "2")))
    fifo.mkdir()
    os.mkfifo(fifo / "kernel.cu")  # opened without blocking: no hang
    huge.mkdir()
    (huge / "kernel.cu").write_bytes(b"x" * (jit.MAX_CODE_BYTES + 1))
    out = tmp_path / "out"
    out.mkdir()
    (out / "kernel.cu").write_text(code("x"))
    linked.symlink_to(out)
    for odd in (
        "kernel.barrier." + "a" * 32 + "\n",
        "kernel.Barrier." + "a" * 32,
        "kernel..x",
        "kernel.b\u0430r." + "a" * 32,
    ):
        (c / odd).mkdir()
    manifest, counts = jit.record(ctx, deepep_tree="a" * 40, profile="p", source="x")
    assert counts == {"folders": 4, "kept": 1, "not_reproduced": 0, "unreadable": 3, "other_shape": 0}
    assert [k["name"] for k in manifest["kernels"]] == ["barrier"]


def test_record_does_not_read_past_the_limit_of_a_growing_file(setup, monkeypatch):
    site, env, nccl, cache, nvcc = setup
    p = cache / "big"
    cache.mkdir(parents=True)
    p.write_bytes(b"y" * 10_000_000)
    reads = []
    real = os.read
    monkeypatch.setattr(jit.os, "read", lambda fd, n: reads.append(n) or real(fd, n))
    with pytest.raises(OSError, match="over 4096 bytes"):
        jit._read_regular(p, jit.MAX_CODE_BYTES)
    assert sum(reads) <= jit.MAX_CODE_BYTES + 1


ENVS = "# Pre-installed environment variables\npersistent_envs = dict()\n"


@pytest.mark.parametrize(
    "extra, why",
    [
        ('persistent_envs["EP_JIT_DEBUG"] = "1"\n', "names EP_JIT_DEBUG in a form other than"),
        ("persistent_envs['EP_JIT_DEBUG']='1'\n", "names EP_JIT_DEBUG in a form other than"),
        ("persistent_envs['EP_JIT_CPP_STANDARD'] = 'c\\'17'\n", "names EP_JIT_CPP_STANDARD"),
        ("persistent_envs['EP_NCCL_ROOT_DIR'] = '/a\\\\b'\n", "names EP_NCCL_ROOT_DIR in a form other than"),
        ('x = """\npersistent_envs[\'EP_JIT_DEBUG\'] = \'1\'\n"""\n', "EP_JIT_DEBUG set"),  # read as set: no prewarm
        ("# EP_JIT_DUMP_SASS is not set\n", "names EP_JIT_DUMP_SASS"),
        ("persistent_envs['EP_JIT_DEBUG'] = ''\n", None),  # empty: unset for DeepEP too
    ],
)
def test_a_hostile_envs_py_gives_a_reason_not_a_wrong_prewarm(setup, extra, why):
    site, env, nccl, cache, nvcc = setup
    envs = site / "deep_ep" / "envs.py"
    envs.write_text(envs.read_text() + extra)
    ctx, reason = jit.Context.of(site, env, "90")
    if why is None:
        assert ctx is not None and reason == ""
    else:
        assert ctx is None and why in reason and "\n" not in reason


def test_an_envs_py_path_the_environment_sets_again_is_not_needed(setup):
    site, env, nccl, cache, nvcc = setup
    envs = site / "deep_ep" / "envs.py"
    envs.write_text(ENVS + "persistent_envs['EP_NCCL_ROOT_DIR'] = '/a\\\\b'\n")
    ctx, why = jit.Context.of(site, dict(env, EP_NCCL_ROOT_DIR=str(nccl), EP_JIT_CACHE_DIR=str(cache)), "90")
    assert why == "" and f"-I {nccl}/include" in ctx.flags


def test_a_huge_fifo_or_symlinked_envs_py_gives_a_reason(setup, tmp_path):
    site, env, *_ = setup
    envs = site / "deep_ep" / "envs.py"
    envs.write_text(ENVS + "#" * jit.MAX_ENVS_BYTES)
    assert jit.Context.of(site, env, "90")[1].endswith("over 65536 bytes")
    envs.unlink()
    os.mkfifo(envs)
    assert "not a regular file" in jit.Context.of(site, env, "90")[1]
    envs.unlink()
    (tmp_path / "real.py").write_text(ENVS)
    envs.symlink_to(tmp_path / "real.py")
    assert jit.Context.of(site, env, "90")[1].startswith(f"cannot read {envs}: ")


NON_UTF8_NVCC = "#!/bin/sh\nprintf 'Cuda compilation tools, \\377\\376 release 13.0\\n'\n"


@pytest.mark.parametrize(
    "change, why",
    [
        ({"EP_JIT_CACHE_DIR": "jit"}, "JIT cache path 'jit' is not plain"),
        ({"EP_JIT_CACHE_DIR": "/a/../b"}, "JIT cache path '/a/../b' is not plain"),
        ({"EP_JIT_CACHE_DIR": "/a/./b"}, "JIT cache path '/a/./b' is not plain"),
        ({"EP_JIT_CACHE_DIR": "/a/.."}, "is not plain"),
        ({"EP_JIT_CACHE_DIR": "", "HOME": ""}, "JIT cache path '.deep_ep' is not plain"),
        ({"CUDA_HOME": "../cuda"}, "nvcc path '../cuda/bin/nvcc' is not plain"),
    ],
)
def test_environment_paths_that_are_not_plain(setup, change, why):
    site, env, *_ = setup
    ctx, reason = jit.Context.of(site, {**env, **change}, "90")
    assert ctx is None and why in reason


def test_an_empty_cache_dir_is_deepeps_default(setup, tmp_path):
    site, env, *_ = setup
    ctx, why = jit.Context.of(site, dict(env, EP_JIT_CACHE_DIR=""), "90")
    assert why == "" and ctx.cache_dir == tmp_path / ".deep_ep"


def test_an_nvcc_that_cannot_run_or_speaks_no_utf8(setup, tmp_path):
    site, env, nccl, cache, nvcc = setup
    nvcc.chmod(0o644)
    ctx, why = jit.Context.of(site, env, "90")
    assert ctx is None and why.startswith(f"nvcc at '{nvcc}' did not run: ") and "Permission denied" in why
    nvcc.write_text(NON_UTF8_NVCC)
    nvcc.chmod(0o755)
    ctx, why = jit.Context.of(site, env, "90")
    assert why == "" and ctx.signature == "NVCC13.0"
    nvcc.write_text("#!/bin/sh\necho 'release \u0661\u0663.\u0660'\n")  # Arabic-Indic digits: no release
    assert jit.Context.of(site, env, "90")[1].startswith("cannot read the release")


def test_nvcc_from_path_or_deepeps_default(setup, tmp_path):
    site, env, nccl, cache, nvcc = setup
    no_home = {k: v for k, v in env.items() if k != "CUDA_HOME"}
    ctx, why = jit.Context.of(site, dict(no_home, PATH=f"/nonexistent:{nvcc.parent}"), "90")
    assert why == "" and ctx.nvcc == str(nvcc)
    ctx, why = jit.Context.of(site, dict(no_home, PATH=str(tmp_path / "empty")), "90")
    # deep_ep.find_cuda_home's fallback: /usr/local/cuda, whatever is there (a reason when it does not run)
    assert (ctx is None and "/usr/local/cuda/bin/nvcc" in why) or ctx.nvcc == "/usr/local/cuda/bin/nvcc"


@pytest.mark.parametrize("arch", ["", "9", "sm_90", "9.0", "\u0669\u0660", None])
def test_a_compute_capability_that_is_not_one(setup, arch):
    site, env, *_ = setup
    ctx, why = jit.Context.of(site, env, arch)
    assert ctx is None and "is not one like '90'" in why


@pytest.mark.parametrize("profile", ["../../etc/h200", "a/b", "", "x\n", "h200 ep1"])
def test_a_profile_name_that_cannot_name_a_manifest(tmp_path, profile):
    with pytest.raises(jit.ManifestError, match="cannot name a manifest") as e:
        jit.manifest_for(tmp_path, profile)
    assert str(e.value).startswith(f"{tmp_path / 'kernels' / 'jit'}: profile name ")


def test_a_manifest_of_another_profile_under_this_ones_name(tmp_path):
    p = tmp_path / "kernels" / "jit" / "h200-ep2.json"
    p.parent.mkdir(parents=True)
    p.write_text(manifest_text())  # profile h200-ep1
    with pytest.raises(jit.ManifestError, match=r"h200-ep2.json: profile: 'h200-ep1' is not this file's profile"):
        jit.manifest_for(tmp_path, "h200-ep2")


@pytest.mark.parametrize(
    "name, kcode, why",
    [
        ("dispatch", code("barrier"), "name 'dispatch' does not match its code (barrier.cuh, barrier_impl)"),
        ("barrier", code("dispatch", "1, 2, 3, 4, 5, 6"), "name 'barrier' does not match its code"),
        ("evil", code("evil"), "name 'evil' is not a JIT kernel DeepEP builds"),
        (
            "barrier",
            code("barrier", "1, 2"),
            "code instantiates barrier_impl with 2 template argument(s), DeepEP's has 6",
        ),
        ("combine", code("combine_utils", "1"), "code includes deep_ep/impls/combine_utils.cuh, not one of the known"),
        ("pp_send", code("pp_send", "1, 2, 3, 4"), "code includes deep_ep/impls/pp_send.cuh, not one of the known"),
    ],
)
def test_a_kernels_name_must_match_its_code_and_its_include_a_known_header(tmp_path, name, kcode, why):
    """Issue 29 item 2: a manifest could name a kernel `dispatch` whose code instantiated another kernel (the folder
    then holds code DeepEP never asks for under that name) or include any impls header; now each (name, code) is one
    DeepEP builds: its header, its function and its arity (kernels.jit.KERNELS, read from DeepEP's source)."""
    p = tmp_path / "kernels" / "jit" / "h200-ep1.json"
    p.parent.mkdir(parents=True)
    p.write_text(manifest_text(kernels=[{"name": "barrier", "code": code()}, {"name": name, "code": kcode}]))
    with pytest.raises(jit.ManifestError) as e:
        jit.manifest_for(tmp_path, "h200-ep1")
    msg = str(e.value)
    assert msg.startswith(f"{p}: kernels/1: ") and why in msg and "\n" not in msg, msg


def test_the_committed_manifest_names_only_kernels_deepep_builds():
    m = jit.load_manifest(Path(__file__).resolve().parents[1] / "kernels" / "jit" / "h200-ep1.json")
    assert {n for n, _ in m.kernels} <= set(jit.KERNELS) and len(m.kernels) == 10
    forms = {(n, c.split("impls/")[1].split(".cuh")[0]) for n, c in m.kernels}
    assert ("dispatch", "dispatch") in forms and ("barrier", "barrier") in forms


def _build_at(root: Path) -> tuple[Path, Path]:
    """A deepep build folder deepep-<key> and an NCCL build folder nccl-<key> under `root` (one build key, the same
    names in every cache folder)."""
    deepep, nccl = root / "builds" / "deepep-cc653921c10cb682", root / "builds" / "nccl-4ac83166acf459e2"
    (deepep / "site" / "deep_ep" / "include").mkdir(parents=True)
    (deepep / "jit").mkdir()
    (nccl / "build" / "include").mkdir(parents=True)
    return deepep, nccl


def test_a_build_in_another_folder_names_the_same_jit_kernels_through_its_stable_view(setup, tmp_path):
    """DeepEP hashes the absolute -I paths of NCCL and deep_ep into each JIT kernel's folder name: a kernel cache
    entry pulled into another cache folder found none of its 10 kernels and compiled them again (the H100's cold
    hits, results/bench/kcache-h100-2026-12-06-b: before_test 10, compiled_in_test 10). Through
    runtime.stable_view both folders give DeepEP the same paths, so the same folder names."""
    from reprostack.kernels import runtime

    _, env, _, _, _ = setup
    views = tmp_path / "views"
    seen = {}
    for cache in ("cold-miss-cache", "cold-hit-cache"):
        deepep, nccl = _build_at(tmp_path / cache)
        real = runtime.runtime_env(deepep, env, nccl_root=nccl / "build")
        dview, nview = runtime.stable_view(deepep, views), runtime.stable_view(nccl, views) / "build"
        viewed = runtime.runtime_env(dview, env, nccl_root=nview)
        ctx_real = jit.Context.of(deepep / "site", real, "90")[0]
        ctx_view = jit.Context.of(dview / "site", viewed, "90")[0]
        seen[cache] = (ctx_real.folder("barrier", code()).name, ctx_view.folder("barrier", code()).name)
        assert (dview / "site").resolve() == (deepep / "site").resolve()  # the view is this build
    assert seen["cold-miss-cache"][0] != seen["cold-hit-cache"][0]  # the break: each folder its own names
    assert seen["cold-miss-cache"][1] == seen["cold-hit-cache"][1]  # through the view: one name


def test_the_view_folder_must_be_the_users_alone(tmp_path):
    """A view folder another user could write (or a link planted in /tmp) is refused with one line, nothing made."""
    from reprostack.errors import BuildError
    from reprostack.kernels import runtime

    target = tmp_path / "deepep-0123456789abcdef"
    target.mkdir()
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(BuildError, match="not a folder of this user's alone"):
        runtime.stable_view(target, shared)
    assert list(shared.iterdir()) == []
    planted = tmp_path / "planted"
    planted.symlink_to(shared)
    with pytest.raises(BuildError, match="not a folder of this user's alone"):
        runtime.stable_view(target, planted)
    own = tmp_path / "own"
    link = runtime.stable_view(target, own)
    assert link == own / target.name and link.resolve() == target and (os.stat(own).st_mode & 0o777) == 0o700
    other = tmp_path / "b" / target.name
    other.mkdir(parents=True)
    assert runtime.stable_view(other, own).resolve() == other  # replaced, atomically, for the same name
