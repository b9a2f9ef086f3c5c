"""The embedded default job: revenue per product from a stream of generated orders.

Spark's ``rate`` source yields ``(timestamp, value)`` rows; each becomes an order of product
``p<value % 5>`` worth ``value % 7 + 1``. The view is revenue and order count per product,
kept by ``outputMode("complete")`` and ``MVSink``.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F


def orders(spark: SparkSession, rows_per_second: int = 20) -> DataFrame:
    rate = spark.readStream.format("rate").option("rowsPerSecond", rows_per_second).load()
    return rate.select(
        F.col("value").alias("order_id"),
        F.concat(F.lit("p"), (F.col("value") % 5).cast("string")).alias("product"),
        (F.col("value") % 7 + 1).cast("decimal(10,2)").alias("amount"),
    )


def revenue_query(spark: SparkSession) -> DataFrame:
    """The demo view: ``product, revenue, orders``."""
    return (
        orders(spark)
        .groupBy("product")
        .agg(F.sum("amount").alias("revenue"), F.count(F.lit(1)).alias("orders"))
    )


def latest_order_query(spark: SparkSession) -> DataFrame:
    """For ``outputMode("update")`` and upsert mode: per product, its latest order and total.

    Each micro-batch holds only the products that had new orders: their new rows.
    """
    return (
        orders(spark)
        .groupBy("product")
        .agg(
            F.max("order_id").alias("last_order"),
            F.sum("amount").alias("revenue"),
        )
    )


def orders_query(spark: SparkSession) -> DataFrame:
    """For append mode: the order stream itself, one row per order, never changed."""
    return orders(spark).withColumn(
        "region", F.concat(F.lit("region "), (F.col("order_id") % 3).cast("string"))
    )
