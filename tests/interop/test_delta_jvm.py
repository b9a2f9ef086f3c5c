"""mvsink beside the JVM Delta runtime (delta-spark 4.4): what Spark users see of a view.

Spark's own Delta reader reads every version of a view; Delta's own DML between epochs is
repaired; tables Spark makes with features delta-rs cannot write are refused before staging,
leaving the folder as it was; DESCRIBE HISTORY says what each mvsink commit did.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import DataFrame, SparkSession

from mvsink import ConfigError, MVSink, UnsupportedTableError
from mvsink.storage import wait_for_cleanup
from tests.helpers import multiset, store, target_table, versions

SCHEMA = "id long, name string, x double, day date, amount decimal(10,2), at timestamp"


def view_sql(ids: range, tag: str = "") -> str:
    return (
        f"SELECT id, concat('n', id, '{tag}') AS name, id / 2 AS x, "
        "date_add(DATE'2026-01-01', CAST(id % 3 AS INT)) AS day, CAST(id * 1.25 AS DECIMAL(10,2)) AS amount, "
        "timestamp_micros(1767225600000000 + id) AS at "
        f"FROM range({ids.start}, {ids.stop})"
    )


def view(spark: SparkSession, ids: range, tag: str = "") -> DataFrame:
    return spark.sql(view_sql(ids, tag))


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


def duckdb_rows(target: str, version: int) -> Counter[Any]:
    """The target at ``version`` as DuckDB's Delta reader (delta-kernel-rs) reads it."""
    import glob

    import duckdb
    import duckdb_extension_delta

    folder = os.path.dirname(duckdb_extension_delta.__file__)
    (extension,) = glob.glob(os.path.join(folder, "extensions", "*", "delta.duckdb_extension"))
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    try:
        con.execute(f"LOAD '{extension}'")
        table = con.execute(f"SELECT * FROM delta_scan('{target}', version => {version})").fetch_arrow_table()
    finally:
        con.close()
    return multiset(table, ["id", "name", "x", "day", "amount", "at"])


def test_duckdbs_delta_reader_agrees_with_sparks_at_every_version(spark, tmp_path):
    target = str(tmp_path / "view")
    sink = MVSink(target, "v", partition_by=["day"], max_rows_per_file=7, heartbeat=0)
    sink(view(spark, range(0, 30)), 0)
    sink(view(spark, range(5, 40), tag="b"), 1)
    spark.sql(f"DELETE FROM delta.`{target}` WHERE id % 4 = 0")  # Delta's DML, then a repair
    sink(view(spark, range(5, 40), tag="b"), 2)
    sink(view(spark, range(0, 12)), 3)
    for version in versions(target):
        assert duckdb_rows(target, version) == spark_rows(spark, target, version), f"version {version}"
    assert sum(duckdb_rows(target, versions(target)[-1]).values()) == 12


def test_the_operations_take_a_catalog_tables_name(spark, tmp_path, monkeypatch, capsys):
    """status, verify, frontier, promote, compact and vacuum, from Python and from the CLI
    (with a job file whose target is a name), resolve the name through the session's catalog."""
    import json

    from mvsink import frontier, promote, status, vacuum, verify
    from mvsink.cli import main

    monkeypatch.chdir(tmp_path)
    spark.sql(f"CREATE TABLE default.rev ({SCHEMA}) USING delta")
    try:
        sink = MVSink("default.rev", "rev", max_rows_per_file=4)
        for epoch in range(3):  # small files to compact
            sink(view(spark, range(0, 6 + 2 * epoch)), epoch)
        location = sink.target
        assert status("default.rev", "rev").views[0].frontier == 3
        assert frontier("default.rev", "rev") == 3
        assert verify(view(spark, range(0, 10)), "default.rev", "rev").ok
        assert not verify(view(spark, range(0, 11)), "default.rev", "rev").ok
        assert promote("default.rev", "rev", "green") > 0
        assert vacuum("default.rev").target == location
        job = tmp_path / "job.toml"
        job.write_text(
            '[job]\nquery = "mvsink.demo:revenue_query"\n\n[sink]\ntarget = "default.rev"\nname = "rev"\n'
            "max_rows_per_file = 40\n"
        )
        assert main(["compact", "--job", str(job)]) == 0
        assert "compacted" in capsys.readouterr().out
        assert main(["status", "default.rev", "--name", "rev", "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["target"] == location and shown["views"][0]["frontier"] == 3
        assert main(["verify", "--name", "rev", "--sql", view_sql(range(0, 10)), "--job", str(job)]) == 2
        capsys.readouterr()  # exactly one of --sql and --job
        assert main(["verify", "default.rev", "--name", "rev", "--sql", view_sql(range(0, 10))]) == 0
        assert main(["frontier", "default.rev", "rev"]) == 0
        assert capsys.readouterr().out.splitlines()[-1] == "3"
        rows = multiset(spark.table("default.rev").toArrow(), ["id", "name", "x", "day", "amount", "at"])
        assert rows == spark_rows(spark, location) and sum(rows.values()) == 10
        assert os.listdir(tmp_path) == ["job.toml"]  # nothing made from the name
    finally:
        spark.sql("DROP TABLE IF EXISTS default.rev")


def drain(stream: DataFrame, checkpoint: str) -> pa.Table:
    """Every row a streaming reader yields until it has read all there is (availableNow)."""
    batches: list[pa.Table] = []
    query = (
        stream.writeStream.foreachBatch(lambda df, _: batches.append(df.toArrow()))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return pa.concat_tables(batches) if batches else pa.table({})


def test_a_downstream_stream_follows_a_view_only_through_the_mvsink_delta_change_feed(spark, tmp_path):
    """What docs/readers.md says: Delta's own streaming source stops at the first correction;
    with skipChangeCommits it runs on but drops every correction (retractions and the rows
    inserted beside them); mvsink-delta's change feed sums to the view at every version."""
    from mvsink.sources import register

    target = str(tmp_path / "view")
    cols = ["id", "name", "x", "day", "amount", "at"]
    sink = MVSink(target, "v", max_rows_per_file=5, heartbeat=0)
    sink(view(spark, range(0, 10)), 0)
    sink(view(spark, range(0, 15)), 1)  # inserts only: a pure append
    corrected = view(spark, range(3, 15)).unionByName(view(spark, range(100, 102), tag="new"))
    sink(corrected, 2)  # retracts 0..2, inserts 100 and 101: a correction
    final = (
        view(spark, range(3, 15))
        .unionByName(view(spark, range(100, 102), tag="new"))
        .unionByName(view(spark, range(15, 18)))
    )
    sink(final, 3)  # a pure append again
    assert versions(target) == [0, 1, 2, 3]

    with pytest.raises(Exception, match="DELTA_SOURCE_TABLE_IGNORE_CHANGES"):
        plain = spark.readStream.format("delta").option("startingVersion", "0").load(target)
        drain(plain, str(tmp_path / "plain"))

    skipped = drain(
        spark.readStream.format("delta")
        .option("startingVersion", "0")
        .option("skipChangeCommits", "true")
        .load(target),
        str(tmp_path / "skip"),
    )
    got = multiset(skipped, cols)
    assert got == multiset(view(spark, range(0, 18)).toArrow(), cols)  # versions 0, 1 and 3 only
    assert got != multiset(final.toArrow(), cols)  # 0..2 never retracted, 100 and 101 never seen

    register(spark)
    feed = drain(
        spark.readStream.format("mvsink-delta").option("path", target).option("mode", "changes").load(),
        str(tmp_path / "changes"),
    )
    assert set(feed.column("_commit_version").to_pylist()) == {0, 1, 2, 3}
    total: Counter[Any] = Counter()
    for version in range(4):
        rows = feed.filter(pc.equal(feed.column("_commit_version"), version))
        for key, n in multiset(rows, [*cols, "diff"]).items():
            total[key[:-1]] += key[-1] * n
        assert +total == multiset(target_table(target, version), cols), f"version {version}"
        assert all(n >= 0 for n in total.values())
