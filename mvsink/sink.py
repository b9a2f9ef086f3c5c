"""The sink: keeps a Delta table equal to a streaming query's result, epoch by epoch.

``MVSink`` is a ``foreachBatch`` callable. Each call runs one epoch through three steps:

    micro-batch (desired) ──┐
                            v
    snapshot ──> mint ──> write ──> append ──> Delta log
       ^         (desc)   (staged)    │
       └───── conflict: discard staged files, reload, retry ──┘

* mint (``mint.py``): from the latest snapshot (version ``v``, frontier ``lower``) decide the
  batch description ``(lower, epoch + 1)``, or nothing (replay, before ``as_of``, read-only).
* write (``plan.py``, ``write.py``): plan the rows to insert and the files to rewrite, and
  stage them as Parquet that nothing references yet. Complete mode fingerprints desired in one
  Spark job and diffs it against the index of the snapshot's files (``correction.py``,
  ``index.py``); upsert mode reads back only the touched keys (``upsert.py``); append mode
  inserts the batch.
* append (``delta.py``): commit removes, adds and the frontier in one Delta version, only if
  no commit at all landed since ``v``.

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

import contextlib
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from mvsink.config import SinkOptions
from mvsink.correction import Correction, Fingerprints, diff
from mvsink.delta import Snapshot, compare_and_append, load_snapshot, read_frontier
from mvsink.errors import (
    CommitOutcomeUnknownError,
    ConfigError,
    ConflictError,
    InputError,
    RetriesExhaustedError,
    Where,
)
from mvsink.fingerprint import FP_A, FP_B, fingerprint_columns, quote
from mvsink.index import PersistedIndex
from mvsink.mint import BatchDescription, mint
from mvsink.plan import Plan, plan_append, plan_complete
from mvsink.report import EpochReport
from mvsink.rules import RULE, Rules, check_rows, raise_broken, table_rules
from mvsink.schema import (
    check_fits,
    check_roles,
    check_supported,
    stored_struct,
    target_schema_json,
    target_struct,
)
from mvsink.upsert import UpsertSpec, plan_upsert, prepare, stored_rows
from mvsink.write import Staged, discard_folder, stage

log = logging.getLogger(__name__)


class MVSink:
    """Keep the Delta table at ``target`` equal to each micro-batch (``complete`` mode).

    Use as ``df.writeStream.foreachBatch(MVSink(target, name))``, or call it directly as
    ``sink(batch_df, epoch)`` from a batch job. Options are those of ``SinkOptions``.
    """

    def __init__(self, target: str, name: str, **options: Any) -> None:
        self.options = SinkOptions.build(target=target, name=name, **options)
        self._index = PersistedIndex()
        self._lock = threading.Lock()
        self._read_only = self.options.read_only
        self.reports: deque[EpochReport] = deque(maxlen=1000)
        # Called with the snapshot after staging and before committing (tests use it to land
        # a competing commit in exactly that window).
        self._before_commit: Callable[[Snapshot], None] | None = None
        # Called right after the commit call returns, inside its error handling (tests use it
        # to fail a commit that landed, as a post-commit step of delta-rs can).
        self._after_commit_call: Callable[[], None] | None = None

    @classmethod
    def from_options(cls, options: SinkOptions) -> MVSink:
        """A sink from an already validated ``SinkOptions`` (e.g. ``SinkOptions.from_toml``)."""
        return cls(**options.model_dump())

    @property
    def name(self) -> str:
        return self.options.name

    @property
    def target(self) -> str:
        return self.options.target

    @property
    def last_report(self) -> EpochReport | None:
        return self.reports[-1] if self.reports else None

    @property
    def read_only(self) -> bool:
        """True while the sink only computes and reports corrections (a standby replica)."""
        return self._read_only

    def promote(self) -> None:
        """Start committing from the next epoch on (a read-only standby taking over).

        Safe while another replica still writes: every commit is conditional on the frontier.
        """
        with self._lock:
            self._read_only = False

    def frontier(self) -> int | None:
        """The target's frontier for this view (None before the first commit)."""
        return read_frontier(self.target, self.options.app_id, self.options.storage_options)

    def __call__(self, batch_df: DataFrame, epoch_id: int) -> EpochReport:
        """Run one epoch: make the target equal ``batch_df`` and record ``epoch_id + 1``."""
        if isinstance(epoch_id, bool) or not isinstance(epoch_id, int) or epoch_id < 0:
            raise InputError(
                f"the epoch must be a non-negative int, got {epoch_id!r}",
                Where(self.name, self.target, None),
            )
        with self._lock:
            report = _Epoch(self, batch_df, epoch_id).run()
        self.reports.append(report)
        log.info("%s", report)
        return report


class _Epoch:
    """One call of the sink: the retry loop around mint, write and append."""

    def __init__(self, sink: MVSink, desired: DataFrame, epoch: int) -> None:
        self.sink = sink
        self.opts = sink.options
        self.raw = desired
        self.epoch = epoch
        self.where = Where(self.opts.name, self.opts.target, epoch)
        self.started = time.monotonic()
        self.spark = desired.sparkSession
        self.stored = stored_struct(desired.schema, self.opts.delete_column)
        self.desired: DataFrame | None = None
        self.ranked: DataFrame | None = None
        self.fingerprints: Fingerprints | None = None
        self.partitions_checked = False
        self.batch_ran = False
        """Whether a Spark job has run every partition of the micro-batch this epoch."""
        self.checked_rules: Rules | None = None
        """The target rules the batch's rows were last found to keep."""
        self.files_read = 0
        self.phases: dict[str, float] = {}

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        """Add the time spent in the block to the epoch's figures under ``name``."""
        start = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.monotonic() - start

    def run(self) -> EpochReport:
        check_supported(self.raw.schema, self.where)
        check_roles(
            self.raw.schema,
            key=self.opts.key,
            delete_column=self.opts.delete_column,
            sequence_column=self.opts.sequence_column,
            partition_by=self.opts.partition_by or (),
            where=self.where,
        )
        try:
            return self._attempts()
        finally:
            for cached in (self.desired, self.ranked):
                if cached is not None:
                    cached.unpersist()

    def _attempts(self) -> EpochReport:
        opts, policy = self.opts, self.opts.retry
        for attempt in range(1, policy.max_attempts + 1):
            with self._phase("snapshot"):
                snap = load_snapshot(opts.target, opts.app_id, opts.storage_options, self.where)
            schema_json, partition_by = self._layout(snap)
            desc = mint(
                self.epoch, snap.frontier, as_of=opts.as_of, read_only=self.sink.read_only, where=self.where
            )
            if desc in ("replay", "before_as_of"):
                self._drain()
                return self._report(desc, snap.frontier, None, None, attempt)
            self._warn_on_gap(desc)
            plan = self._plan(snap, schema_json, partition_by)
            if not isinstance(desc, BatchDescription):
                self._drain()  # append mode plans without running the batch
                return self._report(desc, snap.frontier, None, None, attempt, plan=plan)
            with self._phase("write"):
                staged = stage(
                    self.spark,
                    inserts=plan.inserts,
                    inserted=plan.inserted,
                    rewrites=plan.rewrites,
                    root=snap.root,
                    schema=target_struct(schema_json),
                    partition_by=partition_by,
                    view=opts.name,
                    epoch=self.epoch,
                    max_rows_per_file=opts.max_rows_per_file,
                    cluster_by=opts.cluster_by,
                    expected=plan.expected,
                    where=self.where,
                )
                self.batch_ran = True
            if self.sink._before_commit is not None:
                try:
                    self.sink._before_commit(snap)
                except BaseException:
                    discard_folder(staged.folder)
                    raise
            try:
                with self._phase("append"):
                    version = compare_and_append(
                        snap,
                        adds=staged.adds,
                        removes=staged.removes,
                        app_id=opts.app_id,
                        upper=desc.upper,
                        attempt_id=uuid.uuid4().hex,
                        metadata=self._metadata(desc, staged),
                        schema_json=schema_json,
                        partition_by=partition_by,
                        where=self.where,
                        _after_call=self.sink._after_commit_call,
                    )
            except ConflictError as exc:
                # Known not to have landed (I4): the staged files can go.
                discard_folder(staged.folder)
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
            if plan.expected is not None:
                # Keep the index equal to the new version's files (the snapshot's, less removes,
                # plus ours) so the next epoch reads nothing back.
                self.sink._index.forget(f.key for f in staged.removes)
                for add, entry in zip(staged.adds, staged.entries, strict=True):
                    self.sink._index.put(add.path.replace(os.sep, "/"), entry)
            return self._report("committed", desc.lower, desc.upper, version, attempt, staged=staged)
        raise RetriesExhaustedError(
            f"lost the commit race {policy.max_attempts} times in a row; the epoch is not committed "
            "(Spark will retry the batch). If another writer commits this often, raise "
            "retry.max_attempts or make it commit less often.",
            self.where,
        )

    def _warn_on_gap(self, desc: BatchDescription | str) -> None:
        """Only a complete batch repairs everything: in upsert or append mode, say so when
        epochs between the frontier and this one were never written by anyone."""
        if self.opts.mode == "complete" or not isinstance(desc, BatchDescription) or desc.lower is None:
            return
        if desc.upper > desc.lower + 1:
            log.warning(
                "%s: epochs %d..%d were never committed to the target; in %s mode their rows are "
                "not in it (was the table restored, or the checkpoint replaced?)",
                self.where,
                desc.lower,
                desc.upper - 2,
                self.opts.mode,
            )

    def _layout(self, snap: Snapshot) -> tuple[str, tuple[str, ...]]:
        """The target's schema JSON and partition columns: the table's, or those it will get."""
        wanted = self.opts.partition_by
        if not snap.exists:
            return target_schema_json(self.stored), tuple(wanted or ())
        assert snap.schema_json is not None
        check_fits(self.stored, snap.schema_json, self.where)
        if wanted is not None and tuple(wanted) != snap.partition_by:
            raise ConfigError(
                f"option 'partition_by' is {list(wanted)} but the target is partitioned by "
                f"{list(snap.partition_by)}; drop the option to keep the target's partitioning",
                self.where,
            )
        return snap.schema_json, snap.partition_by

    def _text_partitions(self, partition_by: tuple[str, ...]) -> list[str]:
        return [c for c in partition_by if isinstance(self.stored[c].dataType, StringType)]

    def _check_partition_values(self, rows: DataFrame, partition_by: tuple[str, ...]) -> None:
        """Refuse empty strings in partition columns: Spark and Delta store them as null.

        ``rows`` must be cached: a second partial run of a streaming batch's plan is not safe.
        """
        text = self._text_partitions(partition_by)
        if self.partitions_checked or not text:
            return
        empty = F.lit(False)
        for c in text:
            empty = empty | (F.col(quote(c)) == "")
        if rows.where(empty).limit(1).count():
            raise InputError(
                f"an empty string in partition column(s) {', '.join(text)}: Delta partitions store it "
                "as null, so the target could not equal desired; map it to null or another value",
                self.where,
            )
        self.partitions_checked = True

    def _plan(self, snap: Snapshot, schema_json: str, partition_by: tuple[str, ...]) -> Plan:
        schema = target_struct(schema_json)
        rules = table_rules(snap, self.where)
        mode = self.opts.mode
        if mode == "append":
            if not self._text_partitions(partition_by) and not rules:
                return plan_append(self.raw, schema)
            # Checked rows must be the rows written: one evaluation, cached.
            if self.desired is None:
                self.desired = self.raw.persist(StorageLevel.MEMORY_AND_DISK)
            self._check_partition_values(self.desired, partition_by)
            self._enforce(self.desired, rules)
            return plan_append(self.desired, schema)
        if mode == "upsert":
            spec = UpsertSpec(self.opts.key, self.opts.delete_column, self.opts.sequence_column)
            with self._phase("prepare"):
                if self.ranked is None:
                    self.ranked = prepare(self.raw, schema, spec, self.where)
                self._check_partition_values(self.ranked, partition_by)
                self._enforce(stored_rows(self.ranked, schema), rules)
            with self._phase("read back"):
                plan = plan_upsert(self.spark, self.ranked, schema=schema, spec=spec, snap=snap)
            self.batch_ran = True  # the touched keys were collected from the whole batch
            self.files_read += plan.files_read
            return plan
        corr = self._correction(snap, schema_json, rules)
        self._enforce(self._desired(schema_json).select(*[F.col(quote(c)) for c in schema.names]), rules)
        self._check_partition_values(self._desired(schema_json), partition_by)
        return plan_complete(self.spark, self._desired(schema_json), corr, snap, self.sink._index, schema)

    def _drain(self) -> None:
        """Run the micro-batch's plan without output, unless this epoch already ran it.

        A stateful streaming query commits its state only when every partition of the batch
        ran; Spark 4 fails a ``foreachBatch`` that skips them. Writing nothing is not enough.
        """
        if not self.batch_ran:
            self.raw.write.format("noop").mode("overwrite").save()
            self.batch_ran = True

    def _desired(self, schema_json: str) -> DataFrame:
        """Desired in the target's column order with its fingerprints, cached for this epoch."""
        if self.desired is None:
            schema = target_struct(schema_json)
            a, b = fingerprint_columns(schema)
            cols = [F.col(quote(n)) for n in schema.names]
            self.desired = self.raw.select(*cols, a, b)
            if self.opts.cache_desired:
                self.desired = self.desired.persist(StorageLevel.MEMORY_AND_DISK)
        return self.desired

    def _enforce(self, rows: DataFrame, rules: Rules) -> None:
        """Refuse rows that break the target's rules (``rules.py``), unless already checked."""
        if rules and rules != self.checked_rules:
            with self._phase("rules"):
                check_rows(rows, rules, self.where)
        self.checked_rules = rules

    def _correction(self, snap: Snapshot, schema_json: str, rules: Rules) -> Correction:
        with self._phase("index"):
            schema = target_struct(schema_json)
            self.files_read += self.sink._index.sync(self.spark, snap, schema, self.where)
        if self.fingerprints is None:
            # Desired does not change between attempts: fingerprint it once per epoch, checking
            # the target's rules in the same job.
            with self._phase("fingerprint"):
                desired = self._desired(schema_json)
                table = desired.select(FP_A, FP_B, rules.broken()).toArrow()
                self.fingerprints = Fingerprints(table.column(FP_A).to_numpy(), table.column(FP_B).to_numpy())
                self.batch_ran = True
                broken = table.column(RULE).drop_null()
                if len(broken):
                    raise_broken(
                        desired.select(*[F.col(quote(c)) for c in schema.names]),
                        rules,
                        broken[0].as_py(),
                        self.where,
                    )
                self.checked_rules = rules
        with self._phase("diff"):
            return diff(self.fingerprints, self.sink._index.persisted(snap.files))

    def _metadata(self, desc: BatchDescription, staged: Staged) -> dict[str, str]:
        return {
            "mvsink.view": self.opts.name,
            "mvsink.epoch": str(self.epoch),
            "mvsink.lower": "" if desc.lower is None else str(desc.lower),
            "mvsink.upper": str(desc.upper),
            "mvsink.writer": self.opts.writer or f"{socket.gethostname()}:{os.getpid()}",
            "mvsink.inserted": str(staged.inserted),
            "mvsink.retracted": str(staged.retracted),
            "mvsink.files_added": str(len(staged.adds)),
            "mvsink.files_removed": str(len(staged.removes)),
        }

    def _report(
        self,
        outcome: Any,
        lower: int | None,
        upper: int | None,
        version: int | None,
        attempts: int,
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
            files_added=len(staged.adds) if staged else 0,
            files_removed=len(staged.removes) if staged else 0,
            bytes_written=staged.bytes_written if staged else 0,
            files_read=self.files_read,
            phases=dict(self.phases),
            attempts=attempts,
            seconds=time.monotonic() - self.started,
        )


def frontier(target: str, name: str, storage_options: dict[str, str] | None = None) -> int | None:
    """The frontier (upper) of view ``name`` in the Delta table at ``target``, or None."""
    return read_frontier(target, f"mvsink:{name}", storage_options or {})
