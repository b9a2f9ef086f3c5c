"""One replica of the chaos run (``test_replicas.py``), as its own process: a Spark driver
running two streaming queries from their checkpoints, as a deployed job would.

``python -m tests.chaos.replica CONFIG.json``. Both queries read the same ``mvsink-delta``
source, so every replica's batches carry the same clock (the source's versions):

* ``totals``: a complete-mode view (per group: rows and the sum of ``v``), with a rule whose
  broken rows go to an errors table and a metrics table beside it;
* ``latest``: an upsert-mode view (per ``id``, the row with the highest ``seq``).

The process exits when a query fails (an epoch's error, an injected fault, a task killed by a
fail point), as a job does; the chaos run restarts it. ``MVSINK_FAILPOINTS`` in its
environment arms fail points in the driver and in the Python workers it starts.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

TOTALS_RULE = "total >= 0"


def main(config_path: str) -> int:
    config: dict[str, Any] = json.loads(Path(config_path).read_text())
    from pyspark.sql import functions as F

    from mvsink import MVSink
    from mvsink.cli.session import local_session
    from mvsink.sources import register

    spark = local_session(
        f"replica-{config['writer']}",
        master="local[1]",
        conf={"spark.driver.memory": "768m", "spark.sql.shuffle.partitions": "1"},
    )
    register(spark)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    options = config["storage_options"]
    common: dict[str, Any] = {
        "storage_options": options,
        "writer": config["writer"],
        "read_only": config["read_only"],
        "clock": "source_offsets",
        "retry": {"max_attempts": 100, "initial_backoff_s": 0.02, "max_backoff_s": 1.0},
        "max_rows_per_file": 4,
    }
    ckpt = Path(config["checkpoints"])

    def events() -> Any:
        return spark.readStream.format("mvsink-delta").option("path", config["source"]).load()

    totals = events().groupBy("g").agg(F.count(F.lit(1)).alias("n"), F.sum("v").alias("total"))
    totals_sink = MVSink(
        config["totals"],
        "totals",
        checkpoint=str(ckpt / "totals"),
        checks=[TOTALS_RULE],
        on_error="table",
        metrics_table=config["metrics"],
        **common,
    )
    latest_sink = MVSink(
        config["latest"],
        "latest",
        mode="upsert",
        key=["id"],
        sequence_column="seq",
        checkpoint=str(ckpt / "latest"),
        **common,
    )
    # One line per epoch, kept across kills; open for the life of the process.
    journal = open(config["journal"], "a", buffering=1)  # noqa: SIM115

    def logged(sink: MVSink) -> Any:
        def run(batch: Any, epoch: int) -> None:
            try:
                report = sink(batch, epoch)
            except Exception as exc:
                journal.write(
                    json.dumps({"view": sink.name, "epoch": epoch, "error": type(exc).__name__}) + "\n"
                )
                raise
            journal.write(json.dumps(report.to_json()) + "\n")

        return run

    queries = [
        totals.writeStream.outputMode("complete")
        .foreachBatch(logged(totals_sink))
        .option("checkpointLocation", str(ckpt / "totals"))
        .trigger(processingTime="300 milliseconds")
        .start(),
        events()
        .select("id", "v", "seq")
        .writeStream.foreachBatch(logged(latest_sink))
        .option("checkpointLocation", str(ckpt / "latest"))
        .trigger(processingTime="300 milliseconds")
        .start(),
    ]
    Path(config["ready"]).touch()
    stop = Path(config["stop"])
    parent = os.getppid()  # the chaos run: if it dies, so does the replica
    while not stop.exists() and os.getppid() == parent and all(q.isActive for q in queries):
        time.sleep(0.2)
    failed = [q.exception() for q in queries if q.exception() is not None]
    for q in queries:
        q.stop()
    for e in failed:
        print(str(e)[-3000:], file=sys.stderr, flush=True)
    return 3 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    sys.exit(main(sys.argv[1]))
