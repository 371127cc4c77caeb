"""The pinned AIPerf as a tool: its own virtual environment, built from the wheel the lock pins by sha256.

AIPerf 0.10.0 needs ~130 packages (transformers, datasets, pandas, pyarrow, matplotlib, ...) and pins
`rich~=14.1` against our `rich==15.0.0`, so it never shares reprostack's environment: `ensure_aiperf` builds
`<cache>/tools/aiperf-<version>-<sha12>-py<X.Y>/` once (the wheel downloaded with `pip download --no-deps`,
its sha256 checked against `upstreams.lock`, then installed with `gates/aiperf-constraints.txt` as pip
constraints) and marks it verified; later calls reuse it. `REPROSTACK_WHEELHOUSE` (folders joined by `:`) makes pip use only those folders.
In a gate image (containers/gate-selftest) the venv is built into the image from the lock's `aiperf-wheels` set and
named by `REPROSTACK_AIPERF_VENV`: it is then used as is (its marker must name a wheel sha256 the lock pins) and
never built or changed; a venv there without that marker is one GateError line.
The venv comes from `python -m venv`, which needs ensurepip (Debian/Ubuntu: the python3-venv package); a failure is
one GateError line. `python -m reprostack.gates.aiperftool [CACHE_ROOT]` (the tests session's install step) builds it.
One venv for tests and gates: both default to the reprostack cache ($REPROSTACK_CACHE or the user cache dir; the tests
take $REPROSTACK_TEST_TOOLS when set), and the build runs under a file lock, so a test run and a gate arriving together
build it once.

`make_test_tokenizer` writes a tiny HuggingFace tokenizer folder (WordLevel, whitespace split) with the tool
venv's `tokenizers` package: AIPerf needs a tokenizer, and a local folder needs no network. AIPerf 0.10.0 must
then run with HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE unset: in offline mode it resolves every tokenizer name
through `snapshot_download(local_files_only=True)`, which rejects a filesystem path (HFValidationError).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from ..digest import sha256_file
from ..errors import GateError, ReprostackError
from ..lock import Lock, WheelPin, load

PIN = "aiperf"
_MARKER = ".reprostack-verified.json"
VENV_ENV = "REPROSTACK_AIPERF_VENV"  # a prebuilt venv (a gate image's): used as is, never built


@dataclass(frozen=True)
class AiperfTool:
    """A ready AIPerf: `exe` (the `aiperf` script), `python` (its venv's interpreter), `version`, `sha256` of the
    wheel installed, `venv` folder."""

    exe: Path
    python: Path
    version: str
    sha256: str
    venv: Path


def _pin(lock: Lock) -> WheelPin:
    pin = lock.get(PIN)
    if not isinstance(pin, WheelPin) or not pin.files:
        raise GateError(
            f"{lock.where('upstreams', PIN)}: the aiperf pin must be a wheel pin with files and sha256 "
            f"(reprostack lock wheels aiperf)"
        )
    return pin


def _pip(python: Path, args: list[str], log: Path) -> None:
    from ..fetch.wheels import pip_find_links, wheelhouses_from_env

    extra = pip_find_links(wheelhouses_from_env())  # each folder of $REPROSTACK_WHEELHOUSE (A:B), pip's only source
    cmd = [str(python), "-m", "pip", *args, *extra]
    with open(log, "ab") as f:
        f.write(("$ " + " ".join(cmd) + "\n").encode())
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise GateError(f"pip {' '.join(args[:2])} for aiperf failed (exit {rc}); log {log}:\n" + "\n".join(tail))


def _make_venv(base_python: str, venv: Path) -> None:
    """`base_python -m venv venv`, or GateError with the first paragraph it printed (nothing left behind).
    Debian and Ubuntu ship venv's pip bootstrap (ensurepip) apart, in python3-venv: without it this fails."""
    try:
        r = subprocess.run([base_python, "-m", "venv", str(venv)], capture_output=True, text=True)
    except OSError as e:
        raise GateError(f"cannot make the aiperf venv with {base_python}: {e.strerror or e}") from None
    if r.returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        said = " ".join(((r.stderr + r.stdout).strip() or "no output").split("\n\n")[0].split())[:300]
        hint = " -- as root: apt-get install -y python3-venv" if "ensurepip" in r.stdout + r.stderr else ""
        raise GateError(f"{base_python} -m venv {venv} failed (exit {r.returncode}): {said}{hint}")


def ensure_aiperf(lock: Lock, cache_root: Path, root: Path, *, base_python: str = sys.executable) -> AiperfTool:
    """Return the pinned AIPerf, building its venv under `<cache_root>/tools/` when absent.

    The wheel's sha256 must equal one of the lock's `files` for the pin (GateError otherwise, naming both);
    dependency versions come from `<root>/gates/aiperf-constraints.txt`. Raises GateError when pip fails (with
    the log's tail) and for a malformed pin. Takes minutes the first time (~1 GB of packages), then none.
    """
    pin = _pin(lock)
    allowed = {f.sha256: f.filename for f in pin.files}
    if os.environ.get(VENV_ENV):
        return _prebuilt(Path(os.environ[VENV_ENV]), pin, allowed)
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    venv = Path(cache_root).resolve() / "tools" / f"aiperf-{pin.version}-{sorted(allowed)[0][:12]}-py{py}"
    exe, python = venv / "bin" / "aiperf", venv / "bin" / "python"
    marker = venv / _MARKER
    venv.parent.mkdir(parents=True, exist_ok=True)
    # one venv shared by the tests and the gates, so two of them may arrive at once: the first builds, the other
    # waits on this lock and then finds the marker (written last, so a half-built venv never has one)
    with open(venv.parent / f"{venv.name}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:  # a torn or foreign marker (the cache may be shared) is no marker: the venv is built again
            info = json.loads(marker.read_text()) if exe.is_file() else {}
        except (OSError, ValueError):
            info = {}
        if isinstance(info, dict) and info.get("sha256") in allowed:
            return AiperfTool(exe, python, pin.version, info["sha256"], venv)
        return _build(lock, pin, allowed, venv, root, base_python)


def _build(lock: Lock, pin: WheelPin, allowed: dict, venv: Path, root: Path, base_python: str) -> AiperfTool:
    exe, python, marker = venv / "bin" / "aiperf", venv / "bin" / "python", venv / _MARKER
    constraints = Path(root) / "gates" / "aiperf-constraints.txt"
    if not constraints.is_file():
        raise GateError(f"{constraints}: missing (pip constraints for AIPerf's dependencies)")
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    log = venv.parent / f"{venv.name}.install.log"
    log.write_text("")
    print(
        f"reprostack: building the pinned AIPerf {pin.version} venv once in {venv} (about 1 GB from the index, "
        f"a few minutes; log {log})",
        file=sys.stderr,
        flush=True,
    )
    _make_venv(base_python, venv)
    with tempfile.TemporaryDirectory(prefix="aiperf-wheel-") as tmp:
        _pip(python, ["download", "--no-deps", "--only-binary=:all:", "-d", tmp, f"{pin.name}=={pin.version}"], log)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise GateError(f"pip download aiperf=={pin.version} gave {len(wheels)} wheel(s) in {tmp}, expected 1")
        digest = sha256_file(wheels[0])
        if digest not in allowed:
            raise GateError(
                f"{lock.where('upstreams', PIN, 'files')}: downloaded {wheels[0].name} has sha256 "
                f"{digest}, the lock pins {', '.join(f'{n} {s}' for s, n in allowed.items())}"
            )
        _pip(python, ["install", "--quiet", "--no-compile", "-c", str(constraints), str(wheels[0])], log)
    _compile(python, venv, log)
    marker.write_text(json.dumps({"version": pin.version, "sha256": digest, "wheel": wheels[0].name}) + "\n")
    return AiperfTool(exe, python, pin.version, digest, venv)


def _compile(python: Path, venv: Path, log: Path) -> None:
    """The venv's bytecode, compiled on every core (`compileall -j 0`) instead of pip's one-core pass (about 40 of
    the 100 s of a warm-cache build on 2 cores; this takes about 25): AIPerf's processes then start from .pyc even
    where PYTHONDONTWRITEBYTECODE is set. Like pip, a module that does not compile (a test file of some package in
    an older syntax) is skipped, not an error; a compileall that cannot run at all is a GateError."""
    site = sorted((venv / "lib").glob("python3*/site-packages"))
    with open(log, "a") as fh:
        try:
            rc = subprocess.run(
                [str(python), "-m", "compileall", "-q", "-j", "0", *map(str, site)], stdout=fh, stderr=subprocess.STDOUT
            ).returncode
        except OSError as e:
            rc = f"{e.strerror or e}"
    if rc not in (0, 1):  # 1: some file did not compile (listed in the log); pip ignores those too
        raise GateError(
            f"compiling the AIPerf venv's bytecode failed ({rc if isinstance(rc, str) else f'exit {rc}'}); log {log}"
        )


def _prebuilt(venv: Path, pin: WheelPin, allowed: dict) -> AiperfTool:
    """The venv named by $REPROSTACK_AIPERF_VENV, if its marker names a wheel of the pin; GateError otherwise."""
    exe, python, marker = venv / "bin" / "aiperf", venv / "bin" / "python", venv / _MARKER
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError) as e:
        raise GateError(
            f"{VENV_ENV}={venv}: no readable {_MARKER} ({e}); not an AIPerf venv made from the lock"
        ) from None
    sha = info.get("sha256") if isinstance(info, dict) else None
    if sha not in allowed or info.get("version") != pin.version or not exe.is_file():
        raise GateError(
            f"{VENV_ENV}={venv}: {marker} names aiperf {info.get('version') if isinstance(info, dict) else '?'}"
            f" sha256 {sha}, the lock pins {pin.version} {', '.join(allowed)}"
        )
    return AiperfTool(exe, python, pin.version, sha, venv)


_TOKENIZER_SCRIPT = r"""
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers
out = sys.argv[1]
words = ("tok the of and to a in is it you that he was for on are with as I his they be at one have this from "
         "or had by word but what some we can out other were all there when up use your how said an each she").split()
vocab = {"[UNK]": 0, "[PAD]": 1}
for w in words:
    vocab.setdefault(w, len(vocab))
t = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
t.save(out + "/tokenizer.json")
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "pad_token": "[PAD]",
           "model_max_length": 1000000}, open(out + "/tokenizer_config.json", "w"), indent=1)
"""


def make_test_tokenizer(tool: AiperfTool, out_dir: Path) -> Path:
    """Write a tiny word-level HuggingFace tokenizer folder (tokenizer.json + tokenizer_config.json) into
    `out_dir` with the tool venv's `tokenizers`; one token per whitespace-separated word (the test server
    streams one word per token). Returns `out_dir`. Raises GateError when the script fails."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([str(tool.python), "-c", _TOKENIZER_SCRIPT, str(out_dir)], capture_output=True, text=True)
    if r.returncode != 0:
        raise GateError(f"building the test tokenizer in {out_dir} failed: {r.stderr.strip()[-800:]}")
    return out_dir


def main(argv: list[str] | None = None) -> int:
    """`python -m reprostack.gates.aiperftool CACHE_ROOT`: build (once) the lock's AIPerf under CACHE_ROOT and print
    its `aiperf` script (the tests session's install step); a ReprostackError is one line on stderr, exit 2."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1:
        print(
            "usage: python -m reprostack.gates.aiperftool [CACHE_ROOT]  (default: the reprostack cache, the gates' own)",
            file=sys.stderr,
        )
        return 2
    try:
        print(ensure_aiperf(load("upstreams.lock"), Path(args[0]) if args else paths.cache_dir(), Path(".")).exe)
    except ReprostackError as e:
        print(f"reprostack: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
