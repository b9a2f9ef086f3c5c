"""A seeded chaos run: replicas of one complete-mode view on S3 behind the fault proxy, with
fail points firing, sinks restarted, a rogue writer and a compactor; afterwards the whole
Delta history is checked (``invariants.py``).

``make soak`` (by hand) runs a short one with a fixed seed; ``make chaos`` a
long one (``CHAOS_EPOCHS``) with a new seed each time. The seed is printed, and ``CHAOS_SEED``
replays a run: the faults, fail points and interleaving all come from it (the order in which
concurrent requests reach the store does not, so a replay is close, not exact).
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mvsink import MVSink, MVSinkError, failpoints
from mvsink.failpoints import InjectedFault
from mvsink.ops.compact import compact
from tests.chaos.invariants import check_history
from tests.s3server import FaultyS3

ROWS = 300
FAULTS = {
    "GET": {"error": 0.03, "reset": 0.02},
    "LIST": {"error": 0.03, "reset": 0.02},
    "PUT": {"error": 0.04, "reset": 0.03, "lost": 0.02},
    "CPUT": {"error": 0.05, "lost": 0.08, "reset": 0.03},
    "DELETE": {"error": 0.05, "lost": 0.05},
}
POINTS = ("after_snapshot", "after_staging", "before_commit", "after_commit_call", "after_commit")


def view(spark: SparkSession, epoch: int) -> DataFrame:
    """The view at ``epoch``: every 7th row moves each epoch, every 50th leaves on odd epochs."""
    ids = spark.range(ROWS)
    if epoch % 2:
        ids = ids.where(F.col("id") % 50 != 3)
    moved = F.when(F.col("id") % 7 == epoch % 7, F.lit(epoch)).otherwise(F.lit(0))
    return ids.select("id", (F.col("id") * 10 + moved).alias("v"))


def desired(epoch: int) -> Counter[Any]:
    return Counter(
        (i, i * 10 + (epoch if i % 7 == epoch % 7 else 0))
        for i in range(ROWS)
        if not (epoch % 2 and i % 50 == 3)
    )


@pytest.mark.newest_line
def test_replicas_under_faults_keep_every_version_exact(spark, s3_target, faults: FaultyS3):
    seed = int(os.environ.get("CHAOS_SEED", "20261124"))  # make chaos draws a new one
    epochs = int(os.environ.get("CHAOS_EPOCHS", "10"))
    rng = random.Random(seed)
    print(f"\nchaos: seed {seed}, {epochs} epochs (CHAOS_SEED={seed} replays it)")
    options = {**faults.options, "timeout": "20s"}

    def replica(name: str) -> MVSink:
        return MVSink(s3_target, "v", storage_options=options, writer=name, max_rows_per_file=60)

    sinks = {"a": replica("a"), "b": replica("b")}
    figures = Counter[str]()
    faults.set(FAULTS, seed=seed)
    started = time.monotonic()
    for epoch in range(epochs):
        for name in rng.sample(sorted(sinks), k=rng.choice([1, 2, 2])):
            # A replica runs the epoch until it is reflected, restarted after each crash, as
            # Spark reruns a failed batch from its checkpoint.
            for _ in range(20):
                point = rng.choice(POINTS) if rng.random() < 0.25 else None
                try:
                    with failpoints.armed({point: "raise"} if point else {}):
                        report = sinks[name](view(spark, epoch), epoch)
                    figures[report.outcome] += 1
                    figures["attempts"] += report.attempts
                    break
                except (InjectedFault, MVSinkError) as exc:
                    figures[f"failed: {type(exc).__name__}"] += 1
                    sinks[name] = replica(name)  # a restarted driver: nothing held over
            else:
                raise AssertionError(f"replica {name} never got epoch {epoch} in")
        if rng.random() < 0.3:  # a rogue writer: the next view commit must repair it
            rogue = pa.table({"id": [10_000 + epoch], "v": [-1]})
            figures["rogue commits"] += _try(
                write_deltalake, s3_target, rogue, mode="append", storage_options=options
            )
        if epoch % 5 == 4:
            figures["compactions"] += _try(
                compact, s3_target, "v", options, max_rows_per_file=400, small_rows=100
            )
    seconds = time.monotonic() - started
    counts = faults.counts()  # before the rules (and with them the counts) are cleared
    # Last, a clean epoch: the final version is a view commit, so a rogue row is repaired.
    faults.set({})
    final = replica("a")(view(spark, epochs), epochs)
    assert final.outcome in ("committed", "unchanged", "replay")
    history = check_history(s3_target, options, "v", desired, ["id", "v"])
    injected = {k: {f: n for f, n in v.items() if f != "forward"} for k, v in counts.items()}
    print(
        f"chaos: {seconds:.0f} s; {dict(figures)}; faults {injected}; {history.versions} versions, "
        f"{history.view_commits} view commits compared, {history.files} files read"
    )
    assert not history.violations, history.violations
    assert history.compared == history.view_commits >= 1


def _try(action: Any, *args: Any, **kwargs: Any) -> int:
    """1 if ``action(*args, **kwargs)`` succeeded, 0 if a fault or a lost race stopped it (a
    rogue writer and a compactor do not retry: the chaos goes on)."""
    try:
        action(*args, **kwargs)
        return 1
    except Exception:
        return 0
