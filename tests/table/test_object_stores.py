"""The store suite on Azure Blob Storage (Azurite) and Google Cloud Storage (fake-gcs-server):
what runs on S3 everywhere else, through ``storage_options`` alone (``tests/objectstores.py``).

delta-rs commits a version exclusively by a conditional put of its log file (``If-None-Match:
*`` on Azure, ``ifGenerationMatch=0`` on GCS); ``test_the_store_refuses_a_second_commit_of_a_version``
checks that the emulator honours it, as mvsink's strict compare-and-append relies on it.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties

from mvsink import MVSink, StorageError, frontier
from mvsink.compat import to_arrow
from mvsink.ops.compact import compact
from mvsink.ops.vacuum import vacuum
from tests.helpers import multiset, people
from tests.objectstores import Emulator


def rows(target: str, options: dict[str, str], version: int | None = None) -> pa.Table:
    return DeltaTable(target, version=version, storage_options=options).to_pyarrow_table()


def test_a_view_lives_on_the_store_created_corrected_compacted_and_vacuumed(spark, object_store: Emulator):
    options = object_store.options
    target = f"{object_store.scheme}://{object_store.container()}/views/people"
    sink = MVSink(target, "people", storage_options=options, max_rows_per_file=4)
    assert sink(people(spark, range(20)), 0).outcome == "committed"  # written by Spark tasks
    assert sink(people(spark, range(20)), 1).outcome == "unchanged"  # steady: nothing to write
    desired = people(spark, [*range(5, 20), 40])
    report = sink(desired, 2)
    assert (report.inserted, report.retracted) == (1, 5)
    want = multiset(to_arrow(desired), ["id", "name", "x"])
    assert multiset(rows(target, options)) == want
    # Another writer's row is repaired by the next epoch.
    schema = pa.schema(DeltaTable(target, storage_options=options).schema().to_arrow())
    rogue = pa.Table.from_pylist([{"id": 999, "name": "n9", "x": 1.0}], schema=schema)
    write_deltalake(target, rogue, mode="append", storage_options=options)
    assert sink(desired, 3).retracted == 1
    assert multiset(rows(target, options)) == want and frontier(target, "people", options) == 4
    # Compaction merges the small files in one commit; a vacuum then deletes what it removed.
    DeltaTable(target, storage_options=options).alter.set_table_properties(
        {"delta.deletedFileRetentionDuration": "interval 0 hours"}
    )
    before = set(DeltaTable(target, storage_options=options).file_uris())
    assert compact(target, "people", options, max_rows_per_file=100).files_removed > 0
    after = set(DeltaTable(target, storage_options=options).file_uris())
    assert multiset(rows(target, options)) == want and len(after) < len(before)
    done = vacuum(target, options, apply=True)
    assert done.applied and {f"{target}/{p}" for p in done.data_files} >= before - after
    assert multiset(rows(target, options)) == want
    assert sink(people(spark, range(6, 20)), 4).outcome == "committed"  # the sink goes on
    assert multiset(rows(target, options)) == multiset(
        to_arrow(people(spark, range(6, 20))), ["id", "name", "x"]
    )


def test_bad_credentials_and_a_missing_container_are_one_storage_error(spark, object_store: Emulator):
    container = object_store.container()
    cases = {
        "missing container": (f"{object_store.scheme}://no-such-container-mvsink/v", object_store.options)
    }
    if object_store.scheme == "az":
        wrong = {**object_store.options, "azure_storage_account_key": "d3Jvbmc=" * 11}
        cases["wrong key"] = (f"az://{container}/v", wrong)
    for case, (target, options) in cases.items():
        sink = MVSink(target, "v", storage_options={**options, "max_retries": "1"})
        with pytest.raises(StorageError) as err:
            sink(people(spark, range(3)), 0)
        assert err.value.target == target and target in str(err.value), case
    assert not DeltaTable.is_deltatable(f"{object_store.scheme}://{container}/v", object_store.options)


def test_the_store_refuses_a_second_commit_of_a_version(object_store: Emulator):
    # Two writers that both read version 0 and commit without retrying (as mvsink commits):
    # the store lets one have version 1; the other is refused, and nothing is overwritten.
    options = object_store.options
    target = f"{object_store.scheme}://{object_store.container()}/t"
    write_deltalake(target, pa.table({"a": [0]}), storage_options=options)
    first, second = (DeltaTable(target, storage_options=options) for _ in range(2))
    strict = CommitProperties(max_commit_retries=0)
    write_deltalake(first, pa.table({"a": [1]}), mode="append", commit_properties=strict)
    with pytest.raises(CommitFailedError):
        write_deltalake(second, pa.table({"a": [2]}), mode="append", commit_properties=strict)
    table = DeltaTable(target, storage_options=options)
    assert table.version() == 1 and sorted(table.to_pyarrow_table().column("a").to_pylist()) == [0, 1]
