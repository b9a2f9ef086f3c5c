"""Spark's Python workers: check once that they run the driver's mvsink.

Every task the sink runs (``mapInArrow``: writing files, reading and hashing them) unpickles
functions of mvsink on a worker. A worker whose Python lacks mvsink, pyarrow or deltalake (a
job started from a virtualenv that is not activated, a cluster where only the driver has the
library) would fail the first such task with a ``ModuleNotFoundError`` deep in a Java stack
trace; a worker with another mvsink could hash rows another way. So before its first epoch a
sink runs one small task whose function is pickled by value (it imports nothing of mvsink to
be unpickled) and asks the worker what it has. Anything but the driver's mvsink version and
fingerprint version is a ``ConfigError`` naming the workers' Python and how to fix it.

The answer is kept per Spark application in this process: one task per application, not per
epoch or sink. (``StoredIndex`` checks the fingerprint version again in every task that writes
or reads index entries.)
"""

from __future__ import annotations

import builtins
import logging
import os
import sys
import types
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StringType, StructField, StructType

from mvsink.compat import to_arrow
from mvsink.errors import ConfigError, Where, first_line

log = logging.getLogger(__name__)

_checked: set[str] = set()
"""Spark applications whose workers were found to run the driver's mvsink."""

_ANSWER = StructType([StructField(n, StringType()) for n in ("python", "version", "fingerprint", "error")])

# The probe's source: compiled in a module of its own that no worker can import, so that
# cloudpickle ships the function by value and a worker without mvsink can still run it.
_PROBE = """
def probe(batches):
    import sys
    for _ in batches:
        pass
    import pyarrow as pa
    version = fingerprint = error = ""
    try:
        import deltalake  # noqa: F401  (a dependency: mvsink imports it only in its Delta shim)
        import mvsink
        from mvsink.table.fingerprint import FINGERPRINT_VERSION
        version, fingerprint = mvsink.__version__, str(FINGERPRINT_VERSION)
    except Exception as exc:
        error = type(exc).__name__ + ": " + str(exc)
    yield pa.RecordBatch.from_pydict(
        {"python": [sys.executable], "version": [version], "fingerprint": [fingerprint], "error": [error]}
    )
"""


def _probe() -> Any:
    namespace: dict[str, Any] = {"__builtins__": builtins, "__name__": "mvsink_worker_probe"}
    exec(compile(_PROBE, "<mvsink worker probe>", "exec"), namespace)
    function = namespace["probe"]
    assert isinstance(function, types.FunctionType)
    return function


def check_workers(spark: SparkSession, where: Where) -> None:
    """Raise ``ConfigError`` unless Spark's Python workers import this mvsink (same version,
    same fingerprint version) and its dependencies; once per Spark application."""
    from mvsink._version import __version__
    from mvsink.table.fingerprint import FINGERPRINT_VERSION

    app = _application(spark)
    if app in _checked:
        return
    one: DataFrame = spark.range(1, numPartitions=1)
    try:  # PySpark checks its own requirements (pandas, pyarrow) here, in this process
        probe = one.mapInArrow(_probe(), _ANSWER)
    except Exception as exc:
        raise ConfigError(
            f"this Python ({sys.executable}) cannot start mvsink's Spark tasks: {first_line(exc)}. "
            "Install mvsink with its dependencies in it (pip install mvsink brings pyspark[sql]: "
            "pandas, pyarrow, numpy).",
            where,
        ) from None
    try:
        row = to_arrow(probe).to_pylist()[0]
    except Exception as exc:
        raise ConfigError(
            f"Spark's Python workers ({_worker_python(spark)}) cannot run mvsink's tasks: "
            f"{_cause(exc)}. {_HOW}",
            where,
        ) from None
    if row["error"]:
        raise ConfigError(
            f"Spark's Python workers ({row['python']}) cannot import mvsink: {row['error']}. {_HOW}", where
        )
    if (row["version"], row["fingerprint"]) != (__version__, str(FINGERPRINT_VERSION)):
        raise ConfigError(
            f"Spark's Python workers ({row['python']}) run mvsink {row['version']} (fingerprint "
            f"version {row['fingerprint']}), the driver mvsink {__version__} (fingerprint version "
            f"{FINGERPRINT_VERSION}): their rows would not compare. Nothing was written. {_HOW}",
            where,
        )
    _checked.add(app)


_HOW = (
    "Give the workers the driver's environment: set PYSPARK_PYTHON before the session starts (or "
    "spark.pyspark.python under spark-submit) to "
    f"a Python with this mvsink installed (the driver runs {sys.executable}), ship it with "
    "spark.archives or --py-files, or install it as a cluster library."
)


def _application(spark: SparkSession) -> str:
    try:
        return str(spark.conf.get("spark.app.id", None) or "")
    except Exception:  # not readable through this session: one check per process
        return ""


def _worker_python(spark: SparkSession) -> str:
    """The Python Spark starts workers with, as far as the driver can tell: a classic session
    started from Python took ``PYSPARK_PYTHON`` (else ``python3``) when its context started,
    whatever ``spark.pyspark.python`` says (which only launchers such as spark-submit read)."""
    try:
        started = spark.sparkContext.pythonExec
    except Exception:  # Connect: no context here
        started = None
    if started:
        return "python3 on the workers' PATH" if started == "python3" else str(started)
    try:
        configured = spark.conf.get("spark.pyspark.python", None)
    except Exception:
        configured = None
    return str(configured or os.environ.get("PYSPARK_PYTHON") or "python3 on the workers' PATH")


def _cause(exc: BaseException) -> str:
    """The Python error inside a failed task's Java stack trace, else the first line."""
    text = str(exc)
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("ModuleNotFoundError", "ImportError")) or "No module named" in stripped:
            return stripped
    return first_line(exc)
