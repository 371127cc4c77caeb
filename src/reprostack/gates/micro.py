"""Gate 1 (micro): lock -> sources -> kernels -> DeepEP test_ep.py -> parsed phases -> bars -> report.

The gate passes only on measured evidence: a complete phase table for every rank and every bar of
the profile met, with exactly one NCCL (the pinned one) in each measuring process (judged on the record each rank
of the trials driver prints after its trials: /proc/self/maps and ncclGetVersion; no separate check process,
issue 17; anything else is ERROR naming the rank), on a profile whose bars were
measured (`bars-status: unmeasured` -> FAIL with every number reported). No GPU, or no profile that fits
the host -> SKIP with the reason (after sources were fetched, patched and verified, which needs no GPU). A crash or timeout ->
ERROR with the classified failure and the raw log. Optional runs (gates.arms): the dense comparison arm
(`arms` with "dense") and DeepEP's legacy intranode test (`legacy`); each asked-for run adds a
completeness check. Per-phase figures (gates.metrics) go to `data.metrics`, reported, not bars.

Trials (issue 16): test_ep runs through our trials driver (gates/drivers/micro_trials.py: upstream's test,
its case called `--trials K` times in ONE launch, default 5; why one launch: see the driver's doc), and the
dense arm, when asked for, runs inside that same launch, interleaved with DeepEP trial by trial, on the same
sizes and payload (item 2). Each trial gives one figure per metric (parsers.micro_trials); `data.statistics`
holds n, mean, p50, stdev, the 95% t interval and the samples per metric (report.stats), and every bar with
an inequality is judged on the interval (report.evaluate_interval): PASS only when the whole interval
clears it, FAIL when the whole interval is past it, otherwise INCONCLUSIVE (never PASS). One trial (K=1)
has no interval: INCONCLUSIVE. `data.metrics` gives the per-trial mean for the metrics with statistics and
the first trial's figure for the others (per-phase GB/s, ...).

Kernels: built here from the fetched, patched trees (host mode), or, with `prebuilt` (the in-image runner of
container mode, `--kernels-manifest`), taken from the image: its manifest is checked against the lock and this
checkout's kernel recipes (reprostack.kernels.prebuilt) and nothing is fetched or built; a missing or mismatching
manifest is one error line before anything ran, never a build of another kind.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import hostinfo, sources, ui
from ..errors import ReprostackError
from ..kernels import build as kbuild
from ..fetch.wheels import fetch_wheels, wheelhouses_from_env
from ..atomicfile import write_text_atomic
from ..kernels import jit, ncclwheel, preflight, runtime, toolchain
from ..kernels import prebuilt as kprebuilt
from ..kernels.recipe import load_recipe
from ..lock import Lock
from ..report import GateReport, artifact_for, decide, evaluate, evaluate_interval, skipped, utc_now
from ..report.stats import statistics_block
from . import arms as armsmod
from ..launch import torchrun
from . import metrics
from .parsers.failure import classify_failure
from .parsers.test_ep import classify_test_ep_failure
from .parsers.micro_trials import deepep_trial_started, markers, parse_micro_trials
from .spec import GateSpec, NoProfileForHost, Profile, load_spec
from ..launch.watchdog import run_with_watchdog

GATE = "micro"
TRIALS_DRIVER = "gates/drivers/micro_trials.py"
DEFAULT_TRIALS = 5


@dataclass
class GateRunOptions:
    """What the operator chose for a GPU gate that builds the kernels (micro, training). `python`: the
    interpreter holding torch (default: this one); nodes/node_rank/master_*: the torchrun topology."""

    root: Path
    lock: Lock
    fetch: sources.FetchOptions
    out_dir: Path
    profile: str | None = None
    python: str = sys.executable
    jobs: int | None = None
    arch: str | None = None
    nodes: int | None = None
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    timeout_s: float | None = None
    extra_args: list[str] = field(default_factory=list)
    prebuilt: Path | None = None  # the image's kernels manifest (container mode): use its builds, fetch nothing


@dataclass
class MicroOptions(GateRunOptions):
    """GateRunOptions plus test_ep's modes, the arms (deepep, dense) and the legacy second evidence."""

    modes: str = "first"
    arms: tuple[str, ...] = ("deepep",)
    legacy: bool = False
    trials: int = DEFAULT_TRIALS


def build_kernels(opts: GateRunOptions, trees: dict, prov: dict, timings: dict):
    """Build (or reuse, keyed) NCCL and DeepEP from the patched `trees` with the interpreter `opts.python`;
    records `nccl_build_s` / `deepep_build_s` in `timings` and `kernels` / `toolchain` in `prov`.
    Returns (toolchain, nccl Built, deepep Built). Raises BuildError / ReprostackError."""
    tc = toolchain.detect(opts.python, arch=opts.arch, cache=opts.fetch.cache.root)
    t = time.monotonic()
    recipe = load_recipe(opts.root, "nccl")
    src_version = preflight.nccl_source_version(trees["nccl"].path) if "nccl" in trees else None  # none: wheel alone
    choice = ncclwheel.choose(opts.lock, recipe.source, recipe.wheel, src_version, recipe_path=str(recipe.path))
    if choice.kind == "wheel":  # the pinned release as NVIDIA's wheel: sha256-checked, unpacked once (keyed)
        with ui.step(f"fetch nccl wheel {choice.version}", key="fetch nccl wheel"):
            wheel = fetch_wheels(
                opts.lock,
                choice.wheel_pin,
                cache_root=opts.fetch.cache.root,
                wheelhouses=wheelhouses_from_env(),
                offline=opts.fetch.offline,
            )[0]
        nccl = ncclwheel.unpack(wheel.path, wheel.sha256, choice.version, opts.fetch.cache.root)
    else:
        nccl = kbuild.build_nccl(
            trees["nccl"].path, trees["nccl"].tree, recipe, tc, opts.fetch.cache.root, jobs=opts.jobs
        )
    timings["nccl_build_s"] = round(time.monotonic() - t, 2)
    prov["nccl_from"] = {"kind": choice.kind, "why": choice.why}
    t = time.monotonic()
    deepep = kbuild.build_deepep(
        trees["deepep"].path,
        trees["deepep"].tree,
        load_recipe(opts.root, "deepep"),
        tc,
        nccl,
        opts.fetch.cache.root,
        jobs=opts.jobs,
    )
    timings["deepep_build_s"] = round(time.monotonic() - t, 2)
    prov["kernels"] = {
        b.component: {
            "key": b.key,
            "reused": b.reused,
            "build_seconds": b.info.get("seconds"),
            **({"libstdcxx": b.info["libstdcxx"]} if "libstdcxx" in b.info else {}),
        }
        for b in (nccl, deepep)
    }
    prov["toolchain"] = tc.key_fields()
    return tc, nccl, deepep


@dataclass
class Kernels:
    """What a GPU gate runs its kernels with: `env` (the one-NCCL environment), the pinned NCCL's folder and version,
    DeepEP's JIT cache, the build logs (none when prebuilt) and `accept_sha256` (a prebuilt image's copy of the
    pinned libnccl, see kernels.runtime.check_one_nccl)."""

    env: dict
    nccl_lib: Path
    nccl_version: str
    jit_dir: Path
    logs: list = field(default_factory=list)
    accept_sha256: str | None = None
    site: Path | None = None  # deep_ep built here (None: the image's); its JIT kernels can be compiled ahead
    arch: str | None = None


def nccl_words(lock, trees: dict) -> tuple[str, str]:
    """(`, nccl <tree12>`, "") for an NCCL tree among the verified sources; ("", `; NCCL is the wheel F of pin W, not
    fetched here (it is fetched and sha256-checked only when kernels are built)`) for a stack whose NCCL is a wheel
    alone: a SKIP never counts it among what was verified."""
    if "nccl" in trees:
        return f", nccl {trees['nccl'].tree[:12]}", ""
    w = ncclwheel.wheel_alone(lock, "nccl")
    files = ", ".join(f.filename for f in lock.get(w).files)
    return (
        "",
        f"; NCCL is the wheel {files} of pin {w}, not fetched here (fetched and sha256-checked only when kernels are built)",
    )


def source_trees(opts: GateRunOptions, names) -> tuple[dict, object]:
    """(trees by pin, Prebuilt or None): with `opts.prebuilt`, the image's trees after its manifest matched the lock
    (kernels.prebuilt.check; PrebuiltError otherwise); else fetched, patched and verified here (sources.prepare).
    A stack whose `nccl` is a wheel (kernels.ncclwheel: NCCL from that wheel alone) has no nccl tree: dropped from the
    trees; a prebuilt image's manifest is still checked for it (its `nccl` must be that wheel)."""
    asked = tuple(names)
    names = tuple(n for n in names if n != "nccl" or ncclwheel.needs_source(opts.lock, "nccl"))
    if opts.prebuilt is not None:
        pre = kprebuilt.check(opts.prebuilt, opts.lock, opts.root, asked, arch=opts.arch or toolchain.gpu_arch())
        return {n: pre.tree(opts.lock, n) for n in names}, pre
    return {n: sources.prepare(opts.lock, n, opts.fetch, opts.root) for n in names}, None


def setup_kernels(opts: GateRunOptions, trees: dict, prov: dict, timings: dict, pre=None) -> Kernels:
    """The kernels of a GPU gate: the image's (`pre`, a checked Prebuilt: provenance `kernels_from` says prebuilt)
    or built here (build_kernels). Raises BuildError / ReprostackError."""
    if pre is not None:
        prov["kernels"], prov["kernels_from"] = pre.kernels_provenance(), pre.provenance()
        lib = pre.path_of("nccl", "lib")
        return Kernels(
            runtime.prebuilt_env(),
            lib,
            pre.components["nccl"]["nccl_version"],
            Path(opts.fetch.cache.root) / "jit" / f"deepep-{trees['deepep'].tree[:16]}",
            accept_sha256=pre.file_sha256("nccl", lib / "libnccl.so.2"),
        )
    tc, nccl, deepep = build_kernels(opts, trees, prov, timings)
    return Kernels(
        runtime.runtime_env(deepep.out, cache_root=Path(opts.fetch.cache.root)),
        nccl.out / "build" / "lib",
        nccl.info["version"],
        deepep.out / "jit",
        [nccl.log, deepep.log],
        site=deepep.out / "site",
        arch=tc.arch,
    )


def jit_prewarm(manifest, kern: Kernels, env: dict, tree: str, timings: dict, jobs: int | None):
    """Compile the manifest's DeepEP JIT kernels before the test (kernels.jit), when deep_ep was built here.
    Returns (context or None, the report's `jit` block)."""
    block: dict = {"manifest": str(manifest.path) if manifest else None}
    if kern.site is None:
        block["prewarm"] = "none: the image's deep_ep"
        return None, block
    ctx, why = jit.Context.of(kern.site, env, kern.arch)
    if ctx is None:
        block["prewarm"] = f"none: {why}"
        return None, block
    if manifest is None:
        block["prewarm"] = "none: no manifest for this profile (kernels/jit/<profile>.json)"
    elif manifest.deepep_tree != tree or manifest.arch != ctx.arch:
        block["prewarm"] = (
            f"none: the manifest was recorded for deepep tree {manifest.deepep_tree[:12]} sm_{manifest.arch}, "
            f"this run is tree {tree[:12]} sm_{ctx.arch} (record it again from this run's micro/jit-kernels.json)"
        )
    else:
        with ui.step(f"JIT prewarm {len(manifest.kernels)} DeepEP kernel(s)", key="jit prewarm"):
            block["prewarm"] = jit.prewarm(ctx, manifest.kernels, env, jobs=jobs)
        timings["jit_prewarm_s"] = block["prewarm"]["seconds"]
    block["before_test"] = len(jit.present(ctx))
    return ctx, block


def jit_record(ctx, block: dict, run_dir: Path, tree: str, profile: str) -> Path | None:
    """After the test: how many kernels DeepEP compiled itself, and this run's manifest (`micro/jit-kernels.json`,
    the kernels it used, to record as kernels/jit/<profile>.json)."""
    if ctx is None:
        return None
    block["compiled_in_test"] = len(jit.present(ctx)) - block.get("before_test", 0)
    manifest, counts = jit.record(ctx, deepep_tree=tree, profile=profile, source=str(run_dir))
    block["recorded"] = counts
    out = run_dir / "jit-kernels.json"
    write_text_atomic(out, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return out


def choose_profile(spec: GateSpec, name: str | None, host: dict) -> Profile:
    """The named profile, else the one matching this host: EFA and 8 GPUs -> the EP16 contract;
    otherwise a single-node profile whose GPU count equals the host's (no EFA, N GPUs over NVLink ->
    h200-nvl-epN, one GPU -> h200-ep1). A profile with `gpu-model` matches only when every GPU name the
    host lists contains it (a host that lists no names is not filtered). Raises NoProfileForHost if none (the
    callers report a SKIP with its message); GateError for an unknown named profile."""
    if name:
        return spec.profile(name)
    gpus, efa = host.get("gpu_count", 0), bool(host.get("efa_devices"))
    names = [g.get("name", "") for g in host.get("gpus", [])]
    for p in spec.profiles.values():
        if p.gpu_model and names and not all(p.gpu_model in n for n in names):
            continue
        if p.needs_efa == efa and p.gpus_per_node == gpus and (p.nodes > 1) == efa:
            return p
    raise NoProfileForHost(
        f"{spec.path}: no profile for this host ({gpus} GPU(s), EFA: {efa}); "
        f"pass --profile (known: {', '.join(spec.profiles)})"
    )


def provenance(lock: Lock, spec: GateSpec, trees: dict) -> dict:
    ups = {}
    for name, st in trees.items():
        pin = st.pin
        ups[name] = {
            "url": pin.url,
            "rev": pin.rev,
            "tree": pin.tree,
            "patched_tree": pin.patched_tree,
            "series": [f"{p.kind} {p.value} ({p.upstream_status})" for p in pin.patches],
        }
    if "deepep" in trees and "nccl" not in trees and not ncclwheel.needs_source(lock, "nccl"):  # NCCL: a wheel alone
        w = lock.get("nccl")
        ups["nccl"] = {
            "wheel": ncclwheel.wheel_alone(lock, "nccl"),
            "version": w.version,
            "files": [f"{f.filename} {f.sha256}" for f in w.files],
        }
    return {"lock_sha256": lock.sha256, "stack": lock.stack, "gate_spec_sha256": spec.sha256, "upstreams": ups}


def run_micro(opts: MicroOptions) -> GateReport:
    """Run gate 1 and return its report (not yet written; see report.write_reports).

    Raises ReprostackError only for operator errors found before anything ran (bad lock/spec,
    fetch or patch failure); everything after that ends in a report (pass / fail / error / skip).
    """
    t0, started = time.monotonic(), utc_now()
    timings: dict[str, float] = {}
    if not isinstance(opts.trials, int) or opts.trials < 1:
        raise ReprostackError(f"--trials {opts.trials}: give a whole number >= 1")
    spec = load_spec(opts.root, GATE).with_stack(opts.lock.stack, opts.lock.env)  # the lock stack's env (lockstacks)
    if opts.profile:  # a typo'd profile or an impossible run is an error, also on a host that will skip
        armsmod.check_request(spec, spec.profile(opts.profile), opts.arms, opts.legacy)
    host = hostinfo.collect()

    t = time.monotonic()
    trees, pre = source_trees(opts, ("nccl", "deepep"))
    timings["sources_s"] = round(time.monotonic() - t, 2)
    prov = provenance(opts.lock, spec, trees)
    prov["host"] = host
    data: dict = {"timings_s": timings, "sources_reused": {n: s.reused for n, s in trees.items()}}

    def finish(report: GateReport) -> GateReport:
        timings["total_s"] = round(time.monotonic() - t0, 2)
        report.data = {**data, **report.data}
        report.started, report.ended = started, utc_now()
        report.duration_s = timings["total_s"]
        return report

    if host["gpu_count"] == 0:
        why = (
            "no GPU on this host (nvidia-smi lists none): "
            + ("the image's kernels manifest matched the lock " if pre else "sources were verified and patched ")
            + "(deepep {}{}){}; kernels and test_ep not run".format(
                trees["deepep"].tree[:12], *nccl_words(opts.lock, trees)
            )
        )
        return finish(skipped(GATE, opts.profile or "-", why, provenance=prov))
    try:
        profile = choose_profile(spec, opts.profile, host)
    except NoProfileForHost as e:
        return finish(skipped(GATE, "-", str(e), provenance=prov))
    armsmod.check_request(spec, profile, opts.arms, opts.legacy)
    if profile.gpus_per_node > host["gpu_count"]:
        return finish(
            skipped(
                GATE,
                profile.name,
                f"profile {profile.name} needs {profile.gpus_per_node} GPU(s) "
                f"per node, this host has {host['gpu_count']}",
                provenance=prov,
            )
        )
    if profile.needs_efa and not host["efa_devices"]:
        return finish(
            skipped(GATE, profile.name, f"profile {profile.name} needs EFA devices; none found", provenance=prov)
        )

    manifest = jit.manifest_for(opts.root, profile.name)  # a bad one: one line, exit 2, before anything is built
    run_dir = Path(opts.out_dir) / GATE
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        kern = setup_kernels(opts, trees, prov, timings, pre)
        env = dict(kern.env)
        env.update(spec.env)
        env.update(profile.env)
        env["EP_JIT_CACHE_DIR"] = str(kern.jit_dir)
    except ReprostackError as e:
        rep = GateReport(GATE, profile.name, "error", f"setup: {e}", provenance=prov)
        return finish(rep)
    jit_ctx, data["jit"] = jit_prewarm(manifest, kern, env, trees["deepep"].tree, timings, opts.jobs)

    args = [*spec.args, *profile.args, *opts.extra_args]
    if opts.modes == "all":
        args = [a for a in args if a != "--test-first-only"]
    test_ep = str(trees["deepep"].path / spec.script)
    script = str(Path(opts.root) / TRIALS_DRIVER)
    dense_args = list(spec.dense.args) if "dense" in opts.arms and spec.dense else []
    args = ["--test-ep", test_ep, "--trials", str(opts.trials), "--arms", ",".join(opts.arms), *dense_args, *args]
    nodes = opts.nodes or profile.nodes
    launch = test_ep_launch(
        profile,
        opts.python,
        script,
        args,
        nodes=nodes,
        node_rank=opts.node_rank,
        master_addr=opts.master_addr,
        master_port=opts.master_port,
    )
    base_env = dict(env)  # the legacy run gets the gate's environment without test_ep's launcher variables
    env.update(launch.env)
    # one log per node; with a shared --out, node 0 parses all of them (each node prints its own ranks)
    log = run_dir / (f"test_ep.node{opts.node_rank}.log" if nodes > 1 else "test_ep.log")
    data["command"] = launch.argv
    data["env"] = {k: env[k] for k in sorted({*spec.env, *profile.env, *launch.env, *runtime.RUNTIME_KEYS}) if k in env}
    # its output: the live line (-v: every line); the ETA is per profile and number of trials; `trial k/K` from
    # rank 0's DeepEP trial markers (a plain line each; the bar when live)
    with ui.step(f"test_ep [{profile.name}] x{opts.trials} trial(s)", log=log, total=opts.trials, unit="trial") as st:
        outcome = run_with_watchdog(
            launch.argv,
            env=env,
            cwd=str(trees["deepep"].path),
            timeout_s=opts.timeout_s or spec.timeout_s,
            log_path=log,
            echo=False,
            on_line=ui.line_counter(st, deepep_trial_started),
        )
    timings["test_s"] = round(outcome.duration_s, 2)
    jit_manifest = jit_record(jit_ctx, data["jit"], run_dir, trees["deepep"].tree, profile.name)
    logs = sorted(run_dir.glob("test_ep.node*.log")) if nodes > 1 else [log]
    text = "\n".join(p.read_text(errors="replace") for p in logs)
    tp = parse_micro_trials(text, num_ranks=profile.ep_size, trials=opts.trials, arms=opts.arms, modes=opts.modes)
    parsed = tp.deepep[0]
    data["test_ep"] = parsed.to_dict()  # the first trial's full table; every trial's figures in data.trials
    data["trials"] = {
        **tp.to_dict(),
        "driver": TRIALS_DRIVER,
        "how": f"one launch, test_ep's case run {opts.trials} time(s)"
        + (", the dense arm after each DeepEP trial (ABAB)" if tp.dense else ""),
    }
    data["returncode"] = outcome.returncode
    data["timed_out"] = outcome.timed_out
    artifacts = [artifact_for(p, relative_to=opts.out_dir) for p in logs]
    if jit_manifest is not None:
        artifacts.append(artifact_for(jit_manifest, relative_to=opts.out_dir))
    for b in kern.logs:
        if b.exists():
            artifacts.append(artifact_for(b))

    values = metrics.deepep_metrics(parsed, profile.scale_up_limit_gbs)
    extra = []
    if tp.dense:
        dense0 = tp.dense[0]
        data["dense"] = {"parse": dense0.to_dict(), "trials_ok": tp.dense_ok}
        if not tp.dense_ok:
            data["dense"]["failure"] = classify_failure(text, outcome.returncode, outcome.timed_out).to_dict()
        values.update(metrics.dense_metrics(dense0, parsed.dc_p50_us))
        bad = [f"trial {k}: {p}" for k, d in enumerate(tp.dense) for p in d.problems]
        extra.append(
            armsmod.ArmRun(
                "dense",
                data["dense"],
                {},
                evaluate(
                    "dense_arm_complete",
                    "",
                    tp.dense_ok,
                    "==",
                    True,
                    note="; ".join(bad[:4])
                    or f"{profile.ep_size} rank(s) x {len(dense0.phases)} phases x {opts.trials} trial(s), checks ok",
                ),
            )
        )
    extra += _run_arms(opts, spec, profile, trees, base_env, run_dir, nodes)
    for a in extra:
        data[a.name] = a.data
        values.update(a.values)
        artifacts += a.artifacts
    try:
        summaries = tp.summaries()
    except ValueError:  # a non-finite figure: no statistics, the completeness check already fails
        summaries = {}
    for k, st in summaries.items():  # the trials' mean stands for the metric; its spread is in data.statistics
        values[k] = round(st.mean, 6)
    data["statistics"] = statistics_block(summaries)
    rows = metrics.rows(values, profile.scale_up_limit_source)
    for r in rows:
        if r["metric"] in summaries:
            r["note"] = f"mean of {opts.trials} trial(s): {summaries[r['metric']].describe()}" + (
                f"; {r['note']}" if r["note"] else ""
            )
    data["metrics"] = rows
    data["bars_status"] = profile.bars_status

    if not tp.complete:
        fc = classify_test_ep_failure(
            _failed_part(text, tp), outcome.returncode, outcome.timed_out, num_ranks=profile.ep_size, modes=opts.modes
        )
        data["failure"] = fc.to_dict()
        why = f"{fc.kind}: {fc.detail} ({fc.first_line})"
        if all(p.complete for p in tp.deepep):  # every table complete: what is wrong is in the driver's markers
            why = "trials driver's markers: " + "; ".join(tp.problems[:3])
        result, reason = decide([], ran_ok=False, failure_reason=why)
        return finish(GateReport(GATE, profile.name, result, reason, provenance=prov, artifacts=artifacts))

    try:  # the one-NCCL check, judged on what the measuring ranks saw (no separate process: issue 17)
        one = one_nccl_of_ranks(
            tp.nccl, kern, num_ranks=profile.ep_size, all_local=nodes == 1, misplaced=tp.nccl_misplaced
        )
    except ReprostackError as e:
        return finish(
            GateReport(GATE, profile.name, "error", f"one-NCCL check: {e}", provenance=prov, artifacts=artifacts)
        )
    host["nccl_runtime"] = one["runtime"]
    data["torch_built_with_nccl"] = (
        one.get("torch_built_with") if isinstance(one.get("torch_built_with"), str) else None
    )
    data["nccl_mapped"] = one["mapped"]
    data["nccl_check"] = f"in the measuring process of rank(s) {one['ranks']} after the trials (/proc/self/maps)"
    problems = tp.problems + [f"trial {k}: {p}" for k, t in enumerate(tp.deepep) for p in t.problems]
    checks = [
        evaluate("ranks_x_phases_missing", "lines", len(problems), "==", 0, note="; ".join(problems[:8]) or None),
        evaluate(
            "nccl_runtime",
            "version",
            one["runtime"],
            "==",
            kern.nccl_version,
            note=f"ncclGetVersion of the only NCCL mapped: {one['mapped'][0]}",
        ),
    ]
    for bar in profile.bars:
        if bar.metric in summaries and bar.op != "==":
            checks.append(evaluate_interval(bar.metric, summaries[bar.metric], bar.op, bar.threshold, note=bar.source))
        else:
            checks.append(
                evaluate(bar.metric, bar.unit, values.get(bar.metric), bar.op, bar.threshold, note=bar.source)
            )
    checks += [a.check for a in extra]
    if outcome.returncode != 0:
        data["after_finish"] = (
            f"exit {outcome.returncode} after every phase line was printed "
            f"(teardown; not counted, see test_ep.teardown_lines)"
        )
    result, reason = verdict(profile, checks)
    return finish(GateReport(GATE, profile.name, result, reason, checks=checks, provenance=prov, artifacts=artifacts))


def test_ep_launch(
    profile: Profile,
    python: str,
    script: str,
    args: list[str],
    *,
    nodes: int,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
) -> torchrun.Launch:
    """How gate 1 starts its trials driver on node `node_rank` (the run and its launch plan, gates.plan, both use
    this): several nodes -> torchrun, one agent per node (the operator's rendezvous, ReprostackError without it);
    one node with a `torchrun` profile -> the same agent on 127.0.0.1; else the driver started directly."""
    if nodes > 1:
        torchrun.need_master(profile.name, nodes, master_addr, master_port)
        return torchrun.torchrun(
            python,
            script,
            args,
            gpus=profile.gpus_per_node,
            nodes=nodes,
            node_rank=node_rank,
            master_addr=master_addr,
            master_port=master_port,
        )
    if profile.launcher == "torchrun":  # one agent on this node; test_ep spawns the GPUs' ranks
        return torchrun.torchrun(
            python,
            script,
            args,
            gpus=profile.gpus_per_node,
            nodes=1,
            node_rank=0,
            master_addr=master_addr or "127.0.0.1",
            master_port=master_port or torchrun.free_port(),
        )
    return torchrun.local(python, script, args, gpus=profile.gpus_per_node, port=master_port)


def one_nccl_of_ranks(
    records: list[dict],
    kern: Kernels,
    host: str | None = None,
    *,
    num_ranks: int | None = None,
    all_local: bool = False,
    misplaced: list[tuple[int, object, object]] = (),
) -> dict:
    """The one-NCCL check (kernels.runtime.judge_one_nccl) of every rank record of THIS host (`host`, default this
    machine's name; the other nodes' gates judge theirs): each must map exactly the pinned NCCL, and they must agree
    on its version. Returns the first record plus `ranks`. Raises BuildError naming the rank and what it mapped,
    or that no rank of this host left a record (a driver from before the records, or a log cut short).

    The records come from a log (a line of test_ep's output can mimic the tag): each must name a rank of the run
    (0..num_ranks-1, an int), once; with `all_local` (one node) every rank must have one; a record out of its place
    (`misplaced`: parsers.micro_trials) is refused; the runtime must be a version string."""
    import socket
    from collections import Counter

    from ..errors import BuildError

    host = host or socket.gethostname()
    mine = [r for r in records if r.get("host") == host]

    def shown(rank: object) -> str:
        return str(rank) if type(rank) is int else repr(rank)[:40]

    for no, rank, h in misplaced:
        if h == host:
            raise BuildError(
                f"rank {shown(rank)}: a one-NCCL record out of its place at line {no} of the test's log "
                f"(the driver prints it after the rank's last trial, before its done)"
            )
    if not mine:
        raise BuildError(
            f"no rank on this host ({host}) left its one-NCCL record in the test's log "
            f"({len(records)} record(s) from other hosts)"
        )
    for r in mine:
        rank = r.get("rank")
        if type(rank) is not int or (num_ranks is not None and not 0 <= rank < num_ranks):
            raise BuildError(
                f"rank {shown(rank)}: a one-NCCL record for no rank of this run (ranks 0..{(num_ranks or 0) - 1})"
            )
    count = Counter(r["rank"] for r in mine)
    twice = sorted(k for k, n in count.items() if n > 1)
    if twice:
        raise BuildError(f"rank {twice[0]}: {count[twice[0]]} one-NCCL records in the test's log (one expected)")
    if all_local and num_ranks is not None and len(count) != num_ranks:
        lost = sorted(set(range(num_ranks)) - set(count))
        raise BuildError(f"rank {lost[0]}: no one-NCCL record in the test's log (ranks with one: {sorted(count)})")
    for r in mine:
        if "error" in r:
            raise BuildError(f"rank {r['rank']}: reading its NCCL failed: {str(r['error'])[:300]}")
        try:
            runtime.judge_one_nccl(r, kern.nccl_lib, accept_sha256=kern.accept_sha256)
        except BuildError as e:
            raise BuildError(f"rank {r['rank']}: {e}") from None
        if not isinstance(r.get("runtime"), str) or len(r["runtime"]) > 40:
            raise BuildError(f"rank {r['rank']}: ncclGetVersion gave no version string: {str(r.get('runtime'))[:60]}")
    versions = {r["rank"]: r["runtime"] for r in mine}
    if len(set(versions.values())) != 1:
        raise BuildError(f"the ranks on this host loaded different NCCL versions: {versions}")
    first = mine[0]
    return {**first, "ranks": sorted(versions)}


def _failed_part(text: str, tp) -> str:
    """The log from the driver's marker of the first incomplete DeepEP trial on (the whole log when every trial
    is complete or no marker is found): earlier trials' complete tables would make the crash look like
    teardown noise to classify_failure."""
    bad = next((k for k, p in enumerate(tp.deepep) if not p.complete), None)
    if bad is None:
        return text
    at = next(
        (
            no
            for no, m in markers(text)
            if m.get("event") == "trial" and m.get("arm") == "deepep" and m.get("trial") == bad
        ),
        None,
    )
    return text if at is None else "\n".join(text.split("\n")[at - 1 :])


def verdict(profile: Profile, checks: list) -> tuple[str, str]:
    """(result, reason) of a run that completed. A profile whose bars are not measured never passes: a
    failing `bars_status` check is added to `checks` (in place) and the result is "fail" with the reason
    "profile X has no measured bar yet; numbers reported" (plus any other failed check)."""
    if profile.measured:
        return decide(checks, ran_ok=True)
    others = [c for c in checks if not c.passed]
    why = f"profile {profile.name} has no measured bar yet; numbers reported"
    checks.append(
        evaluate(
            "bars_status", "", profile.bars_status, "==", "measured", note=f"{why} (gates/micro.yaml: bars-status)"
        )
    )
    _, more = decide(others, ran_ok=True) if others else (None, "")
    return "fail", why + (f"; also: {more}" if more else "")


def _run_arms(
    opts: MicroOptions, spec: GateSpec, profile: Profile, trees: dict, env: dict, run_dir: Path, nodes: int
) -> list:
    """The asked-for separate run (the legacy test; the dense arm runs inside the trials launch); [] when none
    was asked for. Its watchdog: its yaml `timeout-s` (else the gate's), capped by the operator's --timeout."""
    out = []

    def limit(arm) -> float:
        own = arm.timeout_s or spec.timeout_s
        return min(own, opts.timeout_s) if opts.timeout_s else own

    if opts.legacy:
        out.append(
            armsmod.run_legacy(
                spec.legacy,
                deepep_tree=trees["deepep"].path,
                python=opts.python,
                env=env,
                profile=profile,
                port=opts.master_port,
                run_dir=run_dir,
                out_dir=opts.out_dir,
                timeout_s=limit(spec.legacy),
            )
        )
    return out
