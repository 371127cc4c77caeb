"""Named stacks of `upstreams.lock`: shared pins once, per-stack overrides of pins, patch series and env.

```yaml
stacks:
  campaign:                       # the default stack (DEFAULT): the shared `upstreams:` as they are
    description: ...
  gin-gdaki:
    description: ...
    extends: campaign             # optional: start from another stack's pins and env (default: the shared pins)
    env: {NCCL_GIN_TYPE: "5"}     # the stack's env, over its parent's (gates put it over the gate spec's env)
    env-why: {LD_LIBRARY_PATH: ...}  # a loader variable (LD_*) in env needs the reason it is there
    overrides:                    # pins of `upstreams:` this stack pins differently
      aws-ofi-nccl: {original: v1.21.1, rev: <40 hex>, tree: <40 hex>, fetch-refs: [refs/tags/v1.21.1]}
      nccl: {wheel: nccl-wheel-2-32}   # this stack's `nccl` IS that shared wheel pin: no git source for it
```

Invariants:
- an override names a pin of `upstreams:` (or of a stack it extends); it never adds one;
- an override is merged over the pin it replaces: its keys replace the pin's. One that moves a git pin's `rev`
  starts a new pin of the same upstream: only `kind`, `url` and `policy` carry over, so a stale tree, submodule
  or patch series of the shared pin can never pass for the new rev's. One with `kind:` is a whole pin;
- the merged pin is validated exactly like a pin of `upstreams:` (same schema, same checks by lock.load), and a
  problem names the override's own line and field (`stacks.S.overrides.P.rev`);
- `extends` names another stack, never one of its own descendants (a cycle is an error at the `extends` line);
- no `stacks:` section, or no `campaign` entry in it: the default stack still exists, with the shared pins;
- an unknown stack name is an error naming the known ones;
- a stack's env never sets a loader variable (LOADER: `LD_PRELOAD`, `LD_LIBRARY_PATH`, any `LD_*`, which decide what
  every process of a gate loads, its NCCL first) unless the same stack's `env-why` gives the reason; an `env-why`
  entry names a variable that stack's env sets.
The selected stack: `--stack NAME` (cli), which sets $REPROSTACK_STACK for this process and its children
(nox sessions, in-gate launches), else DEFAULT.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import LockError
from ..yamlsrc import dotted, line_of

DEFAULT = "campaign"
ENV = "REPROSTACK_STACK"
LOADER_PREFIX = "LD_"  # the dynamic loader's variables (ld.so(8)): LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...
_GIT_REV_CARRIES = ("kind", "url", "policy")  # what a git override that moves `rev` keeps of the shared pin


@dataclass(frozen=True)
class Stack:
    """One stack: its own description/extends, and the effective env and overridden pins (its chain's, root first)."""

    name: str
    description: str
    extends: str | None = None
    env: dict = field(default_factory=dict)
    env_why: dict = field(default_factory=dict)  # loader variable -> why the lock sets it (the chain's, merged)
    overrides: tuple[str, ...] = ()  # names of the pins that differ from the shared `upstreams:`
    line: int | None = None  # line of `stacks.<name>` (None: the implicit default)
    wheel_of: dict = field(default_factory=dict)  # pin -> the shared wheel pin an override `{wheel: W}` made it


def selected() -> str:
    """The stack this process runs: $REPROSTACK_STACK (set by `--stack`), else DEFAULT."""
    return os.environ.get(ENV) or DEFAULT


def merge(base: dict, override: dict) -> dict:
    """The pin `override` makes of `base` (see the module doc: a moved git rev keeps only kind/url/policy)."""
    if "kind" in override:
        return dict(override)
    if base.get("kind") == "git" and "rev" in override and override["rev"] != base.get("rev"):
        out = {k: base[k] for k in _GIT_REV_CARRIES if k in base}
    else:
        out = dict(base)
    out.update(override)
    return out


def chain(data: dict, lines: dict, path: str, name: str) -> list[str]:
    """Stack names from the root of `name`'s `extends` chain down to `name`. LockError on an unknown parent
    or a cycle (at the `extends` line that closes it)."""
    stacks = data.get("stacks") or {}
    out: list[str] = []
    cur: str | None = name
    while cur is not None:
        if cur in out:
            at = ("stacks", out[-1], "extends")
            raise LockError(
                path,
                line_of(lines, at),
                dotted(at),
                f"cycle: {' -> '.join([*out, cur])} (a stack cannot extend itself)",
            )
        out.append(cur)
        parent = (stacks.get(cur) or {}).get("extends")
        if parent is not None and parent not in stacks and parent != DEFAULT:
            at = ("stacks", cur, "extends")
            raise LockError(
                path, line_of(lines, at), dotted(at), f"no such stack {parent!r} (known: {', '.join(names(data))})"
            )
        cur = parent
    return list(reversed(out))


def names(data: dict) -> list[str]:
    """Every stack of the document: DEFAULT first, then the others as written."""
    return [DEFAULT, *(n for n in (data.get("stacks") or {}) if n != DEFAULT)]


def effective(data: dict, lines: dict, path: str, name: str) -> tuple[dict, dict, Stack]:
    """(upstreams, lines, Stack) of stack `name`: the shared pins with the chain's overrides merged in, a line map
    whose `("upstreams", P, ...)` entries of an overridden pin point into the override (so every later error names
    the override's line), and the Stack. Raises LockError for an unknown stack, an unknown parent, a cycle or an
    override of a pin that does not exist."""
    stacks = data.get("stacks") or {}
    if name != DEFAULT and name not in stacks:
        at: tuple = ("stacks",)
        raise LockError(
            path,
            line_of(lines, at) if stacks else None,
            "--stack",
            f"no such stack {name!r} (known: {', '.join(names(data))})",
        )
    ups = dict(data["upstreams"])
    eff_lines = dict(lines)
    env: dict = {}
    overridden: list[str] = []
    wheel_of: dict = {}
    env_why: dict = {}
    for s in chain(data, lines, path, name):
        entry = stacks.get(s) or {}
        _check_loader_env(path, lines, s, entry)
        env.update(entry.get("env") or {})
        env_why.update(entry.get("env-why") or {})
        for pin, ov in (entry.get("overrides") or {}).items():
            at = ("stacks", s, "overrides", pin)
            if pin not in ups:
                raise LockError(
                    path,
                    line_of(lines, at),
                    dotted(at),
                    f"overrides pin {pin!r}, which upstreams: does not have (known: {', '.join(sorted(ups))})",
                )
            wheel_of.pop(pin, None)
            if isinstance(ov, dict) and "wheel" in ov:  # the shared wheel pin, whole (has `kind:`: merge copies it)
                ov = _wheel_override(path, lines, at, ov, ups)
                wheel_of[pin] = ov.pop("_from")
            ups[pin] = merge(ups[pin], ov)
            for k in [k for k in eff_lines if k[:2] == ("upstreams", pin)]:
                del eff_lines[k]  # inherited keys fall back to the override's own line
            for k, ln in lines.items():
                if k[:4] == at:
                    key = ("upstreams", pin, *k[4:])  # a name first: mypy reads `d[(a, *b)]` as 3.11's `d[a, *b]`
                    eff_lines[key] = ln
            if pin not in overridden:
                overridden.append(pin)
    entry = stacks.get(name) or {}
    desc = entry.get("description") or "the shared pins of upstreams: (the published campaign)"
    st = Stack(
        name=name,
        description=desc,
        extends=entry.get("extends"),
        env=env,
        env_why={k: v for k, v in env_why.items() if k in env},
        overrides=tuple(overridden),
        line=line_of(lines, ("stacks", name)) if name in stacks else None,
        wheel_of=wheel_of,
    )
    return ups, eff_lines, st


def is_loader_var(name: str) -> bool:
    """A variable the dynamic loader reads (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...)."""
    return name.upper().startswith(LOADER_PREFIX)


def _check_loader_env(path: str, lines: dict, name: str, entry: dict) -> None:
    """LockError at `stacks.NAME.env.VAR` for a loader variable without `env-why.VAR`, and at `stacks.NAME.env-why.VAR`
    for a reason about a variable that stack's env does not set."""
    env, why = entry.get("env") or {}, entry.get("env-why") or {}
    for k in env:
        if is_loader_var(k) and k not in why:
            at = ("stacks", name, "env", k)
            raise LockError(
                path,
                line_of(lines, at) or line_of(lines, at[:3]),
                dotted(at),
                f"{k} is a loader variable: it decides which libraries (which NCCL) every process of a gate loads; "
                f"a stack sets it only with its reason under `stacks.{name}.env-why.{k}`",
            )
    for k in why:
        if k not in env:
            at = ("stacks", name, "env-why", k)
            raise LockError(
                path, line_of(lines, at) or line_of(lines, at[:3]), dotted(at), f"stack {name}'s env does not set {k}"
            )


def _wheel_override(path: str, lines: dict, at: tuple, ov: dict, ups: dict) -> dict:
    """The whole pin an override `{wheel: W}` stands for: a copy of wheel pin W (plus `_from`: W). LockError at the
    override's line for another key next to `wheel:` or a W that is not a `kind: wheel` pin."""
    w = ov["wheel"]
    if len(ov) != 1:
        extra = ", ".join(sorted(k for k in ov if k != "wheel"))
        raise LockError(
            path, line_of(lines, at), dotted(at), f"an override with `wheel:` is that wheel pin, whole: drop {extra}"
        )
    target = ups.get(w) if isinstance(w, str) else None
    if not isinstance(target, dict) or target.get("kind") != "wheel":
        wheels = sorted(n for n, u in ups.items() if isinstance(u, dict) and u.get("kind") == "wheel")
        raise LockError(
            path,
            line_of(lines, (*at, "wheel")) or line_of(lines, at),
            dotted((*at, "wheel")),
            f"{w!r} is not a `kind: wheel` pin of upstreams: (wheel pins: {', '.join(wheels) or 'none'})",
        )
    return {**target, "_from": w}


def relocate(e: LockError, path: str, stack: str, pins: tuple[str, ...]) -> LockError:
    """A LockError about `upstreams.P...` of an overridden pin, renamed to the override's field."""
    for pin in pins:
        head = f"upstreams.{pin}"
        if e.field == head or e.field.startswith(head + ".") or e.field.startswith(head + "["):
            msg = str(e).split(f"{e.field}: ", 1)[-1]
            return LockError(path, e.line, f"stacks.{stack}.overrides.{pin}" + e.field[len(head) :], msg)
    return e
