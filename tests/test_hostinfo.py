"""Tests of hostinfo.collect with a fake nvidia-smi on PATH and a fake sysfs tree (one EFA, one mlx5 device)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import pytest

from reprostack import hostinfo

FAKE_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu=uuid*)
    echo "GPU-0c1d2e3f-1111-2222-3333-444455556666"
    echo "GPU-9a8b7c6d-1111-2222-3333-444455556666"
    ;;
  *--query-gpu=*)
    echo "0, NVIDIA H200, 580.65.06, 143771, 00000000:18:00.0"
    echo "1, NVIDIA H200, 580.65.06, 143771, 00000000:2A:00.0"
    ;;
  *)
    echo "| NVIDIA-SMI 580.65.06    Driver Version: 580.65.06    CUDA Version: 13.0     |"
    ;;
esac
"""
BROKEN_SMI = """#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
exit 9
"""


def fake_bin(tmp_path: Path, script: str, monkeypatch) -> None:
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    (d / "nvidia-smi").write_text(script)
    (d / "nvidia-smi").chmod(0o755)
    (d / "fi_info").write_text(
        "#!/bin/sh\necho 'fi_info: 2.6.0'\necho 'libfabric: 2.6.0amzn1.0'\necho 'libfabric api: 2.6'\n"
    )
    (d / "fi_info").chmod(0o755)
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ.get('PATH', '')}")


def fake_sysfs(root: Path) -> Path:
    """<root>/class/infiniband/{rdmap16s27 -> efa, mlx5_0 -> mlx5_core} with PCI devices and drivers."""
    drivers = root / "bus" / "pci" / "drivers"
    for name in ("efa", "mlx5_core"):
        (drivers / name).mkdir(parents=True)
    ib = root / "class" / "infiniband"
    for dev, pci, driver in (("rdmap16s27", "0000:10:1b.0", "efa"), ("mlx5_0", "0000:3b:00.0", "mlx5_core")):
        pdev = root / "devices" / "pci0000:00" / pci
        pdev.mkdir(parents=True)
        (pdev / "driver").symlink_to(drivers / driver)
        (ib / dev).mkdir(parents=True)
        (ib / dev / "device").symlink_to(pdev)
    counters = ib / "rdmap16s27" / "ports" / "1" / "hw_counters"
    counters.mkdir(parents=True)
    (counters / "tx_bytes").write_text("1234567890\n")
    (counters / "rx_bytes").write_text("42\n")
    (ib / "mlx5_0" / "ports" / "1" / "hw_counters").mkdir(parents=True)
    (root / "module" / "efa").mkdir(parents=True)
    (root / "module" / "efa" / "version").write_text("2.17.1g\n")
    return root


def test_collect_with_fake_tools(tmp_path, monkeypatch):
    fake_bin(tmp_path, FAKE_SMI, monkeypatch)
    info = hostinfo.collect(nccl_runtime="2.30.4", sysfs_root=fake_sysfs(tmp_path / "sys"))
    assert info["gpus"] == [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "driver_version": "580.65.06",
            "memory_total_mib": 143771,
            "pci_bus_id": "00000000:18:00.0",
        },
        {
            "index": 1,
            "name": "NVIDIA H200",
            "driver_version": "580.65.06",
            "memory_total_mib": 143771,
            "pci_bus_id": "00000000:2A:00.0",
        },
    ]
    assert info["gpu_count"] == 2 and info["driver_version"] == "580.65.06"
    assert info["cuda_driver_version"] == "13.0"
    assert info["efa_devices"] == [
        {"name": "rdmap16s27", "pci": "0000:10:1b.0", "ports": {"1": {"tx_bytes": 1234567890, "rx_bytes": 42}}}
    ]
    assert info["other_rdma_devices"] == [{"name": "mlx5_0", "driver": "mlx5_core"}]
    assert info["efa_versions"] == {"efa_driver": "2.17.1g", "libfabric": "2.6.0amzn1.0"}
    assert hostinfo.efa_tx_bytes(info) == 1234567890
    assert info["nccl_runtime"] == "2.30.4" and info["python"] == platform.python_version()
    assert info["cpu_count"] == os.cpu_count() and info["hostname"] and info["kernel"] == platform.release()
    assert info["notes"] == []
    assert info["identity"]["gpu_uuids"] == [
        "GPU-0c1d2e3f-1111-2222-3333-444455556666",
        "GPU-9a8b7c6d-1111-2222-3333-444455556666",
    ]
    assert hostinfo.gpu_count() == 2
    json.dumps(info)


def test_absent_nvidia_smi_and_sysfs(tmp_path):
    info = hostinfo.collect(sysfs_root=tmp_path / "nosys", nvidia_smi=str(tmp_path / "missing" / "nvidia-smi"))
    assert info["efa_versions"]["efa_driver"] is None  # no efa module: absent, never guessed
    assert info["gpus"] == [] and info["gpu_count"] == 0 and info["cuda_driver_version"] is None
    assert info["efa_devices"] == [] and info["nccl_runtime"] is None
    assert any("not found" in n for n in info["notes"]) and any("no EFA device" in n for n in info["notes"])
    assert hostinfo.gpu_count(nvidia_smi=str(tmp_path / "missing")) == 0
    assert hostinfo.efa_tx_bytes(info) is None


def test_failing_nvidia_smi_gives_note(tmp_path, monkeypatch):
    fake_bin(tmp_path, BROKEN_SMI, monkeypatch)
    gpus, notes = hostinfo.gpus()
    assert gpus == [] and len(notes) == 1
    assert "exit 9" in notes[0] and "couldn't communicate" in notes[0]


@pytest.mark.parametrize("row", ["garbage", "0, H200, 580, lots, 0000:18:00.0"])
def test_unparsed_rows_are_noted(tmp_path, monkeypatch, row):
    fake_bin(tmp_path, f'#!/bin/sh\necho "{row}"\n', monkeypatch)
    gpus, notes = hostinfo.gpus()
    assert gpus == [] and "unparsed row" in notes[0]


def test_machine_identity_is_recorded_facts_or_none(tmp_path, monkeypatch):
    """Which machine and boot a run ran on: the machine id, the boot id and the GPU UUIDs as read, each None (or [])
    with a note when unreadable or not an id, never a guess (issue 27 item 4: a host name and a PCI bus name no
    machine)."""
    fake_bin(tmp_path, FAKE_SMI, monkeypatch)
    mid, boot = tmp_path / "machine-id", tmp_path / "boot_id"
    mid.write_text("3D1219C7C4C5404AAA1F6D2A48ADFDA4\n")
    boot.write_text("eb8dfbf1-0629-4a81-982c-7cb84de4ffe7\n")
    ident, notes = hostinfo.identity(machine_id=mid, boot_id=boot)
    assert (
        ident
        == {
            "machine_id": "3d1219c7c4c5404aaa1f6d2a48adfda4",
            "boot_id": "eb8dfbf1-0629-4a81-982c-7cb84de4ffe7",
            "gpu_uuids": ["GPU-0c1d2e3f-1111-2222-3333-444455556666", "GPU-9a8b7c6d-1111-2222-3333-444455556666"],
        }
        and notes == []
    )
    mid.write_text("vm\n")  # not an id
    ident, notes = hostinfo.identity(nvidia_smi=str(tmp_path / "missing"), machine_id=mid, boot_id=tmp_path / "nope")
    assert ident == {"machine_id": None, "boot_id": None, "gpu_uuids": []}
    assert notes[0] == f"machine_id: {mid} holds no id" and notes[1] == f"boot_id: {tmp_path / 'nope'} unreadable"
    assert notes[2].startswith("gpu_uuids: ") and "not found" in notes[2]
