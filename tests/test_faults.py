"""Faults at the epoch's seams (``mvsink/failpoints.py``) and from the store
(``tests/chaos/proxy.py``): whatever fails, the target holds a whole epoch or none, an epoch
is committed at most once, and what the log says decides an unknown outcome."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mvsink import MVSink, MVSinkError, SparkJobError, StorageError, UnsupportedTableError, failpoints
from mvsink.failpoints import InjectedFault
from tests.helpers import assert_equal_to, versions


def view(spark: SparkSession, epoch: int, n: int = 200) -> DataFrame:
    """n rows; every 10th moves with the epoch."""
    value = F.col("id") * 2 + F.when(F.col("id") % 10 == 0, F.lit(epoch)).otherwise(F.lit(0))
    return spark.range(n).select("id", value.alias("v"))


def rows_of(table: DeltaTable) -> Counter[tuple[Any, ...]]:
    data = table.to_pyarrow_table()
    return Counter(zip(data.column("id").to_pylist(), data.column("v").to_pylist(), strict=True))


def expected(epoch: int, n: int = 200) -> Counter[tuple[Any, ...]]:
    return Counter((i, i * 2 + (epoch if i % 10 == 0 else 0)) for i in range(n))


def frontiers(table: DeltaTable, name: str) -> list[int]:
    """The frontier each version of the table recorded for view ``name``, in version order."""
    out = []
    for commit in sorted(table.history(), key=lambda c: c["version"]):
        upper = commit.get("mvsink.upper")
        if commit.get("mvsink.view") == name and upper:
            out.append(int(upper))
    return out


def test_fail_points_are_checked_when_armed():
    with pytest.raises(ValueError, match="no fail point 'after_lunch'"):
        failpoints.parse("after_lunch=raise")
    with pytest.raises(ValueError, match="raise, sleep:SECONDS or kill"):
        failpoints.parse("after_commit=explode")
    assert failpoints.parse(" after_commit=raise ; write_task=sleep:0.5@0.1") == {
        "after_commit": "raise",
        "write_task": "sleep:0.5@0.1",
    }
    failpoints.hit("after_commit")  # not armed: nothing happens


@pytest.mark.parametrize("point", ["after_snapshot", "after_staging", "before_commit"])
def test_a_failure_before_the_commit_writes_nothing_and_the_retry_commits(spark, local_target, point):
    sink = MVSink(local_target, "v")
    sink(view(spark, 0), 0)
    before = versions(local_target)
    with failpoints.armed({point: "raise"}), pytest.raises(InjectedFault):
        sink(view(spark, 1), 1)
    assert versions(local_target) == before
    assert_equal_to(local_target, view(spark, 0))
    assert sink(view(spark, 1), 1).outcome == "committed"  # Spark's retry of the batch
    assert_equal_to(local_target, view(spark, 1))


def test_a_commit_whose_reply_is_lost_is_resolved_from_the_log(spark, local_target):
    sink = MVSink(local_target, "v")
    sink(view(spark, 0), 0)
    with failpoints.armed({"after_commit_call": "raise"}):
        report = sink(view(spark, 1), 1)
    assert report.outcome == "committed"
    assert_equal_to(local_target, view(spark, 1))
    assert frontiers(DeltaTable(local_target), "v") == [1, 2]


def test_a_crash_after_the_commit_is_a_replay_when_spark_runs_the_batch_again(spark, local_target):
    sink = MVSink(local_target, "v")
    sink(view(spark, 0), 0)
    with failpoints.armed({"after_commit": "raise"}), pytest.raises(InjectedFault):
        sink(view(spark, 1), 1)
    assert_equal_to(local_target, view(spark, 1))  # it landed
    again = MVSink(local_target, "v")(view(spark, 1), 1)  # a restarted query
    assert again.outcome == "replay"
    assert frontiers(DeltaTable(local_target), "v") == [1, 2]  # committed once


def test_a_conditional_put_that_lands_and_loses_its_reply_is_committed_once(spark, s3_target, faults):
    sink = MVSink(s3_target, "v", storage_options=faults.options)
    sink(view(spark, 0), 0)
    faults.set({"CPUT": {"lost": 1.0, "first": 1}})
    report = sink(view(spark, 1), 1)
    assert faults.injected("CPUT", "lost") == 1
    assert report.outcome == "committed"
    table = DeltaTable(s3_target, storage_options=faults.options)
    assert rows_of(table) == expected(1)
    assert frontiers(table, "v") == [1, 2]


def test_slow_down_replies_and_resets_are_retried(spark, s3_target, faults):
    sink = MVSink(s3_target, "v", storage_options=faults.options)
    faults.set(
        {
            "PUT": {"error": 0.3, "reset": 0.2, "first": 4},
            "GET": {"error": 0.3, "first": 4},
            "LIST": {"reset": 0.3, "first": 2},
        },
        seed=7,
    )
    for epoch in range(3):
        assert sink(view(spark, epoch), epoch).outcome == "committed"
    counts = faults.counts()
    assert counts["PUT"].get("error", 0) + counts["PUT"].get("reset", 0) >= 1, counts
    faults.set({})
    table = DeltaTable(s3_target, storage_options=faults.options)
    assert rows_of(table) == expected(2)
    assert frontiers(table, "v") == [1, 2, 3]


def test_a_request_slower_than_the_client_timeout_is_retried(spark, s3_target, faults):
    options = {**faults.options, "timeout": "2s"}
    sink = MVSink(s3_target, "v", storage_options=options)
    sink(view(spark, 0), 0)
    faults.set({"PUT": {"delay": 1.0, "first": 1, "delay_s": 5}})
    assert sink(view(spark, 1), 1).outcome == "committed"
    assert faults.injected("PUT", "delay") == 1
    assert rows_of(DeltaTable(s3_target, storage_options=options)) == expected(1)


# --- Bad input and hostile environments: a clear mvsink error, the target as it was ---------


def test_a_crashed_first_epoch_leaves_nothing_that_stops_the_next(spark, local_target):
    sink = MVSink(local_target, "v")
    with failpoints.armed({"after_staging": "raise"}), pytest.raises(InjectedFault):
        sink(view(spark, 0), 0)
    assert not os.path.exists(os.path.join(local_target, "_delta_log"))
    assert any(n.startswith("mvsink-") for n in os.listdir(local_target))  # its staged files
    assert sink(view(spark, 0), 0).outcome == "committed"
    assert_equal_to(local_target, view(spark, 0))


def test_a_cache_that_cannot_be_released_does_not_replace_the_epochs_outcome(spark, local_target):
    """Stopping a query interrupts its thread, and releasing the epoch's cached frames then
    fails (``InterruptedException``; the chaos run found it). The epoch's outcome is decided
    by then: it must come back as it is, not as the release's raw Py4J error."""
    if not hasattr(spark, "_jvm"):
        pytest.skip("a classic session's thread is interrupted through py4j")
    sink = MVSink(local_target, "v", mode="upsert", key=["id"])

    def interrupt(_snap: Any) -> None:  # as query.stop() does to the thread running the batch
        spark._jvm.java.lang.Thread.currentThread().interrupt()

    with failpoints.armed({"before_commit": interrupt}, view="v"):
        report = sink(view(spark, 0), 0)
    assert report.outcome == "committed" and rows_of(DeltaTable(local_target)) == expected(0)
    spark._jvm.java.lang.Thread.interrupted()  # clear the flag, whatever consumed it


def test_a_folder_of_parquet_without_a_delta_log_is_refused(spark, local_target):
    os.makedirs(os.path.join(local_target, "day=1"))
    pq.write_table(pa.table({"id": [1]}), os.path.join(local_target, "day=1", "part-0.parquet"))
    before = sorted(os.walk(local_target))
    with pytest.raises(UnsupportedTableError, match="holds files but no Delta log") as info:
        MVSink(local_target, "v")(view(spark, 0), 0)
    assert "'day=1'" in info.value.message and info.value.where.epoch == 0
    assert sorted(os.walk(local_target)) == before


def test_an_errors_table_that_fails_after_the_view_committed_says_so(spark, tmp_path, local_target):
    """The view commits first; an errors table that then fails raises its own error, which
    also says the view's epoch is committed. The batch run again (a replay for the view)
    brings the errors table up."""
    errors = str(tmp_path / "errors")
    os.makedirs(errors)
    pq.write_table(pa.table({"id": [1]}), os.path.join(errors, "part-0.parquet"))  # not Delta
    sink = MVSink(local_target, "v", checks=["v % 3 <> 0"], on_error="table", errors_target=errors)
    with pytest.raises(UnsupportedTableError, match="holds files but no Delta log") as info:
        sink(view(spark, 0), 0)
    assert info.value.target == errors
    assert info.value.__notes__ == [
        "the view committed this epoch as version 0; its errors table may be behind until the batch "
        "runs again"
    ]
    assert rows_of(DeltaTable(local_target)) == Counter(r for r in expected(0).elements() if r[1] % 3 != 0)
    os.remove(os.path.join(errors, "part-0.parquet"))
    assert sink(view(spark, 0), 0).outcome == "replay"
    assert rows_of(DeltaTable(errors)) == Counter(r for r in expected(0).elements() if r[1] % 3 == 0)


def test_a_read_only_store_is_a_storage_error_and_the_target_unchanged(spark, s3_target, faults):
    sink = MVSink(s3_target, "v", storage_options=faults.options)
    sink(view(spark, 0), 0)
    faults.set({"PUT": {"deny": 1.0}, "CPUT": {"deny": 1.0}})
    with pytest.raises(MVSinkError) as info:
        sink(view(spark, 1), 1)
    assert isinstance(info.value, StorageError), info.value
    assert faults.injected("PUT", "deny") >= 1
    faults.set({})
    table = DeltaTable(s3_target, storage_options=faults.options)
    assert table.version() == 0 and rows_of(table) == expected(0)


def test_a_udf_that_raises_halfway_is_a_spark_job_error_and_the_target_unchanged(spark, local_target):
    sink = MVSink(local_target, "v")
    sink(view(spark, 0), 0)

    @F.udf("long")
    def checked(v: int) -> int:
        if v == 301:
            raise ValueError(f"bad row {v}")
        return v

    broken = view(spark, 1).select("id", checked("v").alias("v"))  # row 150 of 200: v = 301
    with pytest.raises(SparkJobError, match="ValueError: bad row 301") as info:
        sink(broken, 1)
    assert info.value.where.epoch == 1
    assert versions(local_target) == [0]
    assert_equal_to(local_target, view(spark, 0))


def test_a_cancelled_job_is_a_spark_job_error_and_the_target_unchanged(spark, local_target):
    sink = MVSink(local_target, "v")
    sink(view(spark, 0), 0)

    @F.udf("long")
    def slow(v: int) -> int:
        time.sleep(0.02)
        return v

    cancel = threading.Timer(2.0, spark.sparkContext.cancelAllJobs)
    cancel.start()
    try:
        with pytest.raises(SparkJobError, match="cancel"):
            sink(view(spark, 1, n=2000).select("id", slow("v").alias("v")), 1)
    finally:
        cancel.cancel()
    assert versions(local_target) == [0]
    assert_equal_to(local_target, view(spark, 0))


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[str]:
    """A 4 MB tmpfs, or a skip saying why there is none."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip() or done.returncode}")
    try:
        yield str(mount / "view")
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_a_storage_error_and_the_target_unchanged(spark, small_disk):
    sink = MVSink(small_disk, "v")
    sink(view(spark, 0), 0)
    free = os.statvfs(small_disk)
    with open(os.path.join(os.path.dirname(small_disk), "filler"), "wb") as out:
        out.write(b"\0" * (free.f_bavail * free.f_frsize - 4096))  # all but a page
    with pytest.raises(MVSinkError) as info:
        sink(view(spark, 1), 1)
    assert isinstance(info.value, StorageError), info.value
    assert versions(small_disk) == [0]
    assert_equal_to(small_disk, view(spark, 0))
