"""The import layers of src/reprostack (reprostack.layers), read from the source with `ast` by scripts/import_graph.py:
no import cycle between modules, no import from a lower layer to a higher one, no module taking another module's
`_private` names, every module in exactly one layer, and docs/architecture.md's `## Layers` section as the table
renders it. The reader itself is tested on a small package written here (function-level, relative and absolute
imports, a package's `__init__` run by a submodule import, a cycle three modules long)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from reprostack.layers import LAYERS, Layer

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("import_graph", REPO / "scripts" / "import_graph.py")
ig = importlib.util.module_from_spec(_spec)
sys.modules["import_graph"] = ig
_spec.loader.exec_module(ig)

# Imports that still go from a lower layer to a higher one (none since the gates rework, issue 24). The test fails
# when an entry no longer occurs: delete its line then, so this set only shrinks.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()

# (importer, module, name) of a `_private` name taken from another module, left to the gates rework; only shrinks.
KNOWN_PRIVATE: set[tuple[str, str, str]] = set()


@pytest.fixture(scope="module")
def graph():
    return ig.graph()


def test_there_is_no_import_cycle(graph):
    cycles = ig.cycles(graph)
    assert not cycles, "import cycle(s): " + "; ".join(" -> ".join(c) for c in cycles)


def test_every_module_is_in_exactly_one_layer(graph):
    assert [m for m in sorted(graph) if ig.layer_of(m, LAYERS) < 0] == []
    prefixes = [p for layer in LAYERS for p in layer.modules]
    assert len(prefixes) == len(set(prefixes)), "a prefix is named by two layers"
    assert len({layer.name for layer in LAYERS}) == len(LAYERS)
    for layer in LAYERS:
        for p in layer.modules:  # a prefix that names nothing is a stale line of the table
            full = ig.TOP if p == "__init__" else f"{ig.TOP}.{p}"
            assert any(m == full or m.startswith(full + ".") for m in graph), f"{layer.name}: {p} names no module"


def test_no_import_goes_from_a_lower_layer_to_a_higher_one(graph):
    breaks = set(ig.layer_breaks(graph, LAYERS))
    new = sorted(breaks - KNOWN_VIOLATIONS)
    assert not new, "imports from a lower layer to a higher one:\n" + "\n".join(
        f"  {a} ({LAYERS[ig.layer_of(a, LAYERS)].name}) line {graph[a][b]} -> {b} "
        f"({LAYERS[ig.layer_of(b, LAYERS)].name})"
        for a, b in new
    )


def test_known_violations_only_shrink(graph):
    gone = sorted(KNOWN_VIOLATIONS - set(ig.layer_breaks(graph, LAYERS)))
    assert not gone, f"no longer a layer break, delete it from KNOWN_VIOLATIONS: {gone}"


def test_no_module_takes_another_modules_private_names():
    found = {(a, b, n) for a, b, n, _ in ig.private_imports()}
    assert not sorted(found - KNOWN_PRIVATE), (
        f"private names taken from another module: {sorted(found - KNOWN_PRIVATE)}"
    )
    assert not sorted(KNOWN_PRIVATE - found), (
        f"no longer taken, delete from KNOWN_PRIVATE: {sorted(KNOWN_PRIVATE - found)}"
    )


def test_docs_architecture_layers_section_is_the_table():
    text = (REPO / "docs" / "architecture.md").read_text()
    want = ig.docs_section(LAYERS)
    assert want in text, (
        "docs/architecture.md: ## Layers differs from layers.py; run python3 scripts/import_graph.py --docs"
    )


# --------------------------------------------------------------------------- the reader, on a package written here


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    src = tmp_path / "src"
    for rel, text in {"__init__.py": "", **files}.items():
        f = src / ig.TOP / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return src


def test_reader_sees_function_level_relative_and_absolute_imports(tmp_path):
    src = _package(
        tmp_path,
        {
            "base.py": "import os\n",
            "pkg/__init__.py": "from .inner import thing\n",
            "pkg/inner.py": "from .. import base\nthing = 1\n",
            "pkg/other.py": "def f():\n    from ..top import g\n    return g\n",
            "top.py": "import reprostack.base\nfrom reprostack.pkg.inner import thing\n\ndef g():\n    pass\n",
            "side.py": "from . import base as b, top\nfrom .pkg import inner\n",
        },
    )
    g = ig.graph(src)
    assert g["reprostack.base"] == {}
    assert set(g["reprostack.pkg.other"]) == {"reprostack.top"}  # inside a function; its own package not re-run
    assert set(g["reprostack.pkg.inner"]) == {"reprostack.base"}
    # importing reprostack.pkg.inner from outside runs reprostack.pkg's __init__ first: an edge to it too
    assert set(g["reprostack.top"]) == {"reprostack.base", "reprostack.pkg.inner", "reprostack.pkg"}
    assert set(g["reprostack.side"]) == {"reprostack.base", "reprostack.top", "reprostack.pkg.inner", "reprostack.pkg"}
    assert g["reprostack.pkg.other"]["reprostack.top"] == 2  # the line of the import
    assert ig.cycles(g) == []


def test_reader_reports_a_cycle_and_a_layer_break(tmp_path):
    src = _package(
        tmp_path,
        {
            "a.py": "from . import b\n",
            "b.py": "def f():\n    from .c import x\n",
            "c.py": "import reprostack.a\nx = 1\n",
            "low.py": "def f():\n    from .high import y\n",
            "high.py": "y = 1\n",
        },
    )
    g = ig.graph(src)
    assert ig.cycles(g) == [["reprostack.a", "reprostack.b", "reprostack.c", "reprostack.a"]]
    layers = (Layer("low", ("__init__", "low", "a", "b", "c"), ""), Layer("high", ("high",), ""))
    assert ig.layer_breaks(g, layers) == [("reprostack.low", "reprostack.high")]
    assert ig.layer_of("reprostack", layers) == 0 and ig.layer_of("reprostack.nothing", layers) == -1


def test_reader_finds_private_names_taken_from_another_module(tmp_path):
    src = _package(
        tmp_path,
        {
            "errors.py": "def _msg(e):\n    return str(e)\n\ndef msg(e):\n    return _msg(e)\n",
            "user.py": "from .errors import _msg, msg as _alias\n",
            "attr.py": "from . import errors\n\ndef f():\n    return errors._msg\n",
            "fine.py": "from .errors import msg\n__all__ = ['msg']\n",
        },
    )
    assert ig.private_imports(src) == [
        ("reprostack.attr", "reprostack.errors", "_msg", 4),
        ("reprostack.user", "reprostack.errors", "_msg", 1),
    ]
