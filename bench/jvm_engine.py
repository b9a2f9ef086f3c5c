"""The delta-spark engine against the JVM Delta writers a Spark user has, per epoch.

The view of ``complete_mode.py`` (N rows, K% changing per epoch, at random or in one run of
keys), desired cached in Spark before anything is timed. For each epoch, seconds and bytes
written (every file that appeared under the table: data, deletion vectors, change files,
mvsink's index) by:

* mvsink with ``engine="delta-spark"`` on a table Spark made, with or without deletion vectors;
* overwrite: ``df.write.format("delta").mode("overwrite")`` (complete mode's own sink);
* merge: Delta's keyed ``MERGE INTO`` of the full desired (update changed rows, insert new,
  delete missing), on a table without deletion vectors and on one with them.

Runs in the interop virtualenv (PySpark 4.2 + delta-spark 4.4's jars, ``make test`` makes it):

    MVSINK_DELTA_JARS=../shared/delta-jvm/jars .venv-delta/bin/python bench/jvm_engine.py \\
        --rows 1000000 --percent 1 --pattern random --epochs 3
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from complete_mode import desired, steady_state
from pyspark.sql import DataFrame, SparkSession

from mvsink import MVSink
from mvsink.cli.session import local_session

DV = "'delta.enableDeletionVectors' = 'true'"
NO_DV = "'delta.enableDeletionVectors' = 'false'"


def session() -> SparkSession:
    folder = os.environ.get("MVSINK_DELTA_JARS", os.path.join("..", "shared", "delta-jvm", "jars"))
    jars = sorted(glob.glob(os.path.join(folder, "*.jar")))
    if not jars:
        sys.exit(f"no delta-spark jars in {folder} (set MVSINK_DELTA_JARS)")
    return local_session(
        "mvsink-bench-jvm",
        conf={
            "spark.jars": ",".join(jars),
            "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
            "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
            "spark.databricks.delta.snapshotPartitions": "2",
            "spark.driver.memory": "8g",
        },
    )


def on_disk(path: str) -> dict[str, int]:
    """Every file under the table but its log, with its size."""
    root = Path(path)
    if not root.exists():
        return {}
    found = {}
    for p in root.rglob("*"):
        if p.is_file() and "_delta_log" not in p.parts and not p.name.endswith(".crc"):
            with contextlib.suppress(FileNotFoundError):  # a background delete got there first
                found[str(p.relative_to(root))] = p.stat().st_size
    return found


def timed(path: str, action: Any, *args: Any) -> dict[str, float]:
    before = on_disk(path)
    t = time.perf_counter()
    action(*args)
    secs = time.perf_counter() - t
    after = on_disk(path)
    return {"s": secs, "bytes": sum(size for p, size in after.items() if p not in before)}


def table_bytes(path: str) -> int:
    return sum(size for p, size in on_disk(path).items() if not p.startswith("_mvsink"))


def create(spark: SparkSession, path: str, properties: str) -> None:
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id bigint, k int, x double, s string) USING delta "
        f"TBLPROPERTIES ({properties})"
    )


def merge(spark: SparkSession, path: str, df: DataFrame) -> None:
    df.createOrReplaceTempView("desired_now")
    spark.sql(
        f"MERGE INTO delta.`{path}` t USING desired_now s ON t.id = s.id "
        "WHEN MATCHED AND (t.x <> s.x OR t.k <> s.k OR t.s <> s.s) THEN UPDATE SET * "
        "WHEN NOT MATCHED THEN INSERT * WHEN NOT MATCHED BY SOURCE THEN DELETE"
    ).collect()


def overwrite(df: DataFrame, path: str) -> None:
    df.write.format("delta").mode("overwrite").save(path)


def run(args: argparse.Namespace) -> dict[str, Any]:
    spark = session()
    root = tempfile.mkdtemp(prefix="mvsink-bench-jvm-")
    try:
        paths = {
            name: os.path.join(root, name)
            for name in ("mvsink", "mvsink-dv", "merge", "merge-dv", "overwrite")
        }
        create(spark, paths["mvsink"], NO_DV)
        create(spark, paths["mvsink-dv"], DV)
        create(spark, paths["merge"], NO_DV)
        create(spark, paths["merge-dv"], DV)
        sinks = {
            name: MVSink(paths[name], "bench", engine="delta-spark", max_rows_per_file=args.file_rows)
            for name in ("mvsink", "mvsink-dv")
        }
        results: dict[str, list[dict[str, float]]] = {name: [] for name in paths}
        for epoch in range(args.epochs + 1):
            df = desired(spark, args.rows, args.percent, args.pattern, epoch, False).cache()
            df.count()
            for name, sink in sinks.items():
                results[name].append(timed(paths[name], sink, df, epoch))
                results[name][-1]["phases"] = dict(sink.reports[-1].phases)
            if epoch <= args.merge_epochs:
                for name in ("merge", "merge-dv"):
                    results[name].append(timed(paths[name], merge, spark, paths[name], df))
            results["overwrite"].append(timed(paths["overwrite"], overwrite, df, paths["overwrite"]))
            df.unpersist()
            line = "  ".join(
                f"{k} {v[-1]['s']:.2f}s {v[-1]['bytes'] / 1e6:.2f}MB"
                for k, v in results.items()
                if len(v) > epoch
            )
            print(f"epoch {epoch}: {line}", flush=True)
        size = table_bytes(paths["mvsink-dv"])
        summary = steady_state(results)
        return {"args": vars(args), "table_MB": size / 1e6, "summary": summary, "epochs": results}
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--percent", type=float, default=1.0)
    p.add_argument("--pattern", choices=["random", "keyed"], default="random")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--merge-epochs", type=int, default=3)
    p.add_argument("--file-rows", type=int, default=50_000)
    p.add_argument("--out", default="bench/out")
    args = p.parse_args()
    result = run(args)
    print(f"steady state (epochs 1..N, median); the table holds {result['table_MB']:.1f}MB:")
    over = result["summary"]["overwrite"]["median_s"]
    for name, s in result["summary"].items():
        print(
            f"  {name:10s} {s['median_s']:.2f}s ({s['median_s'] / over:.2f}x overwrite) "
            f"{s['median_MB']:.2f}MB"
        )
    os.makedirs(args.out, exist_ok=True)
    name = f"jvm-{args.pattern}-{args.rows}-{args.percent}.json"
    with open(os.path.join(args.out, name), "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
