"""`reprostack bench gate_micro|cpu`: time the main job cold and warm, or the CPU side (reprostack.bench); arguments
after `--` go to the gate (cli.main splits them off into args.gate_args)."""

from __future__ import annotations

from pathlib import Path

from ..gates import options as gate_options
from . import key_values, load_lock

HELP = "time the main job cold and warm (bench gate_micro) or the CPU side (bench cpu); JSON in results/bench/"
DESCRIPTION = (
    "gate_micro: `reprostack gate micro` cold (fresh cache dir, the wheelhouse as given) "
    "then warm; exit 0 same verdict both times, 1 different. cpu: fetch of every "
    "mirrored git pin cold/warm, lock check, CLI start. Arguments after `--` go to the gate."
)


def add_arguments(p) -> None:
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
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="gate_micro: N cold+warm pairs, each cold on a fresh cache; every run recorded, the median the headline",
    )
    p.add_argument(
        "--mirror", action="append", default=[], metavar="URL=PATH", help="cpu: mirror (also $REPROSTACK_MIRRORS)"
    )
    p.add_argument(
        "--from-nothing",
        action="store_true",
        help="gate_micro: also a cold run from nothing (fresh venv, the project installed, then the gate on a fresh "
        "cache), reported beside the cold run with the seeded setup",
    )
    p.add_argument(
        "--runs",
        default=None,
        metavar="KINDS",
        help="gate_micro, the kernel cache's figures (issue 41) instead: a comma list of cold_miss, warm, cold_hit, "
        "from_nothing_hit, --repeat rounds of each, every run from a fresh folder; run lists in "
        "<results>/kcache-<host>.json (merged with an earlier call's for the same lock, commit and host)",
    )
    gate_options.add_arguments(
        p,
        ("kernel_cache",),
        help={"kernel_cache": "with --runs: the folder the cold_miss run pushes into and the *_hit runs pull from"},
    )
    p.set_defaults(gate_args=[])  # what follows `--` (the gate's own options), split off in cli.main()


def run(args) -> int:
    from .. import bench
    from ..fetch.git import mirrors_from_env

    lock, _ = load_lock(args)
    rest = list(args.gate_args)
    if args.what == "cpu":
        bench.bench_cpu(
            lock=lock,
            mirrors={**mirrors_from_env(), **key_values(args.mirror, "--mirror", "URL=PATH")},
            out_dir=Path(args.results),
            work=Path(args.work) / "cpu",
            host=args.host,
        )
        return 0
    if args.runs:
        return bench.bench_kernel_cache(
            "micro",
            rest,
            lock=lock,
            out_dir=Path(args.results),
            work=Path(args.work) / "kcache",
            store=Path(args.kernel_cache or Path(args.work) / "kernel-cache"),
            kinds=tuple(k.strip() for k in args.runs.split(",") if k.strip()),
            host=args.host,
            repeat=args.repeat,
        )[1]
    return bench.bench_gate(
        "micro",
        rest,
        lock=lock,
        out_dir=Path(args.results),
        work=Path(args.work) / "gate_micro",
        host=args.host,
        repeat=args.repeat,
        from_nothing=args.from_nothing,
    )[1]
