"""The history of an upsert view: one open lifetime per key, a delete closes it, and a late event
is a lifetime that closes as it opens, where it came; on both engines and both placements."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

import mvsink
from mvsink import MVSink, MVSinkError, failpoints
from mvsink.compat import to_arrow
from tests.helpers import (
    KEYED,
    assert_holds_every_version,
    frame,
    history_frontier,
    keyed,
    late_folders,
    lifetimes,
    once,
    versions,
)

pytestmark = pytest.mark.usefixtures("engine")

SCHEMA = KEYED


def as_of_version(spark, target: str, history: str, version: int) -> Counter:
    frame = mvsink.as_of(spark, target, "keyed", version=version, history_target=history)
    return Counter(tuple(r.values()) for r in to_arrow(frame).to_pylist())


def test_one_open_lifetime_per_key_a_delete_closes_it_and_late_events_reopen_nothing(
    spark, tmp_path, placement
):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = keyed(target, history, placement)
    batches = [
        [(1, "a1", 1, False), (2, "b1", 1, False), (3, "c1", 1, False)],
        [(1, "a2", 2, False), (2, None, 2, True)],  # an update, a delete
        # Late: older than id 1's row, older than id 2's tombstone; id 3 moves on.
        [(1, "a-late", 1, False), (2, "b-late", 1, False), (3, "c2", 3, False)],
        [(1, "a-late-again", 0, False)],  # only a late event: its epoch still commits
    ]
    for epoch, rows in enumerate(batches):
        sink(spark.createDataFrame(rows, SCHEMA), epoch)
    assert_holds_every_version(target, history, "keyed")
    newest = DeltaTable(target).version()
    assert newest == 3
    rows = lifetimes(history)
    opened = Counter(r["id"] for r in rows if r["valid_to"] is None)
    assert opened == Counter({1: 1, 3: 1})  # one open lifetime per key held; the deleted key none
    closed_2 = [r for r in rows if r["id"] == 2 and r["opened_by"] == "epoch"]
    assert [(r["v"], r["closed_version"]) for r in closed_2] == [("b1", 1)]
    late = [r for r in rows if r["opened_by"] == "late"]
    spans = sorted((r["v"], r["opened_version"], r["closed_version"]) for r in late)
    assert spans == [("a-late", 2, 2), ("a-late-again", 3, 3), ("b-late", 2, 2)]
    assert all(r["closed_by"] == "late" and r["valid_from"] == r["valid_to"] for r in late)
    # No time or version holds a late event: as_of is the table at every version.
    for version in range(newest + 1):
        stored = DeltaTable(target, version=version).to_pyarrow_table().to_pylist()
        want = Counter(tuple(r.values()) for r in stored)
        assert as_of_version(spark, target, history, version) == want, f"version {version}"
    assert len(late_folders(target)) == 2  # kept while the view's log names their versions


def test_a_late_event_after_an_expired_tombstone_is_taken_and_opens_a_lifetime(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = keyed(target, history, tombstone_retention="20s")
    sink(spark.createDataFrame([(1, "a", 5, False)], SCHEMA), 0)
    deleted = time.monotonic()
    sink(spark.createDataFrame([(1, None, 6, True)], SCHEMA), 1)
    sink(spark.createDataFrame([(1, "early", 2, False)], SCHEMA), 2)  # the tombstone says: late
    assert time.monotonic() - deleted < 20, "too slow to test within the retention"
    time.sleep(max(0.0, 21 - (time.monotonic() - deleted)))
    sink(spark.createDataFrame([(1, "earlier", 1, False)], SCHEMA), 3)  # the tombstone expired: taken
    assert_holds_every_version(target, history, "keyed")
    rows = lifetimes(history)
    assert sorted((r["v"], r["opened_by"]) for r in rows) == [
        ("a", "epoch"),
        ("earlier", "epoch"),
        ("early", "late"),
    ]
    assert [r["v"] for r in rows if r["valid_to"] is None] == ["earlier"]


def test_a_view_without_a_sequence_has_no_late_events(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = MVSink(target, "plain", mode="upsert", key=["id"], history_target=history)
    sink(spark.createDataFrame([(1, "a", 1, False), (2, "b", 1, False)], SCHEMA), 0)
    sink(spark.createDataFrame([(1, "a2", 0, False)], SCHEMA), 1)  # no sequence: the newest batch wins
    assert_holds_every_version(target, history, "plain")
    assert sorted((r["v"], r["valid_to"] is None) for r in lifetimes(history)) == [
        ("a", False),
        ("a2", True),
        ("b", True),
    ]


def test_a_crash_before_the_history_keeps_the_late_events_for_the_next_epoch(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = keyed(target, history)
    sink(spark.createDataFrame([(1, "a", 5, False)], SCHEMA), 0)
    with failpoints.armed({"after_commit": "raise"}, view="keyed"), pytest.raises(failpoints.InjectedFault):
        sink(spark.createDataFrame([(1, "old", 4, False), (2, "b", 1, False)], SCHEMA), 1)
    assert history_frontier(history, "keyed") == 1 and len(late_folders(target)) == 1
    restarted = keyed(target, history)
    batch = spark.createDataFrame([(1, "old", 4, False), (2, "b", 1, False)], SCHEMA)
    assert restarted(batch, 1).outcome == "replay"
    assert_holds_every_version(target, history, "keyed")
    late = [(r["v"], r["opened_version"]) for r in lifetimes(history) if r["opened_by"] == "late"]
    assert late == [("old", 1)]
    assert versions(history) == [0, 1]


def test_a_commit_that_loses_the_race_leaves_no_late_events(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    fast = {"retry": {"initial_backoff_s": 0.0, "max_backoff_s": 0.01}}
    a, b = keyed(target, history, **fast), keyed(target, history, **fast)
    a(spark.createDataFrame([(1, "a", 5, False)], SCHEMA), 0)
    batch = spark.createDataFrame([(1, "old", 4, False)], SCHEMA)
    # b commits epoch 1 (and its history) inside a's attempt, between a's snapshot and commit.
    with failpoints.armed({"before_commit": once(lambda: b(batch, 1))}, view="keyed"):
        assert a(batch, 1).outcome == "replay"
    assert_holds_every_version(target, history, "keyed")
    late = [r for r in lifetimes(history) if r["opened_by"] == "late"]
    assert [(r["v"], r["opened_epoch"]) for r in late] == [("old", 1)]  # once
    assert len(late_folders(target)) == 1  # a's attempt lost: its folder is gone


def test_late_events_whose_files_are_gone_are_a_clear_error_and_the_view_is_untouched(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = keyed(target, history)
    sink(spark.createDataFrame([(1, "a", 5, False)], SCHEMA), 0)
    with failpoints.armed({"after_commit": "raise"}, view="keyed"), pytest.raises(failpoints.InjectedFault):
        sink(spark.createDataFrame([(1, "old", 4, False)], SCHEMA), 1)
    for name in late_folders(target):
        shutil.rmtree(os.path.join(target, "_mvsink", "keyed", "late", name))
    before = versions(target)
    with pytest.raises(MVSinkError, match="met late events, and their files"):
        keyed(target, history)(spark.createDataFrame([(2, "b", 1, False)], SCHEMA), 2)
    assert versions(target) == before


def test_a_history_made_again_from_the_views_first_version_holds_its_late_events(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = keyed(target, history)
    sink(spark.createDataFrame([(1, "a", 5, False)], SCHEMA), 0)
    sink(spark.createDataFrame([(1, "old", 4, False)], SCHEMA), 1)
    before = sorted(map(str, lifetimes(history)))
    shutil.rmtree(history)  # lost: the view's first version names it, so it is made again
    keyed(target, history)(spark.createDataFrame([(2, "b", 1, False)], SCHEMA), 2)
    assert_holds_every_version(target, history, "keyed")
    again = [r for r in lifetimes(history) if r["opened_version"] <= 1]
    assert sorted(map(str, again)) == before


def _followed(caplog) -> list[tuple[int, int]]:
    """(followed, named) per version, from the history's DEBUG summaries."""
    found = []
    for r in caplog.records:
        text = r.getMessage()
        if "rewritten file(s) followed by where their rows went" in text:
            followed, _, named = text.split(": ")[-1].split(" rewritten")[0].partition(" of ")
            found.append((int(followed), int(named)))
    return found


def test_an_epochs_rewrites_are_followed_by_where_staging_put_their_rows(spark, tmp_path, caplog):
    """An upsert epoch tells its history where each rewritten file's kept rows went, so the
    history cuts the dropped lifetimes out of the file's mirror (no row matched by value);
    every version exact, updates and deletes spread over many files."""
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = keyed(target, history, "driver", max_rows_per_file=10)
    with caplog.at_level(logging.DEBUG, logger="mvsink.history.keep"):
        sink(frame(spark, [(i, f"v{i}", 1, False) for i in range(60)], SCHEMA), 0)
        sink(frame(spark, [(i, f"w{i}", 2, i % 9 == 0) for i in range(0, 60, 4)], SCHEMA), 1)
        sink(frame(spark, [(i, f"x{i}", 3, False) for i in range(1, 60, 7)], SCHEMA), 2)
    assert_holds_every_version(target, history, "keyed")
    followed = _followed(caplog)
    assert len(followed) == 2 and all(f == n and n >= 5 for f, n in followed), followed
    # The lifetimes the updates closed are those of the rows they replaced.
    closed = sorted((r["id"], r["v"]) for r in lifetimes(history) if r["closed_version"] == 1)
    assert closed == [(i, f"v{i}") for i in range(0, 60, 4)]


def test_a_mirror_out_of_line_with_its_file_is_matched_by_value(spark, tmp_path, caplog):
    """A mirror whose rows are not in its file's order (so a position would name another
    row): the key columns tell, and the history matches that file's rows by value instead."""
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = keyed(target, history, "driver", max_rows_per_file=100)
    sink(frame(spark, [(i, f"v{i}", 1, False) for i in range(20)], SCHEMA), 0)
    for path in DeltaTable(history).file_uris():  # the first load's mirrors: same rows, reversed
        if os.path.basename(path).startswith("o-"):
            rows = pq.read_table(path)
            pq.write_table(rows.take(pa.array(list(reversed(range(rows.num_rows))))), path)
    with caplog.at_level(logging.DEBUG, logger="mvsink.history.keep"):
        sink(frame(spark, [(3, "w3", 2, False), (17, None, 2, True)], SCHEMA), 1)
    ((followed, named),) = _followed(caplog)
    assert followed == 0 and named >= 1
    assert "do not line up with its rows: matched by value" in caplog.text
    assert_holds_every_version(target, history, "keyed")
