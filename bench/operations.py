"""Operations at scale (issue: running it in production): what each costs, on this machine.

A complete-mode view of N rows ``(id bigint, k int, x double, s string)`` written in files of
``--file-rows`` rows, then:

* quiet epochs (desired unchanged): seconds per epoch and Delta versions created, with
  ``heartbeat=0`` (every epoch commits) and the default ``"10m"`` (none commit);
* an epoch changing 0.1% of rows, then the exact change feed of that version (``mvsink-delta``
  ``mode=changes``): seconds and rows out, against the rows of the files it rewrote;
* ``status`` (log only), ``verify`` (re-reads and hashes the table), ``compact`` of small
  files left by insert-only epochs, and ``vacuum`` (dry run).

    python bench/operations.py --rows 2000000
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mvsink import MVSink, status, vacuum, verify
from mvsink.cli.session import local_session
from mvsink.ops.compact import compact
from mvsink.sources.reader import register


def view(spark: SparkSession, rows: int, epoch: int) -> DataFrame:
    moved = (F.abs(F.xxhash64(F.col("id"), F.lit(epoch))) % 1000) == 0 if epoch else F.lit(False)
    return spark.range(rows).select(
        F.col("id"),
        (F.col("id") % 7).cast("int").alias("k"),
        (F.col("id") / 2 + F.when(moved, 1).otherwise(0)).alias("x"),
        F.concat(F.lit("s-"), F.col("id").cast("string")).alias("s"),
    )


def timed(action):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    result = action()
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--file-rows", type=int, default=50_000)
    parser.add_argument("--quiet", type=int, default=5, help="quiet epochs per heartbeat setting")
    args = parser.parse_args()
    spark = local_session("mvsink-bench-ops", conf={"spark.driver.memory": "4g"})
    register(spark)
    root = Path(tempfile.mkdtemp(prefix="mvsink-ops-"))
    figures: dict[str, object] = {"rows": args.rows, "file_rows": args.file_rows}
    try:
        target = str(root / "view")
        desired = view(spark, args.rows, 0).cache()
        desired.count()
        _, figures["initial_load_s"] = timed(
            lambda: MVSink(target, "v", max_rows_per_file=args.file_rows, heartbeat=0)(desired, 0)
        )
        epoch = 1
        for heartbeat in (0, "10m"):
            sink = MVSink(target, "v", max_rows_per_file=args.file_rows, heartbeat=heartbeat)
            sink(desired, epoch)  # warm the driver's index
            epoch += 1
            before = status(target).table_version
            times = []
            for _ in range(args.quiet):
                _, s = timed(lambda: sink(desired, epoch))  # noqa: B023
                times.append(s)
                epoch += 1
            after = status(target).table_version
            figures[f"quiet_epoch_s[heartbeat={heartbeat}]"] = round(sorted(times)[len(times) // 2], 3)
            figures[f"versions_per_{args.quiet}_quiet_epochs[heartbeat={heartbeat}]"] = int(after or 0) - int(
                before or 0
            )
        changed = view(spark, args.rows, 1)
        report, figures["epoch_0.1pct_s"] = timed(lambda: MVSink(target, "v", heartbeat=0)(changed, epoch))
        figures["epoch_0.1pct"] = {"inserted": report.inserted, "retracted": report.retracted}
        start = report.version
        feed = (
            spark.readStream.format("mvsink-delta")
            .option("path", target)
            .option("mode", "changes")
            .option("startingVersion", str(start))
            .load()
        )
        out: list[int] = []
        query = (
            feed.writeStream.foreachBatch(lambda df, _: out.append(df.count()))
            .option("checkpointLocation", str(root / "feed-ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        _, figures["change_feed_of_that_version_s"] = timed(lambda: query.awaitTermination())
        figures["change_feed_rows"] = sum(out)
        _, figures["status_s"] = timed(lambda: status(target))
        result, figures["verify_s"] = timed(lambda: verify(changed, target, "v"))
        figures["verify_equal"] = result.equal
        small = str(root / "small")
        sink = MVSink(small, "s", max_rows_per_file=args.file_rows, heartbeat=0)
        step = max(1, args.rows // 200)
        for e in range(20):  # 20 insert-only epochs: 20 small files
            sink(view(spark, step * (e + 1), 0), e)
        done, figures["compact_20_small_files_s"] = timed(
            lambda: compact(small, "s", max_rows_per_file=args.file_rows)
        )
        figures["compact"] = str(done)
        _, figures["vacuum_dry_run_s"] = timed(lambda: vacuum(target))
        print(json.dumps(figures, indent=2))
    finally:
        shutil.rmtree(root, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
