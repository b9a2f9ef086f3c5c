"""Upsert mode: per-key replacement, deletes, sequences, self-correction and pruned read-back."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections import Counter

import pyarrow.parquet as pq
import pytest

from mvsink import ConfigError, DuplicateKeyError, InputError, MVSink, failpoints, frontier, status
from mvsink.table.storage import Store
from tests.helpers import (
    added,
    exists,
    foreign_append,
    foreign_delete,
    live_files,
    multiset,
    once,
    removed,
    target_table,
    versions,
)

# Runs on both engines (tests/conftest.py: each line runs the engine it has).
pytestmark = pytest.mark.usefixtures("engine")

SCHEMA = "id long, name string, amount double"
WITH_DELETE = "id long, name string, amount double, gone boolean"
WITH_SEQ = "id long, name string, seq long"


def rows_of(target: str) -> Counter:
    return multiset(target_table(target))


def test_changed_keys_replace_their_rows_and_other_keys_stay(spark, target, placement):
    sink = MVSink(target, "u", mode="upsert", key=["id"], placement=placement)
    sink(spark.createDataFrame([(i, f"n{i}", float(i)) for i in range(1, 6)], SCHEMA), 0)
    report = sink(spark.createDataFrame([(2, "two", 2.5), (6, "six", 6.0)], SCHEMA), 1)
    assert (report.inserted, report.retracted) == (2, 1)
    want = Counter(
        [(1, "n1", 1.0), (2, "two", 2.5), (3, "n3", 3.0), (4, "n4", 4.0), (5, "n5", 5.0), (6, "six", 6.0)]
    )
    assert rows_of(target) == want
    assert frontier(target, "u") == 2
    # The same batch again under a new epoch changes nothing.
    again = sink(spark.createDataFrame([(2, "two", 2.5), (6, "six", 6.0)], SCHEMA), 2)
    assert (again.inserted, again.retracted, again.files_added) == (0, 0, 0)


def test_a_delete_marker_removes_its_key_and_is_not_stored(spark, target, placement):
    sink = MVSink(target, "d", mode="upsert", key=["id"], delete_column="gone", placement=placement)
    sink(spark.createDataFrame([(i, f"n{i}", 1.0, False) for i in range(4)], WITH_DELETE), 0)
    assert target_table(target).column_names == ["id", "name", "amount"]
    sink(
        spark.createDataFrame(
            [(1, None, None, True), (9, "nine", 9.0, False), (7, "x", 1.0, True)], WITH_DELETE
        ),
        1,
    )
    assert rows_of(target) == Counter([(0, "n0", 1.0), (2, "n2", 1.0), (3, "n3", 1.0), (9, "nine", 9.0)])


def test_the_highest_sequence_wins_and_older_events_never_roll_a_key_back(spark, target, placement):
    sink = MVSink(target, "s", mode="upsert", key=["id"], sequence_column="seq", placement=placement)
    batch = [(1, "a-old", 1), (1, "a-new", 3), (1, "a-mid", 2), (2, "b", 5)]
    sink(spark.createDataFrame(batch, WITH_SEQ), 0)
    assert rows_of(target) == Counter([(1, "a-new", 3), (2, "b", 5)])
    # An out-of-order event for key 2 (older than stored) is ignored; key 1 moves on.
    report = sink(spark.createDataFrame([(2, "b-stale", 4), (1, "a-newer", 4)], WITH_SEQ), 1)
    assert rows_of(target) == Counter([(1, "a-newer", 4), (2, "b", 5)])
    assert (report.inserted, report.retracted) == (1, 1)
    # An equal sequence is not older: it replaces.
    sink(spark.createDataFrame([(2, "b-again", 5)], WITH_SEQ), 2)
    assert rows_of(target) == Counter([(1, "a-newer", 4), (2, "b-again", 5)])


def test_an_old_delete_does_not_remove_a_newer_row(spark, target, placement):
    schema = "id long, v string, seq long, del boolean"
    sink = MVSink(
        target,
        "sd",
        mode="upsert",
        key=["id"],
        sequence_column="seq",
        delete_column="del",
        placement=placement,
    )
    sink(spark.createDataFrame([(1, "a", 10, False), (2, "b", 10, False)], schema), 0)
    sink(spark.createDataFrame([(1, None, 9, True), (2, None, 11, True)], schema), 1)
    assert rows_of(target) == Counter([(1, "a", 10)])


@pytest.mark.parametrize(
    "options, batch, error, message",
    [
        ({}, [(1, "a", 1.0), (1, "b", 2.0), (2, "c", 1.0)], DuplicateKeyError, r"\(1,\)"),
        ({}, [(None, "a", 1.0)], InputError, "null in key"),
    ],
)
def test_bad_batches_are_refused_and_leave_the_target_unchanged(
    spark, target, placement, options, batch, error, message
):
    sink = MVSink(target, "bad", mode="upsert", key=["id"], **options, placement=placement)
    sink(spark.createDataFrame([(5, "e", 5.0)], SCHEMA), 0)
    before = versions(target)
    with pytest.raises(error, match=message) as info:
        sink(spark.createDataFrame(batch, SCHEMA), 1)
    assert info.value.view == "bad" and info.value.epoch == 1
    assert versions(target) == before and rows_of(target) == Counter([(5, "e", 5.0)])


def test_a_sequence_tie_or_null_sequence_is_refused(spark, target):
    sink = MVSink(target, "tie", mode="upsert", key=["id"], sequence_column="seq")
    sink(spark.createDataFrame([(1, "a", 1)], WITH_SEQ), 0)
    with pytest.raises(DuplicateKeyError, match="same highest seq"):
        sink(spark.createDataFrame([(1, "x", 2), (1, "y", 2)], WITH_SEQ), 1)
    with pytest.raises(InputError, match="null or NaN sequence"):
        sink(spark.createDataFrame([(1, "x", None)], WITH_SEQ), 1)
    assert versions(target) == [0]


def test_an_event_delivered_twice_counts_once_and_a_tie_that_differs_is_refused(spark, target, placement):
    # At-least-once feeds deliver an event again: rows equal in every column (NaN included)
    # are one event, with or without a sequence column; rows that differ stay ambiguous.
    plain = MVSink(target + "-plain", "plain", mode="upsert", key=["id"], placement=placement)
    twice = [(1, "a", float("nan")), (1, "a", float("nan")), (2, "b", 2.0), (2, "b", 2.0), (2, "b", 2.0)]
    assert plain(spark.createDataFrame(twice, SCHEMA), 0).outcome == "committed"
    rows = sorted(target_table(target + "-plain").to_pylist(), key=lambda r: r["id"])
    assert [(r["id"], r["name"]) for r in rows] == [(1, "a"), (2, "b")]
    assert math.isnan(rows[0]["amount"]) and rows[1]["amount"] == 2.0
    seq = MVSink(target, "seq", mode="upsert", key=["id"], sequence_column="seq", placement=placement)
    events = [(1, "x", 3), (1, "x", 3), (1, "old", 2), (2, "y", 5), (2, "y", 5)]
    assert seq(spark.createDataFrame(events, WITH_SEQ), 0).outcome == "committed"
    assert rows_of(target) == Counter([(1, "x", 3), (2, "y", 5)])
    before = versions(target)
    with pytest.raises(DuplicateKeyError, match=r"same highest seq and different values: \(2,\)"):
        seq(spark.createDataFrame([(2, "y", 7), (2, "y", 7), (2, "z", 7), (1, "w", 9)], WITH_SEQ), 1)
    assert versions(target) == before and rows_of(target) == Counter([(1, "x", 3), (2, "y", 5)])


def test_rows_that_tie_below_a_keys_newest_event_are_not_ambiguous(spark, target, placement):
    # Only a tie at the top decides what the key holds: older events may tie and differ.
    sink = MVSink(target, "below", mode="upsert", key=["id"], sequence_column="seq", placement=placement)
    events = [(1, "new", 5), (1, "a", 3), (1, "b", 3), (2, "y", 4), (2, "z", 1), (2, "w", 1)]
    assert sink(spark.createDataFrame(events, WITH_SEQ), 0).outcome == "committed"
    assert rows_of(target) == Counter([(1, "new", 5), (2, "y", 4)])


def test_keys_named_as_counts_are_upserted_and_checked(spark, target):
    # The batch's check groups by the key: a key named like a count must not clash with it.
    sink = MVSink(target, "named", mode="upsert", key=["n", "bad"])
    schema = "n long, bad string, x double"
    sink(spark.createDataFrame([(1, "a", 1.0), (2, "a", 2.0)], schema), 0)
    sink(spark.createDataFrame([(1, "a", 5.0), (1, "b", 6.0)], schema), 1)
    assert rows_of(target) == Counter([(1, "a", 5.0), (2, "a", 2.0), (1, "b", 6.0)])
    with pytest.raises(DuplicateKeyError, match=r"\(2, 'a'\)"):
        sink(spark.createDataFrame([(2, "a", 7.0), (2, "a", 8.0)], schema), 2)
    with pytest.raises(InputError, match="null in key"):
        sink(spark.createDataFrame([(3, None, 1.0)], schema), 2)


def test_only_a_batch_with_a_key_twice_or_a_null_is_ranked(spark, target, monkeypatch):
    # Distinct keys (an update-mode aggregation's batch) are each their key's winner as they
    # are: the ranking (a sort in each key) runs only for a batch that needs it.
    from mvsink.plan import upsert

    class Ranked(Exception):
        pass

    def ranked(*args: object) -> None:
        raise Ranked

    monkeypatch.setattr(upsert, "_ranked", ranked)
    sink = MVSink(target, "plain", mode="upsert", key=["id"], sequence_column="seq")
    assert sink(spark.createDataFrame([(1, "a", 1), (2, "b", 1)], WITH_SEQ), 0).outcome == "committed"
    for batch in ([(1, "x", 2), (1, "x", 2)], [(3, "c", None)]):
        with pytest.raises(Ranked):
            sink(spark.createDataFrame(batch, WITH_SEQ), 1)


def test_a_tie_whose_rows_differ_by_a_microsecond_is_refused(spark, local_target, placement):
    import datetime as dt

    sink = MVSink(local_target, "us", mode="upsert", key=["id"], sequence_column="seq", placement=placement)
    at = dt.datetime(2026, 1, 1, 12, 0, 0, 1000)
    rows = [(1, 5, at, dt.date(2026, 1, 1)), (1, 5, at + dt.timedelta(microseconds=1), dt.date(2026, 1, 1))]
    with pytest.raises(DuplicateKeyError, match=r"different values: \(1,\)"):
        sink(spark.createDataFrame(rows, "id long, seq long, at timestamp, day date"), 0)
    assert versions(local_target) == []
    same = [(1, 5, at, dt.date(2026, 1, 1))] * 2  # the same event twice is one
    assert (
        sink(spark.createDataFrame(same, "id long, seq long, at timestamp, day date"), 0).outcome
        == "committed"
    )


def test_a_nan_sequence_is_refused_and_leaves_the_target_unchanged(spark, target, placement):
    # Spark ranks NaN above every number within a batch, and no comparison with it holds
    # across batches: a NaN sequence would order one key's events two ways.
    schema = "id long, name string, seq double"
    sink = MVSink(target, "nan", mode="upsert", key=["id"], sequence_column="seq", placement=placement)
    sink(spark.createDataFrame([(1, "a", 1.0)], schema), 0)
    before = versions(target)
    nan = float("nan")
    for batch in ([(1, "x", nan)], [(1, "x", nan), (1, "y", 2.0)], [(2, "z", nan)]):
        with pytest.raises(InputError, match="NaN sequence \\(seq\\)") as info:
            sink(spark.createDataFrame(batch, schema), 1)
        assert (info.value.view, info.value.epoch) == ("nan", 1)
    assert versions(target) == before and rows_of(target) == Counter([(1, "a", 1.0)])


def test_missing_key_column_is_a_clear_error(spark, target):
    with pytest.raises(InputError, match="option 'key' names 'customer'"):
        MVSink(target, "k", mode="upsert", key=["customer"])(
            spark.createDataFrame([(1, "a", 1.0)], SCHEMA), 0
        )
    assert not os.path.exists(target)


def test_whatever_the_target_holds_for_a_touched_key_becomes_the_desired_row(spark, target, placement):
    sink = MVSink(target, "heal", mode="upsert", key=["id"], placement=placement)
    sink(spark.createDataFrame([(i, f"n{i}", float(i)) for i in range(1, 6)], SCHEMA), 0)
    foreign_append(target, [{"id": 3, "name": "n3", "amount": 3.0}] * 2)  # key 3 held three times
    foreign_append(target, [{"id": 4, "name": "stale", "amount": 0.0}])  # key 4 held twice
    foreign_delete(target, "id = 5")  # key 5 missing
    foreign_append(target, [{"id": 99, "name": "rogue", "amount": 0.0}])  # untouched: left alone
    sink(spark.createDataFrame([(3, "n3", 3.0), (4, "four", 4.0), (5, "five", 5.0)], SCHEMA), 1)
    assert rows_of(target) == Counter(
        [
            (1, "n1", 1.0),
            (2, "n2", 2.0),
            (3, "n3", 3.0),
            (4, "four", 4.0),
            (5, "five", 5.0),
            (99, "rogue", 0.0),
        ]
    )


def test_only_files_that_can_hold_a_touched_key_are_read_and_rewritten(spark, target, placement):
    sink = MVSink(
        target,
        "prune",
        mode="upsert",
        key=["id"],
        max_rows_per_file=100,
        cluster_by=["id"],
        placement=placement,
    )
    sink(spark.createDataFrame([(i, f"n{i}", float(i)) for i in range(2000)], SCHEMA), 0)
    files = live_files(target)
    assert len(files) >= 10
    holders = {
        p for p in files if {150, 1234} & set(pq.read_table(os.path.join(target, p)).column("id").to_pylist())
    }
    report = sink(spark.createDataFrame([(150, "x", 0.0), (1234, "y", 0.0), (5000, "new", 0.0)], SCHEMA), 1)
    assert set(removed(target, report.version)) == holders
    assert report.files_read <= len(holders) + 2 < len(files)  # pruned by min/max key stats
    assert len(rows_of(target)) == 2001


def test_upsert_replay_and_a_racing_replica(spark, target, placement):
    a = MVSink(target, "race", mode="upsert", key=["id"], retry={"initial_backoff_s": 0}, placement=placement)
    b = MVSink(target, "race", mode="upsert", key=["id"], retry={"initial_backoff_s": 0}, placement=placement)
    a(spark.createDataFrame([(1, "a", 1.0), (2, "b", 2.0)], SCHEMA), 0)
    batch = spark.createDataFrame([(2, "B", 2.0), (3, "C", 3.0)], SCHEMA)
    with failpoints.armed({"before_commit": once(lambda: b(batch, 1))}, view="race"):  # b first
        report = a(batch, 1)
    assert report.outcome == "replay" and report.attempts == 2
    assert rows_of(target) == Counter([(1, "a", 1.0), (2, "B", 2.0), (3, "C", 3.0)])
    n = len(versions(target))
    assert a(batch, 1).outcome == "replay" and len(versions(target)) == n
    # A foreign commit in the window makes the upsert retry against the new snapshot.
    foreign = once(lambda: foreign_append(target, [{"id": 3, "name": "C", "amount": 3.0}]))
    with failpoints.armed({"before_commit": foreign}, view="race"):
        report = a(spark.createDataFrame([(3, "C", 3.0)], SCHEMA), 2)
    assert report.attempts == 2
    assert rows_of(target) == Counter([(1, "a", 1.0), (2, "B", 2.0), (3, "C", 3.0)])
    assert versions(target)
    assert all(exists(target, p) for p in added(target, report.version))


def test_a_null_delete_marker_is_bad_input(spark, target):
    sink = MVSink(target, "nullmark", mode="upsert", key=["id"], delete_column="gone")
    sink(spark.createDataFrame([(1, "a", 1.0, False)], WITH_DELETE), 0)
    before = versions(target)
    with pytest.raises(InputError, match="null delete marker"):
        sink(spark.createDataFrame([(1, None, None, None)], WITH_DELETE), 1)
    assert versions(target) == before
    assert rows_of(target) == Counter([(1, "a", 1.0)])


def test_stored_rows_with_a_null_sequence_are_older_than_any_event(spark, target, placement):
    sink = MVSink(target, "nullseq", mode="upsert", key=["id"], sequence_column="seq", placement=placement)
    sink(spark.createDataFrame([(1, "a", 3), (2, "b", 1)], WITH_SEQ), 0)
    foreign_append(target, [{"id": 1, "name": "rogue", "seq": None}])  # key 1 held twice
    foreign_append(target, [{"id": 3, "name": "rogue", "seq": None}])
    sink(spark.createDataFrame([(1, "a2", 2), (3, "c", 0)], WITH_SEQ), 1)
    # Key 1: the stored seq 3 is newer than 2 and stays; the null-sequence copy goes.
    # Key 3: the event beats a stored row without a sequence.
    assert rows_of(target) == Counter([(1, "a", 3), (2, "b", 1), (3, "c", 0)])


TOMB = "id long, v string, seq long, del boolean"


def tombstoning(target: str, placement: str = "driver", **options: object) -> MVSink:
    return MVSink(
        target,
        "t",
        mode="upsert",
        key=["id"],
        sequence_column="seq",
        delete_column="del",
        placement=placement,
        **options,
    )


def test_a_deleted_key_never_comes_back_from_a_late_event(spark, target, placement):
    """A delete leaves a tombstone (key, sequence): an older event for the key is ignored, a
    newer one inserts it again. The tombstone is not a row of the view, and outlives the
    sink (a restart reads it from the table)."""
    sink = tombstoning(target, placement)
    sink(spark.createDataFrame([(1, "a", 10, False), (2, "b", 10, False)], TOMB), 0)
    # Key 1 deleted at 12; key 5, never seen, deleted at 20.
    sink(spark.createDataFrame([(1, None, 12, True), (5, None, 20, True)], TOMB), 1)
    assert rows_of(target) == Counter([(2, "b", 10)])
    restarted = tombstoning(target, placement)
    events = [(1, "late", 11, False), (5, "late", 19, False), (2, "b2", 11, False)]
    late = restarted(spark.createDataFrame(events, TOMB), 2)
    assert rows_of(target) == Counter([(2, "b2", 11)])
    assert (late.inserted, late.retracted) == (1, 1)
    assert status(target).views[0].tombstones == 2
    # An equal sequence is not older (as for stored rows); a newer one re-inserts and clears.
    restarted(spark.createDataFrame([(1, "again", 12, False), (5, "new", 21, False)], TOMB), 3)
    assert rows_of(target) == Counter([(1, "again", 12), (2, "b2", 11), (5, "new", 21)])
    assert status(target).views[0].tombstones == 0
    # Readers of the view never see a tombstone: every version holds only view rows.
    for v in versions(target):
        assert target_table(target, v).column_names == ["id", "v", "seq"]


def test_a_delete_and_its_tombstone_land_together_or_not_at_all(spark, target):
    sink = tombstoning(target)
    sink(spark.createDataFrame([(1, "a", 10, False)], TOMB), 0)
    before = versions(target)

    def crash(_snap: object) -> None:
        raise RuntimeError("the driver died before the commit")

    with failpoints.armed({"before_commit": crash}), pytest.raises(RuntimeError, match="driver died"):
        sink(spark.createDataFrame([(1, None, 12, True)], TOMB), 1)
    assert versions(target) == before and rows_of(target) == Counter([(1, "a", 10)])
    assert tombstone_sets(target) == set()  # the attempt's tombstone set went with it
    sink(spark.createDataFrame([(1, None, 12, True)], TOMB), 1)
    assert rows_of(target) == Counter() and len(tombstone_sets(target)) == 1
    sink(spark.createDataFrame([(1, "late", 11, False)], TOMB), 2)
    assert rows_of(target) == Counter()


def test_a_racing_replica_replans_against_the_tombstones_that_landed(spark, target):
    """Replicas under a shared clock: b's late event loses the commit race to a's delete, and
    its retry decides against the tombstone that landed, not the one it planned with."""
    now = {"t": 1}
    clock = lambda df, epoch: dict(now)  # noqa: E731
    a = tombstoning(target, clock=clock, lineage="a")
    b = tombstoning(target, clock=clock, lineage="b", allow_gaps=True)
    a(spark.createDataFrame([(1, "a", 10, False)], TOMB), 0)

    def delete_first() -> None:
        now["t"] = 2
        assert a(spark.createDataFrame([(1, None, 12, True)], TOMB), 1).outcome == "committed"

    now["t"] = 3
    with failpoints.armed({"before_commit": once(delete_first)}):
        report = b(spark.createDataFrame([(1, "late", 11, False)], TOMB), 0)
    assert (report.outcome, report.attempts) == ("committed", 2)
    assert rows_of(target) == Counter()


def test_tombstones_past_their_retention_are_dropped(spark, target, placement):
    sink = tombstoning(target, placement, tombstone_retention="1s")
    sink(spark.createDataFrame([(1, "a", 10, False), (2, "b", 10, False)], TOMB), 0)
    sink(spark.createDataFrame([(1, None, 12, True), (2, None, 12, True)], TOMB), 1)
    assert status(target).views[0].tombstones == 2
    time.sleep(1.5)
    # Past the retention, an event older than the delete inserts its key again.
    sink(spark.createDataFrame([(1, "late", 11, False)], TOMB), 2)
    assert rows_of(target) == Counter([(1, "late", 11)])
    assert status(target).views[0].tombstones == 0


def test_tombstone_options_are_checked(target):
    with pytest.raises(ConfigError, match="tombstone_retention"):
        MVSink(target, "t", mode="upsert", key=["id"], sequence_column="seq", tombstone_retention="7d")
    with pytest.raises(ConfigError, match="duration"):
        tombstoning(target, tombstone_retention="3")


def tombstone_sets(target: str) -> set[str]:
    """The tombstone sets (folders) of view ``t`` in storage."""
    from mvsink.plan.tombstones import root

    return {p.removeprefix(root("t") + "/").split("/")[0] for p in Store(target, {}).files(root("t"))}


def test_the_distributed_decision_is_exact_when_keys_span_its_chunks(spark, target, monkeypatch):
    """A distributed task decides its sorted rows a few keys at a time: a key's rows (the
    batch's winner, several stored copies, a tombstone) never split across two decisions."""
    import mvsink.plan.upsert

    monkeypatch.setattr(mvsink.plan.upsert, "DECIDE_CHUNK_ROWS", 3)
    sink = tombstoning(target, "distributed")
    sink(spark.createDataFrame([(i, f"v{i}", 10, False) for i in range(40)], TOMB), 0)
    foreign_append(target, [{"id": i, "v": f"v{i}", "seq": 10} for i in range(0, 40, 3)])  # copies
    sink(spark.createDataFrame([(i, None, 12, True) for i in range(0, 40, 4)], TOMB), 1)
    events = [(i, f"w{i}", 11 + i % 3, False) for i in range(40)]  # 11 late, 12 equal, 13 newer
    sink(spark.createDataFrame(events, TOMB), 2)
    # A deleted key (i % 4 == 0) stays deleted against its late event only.
    want = Counter((i, f"w{i}", 11 + i % 3) for i in range(40) if i % 4 or 11 + i % 3 >= 12)
    assert rows_of(target) == want


BOUNDED = r"""
import sys
from collections import Counter
from mvsink import MVSink
from mvsink.cli.session import local_session
target, rows = sys.argv[1], int(sys.argv[2])
spark = local_session("bounded", master="local[1]", conf={
    "spark.executor.pyspark.memory": "1200m",  # the Python worker's address space (RLIMIT_AS)
    "spark.sql.shuffle.partitions": "1",  # every key of the batch in one task
    "spark.sql.execution.arrow.maxRecordsPerBatch": "4096",
})
sink = MVSink(target, "big", mode="upsert", key=["id"], placement="distributed")
sink(spark.createDataFrame([(0, "x")], "id long, v string"), 0)
batch = spark.range(rows).selectExpr("id", "repeat(cast(id as string), 40) as v")
report = sink(batch, 1)
assert report.inserted == rows, report
print("ok", report.inserted)
"""


@pytest.mark.single_engine  # its own Spark, in a subprocess: the engine fixture does not reach it
@pytest.mark.soak  # a memory bound measured in a Spark of its own: 45 s
def test_a_distributed_upsert_task_holds_a_bounded_share_of_its_partition(tmp_path):
    """One task gets every key of a 1.2M-row batch (about 300 MB as Arrow) under a Python
    worker limited to 1.2 GB of address space (its imports take about 0.7): it decides the
    keys a chunk at a time, where holding the partition whole runs out of memory."""
    script = tmp_path / "bounded.py"
    script.write_text(BOUNDED)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "view"), "1200000"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        cwd=os.getcwd(),
    )
    assert done.returncode == 0 and "ok 1200000" in done.stdout, done.stderr[-3000:]


def test_a_first_epochs_deletes_leave_tombstones(spark, target, placement):
    sink = tombstoning(target, placement)
    sink(spark.createDataFrame([(1, "a", 10, False), (7, None, 20, True)], TOMB), 0)
    assert status(target).views[0].tombstones == 1
    sink(spark.createDataFrame([(7, "late", 19, False), (1, "b", 11, False)], TOMB), 1)
    assert rows_of(target) == Counter([(1, "b", 11)])


def test_superseded_tombstone_sets_are_swept_past_the_tables_retention(spark, target):
    from mvsink.errors import Where
    from mvsink.plan import tombstones
    from mvsink.table.delta import load_snapshot

    sink = tombstoning(target)
    sink(spark.createDataFrame([(1, "a", 10, False)], TOMB), 0)
    for epoch, key in enumerate((1, 2, 3), start=1):  # each delete writes a new set
        sink(spark.createDataFrame([(key, None, 20, True)], TOMB), epoch)
    assert len(tombstone_sets(target)) == 3
    snap = load_snapshot(target, "mvsink:t", {}, Where("t", target), writing=False)
    current = tombstones.current(snap, "mvsink:t")
    assert current is not None
    store = Store(target, {})
    week = 7 * 24 * 3_600_000  # the table's retention: sets of attempts still staging are that young
    assert tombstones.sweep(store, "t", current, week) == 0
    assert tombstones.sweep(store, "t", current, week, now_ms=int(time.time() * 1000) + week // 2) == 0
    later = int(time.time() * 1000) + week + 60_000
    assert tombstones.sweep(store, "t", current, week, now_ms=later) == 2
    assert tombstone_sets(target) == {f"{current:016x}"}
    assert status(target).views[0].tombstones == 3


@pytest.mark.spark4("string collations are Spark 4's")
def test_a_key_with_a_collation_other_than_bytes_is_refused(spark, target):
    """Spark would group 'A' and 'a' of a UTF8_LCASE key as one key; Arrow's joins, two."""
    sink = MVSink(target, "coll", mode="upsert", key=["id"])
    batch = spark.sql("SELECT 'A' COLLATE UTF8_LCASE AS id, 1 AS v")
    with pytest.raises(InputError, match="collation"):
        sink(batch, 0)
    assert versions(target) == []


@pytest.mark.single_engine  # the JVM Delta itself fails on such a table (an assertion of its own)
def test_a_table_retention_mvsink_does_not_read_is_refused_for_tombstones(spark, local_target):
    """Tombstones last the table's deletedFileRetentionDuration by default: one mvsink does not
    read as Delta does ('1 month') is refused, not taken for 7 days."""
    import pyarrow as pa
    from deltalake import write_deltalake

    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("seq", pa.int64())])
    rows = schema.empty_table()  # (a table with rows no view wrote would be refused first)
    write_deltalake(
        local_target, rows, configuration={"delta.deletedFileRetentionDuration": "interval 1 month"}
    )
    before = versions(local_target)
    with pytest.raises(ConfigError, match="tombstone_retention"):
        tombstoning(local_target)(spark.createDataFrame([(1, None, 12, True)], TOMB), 0)
    assert versions(local_target) == before
    explicit = tombstoning(local_target, tombstone_retention="30d")
    assert explicit(spark.createDataFrame([(1, None, 12, True)], TOMB), 0).outcome == "committed"
    assert rows_of(local_target) == Counter()
