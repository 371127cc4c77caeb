"""The registry-free image chain, built and recorded (`nox -s images [-- --twice]`, issue 26 items 2 and 3).

    .venv/bin/python scripts/image_chain.py [--twice] [--images cuda-toolkit substrate deepep vllm sglang megatron] [--results DIR]
    .venv/bin/python scripts/image_chain.py --check     # is results/images/chain.json the current recipes' and pins'? (CI)

Steps, each timed: the Debian base from the pinned .debs (`python -m reprostack.containers.debsbase debian-12-build`,
with `--twice`: built twice from scratch, its record results/images/base-debian-12-build.json), then `reprostack build`
of the chain's images, parent first, then each gate image on top (vllm, sglang, megatron: one `reprostack build` each).
With `--twice`, the images as built are recorded (scripts/image_twice.py record), every
image of the chain above the base is removed with its intermediate images (`docker rmi`: no layer cache left), built
again from scratch and recorded again; each image's comparison goes to results/images/<image>-twice.json. Last,
results/images/chain.json: per step its seconds (of the last, from-scratch build), status, image id, image size and
build-context bytes, and what the chain downloads (the pinned .debs and wheels, by count and bytes, read from the lock
and the verified cache), with the project commit and lock sha256 it ran at. README's images block is generated from
it (`reprostack docs`), never typed.

Invariants: every number written is measured by this run or read from the lock / cache / engine; commands run with an
argument vector; a step of the chain (base, cuda-toolkit, substrate, deepep) that fails stops the run with its exit code
and writes no chain.json; a gate image that fails is a step with status `failed`, its seconds and the build's error line
(what stops it), the others still build, and the run exits 1 after writing chain.json; a gate image is not built
while the engine's disk has less than --min-free-gb free (a step with status `skipped` and the free space read: the
machine and its engine are shared); writes are atomic. `--twice` writes no record unless the second build was from
scratch: every first-build image gone from the engine after `docker rmi` (else exit 2 naming the ids another image
still holds) and no second-build step from the layer cache (each step's `cached_steps`, counted in its build log);
`from_scratch` in chain.json is that measurement, never the flag.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import image_twice  # noqa: E402

BASE_PIN = "debian-12-build"
GATE_IMAGES = ("vllm", "sglang", "megatron")
DEFAULT_IMAGES = ("cuda-toolkit", "substrate", "deepep", *GATE_IMAGES)


# the CLI of the Python running this script (reprostack importable there: no `reprostack` needed on PATH)
REPROSTACK = [sys.executable, "-m", "reprostack"]


def _run(argv: list[str]) -> float:
    """Run `argv` (output to this terminal); its seconds. A failure exits with its code."""
    print("+ " + " ".join(argv), flush=True)
    t = time.monotonic()
    try:
        rc = subprocess.run(argv).returncode
    except FileNotFoundError:
        print(f"image_chain: {argv[0]}: not found (install it or put it on PATH)", file=sys.stderr)
        sys.exit(2)
    if rc != 0:
        print(f"image_chain: `{' '.join(argv)}` exited {rc}", file=sys.stderr)
        sys.exit(rc)
    return round(time.monotonic() - t, 1)


def _docker_json(*args: str):
    return json.loads(subprocess.run(["docker", *args], capture_output=True, check=True).stdout)


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def cached_steps(log) -> int:
    """How many steps of a build the engine took from its layer cache (the classic builder's `---> Using cache`
    lines in the build's full log): a step from the cache was not built, so its seconds are no build time."""
    if not log or not Path(log).is_file():
        return 0
    with open(log, errors="replace") as f:
        return sum(1 for line in f if line.strip() == "---> Using cache")


def _step(i: dict) -> dict:
    """The chain.json step of one image of a build's images.json, with its size read from the engine and the number
    of its steps the engine took from the layer cache."""
    return {
        "step": f"build {i['name']}",
        "status": i["status"],
        "seconds": round(i["seconds"], 1),
        "image_id": i["image_id"],
        "tag": i["tag"],
        "size_bytes": _docker_json("image", "inspect", i["image_id"])[0]["Size"],
        "context_bytes": i["context_bytes"],
        "cached_steps": cached_steps(i.get("log")) if i["status"] == "built" else 0,
    }


def still_present(ids: list[str], inspect=None) -> list[str]:
    """Of `ids` (image ids just given to `docker rmi`), those the engine still has: `docker rmi` only untags an image
    that another image is built on (a gate image of an earlier run), and the next build then takes its layers from
    the cache: no build from scratch."""
    inspect = inspect or (lambda i: subprocess.run(["docker", "image", "inspect", i], capture_output=True).returncode)
    return [i for i in ids if inspect(i) == 0]


def engine_free_bytes() -> tuple[str, int] | None:
    """(the engine's data root, free bytes on its file system) when that folder is on this machine, else None."""
    cp = subprocess.run(["docker", "info", "--format", "{{.DockerRootDir}}"], capture_output=True, text=True)
    root = cp.stdout.strip()
    if cp.returncode != 0 or not root or not Path(root).is_dir():
        return None
    return root, shutil.disk_usage(root).free


def build_gate(name: str, out: Path, min_free_gb: float = 0.0) -> dict:
    """`reprostack build NAME --out OUT` (its parents are built already: reused); the image's step, or on failure
    {step, status: failed, seconds, error: the build's last `reprostack: error:` line, else its last stderr line}.
    With `min_free_gb`, an engine whose disk has less free space is not asked to build (the machine is shared):
    {step, status: skipped, reason} with the free bytes read."""
    free = engine_free_bytes() if min_free_gb else None
    if free is not None and free[1] < min_free_gb * 1e9:
        reason = f"{free[1] / 1e9:.1f} GB free on the engine's disk ({free[0]}), under --min-free-gb {min_free_gb:g}"
        print(f"image_chain: {name} not built: {reason}")
        return {"step": f"build {name}", "status": "skipped", "seconds": 0.0, "reason": reason}
    argv = [*REPROSTACK, "build", name, "--out", str(out)]
    print("+ " + " ".join(argv), flush=True)
    t = time.monotonic()
    cp = subprocess.run(argv, stderr=subprocess.PIPE, text=True)
    seconds = round(time.monotonic() - t, 1)
    sys.stderr.write(cp.stderr)
    if cp.returncode == 0:
        summary = json.loads((out / "images.json").read_text())
        return _step(next(i for i in summary["images"] if i["name"] == name))
    lines = [ln.strip() for ln in cp.stderr.splitlines() if ln.strip()]
    error = next((ln for ln in reversed(lines) if ln.startswith("reprostack: error:")), lines[-1] if lines else "")
    print(f"image_chain: {name} failed after {seconds} s (exit {cp.returncode}): recorded, the others go on")
    return {"step": f"build {name}", "status": "failed", "seconds": seconds, "exit": cp.returncode, "error": error}


def downloads(lock, images: list[str], root: Path) -> dict:
    """What the chain fetches: the base's .debs (count and bytes from the lock) and each wheel pin the images copy
    (count from the lock, bytes from the verified cache files)."""
    from reprostack import paths
    from reprostack.containers.recipe import load_all

    debs = lock.get(BASE_PIN)
    out = {"debs": {"pin": BASE_PIN, "files": len(debs.files), "bytes": sum(f.size for f in debs.files)}, "wheels": []}
    recipes = load_all(root, images)
    cache = paths.cache_dir() / "wheels"
    for name in images:
        for w in recipes[name].wheels:
            pin = lock.get(w.pin)
            sizes = [(cache / f.sha256 / f.filename) for f in pin.files]
            out["wheels"].append(
                {
                    "image": name,
                    "pin": w.pin,
                    "files": len(pin.files),
                    "bytes": sum(p.stat().st_size for p in sizes) if all(p.is_file() for p in sizes) else None,
                }
            )
    return out


_PIN_REF = re.compile(r"upstreams\.([A-Za-z0-9_-]+)\.")
_KERNEL_REF = re.compile(r"kernels\.([A-Za-z0-9_-]+)\.")


def inputs(root: Path, images: list[str]) -> tuple[list[str], list[str]]:
    """(paths, pins) an image chain is made from, parents included: each recipe folder, the sibling recipes' files it
    names (`../x/f`), the kernel recipes its templates name (`{{ kernels.C.* }}`: kernels/C.yaml), and for a recipe
    with `jit:` the JIT manifests (kernels/jit/) and the reprostack modules that compile them in the image
    (kernels.jitimage.MODULES); the lock pins its templates name (`{{ upstreams.P.* }}`), its sources' and wheels' pins,
    a `lock:` base's pin and the Debian base's .debs pin."""
    from reprostack.containers.recipe import load_all

    recipes = load_all(root, images)
    paths, pins = set(), {BASE_PIN}
    for name, r in recipes.items():
        rdir = f"containers/{name}"
        paths.add(rdir)
        text = "\n".join(p.read_text() for p in sorted((root / rdir).iterdir()) if p.is_file())
        for f in r.files:
            if f.src.startswith("../"):
                paths.add(os.path.normpath(f"{rdir}/{f.src}"))
        paths.update(f"kernels/{c}.yaml" for c in _KERNEL_REF.findall(text))
        pins.update(_PIN_REF.findall(text))
        pins.update(s.upstream for s in r.sources)
        pins.update(w.pin for w in r.wheels)
        if r.base is not None and r.base.pin:
            pins.add(r.base.pin)
        if r.jit is not None:  # the recorded manifests and the reprostack modules that compile them in the image
            from reprostack.kernels.jitimage import MODULES

            paths.add("kernels/jit")
            paths.update(f"src/reprostack/{m}" for m in MODULES)
            pins.add(r.jit.upstream)
    return sorted(paths), sorted(pins)


def stale(root: Path, record: dict) -> list[str]:
    """What changed, in the checkout (working tree included), since the chain record's project commit among the inputs
    of its images: one line per changed file or lock pin; [] when the record is the current recipes' (a CI test)."""
    from reprostack import yamlsrc

    commit = record["project_commit"]
    paths, pins = inputs(root, list(record["images"]))

    def git(*a: str) -> str:
        r = subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"image_chain: git {' '.join(a)}: {r.stderr.strip()}")
        return r.stdout

    lines = [f"{f}: changed since {commit[:12]}" for f in git("diff", "--name-only", commit, "--", *paths).split()]

    def upstreams(text: str, where: str) -> dict:  # reprostack's YAML reader: aliases, depth and size bounded
        data, _ = yamlsrc.compose(text, where)
        return (data.get("upstreams") if isinstance(data, dict) else None) or {}

    then = upstreams(git("show", f"{commit}:upstreams.lock"), f"upstreams.lock at {commit[:12]}")
    now = upstreams((root / "upstreams.lock").read_text(), str(root / "upstreams.lock"))
    lines += [f"upstreams.lock: pin {p} changed since {commit[:12]}" for p in pins if then.get(p) != now.get(p)]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--twice", action="store_true")
    ap.add_argument(
        "--check",
        action="store_true",
        help="build nothing: exit 1 naming each input of the recorded chain (results/images/chain.json) changed since "
        "the commit it was built at (recipe files, kernel recipes, JIT manifests, lock pins)",
    )
    ap.add_argument("--images", nargs="+", default=list(DEFAULT_IMAGES))
    ap.add_argument("--results", type=Path, default=Path("results/images"))
    ap.add_argument("--out", type=Path, default=Path("out/images"))
    ap.add_argument(
        "--min-free-gb",
        type=float,
        default=20.0,
        help="build a gate image only with this much free space on the engine's disk (default 20; 0: always)",
    )
    args = ap.parse_args(argv)
    from reprostack import lock as lockmod

    root = Path.cwd()
    if args.check:
        rec = json.loads((args.results / "chain.json").read_text())
        lines = stale(root, rec)
        for ln in lines:
            print(f"{args.results / 'chain.json'}: {ln}: run `nox -s images` and commit its results")
        print(
            f"image_chain: {', '.join(rec['images'])} recorded at {rec['project_commit'][:12]}: "
            + ("stale" if lines else "the current recipes and pins")
        )
        return 1 if lines else 0
    lock = lockmod.load(root / "upstreams.lock")
    base_argv = [sys.executable, "-m", "reprostack.containers.debsbase", BASE_PIN]
    if args.twice:
        base_argv += ["--twice", "--record", str(args.results / f"base-{BASE_PIN}.json")]
    chain_images = [i for i in args.images if i not in GATE_IMAGES]
    gates = [i for i in args.images if i in GATE_IMAGES]
    if not chain_images:  # `reprostack build` with no image builds every recipe
        ap.error(f"--images: name the chain's images too (gate images {', '.join(GATE_IMAGES)} build on them)")
    base_s = _run(base_argv)
    build = [*REPROSTACK, "build", *chain_images]
    records = {}
    if args.twice:
        _run([*build, "--out", str(args.out / "1")])
        summary = json.loads((args.out / "1" / "images.json").read_text())
        for i in summary["images"]:
            if i["name"] in chain_images:
                records[i["name"]] = image_twice.record(i["tag"], list(image_twice.DEFAULT_KEYS), None)
                records[i["name"]]["builds"] = [i]
        tags = [i["tag"] for i in reversed(summary["images"]) if i["name"] in chain_images]
        _run(["docker", "rmi", *tags])
        kept = still_present([i["image_id"] for i in summary["images"] if i["name"] in chain_images])
        if kept:
            print(
                f"image_chain: --twice: {', '.join(k[:19] for k in kept)} still on the engine after `docker rmi` "
                "(another image is built on it), so a second build would come from the layer cache, not from "
                "scratch: run --twice on an engine that holds no other image built on the chain (a new DOCKER_HOST)",
                file=sys.stderr,
            )
            return 2
    last = args.out / ("2" if args.twice else "1")
    build_s = _run([*build, "--out", str(last)])
    summary = json.loads((last / "images.json").read_text())
    if args.twice:
        cached = {i["name"]: cached_steps(i.get("log")) for i in summary["images"] if i["status"] == "built"}
        if any(cached.values()) or any(i["status"] != "built" for i in summary["images"]):
            print(f"image_chain: --twice: the second build was not from scratch (steps from the layer cache: "
                  f"{cached}; statuses: {[(i['name'], i['status']) for i in summary['images']]}): no record written",
                  file=sys.stderr)  # fmt: skip
            return 2
    steps = [{"step": f"base {BASE_PIN} (debsbase" + (", built twice" if args.twice else "") + ")", "seconds": base_s}]
    for i in summary["images"]:
        steps.append(_step(i))
        if args.twice and i["name"] in records:
            b = image_twice.record(i["tag"], list(image_twice.DEFAULT_KEYS), None)
            b["builds"] = [i]
            how = (
                f"`python3 scripts/image_chain.py --twice`: `reprostack build {' '.join(chain_images)}` on the local "
                f"dockerd (classic builder), then {', '.join(chain_images)} removed with their intermediate images (no "
                "layer cache), built again from scratch (the base made again from the pinned .debs); files "
                "compared by sha256 inside the image (`find / -xdev -type f`, less /proc, /sys, /dev and the files "
                "the engine mounts per container), the files that matter also by ELF section"
            )
            cmp_ = image_twice.compare(records[i["name"]], b, i["name"], how, ("build 1", "build 2"))
            # measured: the second build ran and took no step from the layer cache (refused above otherwise)
            cmp_["second_from_scratch"] = i["status"] == "built" and not cached_steps(i.get("log"))
            _write(args.results / f"{i['name']}-twice.json", cmp_)
            print(
                f"{i['name']}: layers identical {cmp_['layers_identical']}, files identical {cmp_['files_identical']}"
            )
    gate_s = 0.0
    for g in gates:
        steps.append(build_gate(g, last / g, args.min_free_gb))
        gate_s += steps[-1]["seconds"]
    failed = [s["step"] for s in steps if s.get("status") == "failed"]
    chain = {
        "kind": "image-chain",
        "project_commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "lock_sha256": hashlib.sha256((root / "upstreams.lock").read_bytes()).hexdigest(),
        # measured, not assumed: every image step ran a build and took no step from the engine's layer cache
        "from_scratch": all(
            st.get("status") in ("built", "failed", "skipped") and not st.get("cached_steps")
            for st in steps
            if st["step"].startswith("build ")
        ),
        "images": args.images,
        "host": {"cpus": os.cpu_count(), "machine": platform.machine()},  # docs say what ran it from here
        "steps": steps,
        "seconds_total": round(base_s + build_s + gate_s, 1),
        "downloads": downloads(lock, args.images, root),
    }
    _write(args.results / "chain.json", chain)
    print(
        f"chain: {chain['seconds_total']} s -> {args.results / 'chain.json'}"
        + (f"; failed: {failed}" if failed else "")
    )
    return 1 if failed else 0


def cli(argv: list[str] | None = None) -> int:
    """main(), with a tool it runs that is not installed (docker) said in one line, exit 2, never a traceback."""
    try:
        return main(argv)
    except FileNotFoundError as e:
        print(f"image_chain: {e.filename or e}: not found (install it or put it on PATH)", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:  # a python without the project installed (the system python3, PEP 668)
        print(
            f"image_chain: this python ({sys.executable}) has no {e.name!r}: run it with the project's venv "
            "(.venv/bin/python scripts/image_chain.py) or through `nox -s images`",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(cli())
