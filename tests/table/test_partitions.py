"""Partitioned targets: escaping, nulls, every mode, and rewrites confined to touched partitions."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections import Counter
from collections.abc import Iterator
from urllib.parse import unquote

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from mvsink import ConfigError, InputError, MVSink
from mvsink.compat import to_arrow
from tests.delta_session import DELTA_LINE
from tests.helpers import (
    added,
    assert_equal_to,
    live_files,
    log_entry,
    multiset,
    removed,
    spark_read_listed,
    target_table,
    versions,
)

# Runs on both engines (tests/conftest.py: each line runs the engine it has).
pytestmark = pytest.mark.usefixtures("engine")

AWKWARD = ["plain", "with space", "é ü 東京", "a/b", "k=v", "50%", "x:y", "q?#[]{}*", None]


def test_awkward_partition_values_roundtrip_through_both_readers(spark, target):
    rows = [(i, AWKWARD[i % len(AWKWARD)], float(i)) for i in range(36)]
    desired = spark.createDataFrame(rows, "id long, region string, x double")
    sink = MVSink(target, "regions", partition_by=["region"])
    sink(desired, 0)
    assert DeltaTable(target).metadata().partition_columns == ["region"]
    assert_equal_to(target, desired)
    assert multiset(to_arrow(spark_read_listed(spark, target))) == multiset(to_arrow(desired))
    # Read back with its partition values joined in, every row fingerprints as desired does.
    same = sink(desired, 1)
    assert (same.inserted, same.retracted, same.files_added) == (0, 0, 0)
    # The index knows the files under escaped folders by the path the log lists.
    assert same.files_read == 0


def test_a_correction_rewrites_files_only_in_the_partitions_it_touches(spark, target, placement):
    rows = [(i, AWKWARD[i % len(AWKWARD)], float(i)) for i in range(36)]
    sink = MVSink(target, "touch", partition_by=["region"], placement=placement)
    sink(spark.createDataFrame(rows, "id long, region string, x double"), 0)
    changed = [(i, r, x + (1 if r == "é ü 東京" else 0)) for i, r, x in rows]
    desired = spark.createDataFrame(changed, "id long, region string, x double")
    report = sink(desired, 1)
    assert_equal_to(target, desired)
    actions = pa.table(DeltaTable(target, version=0).get_add_actions(flatten=False)).to_pylist()
    partition_of = {unquote(a["path"]): a["partition"]["region"] for a in actions}
    gone = removed(target, report.version)
    assert gone and {partition_of[p] for p in gone} == {"é ü 東京"}
    # Every added file sits under that partition's folder, and is listed with its value.
    new = pa.table(DeltaTable(target).get_add_actions(flatten=False)).to_pylist()
    fresh = [a for a in new if unquote(a["path"]) in set(added(target, report.version))]
    assert fresh and {a["partition"]["region"] for a in fresh} == {"é ü 東京"}


@pytest.mark.parametrize(
    "schema, rows",
    [
        (
            "n int, d date, flag boolean, v string",
            [(i % 3, dt.date(2024, 1, 1 + i % 2), i % 2 == 0, f"v{i}") for i in range(12)],
        ),
        (
            "n int, d date, flag boolean, v string",
            [(None, None, None, "nulls"), (1, dt.date(1999, 12, 31), True, "x")],
        ),
    ],
)
def test_typed_partition_columns(spark, target, placement, schema, rows):
    desired = spark.createDataFrame(rows, schema)
    sink = MVSink(target, "typed", partition_by=["n", "d", "flag"], placement=placement)
    sink(desired, 0)
    assert_equal_to(target, desired)
    assert sink(desired, 1).files_added == 0


def test_upsert_and_append_into_partitioned_targets(spark, target, placement, tmp_path):
    schema = "region string, id long, v string"
    up = MVSink(
        target, "up", mode="upsert", key=["region", "id"], partition_by=["region"], placement=placement
    )
    up(spark.createDataFrame([("eu west", 1, "a"), ("us", 1, "b"), ("50%", 2, "c")], schema), 0)
    files_before = live_files(target)
    report = up(spark.createDataFrame([("eu west", 1, "A"), ("東京", 3, "d")], schema), 1)
    assert multiset(target_table(target)) == Counter(
        [("eu west", 1, "A"), ("us", 1, "b"), ("50%", 2, "c"), ("東京", 3, "d")]
    )
    assert report.files_read == 1  # only the "eu west" partition can hold a touched key
    assert len(set(removed(target, report.version)) & files_before) == 1
    log = str(tmp_path / "log")
    app = MVSink(log, "app", mode="append", partition_by=["region"], placement=placement)
    app(spark.createDataFrame([("a b", 1, "x"), (None, 2, "y")], schema), 0)
    app(spark.createDataFrame([("a b", 1, "x")], schema), 1)
    assert multiset(target_table(log)) == Counter([("a b", 1, "x"), ("a b", 1, "x"), (None, 2, "y")])


def test_partition_by_that_differs_from_the_target_is_refused(spark, target):
    desired = spark.createDataFrame([("a", 1)], "region string, id long")
    MVSink(target, "p", partition_by=["region"])(desired, 0)
    with pytest.raises(ConfigError, match="partitioned by \\['region'\\]"):
        MVSink(target, "p", partition_by=["id"])(desired, 1)
    with pytest.raises(ConfigError):
        MVSink(target, "p", partition_by=[])(desired, 1)
    assert versions(target) == [0]
    MVSink(target, "p", heartbeat=0)(desired, 1)  # no option: the target's partitioning is kept
    assert versions(target) == [0, 1]


@pytest.mark.parametrize(
    "rows, options, message",
    [
        ([("", 1)], {"partition_by": ["region"]}, "empty string in partition"),
        ([("a", 1)], {"partition_by": ["nope"]}, "'partition_by' names 'nope'"),
        ([("a", 1)], {"partition_by": ["region", "id"]}, "every column is a partition column"),
    ],
)
def test_bad_partitioning_is_refused_before_anything_is_written(spark, target, rows, options, message):
    with pytest.raises(InputError, match=message):
        MVSink(target, "bad", **options)(spark.createDataFrame(rows, "region string, id long"), 0)
    assert not DeltaTable.is_deltatable(target)


def test_float_partition_columns_are_refused(spark, target):
    with pytest.raises(InputError, match="partition by string, integer, date or boolean"):
        MVSink(target, "f", partition_by=["x"])(spark.createDataFrame([(1.5, 1)], "x double, id long"), 0)


def test_partition_column_names_that_need_escaping(spark, target):
    name = "a:b%c#d?e[f"
    schema = f"id long, `{name}` string, x double"
    sink = MVSink(target, "names", partition_by=[name], max_rows_per_file=2)
    sink(spark.createDataFrame([(i, f"p{i % 3}", float(i)) for i in range(9)], schema), 0)
    desired = spark.createDataFrame([(i, f"p{i % 3}", float(i)) for i in range(3, 12)], schema)
    report = sink(desired, 1)
    assert report.files_removed > 0
    assert DeltaTable(target).metadata().partition_columns == [name]
    assert_equal_to(target, desired)
    assert multiset(to_arrow(spark_read_listed(spark, target))) == multiset(to_arrow(desired))


@contextlib.contextmanager
def session_time_zone(spark: SparkSession, zone: str) -> Iterator[None]:
    """The shared session in another time zone for the block (restored after)."""
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        yield
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)


def test_timestamp_partition_values_name_their_zone_for_readers_outside_utc(spark, target, placement):
    """A target another writer partitioned by a ``timestamp`` (and a ``timestamp_ntz``):
    mvsink writes the ``timestamp`` values in UTC with ``Z``, which Spark resolves alike in
    every session time zone (an offset-less one it resolves in the session's), the
    ``timestamp_ntz`` ones as wall clocks; and reads back the other writer's offset-less
    values and its own."""
    utc = dt.UTC
    foreign = pa.table(
        {
            "id": pa.array([1], pa.int64()),
            "t": pa.array([dt.datetime(2021, 6, 1, 12, 30, tzinfo=utc)], pa.timestamp("us", tz="UTC")),
            "n": pa.array([dt.datetime(2021, 6, 1, 12, 30)], pa.timestamp("us")),
            "v": pa.array(["a"]),
        }
    )
    write_deltalake(target, foreign, partition_by=["t", "n"])
    rows = [
        (1, dt.datetime(2021, 6, 1, 12, 30, tzinfo=utc), dt.datetime(2021, 6, 1, 12, 30), "a"),
        (2, dt.datetime(2021, 6, 1, 23, 30, 0, 5, tzinfo=utc), dt.datetime(2021, 6, 1, 23, 30), "b"),
        (3, dt.datetime(2021, 12, 31, 23, 59, 59, tzinfo=utc), dt.datetime(2021, 12, 31, 23, 59, 59), "c"),
        (4, None, None, "d"),
    ]
    schema = "id long, t timestamp, n timestamp_ntz, v string"
    epoch = dt.datetime(1970, 1, 1, tzinfo=utc)
    micros = {r[0]: None if r[1] is None else (r[1] - epoch) // dt.timedelta(microseconds=1) for r in rows}
    with session_time_zone(spark, "America/Los_Angeles"):
        desired = spark.createDataFrame(rows, schema)
        sink = MVSink(target, "stamps", placement=placement, take_over="foreign")
        first = sink(desired, 0)
        # The other writer's row was read at its instant: kept, not retracted and inserted again.
        assert (first.inserted, first.retracted) == (3, 0)
        assert_equal_to(target, desired)
        values = [a["add"]["partitionValues"] for a in log_entry(target, first.version) if "add" in a]
        assert values and all(v["t"] is None or v["t"].endswith("Z") for v in values)
        assert all(v["n"] is None or not v["n"].endswith("Z") for v in values)
        # Spark resolves each string as a reader does, in the session's zone: the rows' values.
        raw = spark.createDataFrame([(v["t"], v["n"]) for v in values], "t string, n string")
        seen = raw.select(
            F.unix_micros(F.col("t").cast("timestamp")).alias("t"),
            F.col("n").cast("timestamp_ntz").cast("string").alias("n"),
        ).collect()
        want = {(micros[r[0]], None if r[2] is None else str(r[2])) for r in rows[1:]}
        assert {(s["t"], s["n"]) for s in seen} == want
        if DELTA_LINE:  # Spark's own Delta reader, in this zone: the values, and the right partitions
            table = spark.read.format("delta").load(target)
            held = dict(table.select("id", F.unix_micros("t").alias("t")).collect())
            assert {i: held[i] for i in (2, 3, 4)} == {i: micros[i] for i in (2, 3, 4)}
            # (The other writer's offset-less value is the hazard itself: read 7 hours off.)
            assert held[1] == micros[1] + 7 * 3600 * 10**6
            for i, stamp in [(r[0], r[1]) for r in rows[1:] if r[1] is not None]:
                picked = table.where(F.col("t") == F.lit(stamp)).select("id").collect()
                assert [r["id"] for r in picked] == [i]
        # mvsink reads its own values back: nothing changes.
        again = sink(desired, 1)
        assert (again.inserted, again.retracted, again.files_added) == (0, 0, 0)
