"""The import graph of src/reprostack, read with `ast` (nothing is imported): modules, edges, cycles, layer breaks.

`python3 scripts/import_graph.py` prints the counts, every cycle, every import from a lower layer to a higher one
(the layers: src/reprostack/layers.py) and every import of another module's `_private` name; `--edges` also prints
every edge, `--src DIR` reads another checkout's src/ (the layers stay this checkout's), `--docs` prints the
`## Layers` section of docs/architecture.md. tests/test_layers.py loads this file and fails on a cycle, a layer
break or a private import that is not in its KNOWN_VIOLATIONS / KNOWN_PRIVATE.

Invariants:
- Every `import` and `from ... import` counts, at module level and inside functions, relative or absolute; an
  import that only a type checker runs (`if TYPE_CHECKING:`) counts too.
- `from P import N` is an edge to the module P.N when that file exists, else to P; importing a.b.c also runs the
  package a.b's `__init__`, so it is an edge to each enclosing package that the importer is not itself inside.
- A module is named by its dotted path (`reprostack.lock.wheels`; a package by its `__init__`: `reprostack.lock`).
- A private name is one with a leading underscore and no trailing dunder (`_git_msg`, not `__version__`); taking
  one from another module of the package is `from M import _x` or `M._x` where M names a module of the package.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
TOP = "reprostack"


def modules(src: Path = SRC) -> dict[str, Path]:
    """{dotted name: file} of every module of the package under `src`."""
    out = {}
    for f in sorted((src / TOP).rglob("*.py")):
        parts = list(f.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def _is_package(name: str, mods: dict[str, Path]) -> bool:
    return name in mods and mods[name].name == "__init__.py"


def imports_of(name: str, mods: dict[str, Path]) -> dict[str, int]:
    """{imported module of the package: first line} of module `name` (other packages' imports are left out)."""
    tree = ast.parse(mods[name].read_text(), filename=str(mods[name]))
    here = name if _is_package(name, mods) else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        while target and target not in mods:  # `import reprostack.x.Name`-like: the longest module prefix
            target = target.rpartition(".")[0]
        if not target or target == name:
            return
        found.setdefault(target, line)
        parts = target.split(".")  # enclosing packages run their __init__ unless the importer is already inside
        for i in range(2, len(parts)):
            pkg = ".".join(parts[:i])
            if not (name == pkg or name.startswith(pkg + ".")):
                found.setdefault(pkg, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == TOP or a.name.startswith(TOP + "."):
                    add(a.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
                if not (mod == TOP or mod.startswith(TOP + ".")):
                    continue
            for a in node.names:
                sub = f"{mod}.{a.name}"
                add(sub if sub in mods else mod, node.lineno)
    return found


def graph(src: Path = SRC) -> dict[str, dict[str, int]]:
    """{module: {imported module: line}} for every module of the package."""
    mods = modules(src)
    return {m: imports_of(m, mods) for m in mods}


def cycles(g: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module: [a, b, ..., a], each an edge of g."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def strong(v: str) -> None:  # Tarjan; the package is small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            strong(v)
    return [_one_cycle(g, c) for c in sorted(comps)]


def _one_cycle(g: dict[str, dict[str, int]], comp: list[str]) -> list[str]:
    """The shortest cycle through the component's first module (breadth-first inside the component)."""
    inside, start = set(comp), comp[0]
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(g[v]):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, v, start]
                if w in inside and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")  # cannot happen: comp is strongly connected


def private_imports(src: Path = SRC) -> list[tuple[str, str, str, int]]:
    """(importer, module, private name, line) for every `from M import _x` and `M._x` of another module M."""
    mods = modules(src)
    out = []
    for name, f in mods.items():
        tree = ast.parse(f.read_text(), filename=str(f))
        here = name if _is_package(name, mods) else name.rpartition(".")[0]
        bound: dict[str, str] = {}  # local name -> the module of the package it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                if mod not in mods:
                    continue
                for a in node.names:
                    if f"{mod}.{a.name}" in mods:
                        bound[a.asname or a.name] = f"{mod}.{a.name}"
                    elif _private(a.name) and mod != name:
                        out.append((name, mod, a.name, node.lineno))
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in mods and a.asname:
                        bound[a.asname] = a.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name):
                mod = bound.get(node.value.id)
                if mod and mod != name:
                    out.append((name, mod, node.attr, node.lineno))
    return sorted(set(out))


def _private(n: str) -> bool:
    return n.startswith("_") and not n.endswith("__")


def layer_of(module: str, layers) -> int:
    """Index into `layers` of the layer holding `module`: the layer with the longest matching prefix."""
    best, best_len = -1, -1
    module = f"{TOP}.__init__" if module == TOP else module  # the package's own __init__
    for i, layer in enumerate(layers):
        for prefix in layer.modules:
            full = f"{TOP}.{prefix}"
            if (module == full or module.startswith(full + ".")) and len(full) > best_len:
                best, best_len = i, len(full)
    return best


def layer_breaks(g: dict[str, dict[str, int]], layers) -> list[tuple[str, str]]:
    """(importer, imported) for every import from a lower layer to a higher one."""
    return sorted((a, b) for a in g for b in g[a] if layer_of(a, layers) < layer_of(b, layers))


def docs_section(layers) -> str:
    """The `## Layers` section of docs/architecture.md, from the layers table (highest layer first, as drawn)."""
    lines = [
        "## Layers",
        "",
        "<!-- generated from src/reprostack/layers.py by `python3 scripts/import_graph.py --docs`; "
        "tests/test_layers.py checks it -->",
        "",
        "The package is cut into layers. A module imports from its own layer and the layers below it, never from "
        "one above, and no two modules import each other, directly or round a longer cycle. "
        "`tests/test_layers.py` reads every import of `src/reprostack` with `ast` (at module level and inside "
        "functions, relative and absolute) and fails on a cycle or an import upwards. The table is "
        "`src/reprostack/layers.py`, the one place the layers are written down; a module belongs to the layer "
        "of its longest matching prefix.",
        "",
        "| layer | modules (under `reprostack.`) | what it is |",
        "|---|---|---|",
    ]
    for layer in reversed(layers):
        lines.append(f"| {layer.name} | {', '.join(f'`{m}`' for m in layer.modules)} | {layer.what} |")
    lines += [
        "",
        "The edges that still go upwards are listed in `KNOWN_VIOLATIONS` of `tests/test_layers.py`, each with "
        "what removes it; the test also fails when one of them no longer occurs, so the list only shrinks. "
        "No module takes another module's `_private` names either (`KNOWN_PRIVATE`, the same rule). "
        "Print the graph: `python3 scripts/import_graph.py` (`--edges`: every edge).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(SRC))
    from reprostack.layers import LAYERS

    if "--docs" in argv:
        print(docs_section(LAYERS), end="")
        return 0
    src = Path(argv[argv.index("--src") + 1]) if "--src" in argv else SRC
    g = graph(src)
    cyc = cycles(g)
    breaks = layer_breaks(g, LAYERS)
    unplaced = sorted(m for m in g if layer_of(m, LAYERS) < 0)
    private = private_imports(src)
    if "--edges" in argv:
        for a in sorted(g):
            for b, line in sorted(g[a].items()):
                print(f"{a} -> {b}  (line {line})")
    print(
        f"modules: {len(g)}; edges: {sum(len(v) for v in g.values())}; cycles: {len(cyc)}; "
        f"layer breaks: {len(breaks)}; private imports: {len(private)}"
    )
    for c in cyc:
        print("cycle: " + " -> ".join(c))
    name = {i: layer.name for i, layer in enumerate(LAYERS)} | {-1: "no layer"}
    for a, b in breaks:
        print(f"layer break: {a} ({name[layer_of(a, LAYERS)]}) -> {b} ({name[layer_of(b, LAYERS)]})")
    for m in unplaced:
        print(f"in no layer: {m}")
    for a, b, n, line in private:
        print(f"private import: {a}:{line} takes {b}.{n}")
    return 1 if cyc or breaks or unplaced or private else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
