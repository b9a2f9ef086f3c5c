"""Change files for Change Data Feed: the change type column, and telling change files apart."""

from __future__ import annotations

import pyarrow as pa

from mvsink.table.change_feed import CHANGE_DIR, CHANGE_TYPE, split_changes, with_change_type
from mvsink.table.delta import NewFile
from mvsink.table.storage import Written


def test_a_change_file_holds_the_rows_and_their_change_type() -> None:
    rows = pa.table({"k": [1, 2]})
    out = with_change_type(rows, "delete")
    assert out.column_names == ["k", CHANGE_TYPE]
    assert out.column(CHANGE_TYPE).to_pylist() == ["delete", "delete"]
    assert with_change_type(rows.slice(0, 0), "insert").num_rows == 0


def test_change_files_are_those_under_the_attempts_change_folder() -> None:
    def written(path: str) -> Written:
        return Written(NewFile(path, 1, 1, "{}"))

    data = [written("f/a.parquet"), written("g/_change_data/b.parquet")]
    changes = [written(f"f/{CHANGE_DIR}/c.parquet")]
    assert split_changes("f", [*data, *changes]) == (data, changes)
