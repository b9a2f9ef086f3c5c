"""Catalog tables whose location is unusual or changes, and views, named as targets
(``table/catalog.py``): the sink writes exactly where the catalog says, looked up at each
query run's first epoch and at each direct call.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from mvsink import ConfigError, MVSink, status
from mvsink.compat import to_arrow
from tests.helpers import multiset

SCHEMA = "id long, name string"


def _view(spark, ids: range, tag: str = ""):
    return spark.sql(f"SELECT id, concat('n', id, '{tag}') AS name FROM range({ids.start}, {ids.stop})")


def _rows(spark, location: str):
    return multiset(to_arrow(spark.read.format("delta").load(location)), ["id", "name"])


@pytest.mark.parametrize("suffix", ["#v2", "?v=2"])
def test_a_location_holding_a_hash_or_question_mark_is_written_exactly(spark, tmp_path, suffix):
    """``/lake/orders#v2`` is that folder, never ``/lake/orders`` beside it (which here holds a
    table the view would fit)."""
    lake = tmp_path / "lake"
    neighbour, location = str(lake / "orders"), f"{lake / 'orders'}{suffix}"
    spark.sql(f"CREATE TABLE delta.`{neighbour}` ({SCHEMA}) USING delta")
    spark.sql(f"CREATE TABLE default.orders_v2 ({SCHEMA}) USING delta LOCATION '{location}'")
    try:
        desired = _view(spark, range(0, 8))
        sink = MVSink("default.orders_v2", "orders")
        assert sink(desired, 0).outcome == "committed"
        assert sink.target == location
        assert _rows(spark, location) == multiset(to_arrow(desired), ["id", "name"])
        assert multiset(to_arrow(spark.table("default.orders_v2")), ["id", "name"]) == _rows(spark, location)
        assert _rows(spark, neighbour) == multiset(to_arrow(_view(spark, range(0))), ["id", "name"])
        assert sorted(os.listdir(lake)) == sorted(["orders", os.path.basename(location)])
    finally:
        spark.sql("DROP TABLE IF EXISTS default.orders_v2")


def test_a_table_moved_by_alter_table_is_followed_from_the_next_epoch(spark, tmp_path, caplog):
    """``ALTER TABLE ... SET LOCATION`` while a sink runs: the next epoch writes the new
    location (the catalog is the truth), with a WARNING; the old folder keeps what it had."""
    old, new = str(tmp_path / "v1"), str(tmp_path / "v2")
    spark.sql(f"CREATE TABLE default.moving ({SCHEMA}) USING delta LOCATION '{old}'")
    spark.sql(f"CREATE TABLE delta.`{new}` ({SCHEMA}) USING delta")
    try:
        sink = MVSink("default.moving", "moving")
        first = _view(spark, range(0, 10))
        assert sink(first, 0).outcome == "committed" and sink.target == old
        spark.sql(f"ALTER TABLE default.moving SET LOCATION '{new}'")
        second = _view(spark, range(5, 12), tag="b")
        with caplog.at_level(logging.WARNING, logger="mvsink.sink"):
            assert sink(second, 1).outcome == "committed"
        assert sink.target == new
        assert any(f"moved from {old} to {new}" in r.getMessage() for r in caplog.records)
        assert _rows(spark, new) == multiset(to_arrow(second), ["id", "name"])
        assert multiset(to_arrow(spark.table("default.moving")), ["id", "name"]) == _rows(spark, new)
        assert _rows(spark, old) == multiset(to_arrow(first), ["id", "name"])
        assert sink.frontier() == 2
    finally:
        spark.sql("DROP TABLE IF EXISTS default.moving")


def test_a_query_looks_the_name_up_once_a_run_and_a_restart_follows_a_move(spark, tmp_path, caplog):
    from tests.helpers import write_orders

    old, new, source = str(tmp_path / "v1"), str(tmp_path / "v2"), str(tmp_path / "in")
    columns = "product string, amount long"
    spark.sql(f"CREATE TABLE default.orders_log ({columns}) USING delta LOCATION '{old}'")
    spark.sql(f"CREATE TABLE delta.`{new}` ({columns}) USING delta")
    sink = MVSink("default.orders_log", "log", mode="append", on_new_lineage="adopt")

    def run() -> None:
        stream = spark.readStream.schema(columns).option("maxFilesPerTrigger", 1).csv(source)
        query = (
            stream.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        assert query.exception() is None

    try:
        write_orders(source, "a", [("p1", 5)])
        write_orders(source, "b", [("p2", 7)])
        with caplog.at_level(logging.INFO, logger="mvsink.sink"):
            run()  # two batches, one lookup
        assert sum("table default.orders_log is at" in r.getMessage() for r in caplog.records) == 1
        assert len(sink.reports) == 2 and sink.target == old
        spark.sql(f"ALTER TABLE default.orders_log SET LOCATION '{new}'")
        write_orders(source, "c", [("p3", 9)])
        run()  # the restarted query looks it up again: the new location
        assert sink.target == new
        assert _rows_of(spark, new) == {("p3", 9): 1}
        assert _rows_of(spark, old) == {("p1", 5): 1, ("p2", 7): 1}
    finally:
        spark.sql("DROP TABLE IF EXISTS default.orders_log")


def _rows_of(spark, location: str):
    return multiset(to_arrow(spark.read.format("delta").load(location)), ["product", "amount"])


def test_a_catalog_view_is_refused_as_a_view(spark, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spark.sql(f"CREATE TABLE default.base ({SCHEMA}) USING delta LOCATION '{tmp_path / 'base'}'")
    spark.sql("CREATE VIEW default.recent AS SELECT * FROM default.base WHERE id > 3")
    try:
        with pytest.raises(ConfigError, match=r"'default\.recent' is a view, not a table"):
            MVSink("default.recent", "v")(_view(spark, range(3)), 0)
    finally:
        spark.sql("DROP VIEW IF EXISTS default.recent")
        spark.sql("DROP TABLE IF EXISTS default.base")
    assert os.listdir(tmp_path) == ["base"]


def test_status_counts_no_row_a_deletion_vector_removed(spark, tmp_path):
    """``status`` without a Delta session (delta-rs lists row counts, not deletion vectors)
    says the rows are unknown rather than count rows Delta's DELETE removed; with the session's
    Delta it counts exactly."""
    target = str(tmp_path / "dv")
    spark.sql(
        f"CREATE TABLE delta.`{target}` ({SCHEMA}) USING delta "
        "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    _view(spark, range(10)).coalesce(1).write.format("delta").mode("append").save(target)
    spark.sql(f"DELETE FROM delta.`{target}` WHERE id < 3")
    assert status(target).rows == 7
    script = "import json, sys\nfrom mvsink import status\nprint(json.dumps(status(sys.argv[1]).to_json()))\n"
    done = subprocess.run([sys.executable, "-c", script, target], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["rows"] is None and printed["files"] == 1
