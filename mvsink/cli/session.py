"""A local SparkSession configured the way mvsink's jobs, demo and tests run it."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark import SparkConf
from pyspark.sql import SparkSession

DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # On local disk, skip the .crc side files Hadoop's checksummed file system writes.
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
}


def local_session(
    app_name: str = "mvsink", master: str = "local[2]", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """Get or create a SparkSession with mvsink's defaults, ``conf`` overriding them."""
    # Python workers must run this interpreter, which has pyarrow (not whatever is on PATH).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # A local job needs no routable address; this also silences Spark's loopback warning.
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    # Under spark-submit the master comes from the command line: do not override it.
    if SparkConf().get("spark.master", None) is None:
        builder = builder.master(master)
    for key, value in {**DEFAULTS, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
