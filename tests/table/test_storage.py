"""A table's files (``mvsink.table.storage``): whole-file puts and gets, listings, deletes now
and in the background, on local disk and on object stores reached through their options alone;
which columns get a Parquet dictionary; partition values typed from the log."""

from __future__ import annotations

import datetime as dt
import decimal
import os
import time

import numpy as np
import pyarrow as pa
import pytest

from mvsink import StorageError
from mvsink.table.storage import Store, partition_array, wait_for_cleanup
from tests.s3server import BUCKET


@pytest.fixture
def local(tmp_path) -> Store:
    root = tmp_path / "view"
    root.mkdir()
    return Store(str(root))


def test_a_put_is_read_back_whole_and_leaves_no_temporary_file(local):
    local.put("_mvsink/v/index/a.parquet", b"entry")
    local.put("_mvsink/v/index/a.parquet", pa.py_buffer(b"newer entry"))  # replaced whole
    got = local.get("_mvsink/v/index/a.parquet")
    assert got is not None and got.to_pybytes() == b"newer entry"
    assert local.get("_mvsink/v/index/none.parquet") is None
    assert os.listdir(os.path.join(local.root, "_mvsink", "v", "index")) == ["a.parquet"]


def test_listings_name_files_relative_to_the_root(local):
    files = {
        "_delta_log/00000000000000000000.json": b"{}",
        "_mvsink/v/index/a.parquet": b"ab",
        ".hidden": b"",
        "mvsink-0a1b/part-0.parquet": b"abc",
        "part-1.parquet": b"abcd",
        "year=2024/part-2.parquet": b"abcde",
    }
    for path, data in files.items():
        if "/" in path:
            local.put(path, data)
        else:  # at the root, as another writer puts them (mvsink puts files in folders only)
            with open(os.path.join(local.root, path), "wb") as fh:
                fh.write(data)
    assert sorted(local.files("")) == sorted(files)
    assert local.files("_mvsink") == ["_mvsink/v/index/a.parquet"]
    assert local.files("nowhere") == []
    listing = local.listing("year=2024")
    assert list(listing) == ["year=2024/part-2.parquet"]
    size, mtime = listing["year=2024/part-2.parquet"]
    assert size == 5 and abs(mtime - time.time()) < 600
    assert local.sizes(["part-1.parquet", "gone.parquet", "_mvsink/v/index/a.parquet"]) == {
        "part-1.parquet": 4,
        "_mvsink/v/index/a.parquet": 2,
    }
    assert local.sizes([]) == {}
    # Not Delta's, nor mvsink's (its folder, staging folders), nor hidden: another writer's.
    assert local.foreign() == ["part-1.parquet", "year=2024"]


@pytest.mark.parametrize("threads", [True, False])
def test_deletes_take_exactly_the_named_files_and_a_file_gone_is_no_error(local, threads):
    names = [f"d/{i}.parquet" for i in range(20)]
    for name in [*names, "e/keep.parquet"]:
        local.put(name, b"x")
    local.delete([*names[:15], "d/never-there.parquet"], threads=threads)
    assert sorted(local.files("")) == sorted([*names[15:], "e/keep.parquet"])
    local.delete([])


def test_a_staged_folder_is_deleted_whole_and_a_missing_one_is_no_error(local):
    for name in ("mvsink-1/a.parquet", "mvsink-1/p=1/b.parquet", "mvsink-2/c.parquet"):
        local.put(name, b"x")
    local.delete_folder("mvsink-1")
    assert not os.path.exists(os.path.join(local.root, "mvsink-1"))
    assert local.files("") == ["mvsink-2/c.parquet"]
    local.delete_folder("mvsink-9")
    assert local.files("") == ["mvsink-2/c.parquet"]


def test_background_deletes_on_local_disk_are_done_once_waited_for(local):
    names = [f"_mvsink/v/index/{i}.parquet" for i in range(5)]
    for name in names:
        local.put(name, b"x")
    local.delete_later(names[:4], "index entries")
    local.delete_later([], "index entries")
    assert wait_for_cleanup(timeout=None)
    assert local.files("_mvsink") == [names[4]]


def test_a_local_delete_that_fails_is_one_storage_error_after_the_others(tmp_path):
    root = tmp_path / "view"
    (root / "folder").mkdir(parents=True)
    (root / "a.parquet").write_bytes(b"x")
    with pytest.raises(StorageError, match=r"1 of 2 deletes under .* failed, e\.g\. folder"):
        Store(str(root)).delete(["folder", "a.parquet"], threads=False)
    assert os.listdir(root) == ["folder"]


@pytest.mark.parametrize(
    "value, to, want",
    [
        ("7", pa.int32(), 7),
        ("-3", pa.int64(), -3),
        ("1.5", pa.float64(), 1.5),
        ("true", pa.bool_(), True),
        ("FALSE", pa.bool_(), False),
        ("12.30", pa.decimal128(10, 2), decimal.Decimal("12.30")),
        ("2024-02-29", pa.date32(), dt.date(2024, 2, 29)),
        ("2024-02-29 00:00:00", pa.date32(), dt.date(2024, 2, 29)),
        ("2024-01-01 10:30:00", pa.timestamp("us"), dt.datetime(2024, 1, 1, 10, 30)),
        ("2024-01-01T10:30:00+02:00", pa.timestamp("us"), dt.datetime(2024, 1, 1, 8, 30)),
        (
            "2024-01-01 10:30:00",
            pa.timestamp("us", tz="UTC"),
            dt.datetime(2024, 1, 1, 10, 30, tzinfo=dt.UTC),
        ),
        (
            "2024-01-01 10:30:00-01:00",
            pa.timestamp("us", tz="UTC"),
            dt.datetime(2024, 1, 1, 11, 30, tzinfo=dt.UTC),
        ),
        ("a/b c", pa.string(), "a/b c"),
        ("bytes", pa.binary(), b"bytes"),
        (None, pa.int64(), None),
        (None, pa.string(), None),
    ],
)
def test_a_partition_value_from_the_log_is_typed_and_repeated(value, to, want):
    for n in (0, 1, 3):
        got = partition_array(value, to, n)
        assert got.type == to
        assert got.to_pylist() == [want] * n


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
