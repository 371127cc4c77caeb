"""Classify why a gate's process failed, from its merged log, exit code and the watchdog's verdict.

Kinds (`FailureClass.kind`):
  timeout              the watchdog killed it (`timed_out`); detail names the earliest other evidence
  oom                  CUDA out of memory / OutOfMemoryError / kernel OOM killer / NCCL `Cuda failure 'out of memory'`
  cuda_invalid_device  `invalid device ordinal` (CUDA, or NCCL's `Cuda failure 101 'invalid device ordinal'`)
  nccl_topology        NCCL's topology detection WARNs (src/graph/*.cc: no CPU close to GPU, no real path of a PCI
                       device, a GPU or NIC missing from the topology, several ranks on one GPU, a bad topology XML)
  ofi_provider         aws-ofi-nccl (`NET/OFI ...`) or libfabric could not open the provider: fi_getinfo failed or
                       returned no EFA provider, fabric/domain/endpoint creation failed, libfabric too old
  net_plugin           NCCL `Failed to initialize any NET plugin` (NCCL_NET names a plugin that is not there)
  gin_barrier_timeout  DeepEP device `DeepEP Gin barrier timeout, tag: ...`
  ep_timeout           DeepEP `NVLink barrier timeout` or an EPException `... CPU wait exception (...)`
  ep_assertion         DeepEP EPException `Assertion exception (file:line): cond`, or device `Assertion failed:`
  cuda_error           `CUDA runtime/driver exception`, `CUDA error`, cudaError*/CUDA_ERROR_*, illegal memory access
  nccl_error           EPException `NCCL exception`, `NCCL error`, DistBackendError, nccl*Error, PG watchdog
                       collective timeout, `gin_host.cc ... error N`
  sigsegv / sigabrt / sigbus   crash text (`Segmentation fault`, `Fatal Python error: ...`, torchrun
                       `Signal 11 (SIGSEGV)`, `exitcode: -11`) or the exit code (-11/139, -6/134, -7/135)
  sigkill / signal     exit code -9/137 (OOM killer or an external kill) / any other signal, with no text evidence
  python_exception     a Traceback: its last exception line (of the first chain); used only when none above
  incomplete_output    exit code 0 (or None) and no error text, but the caller found the output incomplete
  unknown              non-zero exit, no recognised error text

Rule: among lines matching the kinds oom ... sigbus, the earliest line wins (in a multi-rank job the rank that
crashed first prints first; its peers then report NCCL errors or barrier timeouts), with one exception: an
out-of-memory line anywhere in the checked output wins over a NCCL / CUDA error or a timeout on either side of it
(NCCL reports an allocation failure as `unhandled cuda error` first and prints the CUDA text on a later line; a
peer's NCCL error can come first): the detail names the other line. A C++ `terminate called after throwing` line
is classified by its `what():` text, else sigabrt. Each kind has one hint (`HINTS`): what to check first.

Sources of the patterns: the WARN texts at the pinned revs of upstreams.lock (NCCL 1933fdd6: src/include/checks.h,
src/include/cudawrap.h `Cuda failure`, src/graph/{paths,search,topo,xml}.cc, src/plugin/net.cc; aws-ofi-nccl
12166be6: src/nccl_ofi_net.cpp, src/nccl_ofi_rdma.cpp, src/nccl_ofi_ofiutils.cpp, include/nccl_ofi_log.h's
`NET/OFI ` prefix; libfabric 5de2d6a2: src/fabric.c, prov/efa/src/efa_device.c) and older releases' texts seen in
public bug reports; tests/data/failure_corpus.yaml holds each real line with its source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .logtext import numbered_lines, prefix_rank

_KINDS: list[tuple[str, re.Pattern]] = [
    (
        "oom",
        re.compile(
            r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|cudaErrorMemoryAllocation"
            r"|CUDA_ERROR_OUT_OF_MEMORY|Out of memory: Killed process|oom-kill|Cuda failure (?:\d+ )?'out of memory'"
        ),
    ),
    (
        "cuda_invalid_device",
        re.compile(r"invalid device ordinal|cudaErrorInvalidDevice\b|CUDA_ERROR_INVALID_DEVICE\b"),
    ),
    (
        "nccl_topology",
        re.compile(
            r"[Cc]ould not find CPU close to GPU|Could not find real path of|could not find (?:DEV|GPU) for GPU"
            r"|could not find PCI SW|Could not find (?:NET|net) (?:with )?id|Could not find any local path from gpu"
            r"|Could not find intermediate GPU|Could not find gpu rank|Could not find GPU in topology"
            r"|No path computed to go from|Multiple ranks detected using the same GPU|XML Topology has wrong version"
            r"|XML Parse(?: error)? :|Attribute \w+ of node \w+ not found|Set CPU affinity : unable to find GPU/CPU"
            r"|P2P is disabled between NVLINK connected GPUs|TOPO/NET : (?:Couldn't|Can't|Tried|Only matched|Could not)"
            r"|tried to create too many nodes|too many Topo links"
        ),
    ),
    (
        "ofi_provider",
        re.compile(
            r"NET/OFI (?:OFI fi_getinfo\(\) call failed|Couldn't open a fabric provider|Unable to find a protocol"
            r"|Initializing plugin failed|EFA provider requires at least libfabric|Could not find any optimal provider"
            r"|Couldn't (?:create fabric|create domain|allocate endpoint|open AV|create completion queue|enable endpoint)"
            r"|Failed to initialize (?:sendrecv|rdma) protocol)"
            r"|fi_getinfo: provider efa output empty list|efa_device_construct_(?:gid|data) failed"
        ),
    ),
    ("net_plugin", re.compile(r"Failed to initialize any NET plugin")),
    ("gin_barrier_timeout", re.compile(r"Gin barrier timeout")),
    ("ep_timeout", re.compile(r"NVLink barrier timeout|CPU wait exception \(")),
    ("ep_assertion", re.compile(r"Assertion exception \(|Assertion failed: \S+:\d+, condition:")),
    (
        "cuda_error",
        re.compile(
            r"CUDA (?:runtime|driver) exception \(|CUDA error|cudaError[A-Z]\w*|CUDA_ERROR_\w+|Cuda failure (?:\d+ )?'"
            r"|illegal memory access|unspecified launch failure|device-side assert"
        ),
    ),
    (
        "nccl_error",
        re.compile(
            r"NCCL exception \(|NCCL error|DistBackendError|nccl(?:Unhandled\w*|System|Internal"
            r"|InvalidArgument|InvalidUsage|Remote)Error|Watchdog caught collective operation timeout"
            r"|gin_host\.cc.*\berror\b"
        ),
    ),
    ("sigsegv", re.compile(r"Segmentation fault|SIGSEGV|[Ss]ignal 11\b|exitcode\s*:\s*-11\b")),
    (
        "sigabrt",
        re.compile(r"Fatal Python error: Aborted|SIGABRT|[Ss]ignal 6\b|exitcode\s*:\s*-6\b|\bAborted \(core dumped\)"),
    ),
    ("sigbus", re.compile(r"Fatal Python error: Bus error|SIGBUS|[Ss]ignal 7\b|\bBus error\b")),
]
HINTS: dict[str, str] = {
    "timeout": "the watchdog's limit was reached: read the earliest evidence first; a first run JIT-compiles kernels",
    "oom": "GPU memory ran out: another process on the GPU (nvidia-smi), or a batch/buffer size too large",
    "cuda_invalid_device": "a rank asked for a GPU it cannot see: CUDA_VISIBLE_DEVICES, --gpus and ranks per node",
    "nccl_topology": "NCCL could not map the GPUs/NICs: /sys must be visible in the container (PCI paths), one GPU "
    "per rank, NCCL_TOPO_FILE valid",
    "ofi_provider": "libfabric found no usable EFA provider: /dev/infiniband/uverbs* mapped into the container, "
    "FI_PROVIDER=efa, the image's libfabric >= the plugin's, memlock unlimited (`reprostack preflight` checks each)",
    "net_plugin": "NCCL_NET names a NET plugin NCCL did not load: is libnccl-net-ofi.so on LD_LIBRARY_PATH "
    "(NCCL_NET_PLUGIN), and built for this NCCL?",
    "gin_barrier_timeout": "a peer never reached DeepEP's GIN barrier: look at the other ranks' logs for the first error",
    "ep_timeout": "a DeepEP barrier or CPU wait timed out: the other ranks' first error, or a hung peer",
    "ep_assertion": "a DeepEP assertion failed: its file:line names the condition (often a config the kernel refuses)",
    "cuda_error": "a CUDA error: rerun with CUDA_LAUNCH_BLOCKING=1 to locate it; check the driver against the image",
    "nccl_error": "NCCL failed: rerun with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET) and read the first WARN",
    "sigsegv": "a crash in native code: the innermost frame names the library; an ABI skew between torch, NCCL "
    "and the DeepEP build is the usual cause",
    "sigabrt": "an abort: the `what():` or assertion text above it says why",
    "sigbus": "a bus error: often /dev/shm too small in a container (--shm-size) or a truncated file",
    "sigkill": "killed (SIGKILL): the kernel's OOM killer (dmesg) or the scheduler's time/memory limit",
    "signal": "killed by a signal from outside: the scheduler, or a user",
    "python_exception": "a Python exception: its last line says what; the traceback above says where",
    "incomplete_output": "the process exited 0 without the expected output: a different test or mode ran",
    "unknown": "no known error text: read the last lines of the log (the report names them)",
}
_NOT_ROOT = ("nccl_error", "cuda_error", "timeout")  # an out-of-memory line elsewhere is the cause
_TERMINATE = re.compile(r"terminate called after throwing")
_WHAT = re.compile(r"what\(\):\s*(.*)")
_TRACEBACK = re.compile(r"^\s*Traceback \(most recent call last\):")
_CHAIN = re.compile(
    r"^(?:During handling of the above exception|The above exception was the direct cause"
    r"|-- Process \d+ terminated with the following error)"
)
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+),? in (?P<func>\S+)')
_STACK_HEAD = re.compile(r"(?P<current>Current thread|Thread|Stack)\b.*\(most recent call first\):")
_WATCHDOG = re.compile(r"\[reprostack watchdog\]")
_RC_KINDS = {
    -11: "sigsegv",
    139: "sigsegv",
    -6: "sigabrt",
    134: "sigabrt",
    -7: "sigbus",
    135: "sigbus",
    -9: "sigkill",
    137: "sigkill",
}


@dataclass(frozen=True)
class FailureClass:
    """Why it failed: `kind` (see module doc), `first_line` = `"line N: <text>"` of the first evidence line
    (None when the verdict comes from the exit code alone), `detail` = one human sentence, `line_no` = N."""

    kind: str
    first_line: str | None
    detail: str
    line_no: int | None = None

    @property
    def hint(self) -> str:
        """What to check first for this kind (HINTS)."""
        return HINTS.get(self.kind, HINTS["unknown"])

    def to_dict(self) -> dict:
        """JSON-ready dict of the four fields and the hint."""
        return {
            "kind": self.kind,
            "first_line": self.first_line,
            "detail": self.detail,
            "line_no": self.line_no,
            "hint": self.hint,
        }

    def line(self) -> str:
        """One line for a report's reason: kind, detail, the first evidence line, the hint."""
        at = f" ({self.first_line})" if self.first_line else ""
        return f"{self.kind}: {self.detail}{at}; hint: {self.hint}"


def evidence_kind(body: str) -> str | None:
    """The failure kind one log line (prefix stripped) is evidence of, or None."""
    for kind, rx in _KINDS:
        if rx.search(body):
            return kind
    return "sigabrt" if _TERMINATE.search(body) else None


def _innermost_frame(lines, start: int) -> str | None:
    """After a `Fatal Python error` at index `start`: the first (innermost) frame of the crashing thread's
    faulthandler stack (`Current thread ... (most recent call first):`, else of the first stack shown),
    as `file:line in func`. Follows the crash line's rank (launcher prefix); looks at most 400 lines ahead."""
    who, stacks = prefix_rank(lines[start][1]), []  # [is_current, first_frame]
    for _no, pre, body in lines[start + 1 : start + 400]:
        if prefix_rank(pre) != who:
            continue
        head = _STACK_HEAD.search(body)
        if head:
            stacks.append([head.group("current") == "Current thread", None])
            continue
        f = _FRAME.search(body)
        if f and stacks and stacks[-1][1] is None:
            stacks[-1][1] = f"{f['file']}:{f['line']} in {f['func']}"
            if stacks[-1][0]:
                break
    return next((fr for cur, fr in stacks if cur and fr), None) or next((fr for _c, fr in stacks if fr), None)


def _python_exception(lines) -> tuple[int, str] | None:
    """(index, text) of the last exception line of the first Traceback chain, following its rank's lines."""
    start = next((i for i, (_n, _p, b) in enumerate(lines) if _TRACEBACK.match(b)), None)
    if start is None:
        return None
    who, state, found = prefix_rank(lines[start][1]), "frames", None
    for i in range(start + 1, len(lines)):
        _no, pre, body = lines[i]
        if prefix_rank(pre) != who:
            continue
        if not body.strip():
            continue
        if _TRACEBACK.match(body):
            state = "frames"
        elif state == "frames" and body[:1].isspace():
            continue
        elif state == "frames":
            found, state = (i, body.strip()), "after"
        elif _CHAIN.match(body.strip()):
            state = "between"
        else:
            break
    return found


def _first_hit(lines, limit: int):
    """(index, kind, extra detail) of the earliest line of lines[:limit] that is evidence of a kind, None when none:
    a C++ `terminate` line by its `what():` text, a `Fatal Python error` with its innermost frame."""
    for i, (no, pre, body) in enumerate(lines[:limit]):
        kind = evidence_kind(body)
        if kind is None:
            continue
        extra = ""
        if _TERMINATE.search(body):
            what = next(
                (
                    _WHAT.search(b)
                    for _n, p, b in lines[i + 1 : i + 4]
                    if prefix_rank(p) == prefix_rank(pre) and _WHAT.search(b)
                ),
                None,
            )
            if what:
                kind, extra = (
                    evidence_kind(what.group(1)) or "sigabrt",
                    f"uncaught C++ exception: {what.group(1)[:200]}",
                )
        if kind in ("sigsegv", "sigabrt", "sigbus") and body.lstrip().startswith("Fatal Python error"):
            frame = _innermost_frame(lines, i)
            extra = f"innermost Python frame: {frame}" if frame else "no Python frame in the faulthandler output"
        return (i, kind, extra)
    return None


def _oom_over(lines, hit, timed_out: bool):
    """The hit, or an out-of-memory line when the hit is a consequence of one (_NOT_ROOT); its detail names the
    hit's line."""
    if hit is None and not timed_out:
        return hit
    if hit is not None and hit[1] not in _NOT_ROOT:
        return hit
    oom = next((i for i, (_n, _p, b) in enumerate(lines) if _KINDS[0][1].search(b)), None)
    if oom is None:
        return hit
    if hit is None:
        return (oom, "oom", "")
    return (oom, "oom", f"then {hit[1]} at line {lines[hit[0]][0]}" if hit[0] != oom else hit[2])


def classify_failure(text: str, returncode: int | None, timed_out: bool, *, parse=None) -> FailureClass:
    """Classify a failed run (see the module doc for kinds and the earliest-evidence rule).

    text: the merged stdout+stderr log; returncode: as subprocess reports it (negative = killed by that signal;
    128+N from a shell); timed_out: the watchdog killed it. `parse`: test_ep's parse of this text
    (parsers.test_ep.classify_test_ep_failure passes it; its completed_line, complete and problems are read): when
    the output is complete, error lines after the last expected phase line of the checked mode(s) are ignored
    (teardown noise, or a later mode the gate does not check).
    Never raises on log content.
    """
    lines = numbered_lines(text)
    limit = len(lines) if parse is None or parse.completed_line is None else parse.completed_line
    rc_text = "no exit code" if returncode is None else f"exit code {returncode}"

    hit = _oom_over(lines[:limit], _first_hit(lines, limit), timed_out)  # (index, kind, extra detail)

    def where(i: int) -> tuple[str, int]:
        no, pre, body = lines[i]
        return f"line {no}: {(pre + body).strip()[:300]}", no

    def rank_of(i: int) -> str:
        r = prefix_rank(lines[i][1])
        return f" (rank {r})" if r is not None else ""

    if timed_out:
        if hit:
            first, no = where(hit[0])
            return FailureClass(
                "timeout",
                first,
                f"killed by the watchdog; earliest evidence: {hit[1]}{rank_of(hit[0])}"
                f"{': ' + hit[2] if hit[2] else ''}",
                no,
            )
        wd = next((i for i, (_n, _p, b) in enumerate(lines) if _WATCHDOG.search(b)), None)
        first, no = where(wd) if wd is not None else (None, None)
        return FailureClass("timeout", first, "killed by the watchdog; no error line before it", no)

    if hit:
        i, kind, extra = hit
        first, no = where(i)
        detail = f"{kind}{rank_of(i)}, {rc_text}" + (f"; {extra}" if extra else "")
        return FailureClass(kind, first, detail, no)

    exc = _python_exception(lines[:limit])
    if exc:
        first, no = where(exc[0])
        return FailureClass("python_exception", first, f"{exc[1][:300]}{rank_of(exc[0])}, {rc_text}", no)

    after = (
        "; every checked phase line was printed before it (teardown or a later mode)"
        if parse is not None and parse.complete
        else ""
    )
    if returncode in _RC_KINDS:
        return FailureClass(_RC_KINDS[returncode], None, f"{rc_text}, no error line in the log{after}")
    if returncode is not None and returncode < 0:
        return FailureClass("signal", None, f"killed by signal {-returncode}, no error line in the log{after}")
    if not returncode:
        why = "; ".join(parse.problems[:3]) if parse is not None and parse.problems else "expected output missing"
        return FailureClass("incomplete_output", None, f"{rc_text} but {why}")
    last = next((i for i in range(len(lines) - 1, -1, -1) if lines[i][2].strip()), None)
    tail = f"; last line: {where(last)[0]}" if last is not None else "; empty log"
    return FailureClass("unknown", None, f"{rc_text}, no recognised error line{after}{tail}")
