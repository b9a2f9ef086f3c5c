"""Row fingerprints: equal rows hash equal wherever they come from; different rows do not."""

from __future__ import annotations

import datetime as dt
import decimal
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from mvsink.compat import to_arrow
from mvsink.fingerprint import fingerprints
from mvsink.schema import arrow_schema, target_schema_json, target_struct

SCHEMA = pa.schema(
    [
        ("i", pa.int64()),
        ("s", pa.string()),
        ("f", pa.float64()),
        ("l", pa.list_(pa.list_(pa.int32()))),
        ("m", pa.map_(pa.string(), pa.int64())),
        ("st", pa.struct([("a", pa.int32()), ("b", pa.string())])),
        ("bin", pa.binary()),
        ("dec", pa.decimal128(20, 3)),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("d", pa.date32()),
        ("flag", pa.bool_()),
    ]
)

texts = st.one_of(st.none(), st.text(max_size=20))
row = st.fixed_dictionaries(
    {
        "i": st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
        "s": texts,
        "f": st.one_of(st.none(), st.floats(allow_nan=True)),
        "l": st.one_of(
            st.none(), st.lists(st.one_of(st.none(), st.lists(st.integers(-5, 5), max_size=3)), max_size=3)
        ),
        "m": st.one_of(
            st.none(),
            st.dictionaries(st.text(max_size=3), st.one_of(st.none(), st.integers(-3, 3)), max_size=3).map(
                lambda d: list(d.items())
            ),
        ),
        "st": st.one_of(
            st.none(), st.fixed_dictionaries({"a": st.one_of(st.none(), st.integers(-3, 3)), "b": texts})
        ),
        "bin": st.one_of(st.none(), st.binary(max_size=12)),
        "dec": st.one_of(st.none(), st.decimals(-(10**10), 10**10, places=3)),
        "ts": st.one_of(st.none(), st.datetimes(timezones=st.just(dt.UTC))),
        "d": st.one_of(st.none(), st.dates()),
        "flag": st.one_of(st.none(), st.booleans()),
    }
)


def canonical(r: dict[str, object]) -> object:
    """mvsink's row equality, as a hashable value: NaN equals NaN, -0.0 equals 0.0, map entry
    order does not matter."""

    def c(v: object) -> object:
        if isinstance(v, float):
            return "NaN" if math.isnan(v) else v + 0.0
        if isinstance(v, list) and v and isinstance(v[0], tuple):
            return ("map", frozenset((k, c(x)) for k, x in v))
        if isinstance(v, list):
            return tuple(c(x) for x in v)
        if isinstance(v, dict):
            return tuple((k, c(x)) for k, x in v.items())
        if isinstance(v, decimal.Decimal):
            return ("dec", v.normalize())
        return v

    return tuple((k, c(r[k])) for k in SCHEMA.names)


@settings(max_examples=60, deadline=None)
@given(st.lists(row, min_size=1, max_size=30), st.integers(0, 29))
def test_equal_rows_hash_equal_and_different_rows_differently(rows, cut):
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    a, b = fingerprints(table)
    got: dict[tuple[int, int], object] = {}
    for k, r in enumerate(rows):
        key = canonical(r)
        assert got.setdefault((int(a[k]), int(b[k])), key) == key, "two different rows share a fingerprint"
    distinct_rows = {canonical(r) for r in rows}
    assert len(set(zip(a.tolist(), b.tolist(), strict=True))) == len(distinct_rows)
    # Layout does not matter: a slice, and the same rows in several chunks, hash alike.
    cut = min(cut, len(rows))
    chunked = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    ca, cb = fingerprints(chunked)
    assert np.array_equal(ca, a) and np.array_equal(cb, b)
    sa, _ = fingerprints(table.slice(cut))
    assert np.array_equal(sa, a[cut:])


def test_structurally_close_rows_differ():
    def fp(rows: list[dict[str, object]], schema: pa.Schema) -> set[tuple[int, int]]:
        a, b = fingerprints(pa.Table.from_pylist(rows, schema=schema))
        return set(zip(a.tolist(), b.tolist(), strict=True))

    two = pa.schema([("x", pa.int64()), ("y", pa.int64())])
    assert len(fp([{"x": 1, "y": None}, {"x": None, "y": 1}], two)) == 2
    nested = pa.schema([("l", pa.list_(pa.list_(pa.int64())))])
    assert len(fp([{"l": [[1], [2]]}, {"l": [[1, 2]]}, {"l": [[], [1, 2]]}, {"l": None}], nested)) == 4
    text = pa.schema([("s", pa.string()), ("t", pa.string())])
    pairs = [("ab", "c"), ("a", "bc"), ("", "abc"), (None, "abc"), ("abcdefgh", ""), ("abcdefgh\x00", None)]
    assert len(fp([{"s": s, "t": t} for s, t in pairs], text)) == len(pairs)
    maps = pa.schema([("m", pa.map_(pa.string(), pa.int64()))])
    assert len(fp([{"m": [("a", 1), ("b", 2)]}, {"m": [("b", 2), ("a", 1)]}], maps)) == 1
    assert len(fp([{"m": [("a", 2), ("b", 1)]}, {"m": [("a", 1), ("b", 2)]}], maps)) == 2


def test_rows_read_from_a_spark_written_file_hash_like_rows_collected_from_spark(spark, tmp_path):
    from pyspark.sql import functions as F

    df = spark.range(500).select(
        F.col("id"),
        F.when(F.col("id") % 3 == 0, None)
        .otherwise(F.concat(F.lit("n-"), F.col("id").cast("string")))
        .alias("s"),
        (F.col("id") / 7).alias("x"),
        F.array(F.col("id"), F.lit(None).cast("long")).alias("arr"),
        F.create_map(F.lit("k"), F.col("id")).alias("m"),
        F.struct(F.col("id").alias("a"), F.lit("z").alias("b")).alias("st"),
        F.timestamp_micros(F.col("id") * 1_000_003).alias("ts"),
        F.to_date(F.lit("2024-02-29")).alias("d"),
        (F.col("id") * 1.5).cast("decimal(12,2)").alias("dec"),
    )
    schema = arrow_schema(target_struct(target_schema_json(df.schema)))
    collected = to_arrow(df).cast(schema)
    spark.conf.set("spark.sql.parquet.outputTimestampType", "INT96")  # a foreign writer's choice
    try:
        df.coalesce(1).write.parquet(str(tmp_path / "spark"))
    finally:
        spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    files = sorted((tmp_path / "spark").glob("*.parquet"))
    read = pa.concat_tables([pq.read_table(f) for f in files]).select(schema.names).cast(schema)
    order_c = np.argsort(collected.column("id").to_numpy())
    order_r = np.argsort(read.column("id").to_numpy())
    ca, cb = fingerprints(collected)
    ra, rb = fingerprints(read)
    assert np.array_equal(ca[order_c], ra[order_r]) and np.array_equal(cb[order_c], rb[order_r])


def test_a_dotted_column_beside_a_struct_gets_no_statistics_it_could_be_confused_with():
    import json

    from mvsink.stats import metadata_stats

    table = pa.table(
        {
            "a.b": pa.array([None, None, 1], pa.int64()),
            "a": pa.array([{"b": None}, {"b": 7}, {"b": 8}], pa.struct([("b", pa.int64())])),
            "c": pa.array([1, 2, 3], pa.int64()),
        }
    )
    sink = pa.BufferOutputStream()
    writer = pq.ParquetWriter(sink, table.schema)
    writer.write_table(table)
    writer.close()
    n, text = metadata_stats(writer.writer.metadata)
    stats = json.loads(text)
    assert n == 3 and stats["maxValues"] == {"c": 3} and stats["nullCount"] == {"c": 0}
