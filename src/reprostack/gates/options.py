"""The one options model of a gate run: GateOptions, its one parser definition, and its command line.

Every place that takes or passes a gate's options uses this module: the CLI (`gate G`, `all-gates`), the runner and
the gates (GateOptions), the in-image runner's command line (container mode, the Slurm script, the Kubernetes
manifests: `GateOptions.runner_argv`), `launch slurm`, `launch k8s` and `preflight` (the options they share with a
run, `--profile` first of all, come from `add_arguments` here, with the same help and the same default rule).

Profile rule (PROFILE_RULE, one for every command): `--profile P` names a profile of `gates/<gate>.yaml`; without it
a gate that RUNS here takes the profile that fits this host (gates.profiles.fitting; none fits: SKIP), and a
command that only PLANS or RENDERS (`--plan`, `launch slurm`, `launch k8s`, `preflight`) takes the published
hardware's (the gate's multi-node EFA profile, gates.profiles.published). gates.profiles.resolve is that rule in
code.

Invariants:
- each option is defined once (OPTIONS: flag, type, help); a command chooses which it takes, never redefines one;
- `from_args(parse(runner_argv(o)))` gives back `o` for every field the in-image runner takes (a test checks it);
- the node rank and master address may be a launcher's placeholder (`${NODE_RANK}`, `$SLURM_NODEID`): rendered as
  given, parsed only by the runner on the node where the launcher has expanded them.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path

from ..errors import ReprostackError

PROFILE_RULE = (
    "hardware profile of gates/<gate>.yaml (default: a run here takes the profile that fits this host, and --plan, "
    "launch and preflight the published 2 x p5en one)"
)


MICRO_TRIALS = 5  # micro: trials in one launch when --trials is not given (gates.micro)
SERVING_TRIALS = 3  # serving: AIPerf profile runs per cell on a GPU profile when --trials is not given (gates.serving)


def trials_type(text: str) -> int:
    """`--trials K`: a whole number >= 1 (argparse prints its error as one line and exits 2)."""
    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if k < 1:
        raise argparse.ArgumentTypeError(f"{k}: give K >= 1")
    return k


# dest -> (flags, add_argument keywords). The one definition of every gate option; `add_arguments` takes a subset.
# `--baseline history`: the accepted runs of the results history database, resolved into report paths by the command
# layer (cmd.gate; the gates never read the history) and given to the gate as `baseline_runs`
BASELINE_HISTORY = "history"
MAX_NODES = 1024  # the most nodes a run, a rendering or a preflight takes (an absurd --nodes is one line, no work)

OPTIONS: dict[str, tuple[tuple[str, ...], dict]] = {
    "plan": (
        ("--plan",),
        dict(
            action="store_true",
            help="print the launch plan (image by digest, per-node commands, env, GPUs, EFA, ulimits, mounts, "
            "timeout) and run nothing; default profile: the published 2 x p5en one",
        ),
    ),
    "json": (("--json",), dict(action="store_true", help="with --plan: JSON instead of the table")),
    "image": (
        ("--image",),
        dict(
            default=None,
            metavar="IMAGE",
            help="the image the gate runs in: with --container an image of this engine (default: the gate recipe's "
            "id from the last `reprostack build` here, out/build/images.json); for launch, the registry ref the "
            "cluster pulls (by digest)",
        ),
    ),
    "kernels_manifest": (
        ("--kernels-manifest",),
        dict(
            default=None,
            metavar="FILE",
            help="gates that build kernels, in host mode: take NCCL and DeepEP prebuilt in this image, as FILE (the "
            "image's /opt/reprostack/kernels.json) records them, after checking it against the lock; nothing is "
            "fetched or built (--container passes it to the in-image runner)",
        ),
    ),
    "kernel_cache": (
        ("--kernel-cache",),
        dict(
            default=None,
            metavar="URL",
            help="gates that build kernels: take a build whose key has a signed entry in this kernel cache instead "
            "of compiling it (oci://HOST/NAME, http(s)://URL, file://PATH or a folder; default "
            "$REPROSTACK_KERNEL_CACHE); a miss or a refused entry builds from source (`reprostack kernels push` "
            "fills it)",
        ),
    ),
    "kernel_keyring": (
        ("--kernel-keyring",),
        dict(
            default=None,
            metavar="DIR",
            help="the public keys a kernel cache entry must be signed by (default: the project's keys/)",
        ),
    ),
    "out": (
        ("--out",),
        dict(
            default=None,
            help="report folder, used as given (share it between nodes); default: a new folder "
            "out/gate_<G>/<UTC time>/ (all-gates: out/all_gates/<UTC time>/) and a `latest` link to it",
        ),
    ),
    "profile": (("--profile",), dict(default=None, help=PROFILE_RULE)),
    "python": (
        ("--python",),
        dict(default=sys.executable, help="interpreter that holds torch (default: this one)"),
    ),
    "jobs": (("--jobs",), dict(type=int, default=None, help="parallel compile jobs (default: all cores)")),
    "arch": (("--arch",), dict(default=None, help="CUDA arch, e.g. 90 (default: from nvidia-smi)")),
    "nodes": (
        ("--nodes",),
        dict(
            type=int,
            default=None,
            metavar="N",
            help="how many nodes the run spans (default: the gate profile's node count; another count is refused)",
        ),
    ),
    "node_rank": (("--node-rank",), dict(type=int, default=0, help="this node's rank (0: the node that reports)")),
    "master_addr": (("--master-addr",), dict(default=None, help="node 0's address (several nodes)")),
    "master_port": (("--master-port",), dict(type=int, default=None, help="rendezvous port (several nodes)")),
    "run_id": (
        ("--run-id",),
        dict(
            default=None,
            metavar="ID",
            help="several nodes: this run's id, the same on every node (Slurm: the job id; Kubernetes: the Job's "
            "uid), written into each node's rc file so node 0 never takes an earlier run's (launch renders it)",
        ),
    ),
    "enroot_import": (
        ("--enroot-import",),
        dict(
            default=None,
            metavar="DIR",
            help="launch slurm, pyxis on enroot 3.x (HyperPod ships 3.4.1, whose docker:// grammar has no "
            "REPO@sha256: before enroot 4.0): each node imports the image by its digest once into "
            "DIR/<digest hex>.sqsh (`enroot import -o FILE docker://REGISTRY#IMAGE:sha256:HEX`; DIR on shared "
            "storage: one import serves every node) and srun runs --container-image=FILE; default: pyxis pulls "
            "REPO@sha256: itself (enroot >= 4). Registry login: docs/examples/README.md",
        ),
    ),
    "modes": (
        ("--modes",),
        dict(choices=["first", "all"], default="first", help="test_ep modes to run and parse"),
    ),
    "timeout": (
        ("--timeout",),
        dict(type=float, default=None, help="watchdog seconds for the test (default: the gate spec's)"),
    ),
    "trials": (
        ("--trials",),
        dict(
            type=trials_type,
            default=None,
            metavar="K",
            help="repeated trials, bars judged on their 95%% interval (PASS / FAIL / INCONCLUSIVE): micro: "
            f"the measurement K >= 1 times in one launch (default {MICRO_TRIALS}; K=1 has no interval: "
            f"INCONCLUSIVE); serving: AIPerf's --num-profile-runs K per cell (default {SERVING_TRIALS} on a GPU "
            "profile, 1 on local-test: the bar on the one run)",
        ),
    ),
    "arms": (
        ("--arm",),
        dict(
            dest="arm",
            action="append",
            default=[],
            help="arm(s) to run (repeatable or comma list; default: every arm of a serving/training gate; "
            "micro: deepep, plus dense for the all_to_all_single comparison arm)",
        ),
    ),
    "vars": (
        ("--var",),
        dict(
            dest="var",
            action="append",
            default=[],
            metavar="K=V",
            help="serving gates: value of a ${K} template variable of the gate spec (e.g. trtllm_seam=DIR)",
        ),
    ),
    "server_args": (
        ("--server-arg",),
        dict(
            dest="server_arg",
            action="append",
            default=[],
            metavar="ARG",
            help="serving gates: appended to the server command (e.g. the test server's --fail-every=3)",
        ),
    ),
    "baseline": (
        ("--baseline",),
        dict(
            default=None,
            metavar="DIR|history",
            help="judge each bar against the accepted runs under DIR (every report of this gate, profile and stack "
            "with result pass; e.g. results/), or with `history` those of the results history database "
            "(`reprostack history`; <cache>/history/history.sqlite3), at the bar's own baseline tolerance, instead of the runs its "
            "spec names; the report says which runs made the bar",
        ),
    ),
    "baseline_runs": (
        ("--baseline-run",),
        dict(
            dest="baseline_run",
            action="append",
            default=[],
            metavar="REPORT",
            help="a report (a path in the project) the baseline bars may take as an accepted run, instead of the "
            "runs the spec names (repeatable; what `--baseline history` resolves to, and what the in-image runner "
            "is given)",
        ),
    ),
    "num_sms": (
        ("--num-sms",),
        dict(
            type=int,
            default=None,
            metavar="K",
            help="micro: DeepEP given K SMs (test_ep --num-sms; default: its own choice), a deliberate variation "
            "the report names (e.g. a slowed run that must not pass its bar)",
        ),
    ),
    "purpose": (
        ("--purpose",),
        dict(
            choices=("ordinary", "baseline"),
            default="ordinary",
            help="what this run is, signed into its attestation (reprostack.evidence): `baseline`, a run made to be "
            "an accepted baseline run (only signed baseline runs make a baseline bar); a deliberate variation "
            "(--num-sms) says so by itself",
        ),
    ),
    "launched_logs": (
        ("--launched-logs",),
        dict(
            default=None,
            metavar="DIR",
            help="a profile started by MPI (fabric across nodes: srun --mpi=pmix, an MPIJob): judge what that launch "
            "wrote in DIR (each test's <test>.log of every rank and its <test>.rc), start nothing (the rendered "
            "sbatch and MPIJob pass it)",
        ),
    ),
    "legacy": (
        ("--legacy",),
        dict(
            action="store_true",
            help="also run DeepEP's legacy test_intranode.py (EP 2/4/8, one node) as second evidence",
        ),
    ),
}
# what a gate run takes (`gate G`, `all-gates`), in the order of the help text
RUN_OPTIONS = (
    "plan",
    "json",
    "container",
    "image",
    "kernels_manifest",
    "kernel_cache",
    "kernel_keyring",
    "out",
    "profile",
    "python",
    "jobs",
    "arch",
    "nodes",
    "node_rank",
    "master_addr",
    "master_port",
    "run_id",
    "modes",
    "timeout",
    "trials",
    "arms",
    "vars",
    "server_args",
    "baseline",
    "baseline_runs",
    "num_sms",
    "purpose",
    "legacy",
    "launched_logs",
)

# what only a launcher takes (`launch slurm`): how the cluster gets the image, never a run's option
LAUNCH_OPTIONS = ("enroot_import",)


def add_arguments(p: argparse.ArgumentParser, names=RUN_OPTIONS, *, required=(), help=None) -> None:
    """Add the options `names` (keys of OPTIONS, plus "container": the --container/--no-container pair) to `p`, as
    defined once here; `required`: those the command cannot run without; `help`: a command's own wording for an
    option whose meaning it narrows (the flag, type and default stay the ones defined here)."""
    for name in names:
        if name == "container":
            where = p.add_mutually_exclusive_group()
            where.add_argument(
                "--container",
                dest="container",
                action="store_true",
                default=False,
                help="run inside the gate's image through the Docker engine at $DOCKER_HOST (no engine: "
                "an error, never a fall back to host mode); the report records the image id",
            )
            where.add_argument(
                "--no-container",
                dest="container",
                action="store_false",
                help="host mode (the default): run on this host's own packages; the report says so",
            )
            continue
        flags, kw = OPTIONS[name]
        kw = dict(kw)
        if name in required:
            kw.pop("default", None)
            kw["required"] = True
        if help and name in help:
            kw["help"] = help[name]
        p.add_argument(*flags, **kw)


def _key_values(items, flag: str, form: str) -> tuple[tuple[str, str], ...]:
    """`["K=V", ...]` of a repeatable option -> ((K, V), ...); ReprostackError naming the option and the item."""
    out = {}
    for item in items:
        if "=" not in item:
            raise ReprostackError(f"{flag} {item!r}: expected {form}")
        k, v = item.split("=", 1)
        out[k] = v
    return tuple(out.items())


@dataclass(frozen=True)
class GateOptions:
    """What the operator chose for a gate run (one model for the CLI, the runner, every gate and the launchers).

    out: the report folder (None: the command's default); arms: arm names, split on commas; vars: `--var K=V`
    pairs; server_args: `--server-arg`s; node_rank / master_addr: ints and addresses, or a launcher's placeholder
    when rendered for a cluster; container / image / kernels_manifest: where it runs (gates.container)."""

    out: Path | None = None
    profile: str | None = None
    python: str = sys.executable
    jobs: int | None = None
    arch: str | None = None
    nodes: int | None = None
    node_rank: int | str = 0
    master_addr: str | None = None
    master_port: int | None = None
    run_id: str | None = None
    modes: str = "first"
    trials: int | None = None
    timeout: float | None = None
    arms: tuple[str, ...] = ()
    vars: tuple[tuple[str, str], ...] = ()
    server_args: tuple[str, ...] = ()
    baseline: str | None = None
    baseline_runs: tuple[str, ...] = ()
    num_sms: int | None = None
    purpose: str = "ordinary"
    legacy: bool = False
    launched_logs: str | None = None
    container: bool = False
    image: str | None = None
    kernels_manifest: str | None = None
    kernel_cache: str | None = None
    kernel_keyring: str | None = None
    plan: bool = False
    json: bool = False

    def __post_init__(self):
        object.__setattr__(self, "arms", tuple(a.strip() for x in self.arms for a in str(x).split(",") if a.strip()))
        if isinstance(self.vars, dict):
            object.__setattr__(self, "vars", tuple(self.vars.items()))
        object.__setattr__(self, "server_args", tuple(self.server_args))
        object.__setattr__(self, "baseline_runs", tuple(self.baseline_runs))
        if self.out is not None and not isinstance(self.out, Path):
            object.__setattr__(self, "out", Path(self.out))

    @classmethod
    def from_args(cls, args: argparse.Namespace, **over) -> GateOptions:
        """The options of a parsed command line (the options it does not take keep their defaults); `over`
        replaces fields. Raises ReprostackError for a malformed `--var`."""
        d = {}
        for f in fields(cls):
            if f.name in ("arms", "vars", "server_args", "baseline_runs", "out"):
                continue
            if hasattr(args, f.name):
                d[f.name] = getattr(args, f.name)
        if getattr(args, "out", None) is not None:
            d["out"] = Path(args.out)
        d["arms"] = tuple(getattr(args, "arm", None) or ())
        d["vars"] = _key_values(getattr(args, "var", None) or (), "--var", "K=V")
        d["server_args"] = tuple(getattr(args, "server_arg", None) or ())
        d["baseline_runs"] = tuple(getattr(args, "baseline_run", None) or ())
        d.update(over)
        return cls(**d)

    def with_(self, **kw) -> GateOptions:
        return replace(self, **kw)

    @property
    def vars_dict(self) -> dict[str, str]:
        return dict(self.vars)

    @property
    def out_dir(self) -> Path:
        """The report folder (ReprostackError when none was decided: a library caller must give one)."""
        if self.out is None:
            raise ReprostackError("no report folder (--out) for this gate run")
        return self.out

    def runner_argv(
        self, gate: str, *, out: str, lock: str, cache: str | None = "/tmp/reprostack-cache", kernels: str | None = None
    ) -> list[str]:
        """The in-image runner's command: `python3 -m reprostack gate GATE --no-container` with these options,
        the report folder `out`, the lockfile `lock` and the cache `cache` as the runner sees them (None: the
        runner's default cache); `kernels`: the image's kernels manifest (a gate that takes its kernels prebuilt)."""
        argv = ["python3", "-m", "reprostack", "gate", gate, "--no-container", "--out", out, "--lock", lock]
        argv += ["--cache", cache] if cache else []
        argv += ["--kernels-manifest", kernels] if kernels else []
        for flag, value in (
            ("--profile", self.profile),
            ("--jobs", self.jobs),
            ("--arch", self.arch),
            ("--nodes", self.nodes),
            ("--master-addr", self.master_addr),
            ("--master-port", self.master_port),
            ("--run-id", self.run_id),
            ("--timeout", self.timeout),
        ):
            if value is not None:
                argv += [flag, str(value)]
        argv += ["--node-rank", str(self.node_rank), "--modes", self.modes]
        argv += [x for arm in self.arms for x in ("--arm", arm)]
        argv += [x for k, v in self.vars for x in ("--var", f"{k}={v}")]
        argv += [f"--server-arg={s}" for s in self.server_args]
        argv += ["--trials", str(self.trials)] if self.trials is not None else []
        argv += ["--baseline", self.baseline] if self.baseline else []
        argv += [x for r in self.baseline_runs for x in ("--baseline-run", r)]
        argv += ["--num-sms", str(self.num_sms)] if self.num_sms is not None else []
        argv += ["--purpose", self.purpose] if self.purpose != "ordinary" else []
        argv += ["--launched-logs", self.launched_logs] if self.launched_logs else []
        return argv + (["--legacy"] if self.legacy else [])
