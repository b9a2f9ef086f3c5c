"""The Delta log read straight from its commit files (``mvsink.table.log``), on tables that
delta-rs writes and on commit files as other engines write them. No Spark."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest
from deltalake import CommitProperties, write_deltalake

from mvsink import MVSinkError
from mvsink.table.log import commit_attempt, commit_info, history, log_actions
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
