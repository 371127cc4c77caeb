"""The H200 host's DeepEP JIT compile of a profile, reproduced on this machine inside the deepep image (issue 26 item 4).

    python3 scripts/jit_host_repro.py IMAGE OUT_DIR [--profile h200-ep1]

The lent H200's cubins are not committed (only their sha256, results/images/cubins-h200-host.json); to compare
their SASS with the image's, the same compile runs here: the image's nvcc (13.0.88, the pinned toolkit wheels, as on
the H200), the same absolute paths the H200 run had (its deep_ep package under the keyed build folder and its NCCL
root, read from results/images/cubins-h200-host/run-2-files/buildlogs.tar: `EP_NCCL_ROOT_DIR` and the build folder
`builds/deepep-<key16>`), the image's copies of the same files put there (deep_ep/include of the same patched tree,
the NCCL headers of the same wheel), and reprostack's own `jit.Context.of` + `jit.prewarm` (this checkout's src/,
mounted read-only). The container has no network. OUT_DIR gets `cache/kernel.<name>.<digest>/` as DeepEP writes it.
Record it with `scripts/cubins.py record --no-so` and check that every folder name and cubin sha256 equals the
H200's before treating the result as the H200's cubins.

Invariants: the docker CLI runs with an argument vector; nothing of the image is changed (`--rm`, a fresh container);
the paths are the H200 run's, never guessed: a build log that does not name them stops the script (exit 2).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILDLOGS = ROOT / "results" / "images" / "cubins-h200-host" / "run-2-files" / "buildlogs.tar"

INNER = r"""
import os, shutil, sys
from pathlib import Path
from reprostack.kernels import jit
site, nccl, profile = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
pkg = Path("/opt/venv/lib/python3.11/site-packages/deep_ep")
(site / "deep_ep").mkdir(parents=True)
shutil.copytree(pkg / "include", site / "deep_ep" / "include", symlinks=True)
(site / "deep_ep" / "envs.py").write_text(f"persistent_envs = dict()\npersistent_envs['EP_NCCL_ROOT_DIR'] = '{nccl}'\n")
nccl.mkdir(parents=True)
shutil.copytree("/opt/reprostack/nccl/include", nccl / "include", symlinks=True)
cache = site.parent / "jit"
env = {**os.environ, "EP_JIT_CACHE_DIR": str(cache)}
env.pop("PYTHONPATH", None)
ctx, why = jit.Context.of(site, env, "90")
if ctx is None:
    sys.exit(f"jit_host_repro: {why}")
m = jit.load_manifest(Path("/m") / f"{profile}.json")
res = jit.prewarm(ctx, m.kernels, env, jobs=1)
print(res)
if res["failed"]:
    sys.exit(1)
shutil.copytree(cache / "cache", "/out/cache")
"""


def host_paths(buildlogs: Path) -> tuple[str, str]:
    """(deep_ep site, NCCL root) of the H200 run, from its DeepEP build log: EP_NCCL_ROOT_DIR and the keyed build
    folder `<cache>/builds/deepep-<key16>` (the log's name), whose `site` holds the package DeepEP's JIT includes."""
    with tarfile.open(buildlogs) as t:
        logs = [m for m in t.getmembers() if re.fullmatch(r"buildlogs/deepep-[0-9a-f]{16}\.build\.log", m.name)]
        if len(logs) != 1:
            sys.exit(f"jit_host_repro: {buildlogs}: expected one buildlogs/deepep-<key16>.build.log")
        text = t.extractfile(logs[0]).read().decode(errors="replace")
    key = logs[0].name.split("/")[1].split(".")[0]
    nccl = re.search(r"> EP_NCCL_ROOT_DIR: (/\S+)", text)
    if not nccl:
        sys.exit(f"jit_host_repro: {buildlogs}: no EP_NCCL_ROOT_DIR line in the DeepEP build log")
    builds = Path(nccl.group(1)).parent.parent  # <cache>/builds/nccl-<key>/build -> <cache>/builds
    return str(builds / key / "site"), nccl.group(1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("image")
    ap.add_argument("out", type=Path)
    ap.add_argument("--profile", default="h200-ep1")
    a = ap.parse_args(argv)
    site, nccl = host_paths(BUILDLOGS)
    print(f"jit_host_repro: deep_ep site {site}, NCCL root {nccl}", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    argv = [
        "docker", "run", "--rm", "--network", "none",
        "-v", f"{ROOT / 'src'}:/rs:ro", "-v", f"{ROOT / 'kernels' / 'jit'}:/m:ro", "-v", f"{a.out.resolve()}:/out",
        "-e", "PYTHONPATH=/rs", "-e", "PYTHONDONTWRITEBYTECODE=1",
        a.image, "/opt/venv/bin/python3", "-c", INNER, site, nccl, a.profile,
    ]  # fmt: skip
    return subprocess.run(argv).returncode


if __name__ == "__main__":
    sys.exit(main())
