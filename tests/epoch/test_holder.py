"""A view owns its table (``epoch/holder.py``): a sink never takes a table another view or tool
holds, nor re-keys a view, unless told to; each refusal leaves the target unchanged."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from mvsink import IdentityChangedError, MVSink, TableHeldError, status
from mvsink.table.log import commit_info
from mvsink.table.record import HOLDER, Keys, holder_tag
from tests.helpers import assert_equal_to, people, store, target_table, versions

pytestmark = pytest.mark.usefixtures("engine")


def _txn(target: str, app: str) -> int | None:
    found = DeltaTable(target).transaction_version(app)
    return None if found is None else int(found)


def test_a_table_another_tool_wrote_is_refused_then_taken_over_explicitly(spark, target):
    # A non-empty table no mvsink view wrote, with the view's columns: epoch 0 used to delete
    # its rows and put desired in their place, logging only at INFO.
    write_deltalake(target, pa.table({"id": [1, 2], "name": ["a", "b"], "x": [1.0, 2.0]}))
    desired = people(spark, range(5))
    with pytest.raises(TableHeldError) as info:
        MVSink(target, "v")(desired, 0)
    assert "foreign table" in info.value.message and "take_over='foreign'" in info.value.message
    assert (info.value.view, info.value.epoch) == ("v", 0) and versions(target) == [0]
    assert target_table(target).num_rows == 2

    report = MVSink(target, "v", take_over="foreign")(desired, 0)
    assert report.outcome == "committed" and versions(target) == [0, 1]  # one version
    assert_equal_to(target, desired)
    info1 = commit_info(store(target), 1)
    assert info1 is not None and "took the table over from rows no mvsink view wrote" in json.dumps(info1)
    assert _txn(target, HOLDER) == holder_tag("v")
    # Held now: the next deployment needs no option, and the option left on is inert.
    MVSink(target, "v")(people(spark, range(3, 9)), 1)
    MVSink(target, "v", take_over="foreign")(people(spark, range(4, 9)), 2)
    assert_equal_to(target, people(spark, range(4, 9)))


def test_a_second_view_on_a_held_table_is_refused_and_status_names_the_holder(spark, local_target):
    target = local_target
    first = people(spark, range(5))
    MVSink(target, "revenue")(first, 0)
    renamed = MVSink(target, "revenue_v2")  # a renamed job
    with pytest.raises(TableHeldError) as info:
        renamed(people(spark, range(10, 12)), 0)
    assert "view revenue" in info.value.message and "take_over='revenue'" in info.value.message
    assert versions(target) == [0]
    assert_equal_to(target, first)
    seen = status(target)
    assert seen.holder == "revenue" and "held by view revenue" in str(seen)

    taken = people(spark, range(10, 12))
    MVSink(target, "revenue_v2", take_over="revenue")(taken, 0)
    assert_equal_to(target, taken)
    assert status(target).holder == "revenue_v2"
    # The old view is refused now, however it is run.
    with pytest.raises(TableHeldError, match="view revenue_v2"):
        MVSink(target, "revenue")(people(spark, range(5)), 1)
    assert_equal_to(target, taken)


def test_an_empty_table_a_platform_made_is_the_first_view_to_commit(spark, local_target):
    target = local_target
    write_deltalake(
        target,
        pa.table(
            {
                "id": pa.array([], pa.int64()),
                "name": pa.array([], pa.string()),
                "x": pa.array([], pa.float64()),
            }
        ),
    )
    desired = people(spark, range(4))
    MVSink(target, "v")(desired, 0)
    assert_equal_to(target, desired)
    assert _txn(target, HOLDER) == holder_tag("v")


def test_a_table_written_before_holders_were_recorded_is_its_views(spark, local_target):
    # A view's table from before this change: its frontier, no holder. Its own view goes on
    # (and records itself); another view is refused, naming it.
    desired = people(spark, range(5))
    legacy = local_target
    write_deltalake(legacy, pa.table({"id": [1], "name": ["a"], "x": [1.0]}))
    from deltalake import CommitProperties, Transaction

    write_deltalake(
        legacy,
        pa.table({"id": [2], "name": ["b"], "x": [2.0]}),
        mode="append",
        commit_properties=CommitProperties(
            app_transactions=[Transaction(Keys.of("old").frontier, 1)],
            custom_metadata={"mvsink.view": "old", "mvsink.epoch": "0"},
        ),
    )
    with pytest.raises(TableHeldError, match="view old"):
        MVSink(legacy, "new")(people(spark, range(2)), 0)
    MVSink(legacy, "old")(desired, 1)
    assert_equal_to(legacy, desired)
    assert _txn(legacy, HOLDER) == holder_tag("old")


def _events(spark, rows):
    return spark.createDataFrame([(*r, False) for r in rows], "k long, v long, seq long, d boolean")


@pytest.mark.parametrize(
    "before, after",
    [
        ({"key": ["k"]}, {"key": ["v"]}),
        ({"key": ["k"], "sequence_column": "seq"}, {"key": ["k"], "sequence_column": "v"}),
        ({"key": ["k"]}, {"key": ["k", "v"]}),
        (
            {"key": ["k"], "sequence_column": "seq", "delete_column": "d"},
            {"key": ["k", "v"], "sequence_column": "seq", "delete_column": "d"},
        ),
    ],
    ids=["another key", "another sequence", "a wider key", "a wider key with tombstones"],
)
def test_an_upsert_view_redeployed_with_another_key_is_refused_naming_both(
    spark, local_target, placement, before, after
):
    target = local_target
    sink = MVSink(target, "u", mode="upsert", placement=placement, **before)
    sink(_events(spark, [(1, 10, 1), (2, 10, 1), (3, 20, 1)]), 0)
    held = target_table(target)
    redeployed = MVSink(target, "u", mode="upsert", placement=placement, **after)
    with pytest.raises(IdentityChangedError) as info:
        redeployed(_events(spark, [(4, 10, 2)]), 1)
    message = info.value.message
    assert f"key {before['key']}" in message and f"key {after['key']}" in message
    assert versions(target) == [0] and target_table(target).equals(held)
    # A deliberate re-keying: one deployment with take_over naming the view itself.
    MVSink(target, "u", mode="upsert", placement=placement, take_over="u", **after)(
        _events(spark, [(4, 11, 2)]), 1
    )
    info1 = commit_info(store(target), 1)
    assert info1 is not None and "took the table over from view u under key" in info1["userMetadata"]
    MVSink(target, "u", mode="upsert", placement=placement, **after)(_events(spark, [(5, 12, 3)]), 2)
    assert target_table(target).num_rows >= 4


def test_tombstones_written_under_another_key_count_for_nothing(spark, local_target, placement):
    target = local_target
    opts = {"mode": "upsert", "sequence_column": "seq", "delete_column": "d"}
    schema = "k long, k2 long, v long, seq long, d boolean"
    wide = MVSink(target, "t", key=["k", "k2"], placement=placement, **opts)
    wide(spark.createDataFrame([(1, 1, 1, 5, False), (1, 2, 1, 5, False)], schema), 0)
    wide(spark.createDataFrame([(1, 1, None, 9, True), (1, 2, None, 6, True)], schema), 1)
    assert target_table(target).num_rows == 0
    # Re-keyed by k alone (deliberately): the old set's two tombstones of k=1 (sequences 9 and
    # 6) would both match, and one would decide at random. They count for nothing instead.
    narrow = MVSink(target, "t", key=["k"], take_over="t", placement=placement, **opts)
    narrow(spark.createDataFrame([(1, 1, 7, 4, False)], schema), 2)
    rows = target_table(target).to_pylist()
    assert [(r["k"], r["v"]) for r in rows] == [(1, 7)]
