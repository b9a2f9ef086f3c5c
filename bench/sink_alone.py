"""The sink alone on cached frames: mvsink against Delta's overwrite (what complete mode's own
sink does each trigger), in interleaved rounds, beside the floor (a ``noop`` write of the frame).

Views (``--view``):

* ``synthetic``: ``complete_mode.desired``: N rows, K% changing per epoch, at random or in one
  run of keys (``--pattern``); ``--wide``: 24 columns, about 260 bytes a row;
* ``orders``: TPC-H ``lineitem`` aggregated per order over its first ``epoch + 1`` files
  (``tpch_stream``'s view, 1.5M rows at SF 1, ~11% of orders changing per file).

Each epoch's frame is cached and counted before anything is timed; the systems then write it,
in an order reversed every epoch. ``--rounds`` runs the whole history again on fresh tables,
the order of the first epoch reversed too; each system's fastest round is kept. Reported per
system: the steady epochs' (1..N) seconds, total and median, and bytes written; the ratios to
the overwrite, of the whole and above the floor.

    MVSINK_DELTA_JARS=.jvm/delta-4.4 .venv-delta/bin/python bench/sink_alone.py \\
        --view synthetic --wide --pattern keyed --percent 1 --epochs 4 --rounds 2
    MVSINK_DELTA_JARS=.jvm/delta-4.4 .venv-delta/bin/python bench/sink_alone.py --view orders --rounds 2
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from complete_mode import desired as synthetic
from jvm_engine import on_disk, session
from pyspark.sql import DataFrame, SparkSession
from tpch_stream import VIEWS, generate

from mvsink import MVSink


def orders(spark: SparkSession, files: Path, epoch: int) -> DataFrame:
    parts = sorted(str(p) for p in files.glob("*.parquet"))[: epoch + 1]
    key, aggs = VIEWS["orders"]
    return spark.read.parquet(*parts).groupBy(*key).agg(*aggs())


def one_round(
    spark: SparkSession, args: argparse.Namespace, frames: Callable[[int], DataFrame], r: int
) -> dict:
    root = tempfile.mkdtemp(prefix="mvsink-alone-")
    try:
        sink = MVSink(f"{root}/mvsink", "bench", max_rows_per_file=args.file_rows)
        systems: dict[str, Callable[[DataFrame, int], Any]] = {
            "floor": lambda df, _: df.write.format("noop").mode("overwrite").save(),
            "mvsink": sink,
            "overwrite": lambda df, _: df.write.format("delta").mode("overwrite").save(f"{root}/overwrite"),
        }
        got: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
        for epoch in range(args.epochs + 1):
            df = frames(epoch).cache()
            df.count()
            order = list(systems) if (epoch + r) % 2 == 0 else list(reversed(systems))
            for name in order:
                where = f"{root}/{name}"
                before = on_disk(where)
                t = time.perf_counter()
                systems[name](df, epoch)
                secs = time.perf_counter() - t
                written = sum(s for p, s in on_disk(where).items() if p not in before and "_mvsink" not in p)
                line: dict[str, Any] = {"s": round(secs, 3), "bytes": written}
                if name == "mvsink":
                    report = sink.reports[-1]
                    line |= {
                        "ins": report.inserted,
                        "ret": report.retracted,
                        "whole": report.whole,
                        "phases": {k: round(v, 3) for k, v in report.phases.items()},
                    }
                got[name].append(line)
            df.unpersist()
            print(
                f"round {r} epoch {epoch}: "
                + "  ".join(f"{n} {got[n][-1]['s']:.2f}s {got[n][-1]['bytes'] / 1e6:.1f}MB" for n in systems)
                + f"  ({got['mvsink'][-1].get('phases')})",
                flush=True,
            )
        return got
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--view", choices=["synthetic", "orders"], default="synthetic")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--percent", type=float, default=1.0)
    p.add_argument("--pattern", choices=["random", "keyed"], default="keyed")
    p.add_argument("--wide", action="store_true")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--file-rows", type=int, default=50_000)
    p.add_argument("--sf", type=float, default=1.0)
    p.add_argument("--parts", type=int, default=12)
    args = p.parse_args()
    spark = session()
    if args.view == "orders":
        files = generate(args.sf, args.parts)
        args.epochs = min(args.epochs, args.parts - 1)

        def frames(epoch: int) -> DataFrame:
            return orders(spark, files, epoch)
    else:

        def frames(epoch: int) -> DataFrame:
            return synthetic(spark, args.rows, args.percent, args.pattern, epoch, args.wide)

    best: dict[str, dict[str, Any]] = {}
    for r in range(args.rounds):
        got = one_round(spark, args, frames, r)
        for name, lines in got.items():
            steady = [line["s"] for line in lines[1:]]
            total = sum(steady)
            if name not in best or total < best[name]["total_s"]:
                best[name] = {
                    "total_s": round(total, 2),
                    "median_s": round(statistics.median(steady), 3),
                    "MB": round(statistics.median(line["bytes"] for line in lines[1:]) / 1e6, 2),
                    "epochs": lines,
                }
    floor = best["floor"]["total_s"]
    over = best["overwrite"]["total_s"]
    summary = {
        "args": vars(args),
        **{n: {k: v for k, v in b.items() if k != "epochs"} for n, b in best.items()},
        "ratio": round(best["mvsink"]["total_s"] / over, 2),
        "own_ratio": round((best["mvsink"]["total_s"] - floor) / max(1e-9, over - floor), 2),
    }
    print(json.dumps(summary), flush=True)
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    wide = "-wide" if args.wide else ""
    name = f"alone-{args.view}-{args.pattern}-{args.rows}-{args.percent}{wide}.json"
    (out / name).write_text(json.dumps({**summary, "rounds_best": best}, indent=1))


if __name__ == "__main__":
    main()
