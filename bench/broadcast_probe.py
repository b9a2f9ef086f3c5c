"""Direction 1 of issue 37 measured: decide inserts in the Spark job against a broadcast of the
stored fingerprints, or bring desired's fingerprints to the driver and diff there.

A cached desired of N rows with its two fingerprint lanes; the stored side is N fingerprints
(as the driver's index holds them). Timed, each three times (the first warms the JVM):

* collect: desired's two lanes to the driver as Arrow (what the driver placement does);
* broadcast join: desired left-joined in Spark to a broadcast of the stored side, the stored
  row id of each desired row back (the least a one-scan probe returns), with the stored side
  built from Arrow each epoch, or cached in Spark between epochs, joined on both lanes or on
  the first only.

    python bench/broadcast_probe.py --rows 1500000
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import functions as F

from mvsink.cli.session import local_session
from mvsink.compat import from_arrow, to_arrow
from mvsink.table.fingerprint import FP_A, FP_B, spark_lanes


def timed(action: Callable[[], Any]) -> float:
    start = time.perf_counter()
    action()
    return round(time.perf_counter() - start, 3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_500_000)
    args = p.parse_args()
    spark = local_session("mvsink-bench-probe", conf={"spark.driver.memory": "6g"})
    n = args.rows
    d = spark.range(n).select(F.col("id"), (F.col("id") * 7 % 1000).alias("v"))
    desired = d.select("*", *spark_lanes(d.schema)).persist(StorageLevel.MEMORY_AND_DISK)
    lanes = to_arrow(desired.select(FP_A, FP_B))
    sid = np.arange(n, dtype=np.int32)
    stored = pa.table({FP_A: lanes.column(FP_A), FP_B: lanes.column(FP_B), "sid": sid})
    schema = f"{FP_A} long, {FP_B} long, sid int"
    held = from_arrow(spark, stored, schema).persist(StorageLevel.MEMORY_AND_DISK)
    held.count()
    both = desired.join(F.broadcast(held), [FP_A, FP_B], "left").select("sid")
    one = desired.join(F.broadcast(held.select(FP_A, "sid")), [FP_A], "left").select("sid")
    runs: dict[str, list[float]] = {}
    for _ in range(3):
        runs.setdefault("collect", []).append(timed(lambda: to_arrow(desired.select(FP_A, FP_B))))

        def fresh() -> None:
            side = from_arrow(spark, stored, schema)
            to_arrow(desired.join(F.broadcast(side), [FP_A, FP_B], "left").select("sid"))

        runs.setdefault("broadcast join, stored side from Arrow", []).append(timed(fresh))
        runs.setdefault("broadcast join, stored side cached", []).append(timed(lambda: to_arrow(both)))
        runs.setdefault("broadcast join on the first lane, cached", []).append(timed(lambda: to_arrow(one)))
    print(json.dumps({"rows": n, "seconds (3 runs)": runs}, indent=1))
    spark.stop()


if __name__ == "__main__":
    main()
