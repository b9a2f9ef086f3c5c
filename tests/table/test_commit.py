"""A commit call that errors may still have landed: the log decides, and nothing it may
reference is ever deleted (issue: a landed commit is never undone)."""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from mvsink import CommitOutcomeUnknownError, MVSink, failpoints, frontier
from mvsink.table.log import commit_attempt, history
from mvsink.table.storage import Store
from tests.helpers import (
    added,
    assert_equal_to,
    commit_info,
    data_files_on_disk,
    exists,
    live_files,
    log_entry,
    once,
    people,
    target_table,
    versions,
)

# Runs on both engines (tests/conftest.py: each line runs the engine it has).
pytestmark = pytest.mark.usefixtures("engine")

RETRY_FAST = {"initial_backoff_s": 0.0, "max_attempts": 3}


def referenced_files_exist(target: str) -> bool:
    return all(exists(target, p) for p in live_files(target))


def test_a_checkpoint_that_fails_after_the_commit_leaves_the_commit_and_its_files(
    spark, local_target, caplog, engine
):
    if engine == "delta-spark":
        pytest.skip(
            "the JVM writes its own checkpoints in a post-commit hook, whose failure it logs (or, "
            "set to throw, is the lost reply test_a_commit_call_that_fails_after_landing covers)"
        )
    target = local_target  # the checkpoint is made to fail by a folder in its place on disk
    sink = MVSink(target, "ckpt")
    for epoch in range(3):
        sink(people(spark, range(epoch, epoch + 5)), epoch)
    DeltaTable(target).alter.set_table_properties({"delta.checkpointInterval": "2"})
    next_version = DeltaTable(target).version() + 1
    if next_version % 2:
        sink(people(spark, range(3, 8)), 3)
        next_version += 1
    epoch = frontier(target, "ckpt")
    # A directory where the checkpoint file of the next version goes: writing it must fail.
    os.makedirs(os.path.join(target, "_delta_log", f"{next_version:020d}.checkpoint.parquet"))
    desired = people(spark, range(10, 16))
    with caplog.at_level(logging.WARNING, logger="mvsink"):
        report = sink(desired, epoch)
    assert report.outcome == "committed" and report.version == next_version
    assert frontier(target, "ckpt") == epoch + 1
    assert referenced_files_exist(target)
    assert_equal_to(target, desired)
    assert any("checkpoint" in r.getMessage() for r in caplog.records)
    # And the view goes on.
    later = people(spark, range(12, 20))
    sink(later, epoch + 1)
    assert_equal_to(target, later)


@pytest.mark.parametrize("error", [OSError, CommitFailedError])
def test_a_commit_call_that_fails_after_landing_is_taken_as_committed(spark, target, error):
    sink = MVSink(target, "landed")
    sink(people(spark, range(5)), 0)

    def fail() -> None:
        # A lost reply (then "version exists" on the client's retry of its own put).
        raise error("the commit was written but the reply was lost")

    desired = people(spark, range(2, 9))
    with failpoints.armed({"after_commit_call": once(fail)}, view="landed"):
        report = sink(desired, 1)
    assert report.outcome == "committed" and report.attempts == 1
    assert report.version == versions(target)[-1]
    assert referenced_files_exist(target)
    assert_equal_to(target, desired)
    assert commit_info(target, report.version)["mvsink.attempt"]


def test_a_landed_commit_is_ours_though_another_landed_after_it(spark, target):
    """The reply is lost, and before the sink reads the log back another writer's commit
    lands on top of ours. The version's own log file decides: ours, committed, nothing
    discarded."""
    sink = MVSink(target, "landed")
    sink(people(spark, range(5)), 0)

    def another_then_fail() -> None:
        DeltaTable(target).delete("id = 8")  # another writer's commit on top of ours
        raise OSError("the commit was written but the reply was lost")

    with failpoints.armed({"after_commit_call": once(another_then_fail)}, view="landed"):
        report = sink(people(spark, range(2, 9)), 1)
    assert report.outcome == "committed" and report.attempts == 1
    assert report.version == versions(target)[-2] and referenced_files_exist(target)


def test_a_commit_another_writer_replaced_after_it_was_reported_is_raised_at_the_next_epoch(spark, target):
    """A writer whose commits are not exclusive the way the sink's are can put its commit file
    over one the sink landed and reported (docs/design.md: a Spark job's Delta on S3 or local
    disk; tests/interop/test_jvm_commit_store.py races one for real). Here that writer's file
    (an empty commit of its own) replaces version 1 after epoch 1 reported it: epoch 2 raises
    ``CommitReplacedError`` before staging anything; run again, it repairs the view."""
    from mvsink import CommitReplacedError
    from tests.helpers import store

    sink = MVSink(target, "replaced")
    sink(people(spark, range(5)), 0)
    assert sink(people(spark, range(2, 9)), 1).version == 1
    foreign = json.dumps({"commitInfo": {"timestamp": 1, "operation": "DELETE", "engineInfo": "other"}})
    store(target).put(f"_delta_log/{1:020}.json", (foreign + "\n").encode())
    files = sorted(store(target).files(""))
    with pytest.raises(CommitReplacedError, match="version 1, which epoch 1 of this sink") as info:
        sink(people(spark, range(2, 9)), 2)
    assert "(DELETE)" in str(info.value) and info.value.epoch == 2
    # Nothing staged, no data file touched (the index may drop entries of files that left the
    # log, in the background: a cache of the sink's, not the table).
    now = sorted(store(target).files(""))
    assert versions(target) == [0, 1] and set(now) <= set(files)
    assert [f for f in now if not f.startswith("_mvsink/")] == [
        f for f in files if not f.startswith("_mvsink/")
    ]
    assert sink(people(spark, range(2, 9)), 2).version == 2  # told once: the next attempt repairs
    assert_equal_to(target, people(spark, range(2, 9)))
    assert sink(people(spark, range(2, 10)), 3).version == 3  # its own commits pass the check


def test_a_landed_commit_without_commit_info_keeps_its_files(spark, local_target):
    """A commit without a commitInfo (a writer told not to record one) cannot be told apart:
    the outcome is unknown and nothing it may reference is deleted, never a conflict."""
    sink = MVSink(local_target, "landed", retry=RETRY_FAST)
    sink(people(spark, range(5)), 0)

    def strip_then_fail() -> None:
        newest = max(versions(local_target))
        path = os.path.join(local_target, "_delta_log", f"{newest:020}.json")
        with open(path) as f:
            kept = [line for line in f if '"commitInfo"' not in line]
        with open(path, "w") as f:
            f.writelines(kept)
        raise OSError("the commit was written but the reply was lost")

    armed = failpoints.armed({"after_commit_call": once(strip_then_fail)}, view="landed")
    with armed, pytest.raises(CommitOutcomeUnknownError, match="records no commitInfo"):
        sink(people(spark, range(2, 9)), 1)
    assert referenced_files_exist(local_target)
    assert_equal_to(local_target, people(spark, range(2, 9)))


@pytest.mark.single_engine
def test_what_the_log_says_of_a_version_is_read_from_that_version(spark, local_target):
    """A trap in delta-rs (1.6): ``DeltaTable.history`` lists the log's files past the version
    the table was loaded at and numbers them counting down from that version, so a commit
    that lands in between shifts every number. mvsink reads a version's commit info from
    the version's own file (``log.commit_info``)."""
    sink = MVSink(local_target, "v")
    for epoch in range(3):
        sink(people(spark, range(epoch, 5)), epoch)
    loaded = DeltaTable(local_target)  # at version 2
    MVSink(local_target, "other", take_over="v")(people(spark, range(3)), 0)  # version 3 lands
    shifted = {c["version"]: c.get("mvsink.view") for c in loaded.history(3)}
    assert shifted[2] == "other" and loaded.version() == 2  # the trap: version 3, labelled 2
    store = Store(local_target)
    assert [(c["version"], c["mvsink.epoch"]) for c in history(store, 2, 3)] == [(2, "2"), (1, "1"), (0, "0")]
    assert commit_attempt(store, 2) == commit_info(local_target, 2)["mvsink.attempt"]
    assert commit_attempt(store, 4) is None


@pytest.mark.parametrize("damage", ["moved", "replaced_by_a_file"])
def test_when_the_log_cannot_tell_the_staged_files_are_kept(spark, local_target, damage):
    target = local_target  # the outage is staged by moving the log folder on disk
    sink = MVSink(target, "unknown")
    sink(people(spark, range(5)), 0)
    log_dir = os.path.join(target, "_delta_log")
    aside = target + "-log-aside"

    def storage_outage() -> None:
        shutil.move(log_dir, aside)
        if damage == "replaced_by_a_file":
            with open(log_dir, "w") as fh:
                fh.write("not a directory")
        raise OSError("timeout after the commit request was sent")

    desired = people(spark, range(3, 9))
    on_disk = data_files_on_disk(target)
    armed = failpoints.armed({"after_commit_call": once(storage_outage)}, view="unknown")
    with armed, pytest.raises(CommitOutcomeUnknownError) as err:
        sink(desired, 1)
    assert err.value.epoch == 1 and err.value.view == "unknown"
    assert "kept" in str(err.value)
    # Storage comes back: the commit had landed, and every file it references is still there.
    if os.path.isfile(log_dir):
        os.remove(log_dir)
    shutil.move(aside, log_dir)
    assert data_files_on_disk(target) > on_disk
    assert referenced_files_exist(target)
    assert_equal_to(target, desired)
    # Spark reruns the failed batch: the log says it is written.
    again = sink(desired, 1)
    assert again.outcome == "replay"
    assert_equal_to(target, desired)


def test_two_writers_creating_the_table_at_once_conflict_cleanly(spark, target):
    a = MVSink(target, "create", retry=RETRY_FAST)
    b = MVSink(target, "create", retry=RETRY_FAST)
    desired = people(spark, range(6))
    with failpoints.armed({"before_commit": once(lambda: b(desired, 0))}, view="create"):  # b first
        report = a(desired, 0)
    assert report.outcome == "replay" and report.attempts == 2
    assert versions(target) == [0]
    assert_equal_to(target, desired)
    # a's staged files of the lost attempt are gone.
    assert data_files_on_disk(target) == set(added(target, 0))


def test_each_commit_names_its_attempt_and_dates_the_frontier(spark, target):
    sink = MVSink(target, "dated")
    sink(people(spark, range(3)), 0)
    sink(people(spark, range(4)), 1)
    attempts = {commit_info(target, v)["mvsink.attempt"] for v in versions(target)}
    assert len(attempts) == 2 and all(len(a) >= 16 for a in attempts)
    txns = [a["txn"] for v in versions(target) for a in log_entry(target, v) if "txn" in a]
    frontiers = [t for t in txns if t["appId"] == "mvsink:dated"]
    assert [t["version"] for t in frontiers] == [1, 2]
    # The first commit also claims the view for its lineage (lineage.py).
    assert {t["appId"] for t in txns} >= {"mvsink:dated#owner"}
    assert all(isinstance(t.get("lastUpdated"), int) and t["lastUpdated"] > 0 for t in txns)
    assert target_table(target).num_rows == 4
