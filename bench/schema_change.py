"""The epoch that changes a view's query, against what a Spark user runs instead.

A complete view of N rows (``complete_mode.desired``: id, k, x, s), then its query with a
column added (``tier``: set in P% of the rows, null in the rest) or with ``k`` widened from
int to long. Timed: the epoch that changes the schema, desired cached in Spark before, and
the bytes it writes (every file that appeared under the table: data and mvsink's index), by:

* mvsink, ``engine="delta-rs"``: the commit replaces every file (delta-rs commits a schema
  only so);
* mvsink, ``engine="delta-spark"``: the new schema beside the correction;
* overwrite: ``df.write.format("delta").mode("overwrite").option("overwriteSchema", "true")``,
  complete mode's own way to take a new query;
* merge: ``MERGE WITH SCHEMA EVOLUTION`` keyed on ``id`` (update changed rows, insert new,
  delete missing), what a hand-written ``foreachBatch`` + MERGE does.

Then one steady epoch of the new query for each. Runs in the interop virtualenv:

    MVSINK_DELTA_JARS=.jvm/delta-4.4 .venv-delta/bin/python bench/schema_change.py \\
        --rows 2000000 --percent 1 --change add
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from complete_mode import desired
from jvm_engine import session, table_bytes, timed
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mvsink import MVSink


def changed(spark: SparkSession, rows: int, percent: float, change: str) -> DataFrame:
    base = desired(spark, rows, 0.0, "random", 0, False)
    if change == "widen":
        return base.withColumn("k", F.col("k").cast("long"))
    every = max(1, round(100 / percent)) if percent > 0 else 0
    tier = F.when(F.col("id") % every == 0, F.lit("gold")) if every else F.lit(None).cast("string")
    return base.withColumn("tier", tier)


def merge(spark: SparkSession, path: str, df: DataFrame, change: str) -> None:
    """A keyed MERGE that touches only rows that differ: the old columns compared, and, for an
    added column, the rows where it is set (the target has no such column to compare yet)."""
    df.createOrReplaceTempView("desired_now")
    differs = "NOT (t.k <=> s.k AND t.x <=> s.x AND t.s <=> s.s)"
    if change == "add":
        differs += " OR s.tier IS NOT NULL"
    spark.sql(
        f"MERGE WITH SCHEMA EVOLUTION INTO delta.`{path}` t USING desired_now s ON t.id = s.id "
        f"WHEN MATCHED AND ({differs}) THEN UPDATE SET * "
        "WHEN NOT MATCHED THEN INSERT * WHEN NOT MATCHED BY SOURCE THEN DELETE"
    ).collect()


def overwrite(df: DataFrame, path: str) -> None:
    df.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)


def run(args: argparse.Namespace) -> dict[str, Any]:
    spark = session()
    root = tempfile.mkdtemp(prefix="mvsink-bench-schema-")
    try:
        paths = {n: os.path.join(root, n) for n in ("delta-rs", "delta-spark", "overwrite", "merge")}
        sinks = {
            n: MVSink(paths[n], "bench", engine=n, schema_changes="evolve", max_rows_per_file=args.file_rows)
            for n in ("delta-rs", "delta-spark")
        }
        first = desired(spark, args.rows, 0.0, "random", 0, False).cache()
        first.count()
        for sink in sinks.values():
            sink(first, 0)
        overwrite(first, paths["overwrite"])
        overwrite(first, paths["merge"])
        first.unpersist()
        out: dict[str, Any] = {"args": vars(args), "table_MB": table_bytes(paths["overwrite"]) / 1e6}
        new = changed(spark, args.rows, args.percent, args.change).cache()
        new.count()
        for epoch in (1, 2):  # the change, then a steady epoch of the new query
            row: dict[str, Any] = {}
            for name, sink in sinks.items():
                row[name] = timed(paths[name], sink, new, epoch)
                report = sink.reports[-1]
                row[name].update(whole=report.whole, removed=report.files_removed, added=report.files_added)
            row["overwrite"] = timed(paths["overwrite"], overwrite, new, paths["overwrite"])
            try:
                row["merge"] = timed(paths["merge"], merge, spark, paths["merge"], new, args.change)
            except Exception as exc:  # Delta refuses some changes a MERGE would need
                row["merge"] = {"s": float("nan"), "bytes": 0, "error": str(exc).splitlines()[0][:300]}
            out[f"epoch{epoch}"] = row
            print(
                f"epoch {epoch}: "
                + "  ".join(f"{k} {v['s']:.2f}s {v['bytes'] / 1e6:.1f}MB" for k, v in row.items()),
                flush=True,
            )
        exact = {}
        for name, path in paths.items():
            held = spark.read.format("delta").load(path)
            exact[name] = sorted(held.columns) == sorted(new.columns) and (
                held.exceptAll(new.select(*held.columns)).count() == 0
                and new.select(*held.columns).exceptAll(held).count() == 0
            )
        out["equals_desired"] = exact
        print("equals desired:", exact)
        return out
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--percent", type=float, default=1.0)
    p.add_argument("--change", choices=["add", "widen"], default="add")
    p.add_argument("--file-rows", type=int, default=50_000)
    p.add_argument("--out", default="bench/out")
    args = p.parse_args()
    result = run(args)
    os.makedirs(args.out, exist_ok=True)
    name = f"schema-{args.change}-{args.rows}-{args.percent}.json"
    with open(os.path.join(args.out, name), "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
