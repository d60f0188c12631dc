"""The package's layout: no import cycle of any kind, and a map that names every module.

The cycle check reads every module of `django_conveyor` with `ast` and
collects every import it makes: at module level, inside functions and
under `if TYPE_CHECKING:` alike, since each of those is a knot a reader
has to untie. import-linter's layer contract (pyproject.toml) checks the
direction of imports between layers; this checks that no two modules,
in any layer, import each other, however indirectly.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers import REPO

PACKAGE = REPO / "django_conveyor"
ARCHITECTURE = REPO / "docs" / "architecture.md"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    """Every module of the package but the migrations (Django's, importing nothing of ours)."""
    return {
        module_name(path): path
        for path in sorted(PACKAGE.rglob("*.py"))
        if "migrations" not in path.relative_to(PACKAGE).parts
    }


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports, wherever the import statement is."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                prefix = ".".join([*base, *([node.module] if node.module else [])])
            else:
                prefix = node.module or ""
            # `from package import module` imports the module; otherwise a name of `prefix`.
            targets = [
                f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in modules else prefix
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]  # `import a.b.c` of a name c
            if target and target != name:
                found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def test_no_two_modules_of_the_package_import_each_other_in_any_way():
    graph = import_graph()
    assert "django_conveyor.worker.attempts" in graph["django_conveyor.context"]  # It reads them.
    assert cycles(graph) == []


def test_the_checker_finds_a_cycle_through_a_function_level_or_type_checking_import(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from . import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n"
    )
    (package / "c.py").write_text("from pkg.a import f\n")
    modules = {f"pkg.{p.stem}" if p.stem != "__init__" else "pkg": p for p in package.glob("*.py")}
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        graph[name] = imports_of(name, path, modules)
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


def documented_modules() -> set[str]:
    """The module paths docs/architecture.md names in backticks, relative to the package."""
    return set(re.findall(r"`([a-z_/]+\.py)`", ARCHITECTURE.read_text()))


def test_the_architecture_page_names_every_module_of_the_package():
    modules = {
        str(path.relative_to(PACKAGE))
        for path in package_modules().values()
        # A package is named by its folder; the commands by theirs, one module each.
        if path.name != "__init__.py" and path.parent != PACKAGE / "management" / "commands"
    }
    missing = sorted(modules - documented_modules())
    assert missing == [], f"docs/architecture.md does not name {missing}"
    outside = ("tests/", "spec/", "docs/", "scripts/", "example_project/")
    stale = sorted(
        m for m in documented_modules() if not m.startswith(outside) and not (PACKAGE / m).exists()
    )
    assert stale == [], f"docs/architecture.md names modules that do not exist: {stale}"
