"""Readers across a view's schema changes (``schema_changes = "evolve"``): Spark's Delta reader
reads every version as it was, DuckDB's (delta-kernel-rs) reads each version when it is the
latest, and Change Data Feed holds exactly what the change retracted and inserted."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession

from mvsink import MVSink
from mvsink.compat import to_arrow
from tests.helpers import duckdb_keys, feed_by_version, multiset, target_table


def queries(spark: SparkSession) -> list[DataFrame]:
    """A view's query as it changes: as first deployed; with ``tier`` added; with ``qty``
    widened from int to long; with ``note`` dropped."""
    base = "SELECT id AS k, concat('n', id) AS note, CAST(id AS INT) AS qty FROM range(0, 12)"
    tier = "CASE WHEN k % 3 = 0 THEN 'gold' END AS tier"
    wide = "CAST(qty AS LONG) * 1000000000 AS qty"
    return [
        spark.sql(base),
        spark.sql(f"SELECT *, {tier} FROM ({base})"),
        spark.sql(f"SELECT k, note, {wide}, {tier} FROM ({base})"),
        spark.sql(f"SELECT k, {wide}, {tier} FROM ({base})"),
    ]


def rows(table: pa.Table) -> Counter[Any]:
    return multiset(table, sorted(table.column_names))


@pytest.mark.parametrize("engine", ["delta-rs", "delta-spark"])
def test_spark_and_duckdb_read_every_version_across_added_widened_and_dropped_columns(
    spark, tmp_path, engine
):
    target = str(tmp_path / "view")
    sink = MVSink(target, "v", engine=engine, schema_changes="evolve", max_rows_per_file=5)
    for epoch, query in enumerate(queries(spark)):
        assert sink(query, epoch).version == epoch
        want = rows(to_arrow(query))
        assert duckdb_keys(target, "true") == {r.k for r in query.collect()}
        assert rows(target_table(target)) == want
    for version, query in enumerate(queries(spark)):
        held = to_arrow(spark.read.format("delta").option("versionAsOf", version).load(target))
        assert held.column_names == query.columns, version
        assert rows(held) == rows(to_arrow(query)), version


def test_change_data_feed_of_an_added_column_holds_the_rows_it_changed(spark, tmp_path):
    """On a table with Change Data Feed (the JVM Delta commits it), adding a column that is
    set in some rows retracts and inserts exactly those rows: the rest keep their files."""
    target = str(tmp_path / "cdf")
    spark.sql(
        f"CREATE TABLE delta.`{target}` (k long, note string, qty int) USING delta "
        "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')"
    )
    sink = MVSink(target, "v", schema_changes="evolve", max_rows_per_file=5)
    first, added = queries(spark)[:2]
    sink(first, 0)
    assert sink(added, 1).retracted == 4  # k = 0, 3, 6, 9 get a tier
    cols = ["k", "note", "qty", "tier"]
    feed = feed_by_version(spark, target, cols)
    before = multiset(to_arrow(first.selectExpr("*", "CAST(NULL AS STRING) AS tier")), cols)
    after = multiset(to_arrow(added), cols)
    assert feed[2]["delete"] == before - after and feed[2]["insert"] == after - before
    assert sum(feed[2]["insert"].values()) == 4
