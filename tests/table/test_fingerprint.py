"""Row fingerprints: equal rows hash equal wherever they come from; different rows do not; and
Spark's evaluation of the definition (``spark_lanes``) equals numpy's (``fingerprints``)."""

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
from mvsink.table.fingerprint import FP_A, FP_B, fingerprints, spark_lanes
from mvsink.table.schema import arrow_schema, target_schema_json, target_struct

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
    # Another writer's map may repeat an entry: repeats count, they do not cancel.
    assert len(fp([{"m": [("a", 1), ("a", 1)]}, {"m": [("b", 2), ("b", 2)]}, {"m": [("a", 1)]}], maps)) == 3


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

    from mvsink.table.stats import metadata_stats

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


# Every type a table may hold, nested every way Spark nests them, for Spark against numpy.
EVERY_TYPE = pa.schema(
    [
        ("i8", pa.int8()),
        ("i16", pa.int16()),
        ("i32", pa.int32()),
        ("i64", pa.int64()),
        ("f32", pa.float32()),
        ("f64", pa.float64()),
        ("flag", pa.bool_()),
        ("s", pa.string()),
        ("bin", pa.binary()),
        ("dec", pa.decimal128(12, 2)),
        ("wide_dec", pa.decimal128(38, 4)),
        ("d", pa.date32()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("ntz", pa.timestamp("us")),
        ("l", pa.list_(pa.list_(pa.int32()))),
        ("ls", pa.list_(pa.struct([("a", pa.string()), ("b", pa.list_(pa.float64()))]))),
        ("m", pa.map_(pa.string(), pa.struct([("x", pa.int64()), ("y", pa.string())]))),
        ("mi", pa.map_(pa.int32(), pa.list_(pa.string()))),
        ("lm", pa.list_(pa.map_(pa.string(), pa.int16()))),
        ("st", pa.struct([("a", pa.int32()), ("n", pa.struct([("s", pa.string()), ("f", pa.float32())]))])),
    ]
)


def _maybe(strategy):
    return st.one_of(st.none(), strategy)


_text = st.text(max_size=90)  # past 32 bytes (XXH64's stripes) and across 8- and 4-byte tails
_floats = st.one_of(st.floats(allow_nan=True), st.sampled_from([0.0, -0.0, float("nan"), float("inf")]))
_f32 = st.one_of(st.floats(width=32, allow_nan=True), st.sampled_from([0.0, -0.0, float("nan")]))
every_row = st.fixed_dictionaries(
    {
        "i8": _maybe(st.integers(-128, 127)),
        "i16": _maybe(st.integers(-(2**15), 2**15 - 1)),
        "i32": _maybe(st.integers(-(2**31), 2**31 - 1)),
        "i64": _maybe(st.integers(-(2**63), 2**63 - 1)),
        "f32": _maybe(_f32),
        "f64": _maybe(_floats),
        "flag": _maybe(st.booleans()),
        "s": _maybe(_text),
        "bin": _maybe(st.binary(max_size=70)),
        "dec": _maybe(st.decimals(-(10**9), 10**9, places=2)),
        "wide_dec": _maybe(st.decimals(-(10**33) + 1, 10**33 - 1, places=4)),
        "d": _maybe(st.dates()),
        "ts": _maybe(st.datetimes(timezones=st.just(dt.UTC))),
        "ntz": _maybe(st.datetimes()),
        "l": _maybe(st.lists(_maybe(st.lists(_maybe(st.integers(-5, 5)), max_size=3)), max_size=3)),
        "ls": _maybe(
            st.lists(
                _maybe(
                    st.fixed_dictionaries(
                        {"a": _maybe(_text), "b": _maybe(st.lists(_maybe(_floats), max_size=3))}
                    )
                ),
                max_size=3,
            )
        ),
        "m": _maybe(
            st.dictionaries(
                st.text(max_size=40),
                _maybe(st.fixed_dictionaries({"x": _maybe(st.integers(-9, 9)), "y": _maybe(_text)})),
                max_size=3,
            ).map(lambda d: list(d.items()))
        ),
        "mi": _maybe(
            st.dictionaries(st.integers(-3, 3), _maybe(st.lists(_maybe(_text), max_size=2)), max_size=3).map(
                lambda d: list(d.items())
            )
        ),
        "lm": _maybe(
            st.lists(
                _maybe(
                    st.dictionaries(st.text(max_size=3), _maybe(st.integers(-3, 3)), max_size=2).map(
                        lambda d: list(d.items())
                    )
                ),
                max_size=2,
            )
        ),
        "st": _maybe(
            st.fixed_dictionaries(
                {
                    "a": _maybe(st.integers(-3, 3)),
                    "n": _maybe(st.fixed_dictionaries({"s": _maybe(_text), "f": _maybe(_f32)})),
                }
            )
        ),
    }
)


@settings(max_examples=12, deadline=None)
@given(st.lists(every_row, min_size=1, max_size=80))
def test_spark_computes_the_same_fingerprints_as_numpy_for_every_type(spark, rows):
    import tempfile

    table = pa.Table.from_pylist(rows, schema=EVERY_TYPE)
    with tempfile.TemporaryDirectory() as folder:
        pq.write_table(
            table.append_column("__i", pa.array(range(len(rows)), pa.int64())), f"{folder}/r.parquet"
        )
        df = spark.read.option("datetimeRebaseMode", "CORRECTED").parquet(folder)
        struct = target_struct(target_schema_json(df.drop("__i").schema))
        got = to_arrow(df.select("__i", *spark_lanes(struct))).sort_by("__i")
    schema = arrow_schema(struct)
    assert schema.names == EVERY_TYPE.names
    a, b = fingerprints(table.cast(schema))
    assert got.column(FP_A).to_pylist() == a.tolist()
    assert got.column(FP_B).to_pylist() == b.tolist()


def test_spark_and_numpy_agree_on_chunked_sliced_and_dictionary_encoded_columns(spark, tmp_path):
    # Layout never matters: Arrow hands numpy offsets, chunks and dictionaries.
    names = pa.array(["x" * (i % 50) + str(i) for i in range(300)])
    table = pa.table({"s": names, "k": pa.array(range(300), pa.int64())})
    pq.write_table(table, tmp_path / "r.parquet")
    df = spark.read.option("datetimeRebaseMode", "CORRECTED").parquet(str(tmp_path))
    struct = target_struct(target_schema_json(df.schema))
    got = to_arrow(df.select(*spark_lanes(struct), "k")).sort_by("k")
    encoded = pa.table({"s": names.dictionary_encode(), "k": table.column("k")})
    for variant in (table, encoded, pa.concat_tables([table.slice(0, 7), table.slice(7)])):
        a, _ = fingerprints(variant.cast(arrow_schema(struct)))
        assert a.tolist() == got.column(FP_A).to_pylist()


def test_near_misses_stay_apart_and_equal_values_meet_in_spark(spark, tmp_path):
    def fp(rows: list[dict[str, object]], schema: pa.Schema) -> list[tuple[int, int]]:
        folder = tmp_path / f"t{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        table = pa.Table.from_pylist(rows, schema=schema)
        pq.write_table(table.append_column("__i", pa.array(range(len(rows)))), folder / "r.parquet")
        df = spark.read.option("datetimeRebaseMode", "CORRECTED").parquet(str(folder))
        struct = target_struct(target_schema_json(df.drop("__i").schema))
        got = to_arrow(df.select("__i", *spark_lanes(struct))).sort_by("__i")
        spark_fps = list(zip(got.column(FP_A).to_pylist(), got.column(FP_B).to_pylist(), strict=True))
        a, b = fingerprints(table.cast(arrow_schema(struct)))
        assert spark_fps == list(zip(a.tolist(), b.tolist(), strict=True))
        return spark_fps

    lists = pa.schema([("l", pa.list_(pa.int64())), ("m", pa.int64())])
    got = fp(
        [
            {"l": [None], "m": 1},
            {"l": [], "m": 1},
            {"l": None, "m": 1},
            {"l": [1], "m": None},
            {"l": [None, 1], "m": None},
        ],
        lists,
    )
    assert len(set(got)) == 5
    structs = pa.schema([("s", pa.struct([("a", pa.int64()), ("b", pa.int64())]))])
    got = fp(
        [{"s": None}, {"s": {"a": None, "b": None}}, {"s": {"a": 1, "b": None}}, {"s": {"a": None, "b": 1}}],
        structs,
    )
    assert len(set(got)) == 4
    maps = pa.schema([("m", pa.map_(pa.string(), pa.int64()))])
    got = fp(
        [
            {"m": []},
            {"m": None},
            {"m": [("a", 1), ("b", 2)]},
            {"m": [("b", 2), ("a", 1)]},
            {"m": [("a", 2), ("b", 1)]},
        ],
        maps,
    )
    assert len(set(got)) == 4 and got[2] == got[3]
    floats = pa.schema([("f", pa.float64()), ("g", pa.float32())])
    got = fp(
        [
            {"f": 0.0, "g": 0.0},
            {"f": -0.0, "g": -0.0},
            {"f": float("nan"), "g": float("nan")},
            {"f": -float("nan"), "g": -float("nan")},  # another NaN bit pattern
            {"f": float("nan"), "g": None},
        ],
        floats,
    )
    assert got[0] == got[1] and got[2] == got[3] and len(set(got)) == 3


def test_arrays_of_only_null_elements_read_by_spark_hash_like_numpy(spark, tmp_path):
    # Parquet stores such a column chunk with an empty dictionary, which Spark 4's generated code
    # for a lambda over the array reads a null element's value from, and fails on.
    schema = pa.schema([("a", pa.list_(pa.int32())), ("l", pa.list_(pa.list_(pa.string())))])
    rows = [{"a": [None], "l": [[None]]}, {"a": [None, None], "l": [[], [None, None]]}, {"a": [], "l": None}]
    table = pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table.append_column("__i", pa.array(range(len(rows)))), tmp_path / "r.parquet")
    df = spark.read.option("datetimeRebaseMode", "CORRECTED").parquet(str(tmp_path))
    struct = target_struct(target_schema_json(df.drop("__i").schema))
    got = to_arrow(df.select("__i", *spark_lanes(struct))).sort_by("__i")
    a, b = fingerprints(table.cast(arrow_schema(struct)))
    assert got.column(FP_A).to_pylist() == a.tolist() and got.column(FP_B).to_pylist() == b.tolist()
    assert len(set(a.tolist())) == 3
