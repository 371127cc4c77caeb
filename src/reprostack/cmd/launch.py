"""`reprostack launch k8s|slurm GATE`: a gate's launch plan rendered for a cluster engine (cluster.k8s, cluster.slurm);
nothing runs without --apply (k8s) or --submit (slurm)."""

from __future__ import annotations

from pathlib import Path

from ..gates.registry import GATE_ORDER
from . import add_source_options, fetch_options, load_lock

HELP = "render a gate's launch plan for a cluster engine (nothing runs without --apply)"


def add_arguments(p) -> None:
    from ..gates import options as gate_options

    # issue 15: `launch k8s` renders Kubernetes manifests (cluster/k8s.py); `preflight` (cluster/preflight.py)
    engines = p.add_subparsers(dest="engine", required=True)
    from ..cluster import k8s_cli as launch_k8s

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
    gate_options.add_arguments(p, ("nodes", "profile", "master_port", "enroot_import"), required=("nodes",))
    p.add_argument("--partition", default=None)
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
        "--models",
        default=None,
        metavar="DIR",
        help="serving gates: the models folder on the nodes (mounted read-only at /models, HF_HOME inside; default: "
        "the submitter's HF_HOME, else ~/.cache/huggingface)",
    )
    p.add_argument(
        "--no-preflight", dest="preflight", action="store_false", help="omit the `reprostack preflight` step"
    )
    gate_options.add_arguments(p, ("arms",))
    p.add_argument("--submit", action="store_true", help="sbatch it, print state changes, exit with the job's code")
    add_source_options(p)
    # --- end launch slurm


def run(args) -> int:
    lock, root = load_lock(args)
    if args.engine == "slurm":  # issue 15: cluster/slurm.py
        return _launch_slurm(args, lock, root, fetch_options(args))
    from ..cluster import k8s_cli as launch_k8s
    from ..gates import registry

    return launch_k8s.main(args, registry.gate(args.gate), lock, root)


def _launch_slurm(args, lock, root, opts) -> int:
    """`launch slurm`: the gate's plan (gates.plan) rendered by cluster.slurm into OUT/job.sbatch; --submit runs it."""
    from ..atomicfile import write_text_atomic
    from ..cluster import slurm
    from ..gates import registry

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
        master_port=args.master_port,
        models=args.models,
        enroot_import=args.enroot_import,
    )
    script = (root / out if not Path(out).is_absolute() else Path(out)) / "job.sbatch"
    (script.parent / "logs").mkdir(parents=True, exist_ok=True)
    write_text_atomic(script, text, mode=0o755)
    print(f"{script}: sbatch script for gate {g.name}, {args.nodes} node(s), runtime {args.runtime}")
    where = slurm.image_from(text)
    if where:
        print(f"image: {where}")
    if not args.submit:
        return 0
    import time

    started = time.time()
    from ..cluster.slurm_submit import submit

    rc = submit(str(script), cwd=str(root))
    for line in _slurm_verdicts(script.parent / "summary.json", since=started):
        print(line)  # the gate's own verdict: Slurm says FAILED for any non-zero exit, a local-test pass included
    print(f"gate {g.name}: job exit {rc}; report and per-node logs in {script.parent}")
    return rc


def _slurm_verdicts(path: Path, *, since: float) -> list[str]:
    """`GATE [PROFILE]: VERDICT — reason` per gate of the summary.json the job wrote (node 0, on the shared out
    dir). Untrusted and maybe absent (the job died first) or left by an earlier job (older than `since`): then
    one line saying so, never a verdict that this job did not write."""
    import json
    from ..report.writers import validate_summary

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
