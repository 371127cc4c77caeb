"""`reprostack` command line: one subcommand per stage, each a thin call into the engine.

Exit codes: 0 ok / every required gate passed; 1 a gate failed or errored; 3 a required gate was
skipped or missing; 2 bad input, a stage that could not run (the message names file, line or pin) or an
internal error (printed with its traceback).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback
from pathlib import Path

from . import lock as lockmod
from . import gitcmd, paths, sources
from .errors import FetchError, ReprostackError, SourceUnreachable
from .gitcmd import GitFailed
from .gates.registry import GATE_ORDER


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lock", default=None, help="lockfile (default: upstreams.lock of the project root)")
    p.add_argument("--cache", default=None, help=f"cache root (default: ${paths.CACHE_ENV} or the user cache dir)")
    p.add_argument("--offline", action="store_true", help="use only the cache and --bundle archives, never the network")
    p.add_argument(
        "--bundle", action="append", default=[], metavar="FILE", help="source bundle written by `reprostack bundle`"
    )
    p.add_argument(
        "--mirror",
        action="append",
        default=[],
        metavar="URL=PATH",
        help="fetch URL (prefix) from PATH instead (git insteadOf); also $REPROSTACK_MIRRORS",
    )
    p.add_argument(
        "--git-timeout",
        default=None,
        metavar="S",
        help="seconds allowed per git command (default: $REPROSTACK_GIT_TIMEOUT or 600); transient network "
        "failures are retried with backoff",
    )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="reprostack", description=__doc__.splitlines()[0])
    ap.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="details: every step's log lines, per-item progress (default: one line per step)",
    )
    ap.add_argument(
        "--stack",
        default=None,
        metavar="NAME",
        help="the lock's stack to use (`reprostack stacks` lists them; default: $REPROSTACK_STACK, else "
        "the published campaign); reports record it as provenance.stack",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser(
        "stacks",
        help="list the lock's stacks; `stacks diff A B`: the pins, patches and env that differ; "
        "`stacks plugin`: build the selected stack's aws-ofi-nccl GIN plugin chain",
        description="`stacks`: list the lock's stacks. `stacks diff A B`: the pins (rev, tree, version), "
        "patch series and env that differ. `stacks plugin --out DIR`: build rdma-core, "
        "libfabric and the aws-ofi-nccl plugin of the selected stack (--stack) from its "
        "verified pins into DIR/prefix and check it exports --symbol. `stacks check-plugin "
        "LIBDIR`: only the export check.",
    )
    p.add_argument("action", nargs="*", metavar="ACTION", help="nothing | diff A B | plugin | check-plugin LIBDIR")
    p.add_argument("--json", action="store_true", help="JSON instead of text")
    p.add_argument("--out", default="out/ginplugin", help="plugin: work folder (default: out/ginplugin)")
    p.add_argument("--jobs", type=int, default=None, help="plugin: parallel build jobs (default: all cores)")
    p.add_argument("--cuda", default=None, help="plugin: CUDA root (default: from nvcc on PATH, else /usr/local/cuda)")
    p.add_argument("--render-only", action="store_true", help="plugin: write the build script, run nothing")
    p.add_argument(
        "--autogen-only",
        action="store_true",
        help="plugin: only run autogen.sh of libfabric and aws-ofi-nccl (on a host with autotools); the "
        "stamped trees under DIR/work/src go where autotools are missing ($GINPLUGIN_PREGEN)",
    )
    p.add_argument(
        "--symbol",
        default="ncclGinPlugin_v14",
        help="plugin/check-plugin: the GIN table that must be exported (default: ncclGinPlugin_v14, GDAKI only)",
    )
    _common(p)

    p = sub.add_parser(
        "lock",
        help="validate upstreams.lock; `lock wheels` fills/checks wheel files and sha256 with pip; "
        "`lock images` fills/checks base image digests from the registry",
    )
    p.add_argument(
        "action",
        choices=["check", "wheels", "images"],
        help="check: validate the lockfile; wheels: resolve each wheel pin's files with pip and write "
        "their sha256 into the lock (only the `files:` blocks change); images: resolve each image "
        "pin's repo:tag to its manifest digest (registry API v2) and write it (only `digest:` lines)",
    )
    p.add_argument(
        "rest",
        nargs=argparse.REMAINDER,
        help="wheels/images: [PIN...] [--check] (see `lock wheels -h`, `lock images -h`)",
    )
    p.add_argument("--lock", default=None)

    for name, helptext in (
        ("fetch", "fetch pinned sources into the cache and verify commit and tree"),
        ("patch", "build the patched trees (fetch first) and verify patched-tree"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("names", nargs="*", help="pins (default: every git pin)")
        _common(p)

    p = sub.add_parser("bundle", help="write fetched sources into one archive for nodes without network")
    p.add_argument("names", nargs="*")
    p.add_argument("-o", "--output", required=True, help="archive to write (e.g. out/sources.tar)")
    _common(p)

    p = sub.add_parser(
        "bump",
        help="move a git pin to a newer upstream revision, replay its series, write lock + branch + PR body",
        description="Move pin UPSTREAM to its policy target (or --to REF), replay the patch series "
        "there (kept / refreshed / upstreamed / conflict, zero fuzz), verify, then write "
        "upstreams.lock and refreshed patches and commit them on a new branch. The PR body "
        "goes to --out. Exit 0: bumped or already current; 1: stopped at a conflict (report "
        "written, nothing else); 2: bad input or an error (nothing written).",
    )
    p.add_argument("upstream", help="the git pin to bump")
    p.add_argument(
        "--to",
        default=None,
        metavar="REF",
        help="target: a 40-hex commit, refs/..., or a branch or tag name (default: the pin's policy)",
    )
    p.add_argument("--branch", default=None, help="branch to commit on (default: bump-<pin>-<new8>)")
    p.add_argument("--no-commit", action="store_true", help="write the lock and patch files only, no branch/commit")
    p.add_argument(
        "--allow-rewind",
        action="store_true",
        help="accept a target that does not descend from the pinned rev (a rewritten upstream)",
    )
    p.add_argument("--out", default="out/bump", help="report folder (default: out/bump)")
    _common(p)

    p = sub.add_parser("outdated", help="per git pin: commits and days behind its policy target (table + JSON)")
    p.add_argument("names", nargs="*", help="pins (default: every git pin)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--out", default="out/bump", help="folder of outdated.json (default: out/bump)")
    _common(p)

    p = sub.add_parser("build", help="build images from containers/<image>/ on the Docker engine ($DOCKER_HOST)")
    from .containers import command as containers_command

    containers_command.add_arguments(p)
    _common(p)

    p = sub.add_parser("gate", help="run a gate and write its reports")
    p.add_argument("gate", choices=list(GATE_ORDER))
    _gate_args(p)

    p = sub.add_parser("all-gates", help="run every gate in dependency order; one combined report")
    _gate_args(p)

    # issue 15: `launch k8s` renders Kubernetes manifests (cluster/k8s.py); `preflight` (cluster/preflight.py)
    p = sub.add_parser("launch", help="render a gate's launch plan for a cluster engine (nothing runs without --apply)")
    engines = p.add_subparsers(dest="engine", required=True)
    from .cluster import k8s as launch_k8s

    launch_k8s.add_arguments(engines.add_parser("k8s", help=launch_k8s.HELP, description=launch_k8s.HELP))
    # --- launch slurm (reprostack.cluster.slurm): one sbatch script from the gate's launch plan
    p = engines.add_parser(
        "slurm",
        help="one sbatch script from the gate's launch plan; --submit runs it",
        description="Write OUT/job.sbatch: #SBATCH --nodes=N --ntasks-per-node=1 --exclusive, "
        "rendezvous from SLURM_*, the preflight step, one srun of the per-node agent "
        "in the gate's image; node 0 writes the report into OUT. --submit: sbatch, "
        "follow the job, exit with its exit code (2: bad input or no sbatch).",
    )
    p.add_argument("gate", choices=list(GATE_ORDER))
    p.add_argument("--nodes", type=int, required=True, help="nodes (must equal the profile's)")
    p.add_argument("--partition", default=None)
    p.add_argument("--profile", default=None, help="profile of gates/<gate>.yaml (default: the published p5en one)")
    p.add_argument(
        "--out",
        default=None,
        help="out dir on the shared filesystem, relative to the project root (default: out/slurm/<gate>)",
    )
    p.add_argument(
        "--runtime",
        choices=["pyxis", "enroot", "docker", "host"],
        default="pyxis",
        help="pyxis (default): srun --container-image; enroot: a squashfs from `build --save`; docker: "
        "docker run per node; host: each node's own packages (labelled host mode)",
    )
    p.add_argument("--image", default=None, metavar="REF", help="image ref (default: the recipe's digest/id)")
    p.add_argument("--sqsh", default=None, metavar="PATH", help="enroot squashfs (default: out/images/<recipe>.sqsh)")
    p.add_argument(
        "--no-preflight", dest="preflight", action="store_false", help="omit the `reprostack preflight` step"
    )
    p.add_argument("--arm", action="append", default=[], help="arm(s) to run (default: every arm)")
    p.add_argument("--submit", action="store_true", help="sbatch it, print state changes, exit with the job's code")
    _common(p)
    # --- end launch slurm
    p = sub.add_parser(
        "preflight",
        help="cross-node preflight: same lock and image, GPUs, EFA, provider efa, clocks, "
        "port; node 0 writes DIR/preflight/verdict.json; exit 2 names node and check",
    )
    p.add_argument("gate", choices=list(GATE_ORDER))
    p.add_argument("--out", required=True, help="shared folder of the run (facts and verdict under DIR/preflight)")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--node-rank", type=int, required=True)
    p.add_argument("--profile", default=None, help="profile of gates/<gate>.yaml (default: the published one)")
    p.add_argument("--lock", default=None, help="lockfile (default: upstreams.lock of the project root)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds node 0 waits for every node (default 300)")
    p.add_argument("--port", type=int, default=None, help="rendezvous port that must be free on node 0 (default 29500)")
    p = sub.add_parser(
        "bench",
        help="time the main job cold and warm (bench gate_micro) or the CPU side (bench cpu); JSON in results/bench/",
        description="gate_micro: `reprostack gate micro` cold (fresh cache dir, the wheelhouse as given) "
        "then warm; exit 0 same verdict both times, 1 different. cpu: fetch of every "
        "mirrored git pin cold/warm, lock check, CLI start. Arguments after `--` go to the gate.",
    )
    p.add_argument("what", choices=["gate_micro", "cpu"])
    p.add_argument("--host", default=None, help="host label in the file name (default: the short host name)")
    p.add_argument("--results", default="results/bench", help="folder of the JSON (default: results/bench)")
    p.add_argument(
        "--work",
        default="out/bench",
        help="scratch folder: caches and reports of the runs (default: out/bench; emptied first)",
    )
    p.add_argument("--lock", default=None)
    p.add_argument(
        "--mirror", action="append", default=[], metavar="URL=PATH", help="cpu: mirror (also $REPROSTACK_MIRRORS)"
    )
    p.set_defaults(gate_args=[])  # what follows `--` (the gate's own options), split off in main()

    p = sub.add_parser(
        "verify",
        help="recompute published claims from raw AIPerf artifacts; verify.json + verify.md",
        description="Recompute every claim of --claims from the AIPerf artifacts under DIR (the first "
        "DIR holding all of a claim's artifacts is used). Exit 0: every claim matched or is "
        "a declared ambiguity; 1: a mismatch; 3: an artifact missing; 2: an artifact or the "
        "claims file could not be read.",
    )
    p.add_argument("dirs", nargs="+", metavar="DIR", help="folder(s) of AIPerf artifacts (<arm>/<cell>/...)")
    p.add_argument("--claims", default=None, help="claims file (default: claims/published.yaml of the project root)")
    p.add_argument("--out", default="out/verify", help="report folder (default: out/verify)")

    p = sub.add_parser(
        "history",
        help="ingest gate reports into a SQLite history; tables, regressions, plots",
        description="Ingest every gate report (*.json) under FOLDER (default: results/) into the "
        "history database, flag a regression where two runs' or two lock versions' 95%% intervals "
        "separate (naming the pins that changed), print the flagged ones first and one line per "
        "metric (--all: every run of every metric), write index.html and one PNG per metric "
        "(matplotlib, the `plots` extra) into --out. Exit 0; 2 when a report or a stored row was "
        "skipped (each named on stderr) or the database cannot be used.",
    )
    p.add_argument("folders", nargs="*", metavar="FOLDER", help="folders (or report files) to ingest")
    p.add_argument("--out", default=None, help="page folder (default: results/history of the project root)")
    p.add_argument("--db", default=None, help="history database (default: <cache dir>/history/history.sqlite3)")
    p.add_argument("--no-plots", action="store_true", help="ingest and print only (no page)")
    p.add_argument("--all", action="store_true", help="print every run of every metric, every regression")
    for sp in sub.choices.values():  # -v also after the subcommand (`nox -s gate_micro -- -v`)
        sp.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help="details (as before it)")
    return ap


def _gate_args(p: argparse.ArgumentParser) -> None:
    from .gates import options as gate_options

    _common(p)
    gate_options.add_arguments(p)  # every gate option, defined once (gates.options)


def _load(args) -> tuple[lockmod.Lock, Path]:
    lock_path = Path(args.lock) if args.lock else paths.project_root() / lockmod.LOCKFILE
    return lockmod.load(lock_path), lock_path.resolve().parent


def _key_values(items: list[str], flag: str, form: str) -> dict[str, str]:
    """`["K=V", ...]` of a repeatable option -> {K: V}; raises ReprostackError naming the option and the item."""
    out = {}
    for item in items:
        if "=" not in item:
            raise ReprostackError(f"{flag} {item!r}: expected {form}")
        k, v = item.split("=", 1)
        out[k] = v
    return out


def _fetch_opts(args) -> sources.FetchOptions:
    mirrors = _key_values(args.mirror, "--mirror", "URL=PATH")
    timeout = None
    if args.git_timeout is not None:
        try:
            timeout = gitcmd.parse_timeout(args.git_timeout, "--git-timeout")
        except ValueError as e:
            raise ReprostackError(str(e)) from None
    if args.cache and Path(args.cache).exists() and not Path(args.cache).is_dir():
        raise ReprostackError(f"--cache {args.cache}: exists and is not a folder")
    opts = sources.FetchOptions.make(
        Path(args.cache) if args.cache else None,
        offline=args.offline,
        mirrors=mirrors,
        bundles=args.bundle,
        timeout=timeout,
    )
    from . import ui

    ui.configure(cache=opts.cache.root)  # the step durations (ETAs) live next to what they time
    return opts


def _git_names(lock: lockmod.Lock, names: list[str]) -> list[str]:
    return names or [n for n, p in lock.upstreams.items() if isinstance(p, lockmod.GitPin)]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    gate_args: list[str] = []
    if "bench" in argv and "--" in argv and argv.index("bench") < argv.index("--"):  # bench ... -- GATE OPTIONS
        argv, gate_args = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    args = parser().parse_args(argv)
    if gate_args:
        args.gate_args = gate_args
    from . import ui

    ui.configure(verbose=args.verbose)
    before = os.environ.get(lockmod.stacks.ENV)
    if args.stack is not None:  # for this command and what it starts (nox sessions, gate launches); restored after
        os.environ[lockmod.stacks.ENV] = args.stack
    try:
        return _main(args)
    finally:
        if before is None:
            os.environ.pop(lockmod.stacks.ENV, None)
        else:
            os.environ[lockmod.stacks.ENV] = before


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _shown(e) -> str:
    """An error's text fit for a terminal: an untrusted value quoted into it (a forged preflight verdict, a path)
    can hold escape sequences or a carriage return that would rewrite what the operator sees; every control
    character but newline and tab is shown escaped (\\x1b)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(e))


def _main(args) -> int:
    try:
        return _dispatch(args)
    except FetchError as e:
        hint = f"\n{_NO_NETWORK_HINT}" if isinstance(e, SourceUnreachable) else ""
        print(f"reprostack: error: {_shown(e)}{hint}", file=sys.stderr)
        return 2
    except ReprostackError as e:
        print(f"reprostack: error: {_shown(e)}", file=sys.stderr)
        return 2
    except GitFailed as e:  # git refused what it was given (a corrupt cache, a bad ref): its own words, one line
        print(f"reprostack: error: {' '.join(str(e).split())[:400]}", file=sys.stderr)
        return 2
    except OSError as e:  # the operator's paths (an --out that is a file, a read-only folder, a full disk)
        where = f"{e.filename}: " if e.filename else ""
        print(f"reprostack: error: {_shown(f'{where}{e.strerror or e}')}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("reprostack: interrupted; nothing half-done is marked verified (the next run cleans up)", file=sys.stderr)
        return 130
    except Exception:  # never exit 1 (= a gate failed) for a crash of the tool itself
        traceback.print_exc()
        print("reprostack: internal error (the traceback above); no verdict was reached", file=sys.stderr)
        return 2


_NO_NETWORK_HINT = (
    "hint: without access to the upstream hosts, fetch through local mirrors (--mirror URL=PATH or "
    "REPROSTACK_MIRRORS=URL=PATH,...) or from a bundle (--offline --bundle FILE; README: "
    "'A GPU node without internet')"
)


def _dispatch(args) -> int:
    if args.cmd == "lock":
        desc = {
            "wheels": "resolve wheel pins with pip; fill (default) or --check their files",
            "images": "resolve image pins' repo:tag to the registry's manifest digest; fill (default) or --check "
            "their digest",
        }.get(args.action, "validate the lockfile")
        wp = argparse.ArgumentParser(prog=f"reprostack lock {args.action}", description=desc)
        wp.add_argument("--lock", default=args.lock)
        if args.action in ("wheels", "images"):
            wp.add_argument("names", nargs="*", help=f"pins (default: every {args.action[:-1]} pin)")
            wp.add_argument(
                "--check",
                action="store_true",
                help="compare the lock with what the index/registry serves and fail on any difference; write nothing",
            )
        wargs = wp.parse_intermixed_args(args.rest)
        args.lock = wargs.lock
        if args.action in ("wheels", "images"):
            from .lock import images as lockimages, wheels as lockwheels

            lock_path = Path(args.lock) if args.lock else paths.project_root() / lockmod.LOCKFILE
            mod = lockwheels if args.action == "wheels" else lockimages
            return mod.run(lock_path, wargs.names, wargs.check)
        lock, _ = _load(args)
        print(f"{lock.path}: ok ({len(lock.upstreams)} pins, sha256 {lock.sha256})")
        return 0
    if args.cmd == "verify":
        return _verify(args)
    if args.cmd == "history":
        from .history.command import run as history_run

        return history_run(args.folders, args.out, args.db, plots=not args.no_plots, full=args.all)
    if args.cmd == "bench":
        from . import bench
        from .fetch.git import mirrors_from_env

        lock, _ = _load(args)
        rest = list(args.gate_args)
        if args.what == "cpu":
            bench.bench_cpu(
                lock=lock,
                mirrors={**mirrors_from_env(), **_key_values(args.mirror, "--mirror", "URL=PATH")},
                out_dir=Path(args.results),
                work=Path(args.work) / "cpu",
                host=args.host,
            )
            return 0
        return bench.bench_gate(
            "micro", rest, lock=lock, out_dir=Path(args.results), work=Path(args.work) / "gate_micro", host=args.host
        )[1]
    if args.cmd == "stacks":
        from . import stacks

        if args.action[:1] in (["plugin"], ["check-plugin"]):
            lock, root = _load(args)
            return stacks.plugin(args, lock, root, _fetch_opts(args) if args.action[0] == "plugin" else None)
        return stacks.run(
            Path(args.lock) if args.lock else paths.project_root() / lockmod.LOCKFILE, args.action, args.json
        )
    lock, root = _load(args)
    if args.cmd == "launch" and args.engine == "slurm":  # issue 15: cluster/slurm.py
        return _launch_slurm(args, lock, root, _fetch_opts(args))
    if args.cmd in ("launch", "preflight"):  # issue 15: cluster/k8s.py, cluster/preflight.py
        from .gates import registry
        from .cluster import k8s as launch_k8s, preflight

        g = registry.gate(args.gate)
        if args.cmd == "launch":
            return launch_k8s.main(args, g, lock, root)
        return preflight.run(
            g,
            root,
            lock,
            out=Path(args.out),
            nodes=args.nodes,
            node_rank=args.node_rank,
            profile=args.profile,
            timeout_s=args.timeout,
            port=args.port,
        )
    opts = _fetch_opts(args)
    if args.cmd == "fetch":
        for n in _git_names(lock, args.names):
            f = sources.fetch(lock.git(n), opts)
            print(f"{n}: {f.pin.rev} tree {f.pin.tree} ok ({len(f.submodules)} submodule(s))")
        return 0
    if args.cmd == "patch":
        for n in _git_names(lock, args.names):
            st = sources.prepare(lock, n, opts, root)
            print(f"{n}: {st.path} tree {st.tree} {'(reused)' if st.reused else ''}".rstrip())
        return 0
    if args.cmd == "bundle":
        from .fetch import write_bundle

        if Path(args.output).is_dir():
            raise ReprostackError(f"-o {args.output}: is a folder; name the archive to write (e.g. out/sources.tar)")
        fetched = [sources.fetch(lock.git(n), opts) for n in _git_names(lock, args.names)]
        out = write_bundle(fetched, Path(args.output))
        print(f"{out}: {out.stat().st_size} bytes ({', '.join(f.pin.name for f in fetched)})")
        return 0
    if args.cmd == "bump":
        return _bump(args, root, opts, argv_of(args))
    if args.cmd == "outdated":
        return _outdated(args, lock, opts)
    if args.cmd == "build":
        from .containers import command as containers_command

        return containers_command.run(args, lock, root, opts)
    return _gates(args, lock, root, opts)


def argv_of(args) -> list[str]:
    """The bump's own arguments as typed (for the PR body's "Produced by")."""
    out = [args.upstream]
    for flag, value in (("--to", args.to), ("--branch", args.branch), ("--lock", args.lock)):
        if value:
            out += [flag, value]
    out += [f for f, on in (("--no-commit", args.no_commit), ("--allow-rewind", args.allow_rewind)) if on]
    return out


def _bump(args, root: Path, opts, argv: list[str]) -> int:
    from .bump import BumpConflict, plan_bump, write_bump, write_report

    lock_path = Path(args.lock) if args.lock else paths.project_root() / lockmod.LOCKFILE
    lk = lockmod.load(lock_path)
    if args.upstream in lk.stacks[lk.stack].overrides:  # bump edits upstreams: (the shared pin), not an override
        raise ReprostackError(
            f"{lk.where('upstreams', args.upstream)}: stack {lk.stack} overrides pin "
            f"{args.upstream}; bump moves the shared pin only: edit stacks.{lk.stack}.overrides."
            f"{args.upstream} (rev and tree, checked by `reprostack --stack {lk.stack} fetch "
            f"{args.upstream}`)"
        )
    r = plan_bump(
        lock_path, args.upstream, opts, to=args.to, project_root=root, allow_rewind=args.allow_rewind, args=argv
    )
    if r.status == "current":
        print(f"{r.upstream}: already at {r.new_rev} ({r.target.how}); nothing to do")
        return 0
    if r.status == "conflict":
        md = write_report(r, Path(args.out))
        print(f"reprostack: error: {BumpConflict(r)}", file=sys.stderr)
        print(f"report: {md.resolve()}")
        return 1
    from .history.bumpview import section as history_section

    r.history = history_section(root, r.old_lock_text, r.new_lock_text, r.impact.gates)
    branch = None if args.no_commit else (args.branch or f"bump-{r.upstream}-{r.new_rev[:8]}")
    write_bump(r, branch)
    md = write_report(r, Path(args.out))
    counts = {}
    for o in r.replay.outcomes:
        counts[o.outcome] = counts.get(o.outcome, 0) + 1
    print(f"{r.title}: " + (", ".join(f"{v} {k}" for k, v in counts.items()) or "no patch series"))
    print(
        f"{r.lock_path}: rev {r.new_rev} tree {r.new_tree}"
        + (f" patched-tree {r.patched_tree}" if r.patched_tree else "")
    )
    if r.branch:
        print(f"branch: {r.branch} (commit {r.commit})")
    print(f"PR body: {md.resolve()}")
    return 0


def _outdated(args, lock, opts) -> int:
    from .bump.outdated import outdated, table, to_json, write_json

    if opts.offline:
        raise ReprostackError("outdated asks each upstream (or its --mirror) for its refs: it cannot run --offline")
    rows = outdated(lock, args.names, opts)
    out = write_json(rows, Path(args.out) / "outdated.json")
    if args.json:
        print(to_json(rows), end="")
    else:
        from rich.console import Console

        Console().print(table(rows))
        for r in rows:  # in full: a table cell would cut them
            if r.error:
                print(f"{r.pin}: error: {r.error}", file=sys.stderr)
        print(f"json: {out.resolve()}")
    return 2 if any(r.error for r in rows) else 0


def _gates(args, lock, root, opts) -> int:
    """`gate NAME` runs one gate (bad input: exit 2); `all-gates` runs every gate in dependency order and always
    writes one combined report (gates.runner). Then the reports, one line per gate, and the exit code."""
    from . import ui
    from .gates import registry, runner
    from .report import exit_code, write_reports

    from .gates.base import RunContext
    from .gates.options import GateOptions

    base = Path(args.out) if args.out else run_base(args)
    ga = GateOptions.from_args(args, out=base)
    if args.image and not args.container:
        raise ReprostackError("--image IMAGE needs --container (host mode runs no image)")
    if args.kernels_manifest and args.container:
        raise ReprostackError(
            "--kernels-manifest is the in-image runner's option: --container already uses the "
            "image's /opt/reprostack/kernels.json"
        )
    near = next((p for p in (base, *base.parents) if p.exists()), None)  # before any gate runs for minutes
    if near is not None and not near.is_dir():
        raise ReprostackError(f"--out {base}: {near} exists and is not a folder")
    if args.plan:
        args.out = str(base)
        return _plans(args, lock, root, opts, ga)
    if not args.out and ((args.nodes or 1) > 1 or args.node_rank > 0):  # each node would stamp its own folder
        raise ReprostackError(
            "a run on several nodes needs --out DIR, the same folder on every node (node 0 reads "
            "every node's log there)"
        )
    # a new folder per run, `latest` pointed at it before anything runs: a crash leaves `latest` without a
    # summary, never an earlier run's summary to be read as this one's verdict; --out DIR is used as given
    before = _latest_target(base)
    out = base if args.out else ui.new_run_dir(base)
    ga, ctx = ga.with_(out=out), RunContext(root, lock, opts)
    ui.detail(f"reports will be in {out.resolve()}")
    try:
        if args.cmd == "gate":
            reports = [runner.run_gate(registry.gate(args.gate), ga, ctx)]
            required = {r.gate for r in reports}
        else:
            reports, required = runner.run_all(ga, ctx), runner.required()
    except ReprostackError:
        if not args.out and not any(out.iterdir()):  # bad input, nothing ran: no trace of this run, latest as it was
            out.rmdir()
            if before:
                ui.point_latest(base, before)
            else:
                (base / "latest").unlink(missing_ok=True)
        raise
    for r in reports:  # which of the lock's stacks ran (contract: provenance.stack)
        r.provenance.setdefault("stack", lock.stack)
    written = write_reports(reports, out, required=required)
    for r in reports:
        print(f"{r.gate} [{r.profile}]: {r.label()} — {r.reason}")
    print(f"reports: {out.resolve()} ({', '.join(sorted(written))})" + ("" if args.out else f"; {base / 'latest'}"))
    return exit_code(reports, required)


def _latest_target(base: Path) -> str | None:
    try:
        return os.readlink(base / "latest")
    except OSError:
        return None


def run_base(args) -> Path:
    """The default folder of a gate command's runs: out/gate_<G> (the nox session's name), out/all_gates."""
    return Path("out") / ("all_gates" if args.cmd == "all-gates" else f"gate_{args.gate.replace('-', '_')}")


def _plans(args, lock, root, opts, ga) -> int:
    """`gate G --plan` / `all-gates --plan`: each gate's launch plan (gates.plan), printed; nothing runs."""
    import json

    from .gates import registry
    from .gates.plan import gate_plan

    gates = [registry.gate(args.gate)] if args.cmd == "gate" else registry.present(root)
    plans = []
    for g in gates:
        profile = args.profile
        if profile and args.cmd == "all-gates" and profile not in g.load(root).profiles:
            profile = None  # --profile names one gate's hardware; the others show their published one
        plans.append(
            gate_plan(
                g, root, lock, out_dir=Path(args.out), cache_dir=opts.cache.root, options=ga.with_(profile=profile)
            )
        )
    if args.json:
        print(
            json.dumps(
                [p.to_dict() for p in plans] if args.cmd == "all-gates" else plans[0].to_dict(),
                indent=2,
                sort_keys=True,
            )
        )
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from . import ui

    console = Console()
    for p in plans:
        name = registry.gate(p.gate).name  # what the operator types (`gate nemo-rl`), not the spec stem
        if not ui.live_display():  # off a terminal: plain `field: value` lines, never wrapped (digests stay whole)
            print(f"launch plan: gate {name} [{p.profile}] (nothing was run)")
            print("\n".join(f"  {line}" for line in p.lines()))
            continue
        t = Table(
            title=escape(f"launch plan: gate {name} [{p.profile}] (nothing was run)"),
            show_header=False,
            title_justify="left",
        )
        t.add_column(style="bold")
        t.add_column(overflow="fold")
        for line in p.lines():
            k, _, v = line.partition(": ")
            t.add_row(escape(k), escape(v))
        console.print(t)
    return 0


def _launch_slurm(args, lock, root, opts) -> int:
    """`launch slurm`: the gate's plan (gates.plan) rendered by cluster.slurm into OUT/job.sbatch; --submit runs it."""
    from .atomicfile import write_text_atomic
    from .gates import registry
    from .cluster import slurm

    g = registry.gate(args.gate)
    out = args.out or f"out/slurm/{g.name}"
    arms = [a.strip() for x in args.arm for a in x.split(",") if a.strip()]
    text = slurm.script_for(
        g,
        root,
        lock,
        nodes=args.nodes,
        out=out,
        profile=args.profile,
        runtime=args.runtime,
        partition=args.partition,
        preflight=args.preflight,
        image=args.image,
        sqsh=args.sqsh,
        arms=arms,
        cache=str(opts.cache.root) if args.cache else None,
    )
    script = (root / out if not Path(out).is_absolute() else Path(out)) / "job.sbatch"
    (script.parent / "logs").mkdir(parents=True, exist_ok=True)
    write_text_atomic(script, text, mode=0o755)
    print(f"{script}: sbatch script for gate {g.name}, {args.nodes} node(s), runtime {args.runtime}")
    if not args.submit:
        return 0
    import time

    started = time.time()
    rc = slurm.submit(str(script), cwd=str(root))
    for line in _slurm_verdicts(script.parent / "summary.json", since=started):
        print(line)  # the gate's own verdict: Slurm says FAILED for any non-zero exit, a local-test pass included
    print(f"gate {g.name}: job exit {rc}; report and per-node logs in {script.parent}")
    return rc


def _slurm_verdicts(path: Path, *, since: float) -> list[str]:
    """`GATE [PROFILE]: VERDICT — reason` per gate of the summary.json the job wrote (node 0, on the shared out
    dir). Untrusted and maybe absent (the job died first) or left by an earlier job (older than `since`): then
    one line saying so, never a verdict that this job did not write."""
    import json
    from .report.writers import validate_summary

    try:
        if path.stat().st_mtime < since:
            return [f"{path}: not written by this job (no verdict; see the logs)"]
        d = json.loads(path.read_text())
        validate_summary(d)
    except FileNotFoundError:
        return [f"{path}: not written (no verdict; see the logs)"]
    except Exception as e:  # unreadable or not a summary: name it, keep the job's exit code
        return [f"{path}: unreadable ({type(e).__name__}; no verdict; see the logs)"]
    return [
        f"{x['gate']} [{x.get('profile') or '-'}]: {x.get('label') or str(x['result']).upper()} — {x.get('reason', '')}"
        for x in d["gates"]
    ]


def _verify(args) -> int:
    from .verify import run_verify

    claims = Path(args.claims) if args.claims else paths.project_root() / "claims" / "published.yaml"
    rc, results, written = run_verify([Path(d) for d in args.dirs], claims, Path(args.out))
    for r in results:
        if r.verdict != "match":
            print(f"{r.claim.id}: {r.verdict.upper()}" + (f" — {r.detail}" if r.detail else ""), file=sys.stderr)
    counts = {}
    for r in results:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    print(f"verify: {len(results)} claims: " + ", ".join(f"{v} {n}" for v, n in counts.items()) + f"; exit {rc}")
    print(f"reports: {Path(args.out).resolve()} ({', '.join(sorted(written))})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
