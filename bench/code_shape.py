"""How one epoch reads: the mvsink modules and functions a steady complete-mode epoch runs,
and the package's longest functions.

Runs a view of a few rows for two epochs on a local session (the second is the steady one,
traced) and reports:

* ``modules``: the mvsink modules whose code ran in the steady epoch;
* ``main_path``: the mvsink calls made directly by the function that runs the epoch's
  attempts (``RUNNER``), in order, with their modules;
* ``entries``: for each mvsink module, how many times control entered it from another module;
* ``longest``: the ten longest functions of the package (lines, ``module:function``);
* ``steady_path_over_60``: the functions that ran in the steady epoch and are over 60 lines;
* ``review``: the figures issue 54's review measured (static, from the source alone): functions
  over 80 lines, modules importing ``deltalake``, retry loops, fault-injection mechanisms,
  modules with logic and no test module, test modules importing another test module.

    python bench/code_shape.py            # all of it (runs a view on a local session)
    python bench/code_shape.py --static   # the review's figures only, no Spark
"""

from __future__ import annotations

import ast
import json
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mvsink"
TESTS = ROOT / "tests"
RUNNER = ("mvsink.epoch.run", "attempts")
"""The function whose direct calls are the epoch's main path (module, function name); the
names before the refactor of issue 38 are tried too."""
_OLD_RUNNER = ("mvsink.sink", "_attempts")


def _modules() -> dict[str, Path]:
    return {
        ".".join(path.relative_to(ROOT).with_suffix("").parts): path for path in sorted(PACKAGE.rglob("*.py"))
    }


def functions() -> list[tuple[int, str, int]]:
    """Every function of the package: (lines, ``module:qualname``, first line), longest first."""
    out = []

    def visit(module: str, node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                out.append((child.end_lineno - child.lineno + 1, f"{module}:{name}", child.lineno))
                visit(module, child, f"{name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(module, child, f"{prefix}{child.name}.")

    for module, path in _modules().items():
        visit(module, ast.parse(path.read_text()), "")
    return sorted(out, reverse=True)


def longest(n: int = 10) -> list[tuple[int, str]]:
    return [(lines, name) for lines, name, _ in functions()[:n]]


def _imports_deltalake(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "deltalake" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "deltalake":
            return True
    return False


def _retry_loops(module: str, tree: ast.AST) -> list[str]:
    """Loops over a number of attempts (``for _ in range(<...attempt...>)``)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Call):
            source = ast.unparse(node.iter)
            if source.startswith("range(") and "attempt" in source.lower():
                out.append(f"{module}:{node.lineno}")
    return out


_HOOK = re.compile(r"^_?(before|after)_[a-z_]+$")


def _callback_hooks(module: str, tree: ast.AST) -> list[str]:
    """Parameters and dataclass fields named like a fault-injection hook (``_after_call``,
    ``before_commit``) and typed or defaulted as a callable: the second mechanism beside
    ``failpoints``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for arg in [*node.args.args, *node.args.kwonlyargs]:
                if _HOOK.match(arg.arg) and "Callable" in ast.unparse(arg.annotation or ast.Constant(None)):
                    out.append(f"{module}:{node.name}({arg.arg}=)")
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and _HOOK.match(node.target.id)
            and "Callable" in ast.unparse(node.annotation)
        ):
            out.append(f"{module}:{node.target.id}")
    return out


def _has_logic(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) for n in ast.walk(tree))


def test_module_of(module: str) -> Path:
    """``mvsink.a.b`` -> ``tests/a/test_b.py``; ``mvsink.b`` -> ``tests/test_b.py``."""
    *folders, name = module.split(".")[1:]
    return TESTS.joinpath(*folders, f"test_{name}.py")


def _test_imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tests":
            if node.module.split(".")[-1].startswith("test_"):
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module}")
        elif isinstance(node, ast.ImportFrom) and node.level and (node.module or "").startswith("test_"):
            out.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.module}")
    return out


def review() -> dict:
    """The figures of issue 54's review, from the source alone."""
    trees = {m: ast.parse(p.read_text()) for m, p in _modules().items()}
    fns = functions()
    deltalake = sorted(m for m, t in trees.items() if _imports_deltalake(t))
    loops = [x for m, t in trees.items() for x in _retry_loops(m, t)]
    hooks = [x for m, t in trees.items() for x in _callback_hooks(m, t)]
    logic = [m for m, t in trees.items() if _has_logic(t) and not m.endswith("__init__")]
    untested = [m for m in logic if not test_module_of(m).exists()]
    cross = [x for p in sorted(TESTS.rglob("test_*.py")) for x in _test_imports(p)]
    sleeps = sum(p.read_text().count("time.sleep(") for p in TESTS.rglob("test_*.py"))
    lines = {m: len(p.read_text().splitlines()) for m, p in _modules().items()}
    return {
        "modules": len(trees),
        "longest_module_lines": dict(sorted(lines.items(), key=lambda kv: -kv[1])[:5]),
        "functions_over_80": [f"{n} {name}" for n, name, _ in fns if n > 80],
        "functions_over_60": [f"{n} {name}" for n, name, _ in fns if n > 60],
        "modules_importing_deltalake": deltalake,
        "retry_loops": loops,
        "fault_injection": {"failpoints": "mvsink.failpoints" in trees, "callback_hooks": hooks},
        "modules_with_logic": len(logic),
        "without_test_module": untested,
        "test_modules_importing_test_modules": cross,
        "time_sleep_calls_in_tests": sleeps,
    }


def trace_epoch() -> dict:
    from mvsink import MVSink
    from mvsink.cli.session import local_session

    spark = local_session("mvsink-code-shape")
    modules: Counter[str] = Counter()
    entries: Counter[str] = Counter()
    main_path: list[str] = []
    stack: list[str] = []
    ran: set[str] = set()

    def module_of(frame) -> str | None:
        name = frame.f_globals.get("__name__", "")
        return name if name == "mvsink" or name.startswith("mvsink.") else None

    def profile(frame, event, arg):
        if event == "call":
            mod = module_of(frame)
            caller = module_of(frame.f_back) if frame.f_back else None
            if mod:
                modules[mod] += 1
                ran.add(f"{mod}:{frame.f_code.co_qualname}")
                if caller != mod:
                    entries[mod] += 1
                parent = frame.f_back
                if parent is not None and (module_of(parent), parent.f_code.co_name) in (RUNNER, _OLD_RUNNER):
                    main_path.append(f"{mod}:{frame.f_code.co_qualname}")
            stack.append(mod or "")
        elif event == "return" and stack:
            stack.pop()

    with tempfile.TemporaryDirectory(prefix="mvsink-shape-") as root:
        sink = MVSink(f"{root}/t", "shape", placement="driver")
        sink(spark.range(1000).selectExpr("id", "id % 7 AS k"), 0)
        batch = spark.range(1000).selectExpr("id", "(id + 1) % 7 AS k")
        sys.setprofile(profile)
        try:
            sink(batch, 1)
        finally:
            sys.setprofile(None)
    spark.stop()
    return {
        "modules": len(modules),
        "main_path": main_path,
        "main_path_calls": len(main_path),
        "main_path_modules": len({c.split(":")[0] for c in main_path}),
        "entries": dict(entries.most_common()),
        "ran": ran,
    }


def steady_path_over(limit: int, ran: set[str]) -> list[str]:
    """The functions that ran in the traced steady epoch and are over ``limit`` lines."""
    return [f"{n} {name}" for n, name, _ in functions() if n > limit and name in ran]


def main() -> None:
    if "--static" in sys.argv[1:]:
        print(json.dumps({"review": review()}, indent=1))
        return
    shape = trace_epoch()
    shape["longest"] = [f"{n} {name}" for n, name in longest()]
    shape["steady_path_over_60"] = steady_path_over(60, shape.pop("ran"))
    shape["review"] = review()
    print(json.dumps(shape, indent=1))


if __name__ == "__main__":
    main()
