"""The embedded default job: revenue per product from a stream of generated orders.

``feed_orders`` writes the next file of orders (JSON lines) into a folder; the job runs it
before the query starts and after each epoch (``[job] feed``), and the query reads the folder
with Spark's file source. Order ``n`` is of product ``p<n % 5>``, worth ``n % 7 + 1``. The
view is revenue and order count per product, kept by ``outputMode("complete")`` and
``MVSink``. The folder holds every order the view read, so ``mvsink verify --job`` can
compute desired again from it.
"""

from __future__ import annotations

import json
import os
import uuid

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

ORDERS = "data/orders"
ORDER_SCHEMA = "order_id long, product string, amount decimal(10,2)"
ORDERS_PER_FILE = 20


def feed_orders(spark: SparkSession, orders: str = ORDERS) -> None:
    """Write the next ``ORDERS_PER_FILE`` orders into the folder ``orders`` as one file,
    whole (written under a hidden name, then renamed: Spark never lists a part of it)."""
    os.makedirs(orders, exist_ok=True)
    n = sum(1 for name in os.listdir(orders) if name.endswith(".json"))
    first = n * ORDERS_PER_FILE
    lines = [
        json.dumps({"order_id": i, "product": f"p{i % 5}", "amount": i % 7 + 1})
        for i in range(first, first + ORDERS_PER_FILE)
    ]
    hidden = os.path.join(orders, f".{uuid.uuid4().hex}.tmp")
    with open(hidden, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    os.replace(hidden, os.path.join(orders, f"orders-{n:06d}.json"))


def order_stream(spark: SparkSession, orders: str = ORDERS) -> DataFrame:
    """The stream of the orders in the folder ``orders``."""
    os.makedirs(orders, exist_ok=True)  # the query waits for the first file
    return spark.readStream.schema(ORDER_SCHEMA).json(orders)


def revenue_query(spark: SparkSession, orders: str = ORDERS) -> DataFrame:
    """The demo view: ``product, revenue, orders``."""
    return (
        order_stream(spark, orders)
        .groupBy("product")
        .agg(F.sum("amount").alias("revenue"), F.count(F.lit(1)).alias("orders"))
    )


def latest_order_query(spark: SparkSession, orders: str = ORDERS) -> DataFrame:
    """For ``outputMode("update")`` and upsert mode: per product, its latest order and total.

    Each micro-batch holds only the products that had new orders: their new rows.
    """
    return (
        order_stream(spark, orders)
        .groupBy("product")
        .agg(
            F.max("order_id").alias("last_order"),
            F.sum("amount").alias("revenue"),
        )
    )


def orders_query(spark: SparkSession, orders: str = ORDERS) -> DataFrame:
    """For append mode: the order stream itself, one row per order, never changed."""
    return order_stream(spark, orders).withColumn(
        "region", F.concat(F.lit("region "), (F.col("order_id") % 3).cast("string"))
    )
