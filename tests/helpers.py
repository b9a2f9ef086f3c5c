"""Reading targets back the way independent readers do, and comparing multisets of rows."""

from __future__ import annotations

import glob
import json
import math
import os
from collections import Counter
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession


def _canon(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return ("NaN",)
    if isinstance(value, float) and value == 0.0:
        return 0.0  # -0.0 and 0.0 are one value for mvsink (and Spark SQL)
    if isinstance(value, dict):
        return tuple((k, _canon(v)) for k, v in value.items())
    if isinstance(value, list):
        items = [_canon(v) for v in value]
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
            # pyarrow renders a map as a list of (key, value) pairs; entry order is not data.
            return ("map", tuple(sorted(items, key=repr)))
        return tuple(items)
    if isinstance(value, tuple):
        return tuple(_canon(v) for v in value)
    return value


def multiset(table: pa.Table, columns: list[str] | None = None) -> Counter[Any]:
    """Rows of an Arrow table as a multiset that is null-safe and treats NaN as equal to NaN."""
    cols = columns or table.column_names
    rows = table.select(cols).to_pylist()
    return Counter(tuple(_canon(r[c]) for c in cols) for r in rows)


def target_table(target: str, version: int | None = None) -> pa.Table:
    """The target as delta-rs reads it (an independent Delta reader)."""
    dt = DeltaTable(target, version=version)
    return pa.table(dt.to_pyarrow_table())


def desired_multiset(df: DataFrame, columns: list[str]) -> Counter[Any]:
    return multiset(df.toArrow(), columns)


def assert_equal_to(target: str, desired: DataFrame, version: int | None = None) -> None:
    table = target_table(target, version)
    got, want = multiset(table), desired_multiset(desired, table.column_names)
    assert got == want, f"target differs: extra {got - want}, missing {want - got}"


def spark_read_listed(spark: SparkSession, target: str) -> DataFrame:
    """The target as Spark reads the files the Delta log lists (no Delta jars).

    Each file is read on its own and given its partition values from the log as literals,
    independently of how mvsink reads them.
    """
    from functools import reduce

    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    dt = DeltaTable(target)
    schema = StructType.fromJson(json.loads(dt.schema().to_json()))
    parts = dt.metadata().partition_columns
    data_schema = StructType([f for f in schema.fields if f.name not in parts])
    frames = []
    for action in pa.table(dt.get_add_actions(flatten=False)).to_pylist():
        df = spark.read.schema(data_schema).parquet(os.path.join(target, unquote(action["path"])))
        for col in parts:
            value = (action.get("partition") or {}).get(col)
            df = df.withColumn(col, F.lit(value).cast(schema[col].dataType))
        frames.append(df.select(*schema.names))
    return reduce(lambda a, b: a.unionByName(b), frames)


def log_entry(target: str, version: int) -> list[dict[str, Any]]:
    """The actions of one Delta commit, straight from the JSON log file."""
    with open(os.path.join(target, "_delta_log", f"{version:020d}.json")) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def added(target: str, version: int) -> list[str]:
    return [unquote(a["add"]["path"]) for a in log_entry(target, version) if "add" in a]


def removed(target: str, version: int) -> list[str]:
    return [unquote(a["remove"]["path"]) for a in log_entry(target, version) if "remove" in a]


def commit_info(target: str, version: int) -> dict[str, Any]:
    return next(a["commitInfo"] for a in log_entry(target, version) if "commitInfo" in a)


def versions(target: str) -> list[int]:
    return sorted(
        int(os.path.basename(p)[:20]) for p in glob.glob(os.path.join(target, "_delta_log", "*.json"))
    )


def live_files(target: str) -> set[str]:
    dt = DeltaTable(target)
    return {unquote(p) for p in pa.table(dt.get_add_actions()).column("path").to_pylist()}


def data_files_on_disk(target: str) -> set[str]:
    out = set()
    for root, dirs, names in os.walk(target):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        for n in names:
            if n.endswith(".parquet"):
                out.add(os.path.relpath(os.path.join(root, n), target))
    return out


def once(action: Any) -> Any:
    """A test hook that runs ``action()`` the first time it is called only."""
    state = {"done": False}

    def hook(*_args: Any) -> None:
        if not state["done"]:
            state["done"] = True
            action()

    return hook
