"""The Python driver's memory per view row, complete mode on the driver placement.

A view of N rows (``complete_mode.desired``: ``id bigint, k int, x double, s string``), 0.1%
changing per epoch in one run of keys, kept by ``MVSink(placement="driver")`` on the delta-rs
engine. The initial load is written by Spark tasks (never collected); each steady epoch then
collects desired's fingerprints and diffs them against the index on the driver. Reported per
epoch: seconds, phases, and how far the Python process's peak RSS rose above its RSS before
the first steady epoch, in bytes per view row (what the driver pays to keep the view).

    python bench/driver_memory.py --rows 10000000 --epochs 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from complete_mode import desired

from mvsink import MVSink
from mvsink.cli.session import local_session


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak() -> None:
    """Start the kernel's count of this process's peak RSS (VmHWM) again from its RSS now."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def peak_bytes() -> int:
    with open("/proc/self/status") as fh:
        line = next(line for line in fh if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--percent", type=float, default=0.1)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--file-rows", type=int, default=50_000)
    args = p.parse_args()
    spark = local_session(
        "mvsink-bench-memory", conf={"spark.driver.memory": "8g", "spark.driver.maxResultSize": "2g"}
    )
    with tempfile.TemporaryDirectory(prefix="mvsink-bench-mem-") as root:
        sink = MVSink(
            f"{root}/t",
            "bench",
            placement="driver",
            driver_max_rows=args.rows * 2,
            max_rows_per_file=args.file_rows,
        )
        df = desired(spark, args.rows, args.percent, "keyed", 0, False).cache()
        df.count()
        sink(df, 0)
        df.unpersist()
        lines = []
        for epoch in range(1, args.epochs + 1):
            df = desired(spark, args.rows, args.percent, "keyed", epoch, False).cache()
            df.count()
            base = rss_bytes()
            if epoch == 1:
                first = base
            reset_peak()
            report = sink(df, epoch)
            df.unpersist()
            line = {
                "epoch": epoch,
                "s": round(report.seconds, 2),
                "phases": {k: round(v, 2) for k, v in report.phases.items()},
                "peak_over_start_bytes_per_row": round((peak_bytes() - first) / args.rows, 1),
                "peak_over_epoch_start_bytes_per_row": round((peak_bytes() - base) / args.rows, 1),
                "rss_after_bytes_per_row": round((rss_bytes() - first) / args.rows, 1),
            }
            print(json.dumps(line), flush=True)
            lines.append(line)
    print(json.dumps({"rows": args.rows, "epochs": lines}))


if __name__ == "__main__":
    main()
