"""The registry-free image chain, built and recorded (`nox -s images [-- --twice]`, issue 26 items 2 and 3).

    python3 scripts/image_chain.py [--twice] [--images cuda-toolkit substrate deepep vllm sglang megatron] [--results DIR]

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
machine and its engine are shared); writes are atomic.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
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


def _run(argv: list[str]) -> float:
    """Run `argv` (output to this terminal); its seconds. A failure exits with its code."""
    print("+ " + " ".join(argv), flush=True)
    t = time.monotonic()
    rc = subprocess.run(argv).returncode
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


def _step(i: dict) -> dict:
    """The chain.json step of one image of a build's images.json, with its size read from the engine."""
    return {
        "step": f"build {i['name']}",
        "status": i["status"],
        "seconds": round(i["seconds"], 1),
        "image_id": i["image_id"],
        "tag": i["tag"],
        "size_bytes": _docker_json("image", "inspect", i["image_id"])[0]["Size"],
        "context_bytes": i["context_bytes"],
    }


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
    argv = ["reprostack", "build", name, "--out", str(out)]
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--twice", action="store_true")
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
    lock = lockmod.load(root / "upstreams.lock")
    base_argv = [sys.executable, "-m", "reprostack.containers.debsbase", BASE_PIN]
    if args.twice:
        base_argv += ["--twice", "--record", str(args.results / f"base-{BASE_PIN}.json")]
    chain_images = [i for i in args.images if i not in GATE_IMAGES]
    gates = [i for i in args.images if i in GATE_IMAGES]
    if not chain_images:  # `reprostack build` with no image builds every recipe
        ap.error(f"--images: name the chain's images too (gate images {', '.join(GATE_IMAGES)} build on them)")
    base_s = _run(base_argv)
    build = ["reprostack", "build", *chain_images]
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
    last = args.out / ("2" if args.twice else "1")
    build_s = _run([*build, "--out", str(last)])
    summary = json.loads((last / "images.json").read_text())
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
        "from_scratch": args.twice,
        "images": args.images,
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


if __name__ == "__main__":
    sys.exit(main())
