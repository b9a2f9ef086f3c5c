"""The same sink under a Spark Connect session: direct calls, and foreachBatch, where the sink
is pickled and runs in a Python process next to the Connect server."""

from __future__ import annotations

import os
import pickle

import pytest
from deltalake import DeltaTable

import mvsink
from mvsink import DuplicateKeyError, MVSink, frontier
from mvsink.compat import SPARK_LINE, to_arrow
from tests.helpers import (
    KEYED,
    assert_equal_to,
    assert_holds_every_version,
    expected,
    foreign_append,
    keyed,
    lifetimes,
    multiset,
    run_available,
    target_table,
    versions,
    write_orders,
)

SCHEMA = "id long, name string, x double"


def test_a_sink_pickles_as_its_options_and_runs_again_where_it_lands(spark, target):
    sink = MVSink(target, "pickled", partition_by=["name"])
    sink(spark.createDataFrame([(1, "a", 1.0)], SCHEMA), 0)
    copy = pickle.loads(pickle.dumps(sink))
    assert copy.options == sink.options and copy.reports == type(copy.reports)(maxlen=1000)
    copy(spark.createDataFrame([(1, "a", 1.0), (2, "b", 2.0)], SCHEMA), 1)
    assert frontier(target, "pickled") == 2


def test_exact_with_duplicates_and_nulls_and_repairs_a_foreign_write(connect, target, placement):
    sink = MVSink(target, "exact", placement=placement)
    rows = [(1, "a", 1.0), (1, "a", 1.0), (2, None, None), (None, None, float("nan")), (3, "c", -0.0)]
    desired = connect.createDataFrame(rows, SCHEMA)
    first = sink(desired, 0)
    assert first.inserted == 5
    assert_equal_to(target, desired)
    foreign_append(target, [{"id": 9, "name": "rogue", "x": 0.0}])
    DeltaTable(target).delete("id = 2")
    fixed = sink(desired, 1)
    assert (fixed.inserted, fixed.retracted) == (1, 1)
    assert_equal_to(target, desired)
    n = len(versions(target))
    assert sink(desired, 1).outcome == "replay" and len(versions(target)) == n


def test_upsert_and_append_under_connect(connect, target, placement):
    up = MVSink(target, "up", mode="upsert", key=["id"], delete_column="gone", placement=placement)
    schema = "id long, name string, gone boolean"
    up(connect.createDataFrame([(1, "a", False), (2, "b", False)], schema), 0)
    up(connect.createDataFrame([(2, "B", False), (1, None, True), (3, "c", False)], schema), 1)
    assert multiset(target_table(target)) == multiset(
        to_arrow(connect.createDataFrame([(2, "B"), (3, "c")], "id long, name string"))
    )
    with pytest.raises(DuplicateKeyError):
        up(connect.createDataFrame([(5, "x", False), (5, "y", False)], schema), 2)
    assert frontier(target, "up") == 2  # bad input left the target as it was

    app = MVSink(target + "-log", "log", mode="append")
    app(connect.createDataFrame([(1, "a", 1.0)], SCHEMA), 0)
    app(connect.createDataFrame([(1, "a", 1.0)], SCHEMA), 0)  # replayed: nothing added
    app(connect.createDataFrame([(2, "b", 2.0)], SCHEMA), 1)
    assert target_table(target + "-log").num_rows == 2


def test_a_streaming_query_under_connect_survives_a_restart(connect, tmp_path, target):
    source, ckpt = str(tmp_path / "in"), str(tmp_path / "ckpt")
    write_orders(source, "a", [("p1", 5), ("p2", 7), ("p1", 1)])
    run_available(connect, source, target, ckpt, checkpoint=ckpt)  # the sink runs next to the server
    assert_equal_to(target, expected(connect, source))
    first = frontier(target, "revenue")
    assert first is not None
    write_orders(source, "b", [("p3", 2), ("p2", 1)])
    run_available(connect, source, target, ckpt, checkpoint=ckpt)  # restarted from its checkpoint
    assert_equal_to(target, expected(connect, source))
    assert frontier(target, "revenue") > first
    assert os.path.isdir(ckpt)


def test_under_connect_the_checkpoint_option_gives_the_lineage(connect, tmp_path, local_target):
    import json

    from tests.helpers import commit_info, run

    target = local_target  # lineage is not the store's business: local disk only

    source = str(tmp_path / "in")
    write_orders(source, "a", [("p1", 5), ("p2", 7)])
    write_orders(source, "b", [("p1", 1)])
    old_ckpt, new_ckpt = str(tmp_path / "old"), str(tmp_path / "new")
    assert run(connect, source, old_ckpt, MVSink(target, "revenue", checkpoint=old_ckpt)) is None
    write_orders(source, "c", [("p3", 4)])
    assert run(connect, source, new_ckpt, MVSink(target, "revenue", checkpoint=new_ckpt)) is None
    assert_equal_to(target, expected(connect, source))  # taken over, not skipped as a replay
    with open(os.path.join(new_ckpt, "metadata")) as fh:
        query = json.load(fh)["id"]
    last = versions(target)[-1]
    assert commit_info(target, last)["mvsink.lineage"] == f"query:{query}"


def test_under_connect_a_query_without_checkpoint_or_lineage_is_refused(
    connect, connect_server, tmp_path, local_target
):
    source = str(tmp_path / "in")
    write_orders(source, "a", [("p1", 5)])
    orders = connect.readStream.schema("product string, amount long").csv(source)
    query = (
        orders.writeStream.foreachBatch(MVSink(local_target, "raw", mode="append"))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    refusal = "cannot see which streaming query"
    if SPARK_LINE < (4, 0):
        # Spark 3.5's Connect server loses a foreachBatch function's error (its Python worker
        # exits, the JVM reads end of stream): the client sees an empty STREAM_FAILED, and the
        # message is in the server's log (docs/operations.md, Spark Connect).
        with pytest.raises(Exception, match="STREAM_FAILED"):
            query.awaitTermination(300)
        assert refusal in connect_server.log.read_text(errors="replace")
    else:
        with pytest.raises(Exception, match=refusal):
            query.awaitTermination(300)
    assert not os.path.exists(os.path.join(local_target, "_delta_log"))  # nothing written


def test_a_history_is_kept_and_read_under_connect(connect, local_target, placement):
    history = f"{local_target}_history"
    sink = MVSink(local_target, "hist", history_target=history, placement=placement)
    sink(connect.createDataFrame([(1, "a", 1.0), (1, "a", 1.0), (2, "b", None)], SCHEMA), 0)
    sink(connect.createDataFrame([(1, "a", 1.0), (3, "c", 3.0)], SCHEMA), 1)
    for version in (0, 1):
        held = mvsink.as_of(connect, local_target, "hist", version=version)
        assert multiset(to_arrow(held)) == multiset(target_table(local_target, version))
    assert multiset(to_arrow(mvsink.as_of(connect, local_target, "hist", 0))) == multiset(
        target_table(local_target, 0)
    )


def test_an_upsert_views_history_keeps_its_late_events_under_connect(connect, local_target, placement):
    history = f"{local_target}_history"
    sink = keyed(local_target, history, placement)
    sink(connect.createDataFrame([(1, "a", 5, False), (2, "b", 5, False)], KEYED), 0)
    sink(connect.createDataFrame([(1, "late", 4, False), (2, None, 6, True)], KEYED), 1)
    assert_holds_every_version(local_target, history, "keyed")
    late = [
        (r["v"], r["opened_version"], r["closed_version"])
        for r in lifetimes(history)
        if r["opened_by"] == "late"
    ]
    assert late == [("late", 1, 1)]
