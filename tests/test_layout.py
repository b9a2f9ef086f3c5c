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
    {"history"},
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


TESTS = PACKAGE.parent / "tests"


def _has_logic(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) for n in ast.walk(tree))


@pytest.mark.parametrize(
    "module", sorted(m for m, p in _modules().items() if p.name != "__init__.py" and _has_logic(p))
)
def test_every_module_with_logic_has_a_test_module(module):
    """The tests mirror the package: ``mvsink/a/b.py`` is tested by ``tests/a/test_b.py``, or,
    for what only runs against the JVM Delta runtime, by ``tests/interop/test_b.py``."""
    *folders, name = module.split(".")[1:]
    mirror = TESTS.joinpath(*folders, f"test_{name}.py")
    interop = TESTS / "interop" / f"test_{name}.py"
    assert mirror.exists() or interop.exists(), (
        f"{module} has no test module ({mirror.relative_to(TESTS.parent)})"
    )


def test_no_test_module_imports_another():
    """Shared helpers live in tests/helpers.py (fixtures in conftest.py): a test module that
    imports another runs that module's tests' set-up twice and ties the two together."""
    found = []
    for path in sorted(TESTS.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            module = node.module or ""
            if (module.split(".")[0] == "tests" or node.level) and module.split(".")[-1].startswith("test_"):
                found.append(f"{path.relative_to(TESTS.parent)}:{node.lineno} imports {module}")
    assert not found, "\n".join(found)


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


SHIM = {"mvsink.table.delta", "mvsink.table.commit", "mvsink.table.jvm_delta"}
"""The Delta shim: the only modules that import ``deltalake`` (the rest speak mvsink's verbs)."""


def test_only_the_delta_shim_imports_deltalake():
    found = []
    for module, path in sorted(_modules().items()):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if any(n.split(".")[0] == "deltalake" for n in names) and module not in SHIM:
                found.append(f"{module}:{node.lineno}")
    assert not found, "deltalake imported outside the Delta shim: " + ", ".join(found)
