"""Host inventory for report provenance: GPUs, driver, CUDA driver version, EFA devices, NCCL runtime.

Nothing here raises on a missing tool or sysfs entry: what cannot be read becomes an empty value plus a line
in `notes`, so a report can always be written.
"""

from __future__ import annotations

import csv
import os
import platform
import re
import socket
import subprocess
from pathlib import Path

_QUERY = ["--query-gpu=index,name,driver_version,memory.total,pci.bus_id", "--format=csv,noheader,nounits"]
_CUDA_VERSION = re.compile(r"CUDA Version:\s*([0-9.]+)")
_TIMEOUT_S = 30
_COUNTERS = ("tx_bytes", "rx_bytes")


def _run(argv: list[str]) -> tuple[str | None, str | None]:
    """(stdout, None) on success, (None, why) otherwise."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return None, f"{argv[0]}: not found"
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{argv[0]}: {e}"
    if p.returncode != 0:
        first = (p.stdout + p.stderr).strip().splitlines()[:1]
        return None, f"{' '.join(argv[:2])}: exit {p.returncode}" + (f": {first[0]}" if first else "")
    return p.stdout, None


def gpus(nvidia_smi: str = "nvidia-smi") -> tuple[list[dict], list[str]]:
    """(GPUs, notes) from `nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id`.

    Each GPU: {"index": int, "name": str, "driver_version": str, "memory_total_mib": int, "pci_bus_id": str}
    (memory.total with nounits is MiB). An absent binary or a failure gives [] and a note.
    """
    out, why = _run([nvidia_smi, *_QUERY])
    if out is None:
        return [], [why]
    found, notes = [], []
    for row in csv.reader(out.splitlines()):
        row = [c.strip() for c in row]
        if not row or row == [""]:
            continue
        try:
            idx, name, driver, mem, bus = row
            found.append(
                {
                    "index": int(idx),
                    "name": name,
                    "driver_version": driver,
                    "memory_total_mib": int(float(mem)),
                    "pci_bus_id": bus,
                }
            )
        except ValueError:
            notes.append(f"nvidia-smi: unparsed row {','.join(row)!r}")
    return found, notes


def gpu_count(nvidia_smi: str = "nvidia-smi") -> int:
    """Number of GPUs nvidia-smi lists (0 when it is absent or fails)."""
    return len(gpus(nvidia_smi)[0])


def cuda_driver_version(nvidia_smi: str = "nvidia-smi") -> tuple[str | None, str | None]:
    """(version, note): the CUDA version the driver supports, from the `CUDA Version: 13.0` in nvidia-smi's header."""
    out, why = _run([nvidia_smi])
    if out is None:
        return None, why
    m = _CUDA_VERSION.search(out)
    return (m.group(1), None) if m else (None, "nvidia-smi: no 'CUDA Version' in its header")


def _read_int(p: Path) -> int | None:
    try:
        return int(p.read_text().strip())
    except (OSError, ValueError):
        return None


def rdma_devices(sysfs_root: str | os.PathLike = "/sys") -> tuple[list[dict], list[dict]]:
    """(efa, others) from `<sysfs_root>/class/infiniband/*`: a device is EFA when its `device/driver` symlink
    ends in `efa`. EFA entries: {"name", "pci", "ports": {port: {"tx_bytes": int, "rx_bytes": int}}} (counters
    from `ports/<p>/hw_counters/`, only those present; pods often expose none). Others: {"name", "driver"}."""
    base = Path(sysfs_root) / "class" / "infiniband"
    efa, others = [], []
    if not base.is_dir():
        return efa, others
    for dev in sorted(base.iterdir()):
        try:
            driver = os.path.basename(os.readlink(dev / "device" / "driver"))
        except OSError:
            driver = None
        if driver != "efa":
            others.append({"name": dev.name, "driver": driver})
            continue
        try:
            pci = os.path.basename(os.path.realpath(dev / "device"))
        except OSError:
            pci = None
        ports = {}
        pdir = dev / "ports"
        for port in sorted(pdir.iterdir()) if pdir.is_dir() else []:
            counters = {c: v for c in _COUNTERS if (v := _read_int(port / "hw_counters" / c)) is not None}
            if counters:
                ports[port.name] = counters
        efa.append({"name": dev.name, "pci": pci, "ports": ports})
    return efa, others


def efa_tx_bytes(info_or_devices) -> int | None:
    """Sum of tx_bytes over all EFA ports (a `collect()` dict or its `efa_devices` list); None when no
    port exposes the counter. Take it before and after a gate for the bytes it sent."""
    devs = info_or_devices.get("efa_devices", []) if isinstance(info_or_devices, dict) else info_or_devices
    vals = [c["tx_bytes"] for d in devs for c in d["ports"].values() if "tx_bytes" in c]
    return sum(vals) if vals else None


def _read_text(p: Path, limit: int = 256) -> str | None:
    try:
        with open(p, "rb") as f:
            return f.read(limit).decode("ascii", "replace").strip() or None
    except OSError:
        return None


def efa_versions(sysfs_root: str | os.PathLike = "/sys", fi_info: str = "fi_info") -> dict:
    """EFA software versions of this host: {"efa_driver": the efa kernel module's version
    (`<sysfs>/module/efa/version`), "libfabric": `fi_info --version`'s libfabric line}; None for what is absent."""
    lib = None
    out, _ = _run([fi_info, "--version"])
    for line in (out or "").splitlines():
        if line.strip().startswith("libfabric:"):
            lib = line.split(":", 1)[1].strip() or None
    return {"efa_driver": _read_text(Path(sysfs_root) / "module" / "efa" / "version"), "libfabric": lib}


_UUID = re.compile(r"^GPU-[0-9a-fA-F-]{8,64}$")
_ID = re.compile(r"^[0-9a-fA-F-]{16,64}$")


def identity(
    nvidia_smi: str = "nvidia-smi", *, machine_id: str | os.PathLike = "/etc/machine-id", boot_id=None
) -> tuple[dict, list[str]]:
    """(identity, notes): which machine and which boot a run ran on, from recorded facts only: {"machine_id" (the
    OS's /etc/machine-id), "boot_id" (/proc/sys/kernel/random/boot_id: new at every boot), "gpu_uuids" (nvidia-smi
    --query-gpu=uuid, in index order)}; what cannot be read is None (or []) with a note, never a guess. A host name
    or a PCI bus id names no machine (every lent VM here is `vm`, its GPU on one bus)."""
    notes = []
    boot = Path(boot_id or "/proc/sys/kernel/random/boot_id")

    def read_id(p: Path, what: str) -> str | None:
        v = _read_text(Path(p), 128)
        if v is None or not _ID.match(v):
            notes.append(f"{what}: {p} " + ("unreadable" if v is None else "holds no id"))
            return None
        return v.lower()

    ids = {"machine_id": read_id(Path(machine_id), "machine_id"), "boot_id": read_id(boot, "boot_id")}
    uuids: list[str] = []
    out, why = _run([nvidia_smi, "--query-gpu=uuid", "--format=csv,noheader"])
    if out is None:
        notes.append(f"gpu_uuids: {why}")
    else:
        for line in out.splitlines():
            u = line.strip()
            if u and _UUID.match(u):
                uuids.append(u)
            elif u:
                notes.append(f"gpu_uuids: unparsed line {u[:80]!r}")
    return {**ids, "gpu_uuids": uuids}, notes


def machine() -> dict:
    """This machine's name, kernel, OS, architecture, CPU count and Python (the first keys of `collect`)."""
    return {
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "os": platform.system(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }


def collect(
    *, nccl_runtime: str | None = None, sysfs_root: str | os.PathLike = "/sys", nvidia_smi: str = "nvidia-smi"
) -> dict:
    """Host inventory as a JSON-ready dict.

    Keys: hostname, kernel (uname -r), os, machine, cpu_count, python, gpus (see `gpus`), gpu_count,
    driver_version (of GPU 0), cuda_driver_version, efa_devices, other_rdma_devices, efa_versions (see
    `efa_versions`), nccl_runtime (as given by
    the caller: the library the gate actually loads, which this process cannot know), identity (see `identity`:
    machine id, boot id, GPU UUIDs; its own `notes` for what could not be read), notes.
    """
    found, notes = gpus(nvidia_smi)
    cuda, why = cuda_driver_version(nvidia_smi) if found else (None, None)
    if why:
        notes.append(why)
    ident, why_ident = identity(nvidia_smi)
    if why_ident:
        ident["notes"] = why_ident
    efa, others = rdma_devices(sysfs_root)
    if not efa:
        notes.append(f"no EFA device under {Path(sysfs_root) / 'class' / 'infiniband'}")
    return {
        **machine(),
        "gpus": found,
        "gpu_count": len(found),
        "driver_version": found[0]["driver_version"] if found else None,
        "cuda_driver_version": cuda,
        "efa_devices": efa,
        "other_rdma_devices": others,
        "efa_versions": efa_versions(sysfs_root),
        "nccl_runtime": nccl_runtime,
        "identity": ident,
        "notes": notes,
    }
