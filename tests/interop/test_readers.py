"""Spark's JVM Delta reader and DuckDB's (delta-kernel-rs) trust mvsink's statistics: a filtered
read returns what a full read filtered does, on every type, NaN included."""

from __future__ import annotations

from typing import Any

import pytest

from mvsink import MVSink
from tests.helpers import FILTERS, Filter, duckdb_keys, make_view


def spark_keys(spark: Any, target: str, where: str) -> set[int]:
    return {r.k for r in spark.read.format("delta").load(target).where(where).select("k").collect()}


@pytest.fixture(scope="module")
def typed_view(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_view(spark, str(tmp_path_factory.mktemp("readers") / "view"))


@pytest.mark.parametrize("case", FILTERS, ids=lambda f: f.name)
def test_sparks_and_duckdbs_filtered_reads_return_every_row_that_matches(spark, typed_view, case: Filter):
    assert spark_keys(spark, typed_view, case.sql) == case.expected()
    assert duckdb_keys(typed_view, case.sql) == case.expected()


def test_a_file_holding_nan_is_never_skipped(spark, tmp_path):
    # Spark and DuckDB order NaN above every number: a bound from the Parquet footer (which
    # ignores NaN) would skip the file for "x > 100" and lose its NaN row.
    target = str(tmp_path / "view")
    rows = [(k, float("nan") if k == 4 else k * 1.0) for k in range(8)]
    MVSink(target, "nan", max_rows_per_file=4, cluster_by=["k"])(
        spark.createDataFrame(rows, "k long, x double"), 0
    )
    for where in ("x > 100", "isnan(x)", "x >= 5"):
        expected = {r.k for r in spark.createDataFrame(rows, "k long, x double").where(where).collect()}
        assert spark_keys(spark, target, where) == expected, where
        assert duckdb_keys(target, where) == expected, where
