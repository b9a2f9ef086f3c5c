"""What becomes of a rewritten file: its kept rows written back (``write_kept``)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.types import LongType, StructField, StructType

from mvsink.errors import InvariantViolation, Where
from mvsink.table.delta import DataFile
from mvsink.table.layout import Layout
from mvsink.table.plan import Rewrite
from mvsink.table.rewrite import write_kept
from mvsink.table.schema import target_schema_json
from mvsink.table.storage import Store

STRUCT = StructType([StructField("k", LongType())])
LAYOUT = Layout(target_schema_json(STRUCT), STRUCT, ())
WHERE = Where("v", "/t", 1)


def stored(tmp_path, keys: list[int]) -> tuple[Store, DataFile]:  # type: ignore[no-untyped-def]
    store = Store(str(tmp_path))
    (w,) = store.write("old", pa.table({"k": pa.array(keys, pa.int64())}), (), 100, schema=LAYOUT.arrow)
    return store, DataFile(w.file.path, w.file.size, w.file.num_records)


def test_the_kept_rows_are_written_back_with_their_fingerprints(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store, file = stored(tmp_path, [1, 2, 3, 4])
    rewrite = Rewrite(file, None, np.array([0, 2], dtype=np.int64))
    kept = write_kept(store, "new", rewrite, LAYOUT, 100, WHERE, hash_kept=True)
    assert kept.rows == 2 and kept.update is None
    (w,) = kept.written
    assert pq.read_table(tmp_path / w.file.path).column("k").to_pylist() == [2, 4]
    assert w.fp_a is not None and len(w.fp_a) == 2


def test_a_file_whose_every_row_goes_is_not_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Store(str(tmp_path))
    gone = DataFile("never-written.parquet", 10, 3)
    kept = write_kept(store, "new", Rewrite(gone, None, np.arange(3, dtype=np.int64)), LAYOUT, 100, WHERE)
    assert (kept.rows, kept.written) == (0, [])


def test_positions_to_drop_must_be_sorted_distinct_and_inside_the_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store, file = stored(tmp_path, [1, 2, 3])
    for drop in ([2, 1], [1, 1], [-1]):
        with pytest.raises(InvariantViolation, match="not distinct and sorted"):
            write_kept(store, "new", Rewrite(file, None, np.array(drop, dtype=np.int64)), LAYOUT, 100, WHERE)
    with pytest.raises(InvariantViolation, match="past its 3 rows"):
        write_kept(
            store, "new", Rewrite(file, None, np.array([5], dtype=np.int64), counted=None), LAYOUT, 100, WHERE
        )
