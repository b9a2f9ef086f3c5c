"""The complete-mode sink against real Spark and real Delta tables."""

from __future__ import annotations

import json
import math
import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame

import mvsink
from mvsink import MVSink, failpoints, frontier
from mvsink.compat import to_arrow
from tests.helpers import (
    added,
    assert_equal_to,
    commit_info,
    data_files_on_disk,
    foreign_append,
    frame,
    live_files,
    log_entry,
    multiset,
    people,
    removed,
    spark_read_listed,
    target_table,
    versions,
)

# Runs on both engines (tests/conftest.py: each line runs the engine it has).
pytestmark = pytest.mark.usefixtures("engine")


def test_first_epoch_creates_the_table_and_records_the_frontier(spark, target):
    sink = MVSink(target, "people")
    assert frontier(target, "people") is None
    desired = people(spark, range(10))
    report = sink(desired, 0)
    assert report.outcome == "committed" and report.version == 0
    assert frontier(target, "people") == 1
    assert sink.frontier() == 1
    assert_equal_to(target, desired)
    info = commit_info(target, 0)
    assert info["mvsink.view"] == "people"
    assert (info["mvsink.epoch"], info["mvsink.lower"], info["mvsink.upper"]) == ("0", "", "1")
    assert info["mvsink.inserted"] == "10" and info["mvsink.retracted"] == "0"
    assert int(info["mvsink.files_added"]) == len(added(target, 0)) >= 1
    assert info["mvsink.files_removed"] == "0"


def test_each_epoch_leaves_the_target_equal_to_desired_and_advances_the_frontier(spark, target, placement):
    sink = MVSink(target, "people", placement=placement)
    for epoch, ids in enumerate([range(0, 10), range(5, 15), range(0, 3), range(100, 101)]):
        desired = people(spark, ids, suffix=str(epoch % 2))
        report = sink(desired, epoch)
        assert_equal_to(target, desired)
        assert frontier(target, "people") == epoch + 1
        info = commit_info(target, report.version)
        assert info["mvsink.lower"] == ("" if epoch == 0 else str(epoch))
        assert info["mvsink.upper"] == str(epoch + 1)
        assert int(info["mvsink.inserted"]) == report.inserted
        assert int(info["mvsink.retracted"]) == report.retracted
        assert int(info["mvsink.files_removed"]) == len(removed(target, report.version))
        # What DESCRIBE HISTORY shows in its userMetadata column, for a person.
        assert info["userMetadata"] == (
            f"mvsink view people epoch {epoch}: +{report.inserted} -{report.retracted} rows, files "
            f"+{report.files_added} -{report.files_removed}, frontier {epoch + 1}, lineage direct, "
            f"writer {info['mvsink.writer']}"
        )


def test_duplicates_nulls_and_nan_are_kept_exactly(spark, target, placement):
    sink = MVSink(target, "dups", max_rows_per_file=2, placement=placement)
    nan = float("nan")
    rows = [(1, "a", 1.0)] * 3 + [(None, None, None)] * 2 + [(2, None, nan)] * 2 + [(3, "c", -0.0)]
    sink(frame(spark, rows), 0)
    assert_equal_to(target, frame(spark, rows))
    # Fewer copies of one row, more of another, NaN rows unchanged: only counts move.
    rows2 = [(1, "a", 1.0)] * 1 + [(None, None, None)] * 4 + [(2, None, nan)] * 2 + [(3, "c", 0.0)]
    report = sink(frame(spark, rows2), 1)
    assert (report.inserted, report.retracted) == (2, 2)
    assert_equal_to(target, frame(spark, rows2))
    # The same multiset again: NaN compares equal to NaN, so nothing is written.
    again = sink(frame(spark, list(reversed(rows2))), 2)
    assert (again.inserted, again.retracted, again.files_added) == (0, 0, 0)


def test_only_files_holding_retracted_rows_are_rewritten(spark, target, placement):
    sink = MVSink(target, "files", max_rows_per_file=10, placement=placement)
    sink(people(spark, range(100)), 0)
    before = live_files(target)
    assert len(before) >= 5
    holder = {}
    for path in before:
        for row in pa.parquet.read_table(os.path.join(target, path)).column("id").to_pylist():
            holder[row] = path
    # Change rows 3 and 4 (same file or two files), drop row 50, add row 1000.
    desired = people(spark, [i for i in range(100) if i != 50]).unionByName(
        frame(spark, [(1000, "new", 1.0)])
    )
    desired = desired.where("id not in (3, 4)").unionByName(
        frame(spark, [(3, "changed", 0.0), (4, "changed", 0.0)])
    )
    report = sink(desired, 1)
    assert_equal_to(target, desired)
    assert set(removed(target, report.version)) == {holder[3], holder[4], holder[50]}
    assert before - {holder[3], holder[4], holder[50]} <= live_files(target)
    assert (report.inserted, report.retracted) == (3, 3)
    # Each rewritten file lost only its retracted rows; inserts went to new files.
    new_rows = sum(
        pa.parquet.read_metadata(os.path.join(target, p)).num_rows for p in added(target, report.version)
    )
    old_rows = sum(
        pa.parquet.read_metadata(os.path.join(target, p)).num_rows for p in removed(target, report.version)
    )
    assert new_rows == old_rows - 3 + 3


def test_an_unchanged_epoch_commits_only_the_frontier(spark, target, placement):
    sink = MVSink(target, "same", placement=placement, heartbeat=0)  # a heartbeat every epoch
    desired = people(spark, range(20))
    sink(desired, 0)
    files = live_files(target)
    report = sink(desired, 1)
    assert report.outcome == "committed" and report.version == 1
    assert added(target, 1) == [] and removed(target, 1) == []
    assert live_files(target) == files
    assert frontier(target, "same") == 2


def test_rogue_inserts_deletes_and_duplicates_are_repaired_next_epoch(spark, target, placement):
    sink = MVSink(target, "heal", max_rows_per_file=5, placement=placement)
    desired = people(spark, range(20))
    sink(desired, 0)
    foreign_append(target, [{"id": 999, "name": "rogue", "x": 1.0}])
    foreign_append(target, [{"id": 7, "name": "n7", "x": 3.5}] * 2)  # duplicates of a real row
    DeltaTable(target).delete("id = 3 OR id = 12")
    assert multiset(target_table(target)) != multiset(to_arrow(desired))
    report = sink(desired, 1)
    assert report.outcome == "committed"
    assert (report.inserted, report.retracted) == (2, 3)
    assert_equal_to(target, desired)


def test_a_replayed_epoch_writes_nothing_and_creates_no_version(spark, target, placement):
    sink = MVSink(target, "replay", placement=placement)
    sink(people(spark, range(5)), 0)
    sink(people(spark, range(6)), 1)
    before = versions(target)
    # Spark replays batch 1 after a restart, and a lagging replica sends batch 0.
    for epoch in (1, 0):
        report = MVSink(target, "replay", placement=placement)(people(spark, range(99)), epoch)
        assert report.outcome == "replay" and report.version is None
    assert versions(target) == before
    assert_equal_to(target, people(spark, range(6)))


def test_epochs_before_as_of_produce_nothing_then_the_frontier_jumps(spark, target, placement):
    sink = MVSink(target, "asof", as_of=5, placement=placement)
    for epoch in range(5):
        assert sink(people(spark, range(epoch + 1)), epoch).outcome == "before_as_of"
    assert not os.path.exists(target)
    sink(people(spark, range(3)), 5)
    assert frontier(target, "asof") == 6
    # A target whose frontier is behind jumps straight to the new upper.
    report = sink(people(spark, range(4)), 9)
    assert (report.lower, report.upper) == (6, 10)
    assert frontier(target, "asof") == 10
    assert_equal_to(target, people(spark, range(4)))


def test_read_only_sink_reports_the_correction_and_commits_nothing(spark, target, placement):
    MVSink(target, "ro", placement=placement)(people(spark, range(10)), 0)
    standby = MVSink(target, "ro", read_only=True, placement=placement, writer="green")
    report = standby(people(spark, range(5, 12)), 1)
    assert report.outcome == "read_only"
    assert (report.inserted, report.retracted) == (2, 5)
    assert versions(target) == [0]
    standby.promote()
    assert not standby.read_only
    assert standby(people(spark, range(5, 12)), 1).outcome == "committed"
    assert_equal_to(target, people(spark, range(5, 12)))


def test_spark_reads_the_listed_files_as_desired(spark, target):
    sink = MVSink(target, "spark")
    desired = people(spark, range(30))
    sink(desired, 0)
    sink(people(spark, range(10, 40)), 1)
    got = multiset(to_arrow(spark_read_listed(spark, target)))
    assert got == multiset(to_arrow(people(spark, range(10, 40))))


def test_public_api_is_pinned():
    assert mvsink.__all__ == sorted(mvsink.__all__)
    assert set(mvsink.__all__) == {
        "CommitOutcomeUnknownError",
        "CommitReplacedError",
        "ConfigError",
        "ConflictError",
        "DuplicateKeyError",
        "EpochReport",
        "HistoryBehindError",
        "IdentityChangedError",
        "InputError",
        "InvariantViolation",
        "LineageError",
        "MVSink",
        "MVSinkError",
        "RetriesExhaustedError",
        "RetryPolicy",
        "SchemaMismatchError",
        "SinkOptions",
        "SparkJobError",
        "StorageError",
        "TableHeldError",
        "UnsupportedTableError",
        "__version__",
        "as_of",
        "frontier",
        "promote",
        "Status",
        "status",
        "Vacuum",
        "vacuum",
        "Verification",
        "verify",
    }


def test_nan_is_not_a_float_problem_in_stats(spark, target):
    # Stats must never carry NaN: a NaN-bearing file must leave the table readable.
    sink = MVSink(target, "nan")
    desired = frame(spark, [(1, "a", math.nan), (2, "b", math.inf), (3, "c", -math.inf)])
    sink(desired, 0)
    assert_equal_to(target, desired)
    assert DeltaTable(target).to_pyarrow_table().num_rows == 3


def test_staged_files_outside_hidden_folders_and_none_left_behind(spark, target):
    sink = MVSink(target, "staging", max_rows_per_file=4)
    sink(people(spark, range(12)), 0)
    sink(people(spark, range(3, 15)), 1)
    on_disk = data_files_on_disk(target)
    ever = {p for v in versions(target) for p in added(target, v)}
    assert on_disk == ever  # every data file on disk was committed at some version
    assert all(not part.startswith(("_", ".")) for p in on_disk for part in p.split(os.sep)[:-1])
    # No writer's leftovers among the data (the log is Delta's: the JVM keeps checksums there).
    leftovers = [n for d, _, ns in os.walk(target) if "_delta_log" not in d for n in ns]
    assert not any(n.endswith(".crc") or n == "_SUCCESS" for n in leftovers)


def test_an_empty_desired_empties_the_view_and_can_create_it(spark, target, placement, tmp_path):
    sink = MVSink(target, "empty", max_rows_per_file=3, placement=placement)
    sink(people(spark, range(7)), 0)
    report = sink(people(spark, range(0)), 1)
    assert report.retracted == 7 and report.files_added == 0
    assert target_table(target).num_rows == 0
    assert frontier(target, "empty") == 2
    fresh = str(tmp_path / "fresh")
    MVSink(fresh, "fresh", placement=placement)(people(spark, range(0)), 0)
    assert target_table(fresh).column_names == ["id", "name", "x"]
    assert frontier(fresh, "fresh") == 1


def test_without_the_cache_desired_is_evaluated_twice_and_still_exact(spark, target):
    sink = MVSink(target, "nocache", cache_desired=False)
    sink(people(spark, range(10)), 0)
    desired = people(spark, range(5, 15))
    report = sink(desired, 1)
    assert (report.inserted, report.retracted) == (5, 5)
    assert_equal_to(target, desired)


def test_a_nondeterministic_desired_is_written_as_one_evaluation(spark, target, placement):
    from pyspark.sql import functions as F

    sink = MVSink(target, "shaky", placement=placement)
    # current_timestamp() is fixed per query, and every evaluation is a new query: rows mixed
    # from two evaluations would show two values of x.
    now = F.unix_micros(F.current_timestamp()).cast("double")
    shaky = people(spark, range(10)).withColumn("x", now)
    first = sink(shaky, 0)
    held = target_table(target).to_pylist()
    assert first.inserted == 10 and len(held) == 10 and len({r["x"] for r in held}) == 1
    second = sink(shaky, 1)  # a new evaluation: every row changed, the target is that one
    held_again = target_table(target).to_pylist()
    assert (second.inserted, second.retracted) == (10, 10)
    assert len(held_again) == 10 and len({r["x"] for r in held_again}) == 1
    assert {r["x"] for r in held_again} != {r["x"] for r in held}


def test_a_target_path_with_glob_characters(spark, tmp_path):
    target = str(tmp_path / "v[1]{a,b}*?")
    sink = MVSink(target, "glob", max_rows_per_file=3)
    sink(people(spark, range(10)), 0)
    desired = people(spark, [*range(2, 8), 20])
    report = sink(desired, 1)
    assert report.files_removed > 0  # rewritten files were read back by Spark under that path
    assert_equal_to(target, desired)


def test_timestamps_at_the_end_of_time_keep_the_stream_going(spark, target):
    import datetime as dt

    end = dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
    rows = [(1, dt.datetime(2024, 1, 1)), (2, end), (3, None)]
    desired = spark.createDataFrame(rows, "id long, valid_until timestamp")
    sink = MVSink(target, "history")
    sink(desired, 0)
    assert_equal_to(target, desired)
    stats = [json.loads(a["add"]["stats"]) for a in log_entry(target, 0) if "add" in a]
    # The file holding the end of time has no bound rather than a wrong one.
    assert any("valid_until" not in s["maxValues"] for s in stats)
    assert all(s["maxValues"].get("valid_until", "") < "9999" for s in stats)
    assert max(s["maxValues"]["id"] for s in stats) == 3
    again = sink(desired, 1)
    assert (again.inserted, again.retracted) == (0, 0)


def test_a_staged_file_gone_before_the_commit_fails_the_epoch_and_commits_nothing(spark, target, placement):
    from mvsink import InvariantViolation
    from tests.helpers import store

    sink = MVSink(target, "vanish", placement=placement)
    sink(people(spark, range(10)), 0)

    def vacuum_too_eager(snap: object) -> None:
        staged = data_files_on_disk(target) - live_files(target)
        store(target).fs.delete_file(sorted(staged)[0])

    armed = failpoints.armed({"before_commit": vacuum_too_eager}, view="vanish")
    with armed, pytest.raises(InvariantViolation, match="missing or changed before the commit"):
        sink(people(spark, range(5, 15)), 1)
    assert versions(target) == [0]
    assert data_files_on_disk(target) == live_files(target)  # the attempt's files are gone


def test_a_file_whose_every_row_goes_is_removed_without_being_read(spark, target, placement):
    sink = MVSink(target, "drop", max_rows_per_file=5, placement=placement)
    sink(people(spark, range(20)), 0)
    report = sink(people(spark, range(10, 20)), 1)  # the files holding ids 0..9 go whole
    assert report.retracted == 10 and report.inserted == 0
    assert report.files_read == 0 and report.files_added == 0
    assert_equal_to(target, people(spark, range(10, 20)))


def test_a_foreign_file_naming_a_column_in_another_case_is_read_by_name(spark, target):
    from tests.helpers import put_parquet

    sink = MVSink(target, "case", mode="upsert", key=["id"])
    sink(spark.createDataFrame([(1, 10), (2, 20)], "id long, Amount long"), 0)
    # Another writer stores the column as "amount": Delta matches names regardless of case.
    size = put_parquet(target, "foreign.parquet", pa.table({"id": [3, 4], "amount": [30, 40]}))
    from deltalake.transaction import AddAction

    dtable = DeltaTable(target)
    dtable.create_write_transaction(
        [AddAction("foreign.parquet", size, {}, 0, True, '{"numRecords":2}')],
        mode="append",
        schema=dtable.schema(),
    )
    sink(spark.createDataFrame([(3, 31)], "id long, Amount long"), 1)  # rewrites the foreign file
    got = {r["id"]: r["Amount"] for r in target_table(target).to_pylist()}
    assert got == {1: 10, 2: 20, 3: 31, 4: 40}


def test_an_index_of_an_older_fingerprint_version_is_never_used_and_is_rebuilt_once(spark, target, placement):
    from mvsink.errors import Where
    from mvsink.table.delta import load_snapshot
    from mvsink.table.fingerprint import FINGERPRINT_VERSION, fingerprints
    from mvsink.table.index import FileEntry, StoredIndex
    from mvsink.table.schema import arrow_schema, target_struct
    from mvsink.table.storage import Store

    MVSink(target, "old", max_rows_per_file=4, placement=placement)(people(spark, range(12)), 0)
    snap = load_snapshot(target, "mvsink:old", {}, Where("old", target))
    assert snap.schema_json is not None
    schema = arrow_schema(target_struct(snap.schema_json))
    store = Store(snap.root)
    current = StoredIndex.of(store, "old", schema)
    older = StoredIndex.of(store, "old", schema, version=FINGERPRINT_VERSION - 1)
    assert older.digest != current.digest
    # The table as an older mvsink left it: entries under the old version's folder only. These
    # hold what the next desired's rows hash to, so a sink that used them would see nothing to do.
    changed = people(spark, range(12), suffix="-new")
    for f in snap.files:
        rows = store.read(f, schema, ())
        renamed = rows.set_column(1, "name", pa.array([f"{n}-new" for n in rows.column("name").to_pylist()]))
        older.put(f.key, f.size, FileEntry(*fingerprints(renamed)))
    current.forget(f.key for f in snap.files)

    restarted = MVSink(target, "old", max_rows_per_file=4, placement=placement)
    report = restarted(changed, 1)
    assert (report.inserted, report.retracted) == (12, 12)
    if placement == "driver":  # (tasks do the reading on the distributed path)
        assert report.files_read == len(snap.files)  # every file read and re-indexed, once
    assert_equal_to(target, changed)
    again = MVSink(target, "old", max_rows_per_file=4, placement=placement)(changed, 2)
    assert (again.inserted, again.retracted, again.files_read) == (0, 0, 0)


def test_a_correction_touching_most_files_writes_desired_whole(spark, target, monkeypatch):
    import mvsink.plan.complete

    monkeypatch.setattr(mvsink.plan.complete, "WHOLE_MIN_BYTES", 0)  # the tables here are small
    sink = MVSink(target, "whole", max_rows_per_file=5, placement="driver")
    sink(people(spark, range(40)), 0)
    before = live_files(target)
    # One row in each file changes: rewriting every file moves more bytes than writing desired.
    scattered = frame(spark, [(i, f"n{i}" + ("!" if i % 5 == 2 else ""), i / 2) for i in range(40)])
    report = sink(scattered, 1)
    assert report.whole and (report.inserted, report.retracted) == (40, 40)
    assert set(removed(target, report.version)) == before
    assert commit_info(target, report.version)["mvsink.whole"] == "true"
    assert_equal_to(target, scattered)
    # Spark wrote the files and their index entries: the next epoch reads nothing, writes nothing.
    same = sink(scattered, 2)
    assert (same.inserted, same.retracted, same.files_read, same.whole) == (0, 0, 0, False)
    # A change confined to one file is corrected file by file.
    one = frame(
        spark,
        [(i, f"n{i}" + ("!" if i % 5 == 2 else "") + ("?" if i == 0 else ""), i / 2) for i in range(40)],
    )
    narrow = sink(one, 3)
    assert not narrow.whole and (narrow.inserted, narrow.retracted) == (1, 1)
    assert "mvsink.whole" not in commit_info(target, narrow.version)
    assert_equal_to(target, one)


def test_rows_to_insert_past_the_drivers_share_are_written_by_spark_tasks(spark, target, monkeypatch, caplog):
    import mvsink.plan.complete

    monkeypatch.setattr(mvsink.plan.complete, "DRIVER_INSERT_ROWS", 0)
    caplog.set_level("INFO", logger="mvsink")
    sink = MVSink(target, "tasks", max_rows_per_file=3, placement="driver")
    rows = [(1, "a", 1.0)] * 3 + [(2, None, float("nan"))] + [(3, "c", -0.0)]
    sink(frame(spark, rows), 0)
    # More copies of one row, a new row, one gone: the inserts come from tasks, copies exact.
    rows2 = [(1, "a", 1.0)] * 5 + [(2, None, float("nan"))] + [(4, "d", 4.0)] * 2
    report = sink(frame(spark, rows2), 1)
    assert (report.inserted, report.retracted) == (4, 1)
    assert any("written by Spark tasks" in r.getMessage() for r in caplog.records)
    assert_equal_to(target, frame(spark, rows2))
    # The tasks stored the new files' index entries from Spark's fingerprints: nothing to do next.
    again = sink(frame(spark, list(reversed(rows2))), 2)
    assert (again.inserted, again.retracted, again.files_read) == (0, 0, 0)


def test_a_batch_the_caller_cached_gives_the_rows_to_insert_from_its_cache(spark, target, caplog):
    """The sink leaves a cached batch cached, and no cache of its own behind: the rows to insert
    are found in the caller's cache by their fingerprints' first lane, the second computed
    for those rows only; copies of a duplicated row come exactly as inserted. Columns named
    with a dot and a backtick resolve on that path too."""
    caplog.set_level("INFO", logger="mvsink")

    def view(changed: int) -> DataFrame:
        rows = spark.range(40).selectExpr(
            "id AS `a.b`", f"concat('n', id, IF(id % 7 = {changed}, '!', '')) AS `c``d`", "id / 2 AS x"
        )
        return rows.unionAll(rows.where("`a.b` = 3")).unionAll(rows.where("`a.b` = 3"))

    sink = MVSink(target, "theirs", max_rows_per_file=10, placement="driver")
    sink(view(-1).dropDuplicates(), 0)
    desired = view(0).cache()
    desired.count()
    cached = spark.sparkContext._jsc.sc().getPersistentRDDs().size()  # other tests' too
    report = sink(desired, 1)
    assert (report.inserted, report.retracted) == (8, 6) and "fetch" in report.phases
    assert not any("written by Spark tasks" in r.getMessage() for r in caplog.records)
    assert desired.storageLevel.useMemory  # left cached, and nothing of the sink's stays
    assert spark.sparkContext._jsc.sc().getPersistentRDDs().size() == cached
    desired.unpersist()
    assert_equal_to(target, view(0))


def test_a_fetch_lacking_a_fingerprint_has_spark_tasks_write_the_rows(spark, tmp_path, monkeypatch, caplog):
    """When the rows fetched from the cache are not the ones the diff inserts (a cache
    recomputed since, by a nondeterministic query), Spark tasks write them, counted against
    the diff."""
    import mvsink.plan.complete

    monkeypatch.setattr(mvsink.plan.complete, "_copies", lambda got, corr: None)
    target = str(tmp_path / "view")
    sink = MVSink(target, "refetch", placement="driver")
    sink(people(spark, range(20)), 0)
    caplog.set_level("WARNING", logger="mvsink")
    desired = people(spark, range(5, 25))
    report = sink(desired, 1)
    assert (report.inserted, report.retracted) == (5, 5)
    assert any("written by Spark tasks" in r.getMessage() for r in caplog.records)
    assert_equal_to(target, desired)


@pytest.mark.parametrize("mode", ["complete", "upsert", "append"])
def test_columns_named_with_dots_and_backticks_are_written_in_every_mode(spark, target, placement, mode):
    """Spark's ``mapInArrow`` hands its tasks each column by name, unquoted, so such a column
    did not resolve and the epoch failed (``compat.map_in_arrow``)."""

    def view(ids: range) -> DataFrame:
        return spark.range(ids.start, ids.stop).selectExpr(
            "id AS `a.b`", "cast(id % 3 AS string) AS `c``d`", "id * 1.5 AS x"
        )

    keyed = {"key": ["a.b"]} if mode == "upsert" else {}
    sink = MVSink(target, "dots", placement=placement, mode=mode, max_rows_per_file=8, **keyed)
    sink(view(range(0, 20)), 0)
    sink(view(range(10, 30)), 1)
    expected = {
        "complete": view(range(10, 30)),
        "upsert": view(range(0, 30)),
        "append": view(range(0, 20)).unionAll(view(range(10, 30))),
    }[mode]
    assert_equal_to(target, expected)
