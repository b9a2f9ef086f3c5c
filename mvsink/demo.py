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

from mvsink.errors import ConfigError

ORDERS = "data/orders"
ORDER_SCHEMA = "order_id long, product string, amount decimal(10,2)"
ORDERS_PER_FILE = 20


def feed_orders(spark: SparkSession, orders: str = ORDERS) -> None:
    """Write the next ``ORDERS_PER_FILE`` orders into the folder ``orders`` as one new file,
    whole: written under a hidden name (Spark lists none), then linked to the next free
    number, never over an existing file."""
    os.makedirs(orders, exist_ok=True)
    hidden = os.path.join(orders, f".{uuid.uuid4().hex}.tmp")
    n = max((_number(name) for name in os.listdir(orders)), default=-1) + 1
    try:
        while True:
            first = n * ORDERS_PER_FILE
            lines = [
                json.dumps({"order_id": i, "product": f"p{i % 5}", "amount": i % 7 + 1})
                for i in range(first, first + ORDERS_PER_FILE)
            ]
            with open(hidden, "w") as fh:
                fh.write("\n".join(lines) + "\n")
            try:
                os.link(hidden, os.path.join(orders, f"orders-{n:06d}.json"))
                return
            except FileExistsError:
                n += 1  # another feeder took this number
    finally:
        os.unlink(hidden)


def _number(name: str) -> int:
    stem = name.removeprefix("orders-").removesuffix(".json")
    return int(stem) if name.startswith("orders-") and stem.isdigit() else -1


def order_stream(spark: SparkSession, orders: str = ORDERS) -> DataFrame:
    """The stream of the orders in the folder ``orders``, which its feed writes."""
    if not os.path.isdir(orders) or not any(_number(n) >= 0 for n in os.listdir(orders)):
        raise ConfigError(
            f"the demo's orders folder {orders!r} holds no orders: the demo's queries read the "
            "files its feed writes (job feed = 'mvsink.demo:feed_orders', args = { orders = ... })"
        )
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
