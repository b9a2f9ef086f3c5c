"""One epoch, top to bottom: the attempt loop of a sink's call, the stages of ``mvsink.epoch``
(its doc has the diagram and the invariants) in order::

    snapshot -> decide -> (Skip: drain, report) | holder -> layout -> plan -> stage -> commit -> report
                                                                   (Lost: discard, back off, again)

The retry loop (``retrying``) is ``table/commit.py``'s. A commit's outcome is a value
(``table/commit.append``: ``Landed`` or ``Lost``), or an error when
the log cannot tell (``CommitOutcomeUnknownError``: the staged files are kept, I4).
``SinkState`` is what a sink keeps between epochs; ``Epoch`` reads it and the options, never
the sink object.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

from pyspark.sql import DataFrame

from mvsink import failpoints
from mvsink.compat import is_dataframe, is_spark_error, spark_reason
from mvsink.config import SinkOptions
from mvsink.epoch import holder
from mvsink.epoch.clock import Stall, Standing, Time, batch_start, epoch_time, query_start, standing
from mvsink.epoch.clock import transactions as clock_transactions
from mvsink.epoch.decide import Commit, Refuse, Skip, decide, unchanged
from mvsink.epoch.holder import Holding
from mvsink.epoch.lineage import DIRECT, Lineage, lineage_of
from mvsink.epoch.mint import BatchDescription
from mvsink.epoch.query import Query, check_output_mode
from mvsink.errors import (
    CommitReplacedError,
    ConfigError,
    InvariantViolation,
    MVSinkError,
    RetriesExhaustedError,
    SchemaMismatchError,
    SparkJobError,
    UnsupportedTableError,
    Where,
)
from mvsink.history.keep import History, View
from mvsink.plan.append import Append
from mvsink.plan.complete import Complete
from mvsink.plan.context import DriverBudget, EpochContext, give_back_memory
from mvsink.plan.tombstones import Tombstones
from mvsink.plan.upsert import Upsert
from mvsink.report import EpochReport
from mvsink.table.commit import Landed, Lost, add_columns, append, retrying
from mvsink.table.deletion_vectors import vector_files
from mvsink.table.delta import Snapshot, keeps_files_across_schema_change, load_snapshot
from mvsink.table.index import DriverIndex
from mvsink.table.layout import Layout, layout_for
from mvsink.table.log import commit_info
from mvsink.table.plan import Plan, Staged
from mvsink.table.record import ATTEMPT, EpochRecord, Keys, now_ms, schema_metadata
from mvsink.table.schema import (
    check_roles,
    check_supported,
    schema_change,
    schema_digest,
    stored_struct,
    target_schema_json,
)
from mvsink.table.staging import discard, stage
from mvsink.table.storage import Store
from mvsink.table.uris import table_root

log = logging.getLogger("mvsink.sink")
_COMMIT = re.compile(r"_delta_log/\d{20}\.json")


class Mode(Protocol):
    """One mode's planner for one epoch: plans attempts, hears of the commit, cleans up."""

    def plan(self, snap: Snapshot, layout: Layout) -> Plan: ...

    def committed(self, staged: Staged) -> None: ...

    def close(self) -> None: ...


@dataclass
class Planning:
    """A mode's planner for one epoch, and what its plans found over the epoch's attempts: the
    data files they read (the report's ``files_read``); a plan whose planning ran every
    partition of the batch tells the context, whose ``drain`` then need not run it."""

    planner: Mode
    ctx: EpochContext
    files_read: int = 0

    def plan(self, snap: Snapshot, layout: Layout) -> Plan:
        plan = self.planner.plan(snap, layout)
        self.files_read += plan.files_read
        self.ctx.batch_ran = self.ctx.batch_ran or plan.ran_batch
        return plan

    def committed(self, staged: Staged) -> None:
        self.planner.committed(staged)

    def close(self) -> None:
        self.planner.close()


@dataclass(frozen=True)
class LandedCommit:
    """A commit this sink landed (``SinkState.landed``)."""

    table_id: str | None
    """The id of the table it landed on; None when the commit made the table (not checked)."""
    version: int
    attempt_id: str
    """The attempt id its commit info carries (``record.ATTEMPT``)."""
    epoch: int


@dataclass
class SinkState:
    """What a sink keeps between its epochs, in the process it runs in (never pickled)."""

    index: DriverIndex = field(default_factory=DriverIndex)
    """Complete mode: the entries of the table's files, on the driver."""
    tombstones: Tombstones = field(default_factory=Tombstones)
    """Upsert mode: the view's tombstone sets read or written."""
    budget: DriverBudget = field(default_factory=DriverBudget)
    """What collecting the view to the driver costs (``placement``)."""
    stall: Stall = field(default_factory=Stall)
    """Under a shared clock: epochs in a row that could not advance the view."""
    clock_seen: dict[tuple[str, int], Time] = field(default_factory=dict)
    """A callable clock's times of the batches seen, by (lineage, epoch): where the next batch
    starts (``clock.batch_start``). Only the last two of a lineage are kept."""
    seen_lineage: str | None = None
    """The lineage of the query this sink serves, once seen."""
    starts: dict[str, Time | None] = field(default_factory=dict)
    """Where each lineage's query started reading (``clock.query_start``), once read."""
    look_up_again: bool = False
    """The table a name resolved to is gone: the next epoch looks the name up again."""
    landed: LandedCommit | None = None
    """The last commit this sink landed, until the next epoch checked that the log still holds
    it (``Epoch._check_still_ours``)."""

    def lineage(self, found: str) -> str:
        """A sink serves one query: once it has seen the query's lineage, a batch that shows
        none (a thread without Spark's properties) is still that query's."""
        if found == DIRECT and self.seen_lineage is not None:
            return self.seen_lineage
        if found != DIRECT:
            self.seen_lineage = found
        return found

    def forget_table(self) -> None:
        """The target moved: what was known of the old folder's files goes."""
        self.index, self.tombstones, self.landed = DriverIndex(), Tombstones(), None


class Epoch:
    """One call of the sink: the attempts of one epoch (see the module doc)."""

    def __init__(
        self,
        state: SinkState,
        opts: SinkOptions,
        desired: DataFrame,
        epoch: int,
        *,
        store: Store,
        read_only: bool,
        named: str | None,
        query: Query | None,
    ) -> None:
        self.state = state
        self.opts = opts
        self.epoch = epoch
        self.store = store
        self.read_only = read_only
        self.named = named
        """The table name the target was given as (None: a path)."""
        self.where = Where(opts.name, opts.target, epoch)
        self.started = time.monotonic()
        self.stored = stored_struct(desired.schema, opts.delete_column)
        check_output_mode(desired, opts.mode, query, self.where)
        self.lineage = state.lineage(lineage_of(desired, query.id if query else None, opts, self.where))
        self.checkpoint = opts.checkpoint or (query.checkpoint if query else None)
        """The query's checkpoint, where known: where it started reading is read from it."""
        self.time = epoch_time(desired, epoch, opts, self.where)
        self.before = state.clock_seen.get((self.lineage, epoch - 1))
        if self.time is not None:
            seen = state.clock_seen
            seen[(self.lineage, epoch)] = self.time
            for old in [k for k in seen if k[0] == self.lineage and k[1] < epoch - 1]:
                del seen[old]
        self.ctx = EpochContext(desired, opts, self.where, store, budget=state.budget)
        self.entitled = True
        """Whether the last attempt found this sink entitled to write the view (``Skip``)."""
        planner: Mode
        if opts.mode == "complete":
            planner = Complete(self.ctx, state.index)
        elif opts.mode == "upsert":
            planner = Upsert(self.ctx, state.tombstones)
        else:
            planner = Append(self.ctx)
        self.mode = Planning(planner, self.ctx)
        self.history = (
            History.at(opts.name, opts.history_target, opts.storage_options, opts.retry, self.where)
            if opts.history_target is not None
            else None
        )
        """The view's history, which the sink keeps whenever it may write the view (a standby
        promoted through the table commits, ``decide.py``, a read-only option or not)."""

    def run(self) -> EpochReport:
        raw, opts = self.ctx.batch, self.opts
        check_supported(raw.schema, self.where)
        check_roles(
            raw.schema,
            key=opts.key,
            delete_column=opts.delete_column,
            sequence_column=opts.sequence_column,
            partition_by=opts.partition_by or (),
            cluster_by=opts.cluster_by,
            where=self.where,
        )
        try:
            return self.attempts()
        except MVSinkError:
            raise
        except Exception as exc:
            if is_spark_error(exc):
                raise SparkJobError(
                    f"a Spark job of this epoch failed, so nothing was committed: {spark_reason(exc)}",
                    self.where,
                ) from exc
            raise
        finally:
            self.mode.close()
            if self.ctx.collected:
                give_back_memory()

    def attempts(self) -> EpochReport:
        """Attempt after attempt (``retrying``), each from a fresh snapshot."""
        where = self.where

        def lost(n: int, race: Lost, pause: float) -> None:
            log.info(
                "%s: attempt %d lost a commit race (%s); retrying in %.2fs", where, n, race.reason, pause
            )

        def exhausted(n: int) -> Exception:
            return RetriesExhaustedError(
                f"lost the commit race {n} times in a row; the epoch is not committed (Spark will "
                "retry the batch). If another writer commits this often, raise retry.max_attempts or "
                "make it commit less often.",
                where,
            )

        return retrying(self.opts.retry, self.attempt, lost=lost, exhausted=exhausted)

    def attempt(self, attempt: int) -> EpochReport | Lost | None:
        """One attempt: each stage in order. ``Lost``: the commit race was lost; None: a table
        appeared since the snapshot (plan against it at once)."""
        snap = self.snapshot()
        if snap is None:
            return None
        decision = self.decide(snap)
        if isinstance(decision, Skip):  # (a sink that only skips checks nothing: it writes nothing)
            if decision.entitled and snap.exists and holder.holds(snap, self.opts.name):  # (a replay)
                self._complete_history(snap)
            return self.skip(decision, snap, attempt)
        holding = holder.check(snap, self.opts, self.ctx.store, self.where)
        self._complete_history(snap)
        layout = self.layout(snap)
        self._check_not_retired(snap, layout)
        self._check_history_follows(layout)
        plan = self.mode.plan(snap, layout)
        staged = self.stage(plan, snap, layout)
        if unchanged(
            decision,
            writes_files=bool(staged.adds or staged.removes or any(s.commits for s in staged.sides)),
            changes_schema=bool(layout.replaces),
            takes_table=bool(holding.took_over),
        ):
            self.discard(staged, plan)
            self.ctx.drain()
            return self.report("unchanged", decision.desc.lower, None, None, attempt, snap)
        outcome = self.commit(decision, holding, staged, plan, snap, layout, attempt)
        if isinstance(outcome, Lost):
            return outcome
        failpoints.hit("after_commit", self.where)
        self.mode.committed(staged)
        self._follow_history(outcome.version, snap, layout, staged)
        lower, upper = decision.desc.lower, decision.desc.upper
        return self.report("committed", lower, upper, outcome.version, attempt, snap, staged=staged)

    # -- the stages, in order -----------------------------------------------------------------

    def snapshot(self) -> Snapshot | None:
        """The table's latest snapshot; None when a table appeared where there was none (the
        attempt starts again against it)."""
        opts = self.opts
        with self.ctx.phase("snapshot"):
            snap = load_snapshot(
                opts.target,
                opts.app_id,
                opts.storage_options,
                self.where,
                engine=opts.engine,
                spark=self.ctx.batch.sparkSession,
                log_files=self.ctx.store,
            )
            self._check_still_ours(snap)
        failpoints.hit("after_snapshot", self.where)
        if not snap.exists and self.named:
            self.state.look_up_again = True
            raise ConfigError(
                f"the table {self.named} was at {opts.target} when this epoch looked it "
                "up, and that folder holds no Delta table any more (dropped, or moved since?): "
                "the next epoch looks the name up again",
                self.where,
            )
        if not snap.exists and not self._only_ours_in_root():
            return None
        self._check_append_only(snap)
        return snap

    def layout(self, snap: Snapshot) -> Layout:
        """The target's schema and partition columns: the table's, or those it will get."""
        opts = self.opts
        return layout_for(
            self.stored,
            snap,
            partition_by=opts.partition_by,
            schema_changes=opts.schema_changes,
            mode=opts.mode,
            key=opts.key,
            sequence_column=opts.sequence_column,
            where=self.where,
        )

    def _complete_history(self, snap: Snapshot) -> None:
        """Bring the view's history to ``snap``'s version before anything else (H3): a crash
        between an epoch's commit and its history's is completed here, by whichever sink
        runs next. Refuses a history target that is not this view's (nothing is staged yet)."""
        if self.history is None:
            return
        partition_by = snap.partition_by if snap.exists else tuple(self.opts.partition_by or ())
        schema_json = snap.schema_json or target_schema_json(self.stored)
        view = View(self.ctx.store, schema_json, partition_by, snap.table_id, self._history_tasks(snap))
        with self.ctx.phase("history"):
            self.history.catch_up(view, snap.version, start=snap)

    def _history_tasks(self, snap: Snapshot) -> Any:
        """Where the history is derived: in Spark tasks (the batch's session) when this epoch
        plans there, for a view too big for the driver; None: on the driver."""
        return self.ctx.batch.sparkSession if self.ctx.placement(snap) == "distributed" else None

    def _check_history_follows(self, layout: Layout) -> None:
        """A view that keeps a history does not change its columns: the history does not follow
        such a change yet (``SchemaMismatchError``, before anything is staged)."""
        if self.history is None or layout.replaces is None:
            return
        change = schema_change(layout.struct, layout.replaces).says()
        raise SchemaMismatchError(
            f"desired's columns differ from the view's table ({change}), and the view keeps a "
            f"history ({self.opts.history_target}), which does not follow a change of the view's "
            "columns yet. Nothing was written. Give the view a new target and history, or keep "
            "its columns.",
            self.where,
        )

    def _follow_history(self, version: int, snap: Snapshot, layout: Layout, staged: Staged) -> None:
        """Right after the epoch's commit, the history's (H3). Its failure fails nothing: the
        view's version landed, and the next epoch completes the history before it plans."""
        if self.history is None:
            return
        view = View(
            self.ctx.store, layout.schema_json, layout.partition_by, snap.table_id, self._history_tasks(snap)
        )
        try:
            with self.ctx.phase("history"):
                self.history.catch_up(view, version, moved=staged.moved)
        except Exception as exc:
            log.warning(
                "%s: version %d of the view committed, and its history could not follow (%s): the "
                "next epoch completes it before it plans",
                self.where,
                version,
                exc,
            )

    def _check_not_retired(self, snap: Snapshot, layout: Layout) -> None:
        """A sink about to change the table's schema does not change it to one the table left:
        a replica still on the query the view's query replaced would change it back
        (``schema.py``). Checked once it is known to commit: such a replica that only skips
        (a standby, a replay, a read-only sink) writes nothing, and is left alone."""
        if layout.replaces is None:
            return
        left = snap.transaction(Keys(self.opts.app_id).retired_schema(schema_digest(self.stored)))
        if left is not None:
            raise SchemaMismatchError(
                f"desired has the columns the view's table left at version {left}, when a sink "
                "with schema_changes = 'evolve' changed them: this sink runs the query the view's "
                "query replaced (a replica not yet redeployed?). Nothing was written: stop it, or "
                "run the new query.",
                self.where,
            )

    def decide(self, snap: Snapshot) -> Commit | Skip:
        """``decide.decide`` over what this attempt knows: under a shared clock, the epoch's
        standing against ``snap`` and where its batch starts, read here; the stall watch hears
        the standing; a ``Refuse`` raises its error."""
        opts = self.opts
        clock = None if self.time is None else standing(self.time, snap, opts.app_id)
        decision = decide(
            snap,
            self.epoch,
            opts,
            lineage=self.lineage,
            read_only=self.read_only,
            clock=clock,
            start=None if clock is None else batch_start(self.epoch, opts, self.where, self.before),
            now=now_ms(),
            where=self.where,
            query_start=self._query_start,
        )
        if decision.stall is not None:
            self._watch_stall(decision.stall)
        if isinstance(decision, Refuse):
            raise decision.error
        return decision

    def _query_start(self) -> Time | None:
        """Where this epoch's query started reading (None: not known), read once a lineage; a
        checkpoint that could not be read is not known this epoch, and read again the next."""
        starts = self.state.starts
        if self.lineage not in starts:
            if self.checkpoint is None:
                return None
            try:
                starts[self.lineage] = query_start(self.checkpoint, self.opts.storage_options, self.where)
            except ConfigError as exc:
                log.info("%s: where the query started is not known: %s", self.where, exc.message)
                return None
        return starts[self.lineage]

    def skip(self, decision: Skip, snap: Snapshot, attempt: int) -> EpochReport:
        """Write nothing, for ``decision``'s reason; a standby still plans, to report what it
        would write, unless desired does not fit the table (a standby still on the query the
        view's query replaced: it is left alone, with a WARNING). The batch runs to its end
        either way."""
        ctx = self.ctx
        self.entitled = decision.entitled
        plan = None
        if decision.plans:
            try:
                layout = self.layout(snap)
            except SchemaMismatchError as exc:
                log.warning(
                    "%s: a standby whose desired does not fit the table plans nothing: %s",
                    self.where,
                    exc.message,
                )
            else:
                plan = self.mode.plan(snap, layout)
        if plan is not None and plan.inserted is None and is_dataframe(plan.inserts):
            # A standby reports what it would insert, also when tasks would write it.
            rows = cast(DataFrame, plan.inserts)
            with ctx.phase("count"):
                plan = replace(plan, inserted=rows.count())
            ctx.batch_ran = True
        ctx.drain()
        return self.report(decision.reason, snap.frontier, None, None, attempt, snap, plan=plan)

    def stage(self, plan: Plan, snap: Snapshot, layout: Layout) -> Staged:
        """The plan as files nothing references yet (I4)."""
        opts, ctx = self.opts, self.ctx
        with ctx.phase("write", _writing(plan)):
            staged = stage(
                plan,
                ctx.store,
                layout,
                view=opts.name,
                epoch=self.epoch,
                max_rows_per_file=opts.max_rows_per_file,
                cluster_by=opts.cluster_by,
                where=self.where,
                change_feed=snap.change_feed,
                deletion_vectors=snap.deletion_vectors,
                # An upsert view's history follows its rewrites by where staging put their rows.
                moves=opts.key if self.history is not None and opts.mode == "upsert" else (),
            )
            if is_dataframe(plan.inserts):
                ctx.batch_ran = True  # Spark tasks wrote the whole batch
        failpoints.hit("after_staging", self.where)
        return staged

    def commit(
        self,
        decision: Commit,
        holding: Holding,
        staged: Staged,
        plan: Plan,
        snap: Snapshot,
        layout: Layout,
        attempt: int,
    ) -> Landed | Lost:
        """Append the staged files and the frontier against ``snap``, strictly (I2). Files of
        an attempt that did not get as far as the commit call, or lost the race, are
        discarded; after the call, only a known loss discards them (I4): an unknown outcome
        raises with the files kept."""
        opts, ctx, desc = self.opts, self.ctx, decision.desc
        attempt_id = uuid.uuid4().hex
        try:
            ctx.drain()
            failpoints.hit("before_commit", self.where, snap)
            self._check_staged(staged)
        except BaseException:
            self.discard(staged, plan)  # not committed: nothing can reference them (I4)
            raise
        schema_json, retiring = layout.schema_json, self._retiring(snap, layout)
        if self._columns_first(snap, layout):
            first = self._add_columns(snap, layout, staged, plan, retiring)
            if isinstance(first, Lost):
                return first
            snap, schema_json, retiring = first, first.schema_json or schema_json, {}
        with ctx.phase("commit", f"{len(staged.adds)} file(s) in, {len(staged.removes)} out"):
            outcome = append(
                snap,
                ctx.store,
                adds=staged.adds,
                removes=staged.removes,
                changes=staged.changes,
                updates=staged.updates,
                app_id=opts.app_id,
                upper=desc.upper,
                attempt_id=attempt_id,
                metadata=self._record(desc, holding, staged, decision.lineage, attempt).metadata(),
                schema_json=schema_json,
                partition_by=layout.partition_by,
                where=self.where,
                transactions={
                    **self._transactions(decision),
                    **{k: v for side in staged.sides for k, v in side.transactions.items()},
                    **holding.transactions(opts.name),
                    **retiring,
                },
            )
        if isinstance(outcome, Lost):
            self.discard(staged, plan)  # known not to have landed (I4)
        else:
            self.state.landed = LandedCommit(snap.table_id, outcome.version, attempt_id, self.epoch)
        return outcome

    def _columns_first(self, snap: Snapshot, layout: Layout) -> bool:
        """Whether desired's added columns are committed in a version of their own before the
        epoch's commit, which is then made on it: through delta-rs in upsert and append mode
        (``commit.keeps_files_across_schema_change``)."""
        return layout.replaces is not None and not (
            self.opts.mode == "complete" or keeps_files_across_schema_change(snap)
        )

    def _add_columns(
        self, snap: Snapshot, layout: Layout, staged: Staged, plan: Plan, retiring: dict[str, int]
    ) -> Snapshot | Lost:
        """Commit desired's added columns alone (``commit.add_columns``) with the record of the
        schema they retire (``retiring``), just before the epoch's commit: the snapshot of that
        version, or the lost race (the staged files, which nothing references yet, are
        discarded then, and on any error)."""
        assert layout.replaces is not None
        change = schema_change(layout.struct, layout.replaces).says()
        attempt_id = uuid.uuid4().hex
        try:
            with self.ctx.phase("commit"):
                first = add_columns(
                    snap,
                    self.ctx.store,
                    schema_json=layout.schema_json,
                    attempt_id=attempt_id,
                    metadata=schema_metadata(self.opts.name, self.epoch, change),
                    transactions=retiring,
                    where=self.where,
                )
        except BaseException:
            self.discard(staged, plan)
            raise
        if isinstance(first, Lost):
            self.discard(staged, plan)
            return first
        assert first.version is not None
        self.state.landed = LandedCommit(snap.table_id, first.version, attempt_id, self.epoch)
        log.info("%s: the table took desired's columns (%s) as version %d", self.where, change, first.version)
        try:
            failpoints.hit("after_schema_commit", self.where)
        except BaseException:
            self.discard(staged, plan)  # the epoch's commit was not made: nothing references them
            raise
        return first

    def report(
        self,
        outcome: Any,
        lower: int | None,
        upper: int | None,
        version: int | None,
        attempts: int,
        snap: Snapshot,
        *,
        plan: Plan | None = None,
        staged: Staged | None = None,
    ) -> EpochReport:
        return EpochReport(
            view=self.opts.name,
            target=self.opts.target,
            epoch=self.epoch,
            outcome=outcome,
            lower=lower,
            upper=upper,
            version=version,
            inserted=staged.inserted if staged else (plan.inserted or 0) if plan else 0,
            retracted=staged.retracted if staged else plan.retracted if plan else 0,
            files_added=len(staged.adds) + len(staged.updates) if staged else 0,
            files_removed=len(staged.removes) if staged else 0,
            bytes_written=staged.bytes_written if staged else 0,
            files_read=self.mode.files_read,
            whole=staged.replaces_all if staged else False,
            phases=dict(self.ctx.phases),
            attempts=attempts,
            seconds=time.monotonic() - self.started,
            snapshot_version=snap.version,
            clock_time=dict(self.time) if self.time is not None else None,
        )

    # -- what the stages need -----------------------------------------------------------------

    def discard(self, staged: Staged, plan: Plan) -> None:
        discard(staged, self.ctx.store, plan.index)

    def _watch_stall(self, clock: Standing) -> None:
        """Under a shared clock, an epoch behind or incomparable writes nothing; when that goes
        on while the committed time stands still, nobody advances the view (``clock.Stall``):
        a WARNING each epoch, and a note ``mvsink status`` shows."""
        stall, store = self.state.stall, self.ctx.store
        verdict, committed = clock.verdict, clock.committed
        who = f"{self.opts.writer or ''}\n{self.lineage}"
        if not stall.observe(verdict, committed, self.epoch):
            if verdict in ("ahead", "same"):
                stall.clear_note(store, self.opts.name, who, self.where)
            return
        log.warning(
            "%s: the view is stalled: for %d epochs (since epoch %s) this sink's time was %s the "
            "committed time, which did not move. This epoch's time: %s; committed: %s. Nothing "
            "is written until a time is ahead of it: check that the replicas read the same "
            "sources (docs/replicas.md)",
            self.where,
            stall.epochs,
            stall.since,
            verdict,
            json.dumps(self.time, sort_keys=True),
            json.dumps(committed, sort_keys=True),
        )
        fields = {
            "writer": self.opts.writer,
            "lineage": self.lineage,
            "epoch": self.epoch,
            "verdict": verdict,
            "time": self.time,
            "committed": committed,
            "at_ms": int(time.time() * 1000),
        }
        stall.leave_note(store, self.opts.name, who, fields, self.where)

    def _check_still_ours(self, snap: Snapshot) -> None:
        """Raise ``CommitReplacedError`` if the last commit this sink landed is no longer in the
        log: another writer put its own commit file over it, so that writer's commits are not
        exclusive the way this sink's are (docs/design.md). Checked once per commit, at the
        next epoch's snapshot, before anything is staged: a best effort, which a replacement
        landing later still escapes. Passes when it cannot tell: the table made again at the
        path (another id; a table this sink made has no id to compare), the log file gone
        (log cleanup), a file without commit info. A read that fails is tried next epoch."""
        last, self.state.landed = self.state.landed, None
        if last is None or last.table_id is None or snap.table_id != last.table_id:
            return
        if snap.version is None or snap.version < last.version:
            return
        try:
            info = commit_info(self.ctx.store, last.version)
        except Exception as exc:
            self.state.landed = last
            log.warning("%s: could not read version %d back to check it: %s", self.where, last.version, exc)
            return
        if info is None or info.keys() == {"version"} or info.get(ATTEMPT) == last.attempt_id:
            return
        by = info.get("operation") or info.get("engineInfo") or "another writer"
        raise CommitReplacedError(
            f"version {last.version}, which epoch {last.epoch} of this sink committed, now holds "
            f"another commit ({by}): a writer on this table replaced the commit file, so its "
            "commits are not exclusive the way this sink's are, and the two must not write this "
            "table together (docs/design.md, 'Two writers on one S3 table'). The rows of epoch "
            f"{last.epoch} are not in the table. Complete mode repairs them at the next epoch; in "
            "upsert and append mode the next epoch finds the view's frontier behind (a LineageError "
            f"naming the gap): replay epoch {last.epoch} from the source (roll the query's "
            "checkpoint back to it) or, accepting the loss, set allow_gaps. This epoch wrote nothing.",
            self.where,
        )

    def _only_ours_in_root(self) -> bool:
        """A target that is not yet a Delta table must hold nothing but what mvsink leaves
        there: the sink would make a table beside someone's files (a Parquet dataset, say),
        which readers of the folder would then no longer see. False if, instead, another
        writer made the folder a Delta table since the snapshot (its files came with a log)."""
        store = self.ctx.store
        found = store.foreign()
        if not found:
            return True
        if any(_COMMIT.fullmatch(p) for p in store.files("_delta_log")):
            return False
        raise UnsupportedTableError(
            f"the target holds files but no Delta log (e.g. {found[0]!r}): it is not a Delta "
            "table. Nothing was written. Point the sink at an empty folder, or make the folder "
            "a Delta table first (CONVERT TO DELTA).",
            self.where,
        )

    def _check_append_only(self, snap: Snapshot) -> None:
        """An append-only table (``delta.appendOnly``) takes no removes: complete and upsert
        mode, which retract rows, are refused before anything is staged."""
        if self.opts.mode != "append" and snap.properties.append_only:
            raise UnsupportedTableError(
                f"the target is append-only (delta.appendOnly = true): {self.opts.mode} mode retracts "
                "rows, which such a table refuses. Use mode 'append', or a table without the property.",
                self.where,
            )

    def _check_staged(self, staged: Staged) -> None:
        """Every staged file (data, change and deletion-vector files) is in storage, whole,
        before a commit may reference it."""
        files = [*staged.adds, *staged.changes, *vector_files(f.deletion_vector for f in staged.updates)]
        gone: list[str] = []
        if staged.side_paths:
            found = self.ctx.store.sizes(staged.side_paths)
            gone += [p for p in staged.side_paths if p not in found]
        if staged.folder and files:
            gone += self.ctx.store.missing(staged.folder, files)
        if gone:
            raise InvariantViolation(
                f"{len(gone)} staged file(s) are missing or changed before the commit (e.g. "
                f"{gone[0]}); was a vacuum with a short retention running? Nothing was committed.",
                self.where,
            )

    def _transactions(self, decision: Commit) -> dict[str, int]:
        """What a commit records besides the frontier: the epoch's time under a shared clock
        (and, when it takes the committed time, that its lineage did), else its lineage's
        standing; the active writer's promotion, again; and when it was made
        (``record.Keys.at``)."""
        desc, lineage, writers = decision.desc, decision.lineage, decision.writers
        keys = Keys(self.opts.app_id)
        at = {keys.at: now_ms()}
        if self.time is not None:
            clock = clock_transactions(
                self.opts.app_id, self.time, lineage.name, self.opts.writer, desc.upper
            )
            taken = {keys.clock_taken(lineage.name): 1} if self.opts.take_over == self.opts.name else {}
            return {**clock, **taken, **self._origin(decision), **writers.restamp(), **at}
        return {**lineage.transactions(desc.upper), **self._origin(decision), **writers.restamp(), **at}

    def _origin(self, decision: Commit) -> dict[str, int]:
        """The view's origin, when the commit records one (``decide._check_start``)."""
        if decision.origin is None:
            return {}
        keys = Keys(self.opts.app_id)
        return {**{keys.origin(p): v for p, v in decision.origin.items()}, keys.origins: len(decision.origin)}

    def _retiring(self, snap: Snapshot, layout: Layout) -> dict[str, int]:
        """The commit that changes the table's schema records the schema it leaves, with the
        version it leaves it at: its own, ``snap``'s next (``_check_not_retired``). The very
        version that changes the schema carries it, so no race, compaction or crash after it
        can lose the record."""
        if layout.replaces is None or snap.version is None:
            return {}
        return {Keys(self.opts.app_id).retired_schema(schema_digest(layout.replaces)): snap.version + 1}

    def _record(
        self, desc: BatchDescription, holding: Holding, staged: Staged, lineage: Lineage, attempt: int
    ) -> EpochRecord:
        return EpochRecord(
            view=self.opts.name,
            mode=self.opts.mode,
            epoch=self.epoch,
            lower=desc.lower,
            upper=desc.upper,
            lineage=lineage.name,
            writer=self.opts.writer or f"{socket.gethostname()}:{os.getpid()}",
            inserted=staged.inserted,
            retracted=staged.retracted,
            files_added=len(staged.adds) + len(staged.updates),
            files_removed=len(staged.removes),
            attempts=attempt,
            seconds=time.monotonic() - self.started,
            phases=self.ctx.phases,
            deletion_vectors=len(staged.updates),
            whole=staged.replaces_all,
            time=self.time,
            takeover=(lineage.owner or 0) + 1 if desc.takeover else None,
            identity=holding.identity,
            took_over=holding.took_over,
            history=table_root(self.opts.history_target) if self.opts.history_target else None,
        )


def _writing(plan: Plan) -> str:
    """What staging ``plan`` writes, for the epoch's progress: rows in and out."""
    rows = "rows to insert" if plan.inserted is None else f"{plan.inserted:,} row(s) to insert"
    return f"{rows}, {plan.retracted:,} to retract"
