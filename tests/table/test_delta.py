"""The Delta shim (``mvsink/table/delta.py``): snapshots, their properties and engine, and
the one mapping of delta-rs's errors. Tables are made by delta-rs here: no Spark."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from mvsink.errors import (
    ConfigError,
    ConflictError,
    InvariantViolation,
    StorageError,
    UnsupportedTableError,
    Where,
)
from mvsink.table import delta

WHERE = Where("v", "/t")
ROWS = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["a", "b", "c"]})


def test_no_table_is_a_snapshot_that_does_not_exist(tmp_path):
    target = str(tmp_path / "t")
    snap = delta.load_snapshot(target, "mvsink:v", {}, WHERE)
    assert not snap.exists and snap.files == () and snap.frontier is None
    assert delta.open_existing(target) is None and delta.read_frontier(target, "mvsink:v", {}) is None


def test_a_table_name_is_refused_here(tmp_path):
    with pytest.raises(ConfigError, match="is a table name"):
        delta.load_snapshot("db.table", "mvsink:v", {}, WHERE)


def test_a_snapshot_lists_the_files_and_carries_the_parsed_properties(tmp_path):
    target = str(tmp_path / "t")
    config = {"delta.checkpointInterval": "5", "delta.deletedFileRetentionDuration": "interval 2 days"}
    write_deltalake(target, ROWS, configuration=config)
    write_deltalake(target, ROWS, mode="append")
    snap = delta.load_snapshot(target, "mvsink:v", {}, WHERE)
    assert snap.exists and snap.version == 1 and snap.engine == "delta-rs"
    assert len(snap.files) == 2 and sum(f.num_records or 0 for f in snap.files) == 6
    assert snap.properties.checkpoint_interval == 5 and snap.properties.retention_us == 48 * 3_600_000_000
    assert not snap.change_feed and not snap.deletion_vectors
    assert snap.bounds("id") is not None
    assert delta.read_table(target).num_rows == 6
    sample, total = delta.read_sample(target, None, 2)
    assert sample.num_rows == 2 and total == 6


def test_change_feed_is_read_from_the_properties(tmp_path):
    target = str(tmp_path / "t")
    write_deltalake(target, ROWS, configuration={"delta.enableChangeDataFeed": "true"})
    assert delta.load_snapshot(target, "mvsink:v", {}, WHERE, writing=False).change_feed


def test_a_table_whose_app_transactions_expire_is_refused(tmp_path):
    target = str(tmp_path / "t")
    write_deltalake(target, ROWS, configuration={"delta.setTransactionRetentionDuration": "interval 1 days"})
    with pytest.raises(UnsupportedTableError, match="setTransactionRetentionDuration"):
        delta.load_snapshot(target, "mvsink:v", {}, WHERE)


def test_every_delta_error_maps_to_an_mvsink_error_in_one_place():
    cases = [
        (CommitFailedError("version 3 exists"), ConflictError, "another commit landed first"),
        (DeltaError("bad protocol"), UnsupportedTableError, "cannot read it: bad protocol"),
        (OSError("connection reset"), StorageError, "cannot read it: connection reset"),
    ]
    for raised, mapped, message in cases:
        with pytest.raises(mapped, match=message) as info, delta.delta_errors(WHERE, "read it"):
            raise raised
        assert info.value.view == "v" and info.value.__cause__ is raised
    with (
        pytest.raises(ConfigError, match="no table there"),
        delta.delta_errors(WHERE, "x", missing="no table there"),
    ):
        raise TableNotFoundError("gone")
    with pytest.raises(TableNotFoundError), delta.delta_errors(WHERE, "x"):
        raise TableNotFoundError("gone")
    with pytest.raises(InvariantViolation), delta.delta_errors(WHERE, "x"):  # mvsink's own pass through
        raise InvariantViolation("ours", WHERE)


def test_delta_rs_says_whether_it_writes_a_table(tmp_path):
    target = str(tmp_path / "t")
    assert delta.delta_rs_refusal(target, {}) is None  # no table: loading says what is wrong
    write_deltalake(target, ROWS)
    assert delta.delta_rs_refusal(target, {}) is None
