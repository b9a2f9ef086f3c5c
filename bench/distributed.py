"""The distributed path at scale, and what a restart costs (issue: views bigger than the driver).

A view of N rows ``(id bigint, k int, x double, s string)``, 0.1% of rows changing per epoch
(spread at random). Reports, on this machine:

* mvsink with ``placement="distributed"``: seconds per epoch, bytes written, split by phase;
* a Spark write of the whole view as Parquet (what an overwrite costs when the view does not
  fit the driver: no collect, every row written);
* the Python driver process's peak RSS (the JVM's heap is set by spark.driver.memory);
* restart: loading the stored index of the whole table on the driver (what a restarted driver
  path pays) against reading the whole table through the I/O layer, and against the old
  restart (read and hash every file).

    python bench/distributed.py --rows 20000000 --epochs 3
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mvsink import MVSink
from mvsink.delta import load_snapshot
from mvsink.errors import Where
from mvsink.fingerprint import fingerprints
from mvsink.index import PersistedIndex, StoredIndex
from mvsink.schema import arrow_schema, target_struct
from mvsink.session import local_session


def desired(spark: SparkSession, rows: int, percent: float, epoch: int) -> DataFrame:
    bump = F.lit(0)
    for e in range(1, epoch + 1):
        moved = (F.abs(F.xxhash64(F.col("id"), F.lit(e))) % 100_000) < int(percent * 1000)
        bump = bump + F.when(moved, 1).otherwise(0)
    return spark.range(rows).select(
        F.col("id"),
        (F.col("id") % 7).cast("int").alias("k"),
        (F.col("id") / 2 + bump).alias("x"),
        F.concat(F.lit("s-"), F.col("id").cast("string")).alias("s"),
    )


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def restart_costs(target: str, name: str) -> dict[str, float]:
    sink = MVSink(target, name)
    snap = load_snapshot(target, f"mvsink:{name}", {}, Where())
    assert snap.schema_json is not None
    schema = arrow_schema(target_struct(snap.schema_json))
    stored = StoredIndex.of(sink.store, name, schema)
    out = {}
    start = time.monotonic()
    PersistedIndex().sync(stored, snap, schema, Where())
    out["index_load_s"] = time.monotonic() - start
    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        rows = sum(pool.map(lambda f: sink.store.read(f, schema, snap.partition_by).num_rows, snap.files))
    out["full_read_s"] = time.monotonic() - start
    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda f: fingerprints(sink.store.read(f, schema, snap.partition_by)), snap.files))
    out["read_and_hash_s"] = time.monotonic() - start
    out["rows"] = rows
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--percent", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--file-rows", type=int, default=50_000)
    parser.add_argument("--driver-memory", default="8g")
    args = parser.parse_args()
    spark = local_session(
        "mvsink-bench",
        conf={"spark.driver.memory": args.driver_memory, "spark.driver.maxResultSize": "64m"},
    )
    work = Path(tempfile.mkdtemp(prefix="mvsink-bench-"))
    target = str(work / "view")
    sink = MVSink(target, "bench", placement="distributed", max_rows_per_file=args.file_rows)
    results: dict[str, object] = {"rows": args.rows, "percent": args.percent}
    start = time.monotonic()
    load = sink(desired(spark, args.rows, args.percent, 0), 0)
    results["initial_load_s"] = round(time.monotonic() - start, 2)
    results["table_bytes"] = load.bytes_written
    epochs = []
    for epoch in range(1, args.epochs + 1):
        start = time.monotonic()
        report = sink(desired(spark, args.rows, args.percent, epoch), epoch)
        seconds = time.monotonic() - start
        epochs.append(
            {
                "seconds": round(seconds, 2),
                "inserted": report.inserted,
                "retracted": report.retracted,
                "bytes_written": report.bytes_written,
                "phases": {k: round(v, 2) for k, v in report.phases.items()},
            }
        )
        print(json.dumps(epochs[-1]), flush=True)
    results["epochs"] = epochs
    results["median_epoch_s"] = statistics.median(e["seconds"] for e in epochs)
    results["bytes_share"] = round(
        statistics.median(e["bytes_written"] for e in epochs) / max(1, load.bytes_written), 4
    )
    overwrite = []
    for epoch in range(1, min(3, args.epochs) + 1):
        out = str(work / f"overwrite-{epoch}")
        start = time.monotonic()
        desired(spark, args.rows, args.percent, epoch).write.mode("overwrite").parquet(out)
        overwrite.append(time.monotonic() - start)
        shutil.rmtree(out)
    results["spark_overwrite_s"] = round(statistics.median(overwrite), 2)
    results["python_driver_peak_rss_mb"] = round(peak_rss_mb(), 1)
    results["restart"] = {k: round(v, 2) for k, v in restart_costs(target, "bench").items()}
    print(json.dumps(results, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
