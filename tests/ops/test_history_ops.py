"""Operating a view's history: its compaction and retention (``compact_history``, the sink's
``compact_every``, ``mvsink compact``), ``mvsink status`` and ``mvsink verify`` of it."""

from __future__ import annotations

import datetime as dt
import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import mvsink
from mvsink import ConfigError, HistoryBehindError, MVSink, failpoints
from mvsink.cli.main import main
from mvsink.compat import to_arrow
from mvsink.config import RetryPolicy
from mvsink.ops.history import compact_history
from mvsink.ops.status import status
from mvsink.ops.verify import verify
from tests.helpers import (
    added,
    assert_holds_every_version,
    commit_info,
    data_files_on_disk,
    foreign_append,
    held_at,
    history_frontier,
    lifetimes,
    multiset,
    people,
    table_at,
    versions,
)

pytestmark = pytest.mark.usefixtures("engine")


def read(frame):
    return multiset(to_arrow(frame))


def closed_files(history: str) -> list[str]:
    return [p for p in DeltaTable(history).file_uris() if os.path.basename(p).startswith("c-")]


def build(spark, target: str, history: str, epochs: int = 5, **options: object) -> MVSink:
    """A view whose every epoch replaces all four rows: from version 1 on, each closes four
    lifetimes (a file of them)."""
    sink = MVSink(target, "v", history_target=history, **options)
    for epoch in range(epochs):
        sink(people(spark, range(epoch, epoch + 4), suffix=str(epoch)), epoch)
    return sink


def test_compacting_the_history_merges_its_closed_lifetimes_and_every_version_reads_the_same(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    build(spark, target, history)
    before = sorted(map(str, lifetimes(history)))
    assert len(closed_files(history)) == 4
    done = compact_history(target, "v")
    assert (done.files_removed, done.files_added, done.dropped) == (4, 1, 0)
    assert len(closed_files(history)) == 1
    assert sorted(map(str, lifetimes(history))) == before  # the same lifetimes, in fewer files
    assert_holds_every_version(target, history, "v")
    assert commit_info(history, done.version)["mvsink.by"] == "compact"
    assert compact_history(target, "v").version is None  # nothing left to merge


def test_the_retention_drops_only_lifetimes_that_ended_before_it_and_as_of_refuses_what_it_no_longer_knows(
    spark, tmp_path
):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    build(spark, target, history)
    newest = DeltaTable(target).version()
    opened_before = [r for r in lifetimes(history) if r["valid_to"] is None]
    # Keep what ended at version 2's time or later: version 1 closed the rest.
    at_2 = int(commit_info(target, 2)["timestamp"])
    done = compact_history(target, "v", retention="1s", now_ms=at_2 + 1000)
    rows = lifetimes(history)
    assert done.dropped == 4
    assert all(r["closed_version"] is None or r["closed_version"] >= 2 for r in rows)
    assert [r for r in rows if r["valid_to"] is None] == opened_before  # never an open lifetime
    # Version 1 is still known whole (what was dropped ended there); version 0 is not.
    for version in range(1, newest + 1):
        assert held_at(history, version) == table_at(target, version), f"version {version}"
        assert read(mvsink.as_of(spark, target, "v", version=version)) == table_at(target, version)
    with pytest.raises(HistoryBehindError, match="history_retention dropped what came before"):
        mvsink.as_of(spark, target, "v", version=0)
    at_1 = dt.datetime.fromtimestamp(int(commit_info(target, 1)["timestamp"]) / 1000, dt.UTC)
    assert read(mvsink.as_of(spark, target, "v", at_1)) == table_at(target, 1)
    with pytest.raises(HistoryBehindError, match="history_retention dropped what came before"):
        mvsink.as_of(spark, target, "v", at_1 - dt.timedelta(milliseconds=1))  # version 0's time
    assert history_frontier(history, "v") == newest + 1  # it holds the same versions
    assert status(target).views[0].kept_history.known_from == 1


def test_a_compaction_racing_an_epoch_loses_and_goes_again(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = build(spark, target, history, epochs=4)
    raced = []

    def epoch_first(snap):
        if not raced:
            raced.append(snap.version)
            sink(people(spark, range(20, 22)), 4)  # the view's epoch and its history land first

    fast = RetryPolicy(initial_backoff_s=0.0, max_backoff_s=0.01)
    with failpoints.armed({"history_before_commit": epoch_first}, view="v"):
        done = compact_history(target, "v", retry=fast)
    assert raced and done.version == raced[0] + 2  # after the epoch's history commit
    assert_holds_every_version(target, history, "v")
    # Only files some history version added are on disk: the loser's staged files are gone.
    assert data_files_on_disk(history) == {p for v in versions(history) for p in added(history, v)}


def test_the_sinks_compaction_compacts_its_history_with_its_retention(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    build(spark, target, history, epochs=6, compact_every=5, history_retention="30d")
    assert len(closed_files(history)) <= 2  # merged at epoch 4; epoch 5's own since
    assert any(commit_info(history, v).get("mvsink.by") == "compact" for v in versions(history))
    assert_holds_every_version(target, history, "v")


def test_status_shows_what_the_history_holds(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    build(spark, target, history, epochs=3)
    found = status(target).views[0].kept_history
    assert found is not None and found.root.endswith("/h")
    rows = lifetimes(history)
    assert found.holds_to == DeltaTable(target).version() and found.known_from == 0
    assert found.open_lifetimes == sum(table_at(target, found.holds_to).values()) == 4
    assert found.closed_lifetimes == sum(1 for r in rows if r["valid_to"] is not None)
    files = [p.removeprefix("file://") for p in DeltaTable(history).file_uris()]
    assert found.bytes == sum(os.path.getsize(p) for p in files) and found.files == len(files)
    assert found.oldest is not None and found.known_since is None
    assert "open lifetimes" in str(status(target))


def test_verify_checks_the_historys_open_lifetimes_are_the_view(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    build(spark, target, history, epochs=3)
    desired = people(spark, range(2, 6), suffix="2")
    result = verify(desired, target, "v")
    assert result.ok and result.history is not None and result.history.open_lifetimes == 4
    # Someone appends an open lifetime to the history: the view does not hold its row.
    schema = pa.schema(DeltaTable(history).schema().to_arrow())
    row = {**{k: None for k in schema.names}, "id": 99, "name": "ghost", "x": 0.0, "opened_version": 0}
    write_deltalake(history, pa.Table.from_pylist([row], schema=schema), mode="append")
    result = verify(desired, target, "v")
    assert result.equal and not result.ok
    assert (result.history.missing, result.history.extra) == (0, 1)
    assert "differ from the view" in str(result)


def test_verify_of_a_history_behind_the_table_says_so_and_compares_nothing(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    build(spark, target, history, epochs=2)
    foreign_append(target, [{"id": 50, "name": "theirs", "x": 1.0}])
    result = verify(people(spark, range(1, 5), suffix="1"), target, "v")
    assert result.history is not None and result.history.open_lifetimes is None
    assert "behind the table" in str(result)


def test_compact_on_the_command_line_compacts_the_history_too(spark, tmp_path, capsys):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    build(spark, target, history)
    assert main(["compact", target, "--name", "v", "--history-retention", "3650d"]) == 0
    out = capsys.readouterr().out
    assert "compacted 4 file(s) of closed lifetimes into 1" in out
    assert_holds_every_version(target, history, "v")


def test_bad_retention_input_is_refused_and_nothing_changes(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    with pytest.raises(ConfigError, match="history_retention"):
        MVSink(target, "v", history_retention="90d")
    with pytest.raises(ConfigError, match="positive duration"):
        MVSink(target, "v", history_target=history, history_retention="90")
    build(spark, target, history, epochs=2)
    before = versions(history)
    with pytest.raises(ConfigError, match="history_retention"):
        compact_history(target, "v", retention="soon")
    assert versions(history) == before
    plain = str(tmp_path / "plain")
    MVSink(plain, "p")(people(spark, range(3)), 0)
    assert main(["compact", plain, "--name", "p", "--history-retention", "9d"]) == 2
