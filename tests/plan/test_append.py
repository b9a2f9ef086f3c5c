"""Append mode: each batch's rows are added exactly once per epoch."""

from __future__ import annotations

from collections import Counter

import pytest

from mvsink import LineageError, MVSink, failpoints, frontier
from tests.helpers import multiset, once, target_table, versions

# Runs on both engines (tests/conftest.py: each line runs the engine it has).
pytestmark = pytest.mark.usefixtures("engine")

SCHEMA = "id long, v string"


def test_each_epoch_appends_its_rows_once_even_when_replayed(spark, target, placement):
    sink = MVSink(target, "log", mode="append", placement=placement)
    b0 = spark.createDataFrame([(1, "a"), (1, "a")], SCHEMA)
    b1 = spark.createDataFrame([(2, "b")], SCHEMA)
    assert sink(b0, 0).inserted == 2
    sink(b1, 1)
    n = len(versions(target))
    assert (
        MVSink(target, "log", mode="append", placement=placement)(b1, 1).outcome == "replay"
    )  # restarted job replays
    assert len(versions(target)) == n
    assert multiset(target_table(target)) == Counter([(1, "a"), (1, "a"), (2, "b")])
    assert frontier(target, "log") == 2


def test_a_replica_writing_the_same_epoch_adds_nothing(spark, target):
    a = MVSink(target, "twin", mode="append", retry={"initial_backoff_s": 0})
    b = MVSink(target, "twin", mode="append", retry={"initial_backoff_s": 0})
    a(spark.createDataFrame([(0, "x")], SCHEMA), 0)
    batch = spark.createDataFrame([(1, "y"), (2, "z")], SCHEMA)
    with failpoints.armed({"before_commit": once(lambda: b(batch, 1))}, view="twin"):  # b first
        assert a(batch, 1).outcome == "replay"
    assert multiset(target_table(target)) == Counter([(0, "x"), (1, "y"), (2, "z")])


def test_a_gap_in_epochs_is_refused_unless_allowed(spark, target, caplog):
    sink = MVSink(target, "gap", mode="append")
    sink(spark.createDataFrame([(1, "a")], SCHEMA), 0)
    before = versions(target)
    with pytest.raises(LineageError, match=r"epochs 1\.\.2 were never committed") as info:
        sink(spark.createDataFrame([(2, "b")], SCHEMA), 3)
    assert info.value.epoch == 3 and versions(target) == before
    lenient = MVSink(target, "gap", mode="append", allow_gaps=True)
    with caplog.at_level("WARNING", logger="mvsink"):
        lenient(spark.createDataFrame([(2, "b")], SCHEMA), 3)
    assert "epochs 1..2 were never committed" in caplog.text
    assert frontier(target, "gap") == 4
