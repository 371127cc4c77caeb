"""enroot + pyxis for the pyxis rehearsal, built from their pins in upstreams.lock (issue 37), plus the GPU stand-in
that records what a real node's NVIDIA container CLI would be asked.

    .venv/bin/python tests/enrootpyxis.py install [--prefix /usr/local] [--state /tmp/rs-enroot]
                                                  [--mirror URL=PATH ...] [--bundle FILE ...] [--offline]
    .venv/bin/python tests/enrootpyxis.py status   # one line: what is installed, else why not (exit 2)

`install` fetches the `enroot` and `pyxis` pins through reprostack's own source cache (`reprostack fetch`: rev and
tree verified; the network, `--mirror`, `$REPROSTACK_MIRRORS` or a `reprostack bundle` archive), exports each tree
(no .git: enroot's Makefile runs `git submodule update`, which must not fetch unpinned code), and builds:
- enroot with `FORCE_GLIBC=1` (its utilities against glibc, not the musl of its unpinned deps/ submodules),
  Debian's makeself 2.4.5 (the version enroot's deps/Makefile names) as enroot-makeself, the kernel headers of
  Debian's linux-libc-dev, strlcpy/strlcat from Debian's libbsd (glibc 2.36 has none); `make install prefix=PREFIX`;
- pyxis against Debian's libslurm-dev (spank.h of the Slurm that runs here: 22.05); `make install prefix=PREFIX`;
- PREFIX/etc/enroot/enroot.conf.d/50-reprostack-rehearsal.conf: enroot's paths under STATE and ENROOT_ALLOW_HTTP
  (the local registry is plain HTTP on loopback; pyxis never passes ENROOT_ALLOW_HTTP from a job, so it is set
  here, for every registry: a test machine only);
- the stand-ins of tests/standins: `nvidia-container-cli` (recording, into PREFIX/bin, only where no real one is
  on PATH) and the stub libcuda it bind-mounts into the container (compiled here from libcuda_stub.c).
A stamp PREFIX/share/reprostack-rehearsal/installed.json names the pins; `install` with the same pins and an intact
install does nothing. Slurm loads pyxis through the plugstack.conf that .ci/slurm-up writes.

Invariants:
- only the lock's trees are built: fetched by commit and verified by tree (reprostack.sources), exported without
  .git, nothing downloaded by a Makefile;
- a failure is one line naming the step (fetch, build, install) and exit 2; the stamp is written last (atomic),
  so a half install is never taken as installed;
- the recording CLI is a stand-in and says so: it refuses (exit 1) outside a rehearsal ($RS_NVIDIA_RECORD unset),
  so a GPU container on this host never starts as if a driver had been injected.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STANDINS = REPO / "tests" / "standins"
PINS = ("enroot", "pyxis")
DEFAULT_PREFIX = Path("/usr/local")
DEFAULT_STATE = Path("/tmp/rs-enroot")
NODE_LOCAL = "/run/rs-node-local"  # each slurmd's own folder (.ci/slurm-up: a bind in its mount namespace)
NODE_LOCAL_ENV = "RS_NODE_LOCAL"  # names one node's folder from outside its namespace (node_env)


def node_env(node: str) -> dict[str, str]:
    """The environment in which `enroot list|remove` outside Slurm sees node `node`'s containers."""
    slurm_dir = os.environ.get("RS_SLURM_DIR", "/tmp/rs-slurm")
    return {**os.environ, NODE_LOCAL_ENV: f"{slurm_dir}/node-local/{node}"}


APT = "libslurm-dev squashfs-tools squashfuse fuse-overlayfs parallel pigz makeself libbsd-dev curl jq zstd gcc make"
CONF_NAME = "50-reprostack-rehearsal.conf"
# glibc < 2.38 (Debian 12) has no strlcpy/strlcat, which musl gives enroot's utilities: Debian's static libbsd has
# them (by path: `-lbsd` would find enroot's own deps/dist/libbsd/libbsd.a, a subset without them, first)


class Failed(Exception):
    pass


def stamp_path(prefix: Path) -> Path:
    return prefix / "share" / "reprostack-rehearsal" / "installed.json"


def pyxis_so(prefix: Path = DEFAULT_PREFIX) -> Path:
    return prefix / "lib" / "slurm" / "spank_pyxis.so"


def installed(prefix: Path = DEFAULT_PREFIX) -> dict | None:
    """The stamp of an intact install (enroot runs, pyxis's plugin is there), else None."""
    try:
        rec = json.loads(stamp_path(prefix).read_text())
    except (OSError, ValueError):
        return None
    enroot = prefix / "bin" / "enroot"
    if not (enroot.is_file() and pyxis_so(prefix).is_file()):
        return None
    p = subprocess.run([str(enroot), "version"], capture_output=True, text=True)
    return rec if p.returncode == 0 and p.stdout.strip() == rec.get("enroot_version") else None


def why_not(prefix: Path = DEFAULT_PREFIX) -> str | None:
    """None when enroot + pyxis of the lock's pins are installed under `prefix`, else the reason."""
    rec = installed(prefix)
    if rec is None:
        return f"enroot + pyxis are not installed under {prefix}: run `.venv/bin/python tests/enrootpyxis.py install`"
    from reprostack.errors import ReprostackError

    try:
        want = _lock_pins()
    except ReprostackError as e:
        return f"upstreams.lock has no enroot/pyxis git pin to rehearse with: {e}"
    got = {n: rec.get(n, {}).get("rev") for n in PINS}
    if got != {n: want[n]["rev"] for n in PINS}:
        return f"enroot + pyxis under {prefix} are of other pins ({got}): run tests/enrootpyxis.py install again"
    return None


def _lock_pins() -> dict:
    from reprostack import lock as lockmod

    lock = lockmod.load(REPO / "upstreams.lock")
    return {n: {"rev": lock.git(n).rev, "tree": lock.git(n).tree, "original": lock.git(n).original} for n in PINS}


def _run(step: str, cmd: list[str], **kw) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-5:]
        raise Failed(f"{step}: `{' '.join(cmd[:4])}` exit {p.returncode}: {' | '.join(tail)}")
    return p.stdout


def export_trees(args, work: Path) -> dict[str, Path]:
    """Each pin's verified tree, exported (no .git) under `work`."""
    from reprostack import lock as lockmod, sources
    from reprostack.errors import ReprostackError

    lock = lockmod.load(REPO / "upstreams.lock")
    mirrors = dict(m.split("=", 1) for m in args.mirror)
    try:
        opts = sources.FetchOptions.make(offline=args.offline, mirrors=mirrors, bundles=[Path(b) for b in args.bundle])
        out = {}
        for n in PINS:
            tree = sources.prepare(lock, n, opts, REPO)
            dest = work / n
            dest.mkdir(parents=True)
            tar = work / f"{n}.tar"
            _run(f"export {n}", ["git", "-C", str(tree.path), "archive", "--format=tar", "-o", str(tar), "HEAD"])
            _run(f"export {n}", ["tar", "-xf", str(tar), "-C", str(dest)])
            out[n] = dest
        return out
    except ReprostackError as e:
        raise Failed(f"fetch: {e}") from None


def build_enroot(src: Path, prefix: Path) -> str:
    makeself = shutil.which("makeself")
    if not makeself:
        raise Failed("build enroot: Debian's makeself is missing (apt-get install makeself)")
    deps = src / "deps"
    (deps / "dist" / "makeself" / "bin").mkdir(parents=True)
    shutil.copy2(makeself, deps / "dist" / "makeself" / "bin" / "enroot-makeself")
    (deps / "dist" / "linux" / "include").mkdir(parents=True)  # empty: the system's linux-libc-dev headers
    for d in ("makeself", "linux-headers"):
        (deps / d).mkdir(exist_ok=True)
        (deps / d / ".stamp").touch()
    bsd = _run("build enroot", ["gcc", "-print-file-name=libbsd.a"]).strip()
    if not Path(bsd).is_file():
        raise Failed("build enroot: Debian's static libbsd is missing (apt-get install libbsd-dev)")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "GIT_ALLOW_PROTOCOL": "none", "HOME": str(src)}
    _run(
        "build enroot",
        ["make", "-C", str(src), "FORCE_GLIBC=1", f"LDLIBS=-l:libbsd.a {bsd}", f"prefix={prefix}", "install"],
        env=env,
    )
    return _run("build enroot", [str(prefix / "bin" / "enroot"), "version"]).strip()


def build_pyxis(src: Path, prefix: Path) -> None:
    if not Path("/usr/include/slurm/spank.h").is_file():
        raise Failed("build pyxis: /usr/include/slurm/spank.h missing (apt-get install libslurm-dev)")
    _run("build pyxis", ["make", "-C", str(src), f"prefix={prefix}", "install"])


def write_conf(prefix: Path, state: Path) -> Path:
    conf = prefix / "etc" / "enroot" / "enroot.conf.d" / CONF_NAME
    lines = [
        "# tests/enrootpyxis.py: the pyxis rehearsal's enroot (a test machine; never a cluster's settings)",
        # runtime and data on the node's own disk: the test cluster's two slurmd share one host, where a cluster's
        # nodes have a disk each; .ci/slurm-up gives each slurmd its own NODE_LOCAL (a mount namespace), and
        # node_env(N) names node N's from outside (a job's env cannot: srun hands each node the batch host's
        # SLURMD_NODENAME, so a path made of it was one folder for both nodes and pyxis's pyxis_JOB.STEP collided)
        f"ENROOT_RUNTIME_PATH ${{{NODE_LOCAL_ENV}:-{NODE_LOCAL}}}/enroot/runtime/user-$(id -u)",
        f"ENROOT_CACHE_PATH {state}/cache/group-$(id -g)",  # by digest, written by rename: shared is safe
        f"ENROOT_DATA_PATH ${{{NODE_LOCAL_ENV}:-{NODE_LOCAL}}}/enroot/data/user-$(id -u)",
        f"ENROOT_TEMP_PATH {state}/tmp",
        "ENROOT_ALLOW_HTTP yes",  # the loopback registry speaks HTTP; pyxis drops ENROOT_ALLOW_HTTP from a job's env
        "ENROOT_CONNECT_TIMEOUT 10",
        "ENROOT_TRANSFER_RETRIES 1",
    ]
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text("\n".join(lines) + "\n")
    (state / "tmp").mkdir(parents=True, exist_ok=True)
    return conf


def install_standins(prefix: Path) -> dict:
    """The recording nvidia-container-cli (where no real one is on PATH) and the stub libcuda it injects."""
    share = stamp_path(prefix).parent
    share.mkdir(parents=True, exist_ok=True)
    lib = share / "libcuda.so.1"
    _run(
        "build libcuda stub",
        ["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(lib), str(STANDINS / "libcuda_stub.c")],
    )
    cli = prefix / "bin" / "nvidia-container-cli"
    real = shutil.which("nvidia-container-cli")
    if real and Path(real).resolve() != cli.resolve():
        raise Failed(
            f"install: a real nvidia-container-cli is on PATH ({real}); the recording stand-in is not installed"
        )
    shutil.copy2(STANDINS / "nvidia-container-cli", cli)
    cli.chmod(0o755)
    return {"nvidia-container-cli": str(cli), "libcuda": str(lib)}


def install(args) -> int:
    prefix, state = Path(args.prefix), Path(args.state)
    want = _lock_pins()
    rec = installed(prefix)
    if rec and all(rec.get(n, {}).get("rev") == want[n]["rev"] for n in PINS):
        write_conf(prefix, state)  # the settings of this checkout, also where an earlier one installed the builds
        print(f"enroot {rec['enroot_version']} + pyxis {want['pyxis']['original']} already installed under {prefix}")
        return 0
    with tempfile.TemporaryDirectory(prefix="rs-enroot-build.") as work:
        trees = export_trees(args, Path(work))
        version = build_enroot(trees["enroot"], prefix)
        build_pyxis(trees["pyxis"], prefix)
    conf = write_conf(prefix, state)
    standins = install_standins(prefix)
    rec = {**want, "enroot_version": version, "pyxis_so": str(pyxis_so(prefix)), "conf": str(conf), **standins}
    tmp = stamp_path(prefix).with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    tmp.replace(stamp_path(prefix))
    print(
        f"enroot {version} ({want['enroot']['rev'][:12]}) + pyxis {want['pyxis']['original']} installed under {prefix}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tests/enrootpyxis.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["install", "status"])
    ap.add_argument("--prefix", default=str(DEFAULT_PREFIX))
    ap.add_argument("--state", default=str(DEFAULT_STATE))
    ap.add_argument("--mirror", action="append", default=[], metavar="URL=PATH")
    ap.add_argument("--bundle", action="append", default=[])
    ap.add_argument("--offline", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.action == "status":
            why = why_not(Path(args.prefix))
            print(why or json.dumps(installed(Path(args.prefix)), sort_keys=True))
            return 2 if why else 0
        return install(args)
    except Failed as e:
        print(f"tests/enrootpyxis.py: {e} (needs: apt-get install {APT})", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
