"""The package keeps the shape issue #40 set: small files of one concern, no import cycles,
no private name reached into from another module.

The allow-lists below are the debt still open on this branch: files and functions other
branches are splitting now. Each entry is checked to still be needed, so an entry that a
split paid off must be deleted here (the lists only shrink).
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parent.parent

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80

# Files (repo-relative) still over MAX_FILE_LINES.
LONG_FILES_ALLOWED: frozenset[str] = frozenset()

# Functions ("path::qualified.name") still over MAX_FUNCTION_LINES.
LONG_FUNCTIONS_ALLOWED: frozenset[str] = frozenset()

# Imports ("importer -> imported", most of them inside functions) that close an import
# cycle today; the graph without them must be acyclic.
CYCLE_EDGES_ALLOWED: frozenset[str] = frozenset()

# Private names imported across a module boundary ("importer -> module.name").
PRIVATE_IMPORTS_ALLOWED: frozenset[str] = frozenset()


@attrs.frozen
class Module:
    """One source file of the package: its dotted name, path and syntax tree."""

    name: str
    path: str
    tree: ast.Module
    lines: int

    @property
    def package(self) -> str:
        """The package a relative import in this module starts from."""
        if self.path.endswith("__init__.py"):
            return self.name
        return self.name.rpartition(".")[0]


def _dotted(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "middleware":  # shipped as tinyctx.middleware (see pyproject)
        parts = ["tinyctx", *parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Module]:
    found: dict[str, Module] = {}
    for folder in ("tinyctx", "middleware"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            name = _dotted(path)
            found[name] = Module(
                name=name,
                path=path.relative_to(ROOT).as_posix(),
                tree=ast.parse(text, filename=str(path)),
                lines=len(text.splitlines()),
            )
    return found


MODULES = _modules()
EXTENSIONS = frozenset(_dotted(path) for path in (ROOT / "tinyctx").rglob("*.c"))


def _functions(
    body: list[ast.stmt], prefix: str = ""
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node.body, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node.body, f"{prefix}{node.name}.")
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in (getattr(node, "body", []), getattr(node, "orelse", [])):
                yield from _functions(block, prefix)


def _span(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return (node.end_lineno or node.lineno) - first + 1


def long_files() -> set[str]:
    return {m.path for m in MODULES.values() if m.lines > MAX_FILE_LINES}


def long_functions() -> set[str]:
    return {
        f"{module.path}::{name}"
        for module in MODULES.values()
        for name, node in _functions(module.tree.body)
        if _span(node) > MAX_FUNCTION_LINES
    }


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of import nodes under ``if TYPE_CHECKING:`` (never run, so never a cycle)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return skipped


def _imports(module: Module) -> Iterator[tuple[str, str | None]]:
    """``(module imported, name taken from it or None)`` for every import the module runs,
    at top level or inside a function."""
    skipped = _type_checking_only(module.tree)
    for node in ast.walk(module.tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                yield base, alias.name


def import_edges() -> set[tuple[str, str]]:
    edges: set[tuple[str, str]] = set()
    for module in MODULES.values():
        for target, name in _imports(module):
            submodule = f"{target}.{name}" if name else None
            if submodule in EXTENSIONS:
                continue  # a C extension imports nothing of the package
            if submodule in MODULES:
                edges.add((module.name, submodule))
            elif target in MODULES:
                edges.add((module.name, target))
    return {(a, b) for a, b in edges if a != b}


def cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        graph.setdefault(a, []).append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, []):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports() -> set[str]:
    """``importer -> module.name`` for each private name taken from another module, except
    a private module's names taken by a module of the same package."""
    found: set[str] = set()
    for module in MODULES.values():
        for target, name in _imports(module):
            if name is None or not _is_private(name) or target not in MODULES:
                continue
            submodule = f"{target}.{name}"
            # a private module itself (`from . import _x`, a C extension too) or a name of one
            source = submodule if submodule in MODULES or submodule in EXTENSIONS else target
            package, _, leaf = source.rpartition(".")
            if _is_private(leaf) and package == module.package:
                continue
            found.add(f"{module.name} -> {target}.{name}")
    return found


class TestFileLength:
    """No source file of the package is longer than 600 lines, but the listed debt."""

    def test_no_file_over_the_limit(self) -> None:
        assert long_files() - LONG_FILES_ALLOWED == set()

    def test_every_allowed_long_file_is_still_long(self) -> None:
        assert LONG_FILES_ALLOWED - long_files() == set(), "delete the paid-off entries"


class TestFunctionLength:
    """No function of the package is longer than 80 lines, but the listed debt."""

    def test_no_function_over_the_limit(self) -> None:
        assert long_functions() - LONG_FUNCTIONS_ALLOWED == set()

    def test_every_allowed_long_function_is_still_long(self) -> None:
        assert LONG_FUNCTIONS_ALLOWED - long_functions() == set(), "delete the paid-off entries"


class TestImportCycles:
    """No import cycle among the package's modules, counting imports inside functions."""

    def test_the_graph_is_acyclic(self) -> None:
        allowed = {tuple(edge.split(" -> ")) for edge in CYCLE_EDGES_ALLOWED}
        assert cycles(import_edges() - allowed) == []

    def test_every_allowed_edge_still_exists(self) -> None:
        edges = {f"{a} -> {b}" for a, b in import_edges()}
        assert CYCLE_EDGES_ALLOWED - edges == set(), "delete the paid-off entries"

    def test_the_check_sees_a_cycle_through_a_function(self) -> None:
        tree = ast.parse("def f():\n    from tinyctx.b import x\n")
        module = Module(name="tinyctx.a", path="tinyctx/a.py", tree=tree, lines=2)
        assert list(_imports(module)) == [("tinyctx.b", "x")]
        assert cycles({("tinyctx.a", "tinyctx.b"), ("tinyctx.b", "tinyctx.a")}) == [
            ["tinyctx.a", "tinyctx.b"]
        ]


class TestPrivateImports:
    """A private name crosses a module boundary only from a private sibling module."""

    def test_no_private_name_is_imported_across_modules(self) -> None:
        assert private_imports() - PRIVATE_IMPORTS_ALLOWED == set()

    def test_every_allowed_private_import_still_exists(self) -> None:
        assert PRIVATE_IMPORTS_ALLOWED - private_imports() == set(), "delete the paid-off entries"


SPLIT_MODULES = (
    "tinyctx.codec",
    "tinyctx.tokens",
    "tinyctx.middleware.budget",
    "tinyctx.middleware.session_memory",
    "tinyctx.middleware.summarize",
)


class TestPublicPaths:
    """A class a split module re-exports reports that module, as before the split."""

    def test_exported_classes_name_their_public_module(self) -> None:
        wrong = {}
        for name in SPLIT_MODULES:
            module = importlib.import_module(name)
            for export in module.__all__:
                value = getattr(module, export)
                if isinstance(value, type) and value.__module__ != name:
                    wrong[f"{name}.{export}"] = value.__module__
        assert wrong == {}
