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

from .cmd import (
    all_gates,
    attest,
    bench,
    docs,
    build,
    bump,
    bundle,
    fetch,
    gate,
    history,
    kernels,
    keys,
    launch,
    lock,
    log,
    outdated,
    patch,
    preflight,
    stacks,
    verify,
    verify_report,
    verify_run,
)
from .errors import FetchError, ReprostackError, SourceUnreachable
from .gitcmd import GitFailed
from .lock import stacks as lockstacks

# The commands, in the order `reprostack -h` lists them: name -> module of reprostack.cmd (HELP, DESCRIPTION where
# it has one, add_arguments(parser), run(args) -> int).
COMMANDS = {
    "stacks": stacks,
    "lock": lock,
    "fetch": fetch,
    "patch": patch,
    "bundle": bundle,
    "bump": bump,
    "outdated": outdated,
    "build": build,
    "kernels": kernels,
    "gate": gate,
    "all-gates": all_gates,
    "launch": launch,
    "preflight": preflight,
    "bench": bench,
    "verify": verify,
    "verify-report": verify_report,
    "verify-run": verify_run,
    "docs": docs,
    "history": history,
    "keys": keys,
    "attest": attest,
    "log": log,
}


class _Version(argparse.Action):
    """`--version`: the package version and the project commit of the code that runs (dirty or clean), then exit."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit(0)


def version_line() -> str:
    """`reprostack 0.1.0 (project commit 0123abcd..., clean|dirty: N file(s) changed)`, or why the commit is not
    known (not a git checkout: the stamp, else the reason reprostack.project gives)."""
    from importlib.metadata import PackageNotFoundError, version

    from . import paths, project

    try:
        ver = version("reprostack")
    except PackageNotFoundError:
        ver = "(not installed)"
    st = project.state(paths.project_root(Path(__file__).resolve().parent))
    if not st.get("commit"):
        return f"reprostack {ver} (project commit unknown: {st.get('why', 'no reason given')})"
    dirty = st.get("dirty")
    tree = (
        "dirty: unknown"
        if dirty is None
        else (f"dirty: {st.get('changed_count', '?')} file(s) changed" if dirty else "clean")
    )
    return f"reprostack {ver} (project commit {st['commit']}, {tree})"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="reprostack", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--version",
        action=_Version,
        help="print the version and the project commit of this code (and whether its tree is dirty)",
    )
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
    for name, mod in COMMANDS.items():
        mod.add_arguments(sub.add_parser(name, help=mod.HELP, description=getattr(mod, "DESCRIPTION", None)))
    for sp in sub.choices.values():  # -v also after the subcommand (`nox -s gate_micro -- -v`)
        sp.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help="details (as before it)")
    return ap


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
    before = os.environ.get(lockstacks.ENV)
    if args.stack is not None:  # for this command and what it starts (nox sessions, gate launches); restored after
        os.environ[lockstacks.ENV] = args.stack
    try:
        return _main(args)
    finally:
        if before is None:
            os.environ.pop(lockstacks.ENV, None)
        else:
            os.environ[lockstacks.ENV] = before


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _shown(e) -> str:
    """An error's text fit for a terminal: an untrusted value quoted into it (a forged preflight verdict, a path)
    can hold escape sequences or a carriage return that would rewrite what the operator sees; every control
    character but newline and tab is shown escaped (\\x1b)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(e))


def _main(args) -> int:
    try:
        return COMMANDS[args.cmd].run(args)
    except FetchError as e:
        hint = f"\n{_NO_NETWORK_HINT}" if isinstance(e, SourceUnreachable) else ""
        print(f"reprostack: error: {_shown(e)}{hint}", file=sys.stderr)
        return 2
    except ReprostackError as e:
        print(f"reprostack: error: {_shown(e)}", file=sys.stderr)
        return 2
    except GitFailed as e:  # git refused what it was given (a corrupt cache, a bad ref): its own words, one line
        print(f"reprostack: error: {' '.join(str(e).split())[:600]}", file=sys.stderr)
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


if __name__ == "__main__":
    sys.exit(main())
