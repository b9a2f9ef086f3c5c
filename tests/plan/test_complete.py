"""The driver placement's fetch of the rows to insert (``complete._fetch``), over a cache of
desired with crafted fingerprints, so that a first-lane collision, which real rows never show,
can be tested: rows are found by their first lane alone, a row whose first lane collides with
a wanted one's is left out, and a duplicated row's copies come exactly as inserted."""

from __future__ import annotations

import numpy as np
from pyspark.sql.types import LongType, StructField, StructType

from mvsink.config import SinkOptions
from mvsink.errors import Where
from mvsink.plan.complete import Complete
from mvsink.plan.context import EpochContext
from mvsink.plan.correction import diff
from mvsink.table.fingerprint import FP_A, FP_B, Fingerprints
from mvsink.table.index import DriverIndex
from mvsink.table.layout import Layout
from mvsink.table.storage import Store
from tests.helpers import persisted_of


def test_a_row_whose_first_lane_collides_with_a_wanted_one_is_never_fetched_for_it(spark, tmp_path):
    # x = 1 is new; x = 2 shares its first lane and is held; x = 3 is held once, wanted thrice.
    rows = [(1, 10, 1), (2, 10, 2), (3, 30, 3), (3, 30, 3), (3, 30, 3), (4, 40, 4)]
    cached = spark.createDataFrame(rows, f"x long, {FP_A} long, {FP_B} long")
    desired = Fingerprints(np.array([r[1] for r in rows]), np.array([r[2] for r in rows]))
    corr = diff(desired, persisted_of([[(10, 2), (30, 3), (40, 4)]]))
    assert (corr.inserted, corr.retracted) == (3, 0)

    target = str(tmp_path / "view")
    ctx = EpochContext(cached, SinkOptions(target=target, name="crafted"), Where("crafted"), Store(target))
    complete = Complete(ctx, DriverIndex())
    layout = Layout("{}", StructType([StructField("x", LongType())]), ())
    complete.hashed, complete.cached, complete.lanes_cached = (layout, cached), cached, True
    complete.fps = desired
    fetched = complete._fetch(corr)
    assert fetched is not None  # the collision neither came nor displaced the wanted row
    table, a, b = fetched
    got = sorted(zip(table.column("x").to_pylist(), a.tolist(), b.tolist(), strict=True))
    assert got == [(1, 10, 1), (3, 30, 3), (3, 30, 3)]
