"""`reprostack stacks` (list the lock's stacks) and `reprostack stacks diff A B` (what differs between two).

A stack is the lock's shared pins with its overrides merged in (reprostack.lock.stacks). The diff compares the
effective pins of both stacks field by field: a git pin's rev, tree, original (the version it names), submodule
revs, patch series (entry by entry: kind, commit or file, Upstream-Status) and patched-tree; a wheel pin's version
and files; an image pin's digest; a wheelset's requirements, overrides and files; then the env. Only what differs
is listed; two stacks that pin the same are "identical". Output is plain text (or JSON with --json), one row per
difference, so a reviewer can paste it into a PR.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import lock as lockmod
from .lock import stacks as lockstacks


def _pin_fields(pin) -> dict:
    """The fields of a typed pin a diff compares (strings or lists of strings, absent as None)."""
    if isinstance(pin, lockmod.GitPin):
        return {
            "url": pin.url,
            "rev": pin.rev,
            "tree": pin.tree,
            "original": pin.original,
            "submodules": [f"{s.path}@{s.rev}" for s in pin.submodules] or None,
            "patches": [f"{p.kind} {p.value} ({p.upstream_status})" for p in pin.patches] or None,
            "patched-tree": pin.patched_tree,
        }
    if isinstance(pin, lockmod.WheelPin):
        return {
            "name": pin.name,
            "version": pin.version,
            "files": [f"{f.filename} {f.sha256}" for f in pin.files] or None,
        }
    if isinstance(pin, lockmod.WheelsetPin):
        return {
            "requirements": list(pin.requirements),
            "overrides": list(pin.overrides) or None,
            "files": [f"{f.name}=={f.version}" for f in pin.files] or None,
        }
    if isinstance(pin, lockmod.DebsPin):
        return {
            "archive": f"{pin.archive} {pin.suite}/{pin.component} {pin.architecture}",
            "include": list(pin.include) or None,
            "files": [f"{f.name}={f.version}" for f in pin.files] or None,
        }
    return {"ref": pin.ref, "id": pin.id}


def diff(a: lockmod.Lock, b: lockmod.Lock) -> list[dict]:
    """Rows {"what": "pin"|"env", "name", "field", "a", "b"} for every difference between two loads of one lock."""
    rows: list[dict] = []
    for name in sorted(set(a.upstreams) | set(b.upstreams)):
        pa, pb = a.upstreams.get(name), b.upstreams.get(name)
        fa = _pin_fields(pa) if pa is not None else {"kind": None}
        fb = _pin_fields(pb) if pb is not None else {"kind": None}
        if pa is not None and pb is not None and pa.kind != pb.kind:
            fa, fb = {"kind": pa.kind, **fa}, {"kind": pb.kind, **fb}
        for f in dict.fromkeys([*fa, *fb]):
            if fa.get(f) != fb.get(f):
                rows.append({"what": "pin", "name": name, "field": f, "a": fa.get(f), "b": fb.get(f)})
    ea, eb = a.env, b.env
    for k in sorted(set(ea) | set(eb)):
        if ea.get(k) != eb.get(k):
            rows.append({"what": "env", "name": k, "field": "value", "a": ea.get(k), "b": eb.get(k)})
    return rows


def _short(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, list):
        return "; ".join(v)
    return str(v)


def render_diff(a: str, b: str, rows: list[dict]) -> str:
    if not rows:
        return f"stacks {a} and {b} are identical (same pins, patches and env)\n"
    out = [f"stacks diff {a} {b}: {len(rows)} difference(s)"]
    for r in rows:
        label = f"{r['name']}.{r['field']}" if r["what"] == "pin" else f"env {r['name']}"
        if isinstance(r["a"], list) or isinstance(r["b"], list):  # a series or file list: entry by entry
            la, lb = r["a"] or [], r["b"] or []
            out.append(f"  {label}:")
            out += [f"    - {x}   ({a} only)" for x in la if x not in lb]
            out += [f"    + {x}   ({b} only)" for x in lb if x not in la]
            if [x for x in la if x in lb] != [x for x in lb if x in la]:
                out.append("    (the entries both have are in another order)")
        else:
            out.append(f"  {label}: {a}={_short(r['a'])}  {b}={_short(r['b'])}")
    return "\n".join(out) + "\n"


def listing(lk: lockmod.Lock) -> list[dict]:
    """One row per stack: name, description, extends, overrides {pin: what it pins}, env keys, default/selected."""
    rows = []
    shared = lk if lk.stack == lockstacks.DEFAULT else lockmod.load(lk.path, stack=lockstacks.DEFAULT)
    for name, st in lk.stacks.items():
        sl = lk if name == lk.stack else lockmod.load(lk.path, stack=name)
        ov = {}
        for p in st.overrides:
            pin = sl.upstreams[p]
            if p in st.wheel_of:  # an override `{wheel: W}`: the pin is that wheel, alone
                ov[p] = f"wheel {st.wheel_of[p]} ({pin.name} {pin.version})"
                continue
            ov[p] = (
                f"{pin.original or ''} {pin.rev[:12]}".strip()
                if isinstance(pin, lockmod.GitPin)
                else getattr(pin, "version", None) or pin.kind
            )
            was = getattr(shared.upstreams.get(p), "url", None)
            url = getattr(pin, "url", None)
            if url is not None and url != was:  # fetched from elsewhere than the shared pin: always shown
                ov[p] += f" from {url} (url overridden; shared: {was or '-'})"
        rows.append(
            {
                "name": name,
                "description": st.description,
                "extends": st.extends,
                "overrides": ov,
                "env": st.env,
                "env_why": st.env_why,
                "default": name == lockstacks.DEFAULT,
                "selected": name == lk.stack,
            }
        )
    return rows


def render_listing(rows: list[dict]) -> str:
    out = []
    for r in rows:
        tags = [t for t, on in (("default", r["default"]), ("selected", r["selected"])) if on]
        out.append(f"{r['name']}" + (f" ({', '.join(tags)})" if tags else "") + f": {r['description']}")
        if r["extends"]:
            out.append(f"  extends: {r['extends']}")
        out.append(
            "  overrides: " + (", ".join(f"{p} -> {v}" for p, v in r["overrides"].items()) or "none (the shared pins)")
        )
        if r["env"]:
            out.append("  env: " + " ".join(f"{k}={v}" for k, v in r["env"].items()))
        for k, why in (r.get("env_why") or {}).items():
            out.append(f"  {k} (a loader variable) because: {why}")
    return "\n".join(out) + "\n"


def run(lock_path: Path, action: list[str], as_json: bool, out=print) -> int:
    """`stacks` (list) or `stacks diff A B`. Raises ReprostackError (LockError) for a bad lock or stack name."""
    from .errors import ReprostackError

    if not action:
        rows = listing(lockmod.load(lock_path))
        out(
            json.dumps(rows, indent=2, sort_keys=True) if as_json else render_listing(rows),
            end="" if not as_json else "\n",
        )
        return 0
    if action[0] == "diff" and len(action) != 3:  # name the stacks it can compare
        known = ", ".join(lockmod.load(lock_path).stacks)  # every stack, the default first (lockstacks.names)
        raise ReprostackError(f"stacks {' '.join(action)}: name two stacks, `stacks diff A B` (stacks: {known})")
    if action[0] != "diff":
        raise ReprostackError(f"stacks {' '.join(action)}: expected `stacks` or `stacks diff A B`")
    a, b = action[1], action[2]
    la, lb = lockmod.load(lock_path, stack=a), lockmod.load(lock_path, stack=b)
    rows = diff(la, lb)
    out(
        json.dumps(rows, indent=2, sort_keys=True) if as_json else render_diff(a, b, rows),
        end="" if not as_json else "\n",
    )
    return 0


def plugin(args, lk: lockmod.Lock, root: Path, fetch) -> int:
    """`stacks plugin` / `stacks check-plugin LIBDIR` (kernels.ginplugin): prepare the chain's verified trees of
    the selected stack, render DIR/build-plugin.sh, run it (unless --render-only), check the exports."""
    import os
    import subprocess

    from . import sources
    from .errors import ReprostackError
    from .kernels import ginplugin

    if args.action[0] == "check-plugin":
        if len(args.action) != 2:
            raise ReprostackError("stacks check-plugin LIBDIR: name the folder that holds libnccl-net*.so")
        r = ginplugin.check_exports(Path(args.action[1]), args.symbol)
        print(f"{r['library']}: exports {' '.join(r['gin'] + r['net'])}")
        return 0
    if len(args.action) != 1:
        raise ReprostackError("stacks plugin: takes no arguments (the stack is --stack, before the subcommand)")
    work = Path(args.out).resolve()
    srcs = {}
    for n in ginplugin.CHAIN:
        st = sources.prepare(lk, n, fetch, root)
        srcs[n] = ginplugin.ChainSource(n, Path(st.path), lk.git(n).rev, st.tree)
    cuda = args.cuda
    if cuda is None:
        import shutil

        nvcc = shutil.which("nvcc")
        guess = Path(nvcc).resolve().parent.parent if nvcc else None
        cuda = str(guess) if guess and (guess / "include" / "cuda.h").is_file() else "/usr/local/cuda"
    text = ginplugin.render_script(
        srcs, work / "work", work / "prefix", cuda, args.jobs or os.cpu_count() or 1, autogen_only=args.autogen_only
    )
    work.mkdir(parents=True, exist_ok=True)
    from .atomicfile import write_text_atomic

    script = work / "build-plugin.sh"
    write_text_atomic(script, text)
    print(f"stack {lk.stack}: {script} ({', '.join(f'{n} {s.rev[:12]}' for n, s in srcs.items())})")
    if args.render_only:
        return 0
    from . import ui

    step = "autogen gin plugin chain" if args.autogen_only else "build gin plugin chain"
    with ui.step(f"{step} [{lk.stack}]", key=step) as st:  # each part's log: work/<part>.*.log
        rc = subprocess.run(["bash", str(script)]).returncode
        st.outcome = "ok" if rc == 0 else f"exit {rc}"
        if rc != 0:
            st.no_record()
    if rc != 0:
        raise ReprostackError(f"stack {lk.stack}: the GIN plugin chain failed (exit {rc}); logs in {work / 'work'}")
    if args.autogen_only:
        print(
            f"generated build systems: {work / 'work' / 'src'} (carry it; GINPLUGIN_PREGEN=<that folder> on the "
            f"host without autotools)"
        )
        return 0
    r = ginplugin.check_exports(work / "prefix" / "lib", args.symbol)
    print(f"{r['library']}: exports {' '.join(r['gin'] + r['net'])}")
    return 0
