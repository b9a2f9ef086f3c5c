"""Readers trust mvsink's statistics: a filtered read returns what a full read filtered does,
on every type, through delta-rs's dataset (here), DuckDB and Spark's JVM Delta
(``tests/interop/test_readers.py``). mvsink writes the statistics (``table/stats.py``)."""

from __future__ import annotations

import datetime as dt
import glob
import json
import os
from typing import Any

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from mvsink import MVSink
from tests.helpers import (
    FILTERS,
    TYPED_COLUMNS,
    live_files,
    make_view,
    spark_read_listed,
    store,
    target_table,
)


@pytest.fixture(scope="module")
def typed_view(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_view(spark, str(tmp_path_factory.mktemp("readers") / "view"))


def file_stats(target: str) -> list[dict[str, Any]]:
    """The ``stats`` of every add action in the log, as written."""
    log = DeltaTable(target).get_add_actions(flatten=True).column("path").to_pylist()
    found = []
    for entry in sorted(glob.glob(os.path.join(target, "_delta_log", "*.json"))):
        with open(entry, encoding="utf-8") as fh:
            actions = [json.loads(line) for line in fh]
        for action in actions:
            if "add" in action and action["add"]["path"] in log:
                found.append(json.loads(action["add"]["stats"]))
    return found


def test_every_file_has_bounds_for_every_column_delta_bounds(typed_view):
    stats = file_stats(typed_view)
    assert len(stats) == 4
    for one in stats:
        assert set(one["minValues"]) == set(TYPED_COLUMNS) - {"bin"}, one
        assert one["minValues"]["nested"].keys() == {"x", "label"}
        assert all(len(one[b]["name"]) == 32 for b in ("minValues", "maxValues"))
    assert {s["minValues"]["edge"] for s in stats} >= {"-Infinity"}
    assert {s["maxValues"]["edge"] for s in stats} >= {"Infinity"}


@pytest.mark.parametrize("case", FILTERS, ids=lambda f: f.name)
def test_a_filtered_delta_rs_read_returns_what_a_full_read_filtered_does(typed_view, case):
    target = typed_view
    whole = target_table(target)
    assert sorted(whole.column("k").to_pylist()) == list(range(12))
    dataset = DeltaTable(target).to_pyarrow_dataset()
    got = set(dataset.to_table(filter=case.expression).column("k").to_pylist())
    assert got == case.expected() and got == set(whole.filter(case.expression).column("k").to_pylist())


def test_a_date_no_bound_can_hold_commits_without_its_bound(spark, tmp_path, placement):
    # Spark takes date_add(DATE'9999-12-31', 1); a Delta bound cannot say +10000-01-01.
    target = str(tmp_path / "view")
    sink = MVSink(target, "far", placement=placement)
    for epoch, days in enumerate((1, 2)):
        far = spark.sql(
            f"SELECT id AS k, date_add(DATE'9999-12-30', CAST(id * {days} AS INT)) AS d FROM range(3)"
        )
        assert sink(far, epoch).outcome == "committed"
    table = target_table(target)
    assert sorted(table.column("d").cast("int32").to_pylist()) == [2932895, 2932897, 2932899]
    stats = file_stats(target)
    assert all("k" in one["minValues"] for one in stats)
    assert any("d" not in one["minValues"] for one in stats)
    assert all(one["maxValues"]["d"] <= "9999-12-31" for one in stats if "d" in one["maxValues"])


def footer_says_proleptic(target: str, path: str) -> bool:
    with store(target).fs.open_input_file(path) as fh:
        meta = pq.ParquetFile(fh).metadata.metadata or {}
    # Spark reads dates as written from 3.0.0 on, INT96 timestamps from 3.1.0 on.
    return meta.get(b"org.apache.spark.version", b"0") >= b"3.1.0" and not {
        b"org.apache.spark.legacyDateTime",
        b"org.apache.spark.legacyINT96",
    } & set(meta)


def test_a_null_filter_on_a_float_column_holding_nan_finds_its_nulls(spark, tmp_path):
    target = str(tmp_path / "view")
    rows = [(1, 1.0), (2, float("nan")), (5, None), (6, 3.0)]
    MVSink(target, "nan", max_rows_per_file=2, cluster_by=["k"])(
        spark.createDataFrame(rows, "k long, x double"), 0
    )
    dataset = DeltaTable(target).to_pyarrow_dataset()
    assert dataset.to_table(filter=ds.field("x").is_null()).column("k").to_pylist() == [5]
    assert sorted(dataset.to_table(filter=ds.field("x").is_valid()).column("k").to_pylist()) == [1, 2, 6]


_MICRO = dt.timedelta(microseconds=1)
ANCIENT = [
    (1, dt.date(1, 1, 1), dt.datetime(1, 1, 1, tzinfo=dt.UTC)),
    (2, dt.date(1582, 10, 4), dt.datetime(1582, 10, 15, 12, tzinfo=dt.UTC)),
    (3, dt.date(1899, 12, 31), dt.datetime(1899, 12, 31, 23, 59, 59, tzinfo=dt.UTC)),
    (4, dt.date(2024, 1, 1), dt.datetime(2024, 1, 1, tzinfo=dt.UTC)),
]


@pytest.mark.parametrize("mode", ["complete", "upsert"])
def test_spark_reads_a_view_of_ancient_dates_with_its_default_settings(spark, tmp_path, placement, mode):
    # Spark 3.5 refuses to read a Parquet file holding dates before 1582 or timestamps before
    # 1900 (READ_ANCIENT_DATETIME) unless the file says which calendar wrote it: its default
    # datetimeRebaseModeInRead is EXCEPTION. Every file mvsink writes says so; Spark must read
    # such a view, after rewrites too, as written, without a setting changed.
    target = str(tmp_path / "view")
    schema = "k long, d date, t timestamp"
    keys = {"key": ["k"]} if mode == "upsert" else {}
    sink = MVSink(target, "ancient", mode=mode, placement=placement, max_rows_per_file=2, **keys)
    assert sink(spark.createDataFrame(ANCIENT, schema), 0).outcome == "committed"
    changed = [ANCIENT[0], (2, dt.date(1, 6, 1), ANCIENT[1][2]), *ANCIENT[2:]]
    assert sink(spark.createDataFrame(changed, schema), 1).outcome == "committed"  # a rewrite
    for key in ("datetimeRebaseModeInRead", "int96RebaseModeInRead"):
        assert spark.conf.get(f"spark.sql.parquet.{key}") in ("EXCEPTION", "CORRECTED")  # defaults
    read = spark_read_listed(spark, target).selectExpr("k", "d", "unix_micros(t) AS t").collect()
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    assert sorted(tuple(r) for r in read) == sorted((k, d, (t - epoch) // _MICRO) for k, d, t in changed)
    assert all(footer_says_proleptic(target, path) for path in live_files(target))
