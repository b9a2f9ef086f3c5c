"""Races, foreign commits and compactions landing between a sink's snapshot and its commit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter

import pytest
from deltalake import DeltaTable

from mvsink import MVSink, RetriesExhaustedError, failpoints, frontier
from tests.delta_session import delta_conf
from tests.helpers import (
    added,
    assert_equal_to,
    commit_info,
    data_files_on_disk,
    foreign_append,
    live_files,
    multiset,
    once,
    people,
    removed,
    target_table,
    versions,
)

# Runs on both engines (tests/conftest.py: each line runs the engine it has).
pytestmark = pytest.mark.usefixtures("engine")

RETRY_FAST = {"initial_backoff_s": 0.0, "max_attempts": 3}


def test_a_compaction_between_snapshot_and_commit_does_not_lose_a_retraction(spark, target, placement):
    sink = MVSink(target, "compact", max_rows_per_file=2, retry=RETRY_FAST, placement=placement)
    sink(people(spark, range(10)), 0)
    small_files = live_files(target)
    assert len(small_files) >= 4
    compacted = {}

    def compact():
        compacted["metrics"] = DeltaTable(target).optimize.compact()

    desired = people(spark, [i for i in range(10) if i != 3])
    with failpoints.armed({"before_commit": once(compact)}, view="compact"):
        report = sink(desired, 1)
    assert compacted["metrics"]["numFilesRemoved"] >= 2  # the compaction really committed
    # The first commit was refused (strict compare-and-append); the retry ran against the
    # compacted files and row 3 is gone, not resurrected through the compacted file.
    assert report.attempts == 2
    assert_equal_to(target, desired)
    assert frontier(target, "compact") == 2
    assert set(removed(target, report.version)) <= {p for v in versions(target) for p in added(target, v)}


def test_a_foreign_append_in_the_commit_window_is_retried_and_repaired(spark, target, placement):
    sink = MVSink(target, "window", retry=RETRY_FAST, placement=placement)
    sink(people(spark, range(5)), 0)
    desired = people(spark, range(6))
    rogue = once(lambda: foreign_append(target, [{"id": 77, "name": "rogue", "x": 0.0}]))
    with failpoints.armed({"before_commit": rogue}, view="window"):
        report = sink(desired, 1)
    assert report.attempts == 2 and report.outcome == "committed"
    assert_equal_to(target, desired)


def test_a_replica_that_loses_the_race_does_not_commit_twice(spark, target, placement):
    a = MVSink(target, "rep", retry=RETRY_FAST, placement=placement)
    b = MVSink(target, "rep", retry=RETRY_FAST, placement=placement)
    a(people(spark, range(5)), 0)
    desired = people(spark, range(2, 9))
    before = versions(target)
    with failpoints.armed({"before_commit": once(lambda: b(desired, 1))}, view="rep"):  # b first
        report = a(desired, 1)
    assert report.outcome == "replay" and report.attempts == 2
    assert versions(target) == [*before, before[-1] + 1]  # exactly one commit for epoch 1
    assert_equal_to(target, desired)
    # a's staged files of the lost attempt are gone; only committed files are on disk.
    assert data_files_on_disk(target) == {p for v in versions(target) for p in added(target, v)}


def test_a_newer_epoch_committed_by_a_replica_supersedes_ours(spark, target, placement):
    a = MVSink(target, "newer", retry=RETRY_FAST, placement=placement)
    b = MVSink(target, "newer", retry=RETRY_FAST, placement=placement)
    a(people(spark, range(5)), 0)
    with failpoints.armed({"before_commit": once(lambda: b(people(spark, range(30, 33)), 2))}, view="newer"):
        report = a(people(spark, range(10)), 1)
    assert report.outcome == "replay"
    assert frontier(target, "newer") == 3
    assert_equal_to(target, people(spark, range(30, 33)))


def test_exhausted_retries_raise_and_leave_no_staged_files(spark, target, placement):
    sink = MVSink(target, "busy", retry=RETRY_FAST, placement=placement)
    sink(people(spark, range(5)), 0)
    rogue = lambda snap: foreign_append(target, [{"id": 1, "name": "x", "x": 1.0}])  # noqa: E731
    armed = failpoints.armed({"before_commit": rogue}, view="busy")
    with armed, pytest.raises(RetriesExhaustedError) as info:
        sink(people(spark, range(3)), 1)
    err = info.value
    assert (err.view, err.target, err.epoch) == ("busy", target, 1)
    assert "busy" in str(err) and target in str(err) and "epoch 1" in str(err)
    assert frontier(target, "busy") == 1
    assert data_files_on_disk(target) == {p for v in versions(target) for p in added(target, v)}


WORKER = r"""
import json, sys, time, os
sys.path.insert(0, os.getcwd())
from mvsink.cli.session import local_session
from mvsink import MVSink
target, go, epochs, mode, placement = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
engine, conf = sys.argv[6], json.loads(sys.argv[7])
spark = local_session("race", conf={"spark.driver.memory": "1g", **conf})
keys = {"key": ["id"]} if mode == "upsert" else {}
retry = {"initial_backoff_s": 0.01, "max_attempts": 50}
sink = MVSink(
    target, "race", mode=mode, max_rows_per_file=4, retry=retry, **keys, placement=placement, engine=engine
)
rows = [[(i, f"e{e}-{i % 3}") for i in range(e, e + 12)] for e in range(epochs)]
frames = [spark.createDataFrame(r, "id long, v string") for r in rows]
for f in frames:
    f.cache().count()
while not os.path.exists(go):
    time.sleep(0.05)
out = []
for e, f in enumerate(frames):
    r = sink(f, e)
    out.append([r.outcome, r.attempts])
print(json.dumps(out))
"""


def expected_after(mode: str, epoch: int) -> Counter:
    """What the view holds after ``epoch``: the batch itself (complete), or every key's latest row."""
    if mode == "complete":
        return Counter((i, f"e{epoch}-{i % 3}") for i in range(epoch, epoch + 12))
    # Batch e upserts ids e..e+11; id i was last written by epoch min(i, e).
    return Counter((i, f"e{min(i, epoch)}-{i % 3}") for i in range(epoch + 12))


@pytest.mark.parametrize(
    ("target", "mode"),
    # In make soak: on Azure, the store's exclusive put is the S3 run's mechanism again; in upsert
    # mode on local disk, the commit turn of tests/table/test_commit.py in processes.
    [
        ("s3", "complete"),
        pytest.param("local", "upsert", marks=pytest.mark.soak),
        pytest.param("azure", "complete", marks=pytest.mark.soak),
    ],
    indirect=["target"],
    ids=["s3-complete", "local-upsert", "azure-complete"],
)
@pytest.mark.newest_line
def test_two_processes_racing_on_the_same_epochs(spark, target, tmp_path, mode, engine):
    epochs = 5
    go = str(tmp_path / "go")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    # Each process is a replica with a session of its own: the engine is named, not forced.
    conf = delta_conf(tmp_path / "warehouse") if engine == "delta-spark" else {}
    named = engine if engine == "delta-spark" else "auto"
    procs = [
        subprocess.Popen(
            # One replica plans on the driver, the other in Spark: they must agree.
            [sys.executable, str(script), target, go, str(epochs), mode, placement, named, json.dumps(conf)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=os.getcwd(),
        )
        for placement in ("driver", "distributed")
    ]
    time.sleep(1)
    open(go, "w").close()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    desired = [expected_after(mode, e) for e in range(epochs)]
    assert frontier(target, "race") == epochs
    # Every committed version holds exactly one epoch's desired: never a duplicated row.
    for v in versions(target):
        upper = DeltaTable(target, version=v).transaction_version("mvsink:race")
        assert multiset(target_table(target, v)) == desired[upper - 1], f"version {v}"
    # Each epoch was committed by exactly one of the two.
    committed = sorted(e for r in results for e, (outcome, _) in enumerate(r) if outcome == "committed")
    assert len(committed) == len(set(committed))
    assert data_files_on_disk(target) == {p for v in versions(target) for p in added(target, v)}
    if engine == "delta-spark":  # after delta-rs made the table, every commit was the JVM's
        assert all("Delta-Lake/" in commit_info(target, v)["engineInfo"] for v in versions(target)[1:])
    print("race attempts:", results)
