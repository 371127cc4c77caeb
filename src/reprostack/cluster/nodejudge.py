"""The judgment of one node's facts for the cross-node preflight (cluster.preflight): what fails real p5en runs,
read by cluster.nodecheck, turned into one row per check (pass | fail | not-needed | unreadable) with a detail that
names what was read. Pure: facts in, rows out; nothing is run or read here.

Checks: NODE_CHECKS, each with its one-line gloss (cluster.preflight's module docstring says what each compares).

Invariants: a fact that is missing or not a version fails its check in one row, never raises (facts files are
untrusted: they passed the schema, nothing more); a check the profile does not need is `not-needed`, never passed;
every detail is one line.
"""

from __future__ import annotations

from . import nodecheck

NOT_NEEDED = "not-needed"
UNREADABLE = "unreadable"
NODE_CHECKS = {  # each node check, in report order, with what it checks (`preflight --help` prints these)
    "driver": "the NVIDIA driver supports the image's CUDA",
    "fabricmanager": "nvidia-fabricmanager running (NVSwitch)",
    "nvlink": "NVLink links up",
    "efa-devices": "/dev/infiniband/uverbs* present",
    "efa-hmem": "`fi_info -p efa -c FI_HMEM` offers GPU memory (GPUDirect RDMA)",
    "efa-module": "the efa kernel module loaded",
    "gdrdrv": "/dev/gdrdrv opens and the gdrdrv module matches the image's libgdrapi",
    "memlock": "ulimit -l unlimited",
    "hugepages": "hugepages for libfabric",
    "ecc": "no uncorrected ECC errors",
    "xid": "no Xid errors in the kernel log",
    "pcie": "GPU and NIC PCIe links at full width",
}
GIN_GDRDRV_FLOOR = (2, 5)  # aws-ofi-nccl v1.21.1 src/rdma/gin/nccl_ofi_gin_api.cpp: "GIN requires GDRCopy 2.5+"


def needs_gin(env: dict) -> bool:
    """The gate's env turns NCCL GIN on (`NCCL_GIN_ENABLE=1`) and DeepEP does not turn it off (`EP_DISABLE_GIN=1`):
    the rule gates.transport.need applies to the ranks, here for the gdrdrv floor GIN needs."""
    on = str(env.get("NCCL_GIN_ENABLE", "")).strip() == "1"
    return on and str(env.get("EP_DISABLE_GIN", "0")).strip() in ("", "0")


def _v(text) -> str:
    return ".".join(map(str, nodecheck.version_tuple(text) or ())) or "?"


def judge_node(c: dict, n: int, row, *, need_gpu: bool, gpus_per_node: int, efa_devices: int, need_gin: bool) -> None:
    """The checks of what fails real p5en runs (cluster.nodecheck's facts `c` of node `n`), each a row: failing
    ones name what was read; a check the profile does not need is `not-needed`."""
    nvl_needed = need_gpu and gpus_per_node > 1
    for check, needed, why in (
        ("driver", need_gpu, "the profile needs no GPU"),
        ("fabricmanager", nvl_needed, "one GPU per node: no NVSwitch fabric"),
        ("nvlink", nvl_needed, "one GPU per node: no NVLink peer"),
        ("ecc", need_gpu, "the profile needs no GPU"),
        ("xid", need_gpu, "the profile needs no GPU"),
        ("pcie", need_gpu, "the profile needs no GPU"),
        ("efa-devices", bool(efa_devices), "the profile needs no EFA"),
        ("efa-hmem", bool(efa_devices) and need_gpu, "the profile needs no EFA to GPU memory"),
        ("efa-module", bool(efa_devices), "the profile needs no EFA"),
        ("gdrdrv", bool(efa_devices), "the profile needs no EFA (GDRCopy serves the EFA plugin)"),
        ("memlock", bool(efa_devices), "the profile needs no EFA (RDMA pins memory)"),
        ("hugepages", bool(efa_devices), "the profile needs no EFA"),
    ):
        if not needed:
            row(check, n, NOT_NEEDED, why)
            continue
        ok, detail = _NODE_JUDGES[check](c, gpus_per_node=gpus_per_node, efa_devices=efa_devices, need_gin=need_gin)
        row(check, n, ok, detail + (f" ({c['notes']})" if ok is False and c.get("notes") else ""))


def _driver(c, **_):
    have, want = c["driver_cuda"], c["image_cuda"]
    if have is None or want is None:
        return (
            False,
            f"driver's CUDA {have or 'unknown'} (nvidia-smi), the image's CUDA {want or 'unknown'} ({c['image_cuda_source']})",
        )
    words = f"driver {c['driver_version']} supports CUDA {have}, the image's CUDA is {want} ({c['image_cuda_source']})"
    hv, wv = nodecheck.version_tuple(have), nodecheck.version_tuple(want)
    if hv is None or wv is None:
        return False, words + ": not a version"
    ok = hv[:2] >= wv[:2]
    return ok, words + ("" if ok else ": the image's kernels need a newer driver (cudaErrorInsufficientDriver)")


def _gpu_rows(c) -> list[dict]:
    return c["gpus"] or []


def _fabricmanager(c, **_):
    gpus = _gpu_rows(c)
    if not gpus:
        return False, "nvidia-smi -q listed no GPU: fabric state unknown"
    bad = [
        f"{g['bus']} {g['fabric_state']}/{g['fabric_status']}"
        for g in gpus
        if (g["fabric_state"], g["fabric_status"]) != ("Completed", "Success")
    ]
    if bad:
        return False, f"fabric manager: GPU(s) not Completed/Success: {', '.join(bad[:8])} (nvidia-smi -q Fabric)"
    return True, f"{len(gpus)} GPU(s) Fabric Completed/Success"


def _nvlink(c, **_):
    nv = c["nvlink"]
    if nv is None or not nv["gpus"]:
        return False, "nvidia-smi nvlink -s gave no link state"
    if nv["down"] or nv["partial"]:
        return False, (
            f"NVLink inactive: GPU(s) {nv['down'] + nv['partial']} "
            f"(all links down: {nv['down'] or 'none'}; some links down: {nv['partial'] or 'none'})"
        )
    links = sorted({g["links"] for g in nv["gpus"]})
    return True, f"{len(nv['gpus'])} GPU(s), {links} link(s) each, all active"


def _ecc(c, **_):
    gpus = _gpu_rows(c)
    if not gpus:
        return False, "nvidia-smi -q listed no GPU: ECC unknown"
    bad = []
    for g in gpus:
        if (g["ecc_volatile_dram_uncorrectable"] or 0) > 0:
            bad.append(f"{g['bus']} {g['ecc_volatile_dram_uncorrectable']} volatile DRAM uncorrectable")
        for key, words in (
            ("retired_pending", "page retirement pending"),
            ("remap_pending", "row remap pending"),
            ("remap_failure", "row remapping failed"),
        ):
            if str(g[key]).strip().lower() == "yes":
                bad.append(f"{g['bus']} {words}")
    return (
        (False, "; ".join(bad[:8]) + " (reset or drain the GPU)")
        if bad
        else (True, f"{len(gpus)} GPU(s): no uncorrectable error, nothing pending")
    )


def _xid(c, **_):
    if c["xid"] is None:
        return UNREADABLE, "the kernel log is not readable here (dmesg, /var/log/kern.log): Xid not checked"
    lines = c["xid"]["lines"]
    return (
        (False, f"{len(lines)} Xid line(s) in the kernel log, first: {lines[0]}")
        if lines
        else (True, "no Xid in the kernel log")
    )


def _pcie(c, **_):
    gpus = _gpu_rows(c)
    if not gpus:
        return False, "nvidia-smi -q listed no GPU: PCIe link width unknown"
    bad = [
        f"{g['bus']} x{g['pcie_width_current']} of x{g['pcie_width_max']}"
        for g in gpus
        if g["pcie_width_current"] is None or g["pcie_width_current"] != g["pcie_width_max"]
    ]
    return (
        (False, f"PCIe link below its width: {', '.join(bad[:8])} (nvidia-smi -q Link Width Current vs Max)")
        if bad
        else (True, f"{len(gpus)} GPU(s) at x{gpus[0]['pcie_width_max']}")
    )


def _efa_devices(c, *, efa_devices, **_):
    devs = c["efa_fi_devices"] or []
    ok = len(devs) >= efa_devices
    words = f"fi_info -p efa lists {len(devs)} EFA device(s) ({', '.join(devs[:4])}{', ...' if len(devs) > 4 else ''})"
    return ok, words + ("" if ok else f", the profile needs {efa_devices}")


def _efa_module(c, **_):
    v = c["efa_module"]
    if not v:
        return False, "the efa kernel module is not loaded (no /sys/module/efa): modprobe efa, or the EFA installer"
    return True, "efa loaded (no version: the in-tree driver)" if v == "loaded" else f"efa {v}"


def _efa_hmem(c, **_):
    h = c["efa_hmem"]
    if h is None:
        return False, f"{nodecheck.FI_HMEM_CMD}: not run"
    if h["offered"]:
        return True, f"{nodecheck.FI_HMEM_CMD}: provider efa offers FI_HMEM (CUDA memory)"
    return False, (
        f"{h['detail']}: libfabric's efa provider offers no FI_HMEM, so no GPUDirect RDMA and no GIN, silently; "
        "libfabric dlopens libcudart.so and libcuda.so.1 at run time (--enable-cuda-dlopen): both must resolve in the "
        "image (ldconfig -p) and the driver's libcuda must be injected (NVIDIA_DRIVER_CAPABILITIES compute)"
    )


def _gdrdrv(c, *, need_gin, **_):
    drv, lib, dev = c["gdrdrv"], c["libgdrapi"], c["gdrdrv_device"]
    if not drv:
        return False, "gdrdrv not loaded (/sys/module/gdrdrv/version absent): GDRCopy fails (CUDA error 719 / GIN init)"
    if not lib:
        return False, f"gdrdrv {drv} loaded, but the image has no libgdrapi.so.MAJOR.MINOR"
    dv, lv = nodecheck.version_tuple(drv), nodecheck.version_tuple(lib)
    words = f"gdrdrv {_v(drv)} (host), libgdrapi {lib} (image)"
    if dev != nodecheck.OPENED:
        return False, (
            f"{words}: cannot open {nodecheck.GDRDRV_DEVICE} in the container ({dev or 'not checked'}): map it "
            "(pyxis --container-mounts=/dev/gdrdrv, docker --device /dev/gdrdrv, Kubernetes a hostPath CharDevice in "
            "a privileged container: `reprostack launch` renders each)"
        )
    if dv is None or lv is None:
        return False, words + ": a version is unreadable (/sys/module/gdrdrv/version, libgdrapi.so.MAJOR.MINOR)"
    if dv[:2] < lv[:2]:
        return False, words + ": the host's driver is older than the image's library (CUDA error 719, GIN init failure)"
    if need_gin and dv[:2] < GIN_GDRDRV_FLOOR:
        return False, words + f": GIN needs gdrdrv >= {'.'.join(map(str, GIN_GDRDRV_FLOOR))} (aws-ofi-nccl)"
    return True, words


def _memlock(c, **_):
    m = c["memlock"]
    return (
        (True, "ulimit -l unlimited")
        if m == "unlimited"
        else (False, f"ulimit -l is {m or 'unknown'} (bytes), EFA needs unlimited (--ulimit memlock=-1)")
    )


def _hugepages(c, **_):
    h = c["hugepages"]
    words = f"HugePages_Total {h['total']}, HugePages_Free {h['free']}, Hugepagesize {h['size_kb']} kB"
    if h["total"] is None:
        return False, "/proc/meminfo has no HugePages_Total"
    if h["total"] > 0 and not h["free"]:
        return (
            False,
            words + ": every configured huge page is held, often by a previous job still running; libfabric's EFA"
            " buffers fall back to regular pages (prov/util/src/util_buf.c)",
        )
    return True, words


_NODE_JUDGES = {
    "driver": _driver,
    "fabricmanager": _fabricmanager,
    "nvlink": _nvlink,
    "ecc": _ecc,
    "xid": _xid,
    "pcie": _pcie,
    "efa-devices": _efa_devices,
    "efa-module": _efa_module,
    "gdrdrv": _gdrdrv,
    "efa-hmem": _efa_hmem,
    "memlock": _memlock,
    "hugepages": _hugepages,
}
