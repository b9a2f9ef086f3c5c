"""The package's layers (``docs/design.md``, "Modules"): each part imports only the parts below
it, and no module imports itself back through others. Every ``import`` counts, including those
inside functions and under ``TYPE_CHECKING``: a layer that needs a higher one's type has the
dependency the wrong way round."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mvsink"

LAYERS: list[set[str]] = [
    {"errors", "report", "compat", "_version", "failpoints"},
    {"table"},
    {"config"},
    {"options_doc"},
    {"plan"},
    {"epoch"},
    {"ops", "sources"},
    {"sink"},
    {"cli", "demo", "__init__"},
]
"""Bottom to top. A part is a subpackage or a top-level module of ``mvsink``."""


def _part(module: str) -> str:
    """``mvsink.table.delta`` -> ``table``; ``mvsink.sink`` -> ``sink``; ``mvsink`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _level(part: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if part in layer)


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(path: Path) -> set[str]:
    """The mvsink modules ``path`` imports (``from mvsink.x import y`` names ``mvsink.x.y``
    when that is a module, else ``mvsink.x``; relative imports resolved)."""
    known = _modules()
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            if module.split(".")[0] != "mvsink":
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in known else module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "mvsink"}
    return found


def test_every_part_has_a_layer():
    parts = {_part(m) for m in _modules()}
    placed = set().union(*LAYERS)
    assert parts <= placed, f"parts without a layer: {sorted(parts - placed)}"


@pytest.mark.parametrize("module", sorted(_modules()))
def test_a_module_imports_only_its_own_part_and_lower_ones(module):
    mine = _part(module)
    above = sorted(
        m for m in _imports(_modules()[module]) if _part(m) != mine and _level(_part(m)) >= _level(mine)
    )
    assert not above, f"{module} imports {above}, which are not below its part ({mine})"


def test_no_import_cycles():
    graph = {m: {i for i in _imports(p) if i in _modules()} for m, p in _modules().items()}
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            raise AssertionError("import cycle: " + " -> ".join([*path[path.index(node) :], node]))
        if node in done:
            return
        for nxt in sorted(graph[node]):
            # A package's __init__ importing its own modules (to re-export them) is how a
            # package is built; a module importing its package back is a cycle like any other.
            if not nxt.startswith(node + "."):
                visit(nxt, [*path, node])
        done.add(node)

    for module in sorted(graph):
        visit(module, [])
