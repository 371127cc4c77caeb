"""What fails real p5en runs, read on one node for the cross-node preflight (cluster.preflight): the NVIDIA driver
against the image's CUDA, fabric manager, NVLink, the EFA devices libfabric lists, the efa kernel module, gdrdrv
against the image's libgdrapi, memlock, hugepages, ECC / retired pages / remapped rows / Xid, PCIe link width, and
the parser of the two-node EFA smoke (`fi_pingpong -p efa`).

Readers (pure, each tested on real tool output, tests/fixtures/preflight/README.md):
- `driver_cuda(nvidia-smi)`: the highest CUDA the driver supports (`CUDA Version: 12.7` of the header, or of
  `nvidia-smi -q`), `driver_version` the driver's own;
- `image_cuda(nvcc --version, $CUDA_VERSION)`: the CUDA the image's toolchain was built for (`release 13.0`, else
  the NVIDIA base images' `CUDA_VERSION=13.0.0`);
- `gpus_q(nvidia-smi -q)`: per GPU (`GPU 00000000:18:00.0` blocks) the Fabric State/Status, PCIe Link Width Max /
  Current, volatile and aggregate DRAM uncorrectable ECC counts, Pending Page Blacklist (retired pages), Remapped
  Rows Pending / Remapping Failure Occurred;
- `nvlink(nvidia-smi nvlink -s)`: per GPU its links, and the GPUs whose links NVML reports inactive
  (`<inactive>`, or `NVML: Unable to retrieve NVLink information as all links are inActive`);
- `efa_domains(fi_info -p efa)`: the EFA devices libfabric lists (distinct `domain:` names of provider `efa`, the
  `-rdm` / `-dgrm` suffix dropped: one device per NIC, however many fabrics and endpoint types it is listed for);
- `memlock(/proc/self/limits)`: `Max locked memory` soft limit (`unlimited` or bytes);
- `hugepages(/proc/meminfo)`: HugePages_Total, HugePages_Free, Hugepagesize (kB);
- `xid_lines(kernel log)`: the `NVRM: Xid (PCI:...): N, ...` lines;
- `kernel_module(root, name)`: a loaded module's `/sys/module/NAME/version` (gdrdrv: MODULE_VERSION `MAJOR.MINOR`,
  gdrcopy src/gdrdrv/gdrdrv.c and gdrdrv.h at v2.5.2; efa: `3.1.0g` from AWS's driver, amzn-drivers
  kernel/linux/efa/src/efa_main.c), `loaded` without one;
- `version_tuple("2.5")`, `libgdrapi_version(paths)`: the image's libgdrapi by its file name
  `libgdrapi.so.MAJOR.MINOR` (gdrcopy src/Makefile LIB_DYNAMIC at v2.5.2);
- `pingpong(fi_pingpong output)`: the table rows (bytes, MB/sec, usec/xfer); the bandwidth of the largest size;
- `efa_hmem(rc, fi_info -p efa -c FI_HMEM output)`: whether libfabric's efa provider offers FI_HMEM (GPU memory);
- `open_device(/dev/gdrdrv)`: whether the container can open GDRCopy's device read-write, as libgdrapi does.
`collect(...)` runs the tools (each bounded in time and output) and returns the facts; nothing here judges.

Invariants: never raises on content (bad or missing output is an empty fact plus a note); every tool is run with a
timeout and stdin closed; output over MAX_OUT characters is cut; at most MAX_ITEMS GPUs, links, devices, lines.
"""

from __future__ import annotations

import errno
import glob
import os
import re
import subprocess
from pathlib import Path

from ..launch.plan import GDRDRV_DEVICE

MAX_OUT = 1 << 20
OPENED = "opened"  # the gdrdrv_device fact of a node whose container opened /dev/gdrdrv read-write
# libfabric's own check that its efa provider serves GPU memory: fi_getinfo with FI_HMEM in the hints' caps (util/info.c
# at v2.6.0: `-c` parses FI_HMEM; prov/efa/src/efa_user_info.c efa_user_info_alter_rdm returns -FI_ENODATA when
# efa_user_info_should_support_hmem says no, e.g. CUDA not loaded); AWS's EFA installer tests it the same way
FI_HMEM_CMD = "fi_info -p efa -c FI_HMEM"
MAX_ITEMS = 1024
TIMEOUT_S = 30

_CUDA = re.compile(r"CUDA Version\s*:?\s*(\d{1,3})\.(\d{1,3})")
_DRIVER = re.compile(r"Driver Version\s*:?\s*([0-9][0-9.]{0,30})")
_NVCC = re.compile(r"\brelease (\d{1,3})\.(\d{1,3})\b")
_GPU_Q = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_KV = re.compile(r"^(\s*)([^:]{1,60}?)\s*:\s*(.{0,200}?)\s*$")
_NVL_GPU = re.compile(r"^GPU (\d{1,4}): (.{0,200})$")
_NVL_LINK = re.compile(r"^\s*Link (\d{1,3}): (.{0,80})$")
_NVL_DOWN = re.compile(r"all links are inActive", re.I)
_FI_BLOCK = re.compile(r"^provider:\s*(\S{1,80})\s*$")
_FI_DOMAIN = re.compile(r"^\s+domain:\s*(\S{1,200})\s*$")
_MEMLOCK = re.compile(r"^Max locked memory\s+(\S{1,40})\s+(\S{1,40})", re.M)
_MEMINFO = re.compile(r"^(HugePages_Total|HugePages_Free|Hugepagesize):\s*(\d{1,20})", re.M)
_XID = re.compile(r"NVRM: Xid \((PCI:[0-9A-Fa-f:.]{1,20})(?: GPU-C?I:\d{1,3}){0,2}\): (\d{1,5})\b.{0,300}")
_PP_ROW = re.compile(
    r"^(?:\[[^\]]{0,40}\]\s*)?(\d{1,9}(?:\.\d)?[kmg]?)\s+(\S{1,12})\s+=?(\S{1,12})\s+(\S{1,12})\s+([\d.]{1,12})s\s+"
    r"([\d.]{1,14})\s+([\d.]{1,14})\s+([\d.]{1,14})\s*$"
)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def run_tool(argv: list[str], timeout: float = TIMEOUT_S) -> tuple[int | None, str]:
    """(exit code or None when it could not run, stdout+stderr cut to MAX_OUT) of one tool. Never raises."""
    try:
        p = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", timeout=timeout, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        return None, f"{argv[0]}: not found"
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{argv[0]}: {e}"[:500]
    return p.returncode, (p.stdout + p.stderr)[:MAX_OUT]


def read_text(path: str | Path, limit: int = MAX_OUT) -> str | None:
    """A small system file's text (sysfs, procfs), None when it cannot be read. Never raises."""
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """(2, 5) of "2.5", (13, 0) of "13.0.88"; None when it does not start with a dotted number."""
    m = re.match(r"\s*(\d{1,6}(?:\.\d{1,6}){0,3})", text or "")
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def driver_cuda(text: str) -> tuple[str | None, str | None]:
    """(driver version, the CUDA version the driver supports) from nvidia-smi's header or `-q`."""
    d, c = _DRIVER.search(text or ""), _CUDA.search(text or "")
    return (d.group(1) if d else None), (f"{c.group(1)}.{c.group(2)}" if c else None)


def image_cuda(nvcc: str | None, env_cuda: str | None) -> tuple[str | None, str]:
    """(CUDA major.minor of the image's toolchain, where it was read)."""
    if nvcc and (m := _NVCC.search(nvcc)):
        return f"{m.group(1)}.{m.group(2)}", "nvcc --version"
    v = version_tuple(env_cuda)
    if v and len(v) >= 2:
        return f"{v[0]}.{v[1]}", "$CUDA_VERSION"
    return None, "no nvcc and no $CUDA_VERSION"


def _int(v: str | None) -> int | None:
    """A count or width of the tools' output (`16x` -> 16); None when it is not a whole number >= 0."""
    m = re.fullmatch(r"\s*(\d{1,18})x?\s*", str(v) if v is not None else "")
    return int(m.group(1)) if m else None


def gpus_q(text: str) -> list[dict]:
    """Per GPU of `nvidia-smi -q` (module doc), in order. Fields absent from the output are None."""
    out: list[dict] = []
    cur: dict | None = None
    path: list[tuple[int, str]] = []
    for raw in (text or "").splitlines():
        if m := _GPU_Q.match(raw):
            if len(out) >= MAX_ITEMS:
                break
            cur = {
                "bus": m.group(1),
                "fabric_state": None,
                "fabric_status": None,
                "pcie_width_max": None,
                "pcie_width_current": None,
                "ecc_volatile_dram_uncorrectable": None,
                "ecc_aggregate_dram_uncorrectable": None,
                "retired_pending": None,
                "remap_pending": None,
                "remap_failure": None,
            }
            out.append(cur)
            path = []
            continue
        if cur is None or not raw.strip():
            continue
        if ":" not in raw:  # a section header (`    Fabric`, `            Link Width`)
            indent, key, value = len(raw) - len(raw.lstrip()), raw.strip()[:60], ""
        else:
            m = _KV.match(raw)
            if not m:
                continue
            indent, key, value = len(m.group(1)), m.group(2).strip(), m.group(3).strip()
        while path and path[-1][0] >= indent:
            path.pop()
        where = [k for _, k in path]
        if not value:
            path.append((indent, key))
            continue
        if where[-1:] == ["Fabric"] and key in ("State", "Status"):
            cur["fabric_" + key.lower()] = value[:80]
        elif where[-1:] == ["Link Width"] and key in ("Max", "Current"):
            cur["pcie_width_" + key.lower()] = _int(value)
        elif where[-2:] in (["ECC Errors", "Volatile"], ["ECC Errors", "Aggregate"]) and key == "DRAM Uncorrectable":
            cur[f"ecc_{where[-1].lower()}_dram_uncorrectable"] = _int(value)
        elif where[-1:] == ["Retired Pages"] and key == "Pending Page Blacklist":
            cur["retired_pending"] = value[:20]
        elif where[-1:] == ["Remapped Rows"] and key == "Pending":
            cur["remap_pending"] = value[:20]
        elif where[-1:] == ["Remapped Rows"] and key == "Remapping Failure Occurred":
            cur["remap_failure"] = value[:20]
    return out


def nvlink(text: str) -> dict:
    """{"gpus": [{"gpu", "links", "inactive"}], "down": [gpu indexes NVML reports with every link inactive]}."""
    gpus: list[dict] = []
    cur = None
    for raw in (text or "").splitlines():
        if m := _NVL_GPU.match(raw):
            if len(gpus) >= MAX_ITEMS:
                break
            cur = {"gpu": int(m.group(1)), "links": 0, "inactive": 0, "all_inactive": False}
            gpus.append(cur)
        elif cur is not None and (m := _NVL_LINK.match(raw)):
            cur["links"] += 1
            if "inactive" in m.group(2).lower():
                cur["inactive"] += 1
        elif cur is not None and _NVL_DOWN.search(raw):
            cur["all_inactive"] = True
    return {
        "gpus": [{"gpu": g["gpu"], "links": g["links"], "inactive": g["inactive"]} for g in gpus],
        "down": [g["gpu"] for g in gpus if g["all_inactive"] or (g["links"] and g["inactive"] == g["links"])],
        "partial": [g["gpu"] for g in gpus if 0 < g["inactive"] < g["links"]],
    }


def efa_domains(text: str) -> list[str]:
    """The EFA devices `fi_info -p efa` lists (module doc), sorted."""
    devices, provider = set(), None
    for raw in (text or "").splitlines():
        if m := _FI_BLOCK.match(raw):
            provider = m.group(1)
        elif (m := _FI_DOMAIN.match(raw)) and provider and provider.split(";")[0] == "efa":
            devices.add(re.sub(r"-(rdm|dgrm)$", "", m.group(1)))
            if len(devices) >= MAX_ITEMS:
                break
    return sorted(devices)


def memlock(limits: str | None) -> str | None:
    """The soft `Max locked memory` of /proc/self/limits: "unlimited", a byte count, or None."""
    m = _MEMLOCK.search(limits or "")
    return m.group(1) if m else None


def hugepages(meminfo: str | None) -> dict:
    """{"total", "free", "size_kb"} of /proc/meminfo (None where absent)."""
    got = dict(_MEMINFO.findall(meminfo or ""))
    return {
        "total": _int(got.get("HugePages_Total")),
        "free": _int(got.get("HugePages_Free")),
        "size_kb": _int(got.get("Hugepagesize")),
    }


def xid_lines(log: str | None) -> list[str]:
    """The `NVRM: Xid (PCI:...): N, ...` lines of a kernel log (at most MAX_ITEMS, 300 characters each)."""
    return [m.group(0)[:300] for m in _XID.finditer(log or "")][:MAX_ITEMS]


def kernel_module(sys_root: str | Path, name: str) -> str | None:
    """A loaded kernel module's MODULE_VERSION (`/sys/module/NAME/version`), `loaded` when it is loaded without one
    (`/sys/module/NAME/` holds `initstate` or `refcnt` for every loaded module; the in-tree efa driver has no
    version, AWS's out-of-tree one (amzn-drivers) does), None when it is not loaded. Never raises."""
    d = Path(sys_root) / "sys" / "module" / name
    v = read_text(d / "version", 200)
    if v is not None:
        v = "".join(c for c in v.strip() if c.isprintable())[:80]
        if v:
            return v
    return "loaded" if (d / "initstate").exists() or (d / "refcnt").exists() else None


def libgdrapi_version(paths: list[str]) -> str | None:
    """MAJOR.MINOR of the newest `libgdrapi.so.MAJOR.MINOR` among `paths` (the image's library)."""
    best = None
    for p in paths:
        m = re.search(r"libgdrapi\.so\.(\d{1,4})\.(\d{1,4})", os.path.basename(p))
        if m and (best is None or (int(m.group(1)), int(m.group(2))) > best):
            best = (int(m.group(1)), int(m.group(2)))
    return f"{best[0]}.{best[1]}" if best else None


def efa_hmem(rc: int | None, text: str) -> dict:
    """{"offered": bool, "detail": str} of `fi_info -p efa -c FI_HMEM`: offered when it exits 0 and lists a
    `provider: efa` entry (util/info.c print_short_info); otherwise the detail is its exit and first line (libfabric
    v2.6.0 prints `fi_getinfo: -61 (No data available)` on stderr and exits 61 when no provider offers FI_HMEM)."""
    listed = any(m.group(1).split(";")[0] == "efa" for m in map(_FI_BLOCK.match, (text or "").splitlines()) if m)
    if rc == 0 and listed:
        return {"offered": True, "detail": f"{FI_HMEM_CMD}: provider efa"}
    first = next((" ".join(ln.split())[:200] for ln in (text or "").splitlines() if ln.strip()), "no output")
    why = f"exit {rc}" if rc is not None else "did not run"
    return {"offered": False, "detail": f"{FI_HMEM_CMD}: {why}: {first}"[:400]}


def open_device(path: str) -> str:
    """OPENED when `path` opens read-write as libgdrapi opens /dev/gdrdrv (gdrcopy src/gdrapi.c gdr_open: O_RDWR |
    O_CLOEXEC), else the errno's name and text (ENOENT: not in the container; EPERM: a device cgroup refuses it)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        return f"{errno.errorcode.get(e.errno, 'E?')}: {e.strerror or e}"[:200]
    os.close(fd)
    return OPENED


def _size(tok: str) -> int | None:
    """Bytes of fabtests' size_str (`64`, `4k`, `1.5k`: one decimal, truncated, so the bytes are a floor)."""
    m = re.fullmatch(r"(\d{1,9})(?:\.(\d))?([kmg]?)", tok)
    if not m:
        return None
    unit = _UNITS[m.group(3)]
    return int(m.group(1)) * unit + int(m.group(2) or 0) * unit // 10


def pingpong(text: str) -> dict:
    """{"rows": [{"bytes", "mb_s", "usec"}], "bytes", "mb_s"}: the table of fi_pingpong, and its largest size's
    MB/sec (fabtests' MB/sec: 10^6 bytes per second); None without a row."""
    rows = []
    for raw in (text or "").splitlines():
        if m := _PP_ROW.match(raw.strip()):
            size = _size(m.group(1))
            try:
                mb, us = float(m.group(6)), float(m.group(7))
            except ValueError:
                continue
            if size is not None and len(rows) < MAX_ITEMS:
                rows.append({"bytes": size, "mb_s": mb, "usec": us})
    top = max(rows, key=lambda r: r["bytes"]) if rows else None
    return {"rows": rows, "bytes": top["bytes"] if top else None, "mb_s": top["mb_s"] if top else None}


LIBGDRAPI_GLOBS = (
    "/usr/lib/x86_64-linux-gnu/libgdrapi.so.*",
    "/usr/lib64/libgdrapi.so.*",
    "/usr/lib/libgdrapi.so.*",
    "/usr/local/lib/libgdrapi.so.*",
    "/opt/gdrcopy/lib*/libgdrapi.so.*",
    "/opt/amazon/efa/lib*/libgdrapi.so.*",
)


def collect(*, need_gpu: bool, need_efa: bool, sys_root: str = "/", gdrdrv_device: str = GDRDRV_DEVICE) -> dict:
    """This node's facts for the checks above (schemas/preflight-node.schema.json `node`). Tools a profile does not
    need are not run (their facts stay None); FI_HMEM is asked only where both EFA and a GPU are."""
    root = Path(sys_root)
    notes: list[str] = []
    facts: dict = {
        "driver_version": None,
        "driver_cuda": None,
        "image_cuda": None,
        "image_cuda_source": None,
        "gpus": [],
        "nvlink": None,
        "efa_fi_devices": None,
        "efa_module": None,
        "gdrdrv": None,
        "libgdrapi": None,
        "gdrdrv_device": None,
        "efa_hmem": None,
        "memlock": memlock(read_text("/proc/self/limits")),
        "hugepages": hugepages(read_text(root / "proc/meminfo")),
        "xid": None,
        "notes": "",
    }
    if need_gpu:
        rc, q = run_tool(["nvidia-smi", "-q"])
        if rc == 0:
            facts["driver_version"], facts["driver_cuda"] = driver_cuda(q)
            facts["gpus"] = gpus_q(q)
        else:
            notes.append(f"nvidia-smi -q: {f'exit {rc}: ' if rc is not None else ''}{q.strip()[:200]}")
        rc, nvl = run_tool(["nvidia-smi", "nvlink", "-s"])
        facts["nvlink"] = nvlink(nvl) if rc == 0 or _NVL_DOWN.search(nvl) else None
        if facts["nvlink"] is None:
            notes.append(f"nvidia-smi nvlink -s: {nvl.strip()[:200]}")
        rc, nvcc = run_tool(["nvcc", "--version"])
        facts["image_cuda"], facts["image_cuda_source"] = image_cuda(
            nvcc if rc == 0 else None, os.environ.get("CUDA_VERSION")
        )
        log = None
        rc, dmesg = run_tool(["dmesg"], timeout=10)
        if rc == 0:
            log = dmesg
        else:
            log = read_text(root / "var/log/kern.log")
        facts["xid"] = None if log is None else {"lines": xid_lines(log)}
    if need_efa:
        rc, fi = run_tool(["fi_info", "-p", "efa"])
        facts["efa_fi_devices"] = efa_domains(fi) if rc == 0 else []
        facts["efa_module"] = kernel_module(root, "efa")
        facts["gdrdrv"] = kernel_module(root, "gdrdrv")
        facts["gdrdrv_device"] = open_device(gdrdrv_device)
        found = [p for g in LIBGDRAPI_GLOBS for p in glob.glob(str(root) + g)][:MAX_ITEMS]
        facts["libgdrapi"] = libgdrapi_version(found)
    if need_efa and need_gpu:
        facts["efa_hmem"] = efa_hmem(*run_tool(FI_HMEM_CMD.split()))
    facts["notes"] = "; ".join(notes)[:1000]
    return facts
