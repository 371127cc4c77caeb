"""Classify why a gate's process failed, from its merged log, exit code and the watchdog's verdict.

Kinds (`FailureClass.kind`):
  timeout              the watchdog killed it (`timed_out`); detail names the earliest other evidence
  oom                  CUDA out of memory / OutOfMemoryError / kernel OOM killer
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
crashed first prints first; its peers then report NCCL errors or barrier timeouts). A C++ `terminate called
after throwing` line is classified by its `what():` text, else sigabrt.
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
            r"|CUDA_ERROR_OUT_OF_MEMORY|Out of memory: Killed process|oom-kill"
        ),
    ),
    ("gin_barrier_timeout", re.compile(r"Gin barrier timeout")),
    ("ep_timeout", re.compile(r"NVLink barrier timeout|CPU wait exception \(")),
    ("ep_assertion", re.compile(r"Assertion exception \(|Assertion failed: \S+:\d+, condition:")),
    (
        "cuda_error",
        re.compile(
            r"CUDA (?:runtime|driver) exception \(|CUDA error|cudaError[A-Z]\w*|CUDA_ERROR_\w+"
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

    def to_dict(self) -> dict:
        """JSON-ready dict of the four fields."""
        return {"kind": self.kind, "first_line": self.first_line, "detail": self.detail, "line_no": self.line_no}


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

    hit = None  # (index, kind, extra detail)
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
        hit = (i, kind, extra)
        break

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
