"""Pruning by file statistics never skips a file that holds a touched key, even when another
writer truncated the statistics (timestamps to milliseconds, strings to a prefix)."""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.transaction import AddAction
from hypothesis import given, settings
from hypothesis import strategies as st

from mvsink import MVSink
from mvsink.plan.prune import candidate_files
from mvsink.table.delta import DataFile, Snapshot
from tests.helpers import multiset, put_parquet, target_table

UTC = dt.UTC


def test_an_upsert_on_a_timestamp_key_finds_rows_behind_truncated_bounds(spark, target):
    sink = MVSink(target, "ts", mode="upsert", key=["at"], max_rows_per_file=1)
    t1 = dt.datetime(2024, 1, 1, 12, 0, 0, 500, tzinfo=UTC)  # sub-millisecond, the files' max
    t2 = dt.datetime(2024, 1, 1, 11, 0, 0, 0, tzinfo=UTC)
    sink(spark.createDataFrame([(t1, "one"), (t2, "two")], "at timestamp, v string"), 0)
    # delta-rs rewrites the files and records the max of t1 as 12:00:00.000, below t1.
    assert DeltaTable(target).optimize.compact()["numFilesRemoved"] == 2
    sink(spark.createDataFrame([(t1, "ONE")], "at timestamp, v string"), 1)
    got = Counter(r["v"] for r in target_table(target).to_pylist())
    assert got == Counter(["ONE", "two"])


def test_an_upsert_on_a_string_key_finds_rows_behind_a_prefix_max(spark, target):
    sink = MVSink(target, "str", mode="upsert", key=["k"])
    sink(spark.createDataFrame([("a", 1)], "k string, v long"), 0)
    # Another writer adds a file whose max statistic is a prefix of its real max, as writers
    # that truncate long strings record it.
    path = "foreign-part-0.parquet"
    size = put_parquet(target, path, pa.table({"k": ["abc-longer"], "v": pa.array([2], pa.int64())}))
    stats = {"numRecords": 1, "minValues": {"k": "abc"}, "maxValues": {"k": "abc"}, "nullCount": {"k": 0}}
    dtable = DeltaTable(target)
    dtable.create_write_transaction(
        [AddAction(path, size, {}, 0, True, json.dumps(stats))], mode="append", schema=dtable.schema()
    )
    sink(spark.createDataFrame([("abc-longer", 3)], "k string, v long"), 1)
    assert multiset(target_table(target)) == Counter([("a", 1), ("abc-longer", 3)])


def _snapshot(lo: list[int | None], hi: list[int | None], parts: list[str] | None) -> Snapshot:
    files = tuple(
        DataFile(f"f{i}", 1, 1, {"p": parts[i]} if parts is not None else {}) for i in range(len(lo))
    )
    stats = pa.table({"min.k": pa.array(lo, pa.int64()), "max.k": pa.array(hi, pa.int64())})
    return Snapshot("/t", 1, None, None, ("p",) if parts is not None else (), files, stats=stats)


@settings(max_examples=200, deadline=None)
@given(
    files=st.lists(
        st.tuples(st.integers(-50, 50), st.integers(0, 20), st.booleans(), st.sampled_from(["x", "y"])),
        max_size=12,
    ),
    keys=st.lists(st.tuples(st.integers(-60, 60), st.sampled_from(["x", "y", "z"])), max_size=15),
    partitioned=st.booleans(),
)
def test_pruning_keeps_exactly_the_files_whose_bounds_admit_a_key(files, keys, partitioned):
    lo = [None if unknown else start for start, _, unknown, _ in files]
    hi = [None if unknown else start + width for start, width, unknown, _ in files]
    parts = [p for *_, p in files] if partitioned else None
    snap = _snapshot(lo, hi, parts)
    key_cols = ["p", "k"] if partitioned else ["k"]
    table = pa.table({"k": pa.array([k for k, _ in keys], pa.int64()), "p": [p for _, p in keys]})
    got = candidate_files(snap, table, key_cols)
    want = [
        i
        for i in range(len(files))
        if any(
            (lo[i] is None or lo[i] <= k <= hi[i]) and (not partitioned or parts[i] == p)  # type: ignore[operator,index]
            for k, p in keys
        )
    ]
    assert got == want


def _typed_snapshot(lo: pa.Array, hi: pa.Array, parts: list[str | None] | None = None) -> Snapshot:
    files = tuple(DataFile(f"f{i}", 1, 1, {"p": parts[i]} if parts else {}) for i in range(len(lo)))
    return Snapshot(
        "/t", 1, None, None, ("p",) if parts else (), files, stats=pa.table({"min.k": lo, "max.k": hi})
    )


def test_bounds_at_the_ends_of_int64_do_not_wrap_around():
    top, bottom = 2**63 - 1, -(2**63)
    snap = _typed_snapshot(pa.array([1, bottom], pa.int64()), pa.array([top, 5], pa.int64()))
    for k in (1, top, bottom, 5):
        got = candidate_files(snap, pa.table({"k": pa.array([k], pa.int64())}), ["k"])
        assert got == [i for i, (lo, hi) in enumerate([(1, top), (bottom, 5)]) if lo <= k <= hi]


def test_decimal_bounds_prune_nothing():
    # delta-rs records decimal bounds through a float: 1234567890123456.78 becomes ...456.80.
    import decimal

    t = pa.decimal128(18, 2)
    snap = _typed_snapshot(
        pa.array([decimal.Decimal("1234567890123456.80")], t),
        pa.array([decimal.Decimal("1234567890123456.80")], t),
    )
    keys = pa.table({"k": pa.array([decimal.Decimal("1234567890123456.78")], t)})
    assert candidate_files(snap, keys, ["k"]) == [0]


def test_a_foreign_partitioning_by_a_type_we_do_not_write_prunes_nothing():
    snap = Snapshot("/t", 1, None, None, ("p",), (DataFile("f0", 1, 1, {"p": "2024-01-01T12:00:00+00:00"}),))
    keys = pa.table({"p": pa.array([dt.datetime(2024, 1, 1, 12, tzinfo=UTC)], pa.timestamp("us", tz="UTC"))})
    assert candidate_files(snap, keys, ["p"]) == [0]
