"""Small epochs through the delta-spark engine, against Delta's own writers, per epoch.

A 1,000-row view ``(id bigint, k int, x double, s string)`` on a table a Spark platform made
with deletion vectors and Change Data Feed on; each later epoch changes ``--changes`` rows.
In each round, fresh tables, and in turn (the order alternates between rounds, so neither side
always pays the JVM's warm-up):

* mvsink: ``MVSink(engine="delta-spark")`` fed the view, complete mode;
* delta: Delta's own first write of the view (``df.write.format("delta").mode("append")``),
  then for each later epoch Delta's own ``MERGE`` of the changed rows (update matched).

The first epoch is reported apart from the later ones (median); mvsink's phases of each epoch
say where its seconds go.

    env -u JDK_JAVA_OPTIONS MVSINK_DELTA_JARS=.jvm/delta-4.4 .venv-delta/bin/python \\
        bench/jvm_small.py --rows 1000 --changes 3 --epochs 5 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jvm_engine import session
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mvsink import MVSink

PROPERTIES = "'delta.enableDeletionVectors' = 'true', 'delta.enableChangeDataFeed' = 'true'"


def view(spark: SparkSession, rows: int, changes: int, epoch: int) -> DataFrame:
    """The view at ``epoch``: ``changes`` rows' ``x`` moved at each epoch after the first."""
    bump = F.lit(0)
    for e in range(1, epoch + 1):
        start = (e * 37) % max(1, rows - changes)
        bump = bump + F.when((F.col("id") >= start) & (F.col("id") < start + changes), 1).otherwise(0)
    return spark.range(rows).select(
        F.col("id"),
        (F.col("id") % 7).cast("int").alias("k"),
        (F.col("id") / 2 + bump).alias("x"),
        F.concat(F.lit("s-"), F.col("id").cast("string")).alias("s"),
    )


def changed(spark: SparkSession, rows: int, changes: int, epoch: int) -> DataFrame:
    start = (epoch * 37) % max(1, rows - changes)
    return view(spark, rows, changes, epoch).where((F.col("id") >= start) & (F.col("id") < start + changes))


def create(spark: SparkSession, path: str) -> None:
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id bigint, k int, x double, s string) USING delta "
        f"TBLPROPERTIES ({PROPERTIES})"
    )


def merge(spark: SparkSession, path: str, df: DataFrame) -> None:
    df.createOrReplaceTempView("changed_now")
    spark.sql(
        f"MERGE INTO delta.`{path}` t USING changed_now s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    ).collect()


def one_round(spark: SparkSession, root: str, args: argparse.Namespace, mvsink_first: bool) -> dict[str, Any]:
    paths = {name: os.path.join(root, name) for name in ("mvsink", "delta")}
    for path in paths.values():
        create(spark, path)
    sink = MVSink(paths["mvsink"], "bench", engine="delta-spark")
    out: dict[str, Any] = {"mvsink": [], "delta": [], "phases": []}
    for epoch in range(args.epochs + 1):
        df = view(spark, args.rows, args.changes, epoch).cache()
        df.count()
        delta_df = (changed(spark, args.rows, args.changes, epoch) if epoch else df).cache()
        delta_df.count()

        def run_mvsink(df: DataFrame = df, epoch: int = epoch) -> None:
            t = time.perf_counter()
            sink(df, epoch)
            out["mvsink"].append(time.perf_counter() - t)
            out["phases"].append(dict(sink.reports[-1].phases))

        def run_delta(delta_df: DataFrame = delta_df, epoch: int = epoch) -> None:
            t = time.perf_counter()
            if epoch == 0:
                delta_df.write.format("delta").mode("append").save(paths["delta"])
            else:
                merge(spark, paths["delta"], delta_df)
            out["delta"].append(time.perf_counter() - t)

        for step in (run_mvsink, run_delta) if mvsink_first else (run_delta, run_mvsink):
            step()
        df.unpersist()
        delta_df.unpersist()
        phases = ", ".join(f"{k} {v:.2f}" for k, v in out["phases"][-1].items() if v >= 0.05)
        print(
            f"  epoch {epoch}: mvsink {out['mvsink'][-1]:.2f}s  delta {out['delta'][-1]:.2f}s  ({phases})",
            flush=True,
        )
    expected = sorted(map(tuple, view(spark, args.rows, args.changes, args.epochs).collect()))
    for name, path in paths.items():
        got = sorted(map(tuple, spark.read.format("delta").load(path).collect()))
        if got != expected:
            sys.exit(f"{name}'s table is not the view after the last epoch")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000)
    p.add_argument("--changes", type=int, default=3)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="bench/out")
    args = p.parse_args()
    spark = session()
    rounds = []
    try:
        for r in range(args.rounds):
            root = tempfile.mkdtemp(prefix="mvsink-bench-jvm-small-")
            try:
                print(f"round {r} ({'mvsink' if r % 2 == 0 else 'delta'} first)", flush=True)
                rounds.append(one_round(spark, root, args, mvsink_first=r % 2 == 0))
            finally:
                shutil.rmtree(root, ignore_errors=True)
    finally:
        spark.stop()
    # Each system's fastest round (the machine is shared), the first round aside when there
    # are more: it pays the JVM's warm-up for whichever went first.
    kept = rounds[1:] if len(rounds) > 1 else rounds
    summary = {}
    for name in ("mvsink", "delta"):
        summary[name] = {
            "first_s": min(r[name][0] for r in kept),
            "later_s": min(statistics.median(r[name][1:]) for r in kept) if args.epochs else 0.0,
        }
    first = summary["mvsink"]["first_s"] / summary["delta"]["first_s"]
    later = summary["mvsink"]["later_s"] / summary["delta"]["later_s"] if args.epochs else float("nan")
    print(
        f"first epoch: mvsink {summary['mvsink']['first_s']:.2f}s, Delta's first write "
        f"{summary['delta']['first_s']:.2f}s ({first:.2f}x); later epochs (median): mvsink "
        f"{summary['mvsink']['later_s']:.2f}s, Delta's MERGE {summary['delta']['later_s']:.2f}s "
        f"({later:.2f}x)"
    )
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"jvm-small-{args.rows}-{args.changes}.json"), "w") as fh:
        json.dump({"args": vars(args), "summary": summary, "rounds": rounds}, fh, indent=1)


if __name__ == "__main__":
    main()
