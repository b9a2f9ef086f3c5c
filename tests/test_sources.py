"""The ``mvsink-delta`` streaming source: a Delta table's appends, version by version."""

from __future__ import annotations

import os
import random
from collections import Counter

import pyarrow as pa
import pyarrow.compute
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F

from mvsink import ConfigError, MVSink
from mvsink.compat import PYTHON_DATA_SOURCES, to_arrow
from mvsink.sources.changes import exact_change
from mvsink.sources.reader import register
from mvsink.table.fingerprint import fingerprints
from tests.helpers import multiset, removed, target_table

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])
SPARK4 = pytest.mark.spark4("mvsink-delta is a Python data source")


def append(target: str, ids: range, tag: str) -> None:
    write_deltalake(target, pa.table({"id": list(ids), "v": [tag] * len(ids)}, schema=SCHEMA), mode="append")


def drain(spark, target: str, ckpt: str, **options: str) -> list[list[tuple[int, str]]]:
    """Run a query from ``ckpt`` over what is available; the rows of each batch."""
    register(spark)
    batches: list[list[tuple[int, str]]] = []
    reader = spark.readStream.format("mvsink-delta").option("path", target)
    for k, v in options.items():
        reader = reader.option(k, v)

    def keep(df, _):
        batches.append(sorted((r["id"], r["v"]) for r in df.collect()))

    query = reader.load().writeStream.foreachBatch(keep).option("checkpointLocation", ckpt)
    run = query.trigger(availableNow=True).start()
    run.awaitTermination(300)
    assert run.exception() is None
    return [b for b in batches if b]


@SPARK4
def test_appends_are_read_once_in_version_order_across_restarts(spark, tmp_path, target):
    ckpt = str(tmp_path / "ckpt")
    append(target, range(0, 3), "a")
    append(target, range(3, 5), "b")
    first = drain(spark, target, ckpt, maxVersionsPerTrigger="1")
    assert first == [[(0, "a"), (1, "a"), (2, "a")], [(3, "b"), (4, "b")]]
    DeltaTable(target).optimize.compact()  # rearranges rows: adds nothing
    append(target, range(5, 6), "c")
    second = drain(spark, target, ckpt, maxVersionsPerTrigger="1")
    assert second == [[(5, "c")]]  # resumed after the last version read; nothing twice
    assert drain(spark, target, ckpt) == []
    # A fresh query reads every append once, the compaction's files not at all.
    everything = Counter(r for b in drain(spark, target, str(tmp_path / "fresh")) for r in b)
    assert everything == Counter([(i, t) for i, t in zip(range(6), "aaabbc", strict=True)])


@SPARK4
def test_a_version_that_deletes_rows_stops_the_stream_with_a_clear_error(spark, tmp_path, local_target):
    append(local_target, range(0, 4), "a")
    DeltaTable(local_target).delete("id = 1")
    with pytest.raises(Exception, match="reads appends only"):
        drain(spark, local_target, str(tmp_path / "ckpt"))


@SPARK4
def test_a_schema_change_stops_the_stream_with_a_clear_error(spark, tmp_path, local_target):
    append(local_target, range(0, 2), "a")
    wider = pa.table({"id": [5], "v": ["b"], "extra": [1.5]})
    write_deltalake(local_target, wider, mode="append", schema_mode="merge")
    with pytest.raises(Exception, match="changes the table's schema"):
        drain(spark, local_target, str(tmp_path / "ckpt"))


# --- the change feed of a view ---------------------------------------------------------------


def feed(spark, target: str, ckpt: str, **options: str) -> list[pa.Table]:
    """The change feed from ``ckpt`` over what is available, one Arrow table per batch."""
    register(spark)
    batches: list[pa.Table] = []
    reader = spark.readStream.format("mvsink-delta").option("path", target).option("mode", "changes")
    for k, v in options.items():
        reader = reader.option(k, v)
    query = reader.load().writeStream.foreachBatch(lambda df, _: batches.append(to_arrow(df)))
    run = query.option("checkpointLocation", ckpt).trigger(availableNow=True).start()
    run.awaitTermination(300)
    assert run.exception() is None, run.exception()
    return [b for b in batches if b.num_rows]


def view_at(spark, epoch: int):
    """Desired of the test view at ``epoch``: ids drift in and out, values change, duplicates
    and nulls come and go, and most rows stay as they were."""
    rng = random.Random(epoch)
    rows = [(i, None if i % 7 == 0 else f"v{i}") for i in range(epoch, 60 + epoch)]
    for _ in range(3):
        k = rng.randrange(len(rows))
        rows[k] = (rows[k][0], f"changed{epoch}")
    rows += [rows[rng.randrange(len(rows))] for _ in range(2)]  # duplicates
    return spark.createDataFrame(rows, "id long, v string")


def signed(
    rows: pa.Table, version: int, diff: int, columns: tuple[str, ...] | list[str] = ("id", "v")
) -> Counter:
    sel = rows.filter(
        pa.compute.and_(
            pa.compute.equal(rows["_commit_version"], version), pa.compute.equal(rows["diff"], diff)
        )
    )
    return multiset(sel, list(columns))


@SPARK4
def test_the_change_feed_of_a_view_is_exact_per_version_and_sums_to_the_view(spark, tmp_path, local_target):
    sink = MVSink(local_target, "feed", max_rows_per_file=8)
    for epoch in range(10):
        sink(view_at(spark, epoch), epoch)
    DeltaTable(local_target).optimize.compact()  # rearranges rows: no change
    last = DeltaTable(local_target).version()

    batches = feed(spark, local_target, str(tmp_path / "ckpt"), maxVersionsPerTrigger="1")
    rows = pa.concat_tables(batches)
    assert all(len(set(b["_commit_version"].to_pylist())) == 1 for b in batches)  # one version a batch
    assert set(rows["diff"].to_pylist()) == {-1, 1}
    cancelled = 0
    for v in range(last + 1):
        before = multiset(target_table(local_target, v - 1), ["id", "v"]) if v else Counter()
        after = multiset(target_table(local_target, v), ["id", "v"])
        assert signed(rows, v, +1) == after - before, f"inserts of version {v}"
        assert signed(rows, v, -1) == before - after, f"retractions of version {v}"
        if v and removed(local_target, v) and v < last:
            rewritten = sum(
                pq.read_metadata(os.path.join(local_target, p)).num_rows for p in removed(local_target, v)
            )
            cancelled += rewritten - (before - after).total()
    assert cancelled > 0  # rewritten files' untouched rows were in the commits, not in the feed
    total = Counter()
    for row in rows.to_pylist():
        total[(row["id"], row["v"])] += row["diff"]
    assert +total == multiset(target_table(local_target), ["id", "v"]) and not -total

    # Resumed from its checkpoint, the feed reads only what came after.
    sink(view_at(spark, 10), 10)
    more = pa.concat_tables(feed(spark, local_target, str(tmp_path / "ckpt")))
    assert set(more["_commit_version"].to_pylist()) == {last + 1}
    assert signed(more, last + 1, +1) == multiset(target_table(local_target), ["id", "v"]) - multiset(
        target_table(local_target, last), ["id", "v"]
    )


@SPARK4
def test_a_large_rewrite_is_cancelled_in_buckets_exactly(spark, tmp_path, local_target):
    """Above ``rewriteRowsPerTask`` rows, a version's rewrite is split by fingerprint
    into tasks that each hold a share of the fingerprints; equal rows share a bucket, so the
    feed is as exact as in one task."""
    from mvsink.sources.reader import DeltaVersions, _Rewrite

    sink = MVSink(local_target, "feed", max_rows_per_file=30)
    for epoch in range(5):
        sink(view_at(spark, epoch), epoch)
    source = DeltaVersions({"path": local_target, "mode": "changes", "rewriteRowsPerTask": "20"})
    reader = source.streamReader(source.schema())
    parts = reader.partitions({"version": 0}, {"version": 4})
    assert max(p.buckets for p in parts if isinstance(p, _Rewrite)) > 2  # the option took effect

    rows = pa.concat_tables(feed(spark, local_target, str(tmp_path / "ckpt"), rewriteRowsPerTask="20"))
    for v in range(5):
        before = multiset(target_table(local_target, v - 1), ["id", "v"]) if v else Counter()
        after = multiset(target_table(local_target, v), ["id", "v"])
        assert signed(rows, v, +1) == after - before, f"inserts of version {v}"
        assert signed(rows, v, -1) == before - after, f"retractions of version {v}"
    with pytest.raises(Exception, match="rewriteRowsPerTask"):
        feed(spark, local_target, str(tmp_path / "bad"), rewriteRowsPerTask="lots")


@SPARK4
def test_the_change_feed_names_a_vacuumed_file_and_a_column_clash(spark, tmp_path, local_target):
    sink = MVSink(local_target, "feed", max_rows_per_file=8)
    sink(view_at(spark, 0), 0)
    sink(view_at(spark, 1), 1)
    DeltaTable(local_target).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    with pytest.raises(Exception, match="no longer exists"):
        feed(spark, local_target, str(tmp_path / "ckpt"))
    clash = str(tmp_path / "clash")
    write_deltalake(clash, pa.table({"id": [1], "diff": [2]}))
    register(spark)
    with pytest.raises(Exception, match="change feed adds"):
        spark.readStream.format("mvsink-delta").option("path", clash).option("mode", "changes").load()


def test_exact_change_cancels_equal_rows_as_multisets():
    def fps(values: list[int]):
        return fingerprints(pa.table({"x": pa.array(values, pa.int64())}))

    # Added: x=1 three times, 2 once; removed: 1 once, 3 twice (in two files).
    inserts, retracts = exact_change([fps([1, 2, 1]), fps([1])], [fps([3, 1]), fps([3])])
    assert [m.tolist() for m in inserts] == [[True, True, True], [False]]  # 1 twice (first ones), 2
    assert [m.tolist() for m in retracts] == [[True, False], [True]]  # 3 twice; 1 cancels
    assert exact_change([], []) == ([], [])
    same = fps([5, 5])
    assert [m.tolist() for side in exact_change([same], [same]) for m in side] == [[False, False]] * 2


@SPARK4
def test_a_table_that_turns_on_deletion_vectors_mid_stream_stops_it(spark, tmp_path, local_target):
    append(local_target, range(0, 2), "a")
    register(spark)
    seen: list[int] = []

    def turn_on(df, _):  # while the query runs, the table starts using deletion vectors
        seen.append(df.count())
        if len(seen) == 1:
            DeltaTable(local_target).alter.set_table_properties({"delta.enableDeletionVectors": "true"})

    stream = spark.readStream.format("mvsink-delta").option("path", local_target).load()
    query = (
        stream.writeStream.foreachBatch(turn_on)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    with pytest.raises(Exception, match="turns on"):
        query.awaitTermination(120)
    query.stop()
    assert seen[0] == 2


@SPARK4
def test_the_change_feed_of_a_partitioned_view_is_exact_per_version(spark, tmp_path, local_target):
    sink = MVSink(local_target, "feed", max_rows_per_file=8, partition_by=["g"])
    for epoch in range(4):
        sink(view_at(spark, epoch).withColumn("g", F.col("id") % 3), epoch)
    rows = pa.concat_tables(feed(spark, local_target, str(tmp_path / "ckpt")))
    cols = ["id", "v", "g"]
    for v in range(DeltaTable(local_target).version() + 1):
        before = multiset(target_table(local_target, v - 1), cols) if v else Counter()
        after = multiset(target_table(local_target, v), cols)
        assert signed(rows, v, +1, cols) == after - before and signed(rows, v, -1, cols) == before - after


def test_the_source_registers_from_spark_4_on_and_is_refused_clearly_before(spark, tmp_path):
    if PYTHON_DATA_SOURCES:
        source = str(tmp_path / "source")
        append(source, range(3), "a")
        register(spark)
        stream = spark.readStream.format("mvsink-delta").option("path", source).load()
        assert stream.isStreaming and stream.columns == ["id", "v"]
    else:
        with pytest.raises(ConfigError, match=r"Spark runs from 4\.0 on; this is PySpark 3\.5") as info:
            register(spark)
        assert "clock='source_offsets' works with those too" in str(info.value)
