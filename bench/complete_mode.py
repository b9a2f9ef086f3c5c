"""Complete mode: mvsink against a full overwrite and a keyed MERGE, per epoch.

A view of N rows ``(id bigint, k int, x double, s string)`` (``--wide``: 20 more columns,
strings and numbers, about 260 bytes a row); each epoch K% of rows change
(``x`` moves), either spread at random over the keys or confined to one run of keys in key
order. Desired is cached in Spark before timing. For each epoch it reports seconds and bytes
written by:

* floor: one Spark scan of the cached desired (a ``noop`` write): no sink can do less;
* mvsink (``MVSink`` fed the cached Spark DataFrame of desired);
* overwrite: ``deltalake.write_deltalake(mode="overwrite")`` of desired as Arrow (what
  Delta's complete-mode sink does; the Spark-to-Arrow conversion is not timed);
* merge: a keyed ``deltalake`` MERGE of the full desired (update changed, insert new, delete
  missing; conversion not timed).

    python bench/complete_mode.py --rows 1000000 --percent 1 --pattern random --epochs 5
    python bench/complete_mode.py --store s3 ...   # all targets on a local S3 server (moto)
    python bench/complete_mode.py --wide --pattern keyed --percent 1 --epochs 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from deltalake import DeltaTable, write_deltalake
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from mvsink import MVSink
from mvsink.cli.session import local_session
from mvsink.compat import to_arrow


def selected(pattern: str, epoch: int, rows: int, percent: float) -> Column:
    """Rows that change at ``epoch`` (epoch 0 is the initial load: none)."""
    ident = F.col("id")
    if pattern == "random":
        return (F.abs(F.xxhash64(ident, F.lit(epoch))) % 10_000) < int(percent * 100)
    width = int(rows * percent / 100)
    start = (epoch * 7919 * width) % max(1, rows - width)
    return (ident >= start) & (ident < start + width)


def desired(
    spark: SparkSession, rows: int, percent: float, pattern: str, epoch: int, wide: bool
) -> DataFrame:
    bumps = [F.when(selected(pattern, e, rows, percent), 1).otherwise(0) for e in range(1, epoch + 1)]
    bump = sum(bumps, F.lit(0)) if bumps else F.lit(0)
    extra = []
    if wide:
        for i in range(10):
            text = F.concat(F.lit(f"attribute-{i}-"), F.col("id").cast("string"))
            extra += [text.alias(f"t{i}"), (F.col("id") * (i + 3) % 1_000_003).alias(f"n{i}")]
    return spark.range(rows).select(
        F.col("id"),
        (F.col("id") % 7).cast("int").alias("k"),
        (F.col("id") / 2 + bump).alias("x"),
        F.concat(F.lit("s-"), F.col("id").cast("string")).alias("s"),
        *extra,
    )


def added_bytes(path: str, version: int, options: dict[str, str]) -> int:
    """Bytes of the files version ``version`` added (from the log's add actions)."""
    dt = DeltaTable(path, version=version, storage_options=options or None)
    previous = set()
    if version > 0:
        before = DeltaTable(path, version=version - 1, storage_options=options or None)
        previous = set(before.get_add_actions().column("path").to_pylist())
    actions = dt.get_add_actions()
    return sum(
        size
        for p, size in zip(
            actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist(), strict=True
        )
        if p not in previous
    )


@contextlib.contextmanager
def store(kind: str) -> Iterator[tuple[str, dict[str, str]]]:
    """A root for the targets and the storage options that reach it."""
    if kind == "local":
        root = tempfile.mkdtemp(prefix="mvsink-bench-")
        try:
            yield root, {}
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.s3server import BUCKET, moto_server

    with moto_server(Path(tempfile.mkdtemp()) / "moto.log") as options:
        yield f"s3://{BUCKET}/bench", options


def run(args: argparse.Namespace) -> dict[str, Any]:
    with store(args.store) as (root, options):
        return _run(args, root, options)


def _run(args: argparse.Namespace, root: str, options: dict[str, str]) -> dict[str, Any]:
    spark = local_session("mvsink-bench", conf={"spark.driver.memory": "6g"})
    results: dict[str, list[dict[str, float]]] = {
        "floor": [],
        "mvsink": [],
        "overwrite": [],
        "collect+overwrite": [],
        "merge": [],
    }
    sink = MVSink(
        f"{root}/mvsink",
        "bench",
        storage_options=options,
        max_rows_per_file=args.file_rows,
        cluster_by=("id",) if args.cluster else (),
    )
    over, merge = f"{root}/overwrite", f"{root}/merge"
    opts = options or None
    for epoch in range(args.epochs + 1):
        df = desired(spark, args.rows, args.percent, args.pattern, epoch, args.wide).persist()
        df.count()
        t = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        results["floor"].append({"s": time.perf_counter() - t, "bytes": 0})
        t = time.perf_counter()
        report = sink(df, epoch)
        results["mvsink"].append(
            {
                "s": time.perf_counter() - t,
                "bytes": report.bytes_written,
                "ins": report.inserted,
                "ret": report.retracted,
                "files_removed": report.files_removed,
                "phases": {k: round(v, 3) for k, v in report.phases.items()},
            }
        )
        t = time.perf_counter()
        arrow = to_arrow(df)
        collect = time.perf_counter() - t
        t = time.perf_counter()
        write_deltalake(over, arrow, mode="overwrite", storage_options=opts)
        secs = time.perf_counter() - t
        size = added_bytes(over, DeltaTable(over, storage_options=opts).version(), options)
        results["overwrite"].append({"s": secs, "bytes": size})
        results["collect+overwrite"].append({"s": secs + collect, "bytes": size})
        if epoch <= args.merge_epochs:
            t = time.perf_counter()
            if epoch == 0:
                write_deltalake(merge, arrow, storage_options=opts)
            else:
                (
                    DeltaTable(merge, storage_options=opts)
                    .merge(arrow, predicate="t.id = s.id", source_alias="s", target_alias="t")
                    .when_matched_update_all(predicate="t.x != s.x OR t.k != s.k OR t.s != s.s")
                    .when_not_matched_insert_all()
                    .when_not_matched_by_source_delete()
                    .execute()
                )
            secs = time.perf_counter() - t
            version = DeltaTable(merge, storage_options=opts).version()
            results["merge"].append({"s": secs, "bytes": added_bytes(merge, version, options)})
        line = f"epoch {epoch}: " + "  ".join(
            f"{k} {v[-1]['s']:.2f}s {v[-1]['bytes'] / 1e6:.1f}MB"
            for k, v in results.items()
            if len(v) > epoch
        )
        phases = " ".join(f"{k}={v:.2f}" for k, v in report.phases.items())
        whole = " (desired written whole)" if getattr(report, "whole", False) else ""
        detail = (
            f"mvsink +{report.inserted} -{report.retracted}, {report.files_removed} files "
            f"rewritten{whole}; {phases}"
        )
        print(f"{line}  ({detail})", flush=True)
        df.unpersist()
    return {"args": vars(args), "summary": steady_state(results), "epochs": results}


def steady_state(results: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per writer, the median seconds and MB written of epochs 1..N (epoch 0 is the load)."""
    return {
        name: {
            "median_s": statistics.median(r["s"] for r in rows[1:]),
            "median_MB": statistics.median(r["bytes"] for r in rows[1:]) / 1e6,
        }
        for name, rows in results.items()
        if len(rows) > 1
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--percent", type=float, default=1.0)
    p.add_argument("--pattern", choices=["random", "keyed"], default="random")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--merge-epochs", type=int, default=2, help="MERGE is slow: epochs to run it for")
    p.add_argument("--file-rows", type=int, default=50_000)
    p.add_argument("--cluster", action="store_true", help="mvsink cluster_by=('id',)")
    p.add_argument("--wide", action="store_true", help="24 columns (about 260 bytes a row)")
    p.add_argument("--store", choices=["local", "s3"], default="local")
    p.add_argument("--out", default="bench/out")
    args = p.parse_args()
    result = run(args)
    print("steady state (epochs 1..N, median):")
    over = result["summary"]["collect+overwrite"]["median_s"]
    for name, s in result["summary"].items():
        ratio = s["median_s"] / over if over else float("nan")
        print(f"  {name:18s} {s['median_s']:.2f}s  {ratio:.2f}x overwrite  {s['median_MB']:.1f}MB written")
    os.makedirs(args.out, exist_ok=True)
    cluster = "-cluster" if args.cluster else ""
    wide = "-wide" if args.wide else ""
    shape = f"{args.store}-{args.pattern}-{args.rows}-{args.percent}-{args.file_rows}{cluster}{wide}"
    name = f"complete-{shape}.json"
    with open(os.path.join(args.out, name), "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
