"""mvsink beside the JVM Delta runtime (delta-spark 4.4): what Spark users see of a view.

Spark's own Delta reader reads every version of a view; Delta's own DML between epochs is
repaired; tables Spark makes with features delta-rs cannot write are refused before staging,
leaving the folder as it was; DESCRIBE HISTORY says what each mvsink commit did.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from mvsink import ConfigError, MVSink, UnsupportedTableError
from mvsink.storage import wait_for_cleanup
from tests.helpers import multiset, store, target_table, versions

SCHEMA = "id long, name string, x double, day date, amount decimal(10,2), at timestamp"


def view(spark: SparkSession, ids: range, tag: str = "") -> DataFrame:
    return spark.sql(
        f"SELECT id, concat('n', id, '{tag}') AS name, id / 2 AS x, "
        "date_add(DATE'2026-01-01', CAST(id % 3 AS INT)) AS day, CAST(id * 1.25 AS DECIMAL(10,2)) AS amount, "
        "timestamp_micros(1767225600000000 + id) AS at "
        f"FROM range({ids.start}, {ids.stop})"
    )


def spark_rows(spark: SparkSession, target: str, version: int | None = None) -> Counter[Any]:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    table = reader.load(target)
    return multiset(table.toArrow(), ["id", "name", "x", "day", "amount", "at"])


def test_spark_reads_every_version_of_a_partitioned_view(spark, tmp_path):
    target = str(tmp_path / "view")
    sink = MVSink(target, "v", partition_by=["day"], max_rows_per_file=7, heartbeat=0)
    for epoch, ids in enumerate([range(0, 30), range(5, 40), range(5, 40), range(0, 12)]):
        sink(view(spark, ids, tag=str(epoch % 2)), epoch)
    for version in versions(target):
        want = multiset(target_table(target, version), ["id", "name", "x", "day", "amount", "at"])
        assert spark_rows(spark, target, version) == want, f"version {version}"
    assert sum(spark_rows(spark, target).values()) == 12


def test_deltas_own_dml_between_epochs_is_repaired(spark, tmp_path):
    target = str(tmp_path / "view")
    desired = view(spark, range(0, 20))
    sink = MVSink(target, "v", max_rows_per_file=6)
    sink(desired, 0)
    want = multiset(desired.toArrow(), ["id", "name", "x", "day", "amount", "at"])
    spark.sql(f"DELETE FROM delta.`{target}` WHERE id IN (1, 7)")
    spark.sql(f"UPDATE delta.`{target}` SET name = 'changed' WHERE id = 3")
    view(spark, range(100, 102)).createOrReplaceTempView("incoming")
    spark.sql(
        f"MERGE INTO delta.`{target}` t USING incoming s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    )
    view(spark, range(200, 201)).write.format("delta").mode("append").save(target)
    assert spark_rows(spark, target) != want
    report = sink(desired, 1)
    assert report.outcome == "committed" and report.retracted >= 4
    assert spark_rows(spark, target) == want


@pytest.mark.parametrize(
    "ddl",
    [
        "TBLPROPERTIES ('delta.enableRowTracking' = 'true')",
        "CLUSTER BY (id)",
    ],
    ids=["row-tracking", "liquid-clustering"],
)
def test_a_table_spark_made_with_features_deltalake_cannot_write_is_refused_before_staging(
    spark, tmp_path, ddl
):
    target = str(tmp_path / "made-by-spark")
    spark.sql(f"CREATE TABLE delta.`{target}` ({SCHEMA}) USING delta {ddl}")
    view(spark, range(0, 5)).write.format("delta").mode("append").save(target)
    wait_for_cleanup()
    files = store(target).files("")
    with pytest.raises(UnsupportedTableError, match="Unsupported table features required") as info:
        MVSink(target, "v")(view(spark, range(0, 8)), 0)
    assert "nothing was staged" in str(info.value)
    assert store(target).files("") == files  # the folder exactly as it was


def test_describe_history_says_what_each_commit_did(spark, tmp_path):
    target = str(tmp_path / "view")
    sink = MVSink(target, "revenue", writer="blue")
    sink(view(spark, range(0, 10)), 0)
    report = sink(view(spark, range(2, 11)), 1)
    history = spark.sql(f"DESCRIBE HISTORY delta.`{target}`").orderBy("version").collect()
    said = [row["userMetadata"] for row in history]
    assert said[-1] == (
        f"mvsink view revenue epoch 1: +{report.inserted} -{report.retracted} rows, files "
        f"+{report.files_added} -{report.files_removed}, frontier 2, lineage direct, writer blue"
    )
    assert said[0].startswith("mvsink view revenue epoch 0: +10 -0 rows")


def test_a_catalog_table_is_addressed_by_name(spark, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spark.sql(f"CREATE TABLE default.revenue ({SCHEMA}) USING delta")
    try:
        desired = view(spark, range(0, 12))
        sink = MVSink("default.revenue", "revenue")
        assert sink(desired, 0).outcome == "committed"
        want = multiset(desired.toArrow(), ["id", "name", "x", "day", "amount", "at"])
        assert (
            multiset(spark.table("default.revenue").toArrow(), ["id", "name", "x", "day", "amount", "at"])
            == want
        )
        again = view(spark, range(3, 14))
        assert MVSink("`spark_catalog`.`default`.`revenue`", "revenue")(again, 1).outcome == "committed"
        got = multiset(spark.table("default.revenue").toArrow(), ["id", "name", "x", "day", "amount", "at"])
        assert got == multiset(again.toArrow(), ["id", "name", "x", "day", "amount", "at"])
        assert sink.frontier() == 2
        assert os.listdir(tmp_path) == []  # nothing made from the name in the working directory
        assert sink.target != "default.revenue" and os.path.isdir(os.path.join(sink.target, "_delta_log"))
        with pytest.raises(ConfigError, match="catalog does not know"):
            MVSink("default.nope", "v")(desired, 0)
        # A location whose name holds a percent sign is taken as it is (not decoded), and
        # refused: delta-rs would read it as an escape and split the table over two folders.
        odd = tmp_path / "a%41b"
        spark.sql(f"CREATE TABLE default.odd ({SCHEMA}) USING delta LOCATION '{odd}'")
        with pytest.raises(ConfigError, match=r"a%41b.*percent-escape"):
            MVSink("default.odd", "odd")(desired, 0)
        assert not (tmp_path / "aAb").exists()
        spark.range(3).write.format("parquet").saveAsTable("default.plain")
        with pytest.raises(ConfigError, match="not a Delta table"):
            MVSink("default.plain", "v")(desired, 0)
    finally:
        spark.sql("DROP TABLE IF EXISTS default.revenue")
        spark.sql("DROP TABLE IF EXISTS default.plain")
        spark.sql("DROP TABLE IF EXISTS default.odd")


def test_deltas_optimize_inside_an_epochs_commit_window_and_vacuum_leave_every_version_exact(spark, tmp_path):
    """Delta's OPTIMIZE landing between an epoch's snapshot and its commit makes the commit
    conflict and re-plan (never turn a retraction into a no-op); VACUUM with the default
    retention deletes nothing any version references."""
    from tests.helpers import once

    target = str(tmp_path / "view")
    sink = MVSink(target, "v", max_rows_per_file=4, heartbeat=0)
    sink(view(spark, range(0, 30)), 0)
    sink._before_commit = once(lambda: spark.sql(f"OPTIMIZE delta.`{target}`").collect())
    report = sink(view(spark, range(2, 30), tag="b"), 1)
    assert report.outcome == "committed" and report.attempts == 2
    sink(view(spark, range(4, 33), tag="c"), 2)
    spark.sql(f"VACUUM delta.`{target}`").collect()
    for version in versions(target):
        want = multiset(target_table(target, version), ["id", "name", "x", "day", "amount", "at"])
        assert spark_rows(spark, target, version) == want, f"version {version}"
    assert spark_rows(spark, target) == multiset(
        view(spark, range(4, 33), tag="c").toArrow(), ["id", "name", "x", "day", "amount", "at"]
    )
