"""Compaction: small files merged through the sink's strict commit, changing no row."""

from __future__ import annotations

import numpy as np
import pytest
from deltalake import DeltaTable

from mvsink import MVSink, failpoints, frontier
from mvsink.cli.main import main
from mvsink.errors import ConfigError, Where
from mvsink.ops.compact import compact
from mvsink.table.delta import load_snapshot
from mvsink.table.fingerprint import fingerprints
from mvsink.table.index import StoredIndex
from mvsink.table.layout import Layout
from mvsink.table.schema import target_struct
from mvsink.table.storage import Store
from tests.helpers import assert_equal_to, commit_info, live_files, log_entry, once, people, versions

# Runs on both engines (tests/conftest.py: each line runs the engine it has).
pytestmark = pytest.mark.usefixtures("engine")


def grow(spark, sink, epochs: int) -> None:
    """Epoch e holds ids 0..5e+4: each epoch inserts five rows, as a small file."""
    for e in range(epochs):
        sink(people(spark, range(5 * (e + 1))), e)


def entries_match_files(target: str, name: str) -> None:
    """Every live file has a stored index entry equal to its rows' fingerprints."""
    snap = load_snapshot(target, f"mvsink:{name}", {}, Where(name, target))
    assert snap.schema_json is not None
    layout = Layout(snap.schema_json, target_struct(snap.schema_json), snap.partition_by)
    store = Store(snap.root)
    index = StoredIndex.of(store, name, layout.arrow)
    for f in snap.files:
        entry = index.get(f)
        assert entry is not None, f"no entry for {f.path}"
        a, b = fingerprints(store.read(f, layout.arrow, layout.partition_by))
        assert np.array_equal(entry.a, a) and np.array_equal(entry.b, b)


def test_compaction_merges_small_files_and_changes_no_row(spark, target):
    sink = MVSink(target, "v", max_rows_per_file=100)
    grow(spark, sink, 6)
    before = live_files(target)
    assert len(before) >= 6
    front = frontier(target, "v")
    done = compact(target, "v", max_rows_per_file=100, cluster_by=["name"])
    assert (done.files_removed, done.files_added, done.rows) == (len(before), 1, 30)
    assert done.version == versions(target)[-1]
    assert_equal_to(target, people(spark, range(30)))
    assert frontier(target, "v") == front  # the view did not move
    actions = log_entry(target, done.version)
    assert all(a[k]["dataChange"] is False for a in actions for k in ("add", "remove") if k in a)
    assert commit_info(target, done.version)["mvsink.operation"] == "compact"
    assert len(live_files(target)) == 1
    names = DeltaTable(target).to_pyarrow_table().column("name")
    assert names.to_pylist() == sorted(names.to_pylist())  # clustered by name
    entries_match_files(target, "v")  # carried over, and true
    # The next epoch reads no file: the index already covers the compacted one.
    report = sink(people(spark, range(31)), 6)
    assert report.files_read == 0 and (report.inserted, report.retracted) == (1, 0)
    report = sink(people(spark, range(1, 31)), 7)  # and a retraction from the merged file
    assert (report.inserted, report.retracted) == (0, 1)
    assert_equal_to(target, people(spark, range(1, 31)))
    assert str(compact(target, "v", max_rows_per_file=100)).endswith("nothing to compact for view v")


def test_a_compaction_landing_inside_an_epoch_makes_the_epoch_retry(spark, local_target):
    sink = MVSink(local_target, "v", max_rows_per_file=100)
    grow(spark, sink, 4)
    # Epoch 4 retracts a row held by a small file that a compaction merges away meanwhile.
    with failpoints.armed({"before_commit": once(lambda: compact(local_target, "v", max_rows_per_file=100))}):
        report = sink(people(spark, range(1, 20)), 4)
    assert report.attempts == 2 and report.outcome == "committed"
    assert_equal_to(local_target, people(spark, range(1, 20)))
    entries_match_files(local_target, "v")


def test_compact_every_runs_after_committed_epochs(spark, local_target):
    sink = MVSink(local_target, "v", max_rows_per_file=100, compact_every=3)
    grow(spark, sink, 3)
    operations = [commit_info(local_target, v).get("mvsink.operation") for v in versions(local_target)]
    assert operations == [None, None, None, "compact"]
    assert len(live_files(local_target)) == 1
    assert_equal_to(local_target, people(spark, range(15)))


def test_compact_cli(spark, local_target, capsys):
    grow(spark, MVSink(local_target, "v", max_rows_per_file=100), 3)
    assert main(["compact", local_target, "--name", "v", "--max-rows-per-file", "100"]) == 0
    assert "small file(s) into 1 (15 rows)" in capsys.readouterr().out
    assert main(["compact", local_target]) == 2
    assert "--name" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["compact", local_target, "--name", "v", "--max-rows-per-file", "many"])


def test_compact_refuses_a_cluster_by_column_it_cannot_sort_by(spark, local_target):
    sink = MVSink(local_target, "v", max_rows_per_file=1)
    df = spark.sql("SELECT id, array(id) AS tags FROM range(4)")
    sink(df, 0)
    before = versions(local_target)
    for column, reason in (("tags", "array<bigint>"), ("nope", "does not store")):
        with pytest.raises(ConfigError, match=reason):
            compact(local_target, "v", cluster_by=[column])
    assert versions(local_target) == before
