"""One decision per attempt (``epoch/decide.py``): a test per condition, each against the
snapshot of a real Delta table that real epochs made; then the pure function itself, over
made-up snapshots, for what is hard to reach through a sink (the order of the conditions, the
stall watch's standing, a time cadence at a given time, refusals as values)."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import SparkSession

from mvsink import LineageError, MVSink, promote
from mvsink.config import SinkOptions
from mvsink.epoch.clock import Standing, Start, Time, standing
from mvsink.epoch.decide import Commit, Decision, Refuse, Skip, decide, unchanged
from mvsink.errors import ConfigError, Where
from mvsink.report import Reason
from mvsink.table.delta import Snapshot, load_snapshot
from mvsink.table.record import Keys, now_ms


def rows(spark: SparkSession, n: int = 3) -> Any:
    return spark.range(n).selectExpr("id", "id * 2 AS v")


def snapshot(target: str, name: str = "v") -> Snapshot:
    return load_snapshot(target, f"mvsink:{name}", {}, Where(name, target))


def ask(
    target: str | Snapshot,
    epoch: int,
    *,
    lineage: str = "direct",
    time: dict[str, int] | None = None,
    read_only: bool = False,
    start: Start | dict[str, int] = None,
    now: int | None = None,
    **options: Any,
) -> Decision:
    """``decide`` as ``Epoch.decide`` asks it: the standing and the start computed first."""
    snap = snapshot(target) if isinstance(target, str) else target
    opts = SinkOptions.build(target=snap.root, name="v", **options)
    clock = None if time is None else standing(Time.of(time), snap, opts.app_id)
    return decide(
        snap,
        epoch,
        opts,
        lineage=lineage,
        read_only=read_only,
        clock=clock,
        start=Time.of(start) if isinstance(start, dict) else start,
        now=now_ms() if now is None else now,
        where=Where("v", snap.root, epoch),
    )


def skipped(decision: Decision) -> tuple[Reason, bool]:
    """A skip's reason and whether the sink was entitled."""
    assert isinstance(decision, Skip), decision
    return decision.reason, decision.entitled


def refused(decision: Decision, match: str) -> Refuse:
    assert isinstance(decision, Refuse), decision
    assert isinstance(decision.error, LineageError)
    with pytest.raises(LineageError, match=match):
        raise decision.error
    return decision


# -- through real tables ------------------------------------------------------------------


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
    for behind, verdict in (({"src": 9}, "behind"), ({"src": 10}, "same")):
        decision = ask(local_target, 7, time=behind)
        # The decision carries what the stall watch hears: the verdict, and against what.
        assert decision == Skip("replay", stall=Standing(Time.of(behind), verdict, Time.of({"src": 10})))
    ahead = ask(local_target, 1, time={"src": 11})
    assert isinstance(ahead, Commit) and ahead.desc.clocked
    assert ahead.stall is not None and (ahead.stall.verdict, ahead.stall.committed) == ("ahead", {"src": 10})


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
    standby = ask(local_target, 3, time={"src": 9}, writer="c", read_only=True)
    assert skipped(standby) == ("replay", False)
    promote(local_target, "v", "c")
    fenced = ask(local_target, 3, time={"src": 9}, writer="a")
    assert fenced == Skip("fenced", entitled=False)  # and the stall watch does not hear it
    assert skipped(ask(local_target, 3, time={"src": 9}, writer="c", read_only=True)) == ("replay", True)


def test_a_new_lineage_takes_the_view_over_and_always_commits(spark, local_target):
    MVSink(local_target, "v", lineage="first")(rows(spark), 4)
    decision = ask(local_target, 0, lineage="second")
    assert isinstance(decision, Commit) and decision.desc.takeover and decision.always
    # Refused where new lineages are not adopted.
    refused(ask(local_target, 0, lineage="third", on_new_lineage="fail"), "new lineage")


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
    refused(ask(local_target, 3, mode="upsert", key=["id"]), r"epochs 1\.\.2 were never committed")
    allowed = ask(local_target, 3, mode="upsert", key=["id"], allow_gaps=True)
    assert isinstance(allowed, Commit) and allowed.desc.upper == 4
    # A new lineage taking an upsert view over past its first epoch misses its earlier rows.
    taking = ask(local_target, 2, mode="upsert", key=["id"], lineage="other", on_new_lineage="adopt")
    refused(taking, "takes the view over at its epoch 2, not its first")


def test_under_a_shared_clock_a_batch_starting_past_the_committed_time_is_a_gap(spark, local_target):
    upsert = {"mode": "upsert", "key": ["id"], "clock": lambda batch, epoch: {"src": 10}}
    MVSink(local_target, "v", **upsert)(rows(spark), 0)
    gap = refused(ask(local_target, 1, time={"src": 20}, start={"src": 15}, **upsert), "past the committed")
    assert gap.stall is not None and gap.stall.verdict == "ahead"  # the stall watch hears it first
    joined = ask(local_target, 1, time={"src": 20}, start={"src": 10}, **upsert)
    assert isinstance(joined, Commit)


# -- the pure function, over made-up snapshots ---------------------------------------------


class _Log:
    """The app transactions a made-up snapshot answers with."""

    def __init__(self, txns: dict[str, int]) -> None:
        self.txns = txns

    def transaction_version(self, app_id: str) -> int | None:
        return self.txns.get(app_id)


KEYS = Keys("mvsink:v")


def made_up(frontier: int | None = 1, **txns: int) -> Snapshot:
    """A snapshot of view ``v`` at ``frontier``, owned by lineage ``direct`` (at that frontier)
    unless ``txns`` say more (by ``Keys`` key)."""
    owned = {KEYS.owner: 1, KEYS.generation("direct"): 1}
    if frontier is not None:
        owned[KEYS.lineage_frontier("direct")] = frontier
    return Snapshot("/made-up", 0, frontier, "{}", (), (), _table=_Log({**owned, **txns}))


def test_a_standbys_replay_is_a_replay_and_a_writer_not_promoted_is_fenced_even_so():
    promoted = {KEYS.active: 2, KEYS.writer("b"): 2, KEYS.writer("a"): 1}
    snap = made_up(3, **promoted)
    assert skipped(ask(snap, 1, writer="b", read_only=True)) == ("replay", True)
    assert skipped(ask(snap, 1, writer="c", read_only=True)) == ("fenced", False)
    assert skipped(ask(snap, 5, writer="c", read_only=True)) == ("read_only", False)  # it still plans
    assert skipped(ask(snap, 5, writer="a")) == ("fenced", False)
    assert skipped(ask(snap, 1, writer="a")) == ("fenced", False)
    assert skipped(ask(made_up(3), 1, read_only=True)) == ("replay", False)
    assert skipped(ask(made_up(3), 1, read_only=True, as_of=2)) == ("before_as_of", False)


def test_a_standing_is_heard_for_every_answer_but_a_writer_not_promoted():
    behind = Standing(Time.of({"t": 1}), "behind", Time.of({"t": 2}))
    opts = SinkOptions.build(target="/made-up", name="v", heartbeat=0)

    def answer(snap: Snapshot, clock: Standing, **kw: Any) -> Decision:
        where = Where("v", "/made-up", 4)
        return decide(snap, 4, opts, lineage="x", clock=clock, start=None, now=0, where=where, **kw)

    assert answer(made_up(), behind, read_only=False).stall == behind
    assert answer(made_up(), behind, read_only=True).stall == behind
    ahead = Standing(Time.of({"t": 3}), "ahead", Time.of({"t": 2}))
    assert answer(made_up(), ahead, read_only=False).stall == ahead
    not_promoted = made_up(**{KEYS.active: 2})
    assert answer(not_promoted, ahead, read_only=False) == Skip("fenced", entitled=False)


def test_a_time_cadence_is_due_by_the_time_given():
    snap = made_up(1, **{KEYS.at: 10_000})
    assert ask(snap, 1, refresh_every="2s", now=11_999) == Skip("between_refreshes")
    due = ask(snap, 1, refresh_every="2s", now=12_000)
    assert isinstance(due, Commit) and due.always
    quiet = ask(snap, 1, heartbeat="2s", now=11_999)
    assert isinstance(quiet, Commit) and not quiet.always


def test_offsets_that_went_back_are_refused_and_an_unreadable_start_is_not_compared():
    opts = {"clock": "source_offsets", "checkpoint": "/made-up-checkpoint"}
    snap = made_up(None)
    back = ask(snap, 3, time={"0.version": 5}, start={"0.version": 7}, **opts)
    assert refused(back, r"went back between its batches \(0.version: 7 -> 5\)").stall is None
    gone = ConfigError("offsets/2 is gone")
    assert isinstance(ask(snap, 3, time={"0.version": 5}, start=gone, **opts), Commit)
    assert isinstance(ask(snap, 0, time={"0.version": 5}, start={"0.version": 7}, **opts), Commit)


def test_an_unreadable_start_fails_the_gap_check_with_its_error():
    upsert = {"mode": "upsert", "key": ["id"], "clock": "source_offsets", "checkpoint": "/made-up"}
    committed = {KEYS.clock("0.version"): 5, KEYS.clock("#parts"): 1}
    gone = ConfigError("offsets/2 is gone")
    decision = ask(made_up(1, **committed), 3, time={"0.version": 6}, start=gone, **upsert)
    assert isinstance(decision, Refuse) and decision.error is gone and decision.stall is not None


def test_an_epoch_is_unchanged_only_when_nothing_makes_it_land():
    snap = made_up(1)
    quiet = ask(snap, 1, heartbeat=5)
    assert isinstance(quiet, Commit) and not quiet.always
    assert unchanged(quiet, writes_files=False, changes_schema=False, takes_table=False)
    for landing in ("writes_files", "changes_schema", "takes_table"):
        said = {"writes_files": False, "changes_schema": False, "takes_table": False, landing: True}
        assert not unchanged(quiet, **said)
    beat = ask(snap, 1, heartbeat=0)
    assert isinstance(beat, Commit) and not unchanged(
        beat, writes_files=False, changes_schema=False, takes_table=False
    )
