"""A view's history beside the JVM Delta runtime: on a table with deletion vectors, where
epochs retract rows by marking them in vectors and Delta's own DELETE and OPTIMIZE write in
between, the history holds every version as Spark's ``VERSION AS OF`` reads it, and
``mvsink.as_of`` reads the same rows."""

from __future__ import annotations

import logging
import os
import shutil
from collections import Counter

import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame

import mvsink
from mvsink import ConfigError, MVSink
from mvsink.compat import to_arrow
from mvsink.table.record import HistoryKeys
from tests.helpers import KEYED, keyed, multiset

COLS = ["id", "name"]


def at_version(spark, target: str, version: int) -> Counter:
    return multiset(to_arrow(spark.read.format("delta").option("versionAsOf", version).load(target)), COLS)


@pytest.mark.both_placements  # (distributed: the history's tasks read files through vectors)
@pytest.mark.parametrize("placement", ["driver", "distributed"])
def test_the_history_of_a_deletion_vector_table_holds_every_version(spark, tmp_path, placement):
    target, history = str(tmp_path / "dv"), str(tmp_path / "dv_history")
    spark.sql(
        f"CREATE TABLE delta.`{target}` (id long, name string) USING delta "
        "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    sink = MVSink(target, "v", max_rows_per_file=20, placement=placement, history_target=history)

    def desired(ids: range, every: int, tag: str) -> DataFrame:
        return spark.sql(
            f"SELECT id, CASE WHEN id % {every} = 0 THEN concat('n', id, '{tag}') ELSE concat('n', id) END "
            f"AS name FROM range({ids.start}, {ids.stop})"
        )

    sink(desired(range(100), 1000, ""), 0)
    sink(desired(range(100), 13, "a"), 1)  # rows retracted through new vectors
    spark.sql(f"DELETE FROM delta.`{target}` WHERE id IN (30, 31, 57)")  # Delta's own vectors
    spark.sql(f"OPTIMIZE delta.`{target}`")  # moves rows, changes none
    sink(desired(range(100), 11, "b"), 2)  # repairs the delete
    sink(desired(range(60), 11, "b"), 3)
    newest = DeltaTable(target).version()
    assert DeltaTable(history).transaction_version(HistoryKeys("v").frontier) == newest + 1
    rows = DeltaTable(history).to_pyarrow_table().to_pylist()
    for version in range(newest + 1):
        want = at_version(spark, target, version)
        held = Counter(
            (r["id"], r["name"])
            for r in rows
            if r["opened_version"] <= version
            and (r["closed_version"] is None or r["closed_version"] > version)
        )
        assert held == want, f"version {version}"
        assert multiset(to_arrow(mvsink.as_of(spark, target, "v", version=version)), COLS) == want
    deleted = {
        (r["id"], r["closed_by"]) for r in rows if r["id"] in (30, 31, 57) and r["closed_by"] == "foreign"
    }
    assert {i for i, _ in deleted} == {30, 31, 57}
    repaired = {r["id"] for r in rows if r["opened_by"] == "repair"}
    assert {30, 31, 57} <= repaired


LIFETIME_DDL = (
    "valid_from TIMESTAMP, valid_to TIMESTAMP, opened_version BIGINT, opened_epoch BIGINT, "
    "opened_by STRING, closed_version BIGINT, closed_epoch BIGINT, closed_by STRING"
)
"""The lifetime columns as docs/history.md's ``CREATE TABLE`` lists them."""


def test_a_history_named_in_the_catalog_is_kept_where_the_catalog_says(spark, tmp_path, caplog):
    """Both tables made in the catalog, as a platform makes them: the history begins in the
    empty table, ``as_of`` reads it by name, and a history table moved by ``ALTER TABLE`` is
    followed; a name the catalog does not know is refused, the view untouched."""
    view_at, history_at, moved_to = (str(tmp_path / d) for d in ("orders", "orders_h", "orders_h2"))
    spark.sql(f"CREATE TABLE default.orders (id BIGINT, name STRING) USING delta LOCATION '{view_at}'")
    spark.sql(
        f"CREATE TABLE default.orders_history (id BIGINT, name STRING, {LIFETIME_DDL}) USING delta "
        f"LOCATION '{history_at}'"
    )
    try:
        sink = MVSink("default.orders", "orders", history_target="default.orders_history")
        for epoch, (ids, tag) in enumerate([(range(10), ""), (range(4, 12), "b"), (range(6, 9), "c")]):
            desired = spark.sql(
                f"SELECT id, concat('n', id, '{tag}') AS name FROM range({ids.start}, {ids.stop})"
            )
            assert sink(desired, epoch).outcome == "committed"
        assert sink.options.history_target == history_at
        newest = DeltaTable(view_at).version()
        for version in range(1, newest + 1):  # (version 0 is the CREATE TABLE: no rows)
            got = mvsink.as_of(
                spark, "default.orders", "orders", version=version, history_target="default.orders_history"
            )
            assert multiset(to_arrow(got), COLS) == at_version(spark, view_at, version), f"version {version}"
        open_now = spark.sql("SELECT id, name FROM default.orders_history WHERE valid_to IS NULL")
        assert multiset(to_arrow(open_now), COLS) == multiset(to_arrow(spark.table("default.orders")), COLS)

        # The history table moves, files and all: the next call writes it where the catalog says.
        shutil.copytree(history_at, moved_to)
        spark.sql(f"ALTER TABLE default.orders_history SET LOCATION '{moved_to}'")
        shutil.rmtree(history_at)
        with caplog.at_level(logging.WARNING, logger="mvsink"):
            sink(spark.sql("SELECT id, concat('n', id) AS name FROM range(0, 3)"), 3)
        assert "history table default.orders_history moved" in caplog.text
        assert DeltaTable(moved_to).transaction_version(HistoryKeys("orders").frontier) == newest + 2
        assert not os.path.exists(history_at)

        before = DeltaTable(view_at).version()
        with pytest.raises(ConfigError, match="catalog does not know"):
            MVSink("default.orders", "orders", history_target="default.nowhere")(
                spark.sql("SELECT 1L AS id, 'x' AS name"), 4
            )
        assert DeltaTable(view_at).version() == before
    finally:
        spark.sql("DROP TABLE IF EXISTS default.orders")
        spark.sql("DROP TABLE IF EXISTS default.orders_history")


def test_an_upsert_view_on_a_deletion_vector_table_follows_its_vectors_by_position(spark, tmp_path, caplog):
    """Upsert epochs on a table with deletion vectors drop rows by marking them: the history
    cuts those positions out of the file's mirror, for the file added again with its vector
    (no row matched by value), and holds every version as Spark's ``VERSION AS OF`` reads it."""
    target, history = str(tmp_path / "dv"), str(tmp_path / "dv_history")
    spark.sql(
        f"CREATE TABLE delta.`{target}` (id long, v string, seq long) USING delta "  # (no delete column)
        "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    sink = keyed(target, history, max_rows_per_file=25)
    with caplog.at_level(logging.DEBUG, logger="mvsink.history.keep"):
        sink(spark.createDataFrame([(i, f"v{i}", 1, False) for i in range(100)], KEYED), 0)
        sink(spark.createDataFrame([(i, f"w{i}", 2, i % 3 == 0) for i in range(0, 100, 7)], KEYED), 1)
        sink(spark.createDataFrame([(i, f"x{i}", 3, False) for i in range(2, 100, 11)], KEYED), 2)
    counts = [
        r.getMessage().split(": ")[-1].split(" rewritten")[0].split(" of ")
        for r in caplog.records
        if "followed by where their rows went" in r.getMessage()
    ]
    assert len(counts) == 2 and all(a == b and int(a) >= 2 for a, b in counts), counts
    for version in (2, 3):  # the epochs marked rows in vectors, not rewriting files
        with open(os.path.join(target, "_delta_log", f"{version:020d}.json")) as fh:
            assert '"deletionVector":{' in fh.read().replace(" ", "")
    newest = DeltaTable(target).version()
    rows = DeltaTable(history).to_pyarrow_table().to_pylist()
    for version in range(1, newest + 1):
        then = to_arrow(spark.read.format("delta").option("versionAsOf", version).load(target))
        held = Counter(
            tuple(r[c] for c in then.column_names)
            for r in rows
            if r["opened_version"] <= version
            and (r["closed_version"] is None or r["closed_version"] > version)
        )
        assert held == multiset(then, then.column_names), f"version {version}"
