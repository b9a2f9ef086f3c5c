"""The one home of helpers shared by test modules (no test module imports another): reading
targets back the way independent readers do, comparing multisets of rows, and the frames,
streaming queries and typed views several suites write. Shared fixtures are in conftest.py."""

from __future__ import annotations

import datetime as dt
import decimal
import glob
import json
import math
import os
import tempfile
from collections import Counter
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mvsink import MVSink
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


# --- Frames of people: the rows most suites write --------------------------------------------

PEOPLE = "id long, name string, x double"


def frame(spark: SparkSession, rows: list[tuple[object, ...]], schema: str = PEOPLE) -> DataFrame:
    return spark.createDataFrame(rows, schema)


def people(spark: SparkSession, ids: range, suffix: str = "") -> DataFrame:
    """A row per id: ``(id, "n{id}{suffix}", id / 2)``."""
    return frame(spark, [(i, f"n{i}{suffix}", i / 2) for i in ids])


def foreign_append(target: str, rows: list[dict[str, object]]) -> None:
    """Append ``rows`` to the target as another writer would (delta-rs, in the target's schema)."""
    schema = pa.schema(DeltaTable(target).schema().to_arrow())
    write_deltalake(target, pa.Table.from_pylist(rows, schema=schema), mode="append")


# --- Streaming queries over folders of order files -------------------------------------------

ORDERS = "product string, amount long"


def write_orders(folder: str, name: str, rows: list[tuple[str, int]]) -> None:
    """A CSV file of ``(product, amount)`` rows, put into ``folder`` whole (renamed into place)."""
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{name}.tmp")
    with open(tmp, "w") as fh:
        fh.writelines(f"{p},{a}\n" for p, a in rows)
    os.rename(tmp, os.path.join(folder, f"{name}.csv"))


def revenue_by_product(orders: DataFrame) -> DataFrame:
    return orders.groupBy("product").agg(F.sum("amount").alias("revenue"), F.count(F.lit(1)).alias("n"))


def run_available(spark: SparkSession, source: str, target: str, ckpt: str, **options: Any) -> Any:
    """A complete-mode query of revenue by product over ``source``, run on what is there
    (availableNow) into ``MVSink(target, "revenue", **options)``; returns the view and the sink."""
    view = revenue_by_product(spark.readStream.schema(ORDERS).csv(source))
    sink = MVSink(target, "revenue", **options)
    run_complete(view, sink, ckpt)
    return view, sink


def run_complete(view: DataFrame, sink: Any, ckpt: str) -> None:
    """Run the complete-mode query ``view`` on what its sources hold (availableNow) into
    ``sink``, checkpointed at ``ckpt``; fails on the query's error."""
    query = (
        view.writeStream.outputMode("complete")
        .foreachBatch(sink)
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None


def expected(spark: SparkSession, source: str) -> DataFrame:
    """What ``run_available``'s view holds once it has read every file in ``source``."""
    return revenue_by_product(spark.read.schema(ORDERS).csv(source))


def run(spark: SparkSession, source: str, ckpt: str, sink: Any, *, complete: bool = True) -> Any:
    """One availableNow run of a query over ``source`` into ``sink``, a file per batch; returns
    the query's exception, if any."""
    orders = spark.readStream.schema(ORDERS).option("maxFilesPerTrigger", 1).csv(source)
    if complete:
        writer = revenue_by_product(orders).writeStream.outputMode("complete")
    else:
        writer = orders.writeStream.outputMode("append")
    query = writer.foreachBatch(sink).option("checkpointLocation", ckpt).trigger(availableNow=True).start()
    try:
        query.awaitTermination(300)
    except Exception as exc:  # the query failed: what its sink raised is in the message
        return exc
    return query.exception()


# --- Kafka records of orders -----------------------------------------------------------------

ORDER = "order_id long, product string, amount long"


def parsed(raw: DataFrame, schema: str) -> DataFrame:
    """Kafka records whose values are JSON objects, as columns."""
    return raw.select(F.from_json(F.col("value").cast("string"), schema).alias("r")).select("r.*")


def revenue(orders: DataFrame) -> DataFrame:
    return orders.groupBy("product").agg(F.sum("amount").alias("revenue"), F.count(F.lit(1)).alias("orders"))


# --- A view of every type Delta partitions and Spark reads (tests/interop) --------------------


def view_sql(ids: range, tag: str = "") -> str:
    return (
        f"SELECT id, concat('n', id, '{tag}') AS name, id / 2 AS x, "
        "date_add(DATE'2026-01-01', CAST(id % 3 AS INT)) AS day, CAST(id * 1.25 AS DECIMAL(10,2)) AS amount, "
        "timestamp_micros(1767225600000000 + id) AS at "
        f"FROM range({ids.start}, {ids.stop})"
    )


def view(spark: SparkSession, ids: range, tag: str = "") -> DataFrame:
    return spark.sql(view_sql(ids, tag))


def feed_by_version(spark: SparkSession, target: str, cols: list[str]) -> dict[int, dict[str, Counter[Any]]]:
    """Delta's Change Data Feed of ``target`` from version 0, as multisets of rows per version
    and change type."""
    feed = (
        spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0).load(target)
    )
    out: dict[int, dict[str, Counter[Any]]] = {}
    table = to_arrow(feed)
    for version in set(table.column("_commit_version").to_pylist()):
        part = table.filter(pc.equal(table.column("_commit_version"), version))
        out[version] = {
            kind: multiset(part.filter(pc.equal(part.column("_change_type"), kind)), cols)
            for kind in ("delete", "insert", "update_preimage", "update_postimage")
        }
    return out


# --- Typed rows whose files hold distinct ranges of every column: readers' filters ------------

_LONG = "n" * 40
_PLACEHOLDER = "\x000\x00"  # once taken for a decimal by the stats' JSON
_DAY0 = dt.date(2024, 1, 1)
_T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
TYPED_SCHEMA = (
    "k long, flag boolean, ratio double, half float, edge double, name string, short string, "
    "bin binary, day date, stamp timestamp, amt decimal(10,2), ph string, "
    "nested struct<x: double, label: string>"
)


def _typed_row(k: int) -> tuple[Any, ...]:
    edge = {0: float("-inf"), 11: float("inf"), 6: -0.0, 7: 0.0}.get(k, k * 10.0)
    return (
        k,
        k % 2 == 0,
        k * 1.5 - 3,
        k / 2,
        edge,
        _LONG + chr(97 + k),
        f"s{k:02d}",
        bytes([k]),
        _DAY0 + dt.timedelta(days=k),
        _T0 + dt.timedelta(hours=k),
        decimal.Decimal(k) + decimal.Decimal("0.25"),
        _PLACEHOLDER if k == 5 else f"p{k}",
        (k * 1.0, _LONG + chr(97 + k)),
    )


TYPED_ROWS = [_typed_row(k) for k in range(12)]
TYPED_COLUMNS = [c.split()[0] for c in TYPED_SCHEMA.split(", ")[:12]] + ["nested"]


@dataclass(frozen=True)
class Filter:
    """A filter on the typed rows, as a pyarrow expression, as SQL and as Python."""

    name: str
    expression: ds.Expression
    sql: str
    keeps: Any  # the rows it keeps, by Python

    def expected(self) -> set[int]:
        return {r[0] for r in TYPED_ROWS if self.keeps(dict(zip(TYPED_COLUMNS, r, strict=True)))}


def _field(*path: str) -> Any:
    return ds.field(*path)


FILTERS = [
    Filter("boolean", _field("flag") == True, "flag = true", lambda r: r["flag"]),  # noqa: E712
    Filter("double below", _field("ratio") < 5.0, "ratio < 5.0", lambda r: r["ratio"] < 5.0),
    Filter("double above zero", _field("ratio") > 0.0, "ratio > 0.0", lambda r: r["ratio"] > 0),
    Filter("float", _field("half") >= 2.5, "half >= 2.5", lambda r: r["half"] >= 2.5),
    Filter("negative zero", _field("edge") == 0.0, "edge = 0.0", lambda r: r["edge"] == 0.0),
    Filter("infinity", _field("edge") > 1e308, "edge > 1e308", lambda r: r["edge"] > 1e308),
    Filter("-infinity", _field("edge") < -1e308, "edge < -1e308", lambda r: r["edge"] < -1e308),
    Filter(
        "long string", _field("name") == _LONG + "c", f"name = '{_LONG}c'", lambda r: r["name"] == _LONG + "c"
    ),
    Filter(
        "long string above",
        _field("name") > _LONG + "j",
        f"name > '{_LONG}j'",
        lambda r: r["name"] > _LONG + "j",
    ),
    Filter("short string", _field("short") == "s03", "short = 's03'", lambda r: r["short"] == "s03"),
    Filter("binary", _field("bin") == bytes([4]), "bin = unhex('04')", lambda r: r["bin"] == bytes([4])),
    Filter(
        "date",
        _field("day") >= _DAY0 + dt.timedelta(days=7),
        "day >= DATE '2024-01-08'",
        lambda r: r["day"] >= _DAY0 + dt.timedelta(days=7),
    ),
    Filter(
        "timestamp",
        _field("stamp") < _T0 + dt.timedelta(hours=5),
        "stamp < TIMESTAMP '2024-01-01 05:00:00'",
        lambda r: r["stamp"] < _T0 + dt.timedelta(hours=5),
    ),
    Filter(
        "decimal",
        _field("amt") == decimal.Decimal("3.25"),
        "amt = 3.25",
        lambda r: r["amt"] == decimal.Decimal("3.25"),
    ),
    Filter(
        "placeholder string",
        _field("ph") == _PLACEHOLDER,
        "ph = concat(chr(0), '0', chr(0))",
        lambda r: r["ph"] == _PLACEHOLDER,
    ),
    Filter("nested double", _field("nested", "x") > 8.0, "nested.x > 8.0", lambda r: r["nested"][0] > 8.0),
    Filter(
        "nested long string",
        _field("nested", "label") == _LONG + "b",
        f"nested.label = '{_LONG}b'",
        lambda r: r["nested"][1] == _LONG + "b",
    ),
]


def make_view(spark: Any, target: str) -> str:
    """The 12 typed rows, 3 to a file, clustered by ``k``: files hold distinct ranges of every column."""
    desired = spark.createDataFrame(TYPED_ROWS, TYPED_SCHEMA)
    report = MVSink(target, "typed", max_rows_per_file=3, cluster_by=["k"])(desired, 0)
    assert report.outcome == "committed"
    assert len(DeltaTable(target).file_uris()) == 4
    return target


def duckdb_keys(target: str, where: str) -> set[int]:
    """The ``k`` of the rows DuckDB's Delta reader (delta-kernel-rs) returns for ``where``."""
    import duckdb
    import duckdb_extension_delta

    folder = os.path.dirname(duckdb_extension_delta.__file__)
    (extension,) = glob.glob(os.path.join(folder, "extensions", "*", "delta.duckdb_extension"))
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    try:
        con.execute(f"LOAD '{extension}'")
        con.execute("SET TimeZone = 'UTC'")
        rows = con.execute(f"SELECT k FROM delta_scan('{target}') WHERE {where}").fetchall()
    finally:
        con.close()
    return {r[0] for r in rows}


# --- Fingerprints ----------------------------------------------------------------------------


def persisted_of(files: list[list[tuple[int, int]]]) -> Any:
    """The fingerprints of files holding these ``(a, b)`` rows, numbered in order."""
    import numpy as np

    from mvsink.table.fingerprint import Fingerprints  # imported here: one suite's internals

    flat = [(k, f, p) for f, rows in enumerate(files) for p, k in enumerate(rows)]
    return Fingerprints(
        a=np.array([k[0] for k, _, _ in flat], dtype=np.int64),
        b=np.array([k[1] for k, _, _ in flat], dtype=np.int64),
        file=np.array([f for _, f, _ in flat], dtype=np.int64),
        pos=np.array([p for _, _, p in flat], dtype=np.int64),
    )


def foreign_delete(target: str, predicate: str) -> None:
    """Delete rows of the target as another writer would (delta-rs's SQL-like predicate)."""
    DeltaTable(table_root(target)).delete(predicate)


# --- A view's history (history_target) -----------------------------------------------------------

LIFETIME = {
    "valid_from",
    "valid_to",
    "opened_version",
    "opened_epoch",
    "opened_by",
    "closed_version",
    "closed_epoch",
    "closed_by",
}
"""The columns a history row has after the view's."""


def lifetimes(history: str) -> list[dict[str, Any]]:
    """Every row of a history table, read with delta-rs (not mvsink)."""
    return DeltaTable(history).to_pyarrow_table().to_pylist()


def held_at(history: str, version: int) -> Counter:
    """The view at ``version`` as its history says, read with delta-rs (not mvsink)."""
    rows = [
        r
        for r in lifetimes(history)
        if r["opened_version"] <= version and (r["closed_version"] is None or r["closed_version"] > version)
    ]
    return Counter(tuple(v for k, v in r.items() if k not in LIFETIME) for r in rows)


def table_at(target: str, version: int) -> Counter:
    return multiset(target_table(target, version))


def history_frontier(history: str, view: str) -> int | None:
    from mvsink.table.record import HistoryKeys

    return DeltaTable(history).transaction_version(HistoryKeys(view).frontier)


def assert_holds_every_version(target: str, history: str, view: str, since: int = 0) -> None:
    """The history holds every version of the view's table, each as the table was then."""
    newest = DeltaTable(target).version()
    assert history_frontier(history, view) == newest + 1
    for v in range(since, newest + 1):
        assert held_at(history, v) == table_at(target, v), f"version {v}"


KEYED = "id long, v string, seq long, del boolean"
"""An upsert view's batches: key, value, sequence, delete mark (``keyed``)."""


def keyed(target: str, history: str, placement: str = "driver", **options: Any) -> MVSink:
    """Upsert view ``keyed`` (key ``id``, sequence ``seq``, delete column ``del``) keeping a
    history at ``history``."""
    return MVSink(
        target,
        "keyed",
        mode="upsert",
        key=["id"],
        sequence_column="seq",
        delete_column="del",
        history_target=history,
        placement=placement,
        **options,
    )


def late_folders(target: str, view: str = "keyed") -> list[str]:
    """The folders of late events an upsert view keeps for its history (``plan/late.py``)."""
    root = os.path.join(target, "_mvsink", view, "late")
    return sorted(os.listdir(root)) if os.path.isdir(root) else []
