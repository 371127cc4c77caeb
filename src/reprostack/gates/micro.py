"""Gate 1 (micro): lock -> sources -> kernels -> DeepEP test_ep.py -> parsed phases -> bars -> report.

The gate passes only on measured evidence: a complete phase table for every rank and every bar of
the profile met, with exactly one NCCL (the pinned one) in the process, on a profile whose bars were
measured (`bars-status: unmeasured` -> FAIL with every number reported). No GPU, or no profile that fits
the host -> SKIP with the reason (after sources were fetched, patched and verified, which needs no GPU). A crash or timeout ->
ERROR with the classified failure and the raw log. Optional runs (gates.arms): the dense comparison arm
(`arms` with "dense") and DeepEP's legacy intranode test (`legacy`); each asked-for run adds a
completeness check. Per-phase figures (gates.metrics) go to `data.metrics`, reported, not bars.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import hostinfo, sources
from ..errors import ReprostackError
from ..kernels import build as kbuild
from ..kernels import runtime, toolchain
from ..kernels.recipe import load_recipe
from ..lock import Lock
from ..report import GateReport, artifact_for, decide, evaluate, skipped, utc_now
from . import arms as armsmod
from . import launchers, metrics
from .parsers.failure import classify_failure
from .parsers.test_ep import parse_test_ep
from .spec import GateSpec, NoProfileForHost, Profile, load_spec
from .watchdog import run_with_watchdog

GATE = "micro"


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


@dataclass
class MicroOptions(GateRunOptions):
    """GateRunOptions plus test_ep's modes, the arms (deepep, dense) and the legacy second evidence."""

    modes: str = "first"
    arms: tuple[str, ...] = ("deepep",)
    legacy: bool = False


def build_kernels(opts: GateRunOptions, trees: dict, prov: dict, timings: dict):
    """Build (or reuse, keyed) NCCL and DeepEP from the patched `trees` with the interpreter `opts.python`;
    records `nccl_build_s` / `deepep_build_s` in `timings` and `kernels` / `toolchain` in `prov`.
    Returns (toolchain, nccl Built, deepep Built). Raises BuildError / ReprostackError."""
    tc = toolchain.detect(opts.python, arch=opts.arch)
    t = time.monotonic()
    nccl = kbuild.build_nccl(trees["nccl"].path, trees["nccl"].tree, load_recipe(opts.root, "nccl"), tc,
                             opts.fetch.cache.root, jobs=opts.jobs)
    timings["nccl_build_s"] = round(time.monotonic() - t, 2)
    t = time.monotonic()
    deepep = kbuild.build_deepep(trees["deepep"].path, trees["deepep"].tree, load_recipe(opts.root, "deepep"),
                                 tc, nccl, opts.fetch.cache.root, jobs=opts.jobs)
    timings["deepep_build_s"] = round(time.monotonic() - t, 2)
    prov["kernels"] = {b.component: {"key": b.key, "reused": b.reused, "build_seconds": b.info.get("seconds"),
                                     **({"libstdcxx": b.info["libstdcxx"]} if "libstdcxx" in b.info else {})}
                       for b in (nccl, deepep)}
    prov["toolchain"] = tc.key_fields()
    return tc, nccl, deepep


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
    raise NoProfileForHost(f"{spec.path}: no profile for this host ({gpus} GPU(s), EFA: {efa}); "
                          f"pass --profile (known: {', '.join(spec.profiles)})")


def provenance(lock: Lock, spec: GateSpec, trees: dict) -> dict:
    ups = {}
    for name, st in trees.items():
        pin = st.pin
        ups[name] = {"url": pin.url, "rev": pin.rev, "tree": pin.tree, "patched_tree": pin.patched_tree,
                     "series": [f"{p.kind} {p.value} ({p.upstream_status})" for p in pin.patches]}
    return {"lock_sha256": lock.sha256, "stack": lock.stack, "gate_spec_sha256": spec.sha256, "upstreams": ups}


def run_micro(opts: MicroOptions) -> GateReport:
    """Run gate 1 and return its report (not yet written; see report.write_reports).

    Raises ReprostackError only for operator errors found before anything ran (bad lock/spec,
    fetch or patch failure); everything after that ends in a report (pass / fail / error / skip).
    """
    t0, started = time.monotonic(), utc_now()
    timings: dict[str, float] = {}
    spec = load_spec(opts.root, GATE).with_stack(opts.lock.stack, opts.lock.env)  # the lock stack's env (lockstacks)
    if opts.profile:  # a typo'd profile or an impossible run is an error, also on a host that will skip
        armsmod.check_request(spec, spec.profile(opts.profile), opts.arms, opts.legacy)
    host = hostinfo.collect()

    t = time.monotonic()
    trees = {name: sources.prepare(opts.lock, name, opts.fetch, opts.root) for name in ("nccl", "deepep")}
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
        why = ("no GPU on this host (nvidia-smi lists none): sources were verified and patched "
               f"(deepep {trees['deepep'].tree[:12]}, nccl {trees['nccl'].tree[:12]}); kernels and test_ep not run")
        return finish(skipped(GATE, opts.profile or "-", why, provenance=prov))
    try:
        profile = choose_profile(spec, opts.profile, host)
    except NoProfileForHost as e:
        return finish(skipped(GATE, "-", str(e), provenance=prov))
    armsmod.check_request(spec, profile, opts.arms, opts.legacy)
    if profile.gpus_per_node > host["gpu_count"]:
        return finish(skipped(GATE, profile.name, f"profile {profile.name} needs {profile.gpus_per_node} GPU(s) "
                              f"per node, this host has {host['gpu_count']}", provenance=prov))
    if profile.needs_efa and not host["efa_devices"]:
        return finish(skipped(GATE, profile.name, f"profile {profile.name} needs EFA devices; none found",
                              provenance=prov))

    run_dir = Path(opts.out_dir) / GATE
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        tc, nccl, deepep = build_kernels(opts, trees, prov, timings)
        env = runtime.runtime_env(deepep.out)
        env.update(spec.env)
        env.update(profile.env)
        env["EP_JIT_CACHE_DIR"] = str(deepep.out / "jit")
        t = time.monotonic()
        one = runtime.check_one_nccl(opts.python, env, nccl.out / "build" / "lib")
        timings["nccl_check_s"] = round(time.monotonic() - t, 2)
        host["nccl_runtime"] = one["runtime"]
        data["torch_built_with_nccl"] = one["torch_built_with"]
        data["nccl_mapped"] = one["mapped"]
    except ReprostackError as e:
        rep = GateReport(GATE, profile.name, "error", f"setup: {e}", provenance=prov)
        return finish(rep)

    args = [*spec.args, *profile.args, *opts.extra_args]
    if opts.modes == "all":
        args = [a for a in args if a != "--test-first-only"]
    script = str(trees["deepep"].path / spec.script)
    nodes = opts.nodes or profile.nodes
    if nodes > 1:
        if not opts.master_addr or not opts.master_port:
            raise ReprostackError(f"profile {profile.name} spans {nodes} nodes: give --master-addr and --master-port "
                                  f"(and --node-rank on each node)")
        launch = launchers.torchrun(opts.python, script, args, gpus=profile.gpus_per_node, nodes=nodes,
                                    node_rank=opts.node_rank, master_addr=opts.master_addr, master_port=opts.master_port)
    elif profile.launcher == "torchrun":  # one agent on this node; test_ep spawns the GPUs' ranks
        launch = launchers.torchrun(opts.python, script, args, gpus=profile.gpus_per_node, nodes=1, node_rank=0,
                                    master_addr=opts.master_addr or "127.0.0.1",
                                    master_port=opts.master_port or launchers.free_port())
    else:
        launch = launchers.local(opts.python, script, args, gpus=profile.gpus_per_node, port=opts.master_port)
    base_env = dict(env)  # the arms get the gate's environment without test_ep's launcher variables
    env.update(launch.env)
    # one log per node; with a shared --out, node 0 parses all of them (each node prints its own ranks)
    log = run_dir / (f"test_ep.node{opts.node_rank}.log" if nodes > 1 else "test_ep.log")
    data["command"] = launch.argv
    data["env"] = {k: env[k] for k in sorted({*spec.env, *profile.env, *launch.env, "PYTHONPATH"}) if k in env}
    outcome = run_with_watchdog(launch.argv, env=env, cwd=str(trees["deepep"].path), timeout_s=opts.timeout_s or spec.timeout_s,
                                log_path=log)
    timings["test_s"] = round(outcome.duration_s, 2)
    logs = sorted(run_dir.glob("test_ep.node*.log")) if nodes > 1 else [log]
    text = "\n".join(p.read_text(errors="replace") for p in logs)
    parsed = parse_test_ep(text, num_ranks=profile.ep_size, modes=opts.modes)
    data["test_ep"] = parsed.to_dict()
    data["returncode"] = outcome.returncode
    data["timed_out"] = outcome.timed_out
    artifacts = [artifact_for(p, relative_to=opts.out_dir) for p in logs]
    for b in (nccl, deepep):
        if b.log.exists():
            artifacts.append(artifact_for(b.log))

    values = metrics.deepep_metrics(parsed, profile.scale_up_limit_gbs)
    extra = _run_arms(opts, spec, profile, trees, base_env, run_dir, nodes, parsed.dc_p50_us)
    for a in extra:
        data[a.name] = a.data
        values.update(a.values)
        artifacts += a.artifacts
    data["metrics"] = metrics.rows(values, profile.scale_up_limit_source)
    data["bars_status"] = profile.bars_status

    if not parsed.complete:
        fc = classify_failure(text, outcome.returncode, outcome.timed_out, num_ranks=profile.ep_size, modes=opts.modes)
        data["failure"] = fc.to_dict()
        result, reason = decide([], ran_ok=False, failure_reason=f"{fc.kind}: {fc.detail} ({fc.first_line})")
        return finish(GateReport(GATE, profile.name, result, reason, provenance=prov, artifacts=artifacts))

    checks = [evaluate("ranks_x_phases_missing", "lines", len(parsed.problems), "==", 0,
                       note="; ".join(parsed.problems) or None),
              evaluate("nccl_runtime", "version", one["runtime"], "==", nccl.info["version"],
                       note=f"ncclGetVersion of the only NCCL mapped: {one['mapped'][0]}")]
    for bar in profile.bars:
        checks.append(evaluate(bar.metric, bar.unit, values.get(bar.metric), bar.op, bar.threshold, note=bar.source))
    checks += [a.check for a in extra]
    if outcome.returncode != 0:
        data["after_finish"] = (f"exit {outcome.returncode} after every phase line was printed "
                                f"(teardown; not counted, see test_ep.teardown_lines)")
    result, reason = verdict(profile, checks)
    return finish(GateReport(GATE, profile.name, result, reason, checks=checks, provenance=prov, artifacts=artifacts))


def verdict(profile: Profile, checks: list) -> tuple[str, str]:
    """(result, reason) of a run that completed. A profile whose bars are not measured never passes: a
    failing `bars_status` check is added to `checks` (in place) and the result is "fail" with the reason
    "profile X has no measured bar yet; numbers reported" (plus any other failed check)."""
    if profile.measured:
        return decide(checks, ran_ok=True)
    others = [c for c in checks if not c.passed]
    why = f"profile {profile.name} has no measured bar yet; numbers reported"
    checks.append(evaluate("bars_status", "", profile.bars_status, "==", "measured",
                           note=f"{why} (gates/micro.yaml: bars-status)"))
    _, more = decide(others, ran_ok=True) if others else (None, "")
    return "fail", why + (f"; also: {more}" if more else "")


def _run_arms(opts: MicroOptions, spec: GateSpec, profile: Profile, trees: dict, env: dict, run_dir: Path,
              nodes: int, deepep_dc: float | None) -> list:
    """The asked-for extra runs (dense arm, legacy test), in that order; [] when none was asked for.
    Each one's watchdog: its yaml `timeout-s` (else the gate's), capped by the operator's --timeout."""
    out = []

    def limit(arm) -> float:
        own = arm.timeout_s or spec.timeout_s
        return min(own, opts.timeout_s) if opts.timeout_s else own

    if "dense" in opts.arms:
        out.append(armsmod.run_dense(spec.dense, root=opts.root, python=opts.python, env=env, profile=profile,
                                     nodes=nodes, node_rank=opts.node_rank, master_addr=opts.master_addr,
                                     master_port=opts.master_port, run_dir=run_dir, out_dir=opts.out_dir,
                                     timeout_s=limit(spec.dense), deepep_dc_p50_us=deepep_dc))
    if opts.legacy:
        out.append(armsmod.run_legacy(spec.legacy, deepep_tree=trees["deepep"].path, python=opts.python, env=env,
                                      profile=profile, port=opts.master_port, run_dir=run_dir,
                                      out_dir=opts.out_dir, timeout_s=limit(spec.legacy)))
    return out
