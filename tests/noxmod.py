"""The project's noxfile.py as a module, for the tests of its helpers (xdist_args, gate_lines, _gate, find_links).

Loaded once per process: its sessions register with nox when it is imported, and a second import registers them
again, which nox answers with one FutureWarning per session (`The session 'tests' has already been registered`; 21
of them in the suite before). Every test that needs the noxfile takes this one module.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

NOXFILE = Path(__file__).resolve().parents[1] / "noxfile.py"
NAME = "reprostack_noxfile"


def load():
    """noxfile.py, imported once (sys.modules[NAME])."""
    mod = sys.modules.get(NAME)
    if mod is None:
        spec = importlib.util.spec_from_file_location(NAME, NOXFILE)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[NAME] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[NAME]
            raise
    return mod


def sessions() -> set[str]:
    """The names of the sessions noxfile.py defines."""
    import nox.registry

    load()
    return set(nox.registry.get())
