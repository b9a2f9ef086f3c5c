"""What every mode needs from its epoch: sizes, the driver's result limit, the placement."""

from __future__ import annotations

import pyarrow as pa
import pytest

from mvsink.config import SinkOptions
from mvsink.errors import Where
from mvsink.plan.context import DriverBudget, EpochContext, ResultLimit, long_row_bytes, parse_bytes
from mvsink.table.delta import DataFile, Snapshot
from mvsink.table.storage import Store


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1024", 1024),
        ("8m", 8 << 20),
        ("1g", 1 << 30),
        (" 512k ", 512 << 10),
        ("2GiB", 2 << 30),
        ("lots", None),
    ],
)
def test_a_spark_size_is_read_in_bytes(text: str, size: int | None) -> None:
    assert parse_bytes(text) == size


def test_a_result_fits_in_a_quarter_of_the_limit_and_any_fits_without_one() -> None:
    limit = ResultLimit(4000)
    assert limit.fits(100, 10) and not limit.fits(101, 10)
    assert ResultLimit(0).fits(10**12, 10**6)
    assert long_row_bytes(2) == 28


def test_the_budget_learns_the_bytes_a_row_takes() -> None:
    budget = DriverBudget()
    budget.learn(pa.table({"a": pa.array([], pa.int64())}))
    assert budget.bytes_per_row is None
    budget.learn(pa.table({"a": pa.array([1, 2], pa.int64())}))
    assert budget.bytes_per_row == 8


def context(tmp_path, **options: object) -> EpochContext:  # type: ignore[no-untyped-def]
    opts = SinkOptions(target=str(tmp_path), name="v", **options)  # type: ignore[arg-type]
    return EpochContext(None, opts, Where("v"), Store(str(tmp_path)))  # type: ignore[arg-type]


def snapshot(*rows: int | None) -> Snapshot:
    files = tuple(DataFile(f"{k}.parquet", 800, n) for k, n in enumerate(rows))
    return Snapshot("/t", 1, 0, None, (), files)


def test_auto_placement_plans_on_the_driver_while_the_table_is_small(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ctx = context(tmp_path, mode="upsert", key=["k"], driver_max_rows=100)
    assert ctx.placement(snapshot(50, 50)) == "driver"
    assert ctx.placement(snapshot(50, 51)) == "distributed"
    # A file without a row count counts a row per 8 bytes: 800 bytes, 100 rows.
    assert ctx.placement(snapshot(None)) == "driver"
    assert ctx.placement(snapshot(None, 1)) == "distributed"
    ctx.too_big = True
    assert ctx.placement(snapshot(1)) == "distributed"
    assert context(tmp_path, placement="driver").placement(snapshot(10**9)) == "driver"


def test_complete_mode_plans_distributed_once_the_fingerprints_would_not_fit_the_driver(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ctx = context(tmp_path, driver_max_rows=10**9)
    ctx.limit = ResultLimit(1000)  # type: ignore[misc]  # a cached property: set as Spark would give it
    assert ctx.placement(snapshot(20)) == "driver"  # 20 rows of 24 bytes: under half the limit
    assert ctx.placement(snapshot(21)) == "distributed"
    ctx.budget.too_big = True
    assert ctx.placement(snapshot(1)) == "distributed"
