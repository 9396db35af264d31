"""No import cycles inside ``rlforge/``.

The graph is built from source with :mod:`ast`, not by importing: every ``import`` and
``from ... import`` statement anywhere in a module (module level, inside functions and
classes, inside ``try``) that names an ``rlforge`` module is an edge. Imports under
``if TYPE_CHECKING:`` are left out, since they never run. A function-level import that
exists only to break a cycle is still a cycle, so it counts.

Resolution rules:

- relative imports are resolved against the importing module's package;
- ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``
  (its ``__init__``, which re-exports ``name``);
- an edge to a package is an edge to its ``__init__``; the implicit import of parent
  packages (``import a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``) is not counted,
  because a package's own submodules always run under a partly initialised parent.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "rlforge"


def module_name(path: Path, root: Path = ROOT) -> tuple[str, bool]:
    """Dotted name of a file under ``root`` and whether it is a package ``__init__``."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree`` except those under ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _resolve_base(node: ast.ImportFrom, name: str, is_pkg: bool) -> str:
    """The absolute module named by ``from <base> import ...`` in module ``name``."""
    if node.level == 0:
        return node.module or ""
    package = name.split(".") if is_pkg else name.split(".")[:-1]
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def _target(dotted: str, modules: set[str]) -> str | None:
    """The longest known module prefix of ``dotted`` (a name inside a module maps to it)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def build_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> set of rlforge modules it imports (self-edges dropped)."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    modules = {name for name, _ in files}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for (name, is_pkg), path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _import_nodes(tree):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [_target(alias.name, modules) for alias in node.names]
            else:
                base = _resolve_base(node, name, is_pkg)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else _target(base, modules))
            graph[name].update(t for t in targets if t is not None and t != name)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    def strongconnect(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return sorted(components)


def _one_cycle(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest closed path through the component's first module, for the message."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return component


def test_graph_sees_relative_and_function_level_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "rlforge"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .b import f\n")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from rlforge import c\n"
        "def g():\n    from rlforge.sub import b\n"
    )
    (pkg / "sub" / "b.py").write_text("from .. import a\nimport rlforge.c as c\n")
    (pkg / "c.py").write_text("from rlforge.sub import f\n")
    graph = build_graph(pkg)
    assert graph["rlforge.a"] == {"rlforge.sub.b"}
    assert graph["rlforge.sub.b"] == {"rlforge.a", "rlforge.c"}
    assert graph["rlforge.c"] == {"rlforge.sub"}
    assert graph["rlforge.sub"] == {"rlforge.sub.b"}
    assert find_cycles(graph) == [["rlforge.a", "rlforge.c", "rlforge.sub", "rlforge.sub.b"]]
    assert _one_cycle(find_cycles(graph)[0], graph) == ["rlforge.a", "rlforge.sub.b", "rlforge.a"]


def test_no_import_cycles() -> None:
    graph = build_graph()
    cycles = find_cycles(graph)
    message = "\n".join(" -> ".join(_one_cycle(c, graph)) + f"   (component: {', '.join(c)})" for c in cycles)
    assert not cycles, f"import cycles inside rlforge/:\n{message}"
