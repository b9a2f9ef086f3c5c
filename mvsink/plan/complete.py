"""Complete mode: each micro-batch is the whole view; the target is made equal to it.

The batch is cached for the epoch, whatever the attempts, and desired fingerprinted by Spark
over it (``fingerprint.spark_lanes``). Two placements compute the same correction from it
(``placement`` option):

* On the driver: one Spark job brings desired's fingerprints (16 bytes a row) to the driver,
  checking the target's rules in the same pass. Per attempt, the index (``index.py``) is
  brought level with the snapshot and the numpy diff (``correction.py``) says which
  rows to insert and which stored rows (file, position) to retract. A second job brings only
  the rows to insert, by their row numbers in the cache (``_numbered``), checked against the
  fingerprints the diff saw; past ``DRIVER_INSERT_ROWS``, the driver's result limit, or when
  that check fails (the cache was recomputed in another order), Spark tasks write them,
  found by fingerprint. Neither collect is bounded before it runs (desired's size, the rows'
  width): each falls back when Spark refuses it (``ResultLimit``), the first to the
  distributed placement, the second to Spark tasks writing the inserts.
  Each file holding a retracted row is read through the I/O layer and its kept rows (with
  their fingerprints: its entry less the dropped positions) are written back.
* Distributed (``distributed.py``): the same steps as Spark jobs and tasks, for views whose
  fingerprints do not fit the driver.

Never worse than a rewrite: when the correction would read and write more bytes than writing
desired whole (a scattered change touching most files, a reprocessed view), the attempt
replaces every file with desired, written by Spark tasks from the cache (``Plan`` of the
whole), and the epoch's report says so (``whole``). Not on a table with Change Data Feed,
whose commits must carry exactly the correction.

A first epoch on an empty target is an initial load, possibly large: desired is written by
Spark tasks and never collected, whatever the placement; the tasks store each file's index
entry from the fingerprints Spark computed.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from mvsink.compat import from_arrow, release
from mvsink.plan.context import EpochContext, long_row_bytes
from mvsink.plan.correction import Correction, diff
from mvsink.plan.distributed import SparkCorrection, correction, with_fingerprints
from mvsink.plan.rules import RULE, Rules, checked, raise_broken, rules_for
from mvsink.table.delta import Snapshot
from mvsink.table.fingerprint import FP_A, FP_B, I64, Fingerprints, quote, spark_lanes
from mvsink.table.index import PersistedIndex, StoredIndex
from mvsink.table.write import Layout, Plan, Rewrite, Staged, raise_task_errors

log = logging.getLogger(__name__)
_ROW = "__mvsink_row"
_N = "__mvsink_n"
_RANK = "__mvsink_rank"
BROADCAST_ROWS = 1_000_000
"""Up to this many fingerprints to insert are broadcast to the join that finds their rows, if
the driver's result limit lets them (``ResultLimit.small_side``)."""

DRIVER_INSERT_ROWS = 200_000
"""Up to this many rows to insert (and their row numbers, broadcast, if the driver's result
limit lets them) are brought to the driver and written there; more are written by Spark tasks
(never collected)."""
WHOLE_MIN_BYTES = 64 << 20
"""Desired is written whole only when that is at least this big (estimated from the table's
bytes per row): below it, one Spark write job costs more than the driver's small rewrites."""


class Complete:
    """Plans complete-mode attempts of one epoch, keeping the sink's index current."""

    def __init__(self, ctx: EpochContext, index: PersistedIndex) -> None:
        self.ctx = ctx
        self.index = index
        self.stored: StoredIndex | None = None
        # The batch, cached for the epoch (by us, unless the caller had), and desired with its
        # fingerprints over it (for the layout it was hashed with): both placements read it.
        self.cached: DataFrame | None = None
        self.ours = False
        self.hashed: tuple[Layout, DataFrame] | None = None
        # The driver path: desired's fingerprints and row numbers (``_numbered``), collected
        # once per epoch.
        self.fps: Fingerprints | None = None
        self.numbers: I64 = np.zeros(0, dtype=np.int64)
        # The frames cached by the current attempt (distributed path).
        self.attempt: list[SparkCorrection | DataFrame] = []

    def plan(self, snap: Snapshot, layout: Layout) -> Plan:
        ctx = self.ctx
        self._release_attempt()
        ctx.whole = False
        rules = rules_for(snap, ctx.opts, ctx.where)
        self.stored = StoredIndex.of(ctx.store, ctx.opts.name, layout.arrow)
        if not snap.files and self.hashed is None:
            return self._initial_load(layout, rules)
        self.index.sweep_once(self.stored, snap, ctx.where)
        if ctx.placement(snap) == "distributed" or not self._collect(layout, rules):
            return self._plan_distributed(snap, layout, rules)
        assert self.fps is not None
        with ctx.phase("index"):
            ctx.files_read += self.index.sync(self.stored, snap, layout.arrow, ctx.where)
        with ctx.phase("diff"):
            corr = diff(self.fps, self.index.persisted(snap.files))
            drops = corr.retracted_positions()
        if self._whole_is_cheaper(snap, corr, drops):
            return self._whole(snap, corr, drops, rules)
        rewrites = self._rewrites(snap, drops)
        if not corr.inserted:
            return Plan(None, 0, rewrites, index=self.stored)
        fetched = self._fetch(corr)
        if fetched is None:
            log.info("%s: %d rows to insert: written by Spark tasks", ctx.where, corr.inserted)
            return Plan(self._inserts(corr), corr.inserted, rewrites, index=self.stored)
        rows, a, b = fetched
        return Plan(rows, rows.num_rows, rewrites, insert_fps=(a, b), index=self.stored)

    def _batch(self) -> DataFrame:
        """The batch, cached: its rows are evaluated once per epoch, whatever reads them. A
        batch the caller cached is used as it is (and left cached)."""
        if self.cached is None:
            batch = self.ctx.batch
            level = batch.storageLevel
            self.ours = not (level.useMemory or level.useDisk)
            self.cached = batch.persist(StorageLevel.MEMORY_AND_DISK) if self.ours else batch
        return self.cached

    def _hashed(self, layout: Layout) -> DataFrame:
        """Desired with its fingerprints, computed by Spark over the cached batch (hashing is
        cheaper than caching the hashes, and a scan of the cache costs little)."""
        if self.hashed is None or self.hashed[0] != layout:
            if self.hashed is not None:  # the table's layout changed between attempts
                self.fps = None
            self.hashed = (layout, with_fingerprints(self._batch(), layout))
            self.ctx.checked_rules = None
        return self.hashed[1]

    def _initial_load(self, layout: Layout, rules: Rules) -> Plan:
        """Desired written by Spark tasks as it is, never collected."""
        ctx = self.ctx
        # With rules, the rows checked must be the rows written: one evaluation, cached.
        desired = with_fingerprints(self._batch() if rules else ctx.batch, layout)
        ctx.enforce(desired.select(*[F.col(quote(c)) for c in layout.struct.names]), rules)
        # ... and the write tasks check each row they write again: a cache block lost since is
        # computed again, which for a nondeterministic query gives other rows.
        return Plan(checked(desired, rules), None, index=self.stored)

    def _plan_distributed(self, snap: Snapshot, layout: Layout, rules: Rules) -> Plan:
        ctx = self.ctx
        assert self.stored is not None
        desired = self._hashed(layout)
        ctx.enforce(desired.select(*[F.col(quote(c)) for c in layout.struct.names]), rules)
        spark = ctx.batch.sparkSession
        try:
            with ctx.phase("diff"):
                corr = correction(
                    spark, desired, snap, self.stored, layout, ctx.opts.max_rows_per_file, ctx.limit
                )
                self.attempt.append(corr)
        except Exception as exc:
            raise_task_errors(exc, ctx.where)
            raise
        ctx.batch_ran = True  # the diff ran every partition of desired
        return Plan(
            checked(corr.inserts, rules) if corr.inserted else None,
            corr.inserted,
            corr.rewrites if corr.retracted else (),
            index=self.stored,
        )

    def _release_attempt(self) -> None:
        for held in self.attempt:
            if isinstance(held, SparkCorrection):
                held.close()
            else:  # a DataFrame, classic or Connect
                release(held)
        self.attempt = []

    def _numbered(self, layout: Layout) -> DataFrame:
        """The cached batch's table columns with each row's number (``_ROW``): the same row
        gets the same number in every job over the cache (its partition and place there)."""
        cols = [F.col(quote(c)) for c in layout.struct.names]
        return self._batch().select(*cols, F.monotonically_increasing_id().alias(_ROW))

    def _collect(self, layout: Layout, rules: Rules) -> bool:
        """Bring desired's fingerprints and row numbers (and the rule each row breaks, if any)
        to the driver, once; False if they are too big to (``EpochContext.collect``)."""
        ctx = self.ctx
        self._hashed(layout)
        if self.fps is not None and rules == ctx.checked_rules:
            return True
        with ctx.phase("collect"):
            numbered = self._numbered(layout)
            table = ctx.collect(numbered.select(_ROW, *spark_lanes(layout.struct), rules.broken()))
            if table is None:
                return False
            ctx.batch_ran = True
        broken = table.column(RULE).drop_null()
        if len(broken):
            cols = [F.col(quote(c)) for c in layout.struct.names]
            raise_broken(ctx.batch.select(*cols), rules, broken[0].as_py(), ctx.where)
        ctx.checked_rules = rules
        if self.fps is None:
            self.fps = Fingerprints(_lane(table, FP_A), _lane(table, FP_B))
            self.numbers = _lane(table, _ROW)
        return True

    def _fetch(self, corr: Correction) -> tuple[pa.Table, I64, I64] | None:
        """The desired rows ``corr`` inserts (``insert_rows``), with their fingerprints, on the
        driver: fetched from the cache by row number (at most ``DRIVER_INSERT_ROWS``, their
        numbers broadcast), hashed again by Spark and checked against the fingerprints the
        diff saw. None if there are more, or Spark will not let the driver collect them."""
        ctx = self.ctx
        assert self.hashed is not None and self.fps is not None
        layout, hashed = self.hashed
        # The numbers' broadcast is bounded before it runs; the rows' collect is not (their
        # width is not known): it falls back when Spark refuses it.
        if corr.inserted > DRIVER_INSERT_ROWS or not ctx.limit.fits(corr.inserted, long_row_bytes(1)):
            return None
        take = corr.insert_rows
        want_a, want_b = self.fps.a[take], self.fps.b[take]
        if corr.inserts_all_desired:
            wanted = hashed
        else:
            numbers = self.numbers[take]
            keys = from_arrow(ctx.batch.sparkSession, pa.table({_ROW: numbers}), f"{_ROW} long")
            fetched = self._numbered(layout).join(F.broadcast(keys), _ROW, "left_semi")
            wanted = fetched.select(*layout.struct.names, *spark_lanes(layout.struct), _ROW)
        with ctx.phase("collect"):
            table = ctx.limit.collect(wanted)
        if table is None:
            log.warning(
                "%s: the rows to insert are more than the driver may collect: Spark tasks write them",
                ctx.where,
            )
            return None
        a, b = _lane(table, FP_A), _lane(table, FP_B)
        if corr.inserts_all_desired:
            same = _same_multiset((a, b), (want_a, want_b))
        else:
            order = np.argsort(_lane(table, _ROW), kind="stable")
            a, b, table = a[order], b[order], table.take(pa.array(order))
            expected = np.argsort(self.numbers[take], kind="stable")
            same = np.array_equal(_lane(table, _ROW), self.numbers[take][expected])
            same = same and np.array_equal(a, want_a[expected]) and np.array_equal(b, want_b[expected])
        if not same:
            # The cache was computed again (a lost executor, an evicted block) and its rows came
            # in another order: row numbers no longer name them. Rows are found by content.
            log.warning(
                "%s: the cached batch was recomputed since its fingerprints were read: the rows to "
                "insert are found by fingerprint and written by Spark tasks",
                ctx.where,
            )
            return None
        rows = table.select(layout.struct.names).cast(layout.arrow)
        return rows, a, b

    def _inserts(self, corr: Correction) -> DataFrame:
        """The rows ``corr`` inserts, with their fingerprints, as a DataFrame for Spark tasks to
        write (never collected), found by content: of each fingerprint to insert, as many
        desired copies as it inserts (equal rows: which copies does not matter), in about a
        file's worth of rows per task. Staging counts the rows written against
        ``corr.inserted``, so a desired that changed since the diff fails the attempt."""
        assert self.hashed is not None
        layout, hashed = self.hashed
        tasks = max(1, -(-corr.inserted // self.ctx.opts.max_rows_per_file))
        if corr.inserts_all_desired:
            return hashed.repartition(tasks)
        keys = pa.table(
            {
                FP_A: np.concatenate([corr.whole_a, corr.part_a]),
                FP_B: np.concatenate([corr.whole_b, corr.part_b]),
                _N: np.concatenate([corr.whole_n, corr.part_n]),
            }
        )
        keys_df = from_arrow(self.ctx.batch.sparkSession, keys, f"{FP_A} long, {FP_B} long, {_N} long")
        keys_df = self.ctx.limit.small_side(keys_df, keys.num_rows, long_row_bytes(3), most=BROADCAST_ROWS)
        rows = hashed.join(keys_df, [FP_A, FP_B])
        if len(corr.part_n):  # some fingerprints insert fewer copies than desired holds
            copies = Window.partitionBy(FP_A, FP_B).orderBy(FP_A)
            rows = rows.withColumn(_RANK, F.row_number().over(copies)).where(F.col(_RANK) <= F.col(_N))
        return rows.select(*layout.struct.names, FP_A, FP_B).repartition(tasks)

    def _whole_is_cheaper(self, snap: Snapshot, corr: Correction, drops: dict[int, I64]) -> bool:
        """Whether writing desired whole moves fewer bytes than the correction: reading each
        file that keeps some rows and writing those back (unless a deletion vector drops them),
        plus the inserts. Sizes in bytes, rows converted at the table's bytes per row."""
        if snap.change_feed or not snap.files or corr.is_empty:
            return False
        held = [len(self.index.entry(f.identity)) for f in snap.files]
        per_row = sum(f.size for f in snap.files) / max(1, sum(held))
        whole = corr.desired_rows * per_row
        if whole < WHOLE_MIN_BYTES:
            return False
        partial = [k for k, d in drops.items() if len(d) < held[k]]
        if snap.deletion_vectors:
            # A vector drops the rows; nothing is read or written back: the correction never
            # moves more than desired, so the whole is never chosen.
            partial = []
        read = sum(snap.files[k].size for k in partial)
        kept = sum(held[k] - len(drops[k]) for k in partial)
        return read + (kept + corr.inserted) * per_row > whole

    def _whole(self, snap: Snapshot, corr: Correction, drops: dict[int, I64], rules: Rules) -> Plan:
        """Every file replaced by desired, written by Spark tasks from the cache. The rules were
        checked on the cache's rows when their fingerprints were collected; the tasks check
        the rows they write again (``rules.checked``): a recomputed cache block may differ."""
        ctx = self.ctx
        assert self.hashed is not None
        ctx.whole = True
        log.info(
            "%s: writing desired whole (%d rows): cheaper than correcting %d of %d files",
            ctx.where,
            corr.desired_rows,
            len(drops),
            len(snap.files),
        )
        held = [len(self.index.entry(f.identity)) for f in snap.files]
        everything = {k: np.arange(n, dtype=np.int64) for k, n in enumerate(held)}
        tasks = max(1, -(-corr.desired_rows // ctx.opts.max_rows_per_file))
        desired = checked(self.hashed[1], rules).repartition(tasks)  # about a file's worth of rows per task
        return Plan(desired, corr.desired_rows, self._rewrites(snap, everything), index=self.stored)

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
        self.hashed = None
        self.fps = None
        if self.cached is not None and self.ours:
            release(self.cached)
        self.cached = None


def _same_multiset(one: tuple[I64, I64], other: tuple[I64, I64]) -> bool:
    """Whether two lists of fingerprints hold the same fingerprints as often."""
    if len(one[0]) != len(other[0]):
        return False
    x, y = np.lexsort((one[1], one[0])), np.lexsort((other[1], other[0]))
    return bool(np.array_equal(one[0][x], other[0][y]) and np.array_equal(one[1][x], other[1][y]))


def _lane(table: pa.Table, name: str) -> I64:
    return np.asarray(table.column(name).to_numpy(), dtype=np.int64)
