"""The ``mvsink-delta`` streaming source: a Delta table's appends, version by version."""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import re
import shutil
import time
from collections import Counter
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F

from mvsink import ConfigError, MVSink
from mvsink.compat import PYTHON_DATA_SOURCES, to_arrow
from mvsink.sources.reader import register
from tests.helpers import multiset, removed, target_table

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])
SPARK4 = pytest.mark.spark4("mvsink-delta is a Python data source")


def append(target: str, ids: range, tag: str) -> None:
    write_deltalake(target, pa.table({"id": list(ids), "v": [tag] * len(ids)}, schema=SCHEMA), mode="append")


def drain(spark, target: str, ckpt: str, **options: str) -> list[list[tuple[int, str]]]:
    """Run a query from ``ckpt`` over what is available; the rows of each batch."""
    register(spark)
    batches: list[list[tuple[int, str]]] = []
    reader = spark.readStream.format("mvsink-delta").option("path", target)
    for k, v in options.items():
        reader = reader.option(k, v)

    def keep(df, _):
        batches.append(sorted((r["id"], r["v"]) for r in df.collect()))

    query = reader.load().writeStream.foreachBatch(keep).option("checkpointLocation", ckpt)
    run = query.trigger(availableNow=True).start()
    run.awaitTermination(300)
    assert run.exception() is None
    return [b for b in batches if b]


@SPARK4
def test_appends_are_read_once_in_version_order_across_restarts(spark, tmp_path, target):
    ckpt = str(tmp_path / "ckpt")
    append(target, range(0, 3), "a")
    append(target, range(3, 5), "b")
    first = drain(spark, target, ckpt, maxVersionsPerTrigger="1")
    assert first == [[(0, "a"), (1, "a"), (2, "a")], [(3, "b"), (4, "b")]]
    DeltaTable(target).optimize.compact()  # rearranges rows: adds nothing
    append(target, range(5, 6), "c")
    second = drain(spark, target, ckpt, maxVersionsPerTrigger="1")
    assert second == [[(5, "c")]]  # resumed after the last version read; nothing twice
    assert drain(spark, target, ckpt) == []
    # A fresh query reads every append once, the compaction's files not at all.
    everything = Counter(r for b in drain(spark, target, str(tmp_path / "fresh")) for r in b)
    assert everything == Counter([(i, t) for i, t in zip(range(6), "aaabbc", strict=True)])


@SPARK4
def test_a_version_that_deletes_rows_stops_the_stream_with_a_clear_error(spark, tmp_path, local_target):
    append(local_target, range(0, 4), "a")
    DeltaTable(local_target).delete("id = 1")
    with pytest.raises(Exception, match="reads appends only"):
        drain(spark, local_target, str(tmp_path / "ckpt"))


@SPARK4
def test_a_schema_change_stops_the_stream_with_a_clear_error(spark, tmp_path, local_target):
    append(local_target, range(0, 2), "a")
    wider = pa.table({"id": [5], "v": ["b"], "extra": [1.5]})
    write_deltalake(local_target, wider, mode="append", schema_mode="merge")
    with pytest.raises(Exception, match="changes the table's schema"):
        drain(spark, local_target, str(tmp_path / "ckpt"))


# --- the change feed of a view ---------------------------------------------------------------


def feed(spark, target: str, ckpt: str, **options: str) -> list[pa.Table]:
    """The change feed from ``ckpt`` over what is available, one Arrow table per batch."""
    register(spark)
    batches: list[pa.Table] = []
    reader = spark.readStream.format("mvsink-delta").option("path", target).option("mode", "changes")
    for k, v in options.items():
        reader = reader.option(k, v)
    query = reader.load().writeStream.foreachBatch(lambda df, _: batches.append(to_arrow(df)))
    run = query.option("checkpointLocation", ckpt).trigger(availableNow=True).start()
    run.awaitTermination(300)
    assert run.exception() is None, run.exception()
    return [b for b in batches if b.num_rows]


def view_at(spark, epoch: int):
    """Desired of the test view at ``epoch``: ids drift in and out, values change, duplicates
    and nulls come and go, and most rows stay as they were."""
    rng = random.Random(epoch)
    rows = [(i, None if i % 7 == 0 else f"v{i}") for i in range(epoch, 60 + epoch)]
    for _ in range(3):
        k = rng.randrange(len(rows))
        rows[k] = (rows[k][0], f"changed{epoch}")
    rows += [rows[rng.randrange(len(rows))] for _ in range(2)]  # duplicates
    return spark.createDataFrame(rows, "id long, v string")


def signed(
    rows: pa.Table, version: int, diff: int, columns: tuple[str, ...] | list[str] = ("id", "v")
) -> Counter:
    sel = rows.filter(
        pa.compute.and_(
            pa.compute.equal(rows["_commit_version"], version), pa.compute.equal(rows["diff"], diff)
        )
    )
    return multiset(sel, list(columns))


@SPARK4
def test_the_change_feed_of_a_view_is_exact_per_version_and_sums_to_the_view(spark, tmp_path, local_target):
    sink = MVSink(local_target, "feed", max_rows_per_file=8)
    for epoch in range(10):
        sink(view_at(spark, epoch), epoch)
    DeltaTable(local_target).optimize.compact()  # rearranges rows: no change
    last = DeltaTable(local_target).version()

    batches = feed(spark, local_target, str(tmp_path / "ckpt"), maxVersionsPerTrigger="1")
    rows = pa.concat_tables(batches)
    assert all(len(set(b["_commit_version"].to_pylist())) == 1 for b in batches)  # one version a batch
    assert set(rows["diff"].to_pylist()) == {-1, 1}
    cancelled = 0
    for v in range(last + 1):
        before = multiset(target_table(local_target, v - 1), ["id", "v"]) if v else Counter()
        after = multiset(target_table(local_target, v), ["id", "v"])
        assert signed(rows, v, +1) == after - before, f"inserts of version {v}"
        assert signed(rows, v, -1) == before - after, f"retractions of version {v}"
        if v and removed(local_target, v) and v < last:
            rewritten = sum(
                pq.read_metadata(os.path.join(local_target, p)).num_rows for p in removed(local_target, v)
            )
            cancelled += rewritten - (before - after).total()
    assert cancelled > 0  # rewritten files' untouched rows were in the commits, not in the feed
    total = Counter()
    for row in rows.to_pylist():
        total[(row["id"], row["v"])] += row["diff"]
    assert +total == multiset(target_table(local_target), ["id", "v"]) and not -total

    # Resumed from its checkpoint, the feed reads only what came after.
    sink(view_at(spark, 10), 10)
    more = pa.concat_tables(feed(spark, local_target, str(tmp_path / "ckpt")))
    assert set(more["_commit_version"].to_pylist()) == {last + 1}
    assert signed(more, last + 1, +1) == multiset(target_table(local_target), ["id", "v"]) - multiset(
        target_table(local_target, last), ["id", "v"]
    )


@SPARK4
def test_a_large_rewrite_is_cancelled_in_buckets_exactly(spark, tmp_path, local_target):
    """Above ``rewriteRowsPerTask`` rows, a version's rewrite is split by fingerprint
    into tasks that each hold a share of the fingerprints; equal rows share a bucket, so the
    feed is as exact as in one task."""
    from mvsink.sources.reader import DeltaVersions, _Rewrite

    sink = MVSink(local_target, "feed", max_rows_per_file=30)
    for epoch in range(5):
        sink(view_at(spark, epoch), epoch)
    source = DeltaVersions({"path": local_target, "mode": "changes", "rewriteRowsPerTask": "20"})
    reader = source.streamReader(source.schema())
    parts = reader.partitions({"version": 0}, {"version": 4})
    assert max(p.buckets for p in parts if isinstance(p, _Rewrite)) > 2  # the option took effect

    rows = pa.concat_tables(feed(spark, local_target, str(tmp_path / "ckpt"), rewriteRowsPerTask="20"))
    for v in range(5):
        before = multiset(target_table(local_target, v - 1), ["id", "v"]) if v else Counter()
        after = multiset(target_table(local_target, v), ["id", "v"])
        assert signed(rows, v, +1) == after - before, f"inserts of version {v}"
        assert signed(rows, v, -1) == before - after, f"retractions of version {v}"
    with pytest.raises(Exception, match="rewriteRowsPerTask"):
        feed(spark, local_target, str(tmp_path / "bad"), rewriteRowsPerTask="lots")


@SPARK4
def test_the_change_feed_names_a_vacuumed_file_and_a_column_clash(spark, tmp_path, local_target):
    sink = MVSink(local_target, "feed", max_rows_per_file=8)
    sink(view_at(spark, 0), 0)
    sink(view_at(spark, 1), 1)
    DeltaTable(local_target).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    # Told to read the history from version 0, whose files are gone (by default the query
    # starts from a snapshot then: test_the_default_start_is_a_snapshot_once_version_0_is_gone).
    with pytest.raises(Exception, match=r"no longer exists.*startingSnapshot='latest'"):
        feed(spark, local_target, str(tmp_path / "ckpt"), startingVersion="0")
    clash = str(tmp_path / "clash")
    write_deltalake(clash, pa.table({"id": [1], "diff": [2]}))
    register(spark)
    with pytest.raises(Exception, match="change feed adds"):
        spark.readStream.format("mvsink-delta").option("path", clash).option("mode", "changes").load()


@SPARK4
def test_a_table_that_turns_on_deletion_vectors_mid_stream_stops_it(spark, tmp_path, local_target):
    append(local_target, range(0, 2), "a")
    register(spark)
    seen: list[int] = []

    def turn_on(df, _):  # while the query runs, the table starts using deletion vectors
        seen.append(df.count())
        if len(seen) == 1:
            DeltaTable(local_target).alter.set_table_properties({"delta.enableDeletionVectors": "true"})

    stream = spark.readStream.format("mvsink-delta").option("path", local_target).load()
    query = (
        stream.writeStream.foreachBatch(turn_on)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    with pytest.raises(Exception, match="turns on"):
        query.awaitTermination(120)
    query.stop()
    assert seen[0] == 2


@SPARK4
def test_the_change_feed_of_a_partitioned_view_is_exact_per_version(spark, tmp_path, local_target):
    sink = MVSink(local_target, "feed", max_rows_per_file=8, partition_by=["g"])
    for epoch in range(4):
        sink(view_at(spark, epoch).withColumn("g", F.col("id") % 3), epoch)
    rows = pa.concat_tables(feed(spark, local_target, str(tmp_path / "ckpt")))
    cols = ["id", "v", "g"]
    for v in range(DeltaTable(local_target).version() + 1):
        before = multiset(target_table(local_target, v - 1), cols) if v else Counter()
        after = multiset(target_table(local_target, v), cols)
        assert signed(rows, v, +1, cols) == after - before and signed(rows, v, -1, cols) == before - after


def test_the_source_registers_from_spark_4_on_and_is_refused_clearly_before(spark, tmp_path):
    if PYTHON_DATA_SOURCES:
        source = str(tmp_path / "source")
        append(source, range(3), "a")
        register(spark)
        stream = spark.readStream.format("mvsink-delta").option("path", source).load()
        assert stream.isStreaming and stream.columns == ["id", "v"]
    else:
        with pytest.raises(ConfigError, match=r"Spark runs from 4\.0 on; this is PySpark 3\.5") as info:
            register(spark)
        assert "clock='source_offsets' works with those too" in str(info.value)


# --- where a query starts, its options, the table's identity and schema ----------------------


def stream(spark, target: str, ckpt: str, **options: str) -> tuple[list[pa.Table], Exception | None]:
    """Run a query from ``ckpt`` over what is available: its non-empty batches, and how it
    failed (None: it did not)."""
    register(spark)
    batches: list[pa.Table] = []
    reader = spark.readStream.format("mvsink-delta").option("path", target)
    for k, v in options.items():
        reader = reader.option(k, v)
    query = reader.load().writeStream.foreachBatch(lambda df, _: batches.append(to_arrow(df)))
    run = query.option("checkpointLocation", ckpt).trigger(availableNow=True).start()
    failed: Exception | None = None
    try:
        run.awaitTermination(300)
        failed = run.exception()
    except Exception as exc:
        failed = exc
    return [b for b in batches if b.num_rows], failed


def ids(batches: list[pa.Table]) -> list[list[int]]:
    return [sorted(b["id"].to_pylist()) for b in batches]


def last_offset(ckpt: str) -> dict:
    """The source's end offset of the checkpoint's last batch, as Spark recorded it."""
    folder = os.path.join(ckpt, "offsets")
    last = max(int(n) for n in os.listdir(folder) if n.isdigit())
    with open(os.path.join(folder, str(last))) as fh:
        return json.loads(fh.read().splitlines()[2])


@SPARK4
def test_a_table_made_again_at_the_same_path_stops_the_stream(spark, tmp_path, local_target):
    ckpt = str(tmp_path / "ckpt")
    for v in range(6):  # versions 0..5
        append(local_target, range(v, v + 1), "old")
    assert ids(stream(spark, local_target, ckpt)[0]) == [[0, 1, 2, 3, 4, 5]]
    assert last_offset(ckpt) == {"version": 5, "from": -1, "id": DeltaTable(local_target).metadata().id}
    shutil.rmtree(local_target)  # dropped, and made again: versions 0..6 of another table
    for v in range(7):
        append(local_target, range(100 + v, 101 + v), "new")
    batches, failed = stream(spark, local_target, ckpt)
    assert batches == []  # not version 6 alone, as if the new table went on from the old
    assert failed is not None and "is not the table this stream was reading" in str(failed)
    assert DeltaTable(local_target).metadata().id in str(failed)
    # A new checkpoint reads the new table.
    assert ids(stream(spark, local_target, str(tmp_path / "new"))[0]) == [list(range(100, 107))]


@SPARK4
def test_offsets_recorded_before_the_table_id_are_read_and_the_id_is_recorded_from_then(
    spark, tmp_path, local_target
):
    ckpt = str(tmp_path / "ckpt")
    append(local_target, range(0, 2), "a")
    assert ids(stream(spark, local_target, ckpt)[0]) == [[0, 1]]
    # As a checkpoint of an earlier mvsink wrote it: no "id" in its offsets.
    folder = tmp_path / "ckpt" / "offsets"
    for name in [n for n in os.listdir(folder) if n.isdigit()]:
        lines = (folder / name).read_text().splitlines()
        offset = json.loads(lines[2])
        offset.pop("id", None)
        (folder / name).write_text("\n".join([*lines[:2], json.dumps(offset)]))
    append(local_target, range(2, 3), "b")
    batches, failed = stream(spark, local_target, ckpt)
    assert failed is None and ids(batches) == [[2]]
    assert last_offset(ckpt) == {"version": 1, "from": -1, "id": DeltaTable(local_target).metadata().id}


@SPARK4
def test_every_option_is_checked_and_an_unknown_name_is_refused(spark, tmp_path, local_target):
    from mvsink.sources.reader import DeltaVersions

    append(local_target, range(0, 2), "a")
    bad = {
        "maxVersionsPerTrigger=-1": (
            {"maxVersionsPerTrigger": "-1"},
            "'maxVersionsPerTrigger' is a positive",
        ),
        "maxVersionsPerTrigger=0": ({"maxVersionsPerTrigger": "0"}, "'maxVersionsPerTrigger' is a positive"),
        "maxVersionsPerTrigger=two": ({"maxVersionsPerTrigger": "two"}, "not 'two'"),
        "startingVersion=-1": ({"startingVersion": "-1"}, "'startingVersion' is a Delta version"),
        "startingVersion=1.5": ({"startingVersion": "1.5"}, "'startingVersion' is a Delta version"),
        "startingVersion=first": ({"startingVersion": "first"}, "or 'latest', not 'first'"),
        "startingSnapshot=-3": ({"startingSnapshot": "-3"}, "'startingSnapshot' is a Delta version"),
        "startingSnapshot past": ({"startingSnapshot": "9"}, "startingSnapshot 9 is past the latest version"),
        "both starts": ({"startingVersion": "0", "startingSnapshot": "0"}, "not both"),
        "rewriteRowsPerTask=0": ({"rewriteRowsPerTask": "0"}, "'rewriteRowsPerTask' is a positive number"),
        "mode": ({"mode": "upserts"}, "'mode' is one of"),
        "typo": ({"maxVersionPerTrigger": "1"}, "has no option 'maxVersionPerTrigger'"),
        "storage key without the prefix": ({"timeout": "30s"}, "as 'storage.<key>'"),
    }
    for case, (options, message) in bad.items():
        with pytest.raises(ConfigError, match=re.escape(message)):
            DeltaVersions({"path": local_target, **options}).schema()
        with pytest.raises(
            Exception, match=re.escape(message.replace("maxVersionPerTrigger", "maxversionpertrigger"))
        ):
            reader = spark.readStream.format("mvsink-delta").option("path", local_target)
            for k, v in options.items():
                reader = reader.option(k, v)
            register(spark)
            reader.load()
        assert case
    with pytest.raises(ConfigError, match="needs option 'path'"):
        DeltaVersions({"mode": "changes"}).schema()
    # Valid spellings pass, in any case: Spark hands the names over lower-cased.
    source = DeltaVersions({"path": local_target, "MAXVERSIONSPERTRIGGER": "1", "startingversion": "LATEST"})
    reader = source.streamReader(source.schema())
    assert reader.limit == 1 and reader.initialOffset()["version"] == DeltaTable(local_target).version()


@SPARK4
def test_starting_version_latest_reads_only_the_versions_after_the_start(spark, tmp_path, local_target):
    ckpt = str(tmp_path / "ckpt")
    append(local_target, range(0, 2), "a")
    append(local_target, range(2, 3), "b")
    batches, failed = stream(spark, local_target, ckpt, startingVersion="latest")
    assert failed is None and batches == []
    append(local_target, range(3, 5), "c")
    batches, failed = stream(spark, local_target, ckpt, startingVersion="latest")
    assert failed is None and ids(batches) == [[3, 4]]
    assert last_offset(ckpt)["from"] == 1  # where the query started: after version 1


@SPARK4
def test_storage_options_pass_with_the_storage_prefix_and_as_bare_cloud_keys(
    spark, tmp_path, s3_target, s3_options
):
    """The server ``s3_options`` reach is not in the environment: only options passed on reach it."""
    write_deltalake(
        s3_target, pa.table({"id": [1, 2], "v": ["a", "b"]}, schema=SCHEMA), storage_options=s3_options
    )
    prefixed = {f"storage.{k}": v for k, v in s3_options.items()}
    batches, failed = stream(spark, s3_target, str(tmp_path / "prefixed"), **prefixed)
    assert failed is None and ids(batches) == [[1, 2]]
    batches, failed = stream(spark, s3_target, str(tmp_path / "bare"), **s3_options)  # as documented before
    assert failed is None and ids(batches) == [[1, 2]]


def widen(target: str, keys: range) -> None:
    """Append rows with a new column ``extra``: the version changes the table's schema."""
    rows = pa.table({"id": list(keys), "v": ["w"] * len(keys), "extra": [1.5] * len(keys)})
    write_deltalake(target, rows, mode="append", schema_mode="merge")


@SPARK4
@pytest.mark.parametrize("mode", ["appends", "changes"])
def test_a_fresh_query_reads_up_to_a_schema_change_and_stops_there(spark, tmp_path, local_target, mode):
    append(local_target, range(0, 2), "a")  # version 0
    append(local_target, range(2, 3), "b")  # 1
    widen(local_target, range(3, 4))  # 2: a new column
    widen(local_target, range(4, 5))  # 3
    batches, failed = stream(
        spark, local_target, str(tmp_path / "ckpt"), mode=mode, maxVersionsPerTrigger="1"
    )
    assert ids(batches) == [[0, 1], [2]]  # versions 0 and 1, under their own schema
    assert all("extra" not in b.column_names for b in batches)
    assert failed is not None and "Delta version 2 of" in str(failed)
    assert "changes the table's schema" in str(failed) and "startingVersion=2" in str(failed)
    # The advice works: a new query from version 2 reads on under the new schema.
    batches, failed = stream(spark, local_target, str(tmp_path / "from2"), mode=mode, startingVersion="2")
    assert failed is None and ids(batches) == [[3, 4]]
    assert batches[0]["extra"].to_pylist() == [1.5, 1.5]
    if mode == "changes":
        assert batches[0]["_commit_version"].to_pylist() == [2, 3] and batches[0]["diff"].to_pylist() == [
            1,
            1,
        ]


@SPARK4
def test_a_restarted_query_stops_at_a_schema_change_it_has_not_read(spark, tmp_path, local_target):
    ckpt = str(tmp_path / "ckpt")
    append(local_target, range(0, 2), "a")
    append(local_target, range(2, 3), "b")
    assert ids(stream(spark, local_target, ckpt)[0]) == [[0, 1, 2]]
    widen(local_target, range(3, 4))  # version 2
    widen(local_target, range(4, 5))  # 3
    batches, failed = stream(spark, local_target, ckpt)
    assert batches == [] and failed is not None
    assert "Delta version 2 of" in str(failed) and "changes the table's schema" in str(failed)
    # Restarted from the checkpoint with another start, so the stream's schema is the new one:
    # its checkpoint stands at version 1, under the old schema. It stops too.
    batches, failed = stream(spark, local_target, ckpt, startingVersion="2")
    assert batches == [] and failed is not None
    assert "at version 1, where this query's checkpoint stands, is not the stream's schema" in str(failed)
    assert "already changed" not in str(failed)  # the change is after the checkpoint's version


@SPARK4
def test_the_default_start_is_a_snapshot_once_version_0_is_gone(spark, tmp_path):
    """Version 0 on while the log holds it and its commit is younger than the table's
    deletedFileRetentionDuration (no removed file can have been vacuumed yet); otherwise the
    snapshot at the latest version. Decided from version 0's commit, not by looking at files."""
    # Older than the retention: version 0 is 1 ms old soon after it was written. Its files
    # are vacuumed here (as the retention allows), but the rule does not look at them.
    old = str(tmp_path / "old")
    rows = pa.table({"id": [0, 1], "v": ["a", "a"]}, schema=SCHEMA)
    write_deltalake(old, rows, configuration={"delta.deletedFileRetentionDuration": "interval 1 millisecond"})
    for v in range(1, 3):
        append(old, range(v * 2, v * 2 + 2), "a")
    time.sleep(0.05)
    DeltaTable(old).optimize.compact()
    ckpt = str(tmp_path / "ckpt")
    batches, failed = stream(spark, old, ckpt, maxVersionsPerTrigger="1")
    latest = DeltaTable(old).version()
    assert failed is None and ids(batches) == [list(range(6))]  # the table as of its latest version
    # Its first batch is the table's state at that version: it proves nothing before it.
    assert last_offset(ckpt) == {"version": latest, "from": latest, "id": DeltaTable(old).metadata().id}
    DeltaTable(old).vacuum(dry_run=False)  # within the (tiny) retention: the history's files go
    append(old, range(6, 7), "b")
    batches, failed = stream(spark, old, ckpt, maxVersionsPerTrigger="1")
    assert failed is None and ids(batches) == [[6]]  # then the versions after it
    assert last_offset(ckpt)["from"] == latest

    # Log cleanup: version 0's commit is no longer in the log (a checkpoint at 2 holds the state).
    cleaned = str(tmp_path / "cleaned")
    for v in range(3):
        append(cleaned, range(v, v + 1), "a")
    DeltaTable(cleaned).create_checkpoint()
    os.remove(os.path.join(cleaned, "_delta_log", f"{0:020}.json"))
    batches, failed = stream(spark, cleaned, str(tmp_path / "ckpt2"), maxVersionsPerTrigger="1")
    assert failed is None and ids(batches) == [[0, 1, 2]]

    # While version 0 is in the log and younger than the retention (7 days by default), the
    # default stays the whole history.
    kept = str(tmp_path / "kept")
    for v in range(2):
        append(kept, range(v, v + 1), "a")
    batches, failed = stream(spark, kept, str(tmp_path / "ckpt3"), maxVersionsPerTrigger="1")
    assert failed is None and ids(batches) == [[0], [1]]
    assert last_offset(str(tmp_path / "ckpt3"))["from"] == -1


def uncommit_last_batch(ckpt: str) -> int:
    """Make Spark run the checkpoint's last batch again at the next start, as after a crash
    between recording its offsets and committing it; the batch's id."""
    folder = os.path.join(ckpt, "commits")
    last = max(int(n) for n in os.listdir(folder) if n.isdigit())
    for name in (str(last), f".{last}.crc"):
        if os.path.exists(os.path.join(folder, name)):
            os.remove(os.path.join(folder, name))
    return last


@SPARK4
def test_a_batch_replayed_after_the_table_was_made_again_stops_the_stream(spark, tmp_path, local_target):
    ckpt = str(tmp_path / "ckpt")
    for v in range(6):  # versions 0..5
        append(local_target, range(v, v + 1), "old")
    batches, failed = stream(spark, local_target, ckpt, maxVersionsPerTrigger="3")
    assert failed is None and ids(batches) == [[0, 1, 2], [3, 4, 5]]
    assert uncommit_last_batch(ckpt) == 1  # versions 3..5: Spark replays them, no latestOffset first
    shutil.rmtree(local_target)  # dropped, and made again: versions 0..6 of another table
    for v in range(7):
        append(local_target, range(100 + v, 101 + v), "new")
    batches, failed = stream(spark, local_target, ckpt, maxVersionsPerTrigger="3")
    assert batches == []  # not the new table's versions 3..5 under the old table's offsets
    assert failed is not None and "is not the table this stream was reading" in str(failed)
    assert DeltaTable(local_target).metadata().id in str(failed)


def clean_log(target: str, below: int) -> None:
    """Log cleanup: a checkpoint at the latest version, and the commits before ``below`` gone."""
    DeltaTable(target).create_checkpoint()
    for v in range(below):
        os.remove(os.path.join(target, "_delta_log", f"{v:020}.json"))


@SPARK4
@pytest.mark.parametrize("option", ["startingVersion", "startingSnapshot"])
def test_a_query_restarts_once_log_cleanup_took_its_starting_version(spark, tmp_path, local_target, option):
    ckpt = str(tmp_path / "ckpt")
    for v in range(4):  # versions 0..3
        append(local_target, range(v, v + 1), "a")
    batches, failed = stream(spark, local_target, ckpt, **{option: "1"})
    first = [[1, 2, 3]] if option == "startingVersion" else [[0, 1], [2, 3]]  # (a snapshot, then 2, 3)
    assert failed is None and ids(batches) == first
    clean_log(local_target, below=3)  # the checkpoint stands at 3; version 1 cannot be read now
    append(local_target, range(4, 6), "b")  # 4
    batches, failed = stream(spark, local_target, ckpt, **{option: "1"})
    assert failed is None and ids(batches) == [[4, 5]]
    # A new query cannot start there: the schema at its start cannot be read.
    batches, failed = stream(spark, local_target, str(tmp_path / "new"), **{option: "1"})
    assert batches == [] and failed is not None and "can no longer be read" in str(failed)


@SPARK4
def test_a_restart_whose_checkpoints_version_cannot_be_read_stops(spark, tmp_path, local_target):
    """The query read versions 0 and 1; then the schema changes at 2 and log cleanup leaves a
    checkpoint at 2. Restarted (its default start is now a snapshot at the latest version,
    under the new schema), it cannot tell the schema at 1 and must not read 2 and 3 under
    another schema than the one it read under."""
    ckpt = str(tmp_path / "ckpt")
    append(local_target, range(0, 2), "a")
    append(local_target, range(2, 3), "a")
    assert ids(stream(spark, local_target, ckpt)[0]) == [[0, 1, 2]]
    widen(local_target, range(3, 4))  # version 2
    clean_log(local_target, below=2)
    widen(local_target, range(4, 5))  # 3
    batches, failed = stream(spark, local_target, ckpt)
    assert batches == [] and failed is not None
    assert "at version 1, where this query's checkpoint stands, can no longer be read" in str(failed)
    assert "startingSnapshot='latest'" in str(failed)


@SPARK4
def test_the_change_feed_from_a_snapshot_is_the_view_then_its_exact_changes(spark, tmp_path, local_target):
    sink = MVSink(local_target, "feed", max_rows_per_file=8)
    for epoch in range(5):
        sink(view_at(spark, epoch), epoch)
    last = DeltaTable(local_target).version()
    ckpt = str(tmp_path / "ckpt")
    batches, failed = stream(
        spark, local_target, ckpt, mode="changes", startingSnapshot="2", maxVersionsPerTrigger="1"
    )
    assert failed is None
    first = batches[0]
    assert set(first["_commit_version"].to_pylist()) == {2} and set(first["diff"].to_pylist()) == {1}
    assert multiset(first, ["id", "v"]) == multiset(target_table(local_target, 2), ["id", "v"])
    rows = pa.concat_tables(batches[1:])
    for v in range(3, last + 1):
        before = multiset(target_table(local_target, v - 1), ["id", "v"])
        after = multiset(target_table(local_target, v), ["id", "v"])
        assert signed(rows, v, +1) == after - before and signed(rows, v, -1) == before - after
    with open(os.path.join(ckpt, "offsets", "0")) as fh:
        assert json.loads(fh.read().splitlines()[2])["from"] == 2  # the snapshot proves nothing before 2
    # startingSnapshot=latest: the view as it is now, in one batch.
    batches, failed = stream(
        spark, local_target, str(tmp_path / "latest"), mode="changes", startingSnapshot="latest"
    )
    assert failed is None and len(batches) == 1
    assert multiset(batches[0], ["id", "v"]) == multiset(target_table(local_target), ["id", "v"])


@SPARK4
def test_a_rewrite_is_exact_however_its_writers_spelled_a_timestamp_partition(spark, tmp_path, local_target):
    """Version 1 removes a file another writer put in partition ``2021-06-01 12:30:00.000000``
    (no zone, as delta-rs writes it) and adds its rewrite in ``2021-06-01T12:30:00.000000Z``
    (as mvsink and Delta write it): one partition, so only the changed row is in the feed."""
    at = pa.array([dt.datetime(2021, 6, 1, 12, 30, tzinfo=dt.UTC)] * 3, pa.timestamp("us", tz="UTC"))
    write_deltalake(
        local_target, pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"], "at": at}), partition_by=["at"]
    )
    with open(os.path.join(local_target, "_delta_log", f"{0:020d}.json")) as fh:
        (added,) = [a["add"] for a in map(json.loads, fh) if "add" in a]
    assert added["partitionValues"]["at"] == "2021-06-01 12:30:00.000000"
    folder = "at=2021-06-01T12:30:00.000000Z"
    rows = pq.read_table(os.path.join(local_target, unquote(added["path"]))).select(["id", "v"])
    os.makedirs(os.path.join(local_target, folder))
    pq.write_table(
        rows.set_column(1, "v", pa.array(["a", "B", "c"])), os.path.join(local_target, folder, "p.parquet")
    )
    size = os.path.getsize(os.path.join(local_target, folder, "p.parquet"))
    values = {"at": "2021-06-01T12:30:00.000000Z"}
    actions = [
        {"commitInfo": {"timestamp": 1, "operation": "WRITE"}},
        {"remove": {**{k: added[k] for k in ("path", "partitionValues", "size")}, "dataChange": True}},
        {
            "add": {
                "path": f"{folder}/p.parquet",
                "size": size,
                "partitionValues": values,
                "modificationTime": 1,
                "dataChange": True,
                "stats": json.dumps({"numRecords": 3}),
            }
        },
    ]
    with open(os.path.join(local_target, "_delta_log", f"{1:020d}.json"), "w") as fh:
        fh.write("".join(json.dumps(a) + "\n" for a in actions))
    batches = feed(spark, local_target, str(tmp_path / "ckpt"), maxVersionsPerTrigger="5")
    changes = pa.concat_tables(batches)
    assert signed(changes, 1, -1) == Counter({(2, "b"): 1})
    assert signed(changes, 1, 1) == Counter({(2, "B"): 1})


@SPARK4
def test_a_first_batch_replayed_after_the_default_start_turned_to_a_snapshot_reads_what_it_recorded(
    spark, tmp_path, local_target
):
    """Batch 0 planned as the history from version 0 (version 0 young), then replayed once
    version 0 is older than the retention (the default start is now a snapshot): the replay
    reads the history it recorded, retractions included, never the snapshot."""
    rows = pa.table({"id": [0, 1], "v": ["a", "a"]}, schema=SCHEMA)
    write_deltalake(
        local_target, rows, configuration={"delta.deletedFileRetentionDuration": "interval 3 seconds"}
    )
    DeltaTable(local_target).delete("id = 0")  # 1: a retraction only the history holds
    append(local_target, range(2, 3), "b")  # 2
    ckpt = str(tmp_path / "ckpt")
    batches, failed = stream(spark, local_target, ckpt, mode="changes")
    assert failed is None and len(batches) == 1
    first = multiset(batches[0], ["id", "diff"])
    assert first[(0, -1)] == 1  # the history from version 0
    assert uncommit_last_batch(ckpt) == 0
    time.sleep(3.5)  # version 0 is now older than the table's retention
    batches, failed = stream(spark, local_target, ckpt, mode="changes")
    assert failed is None and len(batches) == 1
    assert multiset(batches[0], ["id", "diff"]) == first
