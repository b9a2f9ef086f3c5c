"""Vacuum's report and its staging folders: what left the table is told apart from what never
committed, from the log, and the staging folders it empties go with their files."""

from __future__ import annotations

import glob
import os
import shutil
import time
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable, write_deltalake

from mvsink import MVSink, failpoints
from mvsink.ops.compact import compact
from mvsink.ops.vacuum import vacuum
from tests.helpers import (
    assert_equal_to,
    data_files_on_disk,
    live_files,
    people,
    put_parquet,
    removed,
    store,
    versions,
)

# Runs on both engines (tests/conftest.py: each line runs the engine it has).
pytestmark = pytest.mark.usefixtures("engine")

NO_RETENTION = {"delta.deletedFileRetentionDuration": "interval 0 hours"}


def _age(path: str, days: float) -> None:
    old = time.time() - days * 86400
    os.utime(path, (old, old))


def _staging_folders(target: str) -> dict[str, int]:
    """The ``mvsink-*`` folders at the target's root, each with the files it holds (on an
    object store, only folders that hold a file are there at all)."""
    fs = store(target).fs
    tops = fs.get_file_info(pafs.FileSelector("", allow_not_found=True))
    return {
        i.base_name: sum(
            1
            for f in fs.get_file_info(pafs.FileSelector(i.base_name, recursive=True))
            if f.type == pafs.FileType.File
        )
        for i in tops
        if i.type == pafs.FileType.Directory and i.base_name.startswith("mvsink-")
    }


def _crash_before_commit(sink: MVSink, target: str, epoch: int, aside: str) -> Any:
    """Arm (for the block) the sink's attempt at ``epoch`` to stage its files and then die
    before the commit, its staged folder left behind as a killed process leaves it (the
    in-process failure discards the files: a copy made just before is put back)."""

    def crash(_snap: object) -> None:
        (folder,) = glob.glob(os.path.join(target, f"mvsink-v-e{epoch}-*"))
        shutil.copytree(folder, os.path.join(aside, os.path.basename(folder)))
        raise RuntimeError("the driver died before the commit")

    return failpoints.armed({"before_commit": crash}, view=sink.options.name)


def test_after_epochs_and_a_compaction_every_file_left_the_table_and_apply_removes_emptied_folders(
    spark, target
):
    """The report of issue 53: every file an epoch rewrote or a compaction merged was added by
    a commit and removed by a later one, so none is called staged by an attempt that never
    committed; the staging folders they empty go with them, those of live files stay."""
    sink = MVSink(target, "v", max_rows_per_file=5)
    sink(people(spark, range(20)), 0)
    sink(people(spark, range(3, 20)), 1)  # rewrites a file
    compact(target, "v", max_rows_per_file=100)  # merges every file into one
    sink(people(spark, range(3, 21)), 2)  # a live file in a folder of its own
    DeltaTable(target).alter.set_table_properties(NO_RETENTION)
    live = live_files(target)
    left = {p for v in versions(target) for p in removed(target, v)} - live

    plan = vacuum(target)
    assert set(plan.data_files) == left and len(left) >= 5
    assert plan.never_committed == ()
    assert f"({len(left)} no longer in the table, 0 staged by" in str(plan)
    live_folders = {p.split("/")[0] for p in live}
    emptied = set(_staging_folders(target)) - live_folders
    assert emptied and set(plan.staging_folders) == emptied  # a dry run: still there

    done = vacuum(target, apply=True)
    assert done.applied and set(done.data_files) == left and done.never_committed == ()
    assert set(done.staging_folders) == emptied
    folders = _staging_folders(target)
    assert set(folders) == live_folders and all(folders.values())  # none left empty
    assert all(store(target).fs.get_file_info(f).type == pafs.FileType.NotFound for f in emptied)
    assert_equal_to(target, people(spark, range(3, 21)))
    assert sink(people(spark, range(4, 21)), 3).outcome == "committed"  # the sink goes on


def test_a_crashed_attempts_staged_folder_is_reported_as_never_committed(
    spark, local_target, tmp_path, engine
):
    """A real attempt's staged files, left by a crash before its commit: no commit names them,
    and the log reaches back past them, so they never committed. Its folder, emptied by the
    vacuum, goes; an empty folder an earlier vacuum left (older than the retention) goes too;
    an empty folder made moments ago (an attempt in flight, before its first file) stays (with
    delta-rs: Delta's own VACUUM, the delta-spark engine's, may delete empty folders itself)."""
    sink = MVSink(local_target, "v", max_rows_per_file=5)
    sink(people(spark, range(10)), 0)
    aside = str(tmp_path / "aside")
    with _crash_before_commit(sink, local_target, 1, aside), pytest.raises(RuntimeError, match="driver died"):
        sink(people(spark, range(12)), 1)
    (crashed,) = os.listdir(aside)
    shutil.copytree(os.path.join(aside, crashed), os.path.join(local_target, crashed))
    assert sink(people(spark, range(12)), 1).outcome == "committed"  # the retry, from a new folder
    staged = {p for p in data_files_on_disk(local_target) if p.startswith(f"{crashed}/")}
    assert staged and not staged & live_files(local_target)
    for path in staged:
        _age(os.path.join(local_target, path), 10)  # older than the table's 7 days
    earlier = os.path.join(local_target, "mvsink-v-e7-0123456789ab")
    in_flight = os.path.join(local_target, "mvsink-v-e9-ba9876543210")
    for folder in (earlier, in_flight):
        os.makedirs(os.path.join(folder, "part=1"))
    _age(os.path.join(earlier, "part=1"), 10)
    _age(earlier, 10)

    plan = vacuum(local_target)
    assert set(plan.data_files) == set(plan.never_committed) == staged
    assert f"(0 no longer in the table, {len(staged)} staged by" in str(plan)
    assert plan.staging_folders == tuple(sorted([crashed, os.path.basename(earlier)]))

    done = vacuum(local_target, apply=True)
    assert set(done.never_committed) == staged and done.staging_folders == plan.staging_folders
    assert not os.path.exists(os.path.join(local_target, crashed)) and not os.path.exists(earlier)
    if engine == "delta-rs":  # mvsink keeps a fresh empty folder; Delta's own VACUUM (the
        assert os.path.isdir(in_flight)  # delta-spark engine's) may delete empty folders itself
    assert_equal_to(local_target, people(spark, range(12)))


@pytest.mark.single_engine  # the log's reading, whichever engine lists the files; no Spark
def test_never_committed_is_claimed_only_as_far_back_as_the_log_reaches(tmp_path):
    """Log cleanup took the first commits: a staged file written before the oldest commit the
    log keeps may have been added and removed by them, so it is only said to have left the
    table; one written after every commit the log lost is proven never committed."""
    target = str(tmp_path / "t")
    write_deltalake(target, pa.table({"id": [1, 2]}))
    write_deltalake(target, pa.table({"id": [3]}), mode="append")
    table = DeltaTable(target)
    table.alter.set_table_properties(NO_RETENTION)
    table.create_checkpoint()
    os.remove(os.path.join(target, "_delta_log", f"{0:020}.json"))  # as log cleanup does
    for name in glob.glob(os.path.join(target, "_delta_log", "*.json")):
        _age(name, 2)  # the kept commits were written two days ago
    old = "mvsink-v-e1-0123456789ab/part-0.parquet"
    new = "mvsink-v-e5-ba9876543210/part-0.parquet"
    for path in (old, new):
        put_parquet(target, path, pa.table({"id": [9]}))
    _age(os.path.join(target, old), 10)  # before the oldest commit the log keeps

    plan = vacuum(target)
    assert {old, new} <= set(plan.data_files)
    assert plan.never_committed == (new,)
