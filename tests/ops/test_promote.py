"""Promotion: the local_target names the view's active writer; the others fence themselves."""

from __future__ import annotations

import pytest

from mvsink import ConflictError, MVSink, promote
from mvsink.cli.main import main
from mvsink.config import SinkOptions
from mvsink.errors import ConfigError, Where
from mvsink.ops.promote import promote_on
from mvsink.table.delta import load_snapshot
from tests.helpers import assert_equal_to, versions

# Runs on both engines (tests/conftest.py: each line runs the engine it has).
pytestmark = pytest.mark.usefixtures("engine")

SCHEMA = "id long, v string"


def test_blue_green_the_promoted_standby_writes_and_the_old_writer_is_fenced(spark, local_target, capsys):
    blue = MVSink(local_target, "v", writer="blue")
    green = MVSink(local_target, "v", writer="green", read_only=True)
    for epoch in range(3):
        rows = spark.createDataFrame([(i, f"e{epoch}") for i in range(4)], SCHEMA)
        assert blue(rows, epoch).outcome == "committed"  # no promotion yet: blue writes
        assert green(rows, epoch).outcome in ("read_only", "replay")
    before = versions(local_target)
    assert len(before) == 3  # the standby created no versions

    assert main(["promote", local_target, "--name", "v", "--writer", "green"]) == 0
    assert "green is the active writer" in capsys.readouterr().out
    nxt = spark.createDataFrame([(9, "green")], SCHEMA)
    assert green(nxt, 3).outcome == "committed"  # from its next epoch, though started read-only
    assert_equal_to(local_target, nxt)
    after = versions(local_target)
    assert blue(spark.createDataFrame([(1, "blue")], SCHEMA), 4).outcome == "fenced"
    assert versions(local_target) == after
    assert_equal_to(local_target, nxt)


def test_two_promotions_at_once_exactly_one_lands(spark, local_target):
    MVSink(local_target, "v")(spark.createDataFrame([(1, "a")], SCHEMA), 0)
    snap = load_snapshot(local_target, "mvsink:v", {}, Where())
    first = SinkOptions.build(target=local_target, name="v", writer="a")
    second = SinkOptions.build(target=local_target, name="v", writer="b")
    promote_on(snap, first, Where())
    with pytest.raises(ConflictError):
        promote_on(snap, second, Where())  # against the same version: it cannot land
    a, b = MVSink(local_target, "v", writer="a"), MVSink(local_target, "v", writer="b")
    assert a(spark.createDataFrame([(2, "a")], SCHEMA), 1).outcome == "committed"
    assert b(spark.createDataFrame([(3, "b")], SCHEMA), 2).outcome == "fenced"


def test_promotion_needs_a_writer_and_a_table(spark, local_target):
    with pytest.raises(ConfigError, match="writer"):
        MVSink(local_target, "v").promote()
    with pytest.raises(ConfigError, match="no Delta table"):
        promote(local_target, "v", "green")
    assert main(["promote", local_target, "--name", "v", "--writer", "green"]) == 2


def test_failback_a_promoted_writer_whose_lineage_was_superseded_takes_the_view_back(spark, local_target):
    rows = spark.createDataFrame([(1, "blue")], SCHEMA)
    blue = MVSink(local_target, "v", writer="blue", lineage="blue")
    green = MVSink(local_target, "v", writer="green", lineage="green", read_only=True)
    blue(rows, 0)
    promote(local_target, "v", "green")
    greens = spark.createDataFrame([(2, "green")], SCHEMA)
    assert green(greens, 0).outcome == "committed"  # a new lineage, and the active writer
    assert blue(rows, 1).outcome == "fenced"
    promote(local_target, "v", "blue")  # fail back
    assert blue(rows, 2).outcome == "committed"  # its lineage was fenced; promotion wins
    assert green(greens, 1).outcome == "fenced"
    assert_equal_to(local_target, rows)


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_new_lineage_beside_a_promoted_writer_is_fenced_not_an_error(spark, local_target, mode):
    """Every sink but the active writer reports "fenced", a new lineage refused by
    on_new_lineage="fail" too (found by the model-based test)."""
    keyed = {"key": ["id"]} if mode == "upsert" else {}
    primary = MVSink(local_target, "v", mode=mode, writer="primary", **keyed)
    primary(spark.createDataFrame([(1, "a")], SCHEMA), 0)
    primary.promote()
    before = versions(local_target)
    other = MVSink(local_target, "v", mode=mode, writer="other", lineage="L1", **keyed)
    assert other(spark.createDataFrame([(2, "b")], SCHEMA), 0).outcome == "fenced"
    assert versions(local_target) == before


@pytest.mark.parametrize("mode", ["complete", "append", "upsert"])
def test_a_standby_reports_the_rows_it_would_insert_into_an_empty_target(spark, local_target, mode):
    """A standby's report shows its correction also where Spark tasks would write the rows
    (found by the model-based test: it said +0)."""
    keyed = {"key": ["id"]} if mode == "upsert" else {}
    standby = MVSink(local_target, "v", mode=mode, read_only=True, writer="s", **keyed)
    report = standby(spark.createDataFrame([(1, "a"), (2, "b")], SCHEMA), 0)
    assert (report.outcome, report.inserted, report.retracted) == ("read_only", 2, 0)
