"""docs/reliability.md names a test for every row: each name it cites (`test_x.py::test_y`, or a bare `test_y`) is a
test function of this repository's tests, in the file it names (issue 27 item 3: the page cited a test that did not
exist, for behaviour the code had since reversed)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "reliability.md"


def _defined() -> dict[str, set[str]]:
    out = {}
    for p in (REPO / "tests").rglob("*.py"):
        tree = ast.parse(p.read_text())
        out[p.name] = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return out


def cited(text: str) -> tuple[list[tuple[str, str]], set[str]]:
    """(every `file::test` the page cites, every bare test name it cites); `test_ep` (DeepEP's own test) is no test
    of ours and `test_x.py` alone names a file."""
    pairs = re.findall(r"(?:tests/)?(test_[A-Za-z0-9_]+\.py)::(test_[A-Za-z0-9_]+)", text)
    rest = re.sub(r"(?:tests/)?test_[A-Za-z0-9_]+\.py(::test_[A-Za-z0-9_]+)?", "", text)
    bare = set(re.findall(r"(?<![A-Za-z0-9_/.])(test_[A-Za-z0-9_]+)(?![A-Za-z0-9_.])", rest)) - {"test_ep"}
    return pairs, bare


def test_every_test_the_reliability_page_names_exists():
    defined = _defined()
    everywhere = set().union(*defined.values())
    pairs, bare = cited(PAGE.read_text())
    assert len(pairs) > 200  # the page cites its tests by file::name
    missing = sorted({f"{f}::{t}" for f, t in pairs if t not in defined.get(f, set())})
    missing += sorted(t for t in bare if t not in everywhere)
    assert missing == [], "docs/reliability.md names tests that do not exist"


def test_a_cited_name_that_is_not_a_test_is_found():
    """The check itself: a renamed test, a file that does not hold it, a bare name, each found."""
    defined = _defined()
    pairs, bare = cited(
        "| x | y | test_stacks.py::test_no_such_thing, test_layers.py::test_every_module_is_in_exactly_one_layer |\n"
        "| x | y | test_nor_this_one (and test_ep, DeepEP's) |"
    )
    assert [t for f, t in pairs if t not in defined.get(f, set())] == ["test_no_such_thing"]
    assert bare == {"test_nor_this_one"}
