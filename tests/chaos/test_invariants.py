"""The history checker (``invariants.py``) finds what it is there to find."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
from deltalake import write_deltalake

from mvsink import MVSink
from tests.chaos.invariants import check_history


def rows(epoch: int) -> Counter[tuple[int, int]]:
    return Counter((i, i + epoch) for i in range(5))


def test_the_history_check_passes_an_exact_history_and_names_a_wrong_one(spark, local_target):
    sink = MVSink(local_target, "v")
    for epoch in range(2):
        sink(spark.range(5).selectExpr("id", f"id + {epoch} AS v"), epoch)
    # A rogue row, then the view commit that repairs it.
    write_deltalake(local_target, pa.table({"id": [99], "v": [0]}), mode="append")
    sink(spark.range(5).selectExpr("id", "id + 2 AS v"), 2)

    good = check_history(local_target, {}, "v", rows, ["id", "v"])
    assert good.violations == [] and (good.versions, good.view_commits, good.compared) == (4, 3, 3)
    assert good.files >= 3

    wrong = check_history(local_target, {}, "v", lambda e: rows(e + 1), ["id", "v"])
    assert len(wrong.violations) == 3 and all("not desired at epoch" in v for v in wrong.violations)
