"""``cluster_by``: checked against the view at its first epoch, and one order wherever rows are
sorted (Spark's tasks, the driver)."""

from __future__ import annotations

import math
import os

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from mvsink import ConfigError, MVSink
from tests.helpers import added, assert_equal_to, versions

# Runs on both engines (tests/conftest.py: each line runs the engine it has).
pytestmark = pytest.mark.usefixtures("engine")

SCHEMA = "id long, s string, x double, tags array<string>, m map<string,int>"


def rows(ids: range, x: object = None) -> list[tuple[object, ...]]:
    return [(i, f"s{i % 3}", float(i) if x is None else x, [f"t{i}"], {"k": i}) for i in ids]


@pytest.mark.parametrize(
    ("cluster_by", "message"),
    [
        (["tags"], "column 'tags' is array<string>"),
        (["x", "m"], "column 'm' is map<string,int>"),
        (["nope"], "names 'nope', which the view does not store"),
    ],
)
def test_a_column_rows_cannot_be_clustered_by_is_refused_at_the_first_epoch(
    spark, target, placement, cluster_by, message
):
    desired = spark.createDataFrame(rows(range(6)), SCHEMA)
    sink = MVSink(target, "clustered", cluster_by=cluster_by, placement=placement)
    with pytest.raises(ConfigError, match=message) as err:
        sink(desired, 0)
    assert (err.value.view, err.value.epoch) == ("clustered", 0)
    assert "option 'cluster_by'" in str(err.value)
    assert not DeltaTable.is_deltatable(target)
    # On a target that exists: refused, and the target unchanged.
    MVSink(target, "clustered", placement=placement)(desired, 0)
    with pytest.raises(ConfigError, match=message):
        sink(spark.createDataFrame(rows(range(3, 9)), SCHEMA), 1)
    assert versions(target) == [0]
    assert_equal_to(target, desired)


def _key(value: object) -> str:
    """A comparable spelling of a sort key value (NaN equal to NaN)."""
    return "NaN" if isinstance(value, float) and math.isnan(value) else repr(value)


def test_rows_are_clustered_in_sparks_order_on_the_driver_and_in_tasks(spark, local_target, placement):
    """Nulls first and NaN above every number, as Spark's ascending order has them, whether
    the driver sorts the rows it inserts or Spark's write tasks sort theirs."""
    sink = MVSink(local_target, "order", cluster_by=["s", "x"], placement=placement)
    sink(spark.createDataFrame(rows(range(4)), SCHEMA), 0)
    odd = [None, math.nan, 2.5, -1.0, None, 0.0, math.nan, -0.5, 7.0]
    new = [(10 + k, None if k % 3 == 0 else f"s{k % 2}", x, [], {}) for k, x in enumerate(odd)]
    report = sink(spark.createDataFrame(rows(range(4)) + new, SCHEMA), 1)
    assert (report.inserted, report.retracted) == (len(new), 0)
    files = added(local_target, report.version)
    assert files
    for path in files:
        held = pq.read_table(os.path.join(local_target, path), columns=["s", "x"]).to_pylist()
        pairs = [(r["s"], r["x"]) for r in held]
        # Spark itself says the order.
        ordered = spark.createDataFrame(pairs, "s string, x double").orderBy("s", "x").collect()
        assert [(_key(s), _key(x)) for s, x in pairs] == [(_key(r["s"]), _key(r["x"])) for r in ordered]
