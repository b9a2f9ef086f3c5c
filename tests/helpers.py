"""Reading targets back the way independent readers do, and comparing multisets of rows."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections import Counter
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from mvsink.compat import to_arrow
from mvsink.table.storage import Store
from mvsink.table.uris import is_local, table_root


def store(target: str) -> Store:
    """The target's files (on S3, reached with the test server's environment)."""
    return Store(table_root(target))


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
    return multiset(to_arrow(df), columns)


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
    copies = "" if is_local(target) else tempfile.mkdtemp(prefix="mvsink-listed-")
    for i, action in enumerate(pa.table(dt.get_add_actions(flatten=False)).to_pylist()):
        path = unquote(action["path"])
        if is_local(target):
            local = os.path.join(target, path)
        else:  # Spark has no S3 connector here: it reads a byte-for-byte copy
            local = os.path.join(copies, f"{i}.parquet")
            with store(target).fs.open_input_stream(path) as src, open(local, "wb") as dst:
                dst.write(src.read())
        df = spark.read.schema(data_schema).parquet(local)
        for col in parts:
            value = (action.get("partition") or {}).get(col)
            df = df.withColumn(col, F.lit(value).cast(schema[col].dataType))
        frames.append(df.select(*schema.names))
    return reduce(lambda a, b: a.unionByName(b), frames)


def log_entry(target: str, version: int) -> list[dict[str, Any]]:
    """The actions of one Delta commit, straight from the JSON log file."""
    with store(target).fs.open_input_stream(f"_delta_log/{version:020d}.json") as fh:
        text = fh.read().decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def added(target: str, version: int) -> list[str]:
    return [unquote(a["add"]["path"]) for a in log_entry(target, version) if "add" in a]


def removed(target: str, version: int) -> list[str]:
    return [unquote(a["remove"]["path"]) for a in log_entry(target, version) if "remove" in a]


def commit_info(target: str, version: int) -> dict[str, Any]:
    """A version's commitInfo with mvsink's properties at its top level: delta-rs writes them
    there, the JVM engine into its ``tags`` (as ``mvsink.table.log.history`` reads them)."""
    info = next(a["commitInfo"] for a in log_entry(target, version) if "commitInfo" in a)
    tags = info.get("tags") or {}
    return {**{k: v for k, v in tags.items() if k.startswith("mvsink.")}, **info}


def versions(target: str) -> list[int]:
    infos = store(target).fs.get_file_info(pafs.FileSelector("_delta_log", allow_not_found=True))
    names = [i.path.rsplit("/", 1)[-1] for i in infos]
    return sorted(int(n[:20]) for n in names if n.endswith(".json") and n[:20].isdigit())


def live_files(target: str) -> set[str]:
    dt = DeltaTable(target)
    return {unquote(p) for p in pa.table(dt.get_add_actions()).column("path").to_pylist()}


def data_files_on_disk(target: str) -> set[str]:
    """Data files present in storage (referenced or not), relative to the root."""
    infos = store(target).fs.get_file_info(pafs.FileSelector("", recursive=True, allow_not_found=True))
    return {
        i.path.lstrip("/")
        for i in infos
        if i.type == pafs.FileType.File
        and i.path.endswith(".parquet")
        and not any(part.startswith(("_", ".")) for part in i.path.lstrip("/").split("/"))
    }


def once(action: Any) -> Any:
    """A test hook that runs ``action()`` the first time it is called only."""
    state = {"done": False}

    def hook(*_args: Any) -> None:
        if not state["done"]:
            state["done"] = True
            action()

    return hook


def exists(target: str, path: str) -> bool:
    """Whether ``path`` (relative to the root) is in storage."""
    return bool(store(target).fs.get_file_info(path).type == pafs.FileType.File)


def put_parquet(target: str, path: str, table: pa.Table) -> int:
    """Write a Parquet file into the target's storage as another writer would; returns its size."""
    import pyarrow.parquet as pq

    fs = store(target).fs
    if is_local(target):
        os.makedirs(os.path.dirname(os.path.join(target, path)), exist_ok=True)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    data = sink.getvalue()
    if is_local(target):
        with fs.open_output_stream(path) as fh:
            fh.write(data)
    else:
        from deltalake._internal import DeltaFileSystemHandler

        out = DeltaFileSystemHandler(table_root(target), {}).open_output_stream(path, None)
        out.write(data.to_pybytes())
        out.close()
    return int(data.size)
