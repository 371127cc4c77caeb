"""The one profile rule: which profile of a gate spec a run, a plan or a launcher takes, and whether this host is the
hardware of a profile (gates.options.PROFILE_RULE says it for the operator).

- `resolve(spec, name, host)`: `name` when given (anywhere, no host check); else, for a run (`host` given), the
  profile this host fits (`fitting`); else, for a plan, a launcher or preflight, the published one (`published`);
- `fitting(spec, host)`: the first profile that needs a GPU, whose `gpu_model` (when it names one) every GPU of the
  host holds, whose GPU count per node and EFA are the host's, and that spans several nodes exactly when it needs
  EFA; none: NoProfileForHost, whose line is the gate's `no_fit` (data, Gate.no_fit);
- `hardware_gap(profile, host)`: why this host cannot run the profile at all (a SKIP); `hardware_mismatch(profile,
  host)`: why it is other hardware than the profile's (a run here is never evidence for it, RunState.finish);
- `check_nodes(gate, spec, profile, nodes)`: the node count of a run or a rendering, the profile's.

Invariants: one rule for every gate kind and every command (a kind differs only by its `no_fit` line, never by a
rule of its own); a profile that needs no GPU (the serving gates' local-test) is taken only by name; a named profile
is never checked against the host here (a run on other hardware is judged and marked not evidence); the functions
read the spec and the host inventory only, and change nothing.
"""

from __future__ import annotations

from ..errors import GateError
from .spec import HardwareProfile, NoProfileForHost, ProfileT, Spec, SpecOf

# NoProfileForHost's line (a SKIP's reason), str.format'ed with the spec's `path`, its file `name`, the host's `gpus`
# and `efa`, and the `known` profiles
NO_FIT = "{path}: no profile for this host ({gpus} GPU(s), EFA: {efa}); pass --profile (known: {known})"


def published(spec: Spec) -> str:
    """The name of the profile a plan shows when none is named: the first multi-node EFA profile (the campaign's
    2 x p5en), else the spec's first profile."""
    for name, p in spec.profiles.items():
        if p.needs_efa and p.nodes > 1:
            return name
    return next(iter(spec.profiles))


def _gpu_names(host: dict) -> list[str]:
    return [str(g.get("name", "")) for g in host.get("gpus") or [] if isinstance(g, dict)]


def fitting(spec: SpecOf[ProfileT], host: dict, no_fit: str = NO_FIT) -> ProfileT:
    """The profile this host fits (module doc). Raises NoProfileForHost (-> SKIP) with the `no_fit` line."""
    gpus, efa = host.get("gpu_count", 0), bool(host.get("efa_devices"))
    names = _gpu_names(host)
    for p in spec.profiles.values():
        if p.gpu_model and names and not all(p.gpu_model in n for n in names):
            continue
        if p.needs_gpu and p.needs_efa == efa and p.gpus_per_node == gpus and (p.nodes > 1) == efa:
            return p
    known = ", ".join(spec.profiles)
    raise NoProfileForHost(no_fit.format(path=spec.path, name=spec.path.name, gpus=gpus, efa=efa, known=known))


def resolve(
    spec: SpecOf[ProfileT], name: str | None = None, host: dict | None = None, no_fit: str = NO_FIT
) -> ProfileT:
    """The one profile rule (module doc). Raises GateError for an unknown `name`, NoProfileForHost when `host` fits
    none."""
    if name:
        return spec.profile(name)
    if host is not None:
        return fitting(spec, host, no_fit)
    return spec.profile(published(spec))


def hardware_gap(profile: HardwareProfile, host: dict) -> str | None:
    """Why this host cannot run `profile` (too few GPUs, no EFA devices), or None."""
    gpus = host.get("gpu_count", 0)
    if profile.needs_gpu and profile.gpus_per_node > gpus:
        return f"profile {profile.name} needs {profile.gpus_per_node} GPU(s) per node, this host has {gpus}"
    if profile.needs_efa and not host.get("efa_devices"):
        return f"profile {profile.name} needs EFA devices; none found"
    return None


def hardware_mismatch(profile: HardwareProfile, host: dict) -> str | None:
    """Why this host is other hardware than `profile`'s (its GPU model, GPU count per node, EFA), or None. A run here
    is never evidence for that profile (RunState.finish), however the profile was chosen."""
    names = _gpu_names(host)
    model = profile.gpu_model
    if model and names and not all(model in n for n in names):
        return f"this host's GPUs are {', '.join(sorted(set(names)))}, the profile's {model}"
    gpus, efa = int(host.get("gpu_count") or 0), bool(host.get("efa_devices"))
    if profile.needs_gpu and gpus and gpus != profile.gpus_per_node:
        return f"this host has {gpus} GPU(s), the profile {profile.gpus_per_node} per node"
    if efa != bool(profile.needs_efa):
        return "this host has EFA devices, the profile none" if efa else "the profile needs EFA, this host has none"
    return None


def check_nodes(gate: str, spec: Spec, profile: HardwareProfile, nodes: int | None) -> int:
    """The node count of a run or a rendering of gate `gate`: the profile's; another `nodes` is one GateError line."""
    if nodes is not None and nodes != profile.nodes:  # an absurd count too, before any work
        raise GateError(
            f"gate {gate}: --nodes {nodes}, but profile {profile.name} of {spec.path.name} runs on "
            f"{profile.nodes} node(s)"
        )
    return profile.nodes
