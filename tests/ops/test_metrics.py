"""The metrics table (``mvsink/ops/metrics.py``): its strict append, through the commit
shim and the one retry loop. The target here is a plain delta-rs table (no view commits, so
no rows): what is tested is the append's race. The rows themselves: tests/ops/test_operations.py."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from mvsink import failpoints
from mvsink.ops import metrics
from tests.helpers import once


def _target(tmp_path) -> str:
    target = str(tmp_path / "view")
    write_deltalake(target, pa.table({"id": [1]}))
    write_deltalake(target, pa.table({"id": [2]}), mode="append")
    return target


def _recorded(metrics_table: str, view: str, target: str) -> int | None:
    return DeltaTable(metrics_table).transaction_version(metrics.app_id(view, target))


def test_the_append_records_how_far_it_got_and_appends_nothing_twice(tmp_path):
    target, table = _target(tmp_path), str(tmp_path / "metrics")
    assert metrics.record(table, "v", target, {}, 1) == 0  # no commit of the view: no rows
    assert _recorded(table, "v", target) == 1 and DeltaTable(table).version() == 0
    assert metrics.record(table, "v", target, {}, 1) == 0  # nothing new: no commit either
    assert DeltaTable(table).version() == 0


def test_an_append_that_loses_the_race_reads_again_and_appends_only_what_is_missing(tmp_path):
    target, table = _target(tmp_path), str(tmp_path / "metrics")
    metrics.record(table, "v", target, {}, 0)
    racing = once(lambda: metrics.record(table, "v", target, {}, 1))  # a replica, in the window
    with failpoints.armed({"metrics_before_commit": racing}):
        assert metrics.record(table, "v", target, {}, 1) == 0
    assert DeltaTable(table).version() == 1 and _recorded(table, "v", target) == 1


def test_two_creators_of_the_metrics_table_one_loses_and_reads_again(tmp_path):
    target, table = _target(tmp_path), str(tmp_path / "metrics")
    racing = once(lambda: metrics.record(table, "v", target, {}, 1))
    with failpoints.armed({"metrics_before_commit": racing}):
        assert metrics.record(table, "v", target, {}, 1) == 0
    assert DeltaTable(table).version() == 0 and _recorded(table, "v", target) == 1


def test_an_append_that_always_loses_gives_up_quietly(tmp_path, caplog):
    target, table = _target(tmp_path), str(tmp_path / "metrics")
    metrics.record(table, "v", target, {}, 0)

    def another_append_lands() -> None:  # in every window
        write_deltalake(table, metrics.SCHEMA.empty_table(), mode="append")

    with failpoints.armed({"metrics_before_commit": another_append_lands}):
        assert metrics.record(table, "v", target, {}, 1) == 0
    assert "lost the commit race 5 times" in caplog.text
    assert _recorded(table, "v", target) == 0 and DeltaTable(table).version() == 5
