"""Object stores reached through ``storage_options`` alone, and stores that cannot be reached.

The server these tests write to is not the one the environment points at: a reader or writer
(driver or Spark task) that dropped the options would look in the wrong place and fail.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from mvsink import MVSink, StorageError, frontier
from mvsink.compat import to_arrow
from tests.helpers import multiset
from tests.s3server import BUCKET, free_port
from tests.test_sink import people


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


@pytest.mark.parametrize("count", [5, 200], ids=["in-process", "helper-processes"])
def test_deletes_go_to_the_store_the_options_name(spark, s3_target, s3_options, count):
    """Many deletes are spread over helper processes (delta-rs's handler holds the GIL while it
    waits, so threads would not overlap them); each helper reaches the store through the same
    options (the environment points at another server: options win). Exactly the named files
    go, and a file already gone is no error."""
    from concurrent.futures import ThreadPoolExecutor

    from mvsink.table.storage import Store
    from mvsink.table.uris import table_root

    store = Store(table_root(s3_target), s3_options)
    names = [f"_mvsink/x/index/d/{i:03d}.parquet" for i in range(count + 3)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda name: store.put(name, b"entry"), [*names, "keep.parquet"]))
    store.delete([*names[:count], "_mvsink/x/index/d/never-there.parquet"])
    assert sorted(store.files("_mvsink")) == names[count:]
    assert store.get("keep.parquet") is not None
    assert Store(table_root(s3_target)).files("") == []  # the environment's server: untouched


def test_background_deletes_reach_the_store_through_long_lived_helpers(spark, s3_target, s3_options):
    """``delete_later`` on an object store goes through long-lived helper processes (the
    epoch's thread keeps the GIL), with the options, not the environment, naming the store."""
    from mvsink.table.storage import Store, _background_deleter, wait_for_cleanup
    from mvsink.table.uris import table_root

    store = Store(table_root(s3_target), s3_options)
    names = [f"_mvsink/x/index/d/{i}.parquet" for i in range(6)]
    for name in names:
        store.put(name, b"entry")
    store.delete_later(names[:3], "index entries")
    store.delete_later(names[3:5], "index entries")
    assert wait_for_cleanup(timeout=None)
    assert store.files("_mvsink") == [names[5]]
    helpers = list(_background_deleter.procs)
    assert helpers and all(p.poll() is None for p in helpers)  # still there for the next job
    store.delete_later(names[5:], "index entries")
    assert wait_for_cleanup(timeout=None) and store.files("_mvsink") == []
    assert _background_deleter.procs[0] is helpers[0]  # reused, not started again


@pytest.fixture
def silent(tmp_path):
    """An S3 endpoint that accepts connections and never answers (``tests/silentserver.py``)."""
    from tests.silentserver import silent_server

    with silent_server(tmp_path / "silent.log") as server:
        yield server


def test_background_deletes_run_in_parallel_and_a_hung_store_is_given_up_on(silent):
    """Deletes queued in the background are all in flight at once (one request each, spread
    over the helpers), and ``wait_for_cleanup`` gives up at its bound: what is queued is
    dropped and the helpers end, so the process can exit; a sweep finds what stays."""
    from mvsink.table.storage import BACKGROUND_HELPERS, Store, _background_deleter, wait_for_cleanup

    store = Store(f"s3://{BUCKET}/hung/view", silent.options)
    names = [f"_mvsink/v/index/d/{i}.parquet" for i in range(BACKGROUND_HELPERS)]
    store.delete_later(names, "index entries")
    store.delete_later(["_mvsink/v/index/d/later.parquet"], "index entries")  # queued behind
    # One at a time, the second request would wait for the first's timeout (30 s by default).
    assert silent.wait_for_requests(len(names)) == len(names)
    assert not wait_for_cleanup(0.5)
    assert _background_deleter.procs == []  # the helpers in flight were ended
    assert wait_for_cleanup(5)  # nothing left queued: the next wait is immediate
    assert len(silent.requests()) == len(names)  # the dropped job never ran


@pytest.mark.newest_line
def test_a_process_whose_deletes_hang_exits_within_the_bound(silent, tmp_path):
    """As the CLI does, a process that queued deletes waits for them before it exits, and never
    longer than ``CLEANUP_WAIT`` however long the store takes to answer (at exit too)."""
    import json
    import subprocess
    import sys

    from mvsink.table.storage import CLEANUP_WAIT

    script = (
        "import json, sys\n"
        "from mvsink.table.storage import Store, _background_deleter, wait_for_cleanup\n"
        f"store = Store('s3://{BUCKET}/hung/view', json.loads(sys.argv[1]))\n"
        "for i in range(3):\n"
        "    store.delete_later([f'_mvsink/v/index/d/{i}.parquet'], 'index entries')\n"
        "print(json.dumps(wait_for_cleanup()))\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(silent.options)],
        capture_output=True,
        text=True,
        timeout=CLEANUP_WAIT + 60,
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "false"
    assert "left for the next sweep" in done.stderr
    assert took < CLEANUP_WAIT + 20, took  # three deletes one at a time: 90 s and more


def test_deletes_try_every_file_and_raise_one_storage_error(silent, tmp_path):
    """``Store.delete`` in this process tries every file before it raises, and raises a
    ``StorageError`` saying how many failed: on an object store that times out, and on local
    disk (a path that is a folder)."""
    import os

    from mvsink.table.storage import Store

    hung = Store(f"s3://{BUCKET}/hung/view", {**silent.options, "timeout": "1s", "max_retries": "0"})
    with pytest.raises(StorageError, match=r"3 of 3 deletes under s3://.* failed, e\.g\. a\.parquet"):
        hung.delete(["a.parquet", "b.parquet", "c.parquet"])
    assert len(silent.requests()) == 3  # every file was tried
    root = tmp_path / "table"
    (root / "folder").mkdir(parents=True)
    for name in ("a.parquet", "folder/x.parquet", "b.parquet"):
        (root / name).write_bytes(b"x")
    with pytest.raises(StorageError, match=r"1 of 4 deletes under .* failed, e\.g\. folder: "):
        Store(str(root)).delete(["a.parquet", "folder", "b.parquet", "never-there.parquet"])
    assert sorted(os.listdir(root)) == ["folder"]


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


@pytest.mark.parametrize("rows", [100, 200_000])
def test_a_dictionary_goes_to_the_columns_of_few_distinct_values_only(rows, monkeypatch):
    """Judged on 8192 evenly spaced rows past that many (``storage.dictionary_columns``), over
    any chunks: ids and measures get none, a status column or a mostly null one does."""
    import mvsink.table.storage as storage

    counted: list[int] = []
    count_distinct = storage.pc.count_distinct

    def spy(values, **kwargs):  # type: ignore[no-untyped-def]
        counted.append(len(values))
        return count_distinct(values, **kwargs)

    monkeypatch.setattr(storage.pc, "count_distinct", spy)
    ids = np.arange(rows)
    table = pa.table(
        {
            "id": ids,
            "amount": ids * 1.25,
            "name": pa.array([f"n{i}" for i in ids]),
            "status": pa.array(["open", "closed", "held"] * (rows // 3) + ["open"] * (rows % 3)),
            "sparse": pa.array([None if i % 10 else i for i in ids], pa.int64()),
        }
    )
    third = rows // 3
    chunked = pa.concat_tables([table.slice(0, third), table.slice(third, 0), table.slice(third)])
    assert storage.dictionary_columns(chunked) == ["status", "sparse"]
    assert counted == [min(rows, 8192)] * 5
