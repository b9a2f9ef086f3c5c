"""Complete mode: each micro-batch is the whole view; the target is made equal to it.

Two placements compute the same correction (``placement`` option):

* On the driver, per epoch: one Spark job brings desired to the driver as Arrow (checking the
  target's rules in the same pass); it is fingerprinted there (``fingerprint.py``) once,
  whatever the attempts. Per attempt, the index (``index.py``) is brought level with the
  snapshot and the numpy diff (``correction.py``) says which desired rows to insert and which
  stored rows (file, position) to retract. Inserted rows are taken from the Arrow in hand;
  each file holding a retracted row is read through the I/O layer and its kept rows (and
  their fingerprints, its entry less the dropped positions) are written back.
* Distributed (``distributed.py``): the same steps as Spark jobs and tasks, for views whose
  fingerprints do not fit the driver.

A first epoch on an empty target is an initial load, possibly large: desired is written by
Spark tasks and never collected, whatever the placement; the tasks store each file's index
entry.
"""

from __future__ import annotations

import logging

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from mvsink.context import EpochContext
from mvsink.correction import I64, Fingerprints, diff
from mvsink.delta import Snapshot
from mvsink.distributed import SparkCorrection, correction, persisted_rows, with_fingerprints
from mvsink.fingerprint import fingerprints, quote
from mvsink.index import PersistedIndex, StoredIndex
from mvsink.rules import RULE, Rules, raise_broken, rules_for
from mvsink.write import Layout, Plan, Rewrite, Staged, raise_task_errors

log = logging.getLogger(__name__)


class Complete:
    """Plans complete-mode attempts of one epoch, keeping the sink's index current."""

    def __init__(self, ctx: EpochContext, index: PersistedIndex) -> None:
        self.ctx = ctx
        self.index = index
        self.stored: StoredIndex | None = None
        # The driver path: desired, collected once per epoch, and its fingerprints.
        self.rows: pa.Table | None = None
        self.fps: Fingerprints | None = None
        self.cached: DataFrame | None = None
        # The distributed path: desired with its fingerprints (cached for the epoch, for the
        # layout it was hashed with), and the frames cached by the current attempt.
        self.hashed: tuple[Layout, DataFrame] | None = None
        self.attempt: list[SparkCorrection | DataFrame] = []

    def plan(self, snap: Snapshot, layout: Layout) -> Plan:
        ctx = self.ctx
        self._release_attempt()
        rules = rules_for(snap, ctx.opts, ctx.where)
        self.stored = StoredIndex.of(ctx.store, ctx.opts.name, layout.arrow)
        if not snap.files and self.rows is None and self.hashed is None:
            return self._initial_load(layout, rules)
        self.index.sweep_once(self.stored, snap, ctx.where)
        if ctx.placement(snap) == "distributed" or not self._collect(layout, rules):
            return self._plan_distributed(snap, layout, rules)
        assert self.rows is not None and self.fps is not None
        with ctx.phase("index"):
            ctx.files_read += self.index.sync(self.stored, snap, layout.arrow, ctx.where)
        with ctx.phase("diff"):
            corr = diff(self.fps, self.index.persisted(snap.files))
        rewrites = self._rewrites(snap, corr.retracted_positions())
        rows = corr.insert_rows
        inserts = self.rows.take(pa.array(rows)) if len(rows) else None
        return Plan(
            inserts,
            len(rows),
            rewrites,
            insert_fps=(self.fps.a[rows], self.fps.b[rows]),
            index=self.stored,
        )

    def _initial_load(self, layout: Layout, rules: Rules) -> Plan:
        """Desired written by Spark tasks as it is, never collected."""
        ctx = self.ctx
        desired = ctx.batch.select(*[F.col(quote(c)) for c in layout.struct.names])
        if rules:  # the rows checked must be the rows written: one evaluation, cached
            if self.cached is None:
                self.cached = desired.persist(StorageLevel.MEMORY_AND_DISK)
            desired = self.cached
        ctx.enforce(desired, rules)
        return Plan(desired, None, index=self.stored)

    def _plan_distributed(self, snap: Snapshot, layout: Layout, rules: Rules) -> Plan:
        ctx = self.ctx
        assert self.stored is not None
        if self.hashed is None or self.hashed[0] != layout:
            if self.hashed is not None:
                self.hashed[1].unpersist()
            hashed = with_fingerprints(ctx.batch, layout)
            self.hashed = (layout, hashed.persist(StorageLevel.MEMORY_AND_DISK))
            ctx.checked_rules = None
        desired = self.hashed[1]
        ctx.enforce(desired.select(*[F.col(quote(c)) for c in layout.struct.names]), rules)
        spark = ctx.batch.sparkSession
        try:
            # Not cached: tasks read the stored entries again for the retractions, which costs
            # less than caching every row (the files are immutable, so both reads agree).
            persisted = persisted_rows(spark, snap, self.stored, layout)
            with ctx.phase("diff"):
                corr = correction(spark, desired, persisted, snap, layout, ctx.opts.max_rows_per_file)
                self.attempt.append(corr)
        except Exception as exc:
            raise_task_errors(exc, ctx.where)
            raise
        ctx.batch_ran = True  # the diff ran every partition of desired
        return Plan(
            corr.inserts if corr.inserted else None,
            corr.inserted,
            corr.rewrites if corr.retracted else (),
            index=self.stored,
        )

    def _release_attempt(self) -> None:
        for held in self.attempt:
            if isinstance(held, SparkCorrection):
                held.close()
            else:  # a DataFrame, classic or Connect
                held.unpersist()
        self.attempt = []

    def _collect(self, layout: Layout, rules: Rules) -> bool:
        """Bring desired (and the rule each row breaks, if any) to the driver, once; False if
        it is too big to (``EpochContext.collect``)."""
        if self.rows is not None and rules == self.ctx.checked_rules:
            return True
        ctx = self.ctx
        cols = [F.col(quote(c)) for c in layout.struct.names]
        with ctx.phase("collect"):
            table = ctx.collect(ctx.batch.select(*cols, rules.broken()))
            if table is None:
                return False
            ctx.batch_ran = True
        broken = table.column(RULE).drop_null()
        if len(broken):
            raise_broken(ctx.batch.select(*cols), rules, broken[0].as_py(), ctx.where)
        ctx.checked_rules = rules
        if self.rows is None:
            with ctx.phase("fingerprint"):
                self.rows = table.drop_columns([RULE]).cast(layout.arrow)
                a, b = fingerprints(self.rows)
                self.fps = Fingerprints(a, b)
        return True

    def _rewrites(self, snap: Snapshot, drops: dict[int, I64]) -> tuple[Rewrite, ...]:
        """Files holding retracted rows, with their index entries; staging reads them."""
        out = []
        for k in sorted(drops):
            entry = self.index.entry(snap.files[k].identity)
            out.append(Rewrite(snap.files[k], None, drops[k], (entry.a, entry.b)))
        self.ctx.files_read += sum(1 for r in out if len(r.drop) < (r.size or 0))
        return tuple(out)

    def committed(self, staged: Staged) -> None:
        """Keep the index equal to the new version's files (the snapshot's, less removes, plus
        ours) so the next epoch reads nothing back."""
        self.index.forget([f.identity for f in staged.removes])
        for path, entry in staged.entries.items():
            self.index.put(path, entry)
        if self.stored is not None:  # the stored entries of files that left (off the epoch's path)
            kept = {f.key for f in staged.updates}  # a new vector leaves the file's entry as it is
            self.stored.forget([f.key for f in staged.removes if f.key not in kept], wait=False)

    def close(self) -> None:
        self._release_attempt()
        if self.hashed is not None:
            self.hashed[1].unpersist()
            self.hashed = None
        self.rows = None
        if self.cached is not None:
            self.cached.unpersist()
            self.cached = None
