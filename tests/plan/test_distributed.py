"""The distributed path and the index kept in storage (``distributed.py``, ``index.py``).

The suite's SparkSession limits results to ``conftest.MAX_RESULT_SIZE``: here a view whose
fingerprints alone are several times that goes through the distributed path, epoch after
epoch, and the driver path is shown to hit the limit on the same view.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mvsink import MVSink
from mvsink.errors import StorageError, Where
from mvsink.ops.verify import verify
from mvsink.plan.context import ResultLimit, long_row_bytes
from mvsink.plan.distributed import SKETCH_BITS, changed_buckets, correction, sketch_bits, with_fingerprints
from mvsink.table.delta import load_snapshot
from mvsink.table.fingerprint import fingerprints
from mvsink.table.index import FRESH_SECONDS, HIDDEN, StoredIndex
from mvsink.table.layout import Layout
from mvsink.table.schema import arrow_schema, target_struct
from mvsink.table.storage import wait_for_cleanup
from tests.helpers import assert_equal_to, live_files, target_table

# Runs on both engines (tests/conftest.py: each line runs the engine it has).
pytestmark = pytest.mark.usefixtures("engine")

ROWS = 1_000_000  # 16 bytes of fingerprint a row: 16 MB, twice the 8 MB result limit


def view(spark: SparkSession, epoch: int, n: int = ROWS) -> DataFrame:
    """Ids 0..n (less every 1000th from epoch 2 on); every 500th row's value moves each
    epoch; ids below 3 appear twice."""
    ids = spark.range(n)
    if epoch >= 2:
        ids = ids.where(F.col("id") % 1000 != 7)
    value = F.col("id") * 3 + F.when(F.col("id") % 500 == 0, F.lit(epoch)).otherwise(F.lit(0))
    rows = ids.select(F.col("id"), value.alias("v"))
    return rows.unionByName(rows.where(F.col("id") < 3))


def expected(epoch: int, n: int = ROWS) -> tuple[np.ndarray, np.ndarray]:
    ids = np.arange(n, dtype=np.int64)
    if epoch >= 2:
        ids = ids[ids % 1000 != 7]
    ids = np.concatenate([ids, ids[ids < 3]])
    values = ids * 3 + np.where(ids % 500 == 0, epoch, 0)
    order = np.lexsort((values, ids))
    return ids[order], values[order]


def held(target: str) -> tuple[np.ndarray, np.ndarray]:
    table = target_table(target)
    ids, values = table.column("id").to_numpy(), table.column("v").to_numpy()
    order = np.lexsort((values, ids))
    return ids[order], values[order]


def index_entries(target: str, name: str) -> set[str]:
    """The entries in storage, once the deletes queued off the epochs' path are done."""
    assert wait_for_cleanup(timeout=None)
    root = os.path.join(target, HIDDEN, name, "index")
    return {os.path.relpath(os.path.join(d, f), target) for d, _, fs in os.walk(root) for f in fs}


def stored_index(target: str, name: str) -> tuple[StoredIndex, list]:  # type: ignore[type-arg]
    snap = load_snapshot(target, f"mvsink:{name}", {}, Where())
    assert snap.schema_json is not None
    sink = MVSink(target, name)
    return StoredIndex.of(sink.store, name, arrow_schema(target_struct(snap.schema_json))), list(snap.files)


@pytest.mark.newest_line  # 3.5 runs the limit's fallback (test_auto_placement_never_dies...)
def test_a_view_bigger_than_the_result_limit_stays_exact_over_epochs(spark, local_target):
    sink = MVSink(local_target, "big", placement="distributed", max_rows_per_file=200_000)
    for epoch in range(3):
        report = sink(view(spark, epoch), epoch)
        assert report.outcome == "committed"
        ids, values = held(local_target)
        want_ids, want_values = expected(epoch)
        assert np.array_equal(ids, want_ids) and np.array_equal(values, want_values), f"epoch {epoch}"
        if epoch:  # every 500th row moves (id 0 twice); epoch 2 also drops every 1000th
            moved = ROWS // 500 + 1
            assert (report.inserted, report.retracted) == (moved, moved + (ROWS // 1000 if epoch == 2 else 0))
    # The driver path cannot even bring this view's rows in under the same limit.
    standby = MVSink(local_target, "big", placement="driver", read_only=True)
    with pytest.raises(Exception, match="maxResultSize"):
        standby(view(spark, 3), 3)


def test_a_restart_reads_the_index_not_the_table(spark, local_target, placement):
    sink = MVSink(local_target, "restart", max_rows_per_file=50, placement=placement)
    desired = spark.range(1000).select("id", (F.col("id") % 7).alias("v"))
    sink(desired, 0)
    sink(desired.withColumn("v", F.col("v") + (F.col("id") == 5).cast("long")), 1)
    entries = index_entries(local_target, "restart")
    stamps = {p: os.stat(os.path.join(local_target, p)).st_mtime_ns for p in entries}
    assert len(entries) == len(live_files(local_target))

    again = MVSink(local_target, "restart", max_rows_per_file=50, placement=placement)
    report = again(desired, 2)
    assert (report.inserted, report.retracted) == (1, 1)
    assert_equal_to(local_target, desired)
    assert report.files_read <= 1  # the one file rewritten, if read on the driver
    for p, stamp in stamps.items():  # no entry was recomputed
        if os.path.exists(os.path.join(local_target, p)):
            assert os.stat(os.path.join(local_target, p)).st_mtime_ns == stamp


def test_an_entry_that_does_not_describe_its_file_is_not_trusted(spark, local_target, placement):
    sink = MVSink(local_target, "forged", max_rows_per_file=10, placement=placement)
    desired = spark.range(100).select("id", (F.col("id") * 2).alias("v"))
    sink(desired, 0)
    index, files = stored_index(local_target, "forged")
    # Swap two files' entries: each now names the other file.
    a, b = (Path(local_target, index.path(f.key)) for f in files[:2])
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    # Rows whose entries were swapped are unchanged: a trusted entry would retract and insert.
    fresh = MVSink(local_target, "forged", max_rows_per_file=10, placement=placement)
    report = fresh(desired, 1)
    assert (report.inserted, report.retracted) == (0, 0)
    assert_equal_to(local_target, desired)


def test_entries_follow_the_table_and_leftovers_are_swept(spark, local_target, placement):
    sink = MVSink(local_target, "sweep", max_rows_per_file=20, placement=placement)
    for epoch in range(3):
        sink(spark.range(200).select("id", (F.col("id") % (epoch + 2)).alias("v")), epoch)
    index, files = stored_index(local_target, "sweep")
    live = {index.path(f.key) for f in files}
    # Entries of removed files went with their commits.
    assert index_entries(local_target, "sweep") == live
    # A leftover (an attempt that crashed before committing, over an hour ago: a younger one
    # may be a replica's in flight) is swept by the next sink.
    index.put("mvsink-sweep-e9-crashed/part-0.parquet", 1, index.get(files[0]))  # type: ignore[arg-type]
    past = time.time() - FRESH_SECONDS - 60
    os.utime(os.path.join(local_target, index.path("mvsink-sweep-e9-crashed/part-0.parquet")), (past, past))
    assert len(index_entries(local_target, "sweep")) == len(live) + 1
    MVSink(local_target, "sweep", max_rows_per_file=20, placement=placement)(
        spark.range(200).select("id", (F.col("id") % 4).alias("v")), 3
    )
    index, files = stored_index(local_target, "sweep")
    assert index_entries(local_target, "sweep") == {index.path(f.key) for f in files}
    # Delta readers never see the index.
    assert DeltaTable(local_target).to_pyarrow_table().num_rows == 200


def test_auto_placement_goes_distributed_above_driver_max_rows(spark, local_target):
    sink = MVSink(local_target, "auto", driver_max_rows=50, max_rows_per_file=30)
    small = spark.range(40).select("id", F.lit(1).cast("long").alias("v"))
    sink(small, 0)
    on_driver = sink(small.withColumn("v", F.lit(2).cast("long")), 1)
    assert "collect" in on_driver.phases  # 40 rows held: the driver path
    big = spark.range(100).select("id", F.lit(1).cast("long").alias("v"))
    sink(big, 2)
    spread = sink(big.withColumn("v", (F.col("id") % 2)), 3)
    assert "collect" not in spread.phases  # 100 rows held: distributed
    assert_equal_to(local_target, big.withColumn("v", (F.col("id") % 2)))


def test_distributed_on_s3_with_explicit_storage_options(spark, s3_target, s3_options):
    desired = spark.range(300).select("id", (F.col("id") % 3).alias("v"))
    sink = MVSink(s3_target, "s3d", max_rows_per_file=40, placement="distributed", storage_options=s3_options)
    sink(desired, 0)
    changed = desired.withColumn("v", F.when(F.col("id") == 7, 99).otherwise(F.col("v")))
    report = sink(changed, 1)
    assert (report.inserted, report.retracted) == (1, 1)
    got = pa.table(DeltaTable(s3_target, storage_options=s3_options).to_pyarrow_table())
    assert sorted(zip(got.column("id").to_pylist(), got.column("v").to_pylist(), strict=True)) == sorted(
        (r["id"], r["v"]) for r in changed.collect()
    )
    up = MVSink(
        s3_target + "-up",
        "s3u",
        mode="upsert",
        key=["id"],
        max_rows_per_file=40,
        placement="distributed",
        storage_options=s3_options,
    )
    up(desired, 0)
    up(spark.createDataFrame([(7, 50), (1000, 1)], "id long, v long"), 1)
    got = pa.table(DeltaTable(s3_target + "-up", storage_options=s3_options).to_pyarrow_table())
    held_rows = dict(zip(got.column("id").to_pylist(), got.column("v").to_pylist(), strict=True))
    assert len(held_rows) == got.num_rows == 301 and held_rows[7] == 50 and held_rows[1000] == 1


def test_a_task_that_finds_a_file_shorter_than_the_log_says_fails_the_epoch(spark, local_target, placement):
    sink = MVSink(local_target, "short", max_rows_per_file=10, placement=placement)
    desired = spark.range(30).select("id", F.lit(0).alias("v"))
    sink(desired, 0)
    index, files = stored_index(local_target, "short")
    # Replace a data file with fewer rows than its add action records, and drop its entry.
    victim = files[0]
    path = os.path.join(local_target, victim.key)
    table = pq.read_table(path)
    pq.write_table(table.slice(0, table.num_rows - 1), path)
    os.remove(os.path.join(local_target, index.path(victim.key)))
    before = DeltaTable(local_target).version()
    fresh = MVSink(local_target, "short", max_rows_per_file=10, placement=placement)
    with pytest.raises(Exception, match="rows but the Delta log says") as info:
        fresh(desired.withColumn("v", F.lit(1)), 1)
    assert "short" in str(info.value)
    assert DeltaTable(local_target).version() == before


def test_a_data_file_gone_from_storage_is_a_storage_error_naming_it(spark, local_target, placement):
    sink = MVSink(local_target, "gone", max_rows_per_file=10, placement=placement)
    desired = spark.range(30).select("id", F.lit(0).cast("long").alias("v"))
    sink(desired, 0)
    index, files = stored_index(local_target, "gone")
    os.remove(os.path.join(local_target, files[0].key))  # e.g. a vacuum with a short retention
    os.remove(os.path.join(local_target, index.path(files[0].key)))
    before = DeltaTable(local_target).version()
    fresh = MVSink(local_target, "gone", max_rows_per_file=10, placement=placement)
    with pytest.raises(StorageError, match=files[0].key.rsplit("/", 1)[-1]) as info:
        fresh(desired.withColumn("v", F.lit(1).cast("long")), 1)
    assert info.value.view == "gone" and info.value.epoch == 1
    assert DeltaTable(local_target).version() == before


def wide(spark: SparkSession, n: int, tag: str) -> DataFrame:
    """``n`` rows of about 100 bytes each: 100K of them are 10 MB, over the 8 MB limit."""
    return spark.range(n).select(
        F.col("id"), F.concat(F.lit(tag), F.sha2(F.col("id").cast("string"), 256), F.lit("x" * 30)).alias("s")
    )


@pytest.mark.single_engine  # the placement's choice; the engine commits a handful of files
@pytest.mark.parametrize("mode", ["complete", "upsert"])
def test_auto_placement_never_dies_of_the_driver_result_limit(spark, local_target, mode, caplog):
    """A 10-row target and a 10 MB batch, under the suite's 8 MB spark.driver.maxResultSize.
    Upsert cannot collect the batch: ``auto`` falls back to Spark tasks for that epoch.
    Complete mode collects about 16 bytes a row (the fingerprints), which fit; the 100K rows to
    insert do not, so Spark tasks write them. A view whose fingerprints alone pass the limit plans in
    Spark tasks, from then on."""
    options = {"mode": mode, "key": ["id"]} if mode == "upsert" else {}
    sink = MVSink(local_target, "big", **options)
    sink(wide(spark, 10, "a"), 0)
    caplog.set_level("WARNING", logger="mvsink")
    assert sink(wide(spark, 100_000, "b"), 1).outcome == "committed"
    assert verify(wide(spark, 100_000, "b"), local_target, "big").equal  # compared in Spark
    if mode == "upsert":
        assert any("plans in Spark tasks" in r.getMessage() for r in caplog.records)
        caplog.clear()
        # An upsert batch brings only the changed keys: the fallback is for that epoch only.
        small = wide(spark, 10, "d")
        assert sink(small, 2).outcome == "committed"
        assert "collect" in sink.last_report.phases  # back on the driver
        assert not any("plans in Spark tasks" in r.getMessage() for r in caplog.records)
        assert verify(
            wide(spark, 100_000, "b").where("id >= 10").unionByName(small), local_target, "big"
        ).equal
        return
    assert any("Spark tasks write them" in r.getMessage() for r in caplog.records)
    assert not any("plans in Spark tasks" in r.getMessage() for r in caplog.records)
    assert "collect" in sink.last_report.phases  # the fingerprints came to the driver
    batch = wide(spark, 100_000, "b").where("id != 5")
    assert sink(batch, 2).retracted == 1
    assert verify(batch, local_target, "big").equal
    # 600K rows of fingerprints are about 10 MB: over the limit, whatever the rows' width.
    caplog.clear()
    many = spark.range(600_000).select("id", F.lit("z").alias("s"))
    narrow = MVSink(f"{local_target}-narrow", "narrow")
    narrow(many.limit(10), 0)
    # Spark's own broadcast threshold (10 MB) is left above the 8 MB limit: the distributed
    # diff keeps Spark from broadcasting what could pass it (``ResultLimit.small_side``).
    assert narrow(many, 1).outcome == "committed"
    assert any("plans in Spark tasks" in r.getMessage() for r in caplog.records)
    assert verify(many, f"{local_target}-narrow", "narrow").equal
    caplog.clear()
    assert narrow(many.where("id != 7"), 2).retracted == 1
    assert "collect" not in narrow.last_report.phases  # planned in tasks from the start
    assert not any("plans in Spark tasks" in r.getMessage() for r in caplog.records)


def test_index_entries_of_removed_files_go_off_the_epochs_path(spark, local_target):
    """The epoch commits and returns without waiting for the deletes of the index entries of
    the files it removed: they run in the background, after whatever is queued there."""
    import threading

    from mvsink.table import storage

    sink = MVSink(local_target, "bg", max_rows_per_file=20)
    sink(spark.range(200).select("id", F.lit(0).cast("long").alias("v")), 0)
    before = index_entries(local_target, "bg")
    gate = threading.Event()
    storage._cleanup_pool().submit(gate.wait, 60)  # the background thread is busy
    try:
        report = sink(spark.range(200).select("id", (F.col("id") % 2).alias("v")), 1)
        assert report.outcome == "committed" and report.files_removed > 0
        root = os.path.join(local_target, HIDDEN, "bg", "index")
        held = {os.path.relpath(os.path.join(d, f), local_target) for d, _, fs in os.walk(root) for f in fs}
        assert before <= held  # the removed files' entries are still there: nothing waited
    finally:
        gate.set()
    index, files = stored_index(local_target, "bg")
    assert index_entries(local_target, "bg") == {index.path(f.key) for f in files}


def test_the_sketch_settles_every_bucket_a_change_leaves_alone(spark, local_target):
    """The persisted side's bucket summaries (numpy, in the index tasks) and desired's (Spark)
    agree wherever the rows do: after one row changes, exactly the buckets of its old and new
    fingerprints differ, and none when nothing changed; the exact pass then reads only the
    stored rows of those buckets. Were the two evaluators to disagree, or the filter not
    apply, the diff would stay exact and quietly lose its point."""
    sink = MVSink(local_target, "sketch", placement="distributed", max_rows_per_file=20_000)
    extremes = F.when(F.col("id") % 3 == 0, F.lit(None)).otherwise(F.col("id") * -(2**40))
    rows = spark.range(50_000).select("id", extremes.alias("v"), F.col("id").cast("string").alias("s"))
    sink(rows, 0)
    snap = load_snapshot(local_target, "mvsink:sketch", {}, Where())
    assert snap.schema_json is not None
    layout = Layout(snap.schema_json, target_struct(snap.schema_json), snap.partition_by)
    stored = StoredIndex.of(sink.store, "sketch", layout.arrow)
    bits = sketch_bits(snap)
    assert bits == SKETCH_BITS[0]  # 50K rows: the fewest buckets
    # Fewer still when the driver may not collect that many bucket numbers (1 MB: 8,192).
    assert sketch_bits(snap, ResultLimit(1 << 20)) == 13

    def buckets(frame: DataFrame) -> set[int]:
        mask = changed_buckets(spark, with_fingerprints(frame, layout), snap, stored, layout, bits)
        return {int(b) for b in np.flatnonzero(mask)}

    assert buckets(rows) == set()
    moved = rows.select("id", F.when(F.col("id") == 7, F.lit(5)).otherwise(F.col("v")).alias("v"), "s")
    before = pa.table({"id": [7], "v": [7 * -(2**40)], "s": ["7"]}, schema=layout.arrow)
    after = pa.table({"id": [7], "v": [5], "s": ["7"]}, schema=layout.arrow)
    shift = np.uint64(64 - bits)
    want = {int(fingerprints(t)[0].view(np.uint64)[0] >> shift) for t in (before, after)}
    assert buckets(moved) == want

    # The exact pass holds the stored rows of those buckets only.
    stored_a = np.concatenate([stored.load(f, layout.arrow, ())[0].a for f in snap.files])
    in_changed = np.isin(stored_a.view(np.uint64) >> shift, np.array(sorted(want), dtype=np.uint64))
    corr = correction(spark, with_fingerprints(moved, layout), snap, stored, layout, 20_000)
    try:
        assert (corr.inserted, corr.retracted) == (1, 1)
        assert [frame.count() for frame in corr.held] == [int(in_changed.sum()), 2]
    finally:
        corr.close()


PAST_THE_LIMIT = 640_000
"""Rows of ``wide`` whose fingerprints (16 bytes a row on the driver) come to 10 MB, past the
suite's 8 MB limit; so do the changed fingerprint groups the
distributed diff then finds, one per row (about 20 bytes each once Spark serialised them)."""


@pytest.mark.single_engine  # the placement's choice; the engine commits a handful of files
@pytest.mark.newest_line  # mvsink's estimate of a collect; 3.5's refusal: test_auto_placement...
@pytest.mark.parametrize("mode", ["complete", "upsert"])
def test_no_collect_of_an_auto_epoch_passes_the_driver_result_limit(spark, local_target, mode, caplog):
    """Issue 34: a 10-row target, then a batch of rows of about 100 bytes whose fingerprints
    alone pass spark.driver.maxResultSize. ``auto`` falls back to Spark tasks, and nothing the
    tasks' plan brings to the driver on the way (a collect, a broadcast) passes the limit."""
    options = {"mode": mode, "key": ["id"]} if mode == "upsert" else {}
    sink = MVSink(local_target, "big", **options)
    sink(wide(spark, 10, "a"), 0)
    caplog.set_level("WARNING", logger="mvsink")
    batch = wide(spark, PAST_THE_LIMIT, "b")
    report = sink(batch, 1)
    assert (report.outcome, report.inserted, report.retracted) == ("committed", PAST_THE_LIMIT, 10)
    assert any("plans in Spark tasks" in r.getMessage() for r in caplog.records)
    assert verify(batch, local_target, "big").equal


def test_what_an_epoch_brings_to_the_driver_is_bounded_by_the_session_limit(spark):
    """``ResultLimit`` reads the session's limits; a join's small side is broadcast only when
    it fits a quarter of the driver's limit, and otherwise kept from Spark's own broadcast too
    while Spark's threshold (10 MB by default) could pass the limit (the suite's 8 MB)."""
    limit = ResultLimit.of(spark)
    assert (limit.size, limit.spark_broadcasts) == (8 << 20, 10 << 20)
    assert limit.fits(40_000, long_row_bytes(4)) and not limit.fits(50_000, long_row_bytes(4))  # 2 MB

    def join(side: DataFrame) -> str:
        return str(spark.range(1000).join(side, "id")._jdf.queryExecution().executedPlan().toString())

    few = spark.range(10)
    assert "BroadcastHashJoin" in join(limit.small_side(few, 10, long_row_bytes(1), most=100))
    assert "BroadcastHashJoin" in join(few)  # Spark's own choice, for a side it finds small
    # Said to be too many to broadcast: shuffled, whatever Spark would find.
    assert "SortMergeJoin" in join(limit.small_side(few, 10, long_row_bytes(1), most=5))
    assert "SortMergeJoin" in join(limit.small_side(few, 1_000_000, long_row_bytes(1), most=10**7))
    # Under a threshold that keeps Spark's broadcasts within the limit, Spark decides.
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "1m")
    try:
        tame = ResultLimit.of(spark)
        assert tame.spark_broadcasts == 1 << 20
        assert "BroadcastHashJoin" in join(tame.small_side(few, 1_000_000, long_row_bytes(1), most=10**7))
    finally:
        spark.conf.unset("spark.sql.autoBroadcastJoinThreshold")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    try:
        assert ResultLimit.of(spark).spark_broadcasts == 0  # Spark never broadcasts on its own
    finally:
        spark.conf.unset("spark.sql.autoBroadcastJoinThreshold")


@pytest.mark.skipif(
    os.environ.get("MVSINK_TEST_MASTER") != "standalone",
    reason="on the standalone cluster only (make test runs this suite there once)",
)
def test_on_a_standalone_cluster_the_tasks_run_in_executors_apart_from_the_driver(spark, local_target):
    """Issue 37: this suite runs once on a standalone cluster (``tests/cluster.py``): a master,
    a worker and its executor, each a JVM of its own; a distributed epoch's tasks plan and
    write there, and the view is exact."""
    sc = spark.sparkContext
    assert sc.master.startswith("spark://127.0.0.1:")
    sink = MVSink(local_target, "apart", placement="distributed", max_rows_per_file=500)
    sink(wide(spark, 2_000, "a"), 0)
    batch = wide(spark, 2_000, "a").where("id % 10 != 3").unionByName(wide(spark, 30, "b"))
    report = sink(batch, 1)
    assert report.outcome == "committed" and report.retracted == 200
    assert verify(batch, local_target, "apart").equal
    # The tasks ran: the driver's block manager and an executor's, in another process.
    assert sc._jsc.sc().getExecutorMemoryStatus().size() >= 2


def test_a_column_added_to_the_view_is_planned_by_tasks_reading_older_files_with_it_null(
    spark, local_target, engine
):
    """A schema change through the distributed placement: the index of the new layout is
    built by tasks reading the table's files (the added column null in them), and only the
    rows that differ move where the engine keeps files across the change (the JVM Delta);
    delta-rs replaces every file (``delta.keeps_files_across_schema_change``)."""
    sink = MVSink(local_target, "v", placement="distributed", schema_changes="evolve", max_rows_per_file=4)
    sink(spark.createDataFrame([(i, f"n{i}") for i in range(10)], "id long, name string"), 0)
    rows = [(i, f"n{i}", "gold" if i == 3 else None) for i in range(10)]
    changed = spark.createDataFrame(rows, "id long, name string, tier string")
    report = sink(changed, 1)
    assert_equal_to(local_target, changed)
    if engine == "delta-spark":
        assert (report.inserted, report.retracted, report.whole) == (1, 1, False)
    else:
        assert report.whole and report.retracted == 10
