"""Views of Kafka topics, end to end: a real broker (``tests/kafka.py``), Spark's own Kafka
source, records produced as a service would produce them.

Every test checks every version of the view against a batch query over exactly what the
epoch that wrote it had read: the version's epoch (``mvsink.upper``) names the query's end
offsets in its checkpoint (``offsets/<batch>``), or its shared clock time (``mvsink.time``) is
those offsets, and ``spark.read.format("kafka")`` with those ``endingOffsets`` is desired.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from mvsink import LineageError, MVSink
from tests.helpers import ORDER, commit_info, multiset, parsed, revenue, target_table, versions
from tests.kafka import Kafka

CHANGE = "id long, seq long, deleted boolean, name string, amount long"


def stream(spark: SparkSession, kafka: Kafka, topic: str, **options: str) -> DataFrame:
    reader = spark.readStream.format("kafka").options(**kafka.options(topic))
    return reader.options(**{"startingOffsets": "earliest", **options}).load()


def upto(spark: SparkSession, kafka: Kafka, topic: str, ending: dict[str, dict[str, int]]) -> DataFrame:
    """Everything the topic held before ``ending`` (Kafka's next offsets, as checkpoints hold
    them), as a batch."""
    # Spark wants every partition named: one the offsets do not name had nothing read yet.
    named = ending.get(topic, {})
    whole = {topic: {p: named.get(p, 0) for p in ends(kafka, topic)[topic]}}
    reader = spark.read.format("kafka").options(**kafka.options(topic))
    return reader.option("startingOffsets", "earliest").option("endingOffsets", json.dumps(whole)).load()


def checkpoint_offsets(ckpt: str, batch: int) -> dict[str, dict[str, int]]:
    """The end offsets of ``batch`` of a query whose one source is a Kafka topic."""
    lines = Path(ckpt, "offsets", str(batch)).read_text().splitlines()
    return dict(json.loads(lines[2]))


def clock_offsets(target: str, version: int) -> dict[str, dict[str, int]]:
    """The end offsets a version's shared clock time names (``0.<topic>.<partition>``)."""
    out: dict[str, dict[str, int]] = {}
    for part, offset in json.loads(commit_info(target, version)["mvsink.time"]).items():
        source, topic, partition = part.split(".")
        assert source == "0"
        out.setdefault(topic, {})[partition] = offset
    return out


def ends(kafka: Kafka, topic: str) -> dict[str, dict[str, int]]:
    """The topic's end offsets now."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": "mvsink-tests-ends", "log_level": 0}
    )
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        out = {}
        for p in sorted(partitions):
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            out[str(p)] = high
        return {topic: out}
    finally:
        consumer.close()


def orders(start: int, count: int) -> list[dict[str, Any]]:
    return [
        {"order_id": i, "product": f"p{i % 7}", "amount": i % 11 + 1} for i in range(start, start + count)
    ]


def revenue_of(
    spark: SparkSession, kafka: Kafka, topic: str, ending: dict[str, dict[str, int]]
) -> Counter[Any]:
    return multiset_of(revenue(parsed(upto(spark, kafka, topic, ending), ORDER)))


def multiset_of(df: DataFrame) -> Counter[Any]:
    from mvsink.compat import to_arrow

    return multiset(to_arrow(df))


@pytest.mark.parametrize("session", ["classic", "connect"])
def test_a_complete_view_of_a_topic_stays_exact_when_its_query_stops_mid_stream_and_restarts(
    request, spark, kafka, tmp_path, local_target, session
):
    run_on: SparkSession = spark if session == "classic" else request.getfixturevalue("connect")
    topic, ckpt = kafka.topic(partitions=3), str(tmp_path / "ckpt")
    produced = kafka.produce(topic, orders(0, 300))

    def start() -> Any:
        view = revenue(parsed(stream(run_on, kafka, topic), ORDER))
        sink = MVSink(local_target, "revenue", checkpoint=ckpt)
        writer = view.writeStream.outputMode("complete").foreachBatch(sink)
        return writer.option("checkpointLocation", ckpt).trigger(processingTime="300 milliseconds").start()

    # A producer keeps writing while the query runs, is stopped, and runs again.
    done = threading.Event()

    def produce() -> None:
        nonlocal produced
        while not done.is_set():
            produced += kafka.produce(topic, orders(produced, 40))
            time.sleep(0.1)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        query = start()
        wait_for(lambda: len(versions(local_target)) >= 2)
        query.stop()  # mid-stream: the producer goes on
        stopped_at = len(versions(local_target))
        time.sleep(1)
        query = start()  # from its checkpoint
        wait_for(lambda: len(versions(local_target)) >= stopped_at + 2)
    finally:
        done.set()
        producer.join()
    query.processAllAvailable()
    query.stop()
    for version in versions(local_target):
        batch = int(commit_info(local_target, version)["mvsink.upper"]) - 1
        got = multiset(target_table(local_target, version))
        assert got == revenue_of(run_on, kafka, topic, checkpoint_offsets(ckpt, batch)), f"version {version}"
    assert checkpoint_offsets(ckpt, batch) == ends(kafka, topic)  # the last version read it all
    assert sum(r["orders"] for r in target_table(local_target).to_pylist()) == produced


def stops_with(query: Any, match: str) -> str:
    """The error a running query stops with (within 2 minutes), which must match ``match``."""
    try:
        with pytest.raises(Exception, match=match) as failed:
            query.awaitTermination(120)
    finally:
        query.stop()
    return str(failed.value)


def wait_for(done: Any, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, f"not done after {seconds} s"
        time.sleep(0.2)


def changes(seed: int) -> list[list[dict[str, Any]]]:
    """Change events in chunks, as a CDC feed delivers them: inserts, updates, deletes, a key
    deleted and inserted again, events late (an older sequence after a newer one, a late
    update after a delete) and duplicated (the same event twice)."""
    rng = random.Random(seed)
    seq: dict[int, int] = {}
    events: list[dict[str, Any]] = []

    def event(key: int, deleted: bool = False, at: int | None = None) -> dict[str, Any]:
        seq[key] = seq.get(key, 0) + 10 if at is None else seq.get(key, 0)
        return {
            "id": key,
            "seq": seq[key] if at is None else at,
            "deleted": deleted,
            "name": None if deleted else f"n{key}-{rng.randrange(100)}",
            "amount": None if deleted else rng.randrange(1000),
        }

    for key in range(40):
        events.append(event(key))
    for _ in range(160):
        key = rng.randrange(40)
        roll = rng.random()
        if roll < 0.15:
            events.append(event(key, deleted=True))
        elif roll < 0.25 and seq.get(key, 0) > 10:
            events.append(event(key, at=seq[key] - 5))  # late: older than what is stored
        elif roll < 0.35:
            events.append(dict(events[rng.randrange(len(events))]))  # a duplicate
        else:
            events.append(event(key))  # an update, or the insert of a deleted key
    # Key 0: deleted, then a late update from before the delete, then inserted again.
    events += [event(0, deleted=True), event(0, at=seq[0] - 5), event(0)]
    return [events[i : i + 25] for i in range(0, len(events), 25)]


def latest_per_key(
    spark: SparkSession, kafka: Kafka, topic: str, ending: dict[str, dict[str, int]]
) -> Counter[Any]:
    """Desired of the upsert view: per key, its highest-sequence event, unless a delete."""
    best: dict[int, dict[str, Any]] = {}
    for row in parsed(upto(spark, kafka, topic, ending), CHANGE).collect():
        if row.id not in best or row.seq > best[row.id]["seq"]:
            best[row.id] = row.asDict()
    return Counter((r["id"], r["seq"], r["name"], r["amount"]) for r in best.values() if not r["deleted"])


def test_an_upsert_view_of_a_change_topic_keeps_the_latest_event_per_key(
    spark, kafka, tmp_path, local_target
):
    topic, ckpt = kafka.topic(partitions=3), str(tmp_path / "ckpt")
    sink = MVSink(
        local_target,
        "customers",
        mode="upsert",
        key=["id"],
        sequence_column="seq",
        delete_column="deleted",
        checkpoint=ckpt,
    )
    query = (
        parsed(stream(spark, kafka, topic), CHANGE)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", ckpt)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        for i, chunk in enumerate(changes(seed=7)):
            kafka.produce(topic, chunk, key="id")  # one key, one partition: in order there
            if i % 3 == 2:
                query.processAllAvailable()  # a few epochs, each of several chunks
        query.processAllAvailable()
    finally:
        query.stop()
    assert len(versions(local_target)) >= 3
    for version in versions(local_target):
        batch = int(commit_info(local_target, version)["mvsink.upper"]) - 1
        want = latest_per_key(spark, kafka, topic, checkpoint_offsets(ckpt, batch))
        got = multiset(target_table(local_target, version), ["id", "seq", "name", "amount"])
        assert got == want, f"version {version}"
    assert checkpoint_offsets(ckpt, batch) == ends(kafka, topic)
    assert 0 in {r["id"] for r in target_table(local_target).to_pylist()}  # inserted again


def test_a_new_query_from_latest_beside_a_view_that_is_behind_is_refused(
    spark, kafka, tmp_path, local_target
):
    topic = kafka.topic(partitions=2)
    chunks = changes(seed=11)
    options = dict(mode="upsert", key=["id"], sequence_column="seq", delete_column="deleted")

    def run(ckpt: str, **source: str) -> Any:
        sink = MVSink(local_target, "customers", clock="source_offsets", checkpoint=ckpt, **options)
        return (
            parsed(stream(spark, kafka, topic, **source), CHANGE)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", ckpt)
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    kafka.produce(topic, chunks[0], key="id")
    first = run(str(tmp_path / "a"))
    first.processAllAvailable()
    first.stop()
    committed = clock_offsets(local_target, versions(local_target)[-1])
    kafka.produce(topic, chunks[1], key="id")  # nobody writes these
    before = versions(local_target)
    late = run(str(tmp_path / "b"), startingOffsets="latest")
    try:
        # Its initial offsets, recorded once it has planned: the end of chunks[1].
        wait_for(lambda: (tmp_path / "b" / "sources" / "0" / "0").exists())
        kafka.produce(topic, chunks[2], key="id")
        with pytest.raises(Exception, match="past the committed source offsets") as failed:
            late.awaitTermination(120)
    finally:
        late.stop()
    assert LineageError.__name__ in str(failed.value)
    assert versions(local_target) == before  # nothing written
    # The way on: start from the committed offsets (mvsink status shows them).
    resumed = run(str(tmp_path / "c"), startingOffsets=json.dumps(committed))
    resumed.processAllAvailable()
    resumed.stop()
    last = versions(local_target)[-1]
    assert clock_offsets(local_target, last) == ends(kafka, topic)
    want = latest_per_key(spark, kafka, topic, ends(kafka, topic))
    assert multiset(target_table(local_target), ["id", "seq", "name", "amount"]) == want


@pytest.mark.parametrize("clock", ["batch_id", "source_offsets"])
def test_a_complete_redeploy_from_latest_on_a_quiet_topic_is_refused(
    spark, kafka, tmp_path, local_target, clock
):
    """A redeploy that lost its checkpoint, on a quiet topic, with Kafka's default
    startingOffsets=latest: its aggregate would be of the records produced after it started.
    It used to replace the whole view with it at its second epoch; it is refused before
    anything is written, read from the initial offsets Spark records."""
    topic = kafka.topic(partitions=2)
    kafka.produce(topic, orders(0, 200))

    def run(ckpt: str, **source: str) -> Any:
        # Under the batch id clock the sink finds the checkpoint from the running query.
        told = {"checkpoint": ckpt} if clock == "source_offsets" else {}
        sink = MVSink(local_target, "revenue", clock=clock, **told)
        view = revenue(parsed(stream(spark, kafka, topic, **source), ORDER))
        writer = view.writeStream.outputMode("complete").foreachBatch(sink)
        return writer.option("checkpointLocation", ckpt).trigger(processingTime="200 milliseconds").start()

    first = run(str(tmp_path / "a"))
    first.processAllAvailable()
    first.stop()
    before = versions(local_target)
    held = target_table(local_target)
    late = run(str(tmp_path / "b"), startingOffsets="latest")  # the topic is quiet: caught up
    try:
        wait_for(lambda: (tmp_path / "b" / "sources" / "0" / "0").exists())
        kafka.produce(topic, orders(200, 40))
    except BaseException:
        late.stop()
        raise
    failed = stops_with(late, "past where the query that built the view did")
    assert LineageError.__name__ in failed and "allow_late_start" in failed
    assert versions(local_target) == before and target_table(local_target).equals(held)
    # From the beginning, a new checkpoint rebuilds the view of the whole topic.
    again = run(str(tmp_path / "c"))
    again.processAllAvailable()
    again.stop()
    assert multiset(target_table(local_target)) == revenue_of(spark, kafka, topic, ends(kafka, topic))


@pytest.mark.newest_line  # the reset is the broker's and the clock's, the same on every Spark line
def test_a_topic_made_again_under_the_query_is_an_error_at_its_first_epoch_and_a_new_checkpoint_takes_over(
    spark, kafka, tmp_path, local_target
):
    """A topic deleted and made again while a query reads it with failOnDataLoss=false: the
    query's offsets go back, and under the source offsets clock every later epoch used to be a
    replay (the view frozen). The first such epoch is an error naming the reset; a new
    checkpoint from earliest with take_over naming the view takes the view on."""
    from confluent_kafka.admin import NewTopic

    topic = kafka.topic(partitions=1)
    kafka.produce(topic, orders(0, 100))

    def run(ckpt: str, **options: Any) -> Any:
        sink = MVSink(local_target, "revenue", clock="source_offsets", checkpoint=ckpt, **options)
        raw = stream(spark, kafka, topic, failOnDataLoss="false")
        writer = revenue(parsed(raw, ORDER)).writeStream.outputMode("complete").foreachBatch(sink)
        return writer.option("checkpointLocation", ckpt).trigger(processingTime="200 milliseconds").start()

    ckpt = str(tmp_path / "a")
    query = run(ckpt)
    query.processAllAvailable()
    committed = versions(local_target)
    held = target_table(local_target)
    for done in kafka.admin.delete_topics([topic]).values():
        done.result(60)
    deadline = time.monotonic() + 60
    while True:  # the broker deletes the topic's partitions in the background
        try:
            for done in kafka.admin.create_topics([NewTopic(topic, 1, 1)]).values():
                done.result(60)
            break
        except Exception:
            assert time.monotonic() < deadline, "the topic could not be made again"
            time.sleep(0.5)
    kafka.produce(topic, orders(1000, 30))
    failed = stops_with(query, "went back between its batches")
    assert LineageError.__name__ in failed and "take_over='revenue'" in failed
    assert versions(local_target) == committed and target_table(local_target).equals(held)
    taken = run(str(tmp_path / "b"), take_over="revenue")
    taken.processAllAvailable()
    taken.stop()
    assert multiset(target_table(local_target)) == revenue_of(spark, kafka, topic, ends(kafka, topic))


REPLICA = r"""
import os, sys, time
sys.path.insert(0, os.getcwd())
from pyspark.sql import functions as F
from mvsink import MVSink
from mvsink.cli.session import local_session
from tests.kafka import KAFKA_JARS
from tests.helpers import ORDER, parsed, revenue
bootstrap, topic, target, ckpt, ready, stop = sys.argv[1:7]
spark = local_session("replica", conf={"spark.driver.memory": "1g", "spark.jars": ",".join(KAFKA_JARS)})
raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
       .option("subscribe", topic).option("startingOffsets", "earliest").load())
retry = {"max_attempts": 50, "initial_backoff_s": 0.01}
sink = MVSink(target, "revenue", clock="source_offsets", checkpoint=ckpt, retry=retry)
query = (revenue(parsed(raw, ORDER)).writeStream.outputMode("complete").foreachBatch(sink)
         .option("checkpointLocation", ckpt).trigger(processingTime="200 milliseconds").start())
open(ready, "w").close()
while not os.path.exists(stop) and query.isActive:
    time.sleep(0.2)
if query.isActive:
    query.processAllAvailable()
query.stop()
if query.exception() is not None:
    raise SystemExit(str(query.exception()))
print(sorted({r.outcome for r in sink.reports}))
"""


@pytest.mark.newest_line
@pytest.mark.soak  # processes SIGKILLed and restarted, as tests/chaos: 45 s
def test_replicas_sharing_kafka_offsets_keep_the_view_exact_through_a_kill_and_a_new_partition(
    spark, kafka, tmp_path, local_target
):
    topic = kafka.topic(partitions=2)
    script = tmp_path / "replica.py"
    script.write_text(REPLICA)
    stop = tmp_path / "stop"

    def replica(name: str, failpoints: str = "") -> subprocess.Popen[str]:
        ready = tmp_path / f"ready-{name}"
        ready.unlink(missing_ok=True)
        env = {
            **os.environ,
            "PYTHONPATH": os.getcwd(),
            "MVSINK_FAILPOINTS": failpoints,
            "MVSINK_FAILPOINTS_ENABLE": "1",
        }
        proc = subprocess.Popen(
            [
                sys.executable,
                str(script),
                kafka.bootstrap,
                topic,
                local_target,
                str(tmp_path / name),
                str(ready),
                str(stop),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=os.getcwd(),
            start_new_session=True,
        )
        deadline = time.monotonic() + 180
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        return proc

    produced = kafka.produce(topic, orders(0, 100))
    # Replica a pauses after staging in every epoch, so most of its time is mid-epoch.
    a = replica("a", failpoints="after_staging=sleep:1")
    b = replica("b")
    for chunk in range(12):
        produced += kafka.produce(topic, orders(produced, 60))
        if chunk == 4:
            os.killpg(a.pid, signal.SIGKILL)  # mid-epoch, most likely; its checkpoint stays
            a.wait()
        if chunk == 6:
            a = replica("a")  # restarted from its checkpoint
        if chunk == 8:
            kafka.add_partitions(topic, 3)  # the source finds it at its next batch
        time.sleep(0.5)
    stop.touch()
    outs = [p.communicate(timeout=300) for p in (a, b)]
    for p, (_, err) in zip((a, b), outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    seen: dict[str, dict[str, int]] | None = None
    for version in versions(local_target):
        at = clock_offsets(local_target, version)
        if seen is not None:  # the view only moves forward: no epoch is written twice
            assert at != seen and all(at[topic].get(p, 0) >= o for p, o in seen[topic].items())
        seen = at
        assert multiset(target_table(local_target, version)) == revenue_of(spark, kafka, topic, at), (
            f"v{version}"
        )
    assert seen == ends(kafka, topic) and len(seen[topic]) == 3  # nothing lost, the new partition in
    # The replicas raced: both committed epochs of the one view, or one's epochs were found
    # behind the other's commits (replay).
    lineages = {commit_info(local_target, v)["mvsink.lineage"] for v in versions(local_target)}
    outcomes = " ".join(out for out, _ in outs)
    assert len(lineages) == 2 or "replay" in outcomes, outcomes


def test_the_kafka_example_job_runs_and_verifies_from_earliest_but_not_from_latest(
    spark, kafka, tmp_path, monkeypatch, capsys
):
    import threading

    from mvsink.cli import main
    from mvsink.cli.job import JobConfig
    from mvsink.cli.runner import run_job

    monkeypatch.syspath_prepend("examples")  # as PYTHONPATH=examples does (conf/kafka.toml)
    topic = kafka.topic(partitions=2)
    kafka.produce(topic, orders(0, 200))
    target, ckpt = str(tmp_path / "view"), str(tmp_path / "ckpt")
    shipped = (Path("conf") / "kafka.toml").read_text()
    job = tmp_path / "kafka.toml"
    job.write_text(
        shipped.replace('"localhost:9092"', f'"{kafka.bootstrap}"')
        .replace('"orders"', f'"{topic}"')
        .replace('"data/checkpoints/kafka_revenue"', f'"{ckpt}"')
        .replace('"./data/views/kafka_revenue"', f'"{target}"')
    )
    config = JobConfig.load(job)
    config = config.model_copy(
        update={"job": config.job.model_copy(update={"epochs": 1, "trigger_seconds": 0.5})}
    )
    assert [r.outcome for r in run_job(config, stop=threading.Event())] == ["committed"]
    assert main(["verify", "--job", str(job)]) == 0  # a fresh run of the query from earliest
    assert "equals desired" in capsys.readouterr().out
    for starting in ("latest", json.dumps({topic: {"0": -1, "1": 0}})):  # -1: latest, in JSON
        latest = tmp_path / "latest.toml"
        latest.write_text(
            job.read_text().replace("args = {", f"args = {{ starting = {json.dumps(starting)},")
        )
        assert main(["verify", "--job", str(latest)]) == 2, starting
        err = capsys.readouterr().err
        assert "startingOffsets latest" in err and "set startingOffsets to earliest" in err


def kafka_job(tmp_path: Path, kafka: Kafka, topic: str, clock: bool = True) -> Path:
    """conf/kafka.toml for ``topic``, its view and checkpoint under ``tmp_path`` (without
    ``clock = "source_offsets"`` unless ``clock``)."""
    shipped = (Path("conf") / "kafka.toml").read_text()
    job = tmp_path / "kafka.toml"
    text = (
        shipped.replace('"localhost:9092"', f'"{kafka.bootstrap}"')
        .replace('"orders"', f'"{topic}"')
        .replace('"data/checkpoints/kafka_revenue"', f'"{tmp_path / "ckpt"}"')
        .replace('"./data/views/kafka_revenue"', f'"{tmp_path / "view"}"')
    )
    if not clock:
        assert 'clock = "source_offsets"\n' in text
        text = text.replace('clock = "source_offsets"\n', "")
    job.write_text(text)
    return job


def run_once(job: Path) -> None:
    """One epoch of the job file's query."""
    from mvsink.cli.job import JobConfig
    from mvsink.cli.runner import run_job

    config = JobConfig.load(job)
    config = config.model_copy(
        update={"job": config.job.model_copy(update={"epochs": 1, "trigger_seconds": 0.5})}
    )
    assert [r.outcome for r in run_job(config, stop=threading.Event())] == ["committed"]


def verify_job(
    spark: SparkSession, job: Path, tmp_path: Path, scratch: Path | None = None
) -> tuple[Any, Counter[Any]]:
    """``verify --job`` in Python: the verification, and desired as a multiset (computed in
    ``scratch``, else in a folder of its own)."""
    import tempfile

    from mvsink.cli.job import JobConfig
    from mvsink.ops.verify import desired_of_job, verify

    config = JobConfig.load(job)
    with tempfile.TemporaryDirectory(dir=tmp_path) as temporary:
        desired, position = desired_of_job(spark, config, str(scratch or temporary))
        return verify(desired, config.sink.target, config.sink.name, position=position), multiset_of(desired)


def test_verify_job_of_a_view_trailing_its_topic_computes_desired_at_the_views_offsets(
    spark, kafka, tmp_path, monkeypatch, capsys
):
    """Issue 53: a view under the source offsets clock that merely trails its topic used to
    verify as different (desired ran to the topic's end). Desired is computed at the view's
    committed offsets, and verify says how far behind the topic the view is; a view that
    differs at its own offsets still does."""
    from deltalake import DeltaTable

    from mvsink.cli import main

    monkeypatch.syspath_prepend("examples")  # as PYTHONPATH=examples does (conf/kafka.toml)
    topic = kafka.topic(partitions=2)
    kafka.produce(topic, orders(0, 200), key="order_id")
    job = kafka_job(tmp_path, kafka, topic)
    run_once(job)
    view_at = checkpoint_offsets(str(tmp_path / "ckpt"), 0)
    kafka.produce(topic, orders(200, 50), key="order_id")  # nobody reads these
    end = ends(kafka, topic)
    behind = {f"{topic}/{p}": end[topic][p] - view_at[topic].get(p, 0) for p in end[topic]}
    assert sum(behind.values()) == 50

    result, desired = verify_job(spark, job, tmp_path)
    assert desired == revenue_of(spark, kafka, topic, view_at) != revenue_of(spark, kafka, topic, end)
    assert result.ok and result.position is not None and result.position.at_view
    assert result.position.view_offsets == (view_at,)
    assert result.position.behind == behind and result.position.records_behind == 50

    assert main(["verify", "--job", str(job)]) == 0
    out = capsys.readouterr().out
    assert "equals desired at the view's offsets" in out
    assert f"the view is at offsets {json.dumps(view_at, separators=(',', ':'), sort_keys=True)}" in out
    assert "50 record(s) behind its sources' end" in out, out
    assert main(["verify", "--job", str(job), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["equal"] and printed["position"]["records_behind"] == 50
    assert printed["position"]["at_view"] and printed["position"]["behind"] == behind

    # A row of the view deleted: at its own offsets, the view differs.
    DeltaTable(str(tmp_path / "view")).delete("product = 'p3'")
    result, _ = verify_job(spark, job, tmp_path)
    assert not result.ok and (result.missing, result.extra) == (1, 0)
    assert result.missing_sample[0]["product"] == "p3"
    assert result.position is not None and result.position.records_behind == 50
    assert main(["verify", "--job", str(job)]) == 1
    out = capsys.readouterr().out
    assert "differs from desired at the view's offsets: 1 row(s) missing, 0 extra" in out
    assert "50 record(s) behind" in out


def test_verify_job_of_a_view_whose_last_epoch_another_replica_committed(spark, kafka, tmp_path, monkeypatch):
    """The job's checkpoint holds no batch at the view's offsets (a replica with a checkpoint
    of its own committed the view's last epoch): the Kafka offsets are spelled from the
    committed time, and desired is computed there."""
    monkeypatch.syspath_prepend("examples")
    topic = kafka.topic(partitions=2)
    kafka.produce(topic, orders(0, 120), key="order_id")
    job = kafka_job(tmp_path, kafka, topic)
    run_once(job)
    kafka.produce(topic, orders(120, 60), key="order_id")
    other = str(tmp_path / "replica")  # the other replica: ahead of the job's checkpoint
    sink = MVSink(str(tmp_path / "view"), "kafka_revenue", clock="source_offsets", checkpoint=other)
    from kafka_to_view import revenue_by_product  # the job's query

    query = (
        revenue_by_product(spark, kafka.bootstrap, topic)
        .writeStream.outputMode("complete")
        .foreachBatch(sink)
        .option("checkpointLocation", other)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    view_at = checkpoint_offsets(other, 0)
    assert view_at == ends(kafka, topic) != checkpoint_offsets(str(tmp_path / "ckpt"), 0)
    kafka.produce(topic, orders(180, 30), key="order_id")

    result, desired = verify_job(spark, job, tmp_path)
    assert desired == revenue_of(spark, kafka, topic, view_at)
    assert result.ok and result.position is not None and result.position.at_view
    assert result.position.view_offsets == (view_at,) and result.position.records_behind == 30


def test_verify_job_of_a_view_under_the_batch_id_clock_still_runs_to_the_topics_end(
    spark, kafka, tmp_path, monkeypatch, capsys
):
    """Without the source offsets clock the view's offsets are not in its log: desired is
    computed over what the topic holds now, as before, so a trailing view differs."""
    from mvsink.cli import main

    monkeypatch.syspath_prepend("examples")
    topic = kafka.topic(partitions=2)
    kafka.produce(topic, orders(0, 100), key="order_id")
    job = kafka_job(tmp_path, kafka, topic, clock=False)
    run_once(job)
    kafka.produce(topic, orders(100, 20), key="order_id")
    result, desired = verify_job(spark, job, tmp_path)
    assert desired == revenue_of(spark, kafka, topic, ends(kafka, topic))
    assert not result.equal and result.position is None
    assert main(["verify", "--job", str(job)]) == 1
    out = capsys.readouterr().out
    assert "differs from desired: " in out and "offsets" not in out


def test_verify_job_of_a_view_computes_desired_from_where_the_views_query_started(
    spark, kafka, tmp_path, monkeypatch, capsys
):
    """Desired's batch 0 starts at the view's query's initial offsets (its checkpoint's
    ``sources/0/0``), not at the job's startingOffsets as they resolve now: edited since,
    desired is still the view's. A scratch folder used again computes desired afresh. Without
    those initial offsets, desired starts from the job's startingOffsets and says so. Records
    the view read that the topic no longer holds (retention) make desired unknown: an error."""
    from confluent_kafka import TopicPartition

    from mvsink.cli import main
    from mvsink.errors import InputError

    monkeypatch.syspath_prepend("examples")
    topic = kafka.topic(partitions=2)
    kafka.produce(topic, orders(0, 200), key="order_id")
    job = kafka_job(tmp_path, kafka, topic)
    shipped = job.read_text()
    start = {topic: {"0": 10, "1": 10}}
    job.write_text(shipped.replace("args = {", f"args = {{ starting = {json.dumps(json.dumps(start))},"))
    run_once(job)
    ckpt = tmp_path / "ckpt"
    view_at = checkpoint_offsets(str(ckpt), 0)

    def read(ending: dict[str, dict[str, int]]) -> Counter[Any]:
        reader = spark.read.format("kafka").options(**kafka.options(topic))
        raw = reader.option("startingOffsets", json.dumps(start)).option("endingOffsets", json.dumps(ending))
        return multiset_of(revenue(parsed(raw.load(), ORDER)))

    # The job file now starts from earliest: the view's checkpoint still starts it at 10, 10.
    job.write_text(shipped)
    scratch = tmp_path / "scratch"
    result, desired = verify_job(spark, job, tmp_path, scratch)
    assert desired == read(view_at) != revenue_of(spark, kafka, topic, view_at)
    assert result.ok and result.position is not None and result.position.at_view
    assert result.position.reason is None and result.position.records_behind == 0
    assert main(["verify", "--job", str(job)]) == 0
    assert "did not start" not in capsys.readouterr().out

    # The view moves on; the same scratch folder computes desired there, not the last one.
    kafka.produce(topic, orders(200, 40), key="order_id")
    from kafka_to_view import revenue_by_product  # the job's query

    sink = MVSink(str(tmp_path / "view"), "kafka_revenue", clock="source_offsets", checkpoint=str(ckpt))
    query = (
        revenue_by_product(spark, kafka.bootstrap, topic)
        .writeStream.outputMode("complete")
        .foreachBatch(sink)
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    view_at = checkpoint_offsets(str(ckpt), max(int(n) for n in os.listdir(ckpt / "offsets") if n.isdigit()))
    assert view_at == ends(kafka, topic)
    result, desired = verify_job(spark, job, tmp_path, scratch)
    assert desired == read(view_at) and result.ok and result.position is not None
    assert result.position.view_offsets == (view_at,) and result.position.reason is None

    # Spark keeps no progress of desired's batch 0 (the last batch's only): an error.
    kafka.produce(topic, orders(240, 30), key="order_id")  # a batch 1 past the view
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "1")
    try:
        with pytest.raises(InputError, match="numRecentProgressUpdates"):
            verify_job(spark, job, tmp_path)
    finally:
        spark.conf.unset("spark.sql.streaming.numRecentProgressUpdates")

    # The view's checkpoint without its initial offsets: desired from earliest, and it says so.
    initial = ckpt / "sources" / "0" / "0"
    kept = initial.read_bytes()
    initial.unlink()
    try:
        result, desired = verify_job(spark, job, tmp_path)
        assert desired == revenue_of(spark, kafka, topic, view_at) != read(view_at)
        assert not result.equal and result.position is not None and result.position.at_view
        assert result.position.reason is not None and "sources/0/0" in result.position.reason
        earliest = json.dumps({topic: {"0": 0, "1": 0}}, separators=(",", ":"))
        assert f"startingOffsets as they resolve now ({earliest})" in result.position.reason
        assert main(["verify", "--job", str(job)]) == 1
        out = capsys.readouterr().out
        assert "but desired did not start where the view's query started: " in out, out
    finally:
        initial.write_bytes(kept)

    # Retention dropped records the view read: desired there is not known.
    deleted = kafka.admin.delete_records([TopicPartition(topic, 0, 15)])
    for done in deleted.values():
        done.result(60)
    assert main(["verify", "--job", str(job)]) == 2
    assert "the job's query failed" in capsys.readouterr().err


LATE_ORDERS = """
from pyspark.sql import functions as F


def revenue_of_orders_on_time(spark, bootstrap, topic):
    records = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    schema = "order_id long, product string, amount long, at timestamp"
    orders = records.select(F.from_json(F.col("value").cast("string"), schema).alias("o")).select("o.*")
    orders = orders.withWatermark("at", "1 minute").dropDuplicates(["order_id", "at"])
    return orders.groupBy("product").agg(F.sum("amount").alias("revenue"), F.count(F.lit(1)).alias("orders"))
"""


def test_verify_job_of_a_view_whose_query_has_a_watermark_drops_no_row_of_desired(
    spark, kafka, tmp_path, monkeypatch
):
    """The view's batch N ran under a watermark (its events' times so far): desired's batch 0,
    which reads the records of all the view's batches, runs under none, as the view's first
    batch did (its offsets' metadata is the view's batch's but for that), and drops no row the
    view read on time. (Spark 3.4 on drops a batch's late rows by the watermark of the batch
    before it, none for a batch 0; the watermark seeded is what a query's batch 0 has still.)"""
    from mvsink.cli.job import JobConfig

    (tmp_path / "late_orders.py").write_text(LATE_ORDERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    topic = kafka.topic(partitions=2)
    ckpt, target = str(tmp_path / "ckpt"), str(tmp_path / "view")
    job = tmp_path / "late_orders.toml"
    job.write_text(
        "[job]\n"
        'query = "late_orders:revenue_of_orders_on_time"\n'
        f'args = {{ bootstrap = "{kafka.bootstrap}", topic = "{topic}" }}\n'
        'output_mode = "complete"\n'
        f'checkpoint = "{ckpt}"\n'
        "[sink]\n"
        f'target = "{target}"\n'
        'name = "late_orders"\n'
        'clock = "source_offsets"\n'
        f'checkpoint = "{ckpt}"\n'
    )
    query_of = JobConfig.load(job).job.query_of

    def at(second: int) -> str:
        return f"2024-01-01T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}"

    for first, count in ((0, 100), (100, 50)):  # events every 2 s: the second run's all after the first's
        kafka.produce(
            topic, [{**o, "at": at(o["order_id"] * 2)} for o in orders(first, count)], key="order_id"
        )
        sink = MVSink(target, "late_orders", clock="source_offsets", checkpoint=ckpt)
        query = (
            query_of(spark)
            .writeStream.outputMode("complete")
            .foreachBatch(sink)
            .option("checkpointLocation", ckpt)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    last = max(int(n) for n in os.listdir(Path(ckpt, "offsets")) if n.isdigit())
    metadata = json.loads(Path(ckpt, "offsets", str(last)).read_text().splitlines()[1])
    assert metadata["batchWatermarkMs"] > 0  # the view's offsets carry a watermark
    view_at = checkpoint_offsets(ckpt, last)
    assert view_at == ends(kafka, topic)

    scratch = tmp_path / "scratch"
    result, desired = verify_job(spark, job, tmp_path, scratch)
    assert desired == revenue_of(spark, kafka, topic, view_at)
    assert result.ok and result.position is not None and result.position.at_view
    assert result.position.reason is None and result.position.records_behind == 0
    (run,) = scratch.iterdir()
    seeded = json.loads((run / "checkpoint" / "offsets" / "0").read_text().splitlines()[1])
    assert seeded == {**metadata, "batchWatermarkMs": 0}  # its conf and timestamp kept


def test_verify_job_of_a_view_whose_first_batch_started_elsewhere_is_an_error():
    """Where Spark's progress of desired's batch 0 says where a source started (Spark says
    nothing for a query's first batch, but if it does), it must be the initial offsets seeded;
    and its end, the view's offsets."""
    from mvsink.errors import InputError, Where
    from mvsink.ops.verify import _first_batch

    seeded, view = {"t": {"0": 10, "1": 10}}, {"t": {"0": 90, "1": 95}}

    def progress(start: Any, end: Any) -> list[dict[str, Any]]:
        source = {"startOffset": json.dumps(start), "endOffset": json.dumps(end)}
        return [{"batchId": 0, "sources": [source]}, {"batchId": 1, "sources": []}]

    where = Where("v", "t")
    _first_batch(progress(None, view), [view], [seeded], where)  # Spark's way: no start
    _first_batch(progress(seeded, view), [view], [seeded], where)
    _first_batch(progress({"t": {"0": 0, "1": 0}}, view), [view], [None], where)  # not seeded
    with pytest.raises(
        InputError, match=r"started, \{\"t\":\{\"0\":10,\"1\":10\}\}, but its first batch started at"
    ):
        _first_batch(progress({"t": {"0": 0, "1": 0}}, view), [view], [seeded], where)
    with pytest.raises(InputError, match="but its first batch ended at"):
        _first_batch(progress(None, {"t": {"0": 90, "1": 96}}), [view], [seeded], where)
    with pytest.raises(InputError, match="its progress holds none of its first batch"):
        _first_batch(progress(None, view)[1:], [view], [seeded], where)
