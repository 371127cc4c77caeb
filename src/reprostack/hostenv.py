"""Host mode: what a gate that ran without its image ran on, and how that differs from the image's wheelset.

A gate run in host mode (`--no-container`, or a host with no container runtime, like the lent H200) tests the
host, not the pinned stack. Its report says so (`provenance.execution.mode = "host"`) and records:

- an environment fingerprint of the interpreter that ran the gate (the one that holds torch, which is not
  necessarily this process): its version and path, the versions of the distributions that decide the
  transport (torch, the NCCL / NVSHMEM / CUDA runtime wheels), and the sha256 of its sorted `name==version`
  list (the equivalent of a `pip freeze` digest: two hosts with the same digest have the same distributions);
- the drift against the locked wheelset of the gate's image (`substrate-wheels` unless told otherwise): each
  locked distribution that is missing or at another version on the host.

Invariants:
- the fingerprint is read with `importlib.metadata` in a child process of the given interpreter: nothing is
  imported from torch or any other package (a broken CUDA stack still gets a fingerprint), nothing is
  installed or written;
- nothing here raises for a missing or failing interpreter: the fingerprint then holds `error` and a drift
  cannot be computed (`drift` is None, never an empty list that would read as "no difference").
"""

from __future__ import annotations

import hashlib
import json
import subprocess

from .errors import ReprostackError
from .lock import Lock, WheelsetPin, canonical_name

MODE_HOST = "host"
MODE_CONTAINER = "container"
DEFAULT_WHEELSET = "substrate-wheels"

# Distributions whose versions decide what the transport is; recorded by name in the fingerprint.
KEY_DISTRIBUTIONS = (
    "torch",
    "nvidia-nccl-cu13",
    "nvidia-nccl-cu12",
    "nvidia-nvshmem-cu13",
    "nvidia-nvshmem-cu12",
    "nvidia-cuda-runtime",
    "nvidia-cuda-runtime-cu12",
    "cuda-toolkit",
    "triton",
    "deep-ep",
    "megatron-core",
    "vllm",
    "sglang",
    "tensorrt-llm",
)

_PROBE = r"""
import json, platform, sys
from importlib import metadata
dists = {}
for d in metadata.distributions():
    name = (d.metadata.get("Name") or "").strip()
    if name:
        dists.setdefault(name, d.version)
print(json.dumps({"python": platform.python_version(), "executable": sys.executable,
                  "implementation": platform.python_implementation(), "distributions": dists}))
"""

_TIMEOUT_S = 60


def fingerprint(python: str) -> dict:
    """Environment fingerprint of interpreter `python` (see the module docstring).

    Keys: python, executable, implementation, key (canonical name -> version, for KEY_DISTRIBUTIONS present),
    distributions (count), freeze_sha256 (sha256 of the sorted `name==version` lines, canonical names),
    installed (canonical name -> version); or {"executable": python, "error": why} when it cannot be read.
    """
    try:
        p = subprocess.run(
            [python, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"executable": python, "error": f"{python}: {e}"}
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or [""])[-1]
        return {"executable": python, "error": f"{python}: exit {p.returncode}: {last}"[:300]}
    try:
        raw = json.loads(p.stdout)
        installed = {canonical_name(str(k)): str(v) for k, v in raw["distributions"].items()}
    except (ValueError, KeyError, AttributeError, TypeError) as e:
        return {"executable": python, "error": f"{python}: unreadable probe output: {e}"}
    freeze = "".join(f"{n}=={installed[n]}\n" for n in sorted(installed))
    return {
        "python": raw.get("python"),
        "executable": raw.get("executable"),
        "implementation": raw.get("implementation"),
        "key": {n: installed[n] for n in KEY_DISTRIBUTIONS if n in installed},
        "distributions": len(installed),
        "freeze_sha256": hashlib.sha256(freeze.encode()).hexdigest(),
        "installed": installed,
    }


def locked_wheelset(lock: Lock, name: str) -> dict[str, str]:
    """canonical name -> version of wheelset pin `name`, with the wheelsets it is installed on (lowest first;
    an upper layer's version wins). Raises ReprostackError (via Lock.get) for an unknown pin."""
    pin = lock.get(name)
    layers = []
    seen = set()
    while isinstance(pin, WheelsetPin) and pin.name not in seen:
        seen.add(pin.name)
        layers.append(pin)
        pin = lock.get(pin.installed_on) if pin.installed_on else None
    out: dict[str, str] = {}
    for layer in reversed(layers):
        out.update({f.name: f.version for f in layer.files})
    return out


def drift(fp: dict, locked: dict[str, str]) -> list[dict] | None:
    """Locked distributions missing or at another version on the host: [{name, locked, installed}] sorted by
    name (installed None: missing). None when the fingerprint could not be read."""
    if "installed" not in fp:
        return None
    have = fp["installed"]
    return [{"name": n, "locked": v, "installed": have.get(n)} for n, v in sorted(locked.items()) if have.get(n) != v]


def host_execution(lock: Lock, python: str, wheelset: str = DEFAULT_WHEELSET) -> dict:
    """`provenance.execution` of a host-mode gate run: mode, the fingerprint (without the full list of
    distributions, which only feeds the digest and the drift), the wheelset compared with and the drift."""
    fp = fingerprint(python)
    try:
        locked = locked_wheelset(lock, wheelset)
    except ReprostackError as e:  # a lock without that wheelset: the drift is unknown, the fingerprint stands
        locked, why = None, str(e)
    else:
        why = None
    d = drift(fp, locked) if locked is not None else None
    out = {
        "mode": MODE_HOST,
        "note": "host mode: the gate ran on this host's own packages, not inside the pinned image",
        "environment": {k: v for k, v in fp.items() if k != "installed"},
        "wheelset": wheelset,
        "wheelset_drift": d,
    }
    if why:
        out["wheelset_error"] = why
    if d is not None:
        out["wheelset_drift_count"] = len(d)
    return out


def describe(execution: dict) -> str:
    """One line for summaries: `host mode (python 3.12.3, torch 2.11.0, freeze 1a2b3c4d…; 5 of substrate-wheels differ)`
    or `container mode (vllm sha256:0123456789ab…, lock 1a2b3c4d…)`."""
    if execution.get("mode") == MODE_CONTAINER:  # reprostack.gates.container
        kernels = execution.get("kernels") if isinstance(execution.get("kernels"), dict) else {}
        pre = (
            f"; kernels prebuilt in the image, manifest {str(kernels.get('manifest_sha256'))[:8]}…"
            if kernels.get("mode") == "prebuilt"
            else ""
        )
        return (
            f"container mode ({execution.get('image')} {str(execution.get('image_id'))[:19]}…, "
            f"lock {str(execution.get('lock_sha256'))[:8]}…{pre})"
        )
    if execution.get("mode") != MODE_HOST:
        return str(execution.get("mode", "?"))
    env = execution.get("environment", {})
    if "error" in env:
        return f"host mode (environment unreadable: {env['error']})"
    torch = env.get("key", {}).get("torch", "none")
    n = execution.get("wheelset_drift_count")
    diff = f"{n} of {execution.get('wheelset')} differ" if n is not None else "drift unknown"
    return f"host mode (python {env.get('python')}, torch {torch}, freeze {str(env.get('freeze_sha256'))[:8]}…; {diff})"
