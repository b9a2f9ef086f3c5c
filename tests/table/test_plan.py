"""What a planner hands staging (``Plan``) and staging hands the commit (``Staged``)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from mvsink.table.delta import DataFile, NewFile
from mvsink.table.plan import NOTHING, Plan, Rewrite, Staged


def test_a_rewrites_size_is_known_from_its_rows_its_fingerprints_or_the_log() -> None:
    file = DataFile("a.parquet", 10, 5)
    drop = np.array([0], dtype=np.int64)
    assert Rewrite(file, pa.table({"k": [1, 2, 3]}), drop).size == 3
    assert Rewrite(file, None, drop, (np.zeros(4, np.int64), np.zeros(4, np.int64))).size == 4
    assert Rewrite(file, None, drop).size == 5
    assert Rewrite(DataFile("b.parquet", 10, None), None, drop, counted=7).size == 7
    assert Rewrite(DataFile("b.parquet", 10, None), None, drop).size is None


def test_a_plan_retracts_the_rows_its_rewrites_drop_and_reports_what_it_found() -> None:
    rewrites = tuple(Rewrite(DataFile(f"{k}.parquet", 1, 3), None, np.arange(k)) for k in (1, 2))
    plan = Plan(None, 0, rewrites)
    assert plan.retracted == 3
    assert (plan.files_read, plan.replaces_all, plan.ran_batch) == (0, False, False)


def test_the_bytes_an_attempt_wrote_count_its_files_and_vectors() -> None:
    vector = {"sizeInBytes": 30}
    staged = Staged(
        "f",
        (NewFile("f/a", 100, 1, "{}"),),
        {},
        (),
        1,
        0,
        changes=(NewFile("f/_change_data/b", 20, 1, "{}"),),
        updates=(DataFile("c", 500, 2, {}, vector),),
    )
    assert staged.bytes_written == 100 + 20 + 30 + 8
    assert NOTHING.bytes_written == 0 and not NOTHING.replaces_all
