"""What keeping a view's history costs: the TPC-H per-order view of ``tpch_stream.py``, streamed
in ``--parts`` batches, complete mode, with and without ``history_target``, in one run.

Reports, per system (the ``noop`` floor, mvsink, mvsink with history), the whole query's
seconds (fastest of ``--rounds`` interleaved rounds), and for the history:

* ``history_s``: the sink's ``history`` phase, summed over the epochs;
* ``history_bytes`` against ``correction_bytes``: what the history table's commits added
  (its log's add actions) against what the view's commits added (``EpochReport.bytes_written``);
* ``as_of_s`` against ``version_as_of_s``: reading the view as of a middle version from its
  history (``mvsink.as_of``) and with Delta's ``VERSION AS OF`` on the view's table, each
  counted and checked equal to the other.

Runs in the Delta line's virtualenv (``VERSION AS OF`` needs the JVM Delta):

    MVSINK_DELTA_JARS=.jvm/delta-4.4 .venv-delta/bin/python bench/history.py --sf 1 --parts 12

``--placement distributed`` plans the view in Spark tasks, and so carries its history there
(``history/tasks.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jvm_engine import session
from pyspark.sql import SparkSession
from tpch_stream import OUT, desired, floor, generate, run, same, stream

import mvsink
from mvsink import MVSink

VIEW = "orders"


def with_sink(
    spark: SparkSession, files: Path, where: str, history: bool, view: str = VIEW, placement: str = "auto"
) -> dict[str, Any]:
    target = f"{where}/table"
    options = {"history_target": f"{where}/history"} if history else {}
    sink = MVSink(target, view, placement=placement, **options)
    writer = stream(spark, files, view).writeStream.outputMode("complete").foreachBatch(sink)
    total = run(writer.option("checkpointLocation", f"{where}/ckpt"))
    reports = list(sink.reports)
    got: dict[str, Any] = {
        "s": total,
        "sink_s": round(sum(r.seconds for r in reports), 2),
        "epochs": len(reports),
        "correction_bytes": sum(r.bytes_written for r in reports),
    }
    if history:
        got["history_s"] = round(sum(r.phases.get("history", 0.0) for r in reports), 2)
        got["history_bytes"] = _added_bytes(f"{where}/history")
    return got


def _added_bytes(table: str) -> int:
    """Bytes of every file the table's commits added, from its log."""
    total = 0
    log = Path(table) / "_delta_log"
    for name in sorted(os.listdir(log)):
        if name.endswith(".json"):
            for line in (log / name).read_text().splitlines():
                action = json.loads(line)
                if "add" in action:
                    total += int(action["add"]["size"])
    return total


def reads(spark: SparkSession, where: str) -> dict[str, Any]:
    """``as_of`` from the history against ``VERSION AS OF`` on the view's table, one version."""
    target = f"{where}/table"
    version = len([n for n in os.listdir(f"{target}/_delta_log") if n.endswith(".json")]) // 2
    out: dict[str, Any] = {"version": version}
    for name, read in (
        ("as_of", lambda: mvsink.as_of(spark, target, VIEW, version=version)),
        ("version_as_of", lambda: spark.read.format("delta").option("versionAsOf", version).load(target)),
    ):
        best = None
        for _ in range(3):
            start = time.perf_counter()
            rows = read().count()
            took = time.perf_counter() - start
            best = took if best is None else min(best, took)
        out[f"{name}_s"], out[f"{name}_rows"] = round(best or 0.0, 2), rows
    theirs = spark.read.format("delta").option("versionAsOf", version).load(target)
    ours = mvsink.as_of(spark, target, VIEW, version=version)
    out["equal"] = ours.exceptAll(theirs).isEmpty() and theirs.exceptAll(ours).isEmpty()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sf", type=float, default=1.0)
    parser.add_argument("--parts", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--placement",
        default="auto",
        choices=["auto", "driver", "distributed"],
        help="where mvsink plans (and so where the history is carried: distributed, in Spark tasks)",
    )
    args = parser.parse_args()
    files = generate(args.sf, args.parts)
    spark = session()
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="mvsink-history-") as scratch:
        with_sink(spark, files, f"{scratch}/warm", True, "flags")  # untimed: the JVM's and workers' first use
        expected = desired(spark, files, VIEW).cache()
        systems = [
            ("floor", lambda w: floor(spark, files, VIEW, f"{w}/table", f"{w}/ckpt", "complete")),
            ("mvsink", lambda w: with_sink(spark, files, w, False, placement=args.placement)),
            ("mvsink_history", lambda w: with_sink(spark, files, w, True, placement=args.placement)),
        ]
        for r in range(args.rounds):
            for name, fn in systems if r % 2 == 0 else systems[::-1]:
                where = os.path.join(scratch, f"{name}-{r}")
                got = fn(where)
                if name != "floor":
                    got["equal"] = same(spark, f"{where}/table", expected)
                if name == "mvsink_history" and r == 0:
                    got["reads"] = reads(spark, where)
                got["all_s"] = [*runs.get(name, {}).get("all_s", []), round(got["s"], 2)]
                if name not in runs or got["s"] < runs[name]["s"]:
                    runs[name] = {**runs.get(name, {}), **got}
                else:
                    runs[name]["all_s"] = got["all_s"]
                shutil.rmtree(where, ignore_errors=True)
    line: dict[str, Any] = {
        "view": VIEW,
        "sf": args.sf,
        "parts": args.parts,
        "placement": args.placement,
        **runs,
    }
    kept = runs["mvsink_history"]
    line["history_ratio"] = round(kept["s"] / runs["mvsink"]["s"], 2)
    line["history_bytes_ratio"] = round(kept["history_bytes"] / max(kept["correction_bytes"], 1), 2)
    print(json.dumps(line), flush=True)
    OUT.mkdir(exist_ok=True)
    (OUT / f"history-sf{args.sf:g}-{args.placement}.json").write_text(json.dumps(line, indent=2))


if __name__ == "__main__":
    main()
