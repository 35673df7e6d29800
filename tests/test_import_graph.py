"""The installed dfpo package imports without a cycle, counting the imports inside functions too.

A cycle through an import deferred into a function still ties two modules together: neither can be read, tested or
moved without the other, and the order in which they first load decides whether the deferred import succeeds. The
graph is built from source with ``ast`` (nothing is imported but the packages themselves, to find where they are
installed): every ``import dfpo...`` and ``from ... import ...`` naming a dfpo module, at module level or inside a
function, relative imports resolved. ``from package import name`` is an edge to ``package.name`` where that is a
module, else to ``package``. Imports under ``if TYPE_CHECKING:`` are left out: they name types for annotations
and never run.
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE_ROOTS = tuple(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"])
"""The top packages of the distribution (``dfpo`` and the folders mapped under it: ``dfpo.core``, ``dfpo.trainer``, ...)."""


def installed_modules() -> dict[str, pathlib.Path]:
    """Every module of the installed dfpo package, by dotted name, with its source file.

    Each top package is located through the import system (where it is installed, not where this test lies);
    a sub-folder that is itself a top package (``dfpo/integrations`` is not one, so it stays) is walked once."""
    modules: dict[str, pathlib.Path] = {}
    for package in PACKAGE_ROOTS:
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, f"{package} is not installed"
        folder = pathlib.Path(next(iter(spec.submodule_search_locations)))
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules.setdefault(".".join((package, *parts)), path)
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(node: ast.AST):
    """Every Import/ImportFrom under ``node`` (function bodies included), minus those under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            yield from (n for part in child.orelse for n in _imports_of(part))
            continue
        yield from _imports_of(child)


def _imports_of(node: ast.AST):
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    yield from _imports(node)


def imported_modules(name: str, path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
    """The dfpo modules that module ``name`` (source at ``path``) imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in _imports(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            origin = ".".join([*base, *([node.module] if node.module else [])])
        else:
            origin = node.module or ""
        for alias in node.names:
            found.add(f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin)
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    modules = installed_modules()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the list of its modules, first repeated at the end; None when it has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_the_installed_package_has_no_import_cycle():
    """No chain of imports (module level or inside a function) leads from a dfpo module back to itself."""
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_graph_sees_imports_inside_functions_and_relative_ones(tmp_path):
    """The checker itself: a deferred relative import closing a loop is a cycle; a TYPE_CHECKING one is not."""
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import thing\n")
    (tmp_path / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\nimport dfpo.p.a\n")
    modules = {f"dfpo.p.{n}": tmp_path / f"{n}.py" for n in "abc"}
    graph = {name: imported_modules(name, path, modules) for name, path in modules.items()}
    assert graph == {"dfpo.p.a": {"dfpo.p.b"}, "dfpo.p.b": {"dfpo.p.a"}, "dfpo.p.c": {"dfpo.p.a"}}
    assert find_cycle(graph) == ["dfpo.p.a", "dfpo.p.b", "dfpo.p.a"]
    assert find_cycle({"x": {"y"}, "y": set()}) is None


def test_the_graph_covers_the_whole_installed_package():
    """Every top package is walked and the modules this issue moved are seen (a walk that found nothing would pass)."""
    graph = import_graph()
    assert {"dfpo.cli", "dfpo.core.probe", "dfpo.trainer.run.code", "dfpo.trainer.run.folder"} <= set(graph)
    assert "dfpo.trainer.run.code" in graph["dfpo.trainer.run.folder"]


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module a chain of imports leads to from ``start`` (``start`` itself left out unless a cycle returns)."""
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        if (node := todo.pop()) not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return seen


def test_the_run_folder_code_does_not_depend_on_the_training_stages():
    """trainer/run (the run folder, its logs and checkpoints) is what the stages write into, never the reverse: no
    chain of imports leads from a dfpo.trainer.run module to dfpo.trainer.stages (the file names both use, such as
    tax_reference.pt, are spelt in run.layout)."""
    graph = import_graph()
    reached = {
        (module, target)
        for module in graph
        if module.startswith("dfpo.trainer.run.")
        for target in reachable(graph, module)
        if target.startswith("dfpo.trainer.stages")
    }
    assert not reached, sorted(reached)
