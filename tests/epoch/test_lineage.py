"""Lineage: epochs compare only within one query's run; a new one takes the view over or is
refused, and a superseded one is fenced (``lineage.py``)."""

from __future__ import annotations

from collections import Counter

import pytest

from mvsink import LineageError, MVSink, frontier
from mvsink.compat import to_arrow
from tests.helpers import (
    assert_equal_to,
    commit_info,
    expected,
    multiset,
    run,
    target_table,
    versions,
    write_orders,
)

# Runs on both engines (tests/conftest.py: each line runs the engine it has).
pytestmark = pytest.mark.usefixtures("engine")

SCHEMA = "product string, amount long"


def test_a_new_checkpoint_takes_a_complete_view_over_and_fences_the_old_one(spark, tmp_path, local_target):
    source = str(tmp_path / "in")
    write_orders(source, "a", [("p1", 5), ("p2", 7)])
    write_orders(source, "b", [("p1", 1)])
    old = MVSink(local_target, "revenue")
    assert run(spark, source, str(tmp_path / "old"), old) is None
    assert frontier(local_target, "revenue") == 2  # two batches
    write_orders(source, "c", [("p3", 4)])
    new = MVSink(local_target, "revenue")
    assert run(spark, source, str(tmp_path / "new"), new) is None  # batch ids from 0 again
    assert next(r.outcome for r in new.reports) == "committed"  # not taken for a replay
    assert_equal_to(local_target, expected(spark, source))
    taken = [v for v in versions(local_target) if "mvsink.takeover" in commit_info(local_target, v)]
    assert len(taken) == 1 and commit_info(local_target, taken[0])["mvsink.lineage"].startswith("query:")

    # The old job, restarted from its checkpoint with new data, writes nothing.
    write_orders(source, "d", [("p4", 9)])
    before = versions(local_target)
    again = MVSink(local_target, "revenue")
    assert run(spark, source, str(tmp_path / "old"), again) is None
    assert [r.outcome for r in again.reports] == ["fenced"] * len(again.reports) and again.reports
    assert versions(local_target) == before


def test_a_new_checkpoint_in_append_mode_is_refused_or_adopted_from_its_first_batch(
    spark, tmp_path, local_target
):
    source = str(tmp_path / "in")
    write_orders(source, "a", [("p1", 5)])
    write_orders(source, "b", [("p2", 7)])
    assert (
        run(spark, source, str(tmp_path / "one"), MVSink(local_target, "log", mode="append"), complete=False)
        is None
    )
    before = versions(local_target)
    held = multiset(target_table(local_target))

    error = run(
        spark, source, str(tmp_path / "two"), MVSink(local_target, "log", mode="append"), complete=False
    )
    assert error is not None and "LineageError" in str(error) and "on_new_lineage" in str(error)
    assert versions(local_target) == before and multiset(target_table(local_target)) == held

    adopt = MVSink(local_target, "log", mode="append", on_new_lineage="adopt")
    assert run(spark, source, str(tmp_path / "three"), adopt, complete=False) is None
    # Every batch of the new query appended once, from its first: the rows are there twice.
    assert multiset(target_table(local_target)) == Counter({k: 2 * n for k, n in held.items()})


def test_direct_lineages_take_over_and_are_fenced(spark, local_target):
    rows = [(1, "a"), (2, "b")]
    df = spark.createDataFrame(rows, "id long, v string")
    blue = MVSink(local_target, "v", lineage="blue")
    for epoch in range(5):
        blue(df, epoch)
    green = MVSink(local_target, "v", lineage="green")
    other = spark.createDataFrame([(3, "c")], "id long, v string")
    report = green(other, 0)
    assert report.outcome == "committed" and frontier(local_target, "v") == 1
    assert_equal_to(local_target, other)
    assert green(other, 0).outcome == "replay"  # its own replay
    assert blue(df, 9).outcome == "fenced"  # even far ahead of green's epochs
    assert_equal_to(local_target, other)

    up = MVSink(local_target + "-up", "u", mode="upsert", key=["id"], lineage="blue")
    up(df, 0)
    with pytest.raises(LineageError, match="new lineage") as info:
        MVSink(local_target + "-up", "u", mode="upsert", key=["id"], lineage="green")(other, 0)
    assert info.value.view == "u" and info.value.epoch == 0
    assert multiset(target_table(local_target + "-up")) == multiset(to_arrow(df))


def test_a_read_only_new_lineage_commits_nothing(spark, local_target):
    df = spark.createDataFrame([(1, "a")], "id long, v string")
    MVSink(local_target, "v", lineage="blue")(df, 0)
    before = versions(local_target)
    standby = MVSink(local_target, "v", lineage="green", read_only=True)
    assert standby(df, 0).outcome == "read_only"
    assert versions(local_target) == before


def test_a_read_only_upsert_standby_of_a_new_lineage_reports_instead_of_failing(spark, local_target):
    df = spark.createDataFrame([(1, "a")], "id long, v string")
    MVSink(local_target, "u", mode="upsert", key=["id"], lineage="blue")(df, 0)
    standby = MVSink(local_target, "u", mode="upsert", key=["id"], lineage="green", read_only=True)
    assert standby(df, 0).outcome == "read_only"


def test_ownership_is_restamped_by_every_commit(spark, local_target):
    from tests.helpers import log_entry

    sink = MVSink(local_target, "v", lineage="blue")
    for epoch in range(3):
        sink(spark.createDataFrame([(epoch, "a")], "id long, v string"), epoch)
    last = [a["txn"]["appId"] for a in log_entry(local_target, versions(local_target)[-1]) if "txn" in a]
    assert "mvsink:v#owner" in last  # so delta.setTransactionRetentionDuration cannot expire it


def test_a_checkpoint_option_naming_another_query_is_refused(spark, tmp_path, local_target):
    source = str(tmp_path / "in")
    write_orders(source, "a", [("p1", 5)])
    other = str(tmp_path / "other")
    assert run(spark, source, other, MVSink(local_target, "revenue")) is None
    error = run(spark, source, str(tmp_path / "mine"), MVSink(local_target, "revenue", checkpoint=other))
    assert error is not None and "belongs to query" in str(error)


def in_a_thread(sink):
    """``sink`` called from a plain thread of ``foreachBatch`` (as when one batch feeds several
    views), its error raised in the batch."""
    import threading

    def each_batch(batch, epoch):
        failed = []

        def call():
            try:
                sink(batch, epoch)
            except Exception as exc:
                failed.append(exc)

        thread = threading.Thread(target=call)
        thread.start()
        thread.join()
        if failed:
            raise failed[0]

    return each_batch


def test_a_sink_called_from_a_thread_knows_its_query(spark, tmp_path, local_target):
    if "connect" in type(spark).__module__:
        pytest.skip("Spark Connect needs the checkpoint option (test_connect.py)")
    source = str(tmp_path / "in")
    write_orders(source, "a", [("p1", 5)])
    write_orders(source, "b", [("p2", 7)])
    first = MVSink(local_target, "log", mode="append")
    assert run(spark, source, str(tmp_path / "one"), in_a_thread(first), complete=False) is None
    assert commit_info(local_target, versions(local_target)[-1])["mvsink.lineage"].startswith("query:")
    before, held = versions(local_target), multiset(target_table(local_target))

    # A new checkpoint's batches 0 and 1 are not replays of the first query's.
    second = MVSink(local_target, "log", mode="append")
    error = run(spark, source, str(tmp_path / "two"), in_a_thread(second), complete=False)
    assert error is not None and "LineageError" in str(error)
    assert versions(local_target) == before and multiset(target_table(local_target)) == held


def test_a_thread_of_a_query_from_another_session_must_name_its_lineage(spark, tmp_path, local_target):
    if "connect" in type(spark).__module__:
        pytest.skip("classic sessions only")
    source = str(tmp_path / "in")
    write_orders(source, "a", [("p1", 5)])
    other = spark.newSession()
    sink = MVSink(local_target, "log", mode="append")
    error = run(other, source, str(tmp_path / "ckpt"), in_a_thread(sink), complete=False)
    assert error is not None and "ConfigError" in str(error) and "'lineage'" in str(error)
    assert not versions(local_target)

    named = MVSink(local_target, "log", mode="append", checkpoint=str(tmp_path / "ckpt"))
    assert run(other, source, str(tmp_path / "ckpt"), in_a_thread(named), complete=False) is None
    assert multiset(target_table(local_target)) == Counter({("p1", 5): 1})


def test_a_thread_handing_the_sink_a_frame_of_the_default_session_must_name_its_lineage(
    spark, tmp_path, local_target
):
    if "connect" in type(spark).__module__:
        pytest.skip("classic sessions only")
    source = str(tmp_path / "in")
    write_orders(source, "a", [("p1", 5)])

    def copied(sink):
        # A frame of the default session made from the batch's rows: no query in sight.
        return lambda batch, epoch: sink(spark.createDataFrame(batch.collect(), SCHEMA), epoch)

    error = run(
        spark,
        source,
        str(tmp_path / "ckpt"),
        in_a_thread(copied(MVSink(local_target, "log", mode="append"))),
        complete=False,
    )
    assert error is not None and "ConfigError" in str(error) and "'lineage'" in str(error)
    assert not versions(local_target)
