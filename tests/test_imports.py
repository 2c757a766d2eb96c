"""No import circle among the infra modules: a module that needs another's names imports it, never the other way
round too (shared key names live in infra/keys.py, below both)."""

from __future__ import annotations

import ast

from conftest import ROOT

INFRA = ROOT / "infra"


def infra_imports(module: str) -> set[str]:
    """The infra modules `module` imports, wherever in the file (TYPE_CHECKING blocks included)."""
    tree = ast.parse((INFRA / f"{module}.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found |= {name.split(".")[1] for name in names if name.startswith("infra.")}
    modules = {path.stem for path in INFRA.glob("*.py")}
    return found & modules - {module}


def test_no_import_cycle_among_infra_modules():
    graph = {path.stem: infra_imports(path.stem) for path in INFRA.glob("*.py")}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join([*path[path.index(module) :], module])}"
        if module in done:
            return
        for imported in sorted(graph[module]):
            visit(imported, (*path, module))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())
