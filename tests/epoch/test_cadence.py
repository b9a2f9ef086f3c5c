"""Cadence: quiet epochs create no versions (heartbeat), views that refresh on a schedule."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
from pyspark.sql import functions as F

from mvsink import ConfigError, LineageError, MVSink, frontier
from mvsink.table import record
from tests.helpers import assert_equal_to, commit_info, people, run_complete, versions, write_orders


def test_a_quiet_epoch_commits_only_when_a_heartbeat_is_due(spark, local_target):
    sink = MVSink(local_target, "hb", heartbeat=3)
    assert sink(people(spark, range(10)), 0).outcome == "committed"  # creates the table
    quiet = [sink(people(spark, range(10)), e).outcome for e in (1, 2)]
    assert quiet == ["unchanged", "unchanged"] and versions(local_target) == [0]
    assert frontier(local_target, "hb") == 1
    beat = sink(people(spark, range(10)), 3)  # three epochs since the last commit
    assert beat.outcome == "committed" and (beat.inserted, beat.retracted) == (0, 0)
    assert frontier(local_target, "hb") == 4 and versions(local_target) == [0, 1]
    changed = sink(people(spark, range(12)), 4)  # a change commits whenever it comes
    assert changed.outcome == "committed" and frontier(local_target, "hb") == 5
    assert_equal_to(local_target, people(spark, range(12)))
    # A restarted sink counts from the target, not from memory.
    again = MVSink(local_target, "hb", heartbeat=3)
    assert [again(people(spark, range(12)), e).outcome for e in (5, 6, 7)] == [
        "unchanged",
        "unchanged",
        "committed",
    ]
    assert commit_info(local_target, versions(local_target)[-1])["mvsink.epoch"] == "7"


def test_heartbeat_zero_commits_every_epoch(spark, local_target):
    sink = MVSink(local_target, "every", heartbeat=0)
    for e in range(3):
        assert sink(people(spark, range(5)), e).outcome == "committed"
    assert versions(local_target) == [0, 1, 2]


def test_upsert_epochs_always_commit_so_a_lost_epoch_is_still_a_gap(spark, local_target):
    rows = "id long, v string"
    up = MVSink(local_target, "up", mode="upsert", key=["id"], heartbeat="1h")
    up(spark.createDataFrame([(1, "a")], rows), 0)
    assert up(spark.createDataFrame([], rows), 1).outcome == "committed"  # the proof epoch 1 ran
    assert up(spark.createDataFrame([(2, "b")], rows), 2).outcome == "committed"
    before = versions(local_target)
    with pytest.raises(LineageError, match="never committed"):  # epochs 3..8 never arrived
        up(spark.createDataFrame([(3, "c")], rows), 9)
    assert versions(local_target) == before


def test_a_streaming_view_stays_exact_across_a_restart_with_quiet_batches(spark, tmp_path, local_target):
    source, ckpt = str(tmp_path / "in"), str(tmp_path / "ckpt")

    def run():
        orders = (
            spark.readStream.schema("product string, amount long").option("maxFilesPerTrigger", 1).csv(source)
        )
        view = orders.groupBy("product").agg(F.max("amount").alias("top"))
        sink = MVSink(local_target, "top", heartbeat="1h")
        run_complete(view, sink, ckpt)
        return [r.outcome for r in sink.reports]

    write_orders(source, "a", [("p1", 5), ("p2", 7)])
    write_orders(source, "b", [("p1", 1), ("p2", 2)])  # changes no maximum
    assert run() == ["committed", "unchanged"]
    write_orders(source, "c", [("p2", 3)])  # quiet again
    write_orders(source, "d", [("p3", 4)])
    assert sorted(run()) == ["committed", "unchanged"]  # restarted from its checkpoint
    assert len(versions(local_target)) == 2
    assert_equal_to(local_target, spark_max(spark, source))


def spark_max(spark, source):
    orders = spark.read.schema("product string, amount long").csv(source)
    return orders.groupBy("product").agg(F.max("amount").alias("top"))


def test_refresh_every_epochs_advances_only_at_boundaries_across_a_restart(spark, local_target):
    sink = MVSink(local_target, "r", refresh_every=3)
    assert sink(people(spark, range(3)), 0).outcome == "committed"
    outcomes = [sink(people(spark, range(3 + e)), e).outcome for e in (1, 2)]
    assert outcomes == ["between_refreshes"] * 2 and versions(local_target) == [0]
    assert_equal_to(local_target, people(spark, range(3)))
    assert sink(people(spark, range(6)), 3).outcome == "committed"  # the latest desired
    assert_equal_to(local_target, people(spark, range(6)))
    again = MVSink(local_target, "r", refresh_every=3)  # a restart keeps the schedule
    assert [again(people(spark, range(7)), e).outcome for e in (4, 5)] == ["between_refreshes"] * 2
    assert again(people(spark, range(9)), 6).outcome == "committed"
    assert_equal_to(local_target, people(spark, range(9)))
    # A due refresh commits even when nothing changed: the next one counts from it.
    assert [again(people(spark, range(9)), e).outcome for e in (7, 8, 9, 10)] == [
        "between_refreshes",
        "between_refreshes",
        "committed",
        "between_refreshes",
    ]


def stopped_clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """mvsink's clock (``record.now_ms``, wherever a module took it) stopped at the real time
    now, and moved on only by the milliseconds given, as if that long had passed."""
    real = record.now_ms
    start, ahead = real(), [0]

    def now_ms() -> int:
        return start + ahead[0]

    for module in list(sys.modules.values()):
        if module.__name__.startswith("mvsink") and getattr(module, "now_ms", None) is real:
            monkeypatch.setattr(module, "now_ms", now_ms)
    return lambda ms: ahead.__setitem__(0, ahead[0] + ms)


def test_refresh_every_duration_across_a_restart(spark, local_target, monkeypatch):
    advance = stopped_clock(monkeypatch)
    sink = MVSink(local_target, "d", refresh_every="2s")
    sink(people(spark, range(3)), 0)
    assert sink(people(spark, range(4)), 1).outcome == "between_refreshes"
    advance(2_200)
    again = MVSink(local_target, "d", refresh_every="2s")
    assert again(people(spark, range(5)), 2).outcome == "committed"
    assert_equal_to(local_target, people(spark, range(5)))
    assert again(people(spark, range(6)), 3).outcome == "between_refreshes"
    assert_equal_to(local_target, people(spark, range(5)))


def test_cadence_options_are_checked(local_target):
    with pytest.raises(ConfigError, match="refresh_every"):
        MVSink(local_target, "x", mode="upsert", key=["id"], refresh_every=3)
    with pytest.raises(ConfigError, match="heartbeat"):
        MVSink(local_target, "x", heartbeat="ten minutes")
    with pytest.raises(ConfigError, match="heartbeat"):
        MVSink(local_target, "x", heartbeat=-1)
