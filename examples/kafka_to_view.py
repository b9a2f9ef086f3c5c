"""Keep a view of a Kafka topic: revenue per product, from a topic of JSON orders such as
``{"order_id": 1, "product": "p1", "amount": 5}``.

    spark-submit --packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0 \\
        examples/kafka_to_view.py --bootstrap localhost:9092 --topic orders \\
        --target ./data/views/kafka_revenue --checkpoint ./data/checkpoints/kafka_revenue

(on Spark 3.5: ``org.apache.spark:spark-sql-kafka-0-10_2.12:3.5.7``, or your Spark's own
version). The same as a job file, ``conf/kafka.toml``:

    PYTHONPATH=examples mvsink run conf/kafka.toml \\
        --conf spark.jars.packages=org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0

The query reads the topic from ``earliest``: a complete view is an aggregate of everything
the topic held, so its first run must read it all (docs/kafka.md). Replicas of this job, each
with its own checkpoint, keep one view: their epochs are compared by Kafka's offsets
(``clock="source_offsets"``).
"""

from __future__ import annotations

import argparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mvsink import MVSink

ORDER = "order_id long, product string, amount decimal(10,2)"


def revenue_by_product(
    spark: SparkSession, bootstrap: str, topic: str, starting: str = "earliest"
) -> DataFrame:
    """The view's query: ``product, revenue, orders`` over every order in ``topic``."""
    records = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", starting)
        .load()
    )
    orders = records.select(F.from_json(F.col("value").cast("string"), ORDER).alias("o")).select("o.*")
    return orders.groupBy("product").agg(F.sum("amount").alias("revenue"), F.count(F.lit(1)).alias("orders"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True, help="Kafka's bootstrap servers")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--target", required=True, help="the view's Delta table (a path or a catalog name)")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint folder")
    parser.add_argument("--name", default="kafka_revenue", help="the view's name in the table's log")
    args = parser.parse_args()
    # A stateful query keeps its shuffle partitions in its checkpoint for good: Spark's 200
    # would be 200 state stores an epoch for a view of a few products.
    spark = (
        SparkSession.builder.appName("kafka-to-view")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    sink = MVSink(args.target, args.name, clock="source_offsets", checkpoint=args.checkpoint)
    query = (
        revenue_by_product(spark, args.bootstrap, args.topic)
        .writeStream.outputMode("complete")
        .foreachBatch(sink)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime="10 seconds")
        .start()
    )
    query.awaitTermination()


if __name__ == "__main__":
    main()
