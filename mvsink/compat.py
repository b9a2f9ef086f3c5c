"""What differs between the Spark lines mvsink runs on: PySpark 3.5 and 4.x, each with classic
and Spark Connect sessions. The only module that knows Spark versions; everything else calls
what is here instead of an API one line lacks.

- Collecting a DataFrame as Arrow: ``DataFrame.toArrow`` is 4.0+; on 3.5 a classic session
  collects Arrow batches, a Connect session an Arrow table, through their private helpers
  (the ones 4.0's ``toArrow`` is built on).
- A DataFrame of an Arrow table: ``createDataFrame`` takes one from 4.0 on; 3.5 takes rows.
- Spark's Arrow schema of a Spark schema: 3.5's ``to_arrow_schema`` has no ``timezone``
  argument (its timestamps are UTC already).
- Python data sources (``pyspark.sql.datasource``, behind ``format("mvsink-delta")``) are 4.0+.
- ``mapInArrow`` on both lines hands each column to its function by name, unquoted, so a column
  named with a dot or a backtick does not resolve (``map_in_arrow`` works around it).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
from typing import Any

import pyarrow as pa
import pyspark
from pyspark import StorageLevel

SPARK_LINE: tuple[int, int] = tuple(int(p) for p in pyspark.__version__.split(".")[:2])  # type: ignore[assignment]
"""The installed PySpark's (major, minor)."""

PYTHON_DATA_SOURCES = SPARK_LINE >= (4, 0)
"""Whether Spark runs data sources written in Python (``mvsink-delta``)."""


def is_connect(obj: Any) -> bool:
    """Whether a DataFrame or SparkSession belongs to a Spark Connect session."""
    return type(obj).__module__.startswith("pyspark.sql.connect")


def to_arrow_schema(struct: Any) -> pa.Schema:
    """Spark's Arrow schema for a Spark ``StructType`` (timestamps in UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema as spark_arrow_schema

    if SPARK_LINE >= (4, 0):
        return spark_arrow_schema(struct, timezone="UTC")
    return spark_arrow_schema(struct)


def is_dataframe(obj: Any) -> bool:
    """Whether ``obj`` is a Spark DataFrame, classic or Connect (on 3.5 a Connect DataFrame is
    not a ``pyspark.sql.DataFrame``)."""
    from pyspark.sql import DataFrame

    return isinstance(obj, DataFrame) or (is_connect(obj) and type(obj).__name__ == "DataFrame")


def is_spark_error(exc: BaseException) -> bool:
    """Whether ``exc`` is Spark's: a failed job, analysis or Python worker error, classic
    (PySpark's errors, py4j's Java errors) or Connect."""
    from pyspark.errors import PySparkException

    if isinstance(exc, PySparkException):
        return True
    return type(exc).__name__ == "Py4JJavaError"  # classic only; py4j may be absent on Connect


def spark_reason(exc: BaseException, limit: int = 500) -> str:
    """The line of a Spark error that says what went wrong: the error a Python worker raised
    (from its traceback), else a JVM error's root cause, else the first line that is not
    py4j's preamble."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if "Traceback (most recent call last):" in lines:
        python = lines[lines.index("Traceback (most recent call last):") + 1 :]
        raised = [line for line in python if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b", line)]
        if raised:
            return raised[0][:limit]
    causes = [line.removeprefix("Caused by:").strip() for line in lines if line.startswith("Caused by:")]
    if causes:  # a JVM error's root cause says more than its wrappers
        return causes[-1][:limit]
    for line in lines:
        if not line.startswith(("An error occurred while calling", "JVM stacktrace")):
            return line.lstrip(": ")[:limit]
    return type(exc).__name__


def logical_plan(df: Any) -> str:
    """The analyzed logical plan of ``df`` as Spark prints it (``explain(extended=True)``),
    in classic and Connect sessions alike: a streaming one names its sources and their
    options."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        df.explain(extended=True)
    return out.getvalue()


def to_arrow(df: Any) -> pa.Table:
    """All of ``df``'s rows on the driver as an Arrow table of Spark's Arrow schema."""
    if hasattr(type(df), "toArrow"):  # 4.0+, and builds that have it (not a column of that name)
        return df.toArrow()
    schema = to_arrow_schema(df.schema)
    if is_connect(df):
        client = df._session.client
        table, _ = client.to_table(df._plan.to_proto(client))
        return table.cast(schema)
    batches = df._collect_as_arrow()
    if not batches:
        return schema.empty_table()
    # Timestamps come in the session's time zone: the cast only relabels the same instants.
    return pa.Table.from_batches(batches).cast(schema)


def from_arrow(spark: Any, table: pa.Table, schema: str) -> Any:
    """A DataFrame of ``table``'s rows, of the Spark ``schema`` (``"name type, ..."``). For the
    tables mvsink hands Spark (a snapshot's files, their paths), not for rows of a view."""
    if SPARK_LINE >= (4, 0):
        return spark.createDataFrame(table, schema)
    # 3.5 takes Python rows, each checked, converted and pickled in Python (seconds at 100k
    # files): instead each row carries a chunk of them as a JSON array, which the JVM parses
    # (failing, not nulling, on a value that does not fit). Plain column types only.
    from pyspark.sql import functions as F

    columns = [part.strip().split(None, 1) for part in schema.split(",")]
    if [name for name, _ in columns] != table.column_names:
        raise ValueError(f"the table's columns {table.column_names} are not the schema's ({schema})")
    struct = ",".join(f"`{name}`:{kind}" for name, kind in columns)
    rows = table.to_pylist()
    chunks = [
        (json.dumps(rows[i : i + JSON_ROWS_PER_CHUNK]),) for i in range(0, len(rows), JSON_ROWS_PER_CHUNK)
    ]
    payload = spark.createDataFrame(chunks, "rows string")
    parsed = F.from_json("rows", f"array<struct<{struct}>>", {"mode": "FAILFAST"})
    exploded = payload.select(F.explode(parsed).alias("row"))
    return exploded.select(*(F.col(f"row.`{name}`").alias(name) for name, _ in columns))


JSON_ROWS_PER_CHUNK = 2_000
"""Rows of a table ``from_arrow`` puts in one JSON string on 3.5 (about half a MB)."""


KEEP = StorageLevel.MEMORY_AND_DISK_DESER
"""How mvsink caches a frame it reads more than once in an epoch: as Spark's own
``DataFrame.cache()`` does, columnar batches kept as built, spilled to disk when memory runs
short. The serialized level (``MEMORY_AND_DISK``) holds the same bytes but serializes every
batch in and out: filling a 20M-row frame with its fingerprints took 19.3-21.7 s against
14.8-17.4 s here, and a scan of it 0.7-1.1 s against 0.3-0.7 s (issue 55)."""


def cached(frame: Any) -> bool:
    """Whether ``frame`` is cached already (by its caller): the sink then uses it as it is and
    never releases it, since Spark keys a cache by plan and releasing one would release both."""
    level = frame.storageLevel
    return bool(level.useMemory or level.useDisk)


def release(*frames: Any) -> None:
    """Unpersist cached frames, best-effort. By the time a frame is released the epoch's
    outcome is decided (or an error is on its way up): a failure here (the query's thread
    interrupted as it stops, the session going away) must not replace it. Blocks left behind
    go with the session."""
    for frame in frames:
        try:
            frame.unpersist()
        except Exception as exc:
            logging.getLogger(__name__).warning(
                "could not release a cached frame (left to the session): %s",
                (str(exc).splitlines() or [type(exc).__name__])[0][:300],
            )


_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Named:
    """A ``mapInArrow`` function that sees the batch's columns under their real names, where
    they travel under positional ones (``map_in_arrow``). Picklable as its parts."""

    def __init__(self, fn: Any, names: list[str]) -> None:
        self.fn = fn
        self.names = names

    def __call__(self, batches: Any) -> Any:
        return self.fn(pa.RecordBatch.from_arrays(b.columns, names=self.names) for b in batches)


def map_in_arrow(df: Any, fn: Any, schema: Any) -> Any:
    """``df.mapInArrow(fn, schema)`` for any column names. PySpark (3.5 and 4.x, classic and
    Connect) passes each column to the function by its name unquoted, so ``a.b`` is read as a
    field of ``a`` and a backtick is a syntax error: such columns travel under positional names
    and ``fn`` gets them back under their own."""
    names = list(df.columns)
    if all(_PLAIN_NAME.fullmatch(n) for n in names):
        return df.mapInArrow(fn, schema)
    from pyspark.sql import functions as F

    quoted = ["`" + n.replace("`", "``") + "`" for n in names]
    moved = df.select(*[F.col(q).alias(f"_mvsink_col{i}") for i, q in enumerate(quoted)])
    return moved.mapInArrow(_Named(fn, names), schema)
