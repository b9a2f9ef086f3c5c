"""One decision per attempt (``epoch/decide.py``): a test per reason, each against the
snapshot of a real Delta table that real epochs made."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import SparkSession

from mvsink import LineageError, MVSink, promote
from mvsink.config import SinkOptions
from mvsink.epoch.clock import Time
from mvsink.epoch.decide import Clocked, Commit, Decision, Skip, decide
from mvsink.errors import Where
from mvsink.table.delta import Snapshot, load_snapshot


def rows(spark: SparkSession, n: int = 3) -> Any:
    return spark.range(n).selectExpr("id", "id * 2 AS v")


def snapshot(target: str, name: str = "v") -> Snapshot:
    return load_snapshot(target, f"mvsink:{name}", {}, Where(name, target))


def ask(
    target: str,
    epoch: int,
    *,
    lineage: str = "direct",
    time: dict[str, int] | None = None,
    read_only: bool = False,
    start: dict[str, int] | None = None,
    heard: list[Clocked] | None = None,
    **options: Any,
) -> Decision:
    opts = SinkOptions.build(target=target, name="v", **options)
    return decide(
        snapshot(target),
        epoch,
        opts,
        lineage=lineage,
        time=None if time is None else Time.of(time),
        read_only=read_only,
        batch_start=lambda: None if start is None else Time.of(start),
        where=Where("v", target, epoch),
        on_clock=None if heard is None else heard.append,
    )


def test_a_new_table_commits_even_with_nothing_to_change(local_target):
    decision = ask(local_target, 4)
    assert isinstance(decision, Commit)
    assert (decision.desc.lower, decision.desc.upper, decision.always) == (None, 5, True)


def test_an_epoch_before_as_of_is_skipped(local_target):
    assert ask(local_target, 2, as_of=5) == Skip("before_as_of")


def test_an_epoch_the_lineage_already_committed_is_a_replay(spark, local_target):
    MVSink(local_target, "v")(rows(spark), 3)
    assert ask(local_target, 3) == Skip("replay")
    assert ask(local_target, 1) == Skip("replay")
    assert isinstance(ask(local_target, 4), Commit)


def test_under_a_shared_clock_a_time_not_ahead_is_a_replay(spark, local_target):
    MVSink(local_target, "v", clock=lambda batch, epoch: {"src": 10})(rows(spark), 0)
    heard: list[Clocked] = []
    for behind in ({"src": 9}, {"src": 10}):
        assert ask(local_target, 7, time=behind, heard=heard) == Skip("replay")
    ahead = ask(local_target, 1, time={"src": 11}, heard=heard)
    assert isinstance(ahead, Commit) and ahead.desc.clocked
    # The stall watch hears every verdict, and the committed time it was against.
    assert [(c.verdict, c.committed) for c in heard] == [
        ("behind", {"src": 10}),
        ("same", {"src": 10}),
        ("ahead", {"src": 10}),
    ]


def test_a_superseded_lineage_is_fenced(spark, local_target):
    MVSink(local_target, "v", lineage="first")(rows(spark), 0)
    MVSink(local_target, "v", lineage="second")(rows(spark), 0)  # takes the view over
    assert ask(local_target, 5, lineage="first") == Skip("fenced", entitled=False)
    assert isinstance(ask(local_target, 1, lineage="second"), Commit)


def test_a_writer_other_than_the_promoted_one_is_fenced(spark, local_target):
    MVSink(local_target, "v", writer="a")(rows(spark), 0)
    promote(local_target, "v", "b")
    assert ask(local_target, 1, writer="a") == Skip("fenced", entitled=False)
    # Even a replay is fenced: such a writer writes nothing, beside the view either.
    assert ask(local_target, 0, writer="a") == Skip("fenced", entitled=False)
    assert isinstance(ask(local_target, 1, writer="b"), Commit)
    # A standby started read-only writes once the target names it the active writer.
    assert isinstance(ask(local_target, 1, writer="b", read_only=True), Commit)


def test_a_read_only_sink_skips_but_plans(spark, local_target):
    MVSink(local_target, "v")(rows(spark), 0)
    decision = ask(local_target, 1, read_only=True)
    assert decision == Skip("read_only", entitled=False) and decision.plans
    assert not Skip("replay").plans
    # A standby's replay is no licence to write what follows the view (its errors table).
    assert ask(local_target, 0, read_only=True) == Skip("replay", entitled=False)
    assert ask(local_target, 0) == Skip("replay", entitled=True)


def test_under_a_shared_clock_a_standby_or_fenced_writer_behind_writes_nothing(spark, local_target):
    clock = {"clock": lambda batch, epoch: {"src": 10}}
    MVSink(local_target, "v", writer="a", **clock)(rows(spark), 0)
    assert ask(local_target, 3, time={"src": 9}, writer="c", read_only=True) == Skip("replay", entitled=False)
    promote(local_target, "v", "c")
    assert ask(local_target, 3, time={"src": 9}, writer="a") == Skip("fenced", entitled=False)
    assert ask(local_target, 3, time={"src": 9}, writer="c", read_only=True) == Skip("replay")


def test_a_new_lineage_takes_the_view_over_and_always_commits(spark, local_target):
    MVSink(local_target, "v", lineage="first")(rows(spark), 4)
    decision = ask(local_target, 0, lineage="second")
    assert isinstance(decision, Commit) and decision.desc.takeover and decision.always
    with pytest.raises(LineageError):  # refused where new lineages are not adopted
        ask(local_target, 0, lineage="third", on_new_lineage="fail")


def test_between_refreshes_nothing_is_written_and_a_due_refresh_always_commits(spark, local_target):
    MVSink(local_target, "v")(rows(spark), 0)  # frontier 1
    assert ask(local_target, 1, refresh_every=5) == Skip("between_refreshes")
    assert ask(local_target, 3, refresh_every=5) == Skip("between_refreshes")
    due = ask(local_target, 5, refresh_every=5)
    assert isinstance(due, Commit) and due.always
    # What must land is never held back for a refresh: a takeover, or creating the table.
    taken = ask(local_target, 1, lineage="other", refresh_every=5)
    assert isinstance(taken, Commit) and taken.desc.takeover and taken.always
    created = ask(local_target + "-new", 1, refresh_every=5)
    assert isinstance(created, Commit) and created.always


def test_with_no_heartbeat_due_an_empty_correction_commits_nothing(spark, local_target):
    MVSink(local_target, "v")(rows(spark), 0)
    quiet = ask(local_target, 1, heartbeat=5)
    assert isinstance(quiet, Commit) and not quiet.always
    beat = ask(local_target, 5, heartbeat=5)
    assert isinstance(beat, Commit) and beat.always
    assert ask(local_target, 1, heartbeat=0).always  # type: ignore[union-attr]


def test_upsert_and_append_always_commit_and_refuse_a_gap(spark, local_target):
    MVSink(local_target, "v", mode="upsert", key=["id"])(rows(spark), 0)
    next_one = ask(local_target, 1, mode="upsert", key=["id"], heartbeat="1h")
    assert isinstance(next_one, Commit) and next_one.always
    with pytest.raises(LineageError, match=r"epochs 1\.\.2 were never committed"):
        ask(local_target, 3, mode="upsert", key=["id"])
    allowed = ask(local_target, 3, mode="upsert", key=["id"], allow_gaps=True)
    assert isinstance(allowed, Commit) and allowed.desc.upper == 4
    # A new lineage taking an upsert view over past its first epoch misses its earlier rows.
    with pytest.raises(LineageError, match="takes the view over at its epoch 2, not its first"):
        ask(local_target, 2, mode="upsert", key=["id"], lineage="other", on_new_lineage="adopt")


def test_under_a_shared_clock_a_batch_starting_past_the_committed_time_is_a_gap(spark, local_target):
    upsert = {"mode": "upsert", "key": ["id"], "clock": lambda batch, epoch: {"src": 10}}
    MVSink(local_target, "v", **upsert)(rows(spark), 0)
    with pytest.raises(LineageError, match="past the committed source offsets"):
        ask(local_target, 1, time={"src": 20}, start={"src": 15}, **upsert)
    joined = ask(local_target, 1, time={"src": 20}, start={"src": 10}, **upsert)
    assert isinstance(joined, Commit)
