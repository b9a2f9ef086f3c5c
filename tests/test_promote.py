"""Promotion: the target names the view's active writer; the others fence themselves."""

from __future__ import annotations

import pytest

from mvsink import ConflictError, MVSink, promote
from mvsink.cli import main
from mvsink.config import SinkOptions
from mvsink.delta import load_snapshot
from mvsink.errors import ConfigError, Where
from mvsink.sink import promote_on
from tests.helpers import assert_equal_to, versions

SCHEMA = "id long, v string"


def test_blue_green_the_promoted_standby_writes_and_the_old_writer_is_fenced(spark, target, capsys):
    blue = MVSink(target, "v", writer="blue")
    green = MVSink(target, "v", writer="green", read_only=True)
    for epoch in range(3):
        rows = spark.createDataFrame([(i, f"e{epoch}") for i in range(4)], SCHEMA)
        assert blue(rows, epoch).outcome == "committed"  # no promotion yet: blue writes
        assert green(rows, epoch).outcome in ("read_only", "replay")
    before = versions(target)
    assert len(before) == 3  # the standby created no versions

    assert main(["promote", target, "--name", "v", "--writer", "green"]) == 0
    assert "green is the active writer" in capsys.readouterr().out
    nxt = spark.createDataFrame([(9, "green")], SCHEMA)
    assert green(nxt, 3).outcome == "committed"  # from its next epoch, though started read-only
    assert_equal_to(target, nxt)
    after = versions(target)
    assert blue(spark.createDataFrame([(1, "blue")], SCHEMA), 4).outcome == "fenced"
    assert versions(target) == after
    assert_equal_to(target, nxt)


def test_two_promotions_at_once_exactly_one_lands(spark, target):
    MVSink(target, "v")(spark.createDataFrame([(1, "a")], SCHEMA), 0)
    snap = load_snapshot(target, "mvsink:v", {}, Where())
    first = SinkOptions.build(target=target, name="v", writer="a")
    second = SinkOptions.build(target=target, name="v", writer="b")
    promote_on(snap, first, Where())
    with pytest.raises(ConflictError):
        promote_on(snap, second, Where())  # against the same version: it cannot land
    a, b = MVSink(target, "v", writer="a"), MVSink(target, "v", writer="b")
    assert a(spark.createDataFrame([(2, "a")], SCHEMA), 1).outcome == "committed"
    assert b(spark.createDataFrame([(3, "b")], SCHEMA), 2).outcome == "fenced"


def test_promotion_needs_a_writer_and_a_table(spark, target):
    with pytest.raises(ConfigError, match="writer"):
        MVSink(target, "v").promote()
    with pytest.raises(ConfigError, match="no Delta table"):
        promote(target, "v", "green")
    assert main(["promote", target, "--name", "v", "--writer", "green"]) == 2
