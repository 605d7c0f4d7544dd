"""The layers of planner/ (README "Layout of the code"), kept by reading every import statement.

Each module belongs to one layer; it may import its own layer and the layers below, never one
above. Imports inside functions count (a lazy import is still a dependency), and so do imports
under `if TYPE_CHECKING:` (an annotation names what the module depends on). The issue's rules
are this order plus three of their own: the cost model imports only specs, layout and errors;
ortools appears only in the CP-SAT module; planner.validate (torch) is imported only by itself
and the CLI. And no import cycle, at module or function level.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# bottom first; a module is in the layer of its longest matching prefix
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("planner.errors", "planner.limits", "planner.io", "planner.progress",
              "planner.interrupts", "planner.data", "planner.specs", "planner.layout")),
    ("costmodel", ("planner.costmodel",)),
    ("plan", ("planner.plan",)),
    ("search", ("planner.search",)),
    ("inputs", ("planner.hf_config", "planner.registry", "planner.stacks", "planner.published")),
    ("launchers", ("planner.launchers",)),
    ("measured", ("planner.measured",)),
    ("calibrate", ("planner.calibrate",)),
    ("validate", ("planner.validate",)),
    ("reports", ("planner.economics", "planner.report", "planner.explanation", "planner.figures",
                 "planner.html_report")),
    ("cli", ("planner.cli", "planner.__main__", "planner")),  # planner/__init__: the public API
)
COSTMODEL_MAY_IMPORT = ("planner.costmodel", "planner.specs", "planner.layout", "planner.errors")


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (validate/ is planner.validate, pyproject)."""
    out: dict[str, Path] = {}
    for top, pkg in ((ROOT / "planner", "planner"), (ROOT / "validate", "planner.validate")):
        for path in top.rglob("*.py"):
            parts = list(path.relative_to(top).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([pkg, *parts])] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement in the file, anywhere in it."""
    is_pkg = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package of this module
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:  # `from planner import economics` imports a module
                sub = f"{base}.{alias.name}"
                found.append((sub if sub in MODULES else base, node.lineno))
    return found


def _internal(target: str) -> str | None:
    """The planner module an import names (the longest known prefix), None for third parties."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def _layer(module: str) -> int:
    best, layer = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module.startswith(prefix + ".") and prefix != "planner"  # planner: __init__
            if (module == prefix or inside) and len(prefix) > best:
                best, layer = len(prefix), i
    assert layer >= 0, f"{module} is in no layer: add it to LAYERS (and the README's map)"
    return layer


def _edges() -> dict[str, list[tuple[str, int, str]]]:
    """module -> [(imported planner module or "" for a third party, line, as written)]."""
    edges: dict[str, list[tuple[str, int, str]]] = {}
    for name, path in MODULES.items():
        edges[name] = []
        for target, line in sorted(set(_imports(name, path))):
            inner = _internal(target)
            if inner is not None and inner != name:
                edges[name].append((inner, line, target))
            elif inner is None:
                edges[name].append(("", line, target))
    return edges


EDGES = _edges()


def _where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


def test_every_module_has_a_layer():
    for module in MODULES:
        _layer(module)


def test_no_upward_import():
    bad = [f"{_where(m, line)}: {m} ({LAYERS[_layer(m)][0]}) imports {t} "
           f"({LAYERS[_layer(t)][0]})"
           for m, targets in EDGES.items() for t, line, _ in targets
           if t and _layer(t) > _layer(m)]
    assert not bad, "imports that run up the layers:\n" + "\n".join(bad)


def test_costmodel_imports_only_specs_layout_errors():
    bad = [f"{_where(m, line)}: {m} imports {t}" for m, targets in EDGES.items()
           if m.startswith("planner.costmodel") for t, line, _ in targets
           if t and not t.startswith(COSTMODEL_MAY_IMPORT)]
    assert not bad, "\n".join(bad)


def test_search_imports_no_calibration_launcher_or_cli():
    above = ("planner.calibrate", "planner.launchers", "planner.cli", "planner.measured")
    bad = [f"{_where(m, line)}: {m} imports {t}" for m, targets in EDGES.items()
           if m.startswith("planner.search") for t, line, _ in targets if t.startswith(above)]
    assert not bad, "\n".join(bad)


def test_ortools_only_in_the_cpsat_module():
    bad = [_where(m, line) for m, targets in EDGES.items() for t, line, written in targets
           if not t and written.split(".")[0] == "ortools" and m != "planner.search.cpsat"]
    assert not bad, "ortools imported outside planner/search/cpsat.py: " + ", ".join(bad)


def test_validate_only_from_the_cli_and_itself():
    bad = [f"{_where(m, line)}: {m} imports {t}" for m, targets in EDGES.items()
           for t, line, _ in targets
           if t.startswith("planner.validate") and not m.startswith(("planner.validate",
                                                                     "planner.cli"))]
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    graph = {m: sorted({t for t, _, _ in targets if t and t != m})
             for m, targets in EDGES.items()}
    # a package's __init__ importing its own submodules (re-exports) is not a cycle with them
    # unless a submodule imports the package back; Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("source, expected", [
    ("from planner.calibrate.fit import calibrate", "planner.calibrate.fit"),
    ("def f():\n    from planner import economics", "planner.economics"),
    ("from .problem import Space", "planner.search.problem"),
])
def test_the_scanner_sees_each_kind_of_import(tmp_path, source, expected):
    """The rules above are only as good as the scan: module-level, in-function and relative
    imports are all found (a scanner that missed one would pass everything)."""
    path = tmp_path / "probe.py"
    path.write_text(source)
    found = [_internal(t) for t, _ in _imports("planner.search.probe", path)]
    assert expected in found
