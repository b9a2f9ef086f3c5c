"""mvsink beside the JVM Delta runtime (delta-spark 4.4 on Spark 4.2, 3.3 on 3.5): what Spark
users see of a view.

Spark's own Delta reader reads every version of a view; Delta's own DML between epochs is
repaired; tables Spark makes with features delta-rs cannot write are refused before staging,
leaving the folder as it was; DESCRIBE HISTORY says what each mvsink commit did.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from mvsink import ConfigError, MVSink, UnsupportedTableError, failpoints
from mvsink.compat import to_arrow
from mvsink.table.storage import wait_for_cleanup
from tests.delta_session import DELTA_VERSION
from tests.helpers import (
    added,
    data_files_on_disk,
    feed_by_version,
    live_files,
    multiset,
    store,
    target_table,
    versions,
    view,
    view_sql,
)

SCHEMA = "id long, name string, x double, day date, amount decimal(10,2), at timestamp"


def wide(spark: SparkSession, ids: range, tag: str = "") -> DataFrame:
    """A view of every kind of column mvsink keeps, with nulls and NaN, partitioned by ``day``
    (a date) and ``flag`` (a boolean)."""
    return spark.sql(
        f"SELECT id, id % 2 = 0 AS flag, CAST(id AS INT) AS small, CAST(id AS SMALLINT) AS tiny, "
        "CAST(id / 3 AS FLOAT) AS f, "
        "CASE WHEN id % 7 = 0 THEN double('NaN') WHEN id % 5 = 0 THEN NULL ELSE id / 2 END AS x, "
        f"CAST(concat('b', id, '{tag}') AS BINARY) AS raw, "
        f"named_struct('a', CAST(id AS INT), 'b', concat('s', id, '{tag}')) AS st, "
        "array(concat('a', id), NULL) AS arr, map('k', CAST(id AS INT)) AS m, "
        "CAST(timestamp_micros(1767225600000000 + id) AS TIMESTAMP_NTZ) AS ntz, "
        f"CASE WHEN id % 4 = 0 THEN NULL ELSE concat('n', id, '{tag}') END AS name, "
        "date_add(DATE'2026-01-01', CAST(id % 3 AS INT)) AS day, CAST(id * 1.25 AS DECIMAL(10,2)) AS amount, "
        f"timestamp_micros(1767225600000000 + id) AS at FROM range({ids.start}, {ids.stop})"
    )


def spark_rows(
    spark: SparkSession, target: str, version: int | None = None, cols: list[str] | None = None
) -> Counter[Any]:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    table = to_arrow(reader.load(target))
    return multiset(table, cols or ["id", "name", "x", "day", "amount", "at"])


def wide_view(spark: SparkSession, target: str) -> list[str]:
    """Keep a wide, partitioned view through four epochs and Delta's own DELETE; its columns."""
    sink = MVSink(target, "v", partition_by=["day", "flag"], max_rows_per_file=7, heartbeat=0)
    for epoch, ids in enumerate([range(0, 30), range(5, 40), range(5, 40), range(0, 12)]):
        if epoch == 2:
            spark.sql(f"DELETE FROM delta.`{target}` WHERE id % 4 = 1")  # repaired by the next epoch
        sink(wide(spark, ids, tag=str(epoch % 2)), epoch)
    return wide(spark, range(0, 1)).columns


def test_spark_reads_every_version_of_a_partitioned_view_of_every_type(spark, tmp_path):
    target = str(tmp_path / "view")
    cols = wide_view(spark, target)
    for version in versions(target):
        want = multiset(target_table(target, version), cols)
        assert spark_rows(spark, target, version, cols) == want, f"version {version}"
    assert spark_rows(spark, target, None, cols) == multiset(to_arrow(wide(spark, range(0, 12), "1")), cols)


def test_deltas_own_dml_between_epochs_is_repaired(spark, tmp_path):
    target = str(tmp_path / "view")
    desired = view(spark, range(0, 20))
    sink = MVSink(target, "v", max_rows_per_file=6)
    sink(desired, 0)
    want = multiset(to_arrow(desired), ["id", "name", "x", "day", "amount", "at"])
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


FEATURES = pytest.mark.parametrize(
    "ddl",
    [
        "TBLPROPERTIES ('delta.enableRowTracking' = 'true')",
        "CLUSTER BY (id)",
    ],
    ids=["row-tracking", "liquid-clustering"],
)


@FEATURES
def test_the_delta_rs_engine_refuses_such_a_table_before_staging(spark, tmp_path, ddl):
    target = str(tmp_path / "made-by-spark")
    spark.sql(f"CREATE TABLE delta.`{target}` ({SCHEMA}) USING delta {ddl}")
    view(spark, range(0, 5)).write.format("delta").mode("append").save(target)
    assert wait_for_cleanup(timeout=None)
    files = store(target).files("")
    with pytest.raises(UnsupportedTableError, match="Unsupported table features required") as info:
        MVSink(target, "v", engine="delta-rs")(view(spark, range(0, 8)), 0)
    assert "nothing was staged" in str(info.value) and "engine='delta-spark'" in str(info.value)
    assert store(target).files("") == files  # the folder exactly as it was


def test_the_sessions_delta_is_refused_on_s3_without_a_log_store_that_commits_strictly(spark):
    """The JVM's default S3 log store lets two writers both 'win' a version: the engine is
    refused before anything is staged, for a table not made yet as for one that exists."""
    import uuid

    from tests.s3server import BUCKET

    target = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}/view"
    for epoch in range(2):  # no table yet; then a table delta-rs made
        with pytest.raises(UnsupportedTableError, match="S3DynamoDBLogStore") as info:
            MVSink(target, "v", engine="delta-spark")(view(spark, range(0, 8)), epoch)
        assert "nothing was staged" in str(info.value)
        if epoch == 0:
            assert store(target).files("") == []  # nothing written
            MVSink(target, "v")(view(spark, range(0, 4)), 0)
            files = sorted(store(target).files(""))
    assert sorted(store(target).files("")) == files


@FEATURES
def test_auto_keeps_such_a_table_through_the_sessions_delta(spark, tmp_path, ddl):
    """engine='auto' commits through the JVM Delta where delta-rs cannot: exact at every
    version, Delta's own DML between epochs repaired, an OPTIMIZE landing inside the commit
    window is a conflict and a re-plan, the history says what each commit did."""
    from mvsink import status
    from tests.helpers import once

    cols = ["id", "name", "x", "day", "amount", "at"]
    target = str(tmp_path / "made-by-spark")
    spark.sql(f"CREATE TABLE delta.`{target}` ({SCHEMA}) USING delta {ddl}")
    view(spark, range(0, 5), tag="spark").write.format("delta").mode("append").save(target)
    sink = MVSink(target, "v", max_rows_per_file=4, heartbeat=0, writer="blue", take_over="foreign")
    wanted = {}
    for epoch, (ids, tag) in enumerate([(range(0, 20), ""), (range(3, 25), "b"), (range(3, 25), "b")]):
        if epoch == 2:
            spark.sql(f"DELETE FROM delta.`{target}` WHERE id IN (4, 9)")
            spark.sql(f"UPDATE delta.`{target}` SET name = 'changed' WHERE id = 12")
        report = sink(view(spark, ids, tag), epoch)
        assert report.outcome == "committed"
        wanted[report.version] = multiset(to_arrow(view(spark, ids, tag)), cols)
        assert spark_rows(spark, target) == wanted[report.version]
    assert (report.retracted, report.inserted) == (1, 3)  # the repair of Delta's DML
    assert sink(view(spark, range(0, 3)), 2).outcome == "replay"  # the frontier, as a txn
    with failpoints.armed({"before_commit": once(lambda: spark.sql(f"OPTIMIZE delta.`{target}`").collect())}):
        report = sink(view(spark, range(6, 25), tag="b"), 3)
    assert report.outcome == "committed" and report.attempts == 2
    wanted[report.version] = multiset(to_arrow(view(spark, range(6, 25), tag="b")), cols)
    for version, want in wanted.items():
        assert spark_rows(spark, target, version) == want, f"version {version}"
    history = spark.sql(f"DESCRIBE HISTORY delta.`{target}`").orderBy("version").collect()
    assert history[-1]["operation"] == "STREAMING UPDATE"  # as Delta's own streaming sink
    assert report.retracted == 3 and report.inserted == 0
    assert history[-1]["userMetadata"].startswith("mvsink view v epoch 3: +0 -3 rows")
    shown = status(target, "v").views[0]
    assert shown.frontier == 4 and shown.last_commit is not None
    assert (shown.last_commit.epoch, shown.last_commit.writer) == (3, "blue")

    # A commit call that fails after landing is found in the log (by the attempt id in the
    # commit's tags) and taken as committed.
    def lost_reply() -> None:
        raise OSError("the commit was written but the reply was lost")

    with failpoints.armed({"after_commit_call": once(lost_reply)}, view="v"):
        report = sink(view(spark, range(6, 27), tag="b"), 4)
    assert report.outcome == "committed" and report.attempts == 1
    assert spark_rows(spark, target) == multiset(to_arrow(view(spark, range(6, 27), tag="b")), cols)
    # Staged files of the attempt that lost to OPTIMIZE are gone; every referenced file is there.
    assert wait_for_cleanup(timeout=None)
    referenced = {p for v in versions(target) for p in added(target, v)}
    assert data_files_on_disk(target) == referenced
    if "RowTracking" in ddl:
        # Rows in files the next epoch leaves alone keep their row ids; a rewritten file's
        # rows get new ones (remove + add). Compaction, which would renumber rows while
        # saying no data changed, is refused: Delta's OPTIMIZE keeps them.
        def row_ids() -> dict[Any, int]:
            table = to_arrow(spark.read.format("delta").load(target).select("id", "_metadata.row_id"))
            return dict(zip(table.column("id").to_pylist(), table.column("row_id").to_pylist(), strict=True))

        before = row_ids()
        assert len(set(before.values())) == len(before)
        report = sink(view(spark, range(7, 27), tag="b"), 5)  # retracts id 6 only
        after = row_ids()
        kept = [i for i in after if i in before and before[i] == after[i]]
        assert report.files_removed == 1 and len(kept) >= len(after) - 4 and len(kept) > 0
        from mvsink.ops.compact import compact

        with pytest.raises(ConfigError, match="Delta's OPTIMIZE"):
            compact(target, "v", max_rows_per_file=100)
    # A commit carrying app transactions only (a promotion) inside the commit window conflicts
    # too: the retry plans on it and finds the sink fenced.
    from mvsink import promote

    frontier = sink.frontier()
    with failpoints.armed({"before_commit": once(lambda: promote(target, "v", "green"))}, view="v"):
        assert sink(view(spark, range(9, 30), tag="b"), 6).outcome == "fenced"
    assert sink.frontier() == frontier


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
    from mvsink import promote
    from mvsink.ops.compact import compact

    done = compact(target, "revenue", max_rows_per_file=100)
    assert done.files_removed >= 2
    promote(target, "revenue", "green")
    history = spark.sql(f"DESCRIBE HISTORY delta.`{target}`").orderBy("version").collect()
    assert [row["userMetadata"] for row in history[-2:]] == [
        f"mvsink compact view revenue: files -{done.files_removed} +{done.files_added}, no row changed",
        "mvsink promote view revenue: writer green is active",
    ]


def test_a_catalog_table_is_addressed_by_name(spark, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spark.sql(f"CREATE TABLE default.revenue ({SCHEMA}) USING delta")
    try:
        desired = view(spark, range(0, 12))
        sink = MVSink("default.revenue", "revenue")
        assert sink(desired, 0).outcome == "committed"
        want = multiset(to_arrow(desired), ["id", "name", "x", "day", "amount", "at"])
        assert (
            multiset(to_arrow(spark.table("default.revenue")), ["id", "name", "x", "day", "amount", "at"])
            == want
        )
        again = view(spark, range(3, 14))
        assert MVSink("`spark_catalog`.`default`.`revenue`", "revenue")(again, 1).outcome == "committed"
        got = multiset(to_arrow(spark.table("default.revenue")), ["id", "name", "x", "day", "amount", "at"])
        assert got == multiset(to_arrow(again), ["id", "name", "x", "day", "amount", "at"])
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
        # Dropped after the sink looked it up (a managed table: its folder goes too): the next
        # epoch looks the name up again and says so rather than make a table outside the catalog.
        spark.sql("DROP TABLE default.revenue")
        with pytest.raises(ConfigError, match="catalog does not know"):
            sink(again, 2)
        assert not os.path.exists(sink.target)
        spark.range(3).write.format("parquet").saveAsTable("default.plain")
        with pytest.raises(ConfigError, match="not a Delta table"):
            MVSink("default.plain", "v")(desired, 0)
    finally:
        spark.sql("DROP TABLE IF EXISTS default.revenue")
        spark.sql("DROP TABLE IF EXISTS default.plain")
        spark.sql("DROP TABLE IF EXISTS default.odd")


def test_deltas_optimize_inside_an_epochs_commit_window_leaves_every_version_exact(spark, tmp_path):
    """Delta's OPTIMIZE landing between an epoch's snapshot and its commit makes the commit
    conflict and re-plan (never turn a retraction into a no-op)."""
    from tests.helpers import once

    target = str(tmp_path / "view")
    sink = MVSink(target, "v", max_rows_per_file=4, heartbeat=0)
    sink(view(spark, range(0, 30)), 0)
    with failpoints.armed({"before_commit": once(lambda: spark.sql(f"OPTIMIZE delta.`{target}`").collect())}):
        report = sink(view(spark, range(2, 30), tag="b"), 1)
    assert report.outcome == "committed" and report.attempts == 2
    sink(view(spark, range(4, 33), tag="c"), 2)
    for version in versions(target):
        want = multiset(target_table(target, version), ["id", "name", "x", "day", "amount", "at"])
        assert spark_rows(spark, target, version) == want, f"version {version}"
    assert spark_rows(spark, target) == multiset(
        to_arrow(view(spark, range(4, 33), tag="c")), ["id", "name", "x", "day", "amount", "at"]
    )


def test_deltas_vacuum_with_no_retention_inside_the_commit_window(spark, tmp_path):
    """VACUUM RETAIN 0 HOURS deletes every file the latest version does not reference: inside
    an epoch's commit window, the staged files and the files earlier epochs removed. The epoch
    commits nothing (an InvariantViolation), the view stays exact, and its retry commits."""
    from mvsink import InvariantViolation
    from tests.helpers import live_files, once

    cols = ["id", "name", "x", "day", "amount", "at"]
    target = str(tmp_path / "view")
    check = "spark.databricks.delta.retentionDurationCheck.enabled"
    spark.conf.set(check, "false")
    try:
        sink = MVSink(target, "v", max_rows_per_file=4, heartbeat=0)
        sink(view(spark, range(0, 30)), 0)
        sink(view(spark, range(2, 30), tag="b"), 1)  # removes files: garbage for the vacuum
        data = lambda: {p for p in store(target).files("") if not p.startswith("_")}  # noqa: E731
        before = data()
        frontier = sink.frontier()
        vacuum = once(lambda: spark.sql(f"VACUUM delta.`{target}` RETAIN 0 HOURS").collect())
        armed = failpoints.armed({"before_commit": vacuum})
        with armed, pytest.raises(InvariantViolation, match="staged file"):
            sink(view(spark, range(5, 31), tag="d"), 2)
        assert sink.frontier() == frontier  # nothing committed (the versions after are VACUUM's own)
        assert spark_rows(spark, target) == multiset(to_arrow(view(spark, range(2, 30), tag="b")), cols)
        assert data() < before  # it did delete the files version 1 removed
        assert sink(view(spark, range(5, 31), tag="d"), 2).outcome == "committed"
        assert spark_rows(spark, target) == multiset(to_arrow(view(spark, range(5, 31), tag="d")), cols)
        assert all(os.path.exists(os.path.join(target, p)) for p in live_files(target))
    finally:
        spark.conf.unset(check)


def duckdb_rows(target: str, version: int, cols: list[str]) -> Counter[Any]:
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
    return multiset(table, cols)


def test_duckdbs_delta_reader_agrees_with_sparks_at_every_version(spark, tmp_path):
    target = str(tmp_path / "view")
    cols = wide_view(spark, target)
    for version in versions(target):
        got = duckdb_rows(target, version, cols)
        assert got == spark_rows(spark, target, version, cols), f"version {version}"
    assert sum(duckdb_rows(target, versions(target)[-1], cols).values()) == 12


def test_the_operations_take_a_catalog_tables_name(spark, tmp_path, monkeypatch, capsys):
    """status, verify, frontier, promote, compact and vacuum, from Python and from the CLI
    (with a job file whose target is a name), resolve the name through the session's catalog."""
    import json

    from mvsink import frontier, promote, status, vacuum, verify
    from mvsink.cli.main import main

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
        rows = multiset(to_arrow(spark.table("default.rev")), ["id", "name", "x", "day", "amount", "at"])
        assert rows == spark_rows(spark, location) and sum(rows.values()) == 10
        assert os.listdir(tmp_path) == ["job.toml"]  # nothing made from the name
    finally:
        spark.sql("DROP TABLE IF EXISTS default.rev")


def drain(stream: DataFrame, checkpoint: str) -> pa.Table:
    """Every row a streaming reader yields until it has read all there is (availableNow)."""
    batches: list[pa.Table] = []
    query = (
        stream.writeStream.foreachBatch(lambda df, _: batches.append(to_arrow(df)))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return pa.concat_tables(batches) if batches else pa.table({})


STREAM_COLS = ["id", "name", "x", "day", "amount", "at"]


def corrected_view(spark: SparkSession, target: str, before_correction: Any = None) -> DataFrame:
    """Keep a view through five versions: two epochs, the second inserts only (0, 1), a
    compaction (2), a correction retracting 0..2 and inserting 100 and 101 (3), and a pure
    append (4); ``before_correction`` runs before version 3. Returns the final view."""
    from mvsink.ops.compact import compact

    sink = MVSink(target, "v", max_rows_per_file=5, heartbeat=0)
    sink(view(spark, range(0, 10)), 0)
    sink(view(spark, range(0, 15)), 1)  # inserts only: a pure append
    assert compact(target, "v", max_rows_per_file=50).version == 2  # dataChange = false
    if before_correction is not None:
        before_correction()
    corrected = view(spark, range(3, 15)).unionByName(view(spark, range(100, 102), tag="new"))
    sink(corrected, 3)  # retracts 0..2, inserts 100 and 101: a correction
    final = corrected.unionByName(view(spark, range(15, 18)))
    sink(final, 4)  # a pure append again
    assert versions(target) == [0, 1, 2, 3, 4]
    return final


def test_deltas_own_streaming_source_follows_a_view_only_up_to_its_first_correction(spark, tmp_path):
    """What docs/readers.md says. Delta's own streaming source follows insert-only epochs and
    compactions, and stops at the first correction; a new query reads the current version
    whole; skipChangeCommits runs on but drops every correction (its retractions and the rows
    inserted beside them); ignoreChanges re-emits rewritten files whole."""
    target = str(tmp_path / "view")
    rows = lambda df: multiset(to_arrow(df), STREAM_COLS)  # noqa: E731
    plain = lambda: spark.readStream.format("delta").option("startingVersion", "0").load(target)  # noqa: E731

    def follow() -> None:
        got = multiset(drain(plain(), str(tmp_path / "plain")), STREAM_COLS)
        assert got == rows(view(spark, range(0, 15)))

    final = corrected_view(spark, target, before_correction=follow)
    with pytest.raises(Exception, match="DELTA_SOURCE_TABLE_IGNORE_CHANGES"):
        drain(plain(), str(tmp_path / "plain"))  # the same query, going on from version 3

    fresh = drain(spark.readStream.format("delta").load(target), str(tmp_path / "fresh"))
    assert multiset(fresh, STREAM_COLS) == rows(final)  # the current version, whole

    def from_zero(option: str) -> Counter[Any]:
        stream = spark.readStream.format("delta").option("startingVersion", "0").option(option, "true")
        return multiset(drain(stream.load(target), str(tmp_path / option)), STREAM_COLS)

    got = from_zero("skipChangeCommits")
    assert got == rows(view(spark, range(0, 18)))  # versions 0, 1 and 4 only
    assert got != rows(final)  # 0..2 never retracted, 100 and 101 never seen

    again = from_zero("ignoreChanges")
    assert max(again.values()) > 1 and sum(again.values()) > sum(rows(final).values()) + 3  # duplicates


@pytest.mark.spark4("mvsink-delta is a Python data source")
def test_the_mvsink_delta_change_feed_sums_to_the_view_at_every_version(spark, tmp_path):
    """Where Delta's own source stops or drifts (the test above), mvsink-delta's change feed of
    the same view sums to the view at every version."""
    from mvsink.sources.reader import register

    target = str(tmp_path / "view")
    corrected_view(spark, target)
    register(spark)
    feed = drain(
        spark.readStream.format("mvsink-delta").option("path", target).option("mode", "changes").load(),
        str(tmp_path / "changes"),
    )
    assert set(feed.column("_commit_version").to_pylist()) == {0, 1, 3, 4}  # the compaction: nothing
    total: Counter[Any] = Counter()
    for version in range(5):
        part = feed.filter(pc.equal(feed.column("_commit_version"), version))
        for key, n in multiset(part, [*STREAM_COLS, "diff"]).items():
            total[key[:-1]] += key[-1] * n
        assert +total == multiset(target_table(target, version), STREAM_COLS), f"version {version}"
        assert all(n >= 0 for n in total.values())


@pytest.mark.soak  # CLI processes starting Spark with a metastore: about a minute
def test_the_cli_looks_a_name_up_in_the_metastore_its_conf_names(spark, tmp_path):
    """A CLI process starts its own Spark session (job file's [spark], then --conf) and finds a
    table another process created in a shared (Derby) metastore."""
    import json
    import subprocess
    import sys

    from tests.delta_session import delta_conf

    conf = {
        **delta_conf(tmp_path / "warehouse"),
        "spark.sql.catalogImplementation": "hive",
        "spark.hadoop.javax.jdo.option.ConnectionURL": (
            f"jdbc:derby:;databaseName={tmp_path}/metastore;create=true"
        ),
    }
    maker = (
        "import sys, json\n"
        "from mvsink.cli.session import local_session\n"
        "from mvsink import MVSink\n"
        "spark = local_session('maker', conf=json.loads(sys.argv[1]))\n"
        f"spark.sql('CREATE TABLE default.shared ({SCHEMA}) USING delta')\n"
        f"MVSink('default.shared', 'shared')(spark.sql({view_sql(range(0, 7))!r}), 0)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    made = run("-c", maker, json.dumps(conf))
    assert made.returncode == 0, made.stderr[-3000:]
    job = tmp_path / "job.toml"
    spark_table = "\n".join(
        f"{json.dumps(k)} = {json.dumps(v)}" for k, v in conf.items() if k != "spark.jars"
    )
    job.write_text(
        '[job]\nquery = "mvsink.demo:revenue_query"\n\n'
        '[sink]\ntarget = "default.shared"\nname = "shared"\n'
        f"\n[spark]\n{spark_table}\n"
    )
    shown = run(
        "-m",
        "mvsink.cli",
        "status",
        "--job",
        str(job),
        "--json",
        "--conf",
        f"spark.jars={conf['spark.jars']}",
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    status = json.loads(shown.stdout)
    location = str(tmp_path / "warehouse" / "shared")
    assert status["target"] == location and status["views"][0]["frontier"] == 1
    assert f"table default.shared is at {location}" in shown.stderr
    # A session without the metastore's settings (this one) does not know the name.
    from mvsink.cli.main import main

    assert main(["frontier", "default.shared", "shared"]) == 2


def test_the_operations_work_on_a_table_only_the_sessions_delta_writes(spark, tmp_path):
    """status, compact, promote, vacuum and frontier on a liquid-clustered table: from Python
    through the active session, and from a CLI process that starts Spark with Delta from its
    --conf (and says what it lacks without)."""
    import subprocess
    import sys

    from mvsink import frontier, promote, status, vacuum
    from mvsink.ops.compact import compact
    from tests.delta_session import delta_conf

    cols = ["id", "name", "x", "day", "amount", "at"]
    target = str(tmp_path / "clustered")
    spark.sql(f"CREATE TABLE delta.`{target}` ({SCHEMA}) USING delta CLUSTER BY (id)")
    sink = MVSink(target, "v", max_rows_per_file=3, heartbeat=0)
    for epoch in range(3):
        sink(view(spark, range(epoch, 12 + epoch)), epoch)
    assert status(target, "v").views[0].frontier == 3
    done = compact(target, "v", max_rows_per_file=40)
    assert done.version is not None and done.files_removed > 1
    assert promote(target, "v", "green") == done.version + 1
    assert spark_rows(spark, target) == multiset(to_arrow(view(spark, range(2, 14))), cols)
    no_retention = "('delta.deletedFileRetentionDuration' = 'interval 0 hours')"
    spark.sql(f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES {no_retention}")
    dry = vacuum(target)
    assert dry.data_files and all(not os.path.isabs(p) for p in dry.data_files)
    assert not set(dry.data_files) & live_files(target)  # only files the table no longer holds
    applied = vacuum(target, apply=True)
    assert applied.applied and not any(os.path.exists(os.path.join(target, p)) for p in dry.data_files)
    assert spark_rows(spark, target) == multiset(to_arrow(view(spark, range(2, 14))), cols)
    assert frontier(target, "v") == 3

    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    cli = [sys.executable, "-m", "mvsink.cli"]
    conf = [f"--conf={k}={v}" for k, v in delta_conf(tmp_path / "warehouse").items()]
    bare = subprocess.run(
        [*cli, "compact", target, "--name", "v"], capture_output=True, text=True, env=env, timeout=300
    )
    assert bare.returncode == 2 and "needs Delta in the Spark session" in bare.stderr, bare.stderr[-2000:]
    green = MVSink(target, "v", max_rows_per_file=3, heartbeat=0, writer="green")  # the promoted one
    assert green(view(spark, range(3, 15)), 3).outcome == "committed"  # small files again
    ran = subprocess.run(
        [*cli, "compact", target, "--name", "v", *conf], capture_output=True, text=True, env=env, timeout=300
    )
    assert ran.returncode == 0 and "compacted" in ran.stdout, (ran.returncode, ran.stdout, ran.stderr[-3000:])
    history = spark.sql(f"DESCRIBE HISTORY delta.`{target}`").orderBy("version").collect()
    assert history[-1]["userMetadata"].startswith("mvsink compact view v")
    assert spark_rows(spark, target) == multiset(to_arrow(view(spark, range(3, 15))), cols)


@pytest.mark.parametrize("placement", ["driver", "distributed"])
def test_change_data_feed_holds_exactly_what_each_commit_retracts_and_inserts(
    spark, tmp_path, placement, monkeypatch
):
    """On a table with Change Data Feed, every version's feed is exactly the rows it retracted
    and inserted (the difference between it and the version before), never the untouched rows
    of a rewritten file, even where writing desired whole would move fewer bytes; a streaming
    CDF reader through five corrections, Delta's own DELETE and an OPTIMIZE rebuilds the view
    exactly."""
    import mvsink.plan.complete

    monkeypatch.setattr(mvsink.plan.complete, "WHOLE_MIN_BYTES", 0)  # these scattered changes would
    cols = ["id", "name", "day"]
    target = str(tmp_path / "cdf")
    spark.sql(
        f"CREATE TABLE delta.`{target}` (id long, name string, day date) USING delta PARTITIONED BY (day) "
        "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')"
    )
    sink = MVSink(target, "v", partition_by=["day"], max_rows_per_file=6, heartbeat=0, placement=placement)

    def desired(ids: range, changed: int, tag: str) -> DataFrame:
        return spark.sql(
            f"SELECT id, CASE WHEN id % {changed} = 0 THEN concat('n', id, '{tag}') ELSE concat('n', id) END "
            "AS name, date_add(DATE'2026-01-01', CAST(id % 2 AS INT)) AS day "
            f"FROM range({ids.start}, {ids.stop})"
        )

    views = [
        desired(range(0, 40), 1, ""),
        desired(range(4, 44), 7, "a"),  # rows changed in place, some retracted, some new
        desired(range(4, 44), 5, "b"),
        desired(range(4, 30), 5, "b"),  # a tail retracted: whole files go
        desired(range(4, 30), 3, "c"),
    ]
    for epoch, df in enumerate(views):
        if epoch == 2:
            spark.sql(f"DELETE FROM delta.`{target}` WHERE id IN (10, 11)")  # its own change files
        if epoch == 4:
            spark.sql(f"OPTIMIZE delta.`{target}`").collect()  # dataChange = false: no feed
        report = sink(df, epoch)
        assert report.outcome == "committed"
        assert spark_rows(spark, target, cols=cols) == multiset(to_arrow(df), cols)
    feed = feed_by_version(spark, target, cols)
    latest = max(versions(target))
    checked = 0
    held = {version: spark_rows(spark, target, version, cols) for version in range(latest + 1)}
    for version in range(1, latest + 1):
        before, after = held[version - 1], held[version]
        changes = feed.get(version, {"delete": Counter(), "insert": Counter()})
        assert changes["delete"] == before - after, f"version {version}"
        assert changes["insert"] == after - before, f"version {version}"
        assert not changes["delete"] & changes["insert"], f"version {version} retracts and re-inserts"
        checked += bool(changes["delete"])
    assert checked >= 4  # the corrections and the repair of Delta's DELETE
    # The commits that rewrote files carried change files, and each holds few rows.
    log = os.path.join(target, "_delta_log")
    cdc = [
        json.loads(line)["cdc"]
        for name in sorted(os.listdir(log))
        if name.endswith(".json")
        for line in Path(log, name).read_text().splitlines()
        if line.startswith('{"cdc"')
    ]
    assert any(c["path"].startswith("mvsink-v-") for c in cdc)

    stream = spark.readStream.format("delta").option("readChangeFeed", "true").option("startingVersion", 0)
    rows = drain(stream.load(target), str(tmp_path / "cdf-reader"))
    rebuilt: Counter[Any] = Counter()
    for version in sorted(set(rows.column("_commit_version").to_pylist())):
        part = rows.filter(pc.equal(rows.column("_commit_version"), version))
        kinds = {
            k: multiset(part.filter(pc.equal(part.column("_change_type"), k)), cols)
            for k in ("delete", "insert")
        }
        assert not kinds["delete"] - rebuilt, f"version {version} retracts a row the view did not hold"
        rebuilt = rebuilt - kinds["delete"] + kinds["insert"]
    assert rebuilt == multiset(to_arrow(views[-1]), cols)


def deletion_vectors_in_log(target: str) -> list[dict[str, Any]]:
    """Every add action in the log that carries a deletion vector."""
    log = Path(target, "_delta_log")
    return [
        json.loads(line)["add"]
        for name in sorted(p.name for p in log.glob("*.json"))
        for line in (log / name).read_text().splitlines()
        if line.startswith('{"add"') and '"deletionVector"' in line
    ]


def live_vectors(target: str) -> list[dict[str, Any]]:
    """The deletion vectors of the table's current files (through delta-rs's log replay)."""
    from deltalake import DeltaTable

    live = {p for p in pa.table(DeltaTable(target).get_add_actions()).column("path").to_pylist()}
    latest: dict[str, dict[str, Any]] = {}
    log = Path(target, "_delta_log")
    for name in sorted(p.name for p in log.glob("*.json")):
        for line in (log / name).read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                latest[action["add"]["path"]] = action["add"]
    return [latest[p]["deletionVector"] for p in live if latest[p].get("deletionVector")]


def dv_file(descriptor: dict[str, Any]) -> str:
    from mvsink.table.deletion_vectors import file_path

    return file_path(descriptor)


@pytest.mark.both_placements  # the distributed placement's tasks read and write the vectors
@pytest.mark.parametrize(
    ("placement", "extra"),
    [
        ("driver", "'delta.enableRowTracking' = 'true'"),
        ("distributed", "'delta.enableChangeDataFeed' = 'true'"),
    ],
    ids=["driver-row-tracking", "distributed-change-feed"],
)
def test_retractions_on_a_deletion_vector_table_are_deletion_vectors(spark, tmp_path, placement, extra):
    """On a table with deletion vectors on (as Databricks makes new tables), an epoch marks the
    rows it retracts in new deletion vectors of their files, which keep their bytes (and, with
    row tracking, their rows' ids); vectors Delta's own DELETE wrote are read, merged and
    repaired; a file whose every row goes is removed; Spark reads every version exactly, the
    index follows the vectors (a steady epoch reads nothing), and with Change Data Feed each
    version's feed is exactly its changes."""
    from mvsink import verify

    cols = ["id", "name"]
    target = str(tmp_path / "dv")
    spark.sql(
        f"CREATE TABLE delta.`{target}` (id long, name string) USING delta "
        f"TBLPROPERTIES ('delta.enableDeletionVectors' = 'true', {extra})"
    )
    sink = MVSink(target, "v", max_rows_per_file=20, heartbeat=0, placement=placement)

    def desired(ids: range, every: int, tag: str) -> DataFrame:
        return spark.sql(
            f"SELECT id, CASE WHEN id % {every} = 0 THEN concat('n', id, '{tag}') ELSE concat('n', id) END "
            f"AS name FROM range({ids.start}, {ids.stop})"
        )

    def row_ids() -> dict[Any, int]:
        table = to_arrow(spark.read.format("delta").load(target).select("id", "_metadata.row_id"))
        return dict(zip(table.column("id").to_pylist(), table.column("row_id").to_pylist(), strict=True))

    wanted = {}
    report = sink(desired(range(0, 100), 1000, ""), 0)
    wanted[report.version] = multiset(to_arrow(desired(range(0, 100), 1000, "")), cols)
    data_files = {
        str(p.relative_to(target)) for p in Path(target).rglob("*.parquet") if "_mvsink" not in str(p)
    }
    ids_before = row_ids() if "RowTracking" in extra else {}
    table_bytes = sum(Path(target, name).stat().st_size for name in data_files)
    for epoch, df in enumerate(
        [
            desired(range(0, 100), 13, "a"),  # 8 rows changed, scattered over the files
            desired(range(0, 100), 13, "a"),  # Delta's DELETE first: its vectors repaired
            desired(range(0, 100), 11, "b"),  # more rows of files that already have vectors
            desired(range(0, 60), 11, "b"),  # the last two files go whole
        ],
        start=1,
    ):
        if epoch == 2:
            spark.sql(f"DELETE FROM delta.`{target}` WHERE id IN (30, 31, 57)")
        report = sink(df, epoch)
        assert report.outcome == "committed", epoch
        wanted[report.version] = multiset(to_arrow(df), cols)  # each read in Spark below
        if epoch == 1:
            # No data file was rewritten: each touched file got a vector, and the changed rows
            # went into new files of their own.
            assert report.retracted == 8 and report.inserted == 8
            vectors = deletion_vectors_in_log(target)
            assert len(vectors) == report.files_removed and report.files_added > report.files_removed
            assert {unquote(v["path"]) for v in vectors} <= data_files
            written = {str(p.relative_to(target)) for p in Path(target).rglob("*.parquet")} - data_files
            new_data = [p for p in written if "_change_data" not in p and "_mvsink" not in p]
            assert sum(Path(target, p).stat().st_size for p in new_data) < table_bytes / 2
            if ids_before:
                after = row_ids()
                untouched = [i for i in after if i in ids_before and i % 13]
                assert all(after[i] == ids_before[i] for i in untouched)
        if epoch == 2:
            assert (report.retracted, report.inserted) == (0, 3)
    for version, want in wanted.items():
        assert spark_rows(spark, target, version, cols) == want, f"version {version}"
    steady = sink(desired(range(0, 60), 11, "b"), 5)
    assert (steady.inserted, steady.retracted, steady.files_added) == (0, 0, 0), str(steady)
    assert steady.files_read == 0  # the index knew every file, vectors and all
    assert verify(desired(range(0, 60), 11, "b"), target, name="v").equal
    final = multiset(to_arrow(desired(range(0, 60), 11, "b")), cols)
    if "RowTracking" in extra:
        # mvsink's vacuum (Delta's VACUUM here) with no retention keeps the vectors the version
        # references, staged under the attempts' folders, and deletes the rest.
        from mvsink import vacuum

        retention = "'delta.deletedFileRetentionDuration' = 'interval 0 hours'"
        spark.sql(f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES ({retention})")
        vacuum(target, apply=True)
        referenced = {dv_file(v) for v in live_vectors(target)}
        assert referenced and referenced == {str(p.relative_to(target)) for p in Path(target).rglob("*.bin")}
        assert spark_rows(spark, target, cols=cols) == final
    else:
        from mvsink.ops.compact import compact

        assert compact(target, "v", max_rows_per_file=1000).version is not None  # reads past vectors
        assert spark_rows(spark, target, cols=cols) == final and not live_vectors(target)
    if "ChangeDataFeed" in extra:
        feed = feed_by_version(spark, target, cols)
        latest = max(versions(target))
        held = {version: spark_rows(spark, target, version, cols) for version in range(latest + 1)}
        for version in range(1, latest + 1):
            changes = feed.get(version, {"delete": Counter(), "insert": Counter()})
            assert changes["delete"] == held[version - 1] - held[version], f"version {version}"
            assert changes["insert"] == held[version] - held[version - 1], f"version {version}"


def test_the_adds_read_from_the_log_are_the_jvms_at_every_version_of_deltas_own_dml(spark, tmp_path):
    """Delta's own DELETE (vectors), UPDATE, MERGE, OPTIMIZE and a purge on a table with
    deletion vectors and row tracking: at every version, the add actions mvsink reads from the
    log's commit files (from version 0, and carried from each earlier version) are those of the
    JVM's snapshot, vectors and row ids included."""
    from mvsink.table.jvm_delta import JvmDelta
    from mvsink.table.log import Adds

    target = str(tmp_path / "dml")
    spark.sql(
        f"CREATE TABLE delta.`{target}` (id long, name string) USING delta TBLPROPERTIES "
        "('delta.enableDeletionVectors' = 'true', 'delta.enableRowTracking' = 'true')"
    )
    spark.sql("SELECT id, concat('n', id) AS name FROM range(0, 60)").repartition(4).write.format(
        "delta"
    ).mode("append").save(target)
    for statement in (
        "DELETE FROM delta.`{t}` WHERE id % 7 = 0",
        "UPDATE delta.`{t}` SET name = 'u' WHERE id % 5 = 0",
        "DELETE FROM delta.`{t}` WHERE id % 7 = 1",
        "MERGE INTO delta.`{t}` t USING (SELECT id, 'm' AS name FROM range(50, 70)) s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
        "OPTIMIZE delta.`{t}`",
        "DELETE FROM delta.`{t}` WHERE id % 11 = 0",
        "REORG TABLE delta.`{t}` APPLY (PURGE)",
    ):
        spark.sql(statement.format(t=target))
    jvm, log = JvmDelta(spark), store(target)
    newest = max(versions(target))

    def kept(adds: Any) -> dict[str, Any]:
        # (The JVM's snapshot marks every file's dataChange false; commits say it anew.)
        return {p: {k: v for k, v in a.items() if k != "dataChange"} for p, a in adds.items()}

    carried, vectors = Adds.empty(), 0
    for version in range(newest + 1):
        want = kept(jvm._snapshot_adds(target, version))
        vectors += sum(1 for a in want.values() if a.get("deletionVector"))
        fresh = Adds.empty().at(log, version)
        carried = carried.at(log, version)  # type: ignore[assignment]
        assert fresh is not None and kept(fresh.by_path) == want, f"version {version}"
        assert carried is not None and kept(carried.by_path) == want, f"version {version}"
    assert vectors  # (the DML made some)


def test_a_view_on_a_vector_table_stays_exact_when_log_cleanup_took_the_commits_since_its_last_epoch(
    spark, tmp_path
):
    """The adds an epoch read are carried to the next epoch's version through the commit files
    in between; when log cleanup took one (a checkpoint holds the version), the next epoch
    reads the version's state whole instead, Delta's own DELETE's vectors included."""
    target = str(tmp_path / "cleaned")
    spark.sql(
        f"CREATE TABLE delta.`{target}` (id long, name string) USING delta TBLPROPERTIES "
        "('delta.enableDeletionVectors' = 'true', 'delta.checkpointInterval' = '1')"
    )
    sink = MVSink(target, "v", max_rows_per_file=10, heartbeat=0, engine="delta-spark")
    view_of = "SELECT id, concat('n', id, '{tag}') AS name FROM range(0, 50)"
    sink(spark.sql(view_of.format(tag="")), 0)
    sink(spark.sql(view_of.format(tag="")), 1)
    spark.sql(f"DELETE FROM delta.`{target}` WHERE id % 3 = 0")  # vectors the next epoch repairs
    spark.sql(f"UPDATE delta.`{target}` SET name = 'u' WHERE id = 1")
    newest = max(versions(target))
    for version in range(newest):  # the DELETE's commit among them
        os.remove(os.path.join(target, "_delta_log", f"{version:020d}.json"))
    report = sink(spark.sql(view_of.format(tag="")), 2)
    assert report.outcome == "committed" and report.inserted == 18 and report.retracted == 1
    want = multiset(to_arrow(spark.sql(view_of.format(tag=""))), ["id", "name"])
    assert spark_rows(spark, target, cols=["id", "name"]) == want


def test_a_streaming_querys_epochs_carry_the_adds_read_and_check_the_jvm_once(spark, tmp_path):
    """Under ``foreachBatch`` each batch has a session object of its own: what the engine
    checked of the JVM is kept by its SparkContext (one entry), and each epoch's adds are
    carried from the last epoch's (kept for the table, at the version its last epoch read)."""
    from mvsink.table import jvm_delta

    target = str(tmp_path / "streamed")
    spark.sql(
        f"CREATE TABLE delta.`{target}` (id long, name string) USING delta "
        "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    source = tmp_path / "in"
    spark.range(0, 40).selectExpr("id", "concat('n', id) AS name").write.parquet(str(source / "0"))
    sink = MVSink(target, "s", mode="append", max_rows_per_file=10, heartbeat=0, engine="delta-spark")
    seen: list[int] = []

    def each(batch: DataFrame, epoch: int) -> None:
        seen.append(epoch)
        sink(batch, epoch)

    jvm_delta.JvmDelta(spark)  # the JVM checked
    checked = len(jvm_delta._JVMS)

    for part in range(3):
        if part:
            rows = spark.range(part * 5, part * 5 + 3).selectExpr("id", f"concat('m{part}', id) AS name")
            rows.write.parquet(str(source / str(part)))
        query = (
            spark.readStream.schema("id long, name string")
            .parquet(str(source / "*"))
            .writeStream.foreachBatch(each)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    assert len(seen) == 3
    assert spark.sparkContext in jvm_delta._JVMS and len(jvm_delta._JVMS) == checked
    kept = jvm_delta._TABLES[(target, DeltaTable(target).metadata().id)]
    assert kept.version == max(versions(target)) - 1  # the version the last epoch read
    assert not kept.vectors() or kept.checksum_problem(store(target)) is None


@pytest.mark.both_placements  # the distributed decision's tasks read the stored rows past vectors
@pytest.mark.parametrize("placement", ["driver", "distributed"])
def test_an_upsert_view_on_a_deletion_vector_table_updates_and_deletes_through_vectors(
    spark, tmp_path, placement
):
    """Upsert mode on a table with deletion vectors: an update or a delete marks the old row in
    a vector of its file (no file rewritten), Delta's own UPDATE between batches is kept as
    the table's state, and Spark reads the view exactly."""
    target = str(tmp_path / "dv-upsert")
    spark.sql(
        f"CREATE TABLE delta.`{target}` (id long, name string) USING delta "
        "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    sink = MVSink(
        target,
        "u",
        mode="upsert",
        key=["id"],
        delete_column="gone",
        max_rows_per_file=25,
        placement=placement,
    )
    batch = "SELECT id, concat('n', id, '{tag}') AS name, {gone} AS gone FROM range({lo}, {hi})"
    sink(spark.sql(batch.format(tag="", gone="false", lo=0, hi=100)), 0)
    files = {unquote(p) for p in live_files(target)}
    report = sink(spark.sql(batch.format(tag="x", gone="id % 10 = 0", lo=20, hi=40)), 1)
    assert report.retracted == 20 and files <= live_files(target)  # no file left the table
    spark.sql(f"UPDATE delta.`{target}` SET name = 'spark' WHERE id = 50")
    sink(spark.sql(batch.format(tag="y", gone="false", lo=95, hi=105)), 2)
    want = {i: f"n{i}" for i in range(0, 100)}
    want.update({i: f"n{i}x" for i in range(20, 40) if i % 10})
    for i in (20, 30):
        del want[i]
    want[50] = "spark"
    want.update({i: f"n{i}y" for i in range(95, 105)})
    got = to_arrow(spark.read.format("delta").load(target).select("id", "name")).to_pylist()
    assert sorted((r["id"], r["name"]) for r in got) == sorted(want.items())
    vectors = {unquote(v["path"]) for v in deletion_vectors_in_log(target)}
    assert vectors and vectors <= files  # the batches' files kept their bytes


@pytest.mark.parametrize(
    "properties",
    [
        "'delta.columnMapping.mode' = 'name', 'delta.enableDeletionVectors' = 'true'",
        "'delta.columnMapping.mode' = 'id'",
    ],
    ids=["name-mode-with-vectors", "id-mode"],
)
def test_a_column_mapped_table_is_written_by_its_physical_names(spark, tmp_path, properties):
    """On a table with column mapping (and a column renamed since, so logical and physical names
    differ, nested ones too), mvsink reads Spark's files by their physical names and writes its
    own so: Spark reads every version exactly, never a column of nulls."""
    target = str(tmp_path / "mapped")
    spark.sql(
        f"CREATE TABLE delta.`{target}` (id long, name string, st struct<a: int, b: string>, day date) "
        f"USING delta PARTITIONED BY (day) TBLPROPERTIES ({properties})"
    )

    def desired(ids: range, tag: str) -> DataFrame:
        return spark.sql(
            f"SELECT id, concat('n', id, '{tag}') AS label, named_struct('a', CAST(id AS INT), "
            f"'c', concat('s', id, '{tag}')) AS st, date_add(DATE'2026-01-01', CAST(id % 2 AS INT)) AS day "
            f"FROM range({ids.start}, {ids.stop})"
        )

    spark.sql(
        f"INSERT INTO delta.`{target}` SELECT id, concat('n', id), named_struct('a', CAST(id AS INT), "
        "'b', concat('s', id)), date_add(DATE'2026-01-01', CAST(id % 2 AS INT)) FROM range(0, 30)"
    )
    spark.sql(f"ALTER TABLE delta.`{target}` RENAME COLUMN name TO label")
    spark.sql(f"ALTER TABLE delta.`{target}` RENAME COLUMN st.b TO c")
    cols = ["id", "label", "st", "day"]
    assert spark_rows(spark, target, cols=cols) == multiset(to_arrow(desired(range(0, 30), "")), cols)
    sink = MVSink(target, "v", partition_by=["day"], max_rows_per_file=8, heartbeat=0, take_over="foreign")
    wanted = {}
    for epoch, (ids, tag) in enumerate([(range(0, 30), ""), (range(5, 40), "x")]):
        report = sink(desired(ids, tag), epoch)
        assert report.outcome == "committed"
        if epoch == 0:  # Spark's files read back by their physical names: nothing to change
            assert (report.inserted, report.retracted) == (0, 0)
        wanted[report.version] = multiset(to_arrow(desired(ids, tag)), cols)
        assert spark_rows(spark, target, cols=cols) == wanted[report.version], f"epoch {epoch}"
    for version, want in wanted.items():
        assert spark_rows(spark, target, version, cols) == want, f"version {version}"
    nulls = spark.read.format("delta").load(target).where("label IS NULL OR st.c IS NULL").count()
    assert nulls == 0
    # The log keys statistics by physical names; pruning asks by the table's (an upsert would
    # skip the file holding a key if it read another column's bounds, or none).
    from mvsink.errors import Where
    from mvsink.table.delta import load_snapshot
    from mvsink.table.schema import arrow_schema, target_struct

    snap = load_snapshot(target, "mvsink:v", {}, Where(), writing=False, spark=spark)
    bounds = snap.bounds("id")
    assert bounds is not None and snap.schema_json is not None
    id_field = arrow_schema(target_struct(snap.schema_json)).field("id")  # with its physical name
    for file, lo, hi in zip(snap.files, *bounds, strict=True):
        ids = store(target).read(file, pa.schema([id_field]), ()).column("id").to_pylist()
        assert lo.as_py() <= min(ids) and max(ids) <= hi.as_py(), file.path


def test_a_uniform_table_is_refused_before_staging(spark, tmp_path):
    """Iceberg compatibility (UniForm) wants partition values and nested field ids in every
    data file, which mvsink does not write: refused, the folder as it was."""
    target = str(tmp_path / "uniform")
    spark.sql(
        f"CREATE TABLE delta.`{target}` (id long, name string) USING delta "
        "TBLPROPERTIES ('delta.columnMapping.mode' = 'name', 'delta.enableIcebergCompatV2' = 'true')"
    )
    files = store(target).files("")
    with pytest.raises(UnsupportedTableError, match="UniForm"):
        MVSink(target, "v")(spark.sql("SELECT id, 'x' AS name FROM range(3)"), 0)
    assert store(target).files("") == files


def test_a_vector_keeps_the_files_exact_bounds_and_a_vacuumed_vector_is_never_committed(spark, tmp_path):
    """A file added again with a deletion vector keeps its statistics' bounds byte for byte
    (a 38-digit decimal bound read as a float would exclude the row that has it, and readers
    would skip the file); and a vector a VACUUM deleted between staging and commit stops the
    commit (nothing lands), the next epoch commits it again."""
    target = str(tmp_path / "dv-bounds")
    spark.sql(
        f"CREATE TABLE delta.`{target}` (id long, d decimal(38,18)) USING delta "
        "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    extreme = "99999999999999999999.999999999999999999"
    rows = f"SELECT id, IF(id = 0, {extreme}BD, CAST(id AS DECIMAL(38,18))) AS d FROM range({{}})"
    spark.sql(rows.format(6)).coalesce(1).write.format("delta").mode("append").save(target)
    sink = MVSink(target, "v", heartbeat=0, take_over="foreign")  # a table Spark wrote
    assert sink(spark.sql(rows.format(6)), 0).retracted == 0
    report = sink(spark.sql(rows.format(5)), 1)  # id 5 goes: a vector on the one file
    assert report.retracted == 1 and report.files_added == 1
    (vector,) = deletion_vectors_in_log(target)
    assert f'"d":{extreme}' in vector["stats"] and '"tightBounds":false' in vector["stats"]
    assert spark.read.format("delta").load(target).where(f"d = {extreme}BD").count() == 1

    from tests.helpers import once

    frontier = sink.frontier()
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        vacuum = once(lambda: spark.sql(f"VACUUM delta.`{target}` RETAIN 0 HOURS").collect())
        armed = failpoints.armed({"before_commit": vacuum})
        with armed, pytest.raises(Exception, match="missing or changed before the commit"):
            sink(spark.sql(rows.format(4)), 2)  # id 4 goes: only a vector, no added file
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    # Nothing of the attempt landed (the versions since are VACUUM's own).
    assert sink.frontier() == frontier
    assert spark_rows(spark, target, cols=["id"]) == Counter((i,) for i in range(5))
    assert sink(spark.sql(rows.format(4)), 2).outcome == "committed"
    assert spark_rows(spark, target, cols=["id"]) == Counter((i,) for i in range(4))


def test_an_epoch_through_the_sessions_delta_is_a_streaming_update_with_an_exact_checksum(spark, tmp_path):
    """Issue 37: through the JVM engine an epoch is Delta's ``STREAMING UPDATE``, as Delta's own
    streaming sink records a micro-batch (a ``Manual Update`` made Delta recompute the whole
    table's state for each commit's checksum, most of a commit's time). The checksum Delta
    derives from the last one holds the table as it is at every version: its file count and
    bytes are the log's. Compaction stays a ``Manual Update``."""
    from deltalake import DeltaTable

    from mvsink.ops.compact import compact

    target = str(tmp_path / "view")
    sink = MVSink(target, "revenue", engine="delta-spark", max_rows_per_file=3)
    for epoch, ids in enumerate([range(0, 10), range(2, 11), range(5, 20)]):
        assert sink(view(spark, ids, tag=str(epoch)), epoch).outcome == "committed"
    compact(target, "revenue", max_rows_per_file=100, engine="delta-spark")
    history = spark.sql(f"DESCRIBE HISTORY delta.`{target}`").orderBy("version").collect()
    epochs = [row for row in history if (row["userMetadata"] or "").startswith("mvsink view")]
    # The first epoch makes the table.
    assert [row["operation"] for row in epochs] == ["CREATE TABLE", "STREAMING UPDATE", "STREAMING UPDATE"]
    assert [dict(row["operationParameters"]) for row in epochs[1:]] == [
        {"outputMode": "Complete", "queryId": "direct", "epochId": str(epoch)} for epoch in (1, 2)
    ]
    assert history[-1]["operation"] == "Manual Update"
    for row in history[1:]:  # the versions the session's Delta committed (not the creation)
        version = row["version"]
        crc = Path(target, "_delta_log", f"{version:020d}.crc")
        assert crc.exists(), f"no checksum for version {version}"
        said = json.loads(crc.read_text())
        files = DeltaTable(target, version=version).get_add_actions(flatten=True)
        assert (said["numFiles"], said["tableSizeBytes"]) == (
            files.num_rows,
            sum(files.column("size_bytes").to_pylist()),
        ), f"version {version}"


def test_delta_reads_a_view_of_ancient_dates_and_its_change_feed_with_default_settings(spark, tmp_path):
    """A view holding ``date '0001-01-01'`` and timestamps before 1900, on a table with Change
    Data Feed: Delta's reader (3.3 on Spark 3.5, whose datetimeRebaseModeInRead is EXCEPTION by
    default; 4.4 on Spark 4.2) reads every version and the feed's change files, values unchanged
    (every file mvsink writes says its calendar, ``table/storage.SPARK_CALENDAR``)."""
    target = str(tmp_path / "view")
    spark.sql(
        f"CREATE TABLE delta.`{target}` (k BIGINT, d DATE, t TIMESTAMP) USING DELTA "
        "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')"
    )
    ancient = (
        "SELECT id AS k, date_add(DATE'0001-01-01', CAST(id * {step} AS INT)) AS d, "
        "timestamp_micros(-62135596800000000 + id * {step} * 86400000000) AS t FROM range(0, 6)"
    )
    sink = MVSink(target, "ancient", max_rows_per_file=2)
    versions_ = []
    for epoch, step in enumerate((1, 1, 2)):
        desired = spark.sql(ancient.format(step=step)).where(f"k != {epoch}")
        versions_.append((sink(desired, epoch).version, desired))
    as_numbers = ["k", "unix_date(d) AS d", "unix_micros(t) AS t"]
    previous: Counter[Any] = Counter()
    for version, desired in versions_:
        want = Counter(map(tuple, desired.selectExpr(*as_numbers).collect()))
        read = spark.read.format("delta").option("versionAsOf", version).load(target)
        assert Counter(map(tuple, read.selectExpr(*as_numbers).collect())) == want
        feed = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", version)
            .option("endingVersion", version)
            .load(target)
            .selectExpr(*as_numbers, "_change_type")
            .collect()
        )
        changes = {kind: Counter(tuple(r[:3]) for r in feed if r[3] == kind) for kind in ("delete", "insert")}
        assert changes == {"delete": previous - want, "insert": want - previous}, version
        previous = want


def test_a_delta_release_the_engine_was_not_tested_with_is_refused_before_staging(
    spark, tmp_path, monkeypatch
):
    """The engine reaches Delta's internals: on a release it was not tested with (here, as if
    the session's were one), a table that needs it is refused, naming the release and what to
    change, with the folder as it was."""
    import mvsink.table.jvm_delta

    target = str(tmp_path / "view")
    spark.sql(
        f"CREATE TABLE delta.`{target}` (id BIGINT, name STRING) USING DELTA "
        "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    before = sorted(store(target).files(""))
    line = ".".join(spark.version.split(".")[:2])  # as if only Delta 9.9 were tested on this Spark
    tested = mvsink.table.jvm_delta.Tested(line, "io.delta:delta-spark_2.13:9.9.0", "pip install pyspark")
    monkeypatch.setattr(mvsink.table.jvm_delta, "TESTED", {"9.9": tested})
    with pytest.raises(UnsupportedTableError, match=r"spark\.jars\.packages") as info:
        MVSink(target, "v")(view(spark, range(0, 4)).select("id", "name"), 0)
    message = str(info.value)
    assert f"runs Delta {DELTA_VERSION} on Spark {spark.version}" in message
    assert f"Delta 9.9.x with Spark {line}.x" in message and "io.delta:delta-spark_2.13:9.9.0" in message
    assert "nothing was staged" in message
    assert sorted(store(target).files("")) == before
