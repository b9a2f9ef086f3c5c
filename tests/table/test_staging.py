"""Staging a plan held on the driver: files nothing references yet, counted, and discarded."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from mvsink.errors import InvariantViolation, Where
from mvsink.table.change_feed import CHANGE_TYPE
from mvsink.table.delta import DataFile
from mvsink.table.layout import Layout
from mvsink.table.plan import NOTHING, Plan, Rewrite
from mvsink.table.schema import target_schema_json
from mvsink.table.staging import clustered, discard, stage
from mvsink.table.storage import Store

STRUCT = StructType([StructField("k", LongType()), StructField("s", StringType())])
LAYOUT = Layout(target_schema_json(STRUCT), STRUCT, ())
WHERE = Where("v", "/t", 1)


def rows(*keys: int | None) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()), "s": pa.array([str(k) for k in keys])})


def staged_rows(root, files) -> list:  # type: ignore[no-untyped-def]
    return sorted(k for f in files for k in pq.read_table(os.path.join(root, f.path)).column("k").to_pylist())


def run(plan: Plan, store: Store, **options):  # type: ignore[no-untyped-def]
    return stage(
        plan, store, LAYOUT, view="v", epoch=1, max_rows_per_file=2, cluster_by=(), where=WHERE, **options
    )


def test_a_plan_of_nothing_stages_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert run(Plan(None, 0), Store(str(tmp_path))) is NOTHING


def test_inserts_and_a_rewrite_are_staged_in_a_fresh_folder_and_discarded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Store(str(tmp_path))
    (old,) = store.write("old", rows(1, 2), (), 10, schema=LAYOUT.arrow)
    file = DataFile(old.file.path, old.file.size, old.file.num_records)
    rewrite = Rewrite(file, None, np.array([0], dtype=np.int64))
    staged = run(Plan(rows(3, 4, 5), 3, (rewrite,), replaces_all=True), store)
    assert staged.folder is not None and staged.folder.startswith("mvsink-v-e1-")
    assert all(f.path.startswith(staged.folder) for f in staged.adds)
    assert (staged.inserted, staged.retracted, staged.removes) == (3, 1, (file,))
    assert staged_rows(tmp_path, staged.adds) == [2, 3, 4, 5]
    assert max(f.num_records for f in staged.adds) <= 2
    assert staged.replaces_all and staged.changes == ()
    discard(staged, store, None)
    assert not (tmp_path / staged.folder).exists()


def test_with_change_feed_the_retracted_and_inserted_rows_get_change_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Store(str(tmp_path))
    (old,) = store.write("old", rows(1, 2), (), 10, schema=LAYOUT.arrow)
    file = DataFile(old.file.path, old.file.size, old.file.num_records)
    plan = Plan(rows(3), 1, (Rewrite(file, None, np.array([1], dtype=np.int64)),))
    staged = run(plan, store, change_feed=True)
    kinds = sorted(
        (t, k)
        for f in staged.changes
        for t, k in zip(
            *(pq.read_table(tmp_path / f.path).column(c).to_pylist() for c in (CHANGE_TYPE, "k")), strict=True
        )
    )
    assert kinds == [("delete", 2), ("insert", 3)]
    assert staged_rows(tmp_path, staged.adds) == [1, 3]


def test_rows_staged_other_than_the_plan_needs_fail_and_leave_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Store(str(tmp_path))
    with pytest.raises(InvariantViolation, match="staged 2 rows where the plan needs 3"):
        run(Plan(rows(1, 2), 3), store)
    assert not [p for p in os.listdir(tmp_path) if p.startswith("mvsink-")]


def test_inserts_are_clustered_in_sparks_order_nulls_first() -> None:
    table = rows(3, None, 1)
    fps = (np.array([30, 0, 10]), np.array([-30, 0, -10]))
    out, (a, b) = clustered(table, fps, ["k"])  # type: ignore[misc]
    assert out.column("k").to_pylist() == [None, 1, 3]
    assert a.tolist() == [0, 10, 30] and b.tolist() == [0, -10, -30]
    assert clustered(table, None, [])[0] is table
