"""Clocks shared by replicas (``clock.py``): an epoch commits only if its time is ahead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError

from mvsink import ConfigError, LineageError, MVSink, status
from mvsink.compat import to_arrow
from mvsink.table.storage import Store
from tests.helpers import commit_info, multiset, run_complete, target_table, versions

SCHEMA = "id long, v string"


def test_only_an_epoch_ahead_of_the_committed_time_commits(spark, local_target):
    now: dict[str, int] = {}
    a = MVSink(local_target, "v", clock=lambda df, epoch: dict(now))
    b = MVSink(local_target, "v", clock=lambda df, epoch: dict(now))
    rows = spark.createDataFrame([(1, "a")], SCHEMA)
    now.update(x=5, y=1)
    first = a(rows, 7)
    assert (first.outcome, first.snapshot_version, first.clock_time) == ("committed", None, {"x": 5, "y": 1})
    before = versions(local_target)
    now.update(x=3, y=1)
    behind = b(rows, 0)
    # The report says what it decided against: the version read, and the epoch's time.
    said = (behind.outcome, behind.snapshot_version, behind.clock_time)
    assert said == ("replay", before[-1], {"x": 3, "y": 1})
    now.update(x=5, y=1)
    assert b(rows, 1).outcome == "replay"  # the same time
    now.update(x=6, y=0)
    assert b(rows, 2).outcome == "replay"  # incomparable
    assert versions(local_target) == before
    later = spark.createDataFrame([(2, "b")], SCHEMA)
    now.update(x=6, y=1)
    assert b(later, 0).outcome == "committed"  # ahead, though its batch id is far behind a's
    assert json.loads(commit_info(local_target, versions(local_target)[-1])["mvsink.time"]) == {
        "x": 6,
        "y": 1,
    }
    assert multiset(target_table(local_target)) == multiset(to_arrow(later))


def test_source_offsets_needs_a_checkpoint_and_append_mode_refuses_shared_clocks(local_target):
    with pytest.raises(ConfigError, match="checkpoint"):
        MVSink(local_target, "v", clock="source_offsets")
    with pytest.raises(ConfigError, match="append mode"):
        MVSink(local_target, "v", mode="append", clock="source_offsets", checkpoint="/tmp/x")


REPLICA = r"""
import os, sys, time
sys.path.insert(0, os.getcwd())
from pyspark.sql import functions as F
from mvsink import MVSink
from mvsink.cli.session import local_session
from mvsink.sources.reader import register
source, local_target, ckpt, ready, stop = sys.argv[1:6]
spark = local_session("replica", conf={"spark.driver.memory": "1g"})
register(spark)
rows = spark.readStream.format("mvsink-delta").option("path", source).load()
view = rows.groupBy("v").agg(F.count(F.lit(1)).alias("n"), F.sum("id").alias("total"))
retry = {"max_attempts": 50, "initial_backoff_s": 0.01}
sink = MVSink(local_target, "agg", clock="source_offsets", checkpoint=ckpt, retry=retry)
query = (view.writeStream.outputMode("complete").foreachBatch(sink)
         .option("checkpointLocation", ckpt).trigger(processingTime="200 milliseconds").start())
open(ready, "w").close()
while not os.path.exists(stop) and query.isActive:
    time.sleep(0.2)
query.stop()
if query.exception() is not None:
    raise SystemExit(str(query.exception()))
print(sorted({r.outcome for r in sink.reports}))
"""


def desired_at(source: str, version: int) -> Counter:
    rows = pa.table(DeltaTable(source, version=version).to_pyarrow_table()).to_pylist()
    groups: dict[str, list[int]] = {}
    for r in rows:
        groups.setdefault(r["v"], []).append(r["id"])
    return Counter((v, len(ids), sum(ids)) for v, ids in groups.items())


@pytest.mark.spark4("the replicas read mvsink-delta, a Python data source")
def test_replicas_with_their_own_checkpoints_share_the_source_clock(spark, tmp_path, local_target):
    replicas = 2
    source = str(tmp_path / "source")
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    write_deltalake(source, pa.table({"id": [0], "v": ["g0"]}, schema=schema))
    script = tmp_path / "replica.py"
    script.write_text(REPLICA)
    stop = str(tmp_path / "stop")
    procs, ready = [], []
    for r in range(replicas):
        ready.append(str(tmp_path / f"ready{r}"))
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(script),
                    source,
                    local_target,
                    str(tmp_path / f"ckpt{r}"),
                    ready[-1],
                    stop,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": os.getcwd()},
                cwd=os.getcwd(),
            )
        )
    try:
        deadline = time.monotonic() + 180
        while not all(Path(p).exists() for p in ready) and time.monotonic() < deadline:
            time.sleep(0.2)
        last = 0
        for i in range(1, 13):  # a producer appending while the replicas race
            ids = list(range(i * 10, i * 10 + 3))
            write_deltalake(
                source, pa.table({"id": ids, "v": [f"g{i % 4}"] * 3}, schema=schema), mode="append"
            )
            last = i
            time.sleep(0.25)
        while time.monotonic() < deadline:
            try:  # staged files may come before the first commit makes a table
                if DeltaTable(local_target).transaction_version("mvsink:agg~0.version") == last:
                    break
            except TableNotFoundError:
                pass
            time.sleep(0.5)
    finally:
        Path(stop).touch()
        outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    seen = -1
    for v in versions(local_target):
        stamp = json.loads(commit_info(local_target, v)["mvsink.time"])["0.version"]
        assert stamp > seen  # the view never moves back, nor is a time written twice
        seen = stamp
        got = multiset(target_table(local_target, v))
        assert got == desired_at(source, stamp), f"version {v} at source version {stamp}"
    assert seen == last


def checkpoint(root: Path, query: str, offsets: dict[int, int]) -> str:
    """A streaming checkpoint as Spark lays it out: the query id and per batch its offsets."""
    (root / "offsets").mkdir(parents=True)
    (root / "metadata").write_text(json.dumps({"id": query}))
    for batch, version in offsets.items():
        (root / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{{"version":{version}}}\n')
    return str(root)


def test_an_upsert_batch_starting_past_the_committed_offsets_is_refused(spark, tmp_path, local_target):
    rows = spark.createDataFrame([(1, "a")], SCHEMA)
    a = checkpoint(tmp_path / "a", "qa", {0: 5})
    MVSink(local_target, "u", mode="upsert", key=["id"], clock="source_offsets", checkpoint=a)(rows, 0)
    late = checkpoint(tmp_path / "late", "qb", {2: 7, 3: 9})  # its batch 3 covers (7, 9]
    before = versions(local_target)
    sink = MVSink(local_target, "u", mode="upsert", key=["id"], clock="source_offsets", checkpoint=late)
    with pytest.raises(LineageError, match="past the committed source offsets"):
        sink(rows, 3)
    assert versions(local_target) == before
    covering = checkpoint(tmp_path / "covering", "qc", {2: 4, 3: 9})  # covers (4, 9] ⊇ (5, 9]
    ok = MVSink(local_target, "u", mode="upsert", key=["id"], clock="source_offsets", checkpoint=covering)
    assert ok(rows, 3).outcome == "committed"


def test_a_complete_query_that_did_not_start_at_its_sources_beginning_is_refused(
    spark, tmp_path, local_target
):
    # A replica or a redeploy started from later offsets (Kafka's startingOffsets=latest): its
    # aggregate lacks what came before its start, so committing it would drop that from the
    # view. Past the committed offsets, at them (a redeploy on a quiet topic: its first batch
    # is empty and replays, its second would replace the view), or before them but not at 0.
    whole = spark.createDataFrame([(1, "a"), (2, "b")], SCHEMA)
    a = kafka_checkpoint(tmp_path / "a", "qa", initial=0, end=7)
    assert MVSink(local_target, "c", clock="source_offsets", checkpoint=a)(whole, 0).outcome == "committed"
    part = spark.createDataFrame([(3, "c")], SCHEMA)
    before = versions(local_target)
    late = kafka_checkpoint(tmp_path / "late", "qb", initial=9, end=11)  # its first batch: (9, 11]
    with pytest.raises(LineageError, match="past where the query that built the view did") as info:
        MVSink(local_target, "c", clock="source_offsets", checkpoint=late)(part, 0)
    assert "allow_late_start=True" in info.value.message and "allow_gaps" not in info.value.message
    at = kafka_checkpoint(tmp_path / "at", "qc", initial=7, end=7)
    (Path(at) / "offsets" / "1").write_text('v1\n{"batchWatermarkMs":0}\n{"t":{"0":11}}\n')
    quiet = MVSink(local_target, "c", clock="source_offsets", checkpoint=at)
    assert quiet(part, 0).outcome == "replay"  # its empty first batch: the committed time
    with pytest.raises(LineageError, match="past where the query that built the view did") as info:
        quiet(part, 1)
    assert "allow_gaps" not in info.value.message
    covering = kafka_checkpoint(tmp_path / "covering", "qd", initial=3, end=11)
    with pytest.raises(LineageError, match="past where the query that built the view did"):
        MVSink(local_target, "c", clock="source_offsets", checkpoint=covering)(part, 0)
    assert versions(local_target) == before and multiset(target_table(local_target)) == multiset(
        to_arrow(whole)
    )
    # From the beginning it commits; so does a late start by choice.
    fresh = kafka_checkpoint(tmp_path / "fresh", "qe", initial=0, end=11)
    more = spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], SCHEMA)
    assert MVSink(local_target, "c", clock="source_offsets", checkpoint=fresh)(more, 0).outcome == "committed"
    later = kafka_checkpoint(tmp_path / "later", "qf", initial=12, end=13)
    chosen = MVSink(local_target, "c", clock="source_offsets", checkpoint=later, allow_late_start=True)
    assert chosen(part, 0).outcome == "committed"
    assert multiset(target_table(local_target)) == multiset(to_arrow(part))


def test_a_complete_view_whose_query_began_past_offset_0_goes_on_and_so_does_a_replica_from_there(
    spark, tmp_path, local_target
):
    """A topic whose retention dropped its first records: earliest is offset 5. The query that
    built the view from there is its origin: its later epochs commit, and so does a replica
    that starts there too; one that starts later is refused."""
    rows = [spark.createDataFrame([(i, "a")], SCHEMA) for i in range(4)]
    ckpt = kafka_checkpoint(tmp_path / "a", "qa", initial=5, end=8)
    (Path(ckpt) / "offsets" / "1").write_text('v1\n{"batchWatermarkMs":0}\n{"t":{"0":9}}\n')
    sink = MVSink(local_target, "c", clock="source_offsets", checkpoint=ckpt)
    assert sink(rows[0], 0).outcome == "committed"
    assert sink(rows[1], 1).outcome == "committed"
    replica = kafka_checkpoint(tmp_path / "b", "qb", initial=5, end=10)
    assert (
        MVSink(local_target, "c", clock="source_offsets", checkpoint=replica)(rows[2], 0).outcome
        == "committed"
    )
    later = kafka_checkpoint(tmp_path / "c", "qc", initial=6, end=11)
    with pytest.raises(LineageError, match="past where the query that built the view did"):
        MVSink(local_target, "c", clock="source_offsets", checkpoint=later)(rows[3], 0)
    assert multiset(target_table(local_target)) == multiset(to_arrow(rows[2]))


def test_a_new_lineage_of_a_complete_view_is_refused_when_its_query_started_late(
    spark, tmp_path, local_target
):
    """The batch_id clock: a new checkpoint is a new lineage that takes a complete view over
    (on_new_lineage defaults to adopt). One whose query started from later offsets is refused,
    read from its checkpoint; the view's first commit is not (there is nothing to lose)."""
    first = kafka_checkpoint(tmp_path / "first", "q1", initial=5, end=8)
    rows = spark.createDataFrame([(1, "a")], SCHEMA)
    assert MVSink(local_target, "c", checkpoint=first)(rows, 0).outcome == "committed"
    redeploy = kafka_checkpoint(tmp_path / "redeploy", "q2", initial=8, end=8)
    before = versions(local_target)
    with pytest.raises(LineageError, match="past where the query that built the view did"):
        MVSink(local_target, "c", checkpoint=redeploy)(spark.createDataFrame([], SCHEMA), 0)
    assert versions(local_target) == before
    again = kafka_checkpoint(tmp_path / "again", "q3", initial=0, end=8)
    assert MVSink(local_target, "c", checkpoint=again)(rows, 0).outcome == "committed"


@pytest.mark.parametrize("mode", ["complete", "upsert"])
def test_offsets_that_go_back_within_a_query_are_refused_at_the_first_such_epoch(
    spark, tmp_path, local_target, mode
):
    """A topic deleted and made again under failOnDataLoss=false: the query's offsets go back.
    Every later epoch would be behind the committed offsets (a replay) and the view would stop
    moving; the first such epoch is an error naming the reset and the way on, which works."""
    options = {"mode": mode, **({"key": ["id"]} if mode == "upsert" else {})}
    rows = spark.createDataFrame([(1, "a")], SCHEMA)
    ckpt = kafka_checkpoint(tmp_path / "a", "qa", initial=0, end=50)
    (Path(ckpt) / "offsets" / "1").write_text('v1\n{"batchWatermarkMs":0}\n{"t":{"0":60}}\n')
    (Path(ckpt) / "offsets" / "2").write_text('v1\n{"batchWatermarkMs":0}\n{"t":{"0":4}}\n')
    sink = MVSink(local_target, "r", clock="source_offsets", checkpoint=ckpt, **options)
    sink(rows, 0)
    sink(rows, 1)
    before = versions(local_target)
    with pytest.raises(LineageError, match="went back between its batches") as info:
        sink(spark.createDataFrame([(2, "b")], SCHEMA), 2)
    assert "0.t.0: 60 -> 4" in info.value.message and "take_over='r'" in info.value.message
    assert "allow_gaps" not in info.value.message
    assert versions(local_target) == before
    # The way on: a new checkpoint from the beginning, taking the view's offsets for its own.
    fresh = kafka_checkpoint(tmp_path / "fresh", "qb", initial=0, end=4)
    (Path(fresh) / "offsets" / "1").write_text('v1\n{"batchWatermarkMs":0}\n{"t":{"0":9}}\n')
    new_rows = spark.createDataFrame([(2, "b")], SCHEMA)
    without = MVSink(local_target, "r", clock="source_offsets", checkpoint=fresh, **options)
    assert without(new_rows, 0).outcome == "replay"  # behind the old offsets: nothing moves
    taking = MVSink(local_target, "r", clock="source_offsets", checkpoint=fresh, take_over="r", **options)
    assert taking(new_rows, 0).outcome == "committed"
    assert json.loads(commit_info(local_target, versions(local_target)[-1])["mvsink.time"]) == {"0.t.0": 4}
    # Taken once: the lineage's next epochs compare as any other's, the option left on or not.
    assert taking(new_rows, 0).outcome == "replay"
    assert taking(spark.createDataFrame([(3, "c")], SCHEMA), 1).outcome == "committed"
    want = [(3, "c")] if mode == "complete" else [(1, "a"), (2, "b"), (3, "c")]
    assert multiset(target_table(local_target)) == multiset(to_arrow(spark.createDataFrame(want, SCHEMA)))


def kafka_checkpoint(root: Path, query: str, initial: int | dict[str, int], end: int | dict[str, int]) -> str:
    """A new checkpoint of one query on Kafka topic ``t`` (partition 0, or the partitions
    given): its initial offsets (``sources/0/0``, as Spark's Kafka source records them) and its
    batch 0's end."""
    start = {"0": initial} if isinstance(initial, int) else initial
    stop = {"0": end} if isinstance(end, int) else end
    (root / "offsets").mkdir(parents=True)
    (root / "sources" / "0").mkdir(parents=True)
    (root / "metadata").write_text(json.dumps({"id": query}))
    (root / "sources" / "0" / "0").write_text("\x00v1\n" + json.dumps({"t": start}))
    (root / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0}\n' + json.dumps({"t": stop}) + "\n")
    return str(root)


@pytest.mark.parametrize("mode", ["complete", "upsert"])
def test_a_new_replica_from_the_start_of_a_topic_that_gained_a_partition_is_not_refused(
    spark, tmp_path, local_target, mode
):
    # The view is behind at {0: 100, 1: 80}; partition 2 came since. A replica from earliest
    # starts at 0 everywhere, partition 2 included: it skips nothing. One that starts partition
    # 2 at 5 skips its first 5 records, which nobody committed.
    options = {"mode": mode, **({"key": ["id"]} if mode == "upsert" else {})}
    rows = spark.createDataFrame([(1, "a")], SCHEMA)
    a = kafka_checkpoint(tmp_path / "a", "qa", initial={"0": 0, "1": 0}, end={"0": 100, "1": 80})
    assert (
        MVSink(local_target, "k", clock="source_offsets", checkpoint=a, **options)(rows, 0).outcome
        == "committed"
    )
    late = kafka_checkpoint(
        tmp_path / "late", "qb", initial={"0": 0, "1": 0, "2": 5}, end={"0": 120, "1": 90, "2": 9}
    )
    skipped = "past the committed source offsets" if mode == "upsert" else "past where the query that built"
    with pytest.raises(LineageError, match=skipped):
        MVSink(local_target, "k", clock="source_offsets", checkpoint=late, **options)(rows, 0)
    fresh = kafka_checkpoint(
        tmp_path / "b", "qc", initial={"0": 0, "1": 0, "2": 0}, end={"0": 120, "1": 90, "2": 9}
    )
    sink = MVSink(local_target, "k", clock="source_offsets", checkpoint=fresh, **options)
    assert sink(rows, 0).outcome in ("committed", "unchanged")


def offsets_checkpoint(root: Path, query: str, batches: dict[int, list[str]]) -> str:
    """A checkpoint whose batches end at the given source offset lines (JSON, or "-")."""
    (root / "offsets").mkdir(parents=True)
    (root / "metadata").write_text(json.dumps({"id": query}))
    for batch, sources in batches.items():
        (root / "offsets" / str(batch)).write_text(
            "v1\n" + '{"batchWatermarkMs":0}\n' + "\n".join(sources) + "\n"
        )
    return str(root)


def delta_offset(version: int, index: int) -> str:
    return json.dumps(
        {
            "sourceVersion": 1,
            "reservoirId": "r",
            "reservoirVersion": version,
            "index": index,
            "isStartingVersion": False,
        }
    )


@pytest.mark.parametrize(
    "batches",
    [
        # A second source going from no offset to its first one.
        [
            ['{"version":1}', "-"],
            ['{"version":2}', "-"],
            ['{"version":2}', '{"version":0}'],
            ['{"version":3}', '{"version":1}'],
        ],
        # Delta's own source: the file index restarts as the version grows; the base index (-1,
        # or -100) comes first, then the metadata-change indexes -20 and -19, then the files.
        [
            [delta_offset(5, -1)],
            [delta_offset(5, -20)],
            [delta_offset(5, -19)],
            [delta_offset(5, 3)],
            [delta_offset(6, -100)],
            [delta_offset(6, 1)],
            [delta_offset(9, 0)],
        ],
        # A Kafka topic gaining a partition.
        [['{"t":{"0":10}}'], ['{"t":{"0":12}}'], ['{"t":{"0":12,"1":0}}'], ['{"t":{"0":13,"1":4}}']],
    ],
    ids=["new-source", "delta-source", "kafka-partition"],
)
def test_each_source_kind_is_ordered_its_own_way_and_the_view_keeps_moving(
    spark, tmp_path, local_target, batches
):
    ckpt = offsets_checkpoint(tmp_path / "c", "q", dict(enumerate(batches)))
    sink = MVSink(local_target, "s", clock="source_offsets", checkpoint=ckpt, heartbeat=0)
    for epoch in range(len(batches)):
        rows = spark.createDataFrame([(epoch, "e")], SCHEMA)
        assert sink(rows, epoch).outcome == "committed", f"epoch {epoch}"
        assert multiset(target_table(local_target)) == {(epoch, "e"): 1}
    # And a replay of any earlier batch (a replica behind) writes nothing.
    assert MVSink(local_target, "s", clock="source_offsets", checkpoint=ckpt)(rows, 1).outcome == "replay"


def test_a_view_that_stays_incomparable_is_reported_stalled(spark, tmp_path, local_target, caplog):
    now: dict[str, int] = {"x": 5, "y": 5}
    writer = MVSink(local_target, "v", clock=lambda df, epoch: dict(now), writer="a")
    rows = spark.createDataFrame([(1, "a")], SCHEMA)
    assert writer(rows, 0).outcome == "committed"
    stuck = MVSink(local_target, "v", clock=lambda df, epoch: dict(now), writer="b", heartbeat=0)
    now.update(x=6, y=4)  # incomparable with (5, 5), and nobody else moves the view
    caplog.set_level("WARNING", logger="mvsink")
    for epoch in range(1, 6):
        assert stuck(rows, epoch).outcome == "replay"
    warned = [r.getMessage() for r in caplog.records if "stalled" in r.getMessage()]
    assert len(warned) == 2  # epochs 4 and 5: past STALL_EPOCHS (3) in a row
    assert '"x": 6' in warned[-1] and '"x": 5' in warned[-1] and "incomparable" in warned[-1]
    (view,) = status(local_target).views
    (note,) = view.stalled
    assert note["writer"] == "b" and note["since_epoch"] == 1 and note["verdict"] == "incomparable"
    assert "STALLED: writer b" in str(status(local_target))
    now.update(x=6, y=6)  # ahead again: it commits and the note goes
    assert stuck(rows, 6).outcome == "committed"
    assert status(local_target).views[0].stalled == ()


def test_a_replica_behind_a_moving_view_is_not_stalled(spark, local_target, caplog):
    now = {"t": 1}
    lead = MVSink(local_target, "v", clock=lambda df, epoch: {"t": now["t"] + 1}, heartbeat=0)
    lag = MVSink(local_target, "v", clock=lambda df, epoch: dict(now))
    rows = spark.createDataFrame([(1, "a")], SCHEMA)
    caplog.set_level("WARNING", logger="mvsink")
    for epoch in range(6):
        now["t"] = epoch
        assert lead(rows, epoch).outcome == "committed"
        assert lag(rows, epoch).outcome == "replay"  # always one behind, while the view moves
    assert not [r for r in caplog.records if "stalled" in r.getMessage()]


def test_a_source_offset_without_an_integer_is_refused_not_a_frozen_view(spark, tmp_path, local_target):
    shards = (
        '{"shardId-000": {"iteratorPosition": "49590338271490256608559692538361571095921575989136588898"}}'
    )
    ckpt = offsets_checkpoint(tmp_path / "c", "q", {0: [shards]})
    sink = MVSink(local_target, "s", clock="source_offsets", checkpoint=ckpt)
    with pytest.raises(ConfigError, match="holds no integer to order epochs by"):
        sink(spark.createDataFrame([(1, "a")], SCHEMA), 0)
    assert not os.path.exists(local_target)


def test_a_view_committed_before_parts_were_counted_keeps_its_order(spark, tmp_path, local_target):
    """mvsink before this clock named a Delta source's offset by its fields (``0.reservoirVersion``,
    ``0.index``) and tagged the set of names (``~names``): a replica of today reads that time
    in today's order, and its commits make such an old replica find the time incomparable."""
    rows = spark.createDataFrame([(1, "a")], SCHEMA)
    old_clock_commit(rows, local_target, {"0.reservoirVersion": 10, "0.index": 3, "0.sourceVersion": 1})
    batches = {0: [delta_offset(9, 7)], 1: [delta_offset(10, 1)], 2: [delta_offset(10, 5)]}
    ckpt = offsets_checkpoint(tmp_path / "c", "q", batches)
    sink = MVSink(local_target, "v", clock="source_offsets", checkpoint=ckpt, heartbeat=0)
    assert sink(rows, 0).outcome == "replay"  # version 9: behind the committed 10
    assert sink(rows, 1).outcome == "replay"  # (10, 1): behind (10, 3)
    assert sink(rows, 2).outcome == "committed"  # (10, 5): ahead
    assert DeltaTable(local_target).transaction_version("mvsink:v~names") == -1


def old_clock_commit(rows, target: str, parts: dict[str, int]) -> None:
    """View ``v`` at ``target`` as mvsink left it before it counted parts: the committed time
    as ``~<part>`` app transactions and a tag of the set of their names (``~names``)."""
    import hashlib
    import uuid

    from mvsink.errors import Where
    from mvsink.table.commit import compare_and_append
    from mvsink.table.delta import load_snapshot

    MVSink(target, "v")(rows, 0)
    snap = load_snapshot(target, "mvsink:v", {}, Where())
    assert snap.schema_json is not None
    digest = hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()
    tag = int(digest[:12], 16)
    old = {
        **{f"mvsink:v~{k}": v for k, v in parts.items()},
        f"mvsink:v~names@{digest[:16]}": tag,
        "mvsink:v~names": tag,
    }
    compare_and_append(
        snap,
        Store(snap.root),
        adds=(),
        removes=(),
        app_id="mvsink:v",
        upper=None,
        attempt_id=uuid.uuid4().hex,
        metadata={},
        schema_json=snap.schema_json,
        partition_by=(),
        where=Where(),
        transactions=old,
    )


def test_an_old_commit_with_other_sources_is_not_passed_by_a_time_lacking_them(spark, tmp_path, local_target):
    """The old clock committed a part for every source (-1 for one without an offset): a time of
    today whose sources name other parts is not ahead of it, as it was not then."""
    rows = spark.createDataFrame([(1, "a")], SCHEMA)
    old_clock_commit(rows, local_target, {"0.t.0": 100, "1.u.0": 50})
    batches = {0: ['{"t":{"0":120}}', "-"], 1: ['{"t":{"0":130}}', '{"u":{"0":60}}']}
    ckpt = offsets_checkpoint(tmp_path / "c", "q", batches)
    sink = MVSink(local_target, "v", clock="source_offsets", checkpoint=ckpt, heartbeat=0)
    assert sink(rows, 0).outcome == "replay"  # source 1 has no offset: not ahead of 1.u.0 = 50
    assert sink(rows, 1).outcome == "committed"  # both sources past the old commit


def test_a_callable_clock_may_not_use_the_names_mvsink_keeps(spark, local_target):
    sink = MVSink(local_target, "v", clock=lambda df, epoch: {"names": 3})
    with pytest.raises(ConfigError, match="mvsink keeps that name"):
        sink(spark.createDataFrame([(1, "a")], SCHEMA), 0)


def test_source_offsets_keep_a_query_on_the_file_source_exact_across_restarts(spark, tmp_path, local_target):
    """The clock works with the sources every Spark line ships: the file source (whose
    ``logOffset`` numbers batches per query, so it is a clock for one query and its
    restarts, not for replicas with checkpoints of their own)."""
    from pyspark.sql import functions as F

    folder, ckpt = tmp_path / "in", str(tmp_path / "ckpt")
    folder.mkdir()
    written: list[tuple[int, str]] = []

    def land(i: int) -> None:
        rows = [(i * 10 + k, f"g{(i + k) % 3}") for k in range(4)]
        written.extend(rows)
        table = pa.table({"id": [r[0] for r in rows], "v": [r[1] for r in rows]})
        pq.write_table(table, str(folder / f"part-{i}.parquet"))

    def run() -> MVSink:
        rows = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(folder))
        view = rows.groupBy("v").agg(F.count(F.lit(1)).alias("n"), F.sum("id").alias("total"))
        sink = MVSink(local_target, "files", clock="source_offsets", checkpoint=ckpt)
        run_complete(view, sink, ckpt)
        return sink

    def expected() -> Counter:
        groups: dict[str, list[int]] = {}
        for i, v in written:
            groups.setdefault(v, []).append(i)
        return Counter((v, len(ids), sum(ids)) for v, ids in groups.items())

    for i in range(2):
        land(i)
    assert [r.outcome for r in run().reports] == ["committed", "committed"]
    assert multiset(target_table(local_target)) == expected()
    land(2)  # the query restarted from its checkpoint reads on from its own offsets
    assert [r.outcome for r in run().reports] == ["committed"]
    assert multiset(target_table(local_target)) == expected()
    times = [json.loads(commit_info(local_target, v)["mvsink.time"]) for v in versions(local_target)]
    assert [t["0.logOffset"] for t in times] == [0, 1, 2]


def upsert_sink(target: str, ckpt: str, **options: object) -> MVSink:
    return MVSink(target, "u", mode="upsert", key=["id"], clock="source_offsets", checkpoint=ckpt, **options)


@pytest.mark.usefixtures("engine")  # decided before the commit, checked on both engines
def test_a_new_checkpoints_first_upsert_batch_must_start_at_or_before_the_committed_time(
    spark, tmp_path, local_target, caplog
):
    """A replica's first batch jumps the versions between the committed time and where it
    started (Kafka's startingOffsets=latest, a later startingVersion): those changes would
    never be written. Its start is read where Spark or the source recorded it."""
    rows = spark.createDataFrame([(1, "a")], SCHEMA)
    a = offsets_checkpoint(tmp_path / "a", "qa", {0: ['{"version":5,"from":-1}']})
    assert upsert_sink(local_target, a)(rows, 0).outcome == "committed"
    before = versions(local_target)
    cases = {  # checkpoint -> whether its first batch may commit
        "late": ('{"version":9,"from":8}', False),  # mvsink-delta started past 5
        "unknown": ('{"version":9}', False),  # a query started before "from" was recorded
        "covering": ('{"version":9,"from":4}', True),
    }
    for name, (offset, ok) in cases.items():
        ckpt = offsets_checkpoint(tmp_path / name, f"q{name}", {0: [offset]})
        if ok:
            assert upsert_sink(local_target, ckpt)(rows, 0).outcome == "committed"
            continue
        with pytest.raises(LineageError, match="start") as info:
            upsert_sink(local_target, ckpt)(rows, 0)
        assert "on_new_lineage='adopt'" in info.value.message or "past the committed" in info.value.message
        assert versions(local_target) == before
    # Adopting an unknown start accepts the loss knowingly, with a WARNING.
    caplog.set_level("WARNING", logger="mvsink")
    adopted = offsets_checkpoint(tmp_path / "adopted", "qad", {0: ['{"version":12}']})
    assert upsert_sink(local_target, adopted, on_new_lineage="adopt")(rows, 0).outcome == "committed"
    assert any("start is unknown" in r.getMessage() for r in caplog.records)


@pytest.mark.usefixtures("engine")  # decided before the commit, checked on both engines
def test_a_kafka_querys_first_batch_starts_at_its_recorded_initial_offsets(spark, tmp_path, local_target):
    rows = spark.createDataFrame([(1, "a")], SCHEMA)
    a = offsets_checkpoint(tmp_path / "a", "qa", {0: ['{"t":{"0":5,"1":2}}']})
    (Path(a) / "sources" / "0").mkdir(parents=True)
    (Path(a) / "sources" / "0" / "0").write_bytes(b'\x00v1\n{"t":{"0":0,"1":0}}')
    assert upsert_sink(local_target, a)(rows, 0).outcome == "committed"
    before = versions(local_target)

    def replica(name: str, initial: bytes | None) -> MVSink:
        ckpt = offsets_checkpoint(tmp_path / name, name, {0: ['{"t":{"0":9,"1":4}}']})
        if initial is not None:
            (Path(ckpt) / "sources" / "0").mkdir(parents=True)
            (Path(ckpt) / "sources" / "0" / "0").write_bytes(initial)
        return upsert_sink(local_target, ckpt)

    with pytest.raises(LineageError, match="past the committed"):  # startingOffsets=latest
        replica("latest", b'\x00v1\n{"t":{"0":7,"1":2}}')(rows, 0)
    with pytest.raises(LineageError, match="start is unknown"):  # nothing recorded
        replica("none", None)(rows, 0)
    assert versions(local_target) == before
    assert replica("earliest", b'\x00v1\n{"t":{"0":0,"1":0}}')(rows, 0).outcome == "committed"


@pytest.mark.usefixtures("engine")  # decided before the commit, checked on both engines
def test_a_callable_clocks_upsert_batch_with_an_unknown_start_is_refused(spark, local_target):
    """A callable clock says where batches end: a batch starts where the clock put the batch
    before it (seen in this process), or where the same writer's commit of the lineage's
    previous batch left the view."""
    now = {"t": 5}

    def sink(lineage: str, writer: str | None = None) -> MVSink:
        clock = lambda df, e: dict(now)  # noqa: E731
        return MVSink(
            local_target,
            "u",
            mode="upsert",
            key=["id"],
            clock=clock,
            lineage=lineage,
            writer=writer or lineage,
        )

    rows = spark.createDataFrame([(1, "a")], SCHEMA)
    assert sink("a")(rows, 0).outcome == "committed"  # the first commit under the clock
    b = sink("b")
    now["t"] = 9
    with pytest.raises(LineageError, match="start is unknown"):
        b(rows, 0)
    now["t"] = 6
    # A replica sharing the lineage's name but not the writer's does not continue a's commit.
    with pytest.raises(LineageError, match="start is unknown"):
        sink("a", writer="a2")(rows, 1)
    assert sink("a")(rows, 1).outcome == "committed"  # a restart of "a" continues its own commit
    now["t"] = 10
    with pytest.raises(LineageError, match="past the committed"):  # b's epoch 0 ended at 9 > 6
        b(rows, 1)
    assert sink("a")(rows, 2).outcome == "committed"  # "a" moves the view to 10
    now["t"] = 11
    assert b(rows, 2).outcome == "committed"  # starts where its epoch 1 ended: 10, committed


def delta_source(spark: Any, tmp_path: Any) -> tuple[str, pa.Schema]:
    """A Delta table at versions 0..2 (keys 1 and 2), read by ``mvsink-delta``."""
    from mvsink.sources.reader import register

    register(spark)
    source = str(tmp_path / "source")
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    write_deltalake(source, pa.table({"id": [1, 2], "v": ["a0", "b0"]}, schema=schema))
    for v in (1, 2):
        write_deltalake(source, pa.table({"id": [v], "v": [f"v{v}"]}, schema=schema), mode="append")
    return source, schema


def upsert_from(spark: Any, source: str, target: str, ckpt: str, **options: str) -> Exception | None:
    """One availableNow query from ``source`` into an upsert sink of ``target``, a version a
    batch (a key changes once a batch); how it failed, if it did."""
    reader = spark.readStream.format("mvsink-delta").option("path", source)
    reader = reader.option("maxVersionsPerTrigger", "1")
    for k, val in options.items():
        reader = reader.option(k, val)
    sink = upsert_sink(target, ckpt)
    query = reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", ckpt)
    started = query.trigger(availableNow=True).start()
    try:
        started.awaitTermination(300)
    except Exception as exc:
        return exc
    return started.exception()


@pytest.mark.spark4("the queries read mvsink-delta, a Python data source")
def test_a_query_started_past_the_committed_version_is_refused_and_one_covering_it_commits(
    spark, tmp_path, local_target
):
    """The defect end to end: replica A upserts source versions 0..2; versions 3..5 change
    keys; a new query starting at version 5 would jump 3 and 4 for good. mvsink-delta records
    where each query started (its offsets' ``from``), so that query fails before writing, and
    one started at version 3 writes everything."""
    source, schema = delta_source(spark, tmp_path)

    def run(name: str, **options: str) -> Exception | None:
        return upsert_from(spark, source, local_target, str(tmp_path / name), **options)

    assert run("a") is None
    assert multiset(target_table(local_target)) == Counter([(1, "v1"), (2, "v2")])
    for v in (3, 4, 5):  # key 2 changes at 3, key 1 at 4, key 9 appears at 5
        write_deltalake(
            source, pa.table({"id": [{3: 2, 4: 1, 5: 9}[v]], "v": [f"v{v}"]}, schema=schema), mode="append"
        )
    before = versions(local_target)
    failed = run("late", startingVersion="5")
    assert failed is not None and "past the committed source offsets" in str(failed)
    assert versions(local_target) == before
    assert json.loads((tmp_path / "late" / "offsets" / "0").read_text().splitlines()[2]) == {
        "version": 5,
        "from": 4,
        "id": DeltaTable(source).metadata().id,
    }
    assert run("covering", startingVersion="3") is None
    assert multiset(target_table(local_target)) == Counter([(1, "v4"), (2, "v3"), (9, "v5")])


@pytest.mark.spark4("the queries read mvsink-delta, a Python data source")
def test_a_snapshot_start_past_the_committed_version_is_refused_and_one_at_or_below_it_commits(
    spark, tmp_path, local_target
):
    """A snapshot at version L is the source's state there, not its changes: read as upserts
    it deletes nothing that was removed before L. So it starts at L (its offsets' ``from``):
    over a view committed at 2 a snapshot at 5 would jump versions 3 to 5 and is refused; one
    at 2 (or below) writes versions 3 to 5 as changes."""
    source, schema = delta_source(spark, tmp_path)

    def run(name: str, **options: str) -> Exception | None:
        return upsert_from(spark, source, local_target, str(tmp_path / name), **options)

    assert run("a", startingVersion="0") is None  # the view stands at source version 2
    assert multiset(target_table(local_target)) == Counter([(1, "v1"), (2, "v2")])
    for v in (3, 4, 5):  # key 2 changes at 3, key 1 at 4, key 9 appears at 5
        write_deltalake(
            source, pa.table({"id": [{3: 2, 4: 1, 5: 9}[v]], "v": [f"v{v}"]}, schema=schema), mode="append"
        )
    before = versions(local_target)
    failed = run("late", startingSnapshot="5")
    assert failed is not None and "past the committed source offsets" in str(failed)
    assert versions(local_target) == before
    assert json.loads((tmp_path / "late" / "offsets" / "0").read_text().splitlines()[2]) == {
        "version": 5,
        "from": 5,
        "id": DeltaTable(source).metadata().id,
    }
    # At the committed version: the snapshot is the time the view holds (nothing to write),
    # then versions 3 to 5 are upserted.
    assert run("at", startingSnapshot="2") is None
    assert multiset(target_table(local_target)) == Counter([(1, "v4"), (2, "v3"), (9, "v5")])
