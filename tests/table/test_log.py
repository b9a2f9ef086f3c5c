"""The Delta log read straight from its commit files (``mvsink.table.log``), on tables that
delta-rs writes and on commit files as other engines write them. No Spark."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake

from mvsink import MVSinkError
from mvsink.table.log import REPLAYED, Adds, commit_attempt, commit_info, history, log_actions
from mvsink.table.storage import Store
from tests.helpers import log_entry

ROWS = pa.table({"id": pa.array([1, 2], pa.int64())})


def _commit_file(root: str, version: int, actions: list[dict[str, object]]) -> None:
    """A commit file as another engine writes it (the log reader only reads files)."""
    with open(os.path.join(root, "_delta_log", f"{version:020d}.json"), "w") as fh:
        fh.writelines(json.dumps(a) + "\n" for a in actions)


@pytest.fixture
def table(tmp_path) -> str:
    """Versions 0 and 1 by delta-rs (1 carrying an attempt id), 2 by the JVM Delta (mvsink's
    keys in its tags), 3 with no commitInfo at all."""
    root = str(tmp_path / "t")
    write_deltalake(root, ROWS)
    write_deltalake(
        root,
        ROWS,
        mode="append",
        commit_properties=CommitProperties(custom_metadata={"mvsink.attempt": "a1"}),
    )
    jvm = {"timestamp": 1, "operation": "STREAMING UPDATE", "tags": {"mvsink.attempt": "a2", "other": "x"}}
    _commit_file(root, 2, [{"commitInfo": jvm}, {"txn": {"appId": "mvsink:v", "version": 7}}])
    _commit_file(root, 3, [{"txn": {"appId": "mvsink:v", "version": 8}}])
    return root


def test_commit_info_is_the_versions_own_with_mvsinks_keys_at_the_top_level(table):
    store = Store(table)
    first = commit_info(store, 0)
    assert first is not None
    assert first["version"] == 0
    assert first["operation"] == log_entry(table, 0)[0]["commitInfo"]["operation"]
    assert "mvsink.attempt" not in first
    assert commit_info(store, 1)["mvsink.attempt"] == "a1"  # type: ignore[index]
    jvm = commit_info(store, 2)
    assert jvm is not None
    assert (jvm["version"], jvm["operation"], jvm["mvsink.attempt"]) == (2, "STREAMING UPDATE", "a2")
    assert "other" not in jvm  # only mvsink's tags are lifted
    assert commit_info(store, 3) == {"version": 3}
    assert commit_info(store, 4) is None


def test_a_key_at_the_top_level_wins_over_the_same_key_in_the_tags(tmp_path):
    root = str(tmp_path / "t")
    os.makedirs(os.path.join(root, "_delta_log"))
    info = {"operation": "WRITE", "mvsink.attempt": "top", "tags": {"mvsink.attempt": "tag"}}
    _commit_file(root, 0, [{"commitInfo": info}])
    assert commit_info(Store(root), 0)["mvsink.attempt"] == "top"  # type: ignore[index]


def test_the_commit_attempt_is_the_recorded_id_empty_or_none_and_unknown_without_commit_info(table):
    store = Store(table)
    assert commit_attempt(store, 0) == ""
    assert commit_attempt(store, 1) == "a1"
    assert commit_attempt(store, 2) == "a2"
    assert commit_attempt(store, 9) is None
    with pytest.raises(MVSinkError, match="version 3 records no commitInfo"):
        commit_attempt(store, 3)


def test_log_actions_are_the_commit_files_actions_in_order(table):
    store = Store(table)
    for version in range(4):
        assert log_actions(store, version) == log_entry(table, version)
    assert [next(iter(a)) for a in log_actions(store, 2) or []] == ["commitInfo", "txn"]
    assert log_actions(store, 4) is None


def test_history_is_newest_first_up_to_the_limit_and_skips_versions_cleaned_up(table):
    store = Store(table)
    assert [c["version"] for c in history(store, 3, 10)] == [3, 2, 1, 0]
    assert [c["version"] for c in history(store, 3, 2)] == [3, 2]
    assert [c["version"] for c in history(store, 1, 1)] == [1]
    os.remove(os.path.join(table, "_delta_log", f"{1:020d}.json"))
    assert [c["version"] for c in history(store, 3, 10)] == [3, 2, 0]


def _listed(root: str, version: int) -> dict[str, int]:
    """The files delta-rs lists at ``version``, with their sizes."""
    actions = DeltaTable(root, version=version).get_add_actions(flatten=True)
    paths, sizes = actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist()
    return dict(zip(paths, sizes, strict=True))


def test_adds_carried_forward_are_the_files_delta_rs_lists_at_every_version(tmp_path):
    """Appends, an overwrite and a compaction by delta-rs: the adds read from version 0, and
    those carried from each earlier version, are the files of the version, as delta-rs lists them."""
    root = str(tmp_path / "t")
    write_deltalake(root, ROWS)
    write_deltalake(root, ROWS, mode="append")
    write_deltalake(root, ROWS, mode="overwrite")
    write_deltalake(root, ROWS, mode="append")
    DeltaTable(root).optimize.compact()
    store = Store(root)
    newest = DeltaTable(root).version()
    for version in range(newest + 1):
        adds = Adds.empty().at(store, version)
        assert adds is not None and adds.version == version
        assert {p: a["size"] for p, a in adds.by_path.items()} == _listed(root, version)
        assert adds.totals() == (len(_listed(root, version)), sum(_listed(root, version).values()))
        for later in range(version, newest + 1):
            carried = adds.at(store, later)
            assert carried is not None and carried.by_path == Adds.empty().at(store, later).by_path  # type: ignore[union-attr]


def test_a_commit_that_gives_a_file_a_new_deletion_vector_leaves_it_with_the_new_one(tmp_path):
    """In one commit a file is removed with its old vector and added with a new one (as Delta
    writes it): the file stays, with the new vector; fields a writer adds beyond the protocol's
    are not kept."""
    root = str(tmp_path / "t")
    os.makedirs(os.path.join(root, "_delta_log"))
    old = {"storageType": "u", "pathOrInlineDv": "a", "offset": 1, "sizeInBytes": 3, "cardinality": 1}
    new = {**old, "pathOrInlineDv": "b", "cardinality": 2}
    first = {"path": "f.parquet", "size": 10, "stats": '{"numRecords":5}', "dataChange": True}
    _commit_file(root, 0, [{"commitInfo": {}}, {"add": {**first, "deletionVector": old, "internal": 1}}])
    again = {**first, "deletionVector": new}
    # The add first, as a writer may order them: the remove still applies before it.
    _commit_file(root, 1, [{"add": again}, {"remove": {"path": "f.parquet", "deletionVector": old}}])
    _commit_file(root, 2, [{"add": {"path": "g.parquet", "size": 4}}])
    store = Store(root)
    at0 = Adds.empty().at(store, 0)
    assert at0 is not None and at0.by_path == {"f.parquet": {**first, "deletionVector": old}}
    at2 = at0.at(store, 2)
    assert at2 is not None and at2.vectors() == {"f.parquet": new}
    assert at2.totals() == (2, 14)


def test_adds_that_cannot_be_carried_forward_are_none(tmp_path):
    """An older version, more commits than ``REPLAYED``, or a commit file log cleanup took:
    not known here (the caller loads the version's state another way)."""
    root = str(tmp_path / "t")
    for _ in range(4):
        write_deltalake(root, ROWS, mode="append")
    store = Store(root)
    at2 = Adds.empty().at(store, 2)
    assert at2 is not None
    assert at2.at(store, 1) is None
    os.remove(os.path.join(root, "_delta_log", f"{3:020d}.json"))
    assert at2.at(store, 3) is None
    assert Adds.empty().at(store, 4) is None


def test_adds_are_carried_at_most_replayed_commits_forward(tmp_path):
    root = str(tmp_path / "t")
    os.makedirs(os.path.join(root, "_delta_log"))
    newest = REPLAYED  # from the empty table: REPLAYED + 1 commits; from version 0: REPLAYED
    for version in range(newest + 1):
        _commit_file(root, version, [{"add": {"path": f"{version}.parquet", "size": 1}}])
    store = Store(root)
    assert Adds.empty().at(store, newest) is None
    at0 = Adds.empty().at(store, 0)
    assert at0 is not None
    assert at0.at(store, newest) is not None and at0.at(store, newest).totals() == (newest + 1, newest + 1)  # type: ignore[union-attr]


def test_a_remove_of_another_vector_of_a_path_leaves_the_file_held(tmp_path):
    """A file is its path and its vector: a remove naming the path with a vector the file no
    longer has removes nothing."""
    root = str(tmp_path / "t")
    os.makedirs(os.path.join(root, "_delta_log"))
    now = {"storageType": "u", "pathOrInlineDv": "b", "sizeInBytes": 3, "cardinality": 2}
    _commit_file(root, 0, [{"add": {"path": "f.parquet", "size": 10, "deletionVector": now}}])
    stale = {**now, "pathOrInlineDv": "a"}
    _commit_file(root, 1, [{"remove": {"path": "f.parquet", "deletionVector": stale}}])
    _commit_file(root, 2, [{"remove": {"path": "f.parquet"}}])
    store = Store(root)
    assert Adds.empty().at(store, 1).vectors() == {"f.parquet": now}  # type: ignore[union-attr]
    assert Adds.empty().at(store, 2).vectors() == {"f.parquet": now}  # type: ignore[union-attr]


def test_the_checksum_file_says_where_adds_read_do_not_hold(tmp_path):
    """The JVM Delta's checksum of a version (its files, bytes, vectors and the rows they
    drop) against the adds read: agreeing, one differing, and none to ask."""
    root = str(tmp_path / "t")
    os.makedirs(os.path.join(root, "_delta_log"))
    vector = {"storageType": "u", "pathOrInlineDv": "b", "sizeInBytes": 3, "cardinality": 2}
    _commit_file(root, 0, [{"add": {"path": "f.parquet", "size": 10, "deletionVector": vector}}])
    store = Store(root)
    adds = Adds.empty().at(store, 0)
    assert adds is not None and adds.checksum_problem(store) is None  # no checksum file
    crc = {"numFiles": 1, "tableSizeBytes": 10, "numDeletionVectorsOpt": 1, "numDeletedRecordsOpt": 2}
    path = os.path.join(root, "_delta_log", f"{0:020d}.crc")
    with open(path, "w") as fh:
        json.dump({**crc, "numMetadata": 1}, fh)
    assert adds.checksum_problem(store) is None
    with open(path, "w") as fh:
        json.dump({**crc, "numDeletedRecordsOpt": 3}, fh)
    assert adds.checksum_problem(store) == "numDeletedRecordsOpt 3 in its checksum, 2 read"
