"""Redeployments of a view's query: the record of a schema the view left lands in the version
that leaves it, whatever happens to the epoch's own commit; a sink that only skips is never
refused for a schema it does not write."""

from __future__ import annotations

import pytest
from pyspark.sql import DataFrame, SparkSession

from mvsink import MVSink, SchemaMismatchError
from mvsink.failpoints import InjectedFault, armed
from mvsink.table.log import log_actions
from tests.helpers import assert_equal_to, store, target_table, versions

pytestmark = pytest.mark.usefixtures("engine")


def old_rows(spark: SparkSession, ids: range) -> DataFrame:
    return spark.createDataFrame([(i, f"n{i}") for i in ids], "id long, name string")


def new_rows(spark: SparkSession, ids: range) -> DataFrame:
    return spark.createDataFrame([(i, f"n{i}", "vip") for i in ids], "id long, name string, note string")


def _retired_at(target: str, version: int) -> list[int]:
    actions = log_actions(store(target), version) or []
    return [a["txn"]["version"] for a in actions if "txn" in a and "#schema@" in a["txn"]["appId"]]


@pytest.mark.parametrize("mode", ["upsert", "append"])
def test_the_schema_a_view_leaves_is_recorded_by_the_version_leaving_it_even_if_the_epoch_never_commits(
    spark, engine, local_target, mode
):
    """Through delta-rs the added columns land in a version of their own before the epoch's
    commit. A crash between the two (or a lost race, or a compaction) used to lose the record
    of the retired schema, and then a sink still on the old query took the table back."""
    options = {"key": ["id"]} if mode == "upsert" else {}
    sink = MVSink(local_target, "v", mode=mode, schema_changes="evolve", **options)
    sink(old_rows(spark, range(3)), 0)
    with armed({"after_schema_commit": "raise"}):
        try:
            sink(new_rows(spark, range(2, 4)), 1)
            crashed = False
        except InjectedFault:
            crashed = True
    # delta-rs: the schema-only version 1 landed, the epoch did not; the JVM Delta commits
    # both in one version (no point in between: it commits as usual).
    assert crashed == (engine == "delta-rs")
    assert _retired_at(local_target, 1) == [1]
    assert "note" in target_table(local_target).column_names
    held = versions(local_target)
    # A sink still on the old query, in complete mode as a full reconciliation would run it.
    old = MVSink(local_target, "v", lineage="old-job", schema_changes="evolve")
    with pytest.raises(SchemaMismatchError, match="left at version 1"):
        old(old_rows(spark, range(3)), 5)
    assert versions(local_target) == held and "note" in target_table(local_target).column_names


def test_sinks_on_the_old_query_that_only_skip_are_left_alone(spark, local_target):
    """A replay of a committed epoch and a read-only standby, both still on the old query, write
    nothing: they are not refused for a schema change they are not making."""
    for schema_changes in ("refuse", "evolve"):
        target = f"{local_target}-{schema_changes}"
        new = MVSink(target, "v", mode="upsert", key=["id"], schema_changes="evolve", lineage="q")
        new(old_rows(spark, range(3)), 0)
        new(new_rows(spark, range(2, 4)), 1)
        held = versions(target)
        old = MVSink(target, "v", mode="upsert", key=["id"], schema_changes=schema_changes, lineage="q")
        assert old(old_rows(spark, range(3)), 0).outcome == "replay"
        standby = MVSink(
            target, "v", mode="upsert", key=["id"], schema_changes=schema_changes, lineage="q", read_only=True
        )
        assert standby(old_rows(spark, range(3)), 7).outcome == "read_only"
        assert versions(target) == held


def test_a_standby_after_a_widening_in_complete_mode_is_left_alone(spark, local_target):
    wide = "id long, name string"
    narrow = "id int, name string"
    sink = MVSink(local_target, "v", schema_changes="evolve")
    sink(spark.createDataFrame([(1, "a")], narrow), 0)
    sink(spark.createDataFrame([(1, "a"), (2, "b")], wide), 1)
    standby = MVSink(local_target, "v", read_only=True)
    assert standby(spark.createDataFrame([(1, "a")], narrow), 2).outcome == "read_only"
    assert sink(spark.createDataFrame([(1, "a")], narrow), 1).outcome == "replay"
    assert versions(local_target) == [0, 1]
    assert_equal_to(local_target, spark.createDataFrame([(1, "a"), (2, "b")], wide))
