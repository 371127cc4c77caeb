"""The fabric gate run on one node without the gate machinery: prepare its kernels, run its commands, judge them.

    python -m reprostack.gates.fabric_local prepare [--cache C] [--offline] [--bundle B]... [--arch 90] [--jobs N]
    python -m reprostack.gates.fabric_local run --profile P --out DIR [the same options]

`prepare`: the nccl-tests tree (fetched and verified, or from a bundle), the stack's NCCL (NVIDIA's wheel of the pinned
release, sha256-checked, from the cache, $REPROSTACK_WHEELHOUSE or pip; else built from the pinned source) and the
nccl-tests build against it (kernels.nccltests): prints one JSON line {bin_dir, nccl_lib, nccl_version, builds}.
`run`: `prepare`, then each test's command (gates.fabric.node_commands, node 0 of a one-node profile) under
launch.watchdog with the pinned NCCL first on the library path, its whole output in DIR/logs/<test>.log; then
gates.fabric's parse, checks and figures into DIR/fabric.json and a summary on stdout.
Exit: 0 every check passed on a profile with measured bars; 1 a check failed, a test did not end with exit 0 (result
`error`, its first failure line the reason), or the profile's bars are unmeasured (every number reported, never a pass); 3 no profile fits this host and none was named (SKIP); 2 an operator error (one line: bad lock, spec, bundle, build) or a profile
this runner cannot start (several nodes: MPI, see gates.fabric).

Stands in for `reprostack gate fabric` until the Gate class exists (scripts/device/gate_fabric.sh calls it); it
writes no GateReport. Invariants: nothing is run before the lock, the spec and the profile loaded; the logs are kept
whole whatever the test does; fabric.json is written atomically.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .. import hostinfo, paths, sources
from ..atomicfile import write_text_atomic
from ..errors import ReprostackError
from ..fetch.wheels import fetch_wheels, wheelhouses_from_env
from ..kernels import build as kbuild
from ..kernels import ncclwheel, nccltests, preflight, toolchain
from ..kernels.recipe import load_recipe
from ..launch.watchdog import run_with_watchdog
from ..lock import load as load_lock
from . import fabric
from .fabric_spec import load_fabric_spec
from .spec import NoProfileForHost


def prepare_kernels(root: Path, lock, opts: sources.FetchOptions, *, arch: str | None, jobs: int | None) -> dict:
    """Build (or reuse, keyed) NCCL and nccl-tests; {bin_dir, nccl_lib, nccl_version, builds}. Raises
    ReprostackError (fetch, verify, build), each one line."""
    tc = toolchain.detect_nvcc(arch=arch)
    cache = opts.cache.root
    recipe = load_recipe(root, "nccl")
    nccl_tree = sources.prepare(lock, "nccl", opts, root) if ncclwheel.needs_source(lock, "nccl") else None
    src_version = preflight.nccl_source_version(nccl_tree.path) if nccl_tree else None
    choice = ncclwheel.choose(lock, recipe.source, recipe.wheel, src_version, recipe_path=str(recipe.path))
    if choice.kind == "wheel":
        wheel = fetch_wheels(
            lock, choice.wheel_pin, cache_root=cache, wheelhouses=wheelhouses_from_env(), offline=opts.offline
        )[0]
        nccl = ncclwheel.unpack(wheel.path, wheel.sha256, choice.version, cache)
    else:
        nccl = kbuild.build_nccl(nccl_tree.path, nccl_tree.tree, recipe, tc, cache, jobs=jobs)
    tree = sources.prepare(lock, "nccl-tests", opts, root)
    nt = nccltests.build_nccl_tests(tree.path, tree.tree, load_recipe(root, "nccl-tests"), tc, nccl, cache, jobs=jobs)
    return {
        "bin_dir": str(nt.out / "bin"),
        "nccl_lib": str(nccl.out / "build" / "lib"),
        "nccl_version": preflight.nccl_header_version(nccl.out / "build" / "include"),
        "nccl_from": {"kind": choice.kind, "why": choice.why},
        "toolchain": {"nvcc": tc.nvcc_version, "arch": tc.arch, "cuda_home": tc.cuda_home},
        "builds": {
            b.component: {"key": b.key, "reused": b.reused, "seconds": b.seconds, "out": str(b.out)} for b in (nccl, nt)
        },
        "nccl_tests": {"tree": tree.tree, "version": nt.info.get("version"), "binaries": nt.info.get("binaries")},
    }


def run_local(cmds, out_dir: Path, nccl_lib: str) -> dict:
    """Run each one-node command under the watchdog; {test: {"log", "returncode", "timed_out", "seconds"}}."""
    res = {}
    for cmd in cmds:
        if cmd.launcher != "local":
            raise ReprostackError(f"{cmd.test}: profile needs {cmd.launcher}: " + "; ".join(cmd.needs))
        log = Path(out_dir) / "logs" / f"{cmd.test}.log"
        t0 = time.monotonic()
        try:
            o = run_with_watchdog(
                list(cmd.argv),
                env=fabric.process_env(cmd, nccl_lib=nccl_lib),
                cwd=out_dir,
                timeout_s=cmd.timeout_s,
                log_path=log,
                echo=False,
            )
        except OSError as e:
            raise ReprostackError(f"{cmd.test}: cannot start {cmd.argv[0]}: {e}") from None
        res[cmd.test] = {
            "log": str(log),
            "returncode": o.returncode,
            "timed_out": o.timed_out,
            "seconds": round(time.monotonic() - t0, 2),
        }
    return res


def _args(argv):
    ap = argparse.ArgumentParser(prog="python -m reprostack.gates.fabric_local")
    ap.add_argument("command", choices=("prepare", "run"))
    ap.add_argument("--profile")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--offline", action="store_true")
    ap.add_argument("--bundle", action="append", type=Path, default=[])
    ap.add_argument("--arch")
    ap.add_argument("--jobs", type=int)
    return ap.parse_args(argv)


def _judge(spec, profile, kernels: dict, ran: dict, out: Path) -> int:
    text = {t: Path(r["log"]).read_text(errors="replace") for t, r in ran.items()}
    parsed = fabric.parse(text)
    checks = fabric.checks(spec, profile, parsed, nccl_version=kernels["nccl_version"])
    figs = fabric.figures(spec, profile, parsed)
    ok = all(c.passed for c in checks)
    crashed = {t: r for t, r in ran.items() if r["returncode"] != 0 or r["timed_out"]}
    verdict = "error" if crashed else ("pass" if ok and profile.measured else "fail")
    if crashed:
        reason = "; ".join(
            f"{t} {'timed out' if r['timed_out'] else 'exit ' + str(r['returncode'])}"
            + (f": {parsed.get(t).failures[0]}" if parsed.get(t) and parsed.get(t).failures else "")
            for t, r in crashed.items()
        )
    elif verdict == "pass":
        reason = "every check passed"
    elif ok:
        reason = f"profile {profile.name} has no measured bar yet; numbers reported"
    else:
        reason = "failed: " + ", ".join(c.metric for c in checks if not c.passed)
    doc = {
        "gate": "fabric",
        "profile": profile.name,
        "result": verdict,
        "reason": reason,
        "spec_sha256": spec.sha256,
        "checks": [c.to_dict() for c in checks],
        "figures": figs,
        "runs": ran,
        "kernels": kernels,
        "host": hostinfo.collect(nccl_runtime=kernels["nccl_lib"]),
    }
    write_text_atomic(out / "fabric.json", json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
    for c in checks:
        print(f"{'PASS' if c.passed else 'FAIL'}  {c.describe()}" + (f"  [{c.note[:160]}]" if c.note else ""))
    for k, v in figs.items():
        if k.endswith("transports"):
            for t in v:
                print(
                    f"{k[: -len('.transports')]} rank {t['rank']} {t['host']}: {t['transport']} (plugin {t['net_plugin']})"
                )
        elif isinstance(v, dict) and v.get("statistics"):
            print(
                f"{k}: {v['statistics']['mean']:.2f} GB/s [{v['statistics']['ci95'][0]:.2f}, {v['statistics']['ci95'][1]:.2f}] n={v['statistics']['n']}"
            )
    print(f"fabric {profile.name}: {verdict.upper()} ({reason})")
    return 0 if verdict == "pass" else 1


def main(argv=None) -> int:
    a = _args(sys.argv[1:] if argv is None else argv)
    try:
        root = paths.project_root()
        lock = load_lock(root / "upstreams.lock")
        spec = load_fabric_spec(root)
        opts = sources.FetchOptions.make(a.cache, offline=a.offline, bundles=a.bundle)
        if a.command == "prepare":
            print(json.dumps(prepare_kernels(root, lock, opts, arch=a.arch, jobs=a.jobs), sort_keys=True))
            return 0
        if a.out is None:
            raise ReprostackError("run needs --out DIR")
        host = hostinfo.collect()
        profile = fabric.choose_profile(spec, a.profile, host)
        cmds = fabric.node_commands(spec, profile, "bin")  # checked before anything is built
        if cmds[0].launcher != "local":
            raise ReprostackError(f"profile {profile.name}: {'; '.join(cmds[0].needs)}")
        kernels = prepare_kernels(root, lock, opts, arch=a.arch, jobs=a.jobs)
        a.out.mkdir(parents=True, exist_ok=True)
        cmds = fabric.node_commands(spec, profile, kernels["bin_dir"])
        ran = run_local(cmds, a.out.resolve(), kernels["nccl_lib"])
        return _judge(spec, profile, kernels, ran, a.out)
    except NoProfileForHost as e:
        print(f"fabric: SKIP ({e})")
        return 3
    except ReprostackError as e:
        print(f"reprostack: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
