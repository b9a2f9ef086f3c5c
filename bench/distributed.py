"""The distributed path at scale, and what a restart costs (issue: views bigger than the driver).

A view of N rows ``(id bigint, k int, x double, s string)``, 0.1% of rows changing per epoch
(spread at random, or ``--pattern keyed``: one run of keys). Reports, on this machine:

* mvsink with ``placement="distributed"``: seconds per epoch, bytes written, split by phase;
* a Spark write of the whole view as Parquet (what an overwrite costs when the view does not
  fit the driver: no collect, every row written);
* the Python driver process's peak RSS (the JVM's heap is set by spark.driver.memory);
* restart: loading the stored index of the whole table on the driver (what a restarted driver
  path pays) against reading the whole table through the I/O layer, and against the old
  restart (read and hash every file).

    python bench/distributed.py --rows 20000000 --epochs 3
    python bench/distributed.py --rows 10000000 --restart-only [--wide 4]
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
from mvsink.cli.session import local_session
from mvsink.errors import Where
from mvsink.table.delta import load_snapshot
from mvsink.table.fingerprint import fingerprints
from mvsink.table.index import DriverIndex, StoredIndex
from mvsink.table.schema import arrow_schema, target_struct


def desired(
    spark: SparkSession, rows: int, percent: float, epoch: int, wide: int = 0, pattern: str = "random"
) -> DataFrame:
    """The view at ``epoch``; ``wide`` adds that many more columns (a string and a double
    each), for tables nearer production widths. ``pattern``: the changed rows spread at
    random, or one run of keys (``keyed``)."""
    bump = F.lit(0)
    width = int(rows * percent / 100)
    for e in range(1, epoch + 1):
        if pattern == "random":
            moved = (F.abs(F.xxhash64(F.col("id"), F.lit(e))) % 100_000) < int(percent * 1000)
        else:
            start = (e * 7919 * width) % max(1, rows - width)
            moved = (F.col("id") >= start) & (F.col("id") < start + width)
        bump = bump + F.when(moved, 1).otherwise(0)
    extra = []
    for i in range(wide):
        extra.append(
            F.concat(F.lit(f"c{i}-"), F.xxhash64(F.col("id"), F.lit(i)).cast("string")).alias(f"t{i}")
        )
        extra.append((F.col("id") * (i + 1) / 3).alias(f"d{i}"))
    return spark.range(rows).select(
        F.col("id"),
        (F.col("id") % 7).cast("int").alias("k"),
        (F.col("id") / 2 + bump).alias("x"),
        F.concat(F.lit("s-"), F.col("id").cast("string")).alias("s"),
        *extra,
    )


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def restart_costs(target: str, name: str) -> dict[str, float]:
    sink = MVSink(target, name)
    snap = load_snapshot(target, f"mvsink:{name}", {}, Where())
    assert snap.schema_json is not None
    schema = arrow_schema(target_struct(snap.schema_json))
    stored = StoredIndex.of(sink.store, name, schema)

    def index_load() -> None:
        DriverIndex().sync(stored, snap, schema, Where())

    def full_read() -> int:
        with ThreadPoolExecutor(8) as pool:
            return sum(pool.map(lambda f: sink.store.read(f, schema, snap.partition_by).num_rows, snap.files))

    def read_and_hash() -> None:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda f: fingerprints(sink.store.read(f, schema, snap.partition_by)), snap.files))

    # Each three times, interleaved (the first run of anything in a process pays extra): medians.
    timings: dict[str, list[float]] = {"index_load_s": [], "full_read_s": [], "read_and_hash_s": []}
    for _ in range(3):
        for name, step in (
            ("index_load_s", index_load),
            ("full_read_s", full_read),
            ("read_and_hash_s", read_and_hash),
        ):
            start = time.monotonic()
            step()
            timings[name].append(time.monotonic() - start)
    out = {name: statistics.median(values) for name, values in timings.items()}
    out["first_index_load_s"] = timings["index_load_s"][0]
    rows = full_read()
    out["rows"] = rows
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--percent", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--file-rows", type=int, default=50_000)
    parser.add_argument("--driver-memory", default="8g")
    parser.add_argument("--wide", type=int, default=0, help="extra (string, double) column pairs")
    parser.add_argument("--pattern", choices=["random", "keyed"], default="random")
    parser.add_argument("--restart-only", action="store_true", help="load the view, measure a restart")
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
    load = sink(desired(spark, args.rows, args.percent, 0, args.wide), 0)
    results["initial_load_s"] = round(time.monotonic() - start, 2)
    results["table_bytes"] = load.bytes_written
    if args.restart_only:
        results["restart"] = {k: round(v, 2) for k, v in restart_costs(target, "bench").items()}
        print(json.dumps(results, indent=2))
        shutil.rmtree(work, ignore_errors=True)
        return
    epochs = []
    for epoch in range(1, args.epochs + 1):
        start = time.monotonic()
        report = sink(desired(spark, args.rows, args.percent, epoch, args.wide, args.pattern), epoch)
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
        desired(spark, args.rows, args.percent, epoch, args.wide, args.pattern).write.mode(
            "overwrite"
        ).parquet(out)
        overwrite.append(time.monotonic() - start)
        shutil.rmtree(out)
    results["spark_overwrite_s"] = round(statistics.median(overwrite), 2)
    results["ratio_to_spark_overwrite"] = round(
        results["median_epoch_s"] / max(1e-9, statistics.median(overwrite)), 2
    )
    results["python_driver_peak_rss_mb"] = round(peak_rss_mb(), 1)
    results["restart"] = {k: round(v, 2) for k, v in restart_costs(target, "bench").items()}
    print(json.dumps(results, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
