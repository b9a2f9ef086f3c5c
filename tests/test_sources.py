"""The ``mvsink-delta`` streaming source: a Delta table's appends, version by version."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from mvsink.sources import register

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


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


def test_a_version_that_deletes_rows_stops_the_stream_with_a_clear_error(spark, tmp_path, local_target):
    append(local_target, range(0, 4), "a")
    DeltaTable(local_target).delete("id = 1")
    with pytest.raises(Exception, match="reads appends only"):
        drain(spark, local_target, str(tmp_path / "ckpt"))


def test_a_schema_change_stops_the_stream_with_a_clear_error(spark, tmp_path, local_target):
    append(local_target, range(0, 2), "a")
    wider = pa.table({"id": [5], "v": ["b"], "extra": [1.5]})
    write_deltalake(local_target, wider, mode="append", schema_mode="merge")
    with pytest.raises(Exception, match="changes the table's schema"):
        drain(spark, local_target, str(tmp_path / "ckpt"))
