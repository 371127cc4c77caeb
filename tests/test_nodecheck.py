"""The node checks of preflight (cluster.nodecheck readers) on real tool output.

Every reader runs on the real output in tests/fixtures/preflight (README.md there: where each sample was published
and where its format is printed in the tool's source). A failing node is the same real output with one value
changed the way the tool prints it; each test says which. Nothing here mocks the reader or the judge.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reprostack.cluster import nodecheck

ROOT = Path(__file__).resolve().parents[1]
PF = ROOT / "tests" / "fixtures" / "preflight"


def fx(name: str) -> str:
    return (PF / name).read_text()


Q = "nvidia-smi-q-h100x8.txt"
NVL = "nvlink-s-a6000x3.txt"
NVL_UP = "".join(fx(NVL).splitlines(keepends=True)[:10])  # GPUs 0 and 1 of the capture: every link up


def sysfs(tmp_path: Path, modules: dict[str, str | None]) -> Path:
    """A /sys/module tree as the kernel lays it out: `initstate` for every loaded module, `version` where the module
    declares MODULE_VERSION (value as the module's source prints it, tests/fixtures/preflight/README.md)."""
    root = tmp_path / "root"
    for name, version in modules.items():
        d = root / "sys" / "module" / name
        d.mkdir(parents=True)
        (d / "initstate").write_text("live\n")
        if version is not None:
            (d / "version").write_text(version + "\n")
    return root


def unlimited_limits() -> str:
    """The real /proc/self/limits with its memlock row as a process under `ulimit -l unlimited` prints it."""
    return fx("limits-vm-memlock-8m.txt").replace(
        "Max locked memory         8388608              8388608              bytes",
        "Max locked memory         unlimited            unlimited            bytes",
    )


# --- the readers on real output -------------------------------------------------------------------------------


def test_readers_on_the_real_h100_node_output():
    assert nodecheck.driver_cuda(fx(Q)) == ("565.57.01", "12.7")
    assert nodecheck.driver_cuda(fx("nvidia-smi-h100x8.txt")) == ("565.57.01", "12.7")  # the plain header
    gpus = nodecheck.gpus_q(fx(Q))
    assert len(gpus) == 8 and gpus[0]["bus"] == "00000000:18:00.0"
    for g in gpus:
        assert (g["fabric_state"], g["fabric_status"]) == ("Completed", "Success")
        assert g["pcie_width_max"] == g["pcie_width_current"] == 16
        assert g["ecc_volatile_dram_uncorrectable"] == g["ecc_aggregate_dram_uncorrectable"] == 0
        assert (g["retired_pending"], g["remap_pending"], g["remap_failure"]) == ("N/A", "No", "No")
    assert nodecheck.image_cuda(fx("nvcc-h200.txt"), None) == ("13.0", "nvcc --version")
    assert nodecheck.image_cuda(None, "12.4.0") == ("12.4", "$CUDA_VERSION")
    assert nodecheck.image_cuda(None, None) == (None, "no nvcc and no $CUDA_VERSION")


def test_readers_on_real_nvlink_fabric_and_kernel_output():
    nv = nodecheck.nvlink(fx(NVL))
    assert nv["gpus"] == [
        {"gpu": 0, "links": 4, "inactive": 0},
        {"gpu": 1, "links": 4, "inactive": 0},
        {"gpu": 2, "links": 0, "inactive": 0},
    ]
    assert nv["down"] == [2] and nv["partial"] == []
    assert nodecheck.nvlink(NVL_UP)["down"] == []
    assert nodecheck.efa_domains(fx("fi_info-efa-1dev.txt")) == ["efa_0"]  # rdm, dgrm, rxd on dgrm: one NIC
    assert nodecheck.efa_domains(fx("fi_getinfo-61.txt")) == []
    assert nodecheck.memlock(fx("limits-vm-memlock-8m.txt")) == "8388608"
    assert nodecheck.memlock(unlimited_limits()) == "unlimited"
    assert nodecheck.hugepages(fx("meminfo-vm.txt")) == {"total": 0, "free": 0, "size_kb": 2048}
    lines = nodecheck.xid_lines(fx("xid-kernel-log.txt"))
    assert len(lines) == 2 and lines[0].startswith("NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990")


def test_pingpong_tables_of_both_sides_give_the_largest_size_bandwidth():
    client = nodecheck.pingpong(fx("fi_pingpong-efa-client.txt"))
    server = nodecheck.pingpong(fx("fi_pingpong-efa-server.txt"))  # `[rank 0] ` of the harness is skipped
    assert [r["bytes"] for r in client["rows"]] == [64, 256, 1024, 4096]
    assert (client["bytes"], client["mb_s"]) == (4096, 215.58)
    assert (server["bytes"], server["mb_s"], server["rows"][0]["usec"]) == (4096, 196.92, 38.5)
    # fabtests' size_str prints `1.5k` for 1536 B (-S all); `#ack` `+3` when fewer acks came back
    row = "1.5k    100     +3       150k        0.01s     24.10      63.70       0.02"
    assert nodecheck.pingpong(row)["rows"] == [{"bytes": 1536, "mb_s": 24.1, "usec": 63.7}]
    assert nodecheck.pingpong(fx("fi_getinfo-61.txt")) == {"rows": [], "bytes": None, "mb_s": None}


def test_kernel_modules_and_the_image_libgdrapi(tmp_path):
    root = sysfs(tmp_path, {"gdrdrv": "2.5", "efa": None})
    assert nodecheck.kernel_module(root, "gdrdrv") == "2.5"
    assert nodecheck.kernel_module(root, "efa") == "loaded"  # the in-tree driver declares no MODULE_VERSION
    assert nodecheck.kernel_module(root, "nvidia_peermem") is None
    libs = ["/usr/lib/x86_64-linux-gnu/libgdrapi.so.2.4", "/opt/gdrcopy/lib/libgdrapi.so.2.5", "/x/libgdrapi.so.2"]
    assert nodecheck.libgdrapi_version(libs) == "2.5"
    assert nodecheck.libgdrapi_version(["/usr/lib/libgdrapi.so"]) is None
    assert nodecheck.version_tuple("3.1.0g") == (3, 1, 0) and nodecheck.version_tuple("loaded") is None


# --- hostile input -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "\x00\xff\ufffd" * 1000,
        "x" * (4 << 20),
        "GPU 00000000:18:00.0\n" * 5000,
        "GPU 1: A\n" + "\tLink 0: <inactive>\n" * 5000,
        "provider: efa\n" + "".join(f"    domain: d{i}-rdm\n" for i in range(5000)),
        "64 10 =10 1.2k 0.00s 1e999 36.25 0.03\n" * 5000,
        "NVRM: Xid (PCI:0000:dc:00): 45, " + "y" * 10000 + "\n" * 3,
        "Max locked memory " + "9" * 100,
        "HugePages_Total: " + "9" * 40,
    ],
)
def test_hostile_tool_output_never_raises_and_stays_bounded(text):
    gpus = nodecheck.gpus_q(text)
    assert len(gpus) <= nodecheck.MAX_ITEMS
    nv = nodecheck.nvlink(text)
    assert len(nv["gpus"]) <= nodecheck.MAX_ITEMS
    assert len(nodecheck.efa_domains(text)) <= nodecheck.MAX_ITEMS
    assert len(nodecheck.pingpong(text)["rows"]) <= nodecheck.MAX_ITEMS
    assert all(len(x) <= 300 for x in nodecheck.xid_lines(text))
    nodecheck.driver_cuda(text), nodecheck.memlock(text), nodecheck.hugepages(text), nodecheck.image_cuda(text, text)
