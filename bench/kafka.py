"""Kafka → aggregation → view: events per second a streaming query sustains into mvsink,
beside the same query into Delta's own complete-mode sink, in one run on one broker.

A topic of JSON orders ``{"order_id", "product", "amount"}`` over ``--products`` products is
produced up front (``--events`` events on ``--partitions`` partitions). Then, for each sink,
the query ``groupBy(product).agg(sum(amount), count)`` in complete mode reads the whole topic
from ``earliest`` in ``--epochs`` micro-batches (``maxOffsetsPerTrigger``, trigger
``availableNow``), from a fresh checkpoint into a fresh table. Reported per sink: wall
seconds for all epochs, events per second, seconds per epoch (median), the table's bytes
written, and a check that both views hold the same rows.

* mvsink: ``foreachBatch(MVSink(...))`` (delta-rs commits; each epoch writes the changed rows);
* delta: ``writeStream.format("delta").outputMode("complete")`` (each epoch rewrites the view);
  needs the JVM Delta runtime in the session, so it runs in ``.venv-delta``:

    MVSINK_KAFKA_JARS=.jvm/kafka-4 MVSINK_DELTA_JARS=.jvm/delta-4.4 \\
        .venv-delta/bin/python bench/kafka.py --events 2000000 --products 50000 --epochs 10

Without Delta's jars only mvsink runs. The broker is the tests' (``tests/kafka.py``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mvsink import MVSink
from mvsink.cli.session import local_session
from tests.helpers import multiset
from tests.kafka import BROKER_JARS, Kafka, kafka_broker

ORDER = "order_id long, product string, amount decimal(10,2)"


def produce(kafka: Kafka, topic: str, events: int, products: int) -> float:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 20, "batch.size": 1 << 20})
    started = time.perf_counter()
    for i in range(events):
        value = f'{{"order_id":{i},"product":"p{(i * 7919) % products}","amount":{i % 97 + 1}}}'
        while True:
            try:
                producer.produce(topic, value=value)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 50_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0
    return time.perf_counter() - started


def view(spark: SparkSession, kafka: Kafka, topic: str, per_epoch: int) -> DataFrame:
    raw = (
        spark.readStream.format("kafka")
        .options(**kafka.options(topic))
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", per_epoch)
        .load()
    )
    orders = raw.select(F.from_json(F.col("value").cast("string"), ORDER).alias("o")).select("o.*")
    return orders.groupBy("product").agg(F.sum("amount").alias("revenue"), F.count(F.lit(1)).alias("orders"))


def bytes_under(path: str) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(f"{path}/**/*.parquet", recursive=True))


def run(sink: str, df: DataFrame, root: str) -> dict[str, Any]:
    target, ckpt = f"{root}/{sink}/view", f"{root}/{sink}/ckpt"
    writer = df.writeStream.outputMode("complete").option("checkpointLocation", ckpt)
    if sink == "mvsink":
        writer = writer.foreachBatch(MVSink(target, "bench", checkpoint=ckpt))
    else:
        writer = writer.format("delta").option("path", target)
    started = time.perf_counter()
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    wall = time.perf_counter() - started
    recent = [p if isinstance(p, dict) else json.loads(p.json) for p in query.recentProgress]
    durations = [p["durationMs"]["triggerExecution"] / 1000 for p in recent if p.get("numInputRows")]
    rows = sum(p["numInputRows"] for p in recent)
    return {
        "sink": sink,
        "wall_s": round(wall, 2),
        "events": rows,
        "events_per_s": round(rows / wall),
        "epochs": len(durations),
        "epoch_median_s": round(statistics.median(durations), 3) if durations else None,
        "epoch_max_s": round(max(durations), 3) if durations else None,
        "bytes_written": bytes_under(target),
        "view": multiset(DeltaTable(target).to_pyarrow_table()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--products", type=int, default=50_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument(
        "--sinks", default="mvsink,delta", help="which sinks, in this order (the first warms the JVM)"
    )
    args = parser.parse_args()
    jars = sorted(glob.glob(os.path.join(os.environ.get("MVSINK_KAFKA_JARS", ""), "*.jar")))
    delta = sorted(glob.glob(os.path.join(os.environ.get("MVSINK_DELTA_JARS", ""), "*.jar")))
    if not jars:
        sys.exit("set MVSINK_KAFKA_JARS to a folder of Spark's Kafka source (scripts/jvm_jars.sh kafka-4)")
    conf = {
        "spark.jars": ",".join(jars + delta),
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.memory": "4g",
    }
    if delta:
        conf["spark.sql.extensions"] = "io.delta.sql.DeltaSparkSessionExtension"
        conf["spark.sql.catalog.spark_catalog"] = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    root = tempfile.mkdtemp(prefix="mvsink-bench-kafka-")
    with kafka_broker(BROKER_JARS, Path(root)) as bootstrap:
        kafka = Kafka(bootstrap)
        topic = kafka.topic(partitions=args.partitions)
        produced_s = produce(kafka, topic, args.events, args.products)
        spark = local_session("bench-kafka", conf=conf)
        per_epoch = -(-args.events // args.epochs)
        results = [
            run(sink, view(spark, kafka, topic, per_epoch), root)
            for sink in args.sinks.split(",")
            if sink == "mvsink" or delta
        ]
        summary = {
            "events": args.events,
            "products": args.products,
            "partitions": args.partitions,
            "epochs": args.epochs,
            "produce_s": round(produced_s, 1),
            "same_view": all(r["view"] == results[0]["view"] for r in results),
            "view_rows": sum(results[0]["view"].values()),
            "results": [{k: v for k, v in r.items() if k != "view"} for r in results],
        }
        print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
