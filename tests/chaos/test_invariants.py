"""The history checker (``invariants.py``) finds what it is there to find: each rule is broken
on purpose in a real table's log, and the checker names it."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from mvsink import MVSink
from tests.chaos.invariants import check_history, check_metrics, check_verdicts


def rows(epoch: int) -> Counter[tuple[int, int]]:
    return Counter((i, i + epoch) for i in range(5))


def history_of(spark: Any, target: str, epochs: int = 3, **options: Any) -> MVSink:
    sink = MVSink(target, "v", max_rows_per_file=2, **options)
    for epoch in range(epochs):
        sink(spark.range(5).selectExpr("id", f"id + {epoch} AS v"), epoch)
    return sink


def commit(target: str, version: int) -> list[dict[str, Any]]:
    path = Path(target, "_delta_log", f"{version:020}.json")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def forge(target: str, actions: list[dict[str, Any]]) -> int:
    """Write ``actions`` as the table's next version, as a faulty writer would."""
    version = DeltaTable(target).version() + 1
    Path(target, "_delta_log", f"{version:020}.json").write_text("\n".join(map(json.dumps, actions)) + "\n")
    return version


def check(target: str) -> list[str]:
    return check_history(target, {}, "v", rows, ["id", "v"]).violations


def test_the_history_check_passes_an_exact_history_and_names_a_wrong_one(spark, local_target):
    sink = history_of(spark, local_target, epochs=2)
    # A rogue row, then the view commit that repairs it.
    write_deltalake(local_target, pa.table({"id": [99], "v": [0]}), mode="append")
    sink(spark.range(5).selectExpr("id", "id + 2 AS v"), 2)

    good = check_history(local_target, {}, "v", rows, ["id", "v"])
    assert good.violations == [] and (good.versions, good.view_commits, good.compared) == (4, 3, 3)
    assert good.files >= 3 and good.last == 2 and sorted(good.commits) == [0, 1, 3]

    wrong = check_history(local_target, {}, "v", lambda e: rows(e + 1), ["id", "v"])
    assert len(wrong.violations) == 3 and all("not desired at epoch" in v for v in wrong.violations)


def test_a_referenced_file_that_is_gone_is_named(spark, local_target):
    history_of(spark, local_target)
    first = next(a["add"]["path"] for a in commit(local_target, 0) if "add" in a)
    os.remove(os.path.join(local_target, first))  # removed by version 1 or 2: a bad vacuum
    found = check(local_target)
    assert any(first in v and "does not read" in v for v in found), found


def test_a_commit_replayed_into_the_log_breaks_the_frontier_and_the_once_rules(spark, local_target):
    history_of(spark, local_target)
    replayed = [a for a in commit(local_target, 1) if "add" in a or "commitInfo" in a or "txn" in a]
    version = forge(local_target, replayed)
    found = check(local_target)
    assert any(f"v{version}: lineage direct moved its frontier to 2" in v for v in found), found
    assert any(f"v{version}: epoch 1 of lineage direct committed again" in v for v in found), found


def test_files_staged_for_another_epoch_are_named(spark, local_target):
    history_of(spark, local_target)
    actions = commit(local_target, 2)
    for a in actions:
        info = a.get("commitInfo")
        if info is not None:  # claims epoch 3 with epoch 2's files
            info.update({"mvsink.epoch": "3", "mvsink.upper": "4"})
    version = forge(local_target, actions)
    found = check(local_target)
    assert any(f"v{version}: adds mvsink-v-e2-" in v and "not staged by epoch 3" in v for v in found), found


def test_a_compaction_that_changes_rows_and_a_gap_in_the_log_are_named(spark, local_target):
    history_of(spark, local_target)
    # "Changes no data", yet it drops a file of the table.
    dropped = next(a["add"] for a in commit(local_target, 2) if "add" in a)
    remove = {"path": dropped["path"], "dataChange": False, "deletionTimestamp": 1}
    lossy = forge(local_target, [{"remove": remove}, {"commitInfo": {"operation": "OPTIMIZE"}}])
    found = check(local_target)
    assert any(f"v{lossy}: changes no data" in v for v in found), found

    os.rename(
        os.path.join(local_target, "_delta_log", f"{lossy:020}.json"),
        os.path.join(local_target, "_delta_log", f"{lossy + 1:020}.json"),
    )
    assert any("not 0.." in v for v in check(local_target))


def test_the_metrics_check_names_a_commit_recorded_twice_or_missing(spark, tmp_path, local_target):
    metrics = str(tmp_path / "metrics")
    history_of(spark, local_target, metrics_table=metrics)
    history = check_history(local_target, {}, "v", rows, ["id", "v"])
    assert check_metrics(metrics, {}, "v", history) == []
    held = DeltaTable(metrics).to_pyarrow_table()
    twice = held.filter(pc.equal(held["version"], 1))
    write_deltalake(metrics, twice, mode="append")
    assert check_metrics(metrics, {}, "v", history) == ["metrics: version 1 recorded 2 times"]
    DeltaTable(metrics).delete("version = 1")
    assert check_metrics(metrics, {}, "v", history) == ["metrics: view commit v1 is missing (v2 is recorded)"]


@pytest.mark.parametrize("clock", [None, "t"])
def test_the_verdict_check_names_an_unchanged_or_replayed_epoch_the_table_contradicts(
    spark, local_target, clock
):
    times = {"clock": lambda df, epoch: {"t": epoch}} if clock else {}
    sink = MVSink(local_target, "v", heartbeat="1h", **times)
    batch = [spark.range(5).selectExpr("id", f"id + {e} AS v") for e in range(2)]
    reports = [sink(batch[0], 0), sink(batch[1], 1), sink(batch[1], 2), sink(batch[1], 1)]
    assert [r.outcome for r in reports] == ["committed", "committed", "unchanged", "replay"]
    said = [r.to_json() for r in reports]

    def settled(epoch: int) -> Counter[tuple[int, int]]:  # epoch 2 changed nothing
        return rows(min(epoch, 1))

    def verdicts(reports: list[dict[str, Any]], desired: Any = settled) -> tuple[int, list[str]]:
        return check_verdicts(local_target, {}, reports, history, desired, ["id", "v"], clock)

    history = check_history(local_target, {}, "v", settled, ["id", "v"], clock)
    assert history.violations == []
    assert verdicts(said) == (2, [])
    # Had desired moved at epoch 2, "unchanged" was a wrong verdict.
    assert verdicts(said, rows) == (
        2,
        ["epoch 2 (unchanged at v1, position 2): v1 is not desired at 2, yet nothing was written"],
    )
    # A replay of an epoch the view had not reached.
    ahead = {**said[3], "epoch": 4, "clock_time": {"t": 4} if clock else None}
    assert verdicts([ahead])[1] == ["epoch 4 (replay at v1, position 4): the view had only reached 1 at v1"]
    if clock:  # a report without its time cannot be checked: that is named, never skipped
        assert verdicts([{**said[3], "clock_time": None}])[1] == [
            "epoch 1 (replay at v1, position None): the report gives no t"
        ]
