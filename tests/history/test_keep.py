"""Keeping a view's history: each version of the view's table, as lifetimes, whoever made it,
on both engines and both placements; crashes, races, replays and restarts; bad input."""

from __future__ import annotations

import os
import shutil

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from mvsink import ConfigError, MVSink, SchemaMismatchError, UnsupportedTableError, failpoints
from mvsink.ops.compact import compact
from tests.helpers import (
    added,
    assert_holds_every_version,
    commit_info,
    data_files_on_disk,
    foreign_append,
    frame,
    history_frontier,
    lifetimes,
    once,
    people,
    versions,
)

pytestmark = pytest.mark.usefixtures("engine")

FAST = {"retry": {"initial_backoff_s": 0.0, "max_backoff_s": 0.01}}


def open_lifetimes(history: str) -> list[tuple]:
    return sorted(
        (r["id"], r["opened_version"], r["valid_from"]) for r in lifetimes(history) if r["valid_to"] is None
    )


def test_the_history_holds_every_version_of_a_complete_view(spark, target, placement):
    history = f"{target}_history"
    sink = MVSink(target, "people", history_target=history, placement=placement)
    batches = [
        (range(0, 10), "a"),
        (range(5, 15), "b"),
        ([1, 1, 2, 2, 2], "c"),
        ([1, 2, 2], "c"),
        ([100], "d"),
    ]
    for epoch, (ids, suffix) in enumerate(batches):
        sink(people(spark, ids, suffix=suffix), epoch)
    assert_holds_every_version(target, history, "people")
    rows = lifetimes(history)
    # Epoch 3 kept one (1) and two (2) of epoch 2's rows: their lifetimes go on.
    kept = [r for r in rows if r["id"] in (1, 2) and r["opened_epoch"] == 2]
    assert sorted((r["id"], r["closed_epoch"]) for r in kept) == [(1, 3), (1, 4), (2, 3), (2, 4), (2, 4)]
    assert all(r["opened_by"] == "epoch" for r in rows)
    assert all(r["valid_to"] is None or r["valid_to"] >= r["valid_from"] for r in rows)
    info = commit_info(history, 0)
    assert info["mvsink.history_of"] == "people" and info["mvsink.view_version"] == "0"


def test_append_mode_lifetimes_never_close(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = MVSink(target, "events", mode="append", history_target=history)
    for epoch in range(3):
        sink(people(spark, range(epoch * 3, epoch * 3 + 3)), epoch)
        if epoch == 0:
            foreign_append(target, [{"id": 99, "name": "theirs", "x": 0.0}])  # an append view keeps it
    compact(target, "events", max_rows_per_file=100)
    assert history_frontier(history, "events") == DeltaTable(target).version()  # the next epoch completes it
    sink(people(spark, range(50, 52)), 3)
    assert_holds_every_version(target, history, "events")
    rows = lifetimes(history)
    assert len(rows) == 12 and all(r["valid_to"] is None for r in rows)
    assert {r["opened_by"] for r in rows} == {"epoch", "foreign"}  # (no epoch repairs an append view)


def test_a_crash_between_the_views_commit_and_the_historys_is_completed_by_the_next_epoch(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = MVSink(target, "v", history_target=history)
    sink(people(spark, range(5)), 0)
    with failpoints.armed({"after_commit": "raise"}, view="v"), pytest.raises(failpoints.InjectedFault):
        sink(people(spark, range(3, 8)), 1)
    assert DeltaTable(target).version() == 1 and history_frontier(history, "v") == 1  # one behind
    restarted = MVSink(target, "v", history_target=history)
    assert restarted(people(spark, range(3, 8)), 1).outcome == "replay"  # Spark runs the batch again
    assert_holds_every_version(target, history, "v")
    assert versions(history) == [0, 1]  # one history commit per version of the view


def test_a_crash_right_after_the_first_commit_begins_the_history_at_the_views_first_version(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = MVSink(target, "v", history_target=history)
    with failpoints.armed({"after_commit": "raise"}, view="v"), pytest.raises(failpoints.InjectedFault):
        sink(people(spark, range(3)), 0)
    foreign_append(target, [{"id": 9, "name": "rogue", "x": 0.0}])
    assert not os.path.exists(history)
    MVSink(target, "v", history_target=history)(people(spark, range(4)), 1)
    assert_holds_every_version(target, history, "v")
    assert {r["opened_by"] for r in lifetimes(history)} == {"epoch", "foreign", "repair"}


def test_a_replay_adds_nothing_to_the_history(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = MVSink(target, "v", history_target=history)
    sink(people(spark, range(5)), 0)
    sink(people(spark, range(2, 6)), 1)
    before = versions(history)
    assert sink(people(spark, range(2, 6)), 1).outcome == "replay"
    assert versions(history) == before
    assert_holds_every_version(target, history, "v")


def test_replicas_racing_hold_each_versiononce(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    a = MVSink(target, "rep", history_target=history, **FAST)
    b = MVSink(target, "rep", history_target=history, **FAST)
    a(people(spark, range(5)), 0)
    desired = people(spark, range(2, 9))
    # b commits epoch 1 (and its history) inside a's attempt, between a's snapshot and commit.
    with failpoints.armed({"before_commit": once(lambda: b(desired, 1))}, view="rep"):
        assert a(desired, 1).outcome == "replay"
    # a's view commit lands and a crashes before its history's; then a's replay stages the
    # history's commit and, in that window, b's epoch lands the same history version first.
    with failpoints.armed({"after_commit": "raise"}, view="rep"), pytest.raises(failpoints.InjectedFault):
        a(people(spark, range(0, 4)), 2)
    raced = []

    def b_first(snap):
        if not raced:
            raced.append(snap.version)
            assert b(people(spark, range(6, 12)), 3).outcome == "committed"

    with failpoints.armed({"history_before_commit": b_first}, view="rep"):
        assert a(people(spark, range(0, 4)), 2).outcome == "replay"
    assert raced  # a's history commit lost to b's, and a found the version held
    assert_holds_every_version(target, history, "rep")
    assert len(versions(history)) == DeltaTable(target).version() + 1  # one commit per version
    # Only files some history version added are on disk: the loser's staged files are gone.
    assert data_files_on_disk(history) == {p for v in versions(history) for p in added(history, v)}


def test_a_restart_from_a_new_checkpoint_goes_on_with_the_history(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    first = MVSink(target, "v", history_target=history, lineage="q1")
    for epoch in range(3):
        first(people(spark, range(epoch, epoch + 4)), epoch)
    second = MVSink(target, "v", history_target=history, lineage="q2")  # epochs count from 0 again
    for epoch in range(2):
        second(people(spark, range(10 + epoch, 14)), epoch)
    assert_holds_every_version(target, history, "v")


def test_a_standby_keeps_no_history_and_once_promoted_completes_it(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    blue = MVSink(target, "v", writer="blue", history_target=history)
    green = MVSink(target, "v", writer="green", read_only=True, history_target=history)
    blue(people(spark, range(5)), 0)
    with failpoints.armed({"after_commit": "raise"}, view="v"), pytest.raises(failpoints.InjectedFault):
        blue(people(spark, range(1, 6)), 1)
    before = versions(history)
    assert green(people(spark, range(1, 6)), 1).outcome != "committed"
    assert versions(history) == before  # a standby writes nothing, not even history
    green.promote()
    green(people(spark, range(2, 9)), 2)
    assert_holds_every_version(target, history, "v")


def test_a_foreign_write_is_history_and_so_is_its_repair(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = MVSink(target, "v", history_target=history)
    desired = people(spark, range(4))
    sink(desired, 0)
    foreign_append(target, [{"id": 77, "name": "rogue", "x": 0.0}])
    sink(desired, 1)  # repairs the view
    assert_holds_every_version(target, history, "v")
    [rogue] = [r for r in lifetimes(history) if r["id"] == 77]
    assert (rogue["opened_by"], rogue["opened_epoch"], rogue["opened_version"]) == ("foreign", None, 1)
    assert (rogue["closed_by"], rogue["closed_epoch"], rogue["closed_version"]) == ("repair", 1, 2)
    sink(people(spark, range(5)), 2)
    assert {r["opened_by"] for r in lifetimes(history) if r["opened_version"] == 3} == {"epoch"}


def test_a_compaction_moves_rows_without_changing_a_lifetime(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = MVSink(target, "v", history_target=history, max_rows_per_file=2)
    sink(people(spark, range(6)), 0)
    sink(people(spark, range(8)), 1)
    before = sorted(
        (r["id"], r["opened_version"], r["valid_from"]) for r in lifetimes(history) if r["valid_to"] is None
    )
    assert compact(target, "v", max_rows_per_file=100).version is not None
    sink(people(spark, range(8)), 2)  # completes the history over the compaction
    assert_holds_every_version(target, history, "v")
    after = sorted(
        (r["id"], r["opened_version"], r["valid_from"]) for r in lifetimes(history) if r["valid_to"] is None
    )
    assert after == before


def test_a_partitioned_view_with_a_row_in_a_folder_of_its_own(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = MVSink(target, "v", history_target=history, partition_by=["name"], max_rows_per_file=2)
    rows = [(1, "a b", 1.0), (2, "x%y", 2.0), (3, "a b", 3.0), (3, "a b", 3.0), (4, None, 4.0)]
    sink(frame(spark, rows), 0)
    sink(frame(spark, [*rows[1:], (5, "x%y", 5.0)]), 1)
    sink(frame(spark, rows[2:4]), 2)
    assert_holds_every_version(target, history, "v")


def test_a_history_begun_on_a_view_that_holds_rows_starts_with_them(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    MVSink(target, "v")(people(spark, range(3)), 0)
    MVSink(target, "v")(people(spark, range(1, 4)), 1)
    sink = MVSink(target, "v", history_target=history)
    sink(people(spark, range(2, 6)), 2)
    assert_holds_every_version(target, history, "v", since=1)
    started = [r for r in lifetimes(history) if r["opened_by"] == "start"]
    assert sorted(r["id"] for r in started) == [1, 2, 3] and {r["opened_version"] for r in started} == {1}


# -- bad input: a clear error before anything is staged, the view untouched -----------------


def _untouched(target: str, version: int | None) -> None:
    if version is None:
        assert not os.path.exists(os.path.join(target, "_delta_log"))
    else:
        assert DeltaTable(target).version() == version
    # Nothing staged is left: every data file on disk is one a version added.
    on_disk = data_files_on_disk(target) if os.path.exists(target) else set()
    assert on_disk == {p for v in (versions(target) if version is not None else []) for p in added(target, v)}


PEOPLE_HISTORY = pa.schema(
    [("id", pa.int64()), ("name", pa.string()), ("x", pa.float64())]
    + [(c, pa.timestamp("us", "UTC")) for c in ("valid_from", "valid_to")]
    + [(c, pa.int64()) for c in ("opened_version", "opened_epoch")]
    + [("opened_by", pa.string())]
    + [(c, pa.int64()) for c in ("closed_version", "closed_epoch")]
    + [("closed_by", pa.string())]
)
"""The history of ``people`` as a platform's ``CREATE TABLE`` lists it (docs/history.md)."""


def test_an_empty_table_made_with_the_historys_columns_is_where_the_history_begins(spark, tmp_path):
    """A table made for the history (a catalog's ``CREATE TABLE``: empty, the history's
    columns) takes it from the view's first version on, and keeps its id and properties."""
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    made = DeltaTable.create(
        history, schema=PEOPLE_HISTORY, configuration={"delta.logRetentionDuration": "interval 60 days"}
    )
    table_id = made.metadata().id
    sink = MVSink(target, "v", history_target=history)
    for epoch, ids in enumerate((range(5), range(2, 8), range(3, 4))):
        assert sink(people(spark, ids, str(epoch % 2)), epoch).outcome == "committed"
    assert_holds_every_version(target, history, "v")
    table = DeltaTable(history)
    assert table.metadata().id == table_id
    assert table.metadata().configuration["delta.logRetentionDuration"] == "interval 60 days"


def test_a_delta_table_unfit_for_the_history_is_refused_with_the_columns_it_takes(spark, tmp_path):
    """An empty table is taken only as made for the history: none with files (now or ever),
    partitions, mapped column names, properties its commits cannot keep, NOT NULL or other
    columns."""
    target = str(tmp_path / "t")
    MVSink(target, "v")(people(spark, range(3)), 0)
    rows = pa.Table.from_pylist([{"id": 1}], schema=PEOPLE_HISTORY)
    fewer = pa.schema([f for f in PEOPLE_HISTORY if f.name != "closed_by"])
    mapped = {
        "delta.columnMapping.mode": "name",
        "delta.minReaderVersion": "2",
        "delta.minWriterVersion": "5",
    }
    not_null = pa.schema([f.with_nullable(f.name != "closed_by") for f in PEOPLE_HISTORY])

    def emptied(h: str) -> None:  # a file added, then every row deleted: empty, but written
        write_deltalake(h, rows)
        DeltaTable(h).delete()

    unfit = {
        "rows": (lambda h: write_deltalake(h, rows), "it holds 1 file"),
        "emptied": (emptied, "its version 0 added files"),
        "append-only": (
            lambda h: DeltaTable.create(h, PEOPLE_HISTORY, configuration={"delta.appendOnly": "true"}),
            "it is append-only",
        ),
        "not null": (lambda h: DeltaTable.create(h, not_null), "its column closed_by is NOT NULL"),
        "partitioned": (
            lambda h: DeltaTable.create(h, PEOPLE_HISTORY, partition_by=["name"]),
            "it is partitioned",
        ),
        "mapped": (
            lambda h: DeltaTable.create(h, PEOPLE_HISTORY, configuration=mapped),
            "it maps column names",
        ),
        "columns": (lambda h: DeltaTable.create(h, fewer), r"its columns are not .*differ in closed_by"),
    }
    for case, (make, why) in unfit.items():
        history = str(tmp_path / case)
        make(history)
        before = DeltaTable(history).version()
        with pytest.raises(
            ConfigError, match=rf"holds no history of view 'v', and {why}.*`closed_by` string"
        ):
            MVSink(target, "v", history_target=history)(people(spark, range(4)), 1)
        _untouched(target, 0)
        assert DeltaTable(history).version() == before, case


def test_a_history_target_holding_other_files_is_refused(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    os.makedirs(history)
    with open(os.path.join(history, "notes.csv"), "w") as fh:
        fh.write("a,b\n")
    with pytest.raises(UnsupportedTableError, match="no Delta log"):
        MVSink(target, "v", history_target=history)(people(spark, range(3)), 0)
    _untouched(target, None)


def test_a_delta_table_mvsink_did_not_make_for_the_view_is_refused(spark, tmp_path):
    target, history, other = str(tmp_path / "t"), str(tmp_path / "h"), str(tmp_path / "o")
    write_deltalake(history, pa.table({"id": [1]}))
    MVSink(target, "v")(people(spark, range(3)), 0)
    with pytest.raises(ConfigError, match="holds no history of view 'v'"):
        MVSink(target, "v", history_target=history)(people(spark, range(4)), 1)
    _untouched(target, 0)
    MVSink(other, "w", history_target=f"{other}_h")(people(spark, range(3)), 0)
    with pytest.raises(ConfigError, match="holds no history of view 'v'"):
        MVSink(target, "v", history_target=f"{other}_h")(people(spark, range(4)), 1)
    _untouched(target, 0)


def test_a_history_of_another_table_of_the_view_is_refused(spark, tmp_path):
    a, b, history = str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "h")
    MVSink(a, "v", history_target=history)(people(spark, range(3)), 0)
    MVSink(b, "v")(people(spark, range(3)), 0)
    with pytest.raises(ConfigError, match="another table of view 'v'"):
        MVSink(b, "v", history_target=history)(people(spark, range(4)), 1)
    _untouched(b, 0)


def test_the_history_of_a_table_since_made_again_is_refused(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = MVSink(target, "v", history_target=history)
    sink(people(spark, range(3)), 0)
    sink(people(spark, range(4)), 1)
    shutil.rmtree(target)
    with pytest.raises(ConfigError, match="the view has no table"):
        MVSink(target, "v", history_target=history)(people(spark, range(4)), 0)
    _untouched(target, None)


def test_a_history_of_other_columns_is_refused(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    MVSink(str(tmp_path / "x"), "v", history_target=history)(
        frame(spark, [(1, "a")], "id long, name string"), 0
    )
    with pytest.raises(SchemaMismatchError, match="other columns"):
        MVSink(target, "v", history_target=history)(people(spark, range(3)), 0)
    _untouched(target, None)


def test_a_view_changing_its_columns_is_refused_while_it_keeps_a_history(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = MVSink(target, "v", history_target=history, schema_changes="evolve")
    sink(people(spark, range(3)), 0)
    wider = frame(spark, [(1, "a", 0.5, "extra")], "id long, name string, x double, more string")
    with pytest.raises(SchemaMismatchError, match="does not follow a change of the view's columns"):
        sink(wider, 1)
    _untouched(target, 0)
    assert_holds_every_version(target, history, "v")


def test_a_view_with_a_lifetime_column_is_refused(spark, tmp_path):
    target = str(tmp_path / "t")
    with pytest.raises(ConfigError, match="valid_from"):
        MVSink(target, "v", history_target=str(tmp_path / "h"))(
            frame(spark, [(1, 2)], "id long, valid_from long"), 0
        )
    _untouched(target, None)


def test_the_history_cannot_lie_inside_the_target(tmp_path):
    with pytest.raises(ConfigError, match="history_target"):
        MVSink(str(tmp_path / "t"), "v", history_target=str(tmp_path / "t" / "h"))


def test_a_view_with_an_errors_table_keeps_its_history_and_the_errors_table_none(spark, tmp_path):
    """The errors table's sink (``on_error = "table"``) is the view's, less its history: the
    history holds the view's versions only, and the errors table is kept as ever."""
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = MVSink(target, "v", history_target=history, on_error="table", not_null=["name"])
    for epoch, rows in enumerate(
        [[(1, "a", 1.0), (2, None, 2.0)], [(1, "a", 1.0), (3, "c", 3.0), (4, None, 4.0)]]
    ):
        assert sink(frame(spark, rows), epoch).outcome == "committed"
    assert_holds_every_version(target, history, "v")
    assert sorted(r["id"] for r in DeltaTable(f"{target}_errors").to_pyarrow_table().to_pylist()) == [4]
