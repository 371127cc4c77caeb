"""Small typed pieces over hubs (issue 38 item 5): no function over 80 lines and no module over 600 lines in
src/reprostack. A piece that grows past either is split by responsibility, never by cutting it in two; the limits
are the developers' guide's, counted as the source has them (a function from its `def` line, decorators aside, to
its last line, docstring included; a module by its lines)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "reprostack"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_no_module_over_600_lines():
    big = {str(p.relative_to(SRC)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split by responsibility): {big}"


def test_no_function_over_80_lines():
    big = {}
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    big[f"{p.relative_to(SRC)}:{node.lineno} {node.name}"] = n
    assert not big, f"functions over {MAX_FUNCTION_LINES} lines (split by responsibility): {big}"


def test_the_check_sees_a_long_function():
    """The measure itself: a 81-line function is caught, an 80-line one is not."""
    body = "\n".join(f"    x{i} = {i}" for i in range(79))
    for lines, caught in ((80, False), (81, True)):
        src = f"def f():\n{body}\n" + ("    return 0\n" if lines == 81 else "")
        node = ast.parse(src).body[0]
        assert (node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES) is caught
