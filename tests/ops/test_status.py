"""Status: small files judged as the view's last compaction judged them, and what is at a
target that holds no Delta table."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from mvsink import MVSink, status
from mvsink.ops.compact import compact
from mvsink.ops.status import describe_missing_table
from tests.helpers import commit_info, people, put_parquet

# Runs on both engines (tests/conftest.py: each line runs the engine it has).
pytestmark = pytest.mark.usefixtures("engine")


def test_small_files_are_judged_by_the_rows_per_file_of_the_last_compaction(spark, local_target):
    """Issue 53: right after ``compact --max-rows-per-file 100`` the files it wrote are full to
    it, not small against a quarter of the sink's default 50,000; a later small file still is."""
    sink = MVSink(local_target, "v", max_rows_per_file=20)
    sink(people(spark, range(200)), 0)  # ten files of 20 rows
    before = status(local_target, small_rows=12_500)  # as the CLI asks, without a job file
    assert (before.files, before.small_files, before.small_rows) == (10, 10, 12_500)
    assert before.compacted_to is None

    done = compact(local_target, "v", max_rows_per_file=100)
    assert (done.files_removed, done.files_added) == (10, 2)
    assert commit_info(local_target, done.version)["mvsink.max_rows_per_file"] == "100"
    after = status(local_target, small_rows=12_500)
    assert (after.files, after.small_files, after.small_rows, after.compacted_to) == (2, 0, 25, 100)
    judged = "0 with fewer than 25 rows; the last compaction wrote files of up to 100 rows"
    assert judged in str(after)
    assert after.to_json()["compacted_to"] == 100

    sink(people(spark, range(205)), 1)  # five rows more: a small file to the compaction too
    assert status(local_target, "v", small_rows=12_500).small_files == 1

    # A compaction to bigger files than the sink's own does not make the sink's files small.
    compact(local_target, "v", max_rows_per_file=1_000_000)
    bigger = status(local_target, "v", small_rows=10)
    assert (bigger.compacted_to, bigger.small_rows) == (1_000_000, 10)


@pytest.mark.single_engine  # no table is made: nothing commits
def test_what_is_there_when_there_is_no_delta_table(spark, tmp_path):
    """A Parquet folder Spark wrote, a missing path, an empty folder, a file, a folder inside a
    table and one holding a table: each says what it is, not only that no table is there."""
    parquet = str(tmp_path / "parquet")
    spark.range(10).repartition(3).write.parquet(parquet)  # part files, _SUCCESS and .crc files
    said = describe_missing_table(parquet, {})
    assert said == (
        f"no Delta table at {parquet}: it holds 3 Parquet file(s) but no _delta_log: not a Delta table "
        "(write it with Delta, or point at the table's root)"
    )
    missing = str(tmp_path / "missing")
    assert describe_missing_table(missing, {}) == f"no Delta table at {missing}: the folder does not exist"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert describe_missing_table(str(empty), {}).endswith(
        ": the folder is empty (a sink makes the table at its first epoch)"
    )
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    assert describe_missing_table(str(a_file), {}).endswith(": it is a file, not a folder")

    table = str(tmp_path / "lake" / "table")
    write_deltalake(table, pa.table({"p": [1, 2], "id": [1, 2]}), partition_by=["p"])
    inside = os.path.join(table, "p=1")
    assert describe_missing_table(inside, {}).endswith(
        f": it is a folder inside the Delta table at {table}: point at the table's root"
    )
    lake = str(tmp_path / "lake")
    assert describe_missing_table(lake, {}).endswith(
        ": it holds Delta table(s) in sub-folders (table/): point at the table's root"
    )
    for where in (parquet, missing, str(empty)):
        assert status(where).table_version is None  # what the CLI asks before describing it


@pytest.mark.single_engine  # no table is made: nothing commits
def test_what_is_there_on_an_object_store_too(target):
    """An object store has no folders: nothing stored under a path is all there is to say; a
    Parquet file there is found as on local disk."""
    said = describe_missing_table(target, {})
    if target.startswith("s3://"):
        assert said.endswith(
            ": nothing is stored under it (an object store has no empty folders: "
            "check the path, or no sink has committed there yet)"
        )
    else:
        assert said.endswith(": the folder does not exist")
    put_parquet(target, "part-0.parquet", pa.table({"id": [1]}))
    assert describe_missing_table(target, {}).endswith(
        ": it holds 1 Parquet file(s) but no _delta_log: not a Delta table (write it with Delta, or "
        "point at the table's root)"
    )
