"""Operations: status, the metrics log record, vacuum (verify: tests/ops/test_verify.py)."""

from __future__ import annotations

import json
import logging
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from mvsink import MVSink, failpoints, promote, status
from mvsink.cli.main import main
from mvsink.ops.metrics import record
from mvsink.ops.vacuum import vacuum
from mvsink.ops.verify import verify
from mvsink.table.storage import wait_for_cleanup
from tests.delta_session import DELTA_LINE
from tests.helpers import (
    assert_equal_to,
    foreign_append,
    once,
    people,
    removed,
    versions,
)

# Runs on both engines (tests/conftest.py: each line runs the engine it has).
pytestmark = pytest.mark.usefixtures("engine")


def test_status_counts_rows_only_where_it_can_read_the_deletion_vectors(spark, local_target, capsys):
    """On a table with deletion vectors on, delta-rs lists each file's row count but not the
    rows its vector removes: without Delta in the session the row total is unknown (null in
    ``--json``), never a count of rows the table no longer holds. tests/interop counts the
    rows of a table Delta's DELETE wrote vectors to."""
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    if DELTA_LINE:  # delta-rs 1.6 would list variantType among its reader features: Delta 3.3 cannot read it
        spark.sql(
            f"CREATE TABLE delta.`{local_target}` (id BIGINT, name STRING) USING DELTA "
            "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
        )
    else:
        DeltaTable.create(local_target, schema, configuration={"delta.enableDeletionVectors": "true"})
    write_deltalake(
        local_target, pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"]}, schema=schema), mode="append"
    )
    got = status(local_target)
    assert got.files == 1
    if DELTA_LINE:  # the session's Delta reads the vectors
        assert got.rows == 3
        return
    assert got.rows is None
    assert "rows unknown (deletion vectors" in str(got)
    assert main(["status", local_target, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] is None


def test_status_reads_frontier_last_commit_lag_races_and_files(spark, target, capsys):
    sink = MVSink(target, "people", writer="blue", max_rows_per_file=4)
    sink(people(spark, range(10)), 0)
    # Epoch 1 loses one commit race to a foreign writer, then lands.
    rogue = once(lambda: foreign_append(target, [{"id": 99, "name": "rogue", "x": 0.0}]))
    with failpoints.armed({"before_commit": rogue}, view="people"):
        report = sink(people(spark, range(12)), 1)
    assert report.attempts == 2
    foreign_append(target, [{"id": 98, "name": "later", "x": 0.0}])  # the view is one version behind
    promote(target, "people", "green")

    got = status(target)
    assert got.table_version == versions(target)[-1]
    (view,) = got.views
    assert view.view == "people" and view.frontier == 2
    last = view.last_commit
    assert last is not None and last.version == report.version and last.epoch == 1
    assert (last.inserted, last.retracted) == (report.inserted, report.retracted)
    assert last.writer == "blue" and last.lineage == "direct"
    assert view.versions_behind == 2  # the foreign append and the promotion
    assert (view.commits, view.retried_commits, view.conflicts) == (2, 1, 1)
    assert view.active_writer == "green" and view.owner_generation == 1
    assert got.rows == 13 and got.files >= 4 and got.small_files == got.files  # all under 12,500 rows

    # The CLI's --json is the same figures, as documented.
    assert main(["status", target, "--name", "people", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["format"] == 1 and printed["views"][0]["last_commit"]["epoch"] == 1
    assert printed["views"][0]["frontier"] == 2 and printed["rows"] == 13
    assert main(["status", target]) == 0
    assert "view people: frontier 2" in capsys.readouterr().out


def test_status_of_a_missing_table_and_a_bad_invocation(tmp_path, capsys):
    assert status(str(tmp_path / "none")).table_version is None
    assert main(["status"]) == 2
    assert "give the target" in capsys.readouterr().err


def test_each_epoch_is_one_json_metrics_record(spark, local_target, caplog):
    sink = MVSink(local_target, "m", heartbeat="1h")
    with caplog.at_level(logging.INFO, logger="mvsink.metrics"):
        sink(people(spark, range(5)), 0)
        sink(people(spark, range(5)), 1)
    records = [json.loads(r.getMessage()) for r in caplog.records if r.name == "mvsink.metrics"]
    assert [(r["epoch"], r["outcome"]) for r in records] == [(0, "committed"), (1, "unchanged")]
    assert records[0]["inserted"] == 5 and records[0]["version"] == 0 and "commit" in records[0]["phases"]
    # The unchanged epoch names the version it found equal to desired; no clock, no time.
    unchanged = records[1]
    assert (unchanged["snapshot_version"], unchanged["version"], unchanged["clock_time"]) == (0, None, None)


def _age(path: str, days: float) -> None:
    old = time.time() - days * 86400
    os.utime(path, (old, old))


def test_vacuum_is_a_dry_run_by_default_and_deletes_only_the_unreferenced(spark, local_target, capsys):
    sink = MVSink(local_target, "people", max_rows_per_file=5)
    sink(people(spark, range(20)), 0)
    sink(people(spark, range(3, 20)), 1)  # rewrites a file: its old one is removed, recently
    removed_recently = set(removed(local_target, 1))
    assert removed_recently
    # A crashed attempt's staged file from 10 days ago, and one of an attempt in flight.
    crashed = os.path.join(local_target, "mvsink-people-e7-0123456789ab", "part-0.parquet")
    in_flight = os.path.join(local_target, "mvsink-people-e9-ba9876543210", "part-0.parquet")
    for path in (crashed, in_flight):
        os.makedirs(os.path.dirname(path))
        pq.write_table(pa.table({"id": [1]}), path)
    _age(crashed, 10)
    assert wait_for_cleanup(timeout=None)  # the entries of removed files go in the background
    # Index entries: one of a file that left the table, one of an old layout; both old.
    index = os.path.join(local_target, "_mvsink", "people", "index")
    (digest,) = os.listdir(index)
    stale = [os.path.join(index, digest, "0" * 32 + ".parquet"), os.path.join(index, "0" * 16, "x.parquet")]
    for path in stale:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(pa.table({"a": [1], "b": [2]}), path)
        _age(path, 2)
    live_entries = {p for p in _files(index) if p not in stale}
    assert live_entries

    plan = vacuum(local_target)
    assert not plan.applied and plan.data_files == ("mvsink-people-e7-0123456789ab/part-0.parquet",)
    assert plan.data_bytes == os.path.getsize(crashed)
    assert {os.path.join(local_target, p) for p in plan.index_entries} == set(stale)
    assert os.path.exists(crashed) and all(os.path.exists(p) for p in stale)  # a dry run

    assert main(["vacuum", local_target, "--apply"]) == 0
    assert "deleted 1 data file(s)" in capsys.readouterr().out
    assert not os.path.exists(crashed) and not any(os.path.exists(p) for p in stale)
    assert os.path.exists(in_flight) and live_entries <= _files(index)
    assert all(os.path.exists(os.path.join(local_target, p)) for p in removed_recently)  # in retention
    assert_equal_to(local_target, people(spark, range(3, 20)))
    sink(people(spark, range(5, 20)), 2)  # the sink goes on
    assert_equal_to(local_target, people(spark, range(5, 20)))

    # A retention below the table's is refused, and nothing is deleted.
    assert main(["vacuum", local_target, "--retention-hours", "1", "--apply"]) == 2
    assert "refused" in capsys.readouterr().err and os.path.exists(in_flight)


def test_a_retention_other_than_the_tables_is_refused_and_nothing_is_deleted(spark, local_target, capsys):
    """Below the table's retention a vacuum could delete what a commit or reader still needs;
    above it, it would not keep what it says (Delta keeps removed files on record only that
    long; Delta 4.x's own VACUUM even ignores RETAIN). Either is refused, on either engine;
    raising the table's retention keeps more."""
    MVSink(local_target, "people")(people(spark, range(5)), 0)
    crashed = os.path.join(local_target, "mvsink-people-e7-0123456789ab", "part-0.parquet")
    os.makedirs(os.path.dirname(crashed))
    pq.write_table(pa.table({"id": [1]}), crashed)
    _age(crashed, 10)  # older than the table's 7 days
    before = _files(local_target)
    for hours, why in ((1, "below the table's"), (30 * 24, "above the table's")):
        assert main(["vacuum", local_target, "--retention-hours", str(hours), "--apply"]) == 2
        assert why in capsys.readouterr().err
        assert _files(local_target) == before
    assert vacuum(local_target, retention_hours=7 * 24).data_files == (
        "mvsink-people-e7-0123456789ab/part-0.parquet",
    )
    DeltaTable(local_target).alter.set_table_properties(
        {"delta.deletedFileRetentionDuration": "interval 30 days"}
    )
    assert vacuum(local_target).data_files == ()
    assert main(["vacuum", local_target, "--apply"]) == 0
    assert main(["vacuum", local_target, "--retention-hours", str(30 * 24), "--apply"]) == 0
    assert os.path.exists(crashed)
    DeltaTable(local_target).alter.set_table_properties(
        {"delta.deletedFileRetentionDuration": "interval 1 month"}
    )
    assert (
        main(["vacuum", local_target, "--apply"]) == 2 and "cannot use the table's" in capsys.readouterr().err
    )
    assert os.path.exists(crashed)


def test_the_tables_retention_is_read_as_delta_writes_it():
    from mvsink.ops.vacuum import table_retention_us

    hour = 3_600_000_000
    read = lambda text: table_retention_us({"delta.deletedFileRetentionDuration": text})  # noqa: E731
    assert table_retention_us({}) == 168 * hour
    assert read("interval 2 weeks") == 336 * hour and read("interval 36 hours") == 36 * hour
    assert read("30 days") == read("INTERVAL 30 DAYS") == 720 * hour  # what delta-rs reads as 7 days
    assert read("interval 1 day 12 hours") == 36 * hour and read("interval 90 minutes") == hour * 3 // 2
    assert read("interval 25200000 milliseconds") == 7 * hour and read("interval 1.5 seconds") == 1_500_000
    assert read("interval -1 days") == -24 * hour
    for unread in (
        "interval seven days",
        "interval 1 month",
        "interval 1.5 days",
        "interval 1e2 hours",
        "7 dayss",
    ):
        assert read(unread) is None, unread


def test_vacuum_refuses_a_table_that_holds_another_table(spark, local_target, capsys):
    """A Delta table made inside the view's folder (by hand, or before mvsink refused such
    options) is not referenced by the view's log: a full vacuum would delete it."""
    from deltalake import write_deltalake

    MVSink(local_target, "people")(people(spark, range(5)), 0)
    inner = os.path.join(local_target, "errors")
    write_deltalake(inner, pa.table({"id": [1, 2]}))
    for path in _files(inner):
        _age(path, 30)  # older than the view's retention: vacuum candidates
    before = _files(local_target)
    assert main(["vacuum", local_target, "--apply"]) == 2
    assert "another Delta table in its folder (errors/)" in capsys.readouterr().err
    assert _files(local_target) == before
    assert DeltaTable(inner).to_pyarrow_table().num_rows == 2


def _files(folder: str) -> set[str]:
    return {os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs}


def test_the_metrics_table_gets_each_committed_epoch_once_even_after_a_gap(spark, local_target, tmp_path):
    metrics = str(tmp_path / "metrics")
    sink = MVSink(local_target, "m", metrics_table=metrics, heartbeat="1h")
    reports = [sink(people(spark, range(5)), 0), sink(people(spark, range(5)), 1)]  # 1: unchanged
    # A writer without the option commits epoch 2 (as if the metrics append had crashed).
    MVSink(local_target, "m")(people(spark, range(7)), 2)
    reports.append(sink(people(spark, range(8)), 3))
    got = DeltaTable(metrics).to_pyarrow_table().sort_by("version").to_pylist()
    assert [(r["version"], r["epoch"]) for r in got] == [(0, 0), (1, 2), (2, 3)]
    assert [r["inserted"] for r in got] == [5, 2, 1]
    assert got[2]["attempts"] == 1 and "write" in json.loads(got[2]["phases"])
    assert reports[1].outcome == "unchanged"
    assert record(metrics, "m", local_target, {}, 2) == 0  # already there: nothing twice
    assert DeltaTable(metrics).to_pyarrow_table().num_rows == 3


def test_two_replicas_appending_the_same_range_to_the_metrics_table_append_it_once(
    spark, local_target, tmp_path
):
    """Replica A reads the range, replica B appends it, then A commits: A's commit must be
    made against the snapshot it read (a conflict), not land on top with the same rows."""
    metrics = str(tmp_path / "metrics")
    sink = MVSink(local_target, "m")
    for epoch in range(3):
        sink(people(spark, range(3 + epoch)), epoch)
    record(metrics, "m", local_target, {}, 0)  # the table exists, holding version 0
    racing = once(lambda: record(metrics, "m", local_target, {}, 2))  # B, in A's window
    with failpoints.armed({"metrics_before_commit": racing}):
        assert record(metrics, "m", local_target, {}, 2) == 0
    got = sorted(r["version"] for r in DeltaTable(metrics).to_pyarrow_table().to_pylist())
    assert got == [0, 1, 2]
    # The same race while the metrics table does not exist yet: B creates it first.
    fresh = str(tmp_path / "fresh-metrics")
    racing = once(lambda: record(fresh, "m", local_target, {}, 2))
    with failpoints.armed({"metrics_before_commit": racing}):
        assert record(fresh, "m", local_target, {}, 2) == 0
    assert sorted(r["version"] for r in DeltaTable(fresh).to_pyarrow_table().to_pylist()) == [0, 1, 2]


def test_the_commands_reach_a_store_through_storage_options_or_a_job_file(
    spark, s3_target, s3_options, tmp_path, capsys
):
    sink = MVSink(s3_target, "opts", storage_options=s3_options, max_rows_per_file=4)
    sink(people(spark, range(6)), 0)
    sink(people(spark, range(8)), 1)
    flags = [f for k, v in s3_options.items() for f in ("--storage-option", f"{k}={v}")]
    assert main(["status", s3_target, "--json", *flags]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 8
    spark.range(8).selectExpr("id", "concat('n', id) as name", "id / 2 as x").createOrReplaceTempView("eight")
    assert main(["verify", s3_target, "--sql", "SELECT * FROM eight", *flags]) == 0
    assert main(["compact", s3_target, "--name", "opts", "--max-rows-per-file", "100", *flags]) == 0
    assert main(["vacuum", s3_target, *flags]) == 0
    out, err = capsys.readouterr()
    assert "compacted" in out and "would delete" in out and err == ""  # no progress off a terminal
    job = tmp_path / "job.toml"
    job.write_text(
        f'[sink]\ntarget = "{s3_target}"\nname = "opts"\n[sink.storage_options]\n'
        + "".join(f'{k} = "{v}"\n' for k, v in s3_options.items())
    )
    assert main(["status", "--job", str(job), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["views"][0]["view"] == "opts"
    assert main(["status", s3_target]) == 2  # the environment's server has no such table
    assert "no Delta table" in capsys.readouterr().err
    assert verify(people(spark, range(8)), s3_target, "opts", s3_options).equal
