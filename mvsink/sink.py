"""The sink: keeps a Delta table equal to a streaming query's result, epoch by epoch.

``MVSink`` is a ``foreachBatch`` callable. Each call runs one epoch; each attempt of it:

    micro-batch (desired) ──────────────┐
                                         v
    snapshot ──> decide ──> plan ──> stage ──> commit ──> Delta log
       ^         (desc)            (files)      │
       └──────── conflict: discard staged files, reload, retry ──┘

* decide (``epoch/decide.py``): from the latest snapshot (version ``v``, frontier ``lower``),
  commit the batch description ``(lower, epoch + 1)``, or skip, for a named reason.
* plan: the mode (``plan/complete.py``, ``plan/upsert.py``, ``plan/append.py``) plans the rows
  to insert and the files to rewrite.
* stage (``table/write.py``): the plan as Parquet that nothing references yet, through the
  I/O layer (``table/storage.py``), on the driver or in Spark tasks.
* commit (``table/delta.py``): removes, adds and the frontier in one Delta version, only if no
  commit at all landed since ``v``.

The frontier of view ``name`` is the app transaction ``mvsink:<name>`` in the Delta log: the
target holds desired as of epoch ``frontier - 1``.

Invariants (cited elsewhere by number):

* I1. Lowers of committed descriptions strictly increase; at most one description is valid
  at a time (the one whose lower is the current frontier).
* I2. A commit is only ever made against the snapshot its correction was computed from
  (``compare_and_append`` is strict: any commit since that snapshot makes it fail).
* I3. After a successful append at ``upper`` the target equals desired of epoch ``upper - 1``
  as a multiset, whatever it held before (complete mode); every key the batch touched holds
  exactly its desired row (upsert mode); the batch's rows were added once (append mode).
* I4. No staged file is referenced unless its whole description committed; a failed attempt
  deletes its staged files, and a crash leaves only unreferenced files that vacuum removes.
* I5. Nothing is lost: an epoch commits, is found already reflected (a newer frontier), or
  raises.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol, cast

from pyspark.sql import DataFrame

from mvsink import failpoints
from mvsink.compat import is_dataframe, is_spark_error, release, spark_reason
from mvsink.config import SinkOptions
from mvsink.epoch.clock import Stall, Time, batch_start, epoch_time
from mvsink.epoch.clock import transactions as clock_transactions
from mvsink.epoch.decide import Clocked, Skip, decide
from mvsink.epoch.lineage import DIRECT, Lineage, Writers, lineage_of
from mvsink.epoch.mint import BatchDescription
from mvsink.epoch.query import check_output_mode, running_query
from mvsink.epoch.workers import check_workers
from mvsink.errors import (
    CommitOutcomeUnknownError,
    ConfigError,
    ConflictError,
    InputError,
    InvariantViolation,
    MVSinkError,
    RetriesExhaustedError,
    SparkJobError,
    UnsupportedTableError,
    Where,
)
from mvsink.ops.promote import promote
from mvsink.plan.append import Append
from mvsink.plan.complete import Complete
from mvsink.plan.context import DriverBudget, EpochContext, give_back_memory
from mvsink.plan.quarantine import Quarantine, check_expressions, errors_options
from mvsink.plan.tombstones import Tombstones
from mvsink.plan.upsert import Upsert
from mvsink.report import EpochReport
from mvsink.table.catalog import CatalogUnavailable, is_path, locate
from mvsink.table.deletion_vectors import vector_files
from mvsink.table.delta import Snapshot, compare_and_append, load_snapshot, read_frontier, table_root
from mvsink.table.index import PersistedIndex
from mvsink.table.record import EpochRecord, Keys, now_ms
from mvsink.table.schema import (
    check_fits,
    check_roles,
    check_supported,
    stored_struct,
    target_schema_json,
    target_struct,
)
from mvsink.table.storage import Store
from mvsink.table.write import Layout, Plan, Staged, discard, stage

log = logging.getLogger(__name__)
metrics = logging.getLogger("mvsink.metrics")
"""One JSON object per epoch (``EpochReport.to_json``): route it to a metrics pipeline."""
_COMMIT = re.compile(r"_delta_log/\d{20}\.json")


class Mode(Protocol):
    """One mode's planner for one epoch: plans attempts, hears of the commit, cleans up."""

    def plan(self, snap: Snapshot, layout: Layout) -> Plan: ...

    def committed(self, staged: Staged) -> None: ...

    def close(self) -> None: ...


class MVSink:
    """Keep the Delta table at ``target`` equal to each micro-batch (``complete`` mode).

    Use as ``df.writeStream.foreachBatch(MVSink(target, name))``, or call it directly as
    ``sink(batch_df, epoch)`` from a batch job. Options are those of ``SinkOptions``.

    The sink pickles as its options alone (Spark Connect ships ``foreachBatch`` callables to a
    Python process next to the server): its runtime state (lock, index, reports) is created
    where it runs.
    """

    def __init__(self, target: str, name: str, **options: Any) -> None:
        self.options = SinkOptions.build(target=target, name=name, **options)
        self._read_only = self.options.read_only
        self._named: str | None = None  # the table name the target was given as, once resolved
        self._located_for: str | None = None  # the query run the name was last looked up for
        self._runtime()

    def _runtime(self) -> None:
        self._index = PersistedIndex()
        self._lock = threading.Lock()
        self._probed = False
        self._seen_lineage: str | None = None
        self._errors: Quarantine | None = None  # on_error = "table": the errors table's sink
        self._budget = DriverBudget()  # what collecting the view to the driver costs (placement)
        self._stall = Stall()  # under a shared clock: epochs in a row that could not advance the view
        self._tombstones = Tombstones()  # upsert mode: the view's tombstone sets read or written
        # A callable clock's times of the batches this sink saw, by (lineage, epoch): where the
        # next batch starts (``clock.batch_start``). Only the last two of a lineage are kept.
        self._clock_seen: dict[tuple[str, int], Time] = {}
        self.reports: deque[EpochReport] = deque(maxlen=1000)
        # Called with the snapshot after staging and before committing (tests use it to land
        # a competing commit in exactly that window).
        self._before_commit: Callable[[Snapshot], None] | None = None
        # Called right after the commit call returns, inside its error handling (tests use it
        # to fail a commit that landed, as a post-commit step of delta-rs can).
        self._after_commit_call: Callable[[], None] | None = None

    def _lineage(self, found: str) -> str:
        """A sink object serves one query: once it has seen the query's lineage, a batch that
        shows none (a thread without Spark's properties) is still that query's."""
        if found == DIRECT and self._seen_lineage is not None:
            return self._seen_lineage
        if found != DIRECT:
            self._seen_lineage = found
        return found

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "read_only": self._read_only, "named": self._named}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.options = state["options"]
        self._read_only = state["read_only"]
        self._named = state.get("named")
        self._runtime()

    @classmethod
    def from_options(cls, options: SinkOptions) -> MVSink:
        """A sink from an already validated ``SinkOptions`` (e.g. ``SinkOptions.from_toml``)."""
        return cls(**options.model_dump())

    @property
    def name(self) -> str:
        return self.options.name

    @property
    def target(self) -> str:
        """The table's location (once a table name was resolved, its location)."""
        return self.options.target

    def _locate(self, spark: Any, run: str | None = None) -> None:
        """Resolve a target given as a table name to the Delta table's location, through
        ``spark``'s catalog (``catalog.py``): the options then hold the location. Looked up at
        the first epoch of each run of a query (``run``, the query's id), at every direct call
        and operation (``run`` None), and again after an epoch found no table there: not at
        every epoch, where Delta's ``DESCRIBE DETAIL`` costs a listing of the table. A table
        moved (``ALTER TABLE ... SET LOCATION``) is followed from then, with a WARNING: the
        catalog is the truth; the caches of the old folder's files (index, tombstones) go,
        and the new store is probed. A catalog that cannot answer keeps the location found
        before, with a WARNING, instead of stopping the query."""
        name = self._named or self.options.target
        if is_path(name) or (run is not None and run == self._located_for):
            return
        where = Where(self.name, name)
        try:
            location = locate(name, where, spark)
        except CatalogUnavailable as exc:
            if self._named is None:
                raise
            log.warning("%s: %s; writing %s, where the table was", where, exc, self.options.target)
            return
        self._located_for = run
        if self._named is not None and location == self.options.target:
            return
        if self._named is not None:
            log.warning(
                "%s: table %s moved from %s to %s: writing the new location",
                where,
                name,
                self.options.target,
                location,
            )
            self._index, self._tombstones, self._probed = PersistedIndex(), Tombstones(), False
        self._named = name
        self.options = SinkOptions.build(**{**self.options.model_dump(), "target": location})
        log.info("%s: table %s is at %s", where, name, location)

    def _locate_now(self) -> None:
        """``_locate`` outside an epoch: through the active Spark session."""
        self._locate(None)

    @property
    def store(self) -> Store:
        """The target's files, as the I/O layer reaches them."""
        return Store(table_root(self.target), dict(self.options.storage_options))

    @property
    def last_report(self) -> EpochReport | None:
        return self.reports[-1] if self.reports else None

    @property
    def read_only(self) -> bool:
        """True while the sink only computes and reports corrections (a standby replica)."""
        return self._read_only

    def promote(self) -> None:
        """Make this sink's ``writer`` the view's active writer, recorded in the target
        (``promote``), and start committing from the next epoch on. Every other writer of the
        view is fenced from then on. Needs the ``writer`` option (a name stable across
        restarts) and an existing table."""
        if self.options.writer is None:
            raise ConfigError(
                "promote() needs the 'writer' option: a name for this writer that stays the same "
                "across restarts",
                Where(self.name, self.target),
            )
        with self._lock:
            self._locate_now()
            promote(self.target, self.name, self.options.writer, self.options.storage_options)
            self._read_only = False

    def _with_errors_table(self, batch_df: DataFrame, epoch_id: int, where: Where) -> EpochReport:
        """Split the batch (``quarantine.py``): the rows that keep the rules to the view, then
        the error rows to the errors table. The view decides: the errors table is written only
        for an epoch the view committed or already holds (a replay: the errors table may have
        missed it in a crash), never for one the view refused (fenced, read-only, before
        ``as_of``), so it follows the view's lineage and active writer."""
        if self._errors is None:
            self._errors = Quarantine(MVSink.from_options(errors_options(self.options)))
        marked, ok, bad = self._errors.split(batch_df, self.options, where)
        try:
            view = _Epoch(self, ok, epoch_id)
            report = view.run()
            if view.entitled and report.outcome in ("committed", "unchanged", "replay", "between_refreshes"):
                try:
                    errors = self._errors.run(bad, epoch_id)
                except Exception as exc:
                    # Its message speaks for the errors table only: say what the view did.
                    done = (
                        f"the view committed this epoch as version {report.version}"
                        if report.outcome == "committed"
                        else f"the view needed no commit for this epoch ({report.outcome})"
                    )
                    exc.add_note(f"{done}; its errors table may be behind until the batch runs again")
                    raise
                if errors.outcome == "fenced":
                    log.warning(
                        "%s: the errors table %s is owned by another lineage or writer than the "
                        "view: its rows were not written",
                        where,
                        self._errors.sink.target,
                    )
            return report
        finally:
            release(marked)

    def _record_metrics(self, version: int, where: Where) -> None:
        """Append the view's committed epochs to the metrics table (``metrics.py``). The epoch
        is committed whatever happens here: a failure is a WARNING, and the next epoch's
        append fills the gap."""
        from mvsink.ops.metrics import record

        opts = self.options
        assert opts.metrics_table is not None
        try:
            record(opts.metrics_table, opts.name, opts.target, opts.storage_options, version)
        except Exception as exc:  # the epoch is committed: never fail it (or the query) now
            log.warning("%s: could not append to the metrics table (the epoch is committed): %s", where, exc)

    def _compact_due(self, report: EpochReport) -> bool:
        """``compact_every`` epochs passed since the last compaction, counted in frontiers:
        the table records the frontier each compaction ran at (``#compacted``)."""
        every = self.options.compact_every
        if not every or report.outcome != "committed" or report.upper is None:
            return False
        last = read_frontier(self.target, Keys(self.options.app_id).compacted, self.options.storage_options)
        # A new lineage restarts epoch numbers: a last mark above the frontier is another's.
        since = report.upper - (last if last is not None and last <= report.upper else 0)
        return since >= every

    def _compact(self, where: Where) -> None:
        """Merge small files after a committed epoch (``compact_every``). The epoch is
        committed whatever happens here: a failure is a WARNING, never the epoch's error."""
        from mvsink.ops.compact import compact

        opts = self.options
        try:
            done = compact(
                opts.target,
                opts.name,
                opts.storage_options,
                max_rows_per_file=opts.max_rows_per_file,
                cluster_by=opts.cluster_by,
                retry=opts.retry,
                engine=opts.engine,
            )
            log.info("%s: %s", where, done)
        except Exception as exc:  # the epoch is committed: never fail it (or the query) now
            log.warning("%s: compaction after the epoch failed (the epoch is committed): %s", where, exc)

    def frontier(self) -> int | None:
        """The target's frontier for this view (None before the first commit)."""
        self._locate_now()
        return read_frontier(self.target, self.options.app_id, self.options.storage_options)

    def __call__(self, batch_df: DataFrame, epoch_id: int) -> EpochReport:
        """Run one epoch: make the target equal ``batch_df`` and record ``epoch_id + 1``."""
        where = Where(self.name, self.target, epoch_id if isinstance(epoch_id, int) else None)
        if isinstance(epoch_id, bool) or not isinstance(epoch_id, int) or epoch_id < 0:
            raise InputError(f"the epoch must be a non-negative int, got {epoch_id!r}", where)
        with self._lock:
            named = bool(self.options.lineage or self.options.checkpoint)
            query = running_query(batch_df, named, where)
            self._locate(batch_df.sparkSession, query.run if query else None)
            if not self._probed:
                where = Where(self.name, self.target, epoch_id)
                self.store.probe(where)
                check_workers(batch_df.sparkSession, where)
                self._probed = True
            if self.options.checks or self.options.not_null:
                check_expressions(batch_df, self.options, where)
            if self.options.on_error == "table":
                report = self._with_errors_table(batch_df, epoch_id, where)
            else:
                report = _Epoch(self, batch_df, epoch_id).run()
            if self.options.metrics_table and report.outcome == "committed" and report.version is not None:
                self._record_metrics(report.version, where)
            if self._compact_due(report):
                self._compact(where)
        self.reports.append(report)
        log.info("%s", report)
        metrics.info("%s", json.dumps(report.to_json(), sort_keys=True))
        return report


class _Epoch:
    """One call of the sink: the retry loop around decide, plan, stage and commit."""

    def __init__(self, sink: MVSink, desired: DataFrame, epoch: int) -> None:
        self.sink = sink
        self.opts = sink.options
        self.epoch = epoch
        self.where = Where(self.opts.name, self.opts.target, epoch)
        self.started = time.monotonic()
        self.stored = stored_struct(desired.schema, self.opts.delete_column)
        query = running_query(desired, bool(self.opts.lineage or self.opts.checkpoint), self.where)
        check_output_mode(desired, self.opts.mode, query, self.where)
        self.lineage = sink._lineage(lineage_of(desired, query.id if query else None, self.opts, self.where))
        self.time = epoch_time(desired, epoch, self.opts, self.where)
        self.before = sink._clock_seen.get((self.lineage, epoch - 1))
        if self.time is not None and callable(self.opts.clock):
            seen = sink._clock_seen
            seen[(self.lineage, epoch)] = self.time
            for old in [k for k in seen if k[0] == self.lineage and k[1] < epoch - 1]:
                del seen[old]
        self.ctx = EpochContext(desired, self.opts, self.where, sink.store, budget=sink._budget)
        self.entitled = True
        """Whether the last attempt found this sink entitled to write the view (``Skip``)."""
        self.mode: Mode
        if self.opts.mode == "complete":
            self.mode = Complete(self.ctx, sink._index)
        elif self.opts.mode == "upsert":
            self.mode = Upsert(self.ctx, sink._tombstones)
        else:
            self.mode = Append(self.ctx)

    def run(self) -> EpochReport:
        raw = self.ctx.batch
        check_supported(raw.schema, self.where)
        check_roles(
            raw.schema,
            key=self.opts.key,
            delete_column=self.opts.delete_column,
            sequence_column=self.opts.sequence_column,
            partition_by=self.opts.partition_by or (),
            cluster_by=self.opts.cluster_by,
            where=self.where,
        )
        try:
            return self._attempts()
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

    def _attempts(self) -> EpochReport:
        opts, policy, ctx = self.opts, self.opts.retry, self.ctx
        for attempt in range(1, policy.max_attempts + 1):
            with ctx.phase("snapshot"):
                snap = load_snapshot(
                    opts.target,
                    opts.app_id,
                    opts.storage_options,
                    self.where,
                    engine=opts.engine,
                    spark=self.ctx.batch.sparkSession,
                )
            failpoints.hit("after_snapshot")
            if not snap.exists and self.sink._named:
                self.sink._located_for = None  # the next epoch looks the name up again
                raise ConfigError(
                    f"the table {self.sink._named} was at {opts.target} when this epoch looked it "
                    "up, and that folder holds no Delta table any more (dropped, or moved since?): "
                    "the next epoch looks the name up again",
                    self.where,
                )
            if not snap.exists and not self._only_ours_in_root():
                continue  # a table appeared since the snapshot: plan against it
            self._check_append_only(snap)
            layout = self._layout(snap)
            decision = decide(
                snap,
                self.epoch,
                opts,
                lineage=self.lineage,
                time=self.time,
                read_only=self.sink.read_only,
                batch_start=lambda: batch_start(self.epoch, opts, self.where, self.before),
                where=self.where,
                on_clock=self._watch_stall,
            )
            if isinstance(decision, Skip):
                self.entitled = decision.entitled
                plan = self.mode.plan(snap, layout) if decision.plans else None
                if plan is not None and plan.inserted is None and is_dataframe(plan.inserts):
                    # A standby reports what it would insert, also when tasks would write it.
                    rows = cast(DataFrame, plan.inserts)
                    with ctx.phase("count"):
                        plan = replace(plan, inserted=rows.count())
                    ctx.batch_ran = True
                ctx.drain()
                return self._report(decision.reason, snap.frontier, None, None, attempt, snap, plan=plan)
            desc = decision.desc
            plan = self.mode.plan(snap, layout)
            with ctx.phase("write"):
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
                )
                if is_dataframe(plan.inserts):
                    ctx.batch_ran = True  # Spark tasks wrote the whole batch
            failpoints.hit("after_staging")
            if not (staged.adds or staged.removes or decision.always):
                # Nothing to change and no heartbeat due: no version (decide.py).
                self._discard(staged, plan)
                ctx.drain()
                return self._report("unchanged", desc.lower, None, None, attempt, snap)
            try:
                ctx.drain()
                if self.sink._before_commit is not None:
                    self.sink._before_commit(snap)
                failpoints.hit("before_commit")
                self._check_staged(staged)
            except BaseException:
                self._discard(staged, plan)  # not committed: nothing can reference them (I4)
                raise
            try:
                with ctx.phase("commit"):
                    version = compare_and_append(
                        snap,
                        ctx.store,
                        adds=staged.adds,
                        removes=staged.removes,
                        changes=staged.changes,
                        updates=staged.updates,
                        app_id=opts.app_id,
                        upper=desc.upper,
                        attempt_id=uuid.uuid4().hex,
                        metadata=self._metadata(desc, staged, decision.lineage, attempt),
                        schema_json=layout.schema_json,
                        partition_by=layout.partition_by,
                        where=self.where,
                        transactions={
                            **self._transactions(desc, decision.lineage, decision.writers),
                            **(staged.side.transactions if staged.side is not None else {}),
                        },
                        _after_call=self.sink._after_commit_call,
                    )
            except ConflictError as exc:
                # Known not to have landed (I4): the staged files can go.
                self._discard(staged, plan)
                pause = policy.backoff(attempt, random.random())
                log.info(
                    "%s: attempt %d lost a commit race (%s); retrying in %.2fs",
                    self.where,
                    attempt,
                    exc.message,
                    pause,
                )
                if attempt < policy.max_attempts:
                    time.sleep(pause)
                continue
            except CommitOutcomeUnknownError:
                # The commit may have landed: its files may be referenced. Keep them (I4).
                raise
            failpoints.hit("after_commit")
            self.mode.committed(staged)
            return self._report("committed", desc.lower, desc.upper, version, attempt, snap, staged=staged)
        raise RetriesExhaustedError(
            f"lost the commit race {policy.max_attempts} times in a row; the epoch is not committed "
            "(Spark will retry the batch). If another writer commits this often, raise "
            "retry.max_attempts or make it commit less often.",
            self.where,
        )

    def _watch_stall(self, clock: Clocked) -> None:
        """Under a shared clock, an epoch behind or incomparable writes nothing; when that goes
        on while the committed time stands still, nobody advances the view (``clock.Stall``):
        a WARNING each epoch, and a note ``mvsink status`` shows."""
        stall, store = self.sink._stall, self.ctx.store
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
        if self.opts.mode != "append" and snap.configuration.get("delta.appendOnly", "").lower() == "true":
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

    def _discard(self, staged: Staged, plan: Plan) -> None:
        discard(staged, self.ctx.store, plan.index)

    def _transactions(self, desc: BatchDescription, lineage: Lineage, writers: Writers) -> dict[str, int]:
        """What a commit records besides the frontier: the epoch's time under a shared clock,
        else its lineage's standing; the active writer's promotion, again; and when it was
        made (``record.Keys.at``)."""
        at = {Keys(self.opts.app_id).at: now_ms()}
        if self.time is not None:
            clock = clock_transactions(
                self.opts.app_id, self.time, lineage.name, self.opts.writer, desc.upper
            )
            return {**clock, **writers.restamp(), **at}
        return {**lineage.transactions(desc.upper), **writers.restamp(), **at}

    def _layout(self, snap: Snapshot) -> Layout:
        """The target's schema and partition columns: the table's, or those it will get."""
        wanted = self.opts.partition_by
        if not snap.exists:
            schema_json = target_schema_json(self.stored)
            return Layout(schema_json, target_struct(schema_json), tuple(wanted or ()))
        assert snap.schema_json is not None
        check_fits(self.stored, snap.schema_json, self.where)
        if wanted is not None and tuple(wanted) != snap.partition_by:
            raise ConfigError(
                f"option 'partition_by' is {list(wanted)} but the target is partitioned by "
                f"{list(snap.partition_by)}; drop the option to keep the target's partitioning",
                self.where,
            )
        return Layout(snap.schema_json, target_struct(snap.schema_json), snap.partition_by)

    def _metadata(
        self, desc: BatchDescription, staged: Staged, lineage: Lineage, attempt: int
    ) -> dict[str, str]:
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
            whole=self.ctx.whole,
            time=self.time,
            takeover=(lineage.owner or 0) + 1 if desc.takeover else None,
        ).metadata()

    def _report(
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
            files_read=self.ctx.files_read,
            whole=self.ctx.whole and staged is not None,
            phases=dict(self.ctx.phases),
            attempts=attempts,
            seconds=time.monotonic() - self.started,
            snapshot_version=snap.version,
            clock_time=dict(self.time) if self.time is not None else None,
        )
