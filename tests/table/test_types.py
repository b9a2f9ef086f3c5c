"""Every type Delta supports roundtrips and compares correctly, nulls and nesting included."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pyarrow.parquet
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from mvsink import MVSink
from mvsink.compat import to_arrow
from tests.helpers import added, assert_equal_to, multiset, spark_read_listed

ALL_TYPES = (
    "b byte, sh short, i int, l long, f float, d double, dec decimal(20,4), s string, "
    "bin binary, flag boolean, day date, ts timestamp, ntz timestamp_ntz, "
    "arr array<int>, nested array<array<string>>, m map<string,int>, "
    "st struct<a:int,b:string,c:array<double>>, "
    "deep struct<m:map<int,struct<x:long>>,l:array<map<string,string>>>"
)


def row(k: int) -> tuple[object, ...]:
    return (
        k % 100,
        k * 7,
        k * 1000,
        k * 10**12,
        k / 3,
        k / 7,
        decimal.Decimal(f"{k}.1234"),
        f"s{k}é",
        bytes([k % 256, 0, 255]),
        k % 2 == 0,
        dt.date(2020, 1, 1) + dt.timedelta(days=k),
        dt.datetime(2024, 5, 1, 12, 0, 0, k * 1001, tzinfo=dt.UTC),
        dt.datetime(2024, 5, 1, 12, 0, 0, k * 999),
        [k, None, k + 1],
        [["a", None], [], None],
        {"x": k, "y": None},
        (k, None, [1.5, None]),
        ({k: (k,), k + 1: None}, [{"k": "v"}, None]),
    )


NULLS = (None,) * 18


def test_all_types_roundtrip_and_an_unchanged_epoch_writes_nothing(
    spark: SparkSession, target: str, placement
) -> None:
    rows = [row(k) for k in range(20)] + [NULLS, NULLS]
    desired = spark.createDataFrame(rows, ALL_TYPES)
    sink = MVSink(target, "types", max_rows_per_file=7, placement=placement)
    sink(desired, 0)
    assert_equal_to(target, desired)
    assert multiset(to_arrow(spark_read_listed(spark, target))) == multiset(to_arrow(desired))
    # Read back from Parquet, every row fingerprints exactly as desired does.
    same = sink(spark.createDataFrame(list(reversed(rows)), ALL_TYPES), 1)
    assert (same.inserted, same.retracted, same.files_added) == (0, 0, 0)


def test_a_change_deep_inside_a_value_is_one_retraction_and_one_insert(spark, target, placement):
    rows = [row(k) for k in range(10)]
    sink = MVSink(target, "deep", placement=placement)
    sink(spark.createDataFrame(rows, ALL_TYPES), 0)
    changed = list(rows)
    r = list(changed[4])
    r[17] = ({4: (5,), 5: None}, [{"k": "v"}, None])  # one long inside a map inside a struct
    changed[4] = tuple(r)
    r = list(changed[6])
    r[15] = {"y": None, "x": 6}  # the same map, entries in another order: no change
    changed[6] = tuple(r)
    desired = spark.createDataFrame(changed, ALL_TYPES)
    report = sink(desired, 1)
    assert (report.inserted, report.retracted) == (1, 1)
    assert_equal_to(target, desired)


def test_rows_that_plain_spark_hashing_confuses_stay_distinct(spark, target, placement):
    # xxhash64 skips nulls and ignores array boundaries: each pair below hashes alike there.
    schema = "a int, b int, arr array<array<int>>, s struct<x:string,y:string>, m map<string,string>"
    pairs = [
        ((1, None, None, None, None), (None, 1, None, None, None)),
        ((0, 0, [[1], [2]], None, None), (0, 0, [[1, 2]], None, None)),
        ((0, 0, [[1, 2], []], None, None), (0, 0, [[], [1, 2]], None, None)),
        ((0, 0, None, ("a", None), None), (0, 0, None, (None, "a"), None)),
        ((0, 0, [], None, None), (0, 0, None, None, None)),
        ((0, 0, None, None, {"k": None}), (0, 0, None, None, {})),
        ((0, 0, None, None, {"a": "b"}), (0, 0, None, None, {"b": "a"})),
    ]
    # Every first row, then every second row: had any two rows the same fingerprint, the
    # second epoch would find it already held and change fewer than all seven.
    sink = MVSink(target, "collide", placement=placement)
    sink(spark.createDataFrame([first for first, _ in pairs], schema), 0)
    report = sink(spark.createDataFrame([second for _, second in pairs], schema), 1)
    assert (report.inserted, report.retracted) == (len(pairs), len(pairs))
    assert_equal_to(target, spark.createDataFrame([second for _, second in pairs], schema))


def test_stats_bound_the_data_so_readers_can_skip_files(spark, target):
    rows = [row(k) for k in range(30)]
    desired = spark.createDataFrame(rows, ALL_TYPES)
    MVSink(target, "stats", max_rows_per_file=10)(desired, 0)
    table = DeltaTable(target)
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert len(actions) == len(added(target, 0)) >= 3  # at most 10 rows a file
    for a in actions:
        data = pa.parquet.read_table(f"{target}/{a['path']}")
        assert a["num_records"] == data.num_rows
        for col in ("i", "l", "dec", "day", "ts", "sh", "b"):
            values = [v for v in data.column(col).to_pylist() if v is not None]
            assert a[f"min.{col}"] is not None
            assert a[f"min.{col}"] <= min(values) and max(values) <= a[f"max.{col}"], col
        assert a["null_count.i"] == 0
    # A filtered read (which prunes by these stats) finds exactly the matching rows.
    got = table.to_pyarrow_table(filters=[("i", ">=", 25000)]).num_rows
    assert got == 5
