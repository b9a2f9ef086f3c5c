"""A view's history beside the JVM Delta runtime: on a table with deletion vectors, where
epochs retract rows by marking them in vectors and Delta's own DELETE and OPTIMIZE write in
between, the history holds every version as Spark's ``VERSION AS OF`` reads it, and
``mvsink.as_of`` reads the same rows."""

from __future__ import annotations

from collections import Counter

import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame

import mvsink
from mvsink import MVSink
from mvsink.compat import to_arrow
from mvsink.table.record import HistoryKeys
from tests.helpers import multiset

COLS = ["id", "name"]


def at_version(spark, target: str, version: int) -> Counter:
    return multiset(to_arrow(spark.read.format("delta").option("versionAsOf", version).load(target)), COLS)


@pytest.mark.parametrize("placement", ["driver", "distributed"])
def test_the_history_of_a_deletion_vector_table_holds_every_version(spark, tmp_path, placement):
    target, history = str(tmp_path / "dv"), str(tmp_path / "dv_history")
    spark.sql(
        f"CREATE TABLE delta.`{target}` (id long, name string) USING delta "
        "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    sink = MVSink(target, "v", max_rows_per_file=20, placement=placement, history_target=history)

    def desired(ids: range, every: int, tag: str) -> DataFrame:
        return spark.sql(
            f"SELECT id, CASE WHEN id % {every} = 0 THEN concat('n', id, '{tag}') ELSE concat('n', id) END "
            f"AS name FROM range({ids.start}, {ids.stop})"
        )

    sink(desired(range(100), 1000, ""), 0)
    sink(desired(range(100), 13, "a"), 1)  # rows retracted through new vectors
    spark.sql(f"DELETE FROM delta.`{target}` WHERE id IN (30, 31, 57)")  # Delta's own vectors
    spark.sql(f"OPTIMIZE delta.`{target}`")  # moves rows, changes none
    sink(desired(range(100), 11, "b"), 2)  # repairs the delete
    sink(desired(range(60), 11, "b"), 3)
    newest = DeltaTable(target).version()
    assert DeltaTable(history).transaction_version(HistoryKeys("v").frontier) == newest + 1
    rows = DeltaTable(history).to_pyarrow_table().to_pylist()
    for version in range(newest + 1):
        want = at_version(spark, target, version)
        held = Counter(
            (r["id"], r["name"])
            for r in rows
            if r["opened_version"] <= version
            and (r["closed_version"] is None or r["closed_version"] > version)
        )
        assert held == want, f"version {version}"
        assert multiset(to_arrow(mvsink.as_of(spark, target, "v", version=version)), COLS) == want
    deleted = {
        (r["id"], r["closed_by"]) for r in rows if r["id"] in (30, 31, 57) and r["closed_by"] == "foreign"
    }
    assert {i for i, _ in deleted} == {30, 31, 57}
    repaired = {r["id"] for r in rows if r["opened_by"] == "repair"}
    assert {30, 31, 57} <= repaired
