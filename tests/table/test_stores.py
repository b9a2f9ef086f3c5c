"""Object stores reached through ``storage_options`` alone, and stores that cannot be reached.

The server these tests write to is not the one the environment points at: a reader or writer
(driver or Spark task) that dropped the options would look in the wrong place and fail.
"""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from mvsink import MVSink, StorageError, frontier
from mvsink.compat import to_arrow
from tests.helpers import multiset, people
from tests.s3server import BUCKET, free_port


def rows(target: str, options: dict[str, str]) -> pa.Table:
    return DeltaTable(target, storage_options=options).to_pyarrow_table()


def test_every_mode_works_with_storage_options_alone(spark, s3_target, s3_options):
    target = s3_target
    sink = MVSink(target, "opts", storage_options=s3_options, partition_by=["name"], max_rows_per_file=4)
    sink(people(spark, range(20)), 0)  # an initial load, written by Spark tasks
    desired = people(spark, [*range(5, 20), 40])
    report = sink(desired, 1)  # driver-side rewrites
    assert (report.inserted, report.retracted) == (1, 5)
    assert multiset(rows(target, s3_options)) == multiset(to_arrow(desired), ["id", "name", "x"])
    # Another writer's rows are repaired by the next epoch.
    schema = DeltaTable(target, storage_options=s3_options).schema().to_arrow()
    rogue = pa.Table.from_pylist([{"id": 999, "name": "n9", "x": 1.0}], schema=pa.schema(schema))
    write_deltalake(target, rogue, mode="append", storage_options=s3_options)
    again = sink(desired, 2)
    assert again.retracted == 1 and again.files_read >= 1
    assert multiset(rows(target, s3_options)) == multiset(to_arrow(desired), ["id", "name", "x"])
    assert frontier(target, "opts", s3_options) == 3

    up = MVSink(s3_target + "-upsert", "up", mode="upsert", key=["id"], storage_options=s3_options)
    up(people(spark, range(6)), 0)
    up(spark.createDataFrame([(2, "two", 2.5), (9, "nine", 9.0)], "id long, name string, x double"), 1)
    got = {r["id"]: r["name"] for r in rows(s3_target + "-upsert", s3_options).to_pylist()}
    assert got[2] == "two" and got[9] == "nine" and len(got) == 7

    app = MVSink(s3_target + "-append", "app", mode="append", storage_options=s3_options)
    app(people(spark, range(3)), 0)
    app(people(spark, range(3)), 0)  # a replay adds nothing
    assert rows(s3_target + "-append", s3_options).num_rows == 3


def _boom(x: int) -> int:
    raise RuntimeError("a Spark job ran before the store was checked")


def _cases(options: dict[str, str]) -> dict[str, tuple[str, dict[str, str]]]:
    closed = free_port()
    return {
        "missing bucket": ("s3://no-such-bucket-mvsink/view", options),
        "unreachable endpoint": (
            f"s3://{BUCKET}/view",
            {**options, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed}", "max_retries": "1"},
        ),
    }


@pytest.mark.parametrize("case", ["missing bucket", "unreachable endpoint"])
def test_a_store_that_cannot_be_reached_is_one_clear_error_before_any_spark_job(spark, s3_options, case):
    target, options = _cases(s3_options)[case]
    boom = F.udf(_boom, LongType())
    desired = spark.range(3).select(boom(F.col("id")).alias("id"))  # any Spark job fails loudly
    sink = MVSink(target, "gone", storage_options=options)
    started = time.monotonic()
    with pytest.raises(StorageError) as err:
        sink(desired, 0)
    assert err.value.target == target and err.value.view == "gone"
    assert target in str(err.value) and "storage_options" in str(err.value)
    assert time.monotonic() - started < 60


def test_missing_credentials_are_one_clear_error(spark, s3_target, s3_options, monkeypatch):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    # No keys anywhere: the client falls back to instance metadata, which is not there.
    options = {k: v for k, v in s3_options.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    options["AWS_EC2_METADATA_DISABLED"] = "true"
    options["max_retries"] = "1"
    sink = MVSink(s3_target, "nokeys", storage_options=options)
    with pytest.raises(StorageError) as err:
        sink(people(spark, range(3)), 0)
    assert s3_target in str(err.value)
    assert DeltaTable.is_deltatable(s3_target, storage_options=s3_options) is False


def test_a_store_lost_after_the_first_epoch_is_a_storage_error(spark, tmp_path):
    from tests.s3server import moto_server

    with moto_server(tmp_path / "moto.log") as options:
        target = f"s3://{BUCKET}/lost/view"
        sink = MVSink(target, "lost", storage_options=options)
        sink(people(spark, range(5)), 0)
    # The server is gone (an outage, expired credentials): one clear error, not an OSError.
    with pytest.raises(StorageError) as err:
        sink(people(spark, range(3)), 1)
    assert err.value.target == target and err.value.epoch == 1


def test_the_index_sweep_leaves_fresh_entries_and_writes_in_flight(tmp_path):
    """A sweep deletes only entries older than ``FRESH_SECONDS``, as vacuum does: a younger one
    may be a replica's entry in flight, or the temporary file of a put about to be renamed
    into place. A put beside a neighbour sweeping continuously never fails."""
    import os
    import threading

    from mvsink.table.index import FRESH_SECONDS, StoredIndex
    from mvsink.table.storage import Store, wait_for_cleanup

    store = Store(str(tmp_path / "view"))
    index = StoredIndex(store, "v", "0" * 16)
    old, fresh = index.path("old.parquet"), index.path("fresh.parquet")
    temp = f"{index.path('inflight.parquet')}.1a2b3c4d.tmp"
    for path in (old, fresh, temp):
        store.put(path, b"entry")
    past = time.time() - FRESH_SECONDS - 60
    os.utime(tmp_path / "view" / old, (past, past))
    assert index.sweep([]) == 1
    assert wait_for_cleanup(timeout=None)
    assert sorted(store.files(index.root)) == sorted([fresh, temp])
    # An hour on, both are leftovers: swept.
    assert index.sweep([], now=time.time() + FRESH_SECONDS + 60) == 2
    assert wait_for_cleanup(timeout=None) and store.files(index.root) == []

    stop, failures = threading.Event(), []

    def neighbour() -> None:
        while not stop.is_set():
            index.sweep([])
            wait_for_cleanup()

    sweeper = threading.Thread(target=neighbour)
    sweeper.start()
    try:
        for i in range(300):
            try:
                store.put(index.path(f"part-{i}.parquet"), b"entry")
            except OSError as exc:
                failures.append(exc)
    finally:
        stop.set()
        sweeper.join()
    assert failures == []
    assert len(store.files(index.root)) == 300
