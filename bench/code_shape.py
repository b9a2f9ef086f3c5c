"""How one epoch reads: the mvsink modules and functions a steady complete-mode epoch runs,
and the package's longest functions.

Runs a view of a few rows for two epochs on a local session (the second is the steady one,
traced) and reports:

* ``modules``: the mvsink modules whose code ran in the steady epoch;
* ``main_path``: the mvsink calls made directly by the function that runs the epoch's
  attempts (``RUNNER``), in order, with their modules;
* ``entries``: for each mvsink module, how many times control entered it from another module;
* ``longest``: the ten longest functions of the package (lines, ``module:function``).

    python bench/code_shape.py
"""

from __future__ import annotations

import ast
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "mvsink"
RUNNER = ("mvsink.epoch.run", "attempts")
"""The function whose direct calls are the epoch's main path (module, function name); the
names before the refactor of issue 38 are tried too."""
_OLD_RUNNER = ("mvsink.sink", "_attempts")


def longest(n: int = 10) -> list[tuple[int, str]]:
    out = []
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                out.append((node.end_lineno - node.lineno + 1, f"{module}:{node.name}"))
    return sorted(out, reverse=True)[:n]


def trace_epoch() -> dict:
    from mvsink import MVSink
    from mvsink.cli.session import local_session

    spark = local_session("mvsink-code-shape")
    modules: Counter[str] = Counter()
    entries: Counter[str] = Counter()
    main_path: list[str] = []
    stack: list[str] = []

    def module_of(frame) -> str | None:
        name = frame.f_globals.get("__name__", "")
        return name if name == "mvsink" or name.startswith("mvsink.") else None

    def profile(frame, event, arg):
        if event == "call":
            mod = module_of(frame)
            caller = module_of(frame.f_back) if frame.f_back else None
            if mod:
                modules[mod] += 1
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
    }


def main() -> None:
    shape = trace_epoch()
    shape["longest"] = [f"{n} {name}" for n, name in longest()]
    print(json.dumps(shape, indent=1))


if __name__ == "__main__":
    main()
