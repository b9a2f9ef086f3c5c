"""Upsert mode: mvsink against a keyed delta-rs MERGE of the same change set.

A view of N rows ``(id bigint, k int, x double, s string)`` keyed on ``id``, written once;
then each epoch changes C keys, either clustered (one run of consecutive ids) or scattered
(ids drawn at random). For each epoch it reports seconds, bytes written and files rewritten
for mvsink (``MVSink(mode="upsert", key=["id"])`` fed the change set as a Spark DataFrame) and
for ``DeltaTable.merge`` of the same change set from Arrow (conversion not timed).

``--deletes P``: P% of each epoch's changes are deletes, every row carries a sequence (the
epoch), and mvsink runs with ``sequence_column`` and ``delete_column``, so it keeps
tombstones (the set grows by the deletes of every epoch); the MERGE deletes matched keys,
updates older ones, and keeps no tombstones. ``--placement distributed`` plans in Spark tasks.

``--history``: a second mvsink view of the same change sets keeps a history
(``history_target``), beside the one without: the cost of keeping it per epoch (seconds, and
the bytes its commits add, against the view's own), in the same run. With ``--late P``, P% of
each epoch's changes are late events (a sequence older than the stored one: the view ignores
them, its history records them).

    python bench/upsert_mode.py --rows 10000000 --changes 10000 --pattern scattered
    python bench/upsert_mode.py --rows 2000000 --changes 100000 --deletes 20 --placement distributed
    python bench/upsert_mode.py --rows 2000000 --changes 20000 --deletes 10 --late 5 --history
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F

from mvsink import MVSink
from mvsink.cli.session import local_session
from mvsink.compat import from_arrow, to_arrow


def log_figures(path: str, version: int) -> tuple[int, int]:
    """Bytes added and files removed by one commit."""
    added = removed = 0
    with open(os.path.join(path, "_delta_log", f"{version:020d}.json")) as fh:
        for line in fh:
            action = json.loads(line)
            if "add" in action:
                added += action["add"]["size"]
            if "remove" in action:
                removed += 1
    return added, removed


def changes(
    rows: int,
    count: int,
    pattern: str,
    epoch: int,
    rng: np.random.Generator,
    deletes: float = 0.0,
    late: float = 0.0,
) -> pa.Table:
    if pattern == "clustered":
        start = (epoch * 7919 * count) % (rows - count)
        ids = np.arange(start, start + count, dtype=np.int64)
    else:
        ids = np.sort(rng.choice(rows, size=count, replace=False)).astype(np.int64)
    columns = {
        "id": ids,
        "k": (ids % 7).astype(np.int32),
        "x": ids / 2 + epoch,
        "s": pa.array([f"s-{i}-e{epoch}" for i in ids]),
    }
    if deletes:
        # A late event carries sequence -1: older than any stored row's (or tombstone's).
        late_ones = rng.random(count) < late / 100
        columns["seq"] = np.where(late_ones, -1, epoch).astype(np.int64)
        columns["del"] = (rng.random(count) < deletes / 100) & ~late_ones
    return pa.table(columns)


def run(args: argparse.Namespace) -> dict[str, Any]:
    spark = local_session("mvsink-bench-upsert", conf={"spark.driver.memory": "8g"})
    root = tempfile.mkdtemp(prefix="mvsink-bench-upsert-")
    ours, merged = os.path.join(root, "mvsink"), os.path.join(root, "merge")
    sequenced = {"sequence_column": "seq", "delete_column": "del"} if args.deletes else {}
    common: dict[str, Any] = {
        "mode": "upsert",
        "key": ["id"],
        "max_rows_per_file": args.file_rows,
        "cluster_by": ["id"],
        "placement": args.placement,
        **sequenced,
    }
    sink = MVSink(ours, "bench", **common)
    kept = os.path.join(root, "mvsink-history")
    keeper = MVSink(kept, "bench", history_target=f"{kept}-h", **common) if args.history else None
    rng = np.random.default_rng(7)
    results: dict[str, list[dict[str, float]]] = {"mvsink": [], "merge": []}
    if keeper is not None:
        results["mvsink_history"] = []
    try:
        base = spark.range(args.rows).select(
            F.col("id"),
            (F.col("id") % 7).cast("int").alias("k"),
            (F.col("id") / 2).alias("x"),
            F.concat(F.lit("s-"), F.col("id").cast("string")).alias("s"),
            *([F.lit(0).cast("long").alias("seq"), F.lit(False).alias("del")] if args.deletes else []),
        )
        t = time.perf_counter()
        sink(base, 0)
        print(f"initial load: mvsink {time.perf_counter() - t:.1f}s", flush=True)
        if keeper is not None:
            t = time.perf_counter()
            keeper(base, 0)
            print(f"initial load: mvsink with history {time.perf_counter() - t:.1f}s", flush=True)
        t = time.perf_counter()
        # About as many rows a file as mvsink's (13 bytes a row, compressed), ordered by id.
        write_deltalake(merged, to_arrow(base.drop("del")), target_file_size=args.file_rows * 13)
        print(f"initial load: merge table {time.perf_counter() - t:.1f}s (from Spark via Arrow)", flush=True)
        for epoch in range(1, args.epochs + 1):
            change = changes(args.rows, args.changes, args.pattern, epoch, rng, args.deletes, args.late)
            schema = "id long, k int, x double, s string" + (
                ", seq long, del boolean" if args.deletes else ""
            )
            df = from_arrow(spark, change, schema)
            t = time.perf_counter()
            report = sink(df, epoch)
            results["mvsink"].append(
                {
                    "s": time.perf_counter() - t,
                    "bytes": report.bytes_written,
                    "files_rewritten": report.files_removed,
                    "files_read": report.files_read,
                    "phases": {k: round(v, 3) for k, v in report.phases.items()},
                }
            )
            if keeper is not None:
                t = time.perf_counter()
                report = keeper(df, epoch)
                results["mvsink_history"].append(
                    {
                        "s": time.perf_counter() - t,
                        "bytes": report.bytes_written,
                        "history_s": report.phases.get("history", 0.0),
                        "history_bytes": log_figures(f"{kept}-h", DeltaTable(f"{kept}-h").version())[0],
                        "files_rewritten": report.files_removed,
                    }
                )
            t = time.perf_counter()
            merge = DeltaTable(merged).merge(
                change, predicate="t.id = s.id", source_alias="s", target_alias="t"
            )
            if args.deletes:
                cols = {c: f"s.{c}" for c in ("id", "k", "x", "s", "seq")}
                merge = (
                    merge.when_matched_delete("s.del AND s.seq >= t.seq")
                    .when_matched_update(cols, "NOT s.del AND s.seq >= t.seq")
                    .when_not_matched_insert(cols, "NOT s.del AND s.seq >= 0")  # (a late one: never)
                )
            else:
                merge = merge.when_matched_update_all().when_not_matched_insert_all()
            merge.execute()
            secs = time.perf_counter() - t
            size, gone = log_figures(merged, DeltaTable(merged).version())
            results["merge"].append({"s": secs, "bytes": size, "files_rewritten": gone})
            m, g = results["mvsink"][-1], results["merge"][-1]
            if keeper is not None:
                h = results["mvsink_history"][-1]
                print(
                    f"epoch {epoch}: mvsink with history {h['s']:.2f}s (history {h['history_s']:.2f}s, "
                    f"{h['history_bytes'] / 1e6:.2f}MB against the view's {h['bytes'] / 1e6:.2f}MB)",
                    flush=True,
                )
            print(
                f"epoch {epoch}: mvsink {m['s']:.2f}s {m['bytes'] / 1e6:.1f}MB "
                f"{m['files_rewritten']} rewritten ({m['files_read']} read)  |  "
                f"merge {g['s']:.2f}s {g['bytes'] / 1e6:.1f}MB {g['files_rewritten']} rewritten  "
                f"(mvsink {' '.join(f'{k}={v:.2f}' for k, v in m['phases'].items())})",
                flush=True,
            )
        # Both tables hold the same rows (MERGE keeps no tombstones: here no event is late).
        assert (
            DeltaTable(ours).to_pyarrow_dataset().count_rows()
            == DeltaTable(merged).to_pyarrow_dataset().count_rows()
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = {
        name: {
            "median_s": statistics.median(r["s"] for r in rows),
            "median_MB": statistics.median(r["bytes"] for r in rows) / 1e6,
            "median_files_rewritten": statistics.median(r["files_rewritten"] for r in rows),
        }
        for name, rows in results.items()
    }
    return {"args": vars(args), "summary": summary, "epochs": results}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--changes", type=int, default=10_000)
    p.add_argument("--pattern", choices=["clustered", "scattered"], default="scattered")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--file-rows", type=int, default=50_000)
    p.add_argument("--deletes", type=float, default=0.0, help="percent of changes that are deletes")
    p.add_argument("--placement", choices=["auto", "driver", "distributed"], default="auto")
    p.add_argument("--history", action="store_true", help="a second view keeping a history, side by side")
    p.add_argument(
        "--late", type=float, default=0.0, help="percent of changes that are late (with --deletes)"
    )
    p.add_argument("--out", default="bench/out")
    args = p.parse_args()
    if args.late and not args.deletes:
        p.error("--late needs --deletes (late events need a sequence)")
    result = run(args)
    print("median per epoch:")
    for name, s in result["summary"].items():
        print(
            f"  {name:7s} {s['median_s']:.2f}s  {s['median_MB']:.1f}MB written  "
            f"{s['median_files_rewritten']:.0f} files rewritten"
        )
    os.makedirs(args.out, exist_ok=True)
    extra = f"-h-l{args.late:g}" if args.history else ""
    name = f"upsert-{args.pattern}-{args.rows}-{args.changes}-d{args.deletes:g}-{args.placement}{extra}.json"
    with open(os.path.join(args.out, name), "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
