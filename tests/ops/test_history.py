"""Reading a view's history: ``as_of`` by version, time and epoch, against the view's table at
that version (read with delta-rs, time travel), and what it refuses."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from deltalake import DeltaTable

import mvsink
from mvsink import HistoryBehindError, MVSink, failpoints
from mvsink.compat import to_arrow
from tests.helpers import commit_info, multiset, people, target_table

pytestmark = pytest.mark.usefixtures("engine")


def at(target: str, version: int):
    return multiset(target_table(target, version))


def read(frame):
    return multiset(to_arrow(frame))


def committed_at(target: str, version: int) -> dt.datetime:
    ms = int(commit_info(target, version)["timestamp"])
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def build(spark, target: str, history: str, batches) -> MVSink:
    sink = MVSink(target, "v", history_target=history)
    for epoch, (ids, suffix) in enumerate(batches):
        sink(people(spark, ids, suffix=suffix), epoch)
    return sink


def test_as_of_a_version_a_time_and_an_epoch_is_the_view_then(spark, target):
    history = f"{target}_history"
    build(spark, target, history, [(range(5), "a"), (range(3, 9), "a"), ([1, 1, 1], "b"), (range(2), "c")])
    for v in range(4):
        assert read(mvsink.as_of(spark, target, "v", version=v)) == at(target, v)
        assert read(mvsink.as_of(spark, target, "v", v)) == at(target, v)  # epoch v committed version v
        when = committed_at(target, v)
        assert read(mvsink.as_of(spark, target, "v", when)) == at(target, v)
        later = when + dt.timedelta(milliseconds=1)
        assert read(mvsink.as_of(spark, target, "v", later.isoformat())) == at(target, v)
    # Given where the history is, or found from the view's commits: the same.
    same = mvsink.as_of(spark, target, "v", version=1, history_target=history)
    assert read(same) == at(target, 1)


def test_an_epoch_that_changed_nothing_is_the_view_its_epoch_before_left(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    build(spark, target, history, [(range(3), "a"), (range(3), "a"), (range(4), "a")])
    assert DeltaTable(target).version() == 1  # epoch 1 wrote nothing
    assert read(mvsink.as_of(spark, target, "v", 1)) == at(target, 0)
    assert read(mvsink.as_of(spark, target, "v", 2)) == at(target, 1)


def test_epochs_name_the_newest_querys_after_a_restart_from_a_new_checkpoint(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    first = MVSink(target, "v", history_target=history, lineage="q1")
    for epoch in range(3):
        first(people(spark, range(epoch + 1), suffix="old"), epoch)
    second = MVSink(target, "v", history_target=history, lineage="q2")
    second(people(spark, range(7), suffix="new"), 0)
    second(people(spark, range(8), suffix="new"), 1)
    assert read(mvsink.as_of(spark, target, "v", 0)) == at(target, 3)
    assert read(mvsink.as_of(spark, target, "v", 1)) == at(target, 4)
    assert read(mvsink.as_of(spark, target, "v", version=1)) == at(target, 1)


def test_what_the_history_does_not_hold_yet_or_any_more_is_refused(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    MVSink(target, "v")(people(spark, range(3)), 0)
    MVSink(target, "v")(people(spark, range(1, 3)), 1)
    sink = MVSink(target, "v", history_target=history)
    sink(people(spark, range(1, 4)), 2)  # the history begins at version 1, the rows it held
    with pytest.raises(HistoryBehindError, match="knows the view"):
        mvsink.as_of(spark, target, "v", committed_at(target, 1) - dt.timedelta(milliseconds=1))
    with pytest.raises(HistoryBehindError, match="from version 1, after 0"):
        mvsink.as_of(spark, target, "v", version=0)
    assert read(mvsink.as_of(spark, target, "v", version=1)) == at(target, 1)
    assert read(mvsink.as_of(spark, target, "v", committed_at(target, 1))) == at(target, 1)
    with failpoints.armed({"after_commit": "raise"}, view="v"), pytest.raises(failpoints.InjectedFault):
        sink(people(spark, range(5)), 3)
    with pytest.raises(HistoryBehindError, match="up to 2, not 3"):
        mvsink.as_of(spark, target, "v", version=3)
    with pytest.raises(HistoryBehindError, match="version 3 of the view's table"):
        mvsink.as_of(spark, target, "v", dt.datetime.now(dt.UTC))
    with pytest.raises(HistoryBehindError, match="epoch 3 committed"):
        mvsink.as_of(spark, target, "v", 3)
    assert read(mvsink.as_of(spark, target, "v", 2)) == at(target, 2)
    sink(people(spark, range(5)), 3)  # a replay: completes the history
    assert read(mvsink.as_of(spark, target, "v", dt.datetime.now(dt.UTC))) == at(target, 3)
    assert read(mvsink.as_of(spark, target, "v", 3)) == at(target, 3)


def test_as_of_refuses_a_view_without_history_and_a_question_twice_asked(spark, tmp_path):
    target = str(tmp_path / "t")
    MVSink(target, "v")(people(spark, range(3)), 0)
    with pytest.raises(mvsink.ConfigError, match="keeps no history"):
        mvsink.as_of(spark, target, "v", version=0)
    with pytest.raises(mvsink.ConfigError, match="only one"):
        mvsink.as_of(spark, target, "v", 0, version=0)
    with pytest.raises(mvsink.ConfigError, match="not True"):
        mvsink.as_of(spark, target, "v", True, history_target=str(tmp_path / "t"))
    with pytest.raises(mvsink.ConfigError, match="ISO 8601"):
        mvsink.as_of(spark, target, "v", "last tuesday", history_target=str(tmp_path / "t"))


def test_the_history_command_prints_a_keys_lifetimes(spark, tmp_path, capsys):
    from mvsink.cli.main import main

    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    build(spark, target, history, [(range(3), "a"), (range(3), "b"), ([5], "b")])
    capsys.readouterr()
    assert main(["history", target, "--name", "v", "--equal", "id=1", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["name"], r["opened_version"], r["closed_version"]) for r in lines] == [
        ("n1a", 0, 1),
        ("n1b", 1, 2),
    ]
    assert main(["history", target, "--name", "v", "--equal", "id=5", "--equal", "name=n5b"]) == 0
    shown = capsys.readouterr().out
    assert "lifetimes of view v (id=5, name=n5b)" in shown and "n5b" in shown and "n1a" not in shown
    assert main(["history", target, "--name", "v", "--equal", "nope=1"]) == 2
    assert "no column 'nope'" in capsys.readouterr().err
    assert main(["history", target, "--name", "v", "--equal", "id=one"]) == 2
    assert "not a value of the column's type" in capsys.readouterr().err
    assert main(["history", target, "--name", "v"]) == 2
    assert "--equal COLUMN=VALUE" in capsys.readouterr().err
