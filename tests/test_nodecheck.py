"""The node checks of preflight (cluster.nodecheck readers, cluster.preflight.judge_node) on real tool output.

Every reader runs on the real output in tests/fixtures/preflight (README.md there: where each sample was published
and where its format is printed in the tool's source). A failing node is the same real output with one value
changed the way the tool prints it; each test says which. Nothing here mocks the reader or the judge.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reprostack.cluster import nodecheck
from reprostack.cluster.preflight import NOT_NEEDED, UNREADABLE, judge_node, needs_gin

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


def facts(
    tmp_path,
    *,
    q=None,
    nvl=NVL_UP,
    nvcc="nvcc-h200.txt",
    env_cuda=None,
    fi="fi_info-efa-1dev.txt",
    modules=None,
    libs=("libgdrapi.so.2.5",),
    limits=None,
    meminfo=None,
    log="",
    device=nodecheck.OPENED,
    hmem=(0, "fi_info-efa-1dev.txt"),
) -> dict:
    """The facts cluster.nodecheck.collect records, read by its readers from real output (the fields of
    schemas/preflight-node.schema.json `node_checks`)."""
    qt = fx(Q) if q is None else q
    driver, cuda = nodecheck.driver_cuda(qt)
    image, source = nodecheck.image_cuda(fx(nvcc) if nvcc else None, env_cuda)
    root = sysfs(tmp_path, {"efa": "3.1.0g", "gdrdrv": "2.5"} if modules is None else modules)
    return {
        "driver_version": driver,
        "driver_cuda": cuda,
        "image_cuda": image,
        "image_cuda_source": source,
        "gpus": nodecheck.gpus_q(qt),
        "nvlink": nodecheck.nvlink(nvl),
        "efa_fi_devices": nodecheck.efa_domains(fx(fi)),
        "efa_module": nodecheck.kernel_module(root, "efa"),
        "gdrdrv": nodecheck.kernel_module(root, "gdrdrv"),
        "libgdrapi": nodecheck.libgdrapi_version([f"/usr/lib/x86_64-linux-gnu/{n}" for n in libs]),
        "gdrdrv_device": device,
        "efa_hmem": nodecheck.efa_hmem(hmem[0], hmem[1] if "\n" in hmem[1] else fx(hmem[1])),
        "memlock": nodecheck.memlock(limits if limits is not None else unlimited_limits()),
        "hugepages": nodecheck.hugepages(meminfo if meminfo is not None else fx("meminfo-vm.txt")),
        "xid": None if log is None else {"lines": nodecheck.xid_lines(log)},
        "notes": "",
    }


def unlimited_limits() -> str:
    """The real /proc/self/limits with its memlock row as a process under `ulimit -l unlimited` prints it."""
    return fx("limits-vm-memlock-8m.txt").replace(
        "Max locked memory         8388608              8388608              bytes",
        "Max locked memory         unlimited            unlimited            bytes",
    )


def judge(c, *, need_gpu=True, gpus_per_node=8, efa_devices=1, need_gin=False) -> dict:
    rows = {}

    def row(check, node, ok, detail=""):
        rows[check] = (ok if isinstance(ok, str) else ("pass" if ok else "fail"), detail)

    judge_node(c, 0, row, need_gpu=need_gpu, gpus_per_node=gpus_per_node, efa_devices=efa_devices, need_gin=need_gin)
    return rows


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


# --- the judges on facts read from real output ------------------------------------------------------------------


def test_a_healthy_node_passes_every_check_and_says_what_it_read(tmp_path):
    rows = judge(facts(tmp_path, nvcc=None, env_cuda="12.4.0"))
    assert {k: v[0] for k, v in rows.items()} == {
        k: "pass"
        for k in (
            "driver",
            "fabricmanager",
            "nvlink",
            "ecc",
            "xid",
            "pcie",
            "efa-devices",
            "efa-hmem",
            "efa-module",
            "gdrdrv",
            "memlock",
            "hugepages",
        )
    }
    assert rows["driver"][1] == "driver 565.57.01 supports CUDA 12.7, the image's CUDA is 12.4 ($CUDA_VERSION)"
    assert rows["efa-devices"][1] == "fi_info -p efa lists 1 EFA device(s) (efa_0)"
    assert rows["gdrdrv"][1] == "gdrdrv 2.5 (host), libgdrapi 2.5 (image)"
    assert rows["efa-module"][1] == "efa 3.1.0g" and rows["pcie"][1] == "8 GPU(s) at x16"


def test_an_image_newer_than_the_driver_fails_the_driver_check(tmp_path):
    """The H200 image's nvcc (CUDA 13.0) on the H100 node's driver 565.57.01 (CUDA 12.7)."""
    status, detail = judge(facts(tmp_path))["driver"]
    assert status == "fail" and "supports CUDA 12.7, the image's CUDA is 13.0 (nvcc --version)" in detail
    assert "cudaErrorInsufficientDriver" in detail


def test_fewer_efa_devices_than_the_profile_needs_names_the_count(tmp_path):
    status, detail = judge(facts(tmp_path), efa_devices=16)["efa-devices"]
    assert status == "fail" and detail == "fi_info -p efa lists 1 EFA device(s) (efa_0), the profile needs 16"
    status, detail = judge(facts(tmp_path / "b", fi="fi_getinfo-61.txt"), efa_devices=16)["efa-devices"]
    assert status == "fail" and "lists 0 EFA device(s)" in detail


def test_inactive_nvlink_names_the_gpu(tmp_path):
    status, detail = judge(facts(tmp_path, nvl=fx(NVL)))["nvlink"]
    assert status == "fail" and "GPU(s) [2]" in detail and "all links down: [2]" in detail
    one_link = NVL_UP.replace("Link 3: 14.062 GB/s", "Link 3: <inactive>", 1)  # azhpc-diagnostics#73's form
    status, detail = judge(facts(tmp_path / "b", nvl=one_link))["nvlink"]
    assert status == "fail" and "some links down: [0]" in detail


@pytest.mark.parametrize(
    "check,old,new,says",
    [
        ("fabricmanager", "State                             : Completed", "State : In Progress", "In Progress"),
        ("pcie", "Current                   : 16x", "Current                   : 8x", "x8 of x16"),
        ("ecc", "DRAM Uncorrectable            : 0", "DRAM Uncorrectable            : 2", "2 volatile DRAM"),
        ("ecc", "Pending                           : No", "Pending                           : Yes", "row remap"),
    ],
)
def test_one_gpu_out_of_state_fails_naming_its_bus(tmp_path, check, old, new, says):
    """The real 8 x H100 `nvidia-smi -q`, the first occurrence of one value changed as a failing GPU prints it."""
    text = fx(Q)
    assert old in text
    status, detail = judge(facts(tmp_path, q=text.replace(old, new, 1)))[check]
    assert status == "fail" and "00000000:18:00.0" in detail and says in detail, detail


def test_xid_lines_fail_and_an_unreadable_log_is_never_a_pass(tmp_path):
    status, detail = judge(facts(tmp_path, log=fx("xid-kernel-log.txt")))["xid"]
    assert status == "fail" and detail.startswith("2 Xid line(s) in the kernel log, first: NVRM: Xid (PCI:0000:dc:00)")
    status, detail = judge(facts(tmp_path / "b", log=None))["xid"]
    assert status == UNREADABLE and "Xid not checked" in detail


@pytest.mark.parametrize(
    "drv,libs,gin,says",
    [
        ("2.4", ("libgdrapi.so.2.5",), False, "older than the image's library"),
        ("2.4", ("libgdrapi.so.2.4",), True, "GIN needs gdrdrv >= 2.5"),
        (None, ("libgdrapi.so.2.5",), False, "gdrdrv not loaded"),
        ("2.5", (), False, "the image has no libgdrapi"),
    ],
)
def test_gdrdrv_against_the_image_libgdrapi(tmp_path, drv, libs, gin, says):
    mods = {"efa": "3.1.0g"} | ({"gdrdrv": drv} if drv else {})
    status, detail = judge(facts(tmp_path, modules=mods, libs=libs), need_gin=gin)["gdrdrv"]
    assert status == "fail" and says in detail, detail


# libfabric v2.6.0's fi_info when no provider matches the hints: `fi_getinfo: %d (%s)` on stderr (util/info.c run()),
# exit -ret = 61 (main: `return -ret`). The real `fi_getinfo: -61` capture of an older release with the ` (%s)` the
# pinned rev adds (fi_strerror(61): "No data available"), as tests/fixtures/preflight/README.md says.
NO_HMEM = (61, fx("fi_getinfo-61.txt").rstrip("\n") + " (No data available)\n")


def test_efa_hmem_reader_on_real_fi_info_output():
    """issue 37 item 2: `fi_info -p efa -c FI_HMEM` lists the efa entries when the provider serves GPU memory, and
    prints `fi_getinfo: -61 (No data available)` with exit 61 when it does not (CUDA not loaded by libfabric)."""
    assert nodecheck.efa_hmem(0, fx("fi_info-efa-1dev.txt")) == {
        "offered": True,
        "detail": "fi_info -p efa -c FI_HMEM: provider efa",
    }
    assert nodecheck.efa_hmem(*NO_HMEM) == {
        "offered": False,
        "detail": "fi_info -p efa -c FI_HMEM: exit 61: fi_getinfo: -61 (No data available)",
    }
    assert not nodecheck.efa_hmem(None, "fi_info: not found")["offered"]  # no libfabric tools: never offered
    assert not nodecheck.efa_hmem(0, "provider: tcp\n    fabric: x\n")["offered"]  # another provider's entry


def test_efa_without_hmem_fails_in_one_line_never_silently(tmp_path):
    """issue 37 item 2: FI_HMEM off (libfabric could not dlopen libcudart) was silent: EFA without GPUDirect RDMA and
    without GIN. The node check fails in one line naming the command's answer and what to look at."""
    status, detail = judge(facts(tmp_path, hmem=NO_HMEM))["efa-hmem"]
    assert status == "fail" and "\n" not in detail
    assert detail.startswith("fi_info -p efa -c FI_HMEM: exit 61: fi_getinfo: -61 (No data available): libfabric's")
    assert "libcudart.so" in detail and "no GIN" in detail
    assert judge(facts(tmp_path / "b"))["efa-hmem"] == (
        "pass",
        "fi_info -p efa -c FI_HMEM: provider efa offers FI_HMEM (CUDA memory)",
    )
    assert judge(facts(tmp_path / "c"), need_gpu=False)["efa-hmem"][0] == NOT_NEEDED  # no GPU: no GPU memory to serve


def test_gdrdrv_device_is_opened_and_one_that_cannot_be_is_named_with_both_versions(tmp_path):
    """issue 37 item 5: preflight read /sys/module only; the container may lack /dev/gdrdrv (docker, EKS) or be
    refused it (a device cgroup). The node opens it as libgdrapi does (O_RDWR): a real character device opens, a
    missing one is ENOENT; the failing row names the device, the errno, both versions and how each launcher maps it."""
    assert nodecheck.open_device("/dev/null") == nodecheck.OPENED  # a real character device, opened read-write
    missing = nodecheck.open_device(str(tmp_path / "gdrdrv"))
    assert missing == "ENOENT: No such file or directory"
    status, detail = judge(facts(tmp_path, device=missing))["gdrdrv"]
    assert status == "fail" and "\n" not in detail
    assert detail.startswith("gdrdrv 2.5 (host), libgdrapi 2.5 (image): cannot open /dev/gdrdrv in the container ")
    assert "(ENOENT: No such file or directory)" in detail and "--container-mounts=/dev/gdrdrv" in detail
    eperm = judge(facts(tmp_path / "b", device="EPERM: Operation not permitted"))["gdrdrv"]
    assert eperm[0] == "fail" and "privileged" in eperm[1]
    # host 2.4 against the image's 2.5 (aws-ofi-nccl issue 1350: CUDA error 719): both versions in the one line
    status, detail = judge(facts(tmp_path / "c", modules={"efa": "3.1.0g", "gdrdrv": "2.4"}))["gdrdrv"]
    assert status == "fail" and detail.startswith(
        "gdrdrv 2.4 (host), libgdrapi 2.5 (image): the host's driver is older"
    )


def test_collect_opens_the_gdrdrv_device_and_asks_libfabric_for_fi_hmem_where_both_are_needed(tmp_path, monkeypatch):
    """collect() on this machine: the device given is opened (a real character device), the default /dev/gdrdrv is
    absent here (no gdrdrv module); `fi_info -p efa -c FI_HMEM` runs (a stand-in fi_info printing the real one-device
    listing records its argv) only when the profile needs both EFA and a GPU."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "fi_info").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/argv\ncat {PF / "fi_info-efa-1dev.txt"}\n')
    (bin_ / "fi_info").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:/usr/bin:/bin")
    c = nodecheck.collect(need_gpu=True, need_efa=True, gdrdrv_device="/dev/null")
    assert c["gdrdrv_device"] == nodecheck.OPENED and c["efa_hmem"]["offered"] is True
    assert "-p efa -c FI_HMEM" in (tmp_path / "argv").read_text().splitlines()
    if not Path("/dev/gdrdrv").exists():
        assert nodecheck.collect(need_gpu=False, need_efa=True)["gdrdrv_device"].startswith("ENOENT")
    (tmp_path / "argv").unlink()
    assert nodecheck.collect(need_gpu=False, need_efa=True)["efa_hmem"] is None  # no GPU: not asked
    assert "FI_HMEM" not in (tmp_path / "argv").read_text()


def test_the_gdrdrv_gin_floor_follows_the_gate_env_the_way_the_transport_need_does():
    from reprostack.gates.spec import load_spec

    spec = load_spec(ROOT, "micro")
    assert needs_gin({**spec.env, **spec.profile("p5en-efa-ep16").env})  # the campaign: GIN over the CPU proxy
    assert not needs_gin({**spec.env, **spec.profile("h200-ep1").env})  # EP_DISABLE_GIN=1 (backport #630)
    assert not needs_gin({}) and needs_gin({"NCCL_GIN_ENABLE": "1", "EP_DISABLE_GIN": "0"})


def test_memlock_hugepages_and_the_efa_module(tmp_path):
    rows = judge(facts(tmp_path, limits=fx("limits-vm-memlock-8m.txt"), modules={"gdrdrv": "2.5"}))
    assert rows["memlock"] == ("fail", "ulimit -l is 8388608 (bytes), EFA needs unlimited (--ulimit memlock=-1)")
    assert rows["efa-module"][0] == "fail" and "not loaded" in rows["efa-module"][1]
    taken = fx("meminfo-vm.txt").replace("HugePages_Total:       0", "HugePages_Total:    5128")
    status, detail = judge(facts(tmp_path / "b", meminfo=taken))["hugepages"]
    assert status == "fail" and "HugePages_Total 5128, HugePages_Free 0" in detail
    in_tree = judge(facts(tmp_path / "c", modules={"efa": None, "gdrdrv": "2.5"}))["efa-module"]
    assert in_tree == ("pass", "efa loaded (no version: the in-tree driver)")


def test_checks_a_profile_does_not_need_are_not_needed(tmp_path):
    rows = judge(facts(tmp_path), need_gpu=False, efa_devices=0)
    assert {v[0] for v in rows.values()} == {NOT_NEEDED}
    one_gpu = judge(facts(tmp_path / "b"), gpus_per_node=1, efa_devices=0)
    assert one_gpu["fabricmanager"][0] == one_gpu["nvlink"][0] == NOT_NEEDED
    assert one_gpu["pcie"][0] == "pass"


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
    for rc in (0, 61, None):  # the FI_HMEM reader: one bounded line, never offered without an efa entry and exit 0
        h = nodecheck.efa_hmem(rc, text)
        assert len(h["detail"]) <= 400 and "\n" not in h["detail"]
        assert h["offered"] == (rc == 0 and text.startswith("provider: efa\n"))


def test_facts_that_are_not_versions_fail_never_raise(tmp_path):
    """A facts file passes the schema with any short string where a version belongs (`x`, `loaded`): the judge
    fails that check in one row and never raises."""
    c = facts(tmp_path)
    c.update(driver_cuda="x", image_cuda="12.4", gdrdrv="loaded", libgdrapi="2.5", memlock="-1")
    rows = judge(c)
    words = "driver 565.57.01 supports CUDA x, the image's CUDA is 12.4 (nvcc --version): not a version"
    assert rows["driver"] == ("fail", words)
    assert rows["gdrdrv"][0] == "fail" and "unreadable" in rows["gdrdrv"][1]
    assert rows["memlock"][0] == "fail"


def test_on_this_machine_no_gpu_or_efa_check_passes_without_the_hardware():
    """collect() runs the real tools of this machine; where they are missing (this CPU machine: no nvidia-smi, no
    fi_info, no efa module) every GPU and EFA check fails or says it could not read, never passes."""
    if shutil.which("nvidia-smi") or Path("/sys/module/efa").exists():
        pytest.skip("this machine has a GPU driver or an EFA module: the no-hardware case cannot be shown here")
    c = nodecheck.collect(need_gpu=True, need_efa=True)
    assert c["gpus"] == [] and c["efa_fi_devices"] == [] and c["efa_module"] is None and "nvidia-smi" in c["notes"]
    rows = judge(c, efa_devices=16)
    for check in (
        "driver",
        "fabricmanager",
        "nvlink",
        "ecc",
        "pcie",
        "efa-devices",
        "efa-hmem",
        "efa-module",
        "gdrdrv",
    ):
        assert rows[check][0] == "fail", (check, rows[check])
    assert rows["xid"][0] in ("pass", "fail", UNREADABLE)  # the kernel log is readable or not; never assumed
