"""Complete mode: each micro-batch is the whole view; the target is made equal to it.

The batch is cached for the epoch, whatever the attempts, with desired's fingerprints computed
by Spark (``fingerprint.spark_lanes``) in the same pass, so no later scan hashes it again. Two
placements compute the same correction from it (``placement`` option):

* On the driver: one Spark job brings desired's fingerprints (16 bytes a row) to the driver,
  checking the target's rules in the same pass. Per attempt, the index (``index.py``) is
  brought level with the snapshot and the numpy diff (``correction.py``) says which
  rows to insert and which stored rows (file, position) to retract. A second job brings only
  the rows to insert, found in the cache by their fingerprints (equal fingerprints, equal
  rows: any copies will do), never more rows than the diff inserts; past
  ``DRIVER_INSERT_ROWS``, the driver's result limit, or when the cache no longer holds
  them (it was recomputed, and a nondeterministic query gave other rows), Spark tasks write
  them. Neither collect is bounded before it runs (desired's size, the rows' width): each
  falls back when Spark refuses it (``ResultLimit``), the first to the distributed
  placement, the second to Spark tasks writing the inserts.
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
from dataclasses import replace

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from mvsink.compat import KEEP, cached, from_arrow, release
from mvsink.plan.context import EpochContext, give_back_memory, long_row_bytes
from mvsink.plan.correction import Correction, diff
from mvsink.plan.distributed import SparkCorrection, correction, with_fingerprints
from mvsink.plan.rules import RULE, Rules, checked, raise_broken, rules_for
from mvsink.table.delta import Snapshot, keeps_files_across_schema_change
from mvsink.table.fingerprint import FP_A, FP_B, I64, Fingerprints, quote, spark_lanes
from mvsink.table.index import DriverIndex, StoredIndex
from mvsink.table.layout import Layout
from mvsink.table.plan import Plan, Rewrite, Staged
from mvsink.table.tasks import raise_task_errors

log = logging.getLogger(__name__)
_N = "__mvsink_n"
_RANK = "__mvsink_rank"
BROADCAST_ROWS = 1_000_000
"""Up to this many fingerprints to insert are broadcast to the join that finds their rows, if
the driver's result limit lets them (``ResultLimit.small_side``)."""

DRIVER_INSERT_ROWS = 200_000
"""Up to this many rows to insert (found by their fingerprints, broadcast, if the driver's
result limit lets them) are brought to the driver and written there; more are written by Spark tasks
(never collected)."""
WHOLE_MIN_BYTES = 64 << 20
"""Desired is written whole only when that is at least this big (estimated from the table's
bytes per row): below it, one Spark write job costs more than the driver's small rewrites."""


class Complete:
    """Plans complete-mode attempts of one epoch, keeping the sink's index current."""

    def __init__(self, ctx: EpochContext, index: DriverIndex) -> None:
        self.ctx = ctx
        self.index = index
        self.stored: StoredIndex | None = None
        # The batch, cached for the epoch (by us, unless the caller had), and desired with its
        # fingerprints over it (for the layout it was hashed with): both placements read it.
        self.cached: DataFrame | None = None
        self.ours = False
        self.hashed: tuple[Layout, DataFrame] | None = None
        self.lanes_cached = False
        """Whether ``hashed`` reads desired's fingerprints from the cache (ours, for the layout
        it was first hashed for) rather than computing them at each scan."""
        # The driver path: desired's fingerprints, collected once per epoch.
        self.fps: Fingerprints | None = None
        # The frames cached by the current attempt (distributed path).
        self.attempt: list[SparkCorrection | DataFrame] = []
        # Whether a driver diff's correction committed: the index packs the new version's
        # entries at close, once desired's fingerprints are gone (``DriverIndex.pack``).
        self.repack = False

    def plan(self, snap: Snapshot, layout: Layout) -> Plan:
        ctx = self.ctx
        self._release_attempt()
        rules = rules_for(snap, ctx.opts, ctx.where)
        self.stored = StoredIndex.of(ctx.store, ctx.opts.name, layout.arrow)
        if not snap.files and self.hashed is None:
            return self._initial_load(layout, rules)
        if layout.replaces is not None and (
            layout.rewrites_every_file or not keeps_files_across_schema_change(snap)
        ):
            return self._reshape(snap, layout, rules)
        if layout.replaces is None:
            # Not before a schema change lands: the index of the table's current layout, which
            # its other writers read, is not this epoch's to sweep.
            self.index.sweep_once(self.stored, snap, ctx.where)
        if ctx.placement(snap) == "distributed":
            return self._plan_distributed(snap, layout, rules)
        with ctx.phase("index", f"{len(snap.files):,} data file(s)"):
            # Before desired's fingerprints come: a restarted sink reads and packs every entry
            # while the driver holds nothing else of the view, so its peak is a steady
            # epoch's (measured at 10M rows: 64.7 bytes a view row when it came after them).
            synced = self.index.sync(self.stored, snap, layout.arrow, ctx.where)
            self.index.persisted(snap.files)
            give_back_memory()  # entries read into Arrow are packed into numpy now
        if not self._collect(layout, rules):
            self.index.clear()  # a view too big for the driver: the index is not held for it
            plan = self._plan_distributed(snap, layout, rules)
        else:
            plan = self._plan_on_driver(snap, rules)
        return replace(plan, files_read=plan.files_read + synced)

    def _plan_on_driver(self, snap: Snapshot, rules: Rules) -> Plan:
        """The correction of the index's entries (level with ``snap``) to desired's collected
        fingerprints, by the numpy diff; the rows to insert fetched, or written by tasks. The
        fingerprints' collect ran the batch (in this attempt or an earlier one)."""
        ctx = self.ctx
        assert self.fps is not None
        persisted = self.index.persisted(snap.files)  # packed above: views, nothing copied
        with ctx.phase("diff"):
            corr = diff(self.fps, persisted)
            del persisted
            give_back_memory()  # the diff's working arrays
            drops = corr.retracted_positions()
        if self._replacing_is_cheaper(snap, corr, drops):
            return self._replace_all(snap, corr, drops, rules)
        rewrites = self._rewrites(snap, drops)
        plan = Plan(None, 0, rewrites, index=self.stored, files_read=_kept_files(rewrites), ran_batch=True)
        if not corr.inserted:
            return plan
        fetched = self._fetch(corr)
        if fetched is None:
            log.info("%s: %d rows to insert: written by Spark tasks", ctx.where, corr.inserted)
            return replace(plan, inserts=self._inserts(corr), inserted=corr.inserted)
        rows, a, b = fetched
        return replace(plan, inserts=rows, inserted=rows.num_rows, insert_fps=(a, b))

    def _hashed(self, layout: Layout) -> DataFrame:
        """Desired with its fingerprints for ``layout``, its rows evaluated once per epoch
        whatever reads them: the batch is cached with the fingerprints of the first layout it
        is hashed for, so the collect and the fetch of the rows to insert read them and never
        hash again. A batch the caller cached is used as it is (and left cached), hashed at
        each scan (the fetch then hashes every row's first lane again, ``_wanted``: a second
        cache cost more, 3.5 s at 10M rows); so is the cache for a layout changed between
        attempts."""
        if self.hashed is None or self.hashed[0] != layout:
            if self.hashed is not None:  # the table's layout changed between attempts
                self.fps = None
            if self.cached is None:
                batch = self.ctx.batch
                self.ours = not cached(batch)
                if self.ours:
                    lanes = spark_lanes(layout.struct)
                    self.cached = batch.select("*", *lanes).persist(KEEP)
                    columns = [quote(c) for c in layout.struct.names]
                    self.hashed = (layout, self.cached.select(*columns, FP_A, FP_B))
                else:
                    self.cached = batch
            self.lanes_cached = self.hashed is not None and self.hashed[0] == layout
            if self.hashed is None or self.hashed[0] != layout:
                self.hashed = (layout, with_fingerprints(self.cached, layout))
            self.ctx.checked_rules = None
        return self.hashed[1]

    def _initial_load(self, layout: Layout, rules: Rules) -> Plan:
        """Desired written by Spark tasks as it is, never collected."""
        ctx = self.ctx
        # With rules, the rows checked must be the rows written: one evaluation, cached.
        desired = self._hashed(layout) if rules else with_fingerprints(ctx.batch, layout)
        ctx.enforce(desired.select(*[F.col(quote(c)) for c in layout.struct.names]), rules)
        # ... and the write tasks check each row they write again: a cache block lost since is
        # computed again, which for a nondeterministic query gives other rows.
        return Plan(checked(desired, rules), None, index=self.stored)

    def _reshape(self, snap: Snapshot, layout: Layout, rules: Rules) -> Plan:
        """The epoch that changes the table's schema, where the commit must replace every file
        (``Layout.rewrites_every_file``, ``keeps_files_across_schema_change``): desired
        written whole by Spark tasks, never collected, as an initial load is, and every file
        of the snapshot retracted whole (not read: a file the log gives no row count of is
        counted from its footer). Otherwise a schema change is an epoch like any other: the
        index of the new layout reads the table's files in it (an added column null in older
        files) and the correction writes what differs."""
        ctx = self.ctx
        log.info(
            "%s: the view's schema changes in this epoch: desired is written whole, replacing "
            "the table's %d files",
            ctx.where,
            len(snap.files),
        )
        rewrites = []
        for f in snap.files:
            n = ctx.store.rows(f) if f.num_records is None else f.num_records
            rewrites.append(Rewrite(f, None, np.arange(n, dtype=np.int64), counted=n))
        return replace(self._initial_load(layout, rules), rewrites=tuple(rewrites), replaces_all=True)

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
        return Plan(
            checked(corr.inserts, rules) if corr.inserted else None,
            corr.inserted,
            corr.rewrites if corr.retracted else (),
            index=self.stored,
            ran_batch=True,  # the diff ran every partition of desired
        )

    def _release_attempt(self) -> None:
        for held in self.attempt:
            if isinstance(held, SparkCorrection):
                held.close()
            else:  # a DataFrame, classic or Connect
                release(held)
        self.attempt = []

    def _collect(self, layout: Layout, rules: Rules) -> bool:
        """Bring desired's fingerprints (and the rule each row breaks, if the table has rules)
        to the driver, once; False if they are too big to (``EpochContext.collect``)."""
        ctx = self.ctx
        hashed = self._hashed(layout)
        if self.fps is not None and rules == ctx.checked_rules:
            return True
        with ctx.phase("collect"):
            cols = [F.col(quote(c)) for c in layout.struct.names]
            checks = [rules.broken()] if rules else []
            table = ctx.collect(hashed.select(FP_A, FP_B, *checks))
            if table is None:
                return False
        if checks:
            broken = table.column(RULE).drop_null()
            if len(broken):
                raise_broken(ctx.batch.select(*cols), rules, broken[0].as_py(), ctx.where)
        ctx.checked_rules = rules
        if self.fps is None:
            batches = table.to_batches()
            del table
            self.fps = _drain(batches)
        return True

    def _fetch(self, corr: Correction) -> tuple[pa.Table, I64, I64] | None:
        """The desired rows ``corr`` inserts, with their fingerprints, on the driver: found in
        the cache by fingerprint (at most ``DRIVER_INSERT_ROWS``, their fingerprints'
        first lanes broadcast: ``_wanted``), and of each fingerprint as many copies as
        ``corr`` inserts (``_copies``).
        When every wanted fingerprint is inserted whole, every desired copy of each comes;
        when desired holds more copies of some than the diff inserts, one copy of each wanted
        fingerprint comes (equal rows) and is repeated, so no more rows reach the driver than
        are inserted. None if there are more than ``DRIVER_INSERT_ROWS``, Spark will not let
        the driver collect them, or the cache lacks a fingerprint the diff saw (it was
        recomputed since, and gave other rows)."""
        ctx = self.ctx
        assert self.hashed is not None and self.fps is not None
        layout = self.hashed[0]
        # The fingerprints' broadcast is bounded before it runs; the rows' collect is not (their
        # width is not known): it falls back when Spark refuses it.
        keys = 0 if corr.inserts_all_desired else len(corr.new_a) + len(corr.part_a)
        if corr.inserted > DRIVER_INSERT_ROWS or not ctx.limit.fits(keys, long_row_bytes(1)):
            return None
        columns = [F.col(quote(c)) for c in layout.struct.names]
        want_a, want_b, _ = corr.insert_keys()
        with ctx.phase("fetch"):  # the keys' DataFrame and the join's plan too
            wanted = self._wanted(corr, want_a if keys else None, columns)
            table = ctx.limit.collect(wanted.select(*columns, FP_A, FP_B))
        if table is None:
            log.warning(
                "%s: the rows to insert are more than the driver may collect: Spark tasks write them",
                ctx.where,
            )
            return None
        got = Fingerprints(_lane(table, FP_A), _lane(table, FP_B))
        if keys:
            wanted_rows = _among(got, want_a, want_b)
            if not wanted_rows.all():
                table = table.filter(pa.array(wanted_rows))
                got = Fingerprints(got.a[wanted_rows], got.b[wanted_rows])
        keep = _copies(got, corr)
        if keep is None:
            # The cache was computed again (a lost executor, an evicted block) and gave other
            # rows (a nondeterministic query): Spark tasks write the rows, checked by count.
            log.warning(
                "%s: the cached batch was recomputed since its fingerprints were read and holds "
                "other rows: the rows to insert are written by Spark tasks",
                ctx.where,
            )
            return None
        rows = table.take(pa.array(keep)).select(layout.struct.names).cast(layout.arrow)
        return rows, got.a[keep], got.b[keep]

    def _wanted(self, corr: Correction, want_a: I64 | None, columns: list[Column]) -> DataFrame:
        """The cached desired rows of the fingerprints ``corr`` inserts, whose first lanes are
        ``want_a`` (None: all of desired, which it inserts whole), found by their first lane
        alone, one long a key: a join on both took 0.88 s where this takes 0.64 (1.5M cached
        rows, 125K found). A row found whose second lane is not wanted (a 64-bit collision) is
        left out on the driver (``_among``)."""
        assert self.hashed is not None
        layout, hashed = self.hashed
        if want_a is None:
            return hashed
        spark = self.ctx.batch.sparkSession
        firsts = F.broadcast(from_arrow(spark, pa.table({FP_A: np.unique(want_a)}), f"{FP_A} long"))
        if self.lanes_cached:  # the cache holds the fingerprints
            wanted = hashed.join(firsts, FP_A, "left_semi")
        else:
            # The cache holds the rows only (the caller's, or ours for another layout): every
            # row's first lane is hashed to find them, the second only for the rows found.
            assert self.cached is not None
            lane_a, lane_b = spark_lanes(layout.struct)
            found = self.cached.select(*columns, lane_a).join(firsts, FP_A, "left_semi")
            wanted = found.select(*columns, FP_A, lane_b)
        if len(corr.part_a):  # duplicated rows: a shuffle of the wanted rows only
            wanted = wanted.dropDuplicates([FP_A, FP_B])
        return wanted

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
        want_a, want_b, want_n = corr.insert_keys()
        keys = pa.table({FP_A: want_a, FP_B: want_b, _N: want_n})
        keys_df = from_arrow(self.ctx.batch.sparkSession, keys, f"{FP_A} long, {FP_B} long, {_N} long")
        keys_df = self.ctx.limit.small_side(keys_df, keys.num_rows, long_row_bytes(3), most=BROADCAST_ROWS)
        rows = hashed.join(keys_df, [FP_A, FP_B])
        if len(corr.part_n):  # some fingerprints insert fewer copies than desired holds
            copies = Window.partitionBy(FP_A, FP_B).orderBy(FP_A)
            rows = rows.withColumn(_RANK, F.row_number().over(copies)).where(F.col(_RANK) <= F.col(_N))
        columns = [F.col(quote(c)) for c in layout.struct.names]
        return rows.select(*columns, FP_A, FP_B).repartition(tasks)

    def _replacing_is_cheaper(self, snap: Snapshot, corr: Correction, drops: dict[int, I64]) -> bool:
        """Whether writing desired whole moves fewer bytes than the correction: reading each
        file that keeps some rows and writing those back (unless a deletion vector drops them),
        plus the inserts. Sizes in bytes, rows converted at the table's bytes per row."""
        if snap.change_feed or not snap.files or corr.is_empty:
            return False
        held = [len(self.index.entry(f.identity)) for f in snap.files]
        per_row = sum(f.size for f in snap.files) / max(1, sum(held))
        desired = corr.desired_rows * per_row
        if desired < WHOLE_MIN_BYTES:
            return False
        partial = [k for k, d in drops.items() if len(d) < held[k]]
        if snap.deletion_vectors:
            # A vector drops the rows; nothing is read or written back: the correction never
            # moves more than desired, so the whole is never chosen.
            partial = []
        read = sum(snap.files[k].size for k in partial)
        kept = sum(held[k] - len(drops[k]) for k in partial)
        return read + (kept + corr.inserted) * per_row > desired

    def _replace_all(self, snap: Snapshot, corr: Correction, drops: dict[int, I64], rules: Rules) -> Plan:
        """Every file replaced by desired, written by Spark tasks from the cache. The rules were
        checked on the cache's rows when their fingerprints were collected; the tasks check
        the rows they write again (``rules.checked``): a recomputed cache block may differ."""
        ctx = self.ctx
        assert self.hashed is not None
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
        rewrites = self._rewrites(snap, everything)
        return Plan(
            desired,
            corr.desired_rows,
            rewrites,
            index=self.stored,
            files_read=_kept_files(rewrites),
            replaces_all=True,
            ran_batch=True,
        )

    def _rewrites(self, snap: Snapshot, drops: dict[int, I64]) -> tuple[Rewrite, ...]:
        """Files holding retracted rows, with their index entries; staging reads them."""
        out = []
        for k in sorted(drops):
            entry = self.index.entry(snap.files[k].identity)
            out.append(Rewrite(snap.files[k], None, drops[k], (entry.a, entry.b)))
        return tuple(out)

    def committed(self, staged: Staged) -> None:
        """Keep the index equal to the new version's files (the snapshot's, less removes, plus
        ours) so the next epoch reads nothing back."""
        self.index.forget([f.identity for f in staged.removes])
        for path, entry in staged.entries.items():
            self.index.put(path, entry)
        self.repack = self.fps is not None
        if self.stored is not None:  # the stored entries of files that left (off the epoch's path)
            kept = {f.key for f in staged.updates}  # a new vector leaves the file's entry as it is
            self.stored.forget([f.key for f in staged.removes if f.key not in kept], wait=False)

    def close(self) -> None:
        self._release_attempt()
        self.hashed = None
        self.lanes_cached = False
        self.fps = None
        if self.cached is not None and self.ours:
            release(self.cached)
        self.cached = None
        if self.repack:
            self.repack = False
            give_back_memory()  # desired's lanes and the diff's arrays go before the copy
            try:
                self.index.pack()
            except MemoryError:  # the epoch is committed: the next diff packs instead
                log.warning("%s: no memory to pack the index after the commit", self.ctx.where)


def _kept_files(rewrites: tuple[Rewrite, ...]) -> int:
    """Rewritten files that keep some rows: staging reads them to write those back."""
    return sum(1 for r in rewrites if len(r.drop) < (r.size or 0))


def _copies(got: Fingerprints, corr: Correction) -> I64 | None:
    """Which of the fetched rows ``got`` make the rows ``corr`` inserts, as indices into
    ``got`` (repeated where a row is inserted more often than it came): of each fingerprint
    inserted ``n`` times, its earliest copies, then its first again until there are ``n``
    (equal fingerprints, equal rows). None unless ``got`` holds exactly the fingerprints
    inserted."""
    want_a, want_b, want_n = corr.insert_keys()
    order = np.lexsort((got.b, got.a))  # stable: equal fingerprints keep their fetch order
    a, b = got.a[order], got.b[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
    starts = np.flatnonzero(new)
    wanted = np.lexsort((want_b, want_a))
    if len(starts) != len(wanted) or not (
        np.array_equal(a[starts], want_a[wanted]) and np.array_equal(b[starts], want_b[wanted])
    ):
        return None
    need = want_n[wanted]
    came = np.diff(np.append(starts, len(order)))
    rank = np.arange(len(order)) - np.repeat(starts, came)
    own = order[rank < np.repeat(np.minimum(came, need), came)]
    again = np.repeat(order[starts], np.maximum(need - came, 0))
    return np.sort(np.concatenate([own, again]))


def _among(got: Fingerprints, want_a: I64, want_b: I64) -> npt.NDArray[np.bool_]:
    """Which of ``got`` are among the fingerprints ``(want_a, want_b)``."""
    order = np.lexsort((want_b, want_a))
    sa, sb = want_a[order], want_b[order]
    lo, hi = np.searchsorted(sa, got.a, "left"), np.searchsorted(sa, got.a, "right")
    found = np.zeros(len(got), dtype=bool)
    live = np.flatnonzero(lo < hi)
    step = 0
    while len(live):  # equal first lanes: a run of one, unless 64 bits collide
        hit = sb[lo[live] + step] == got.b[live]
        found[live[hit]] = True
        live = live[~hit]
        step += 1
        live = live[lo[live] + step < hi[live]]
    return found


def _lane(table: pa.Table, name: str) -> I64:
    return np.asarray(table.column(name).to_numpy(), dtype=np.int64)


_DRAIN_BYTES = 16 << 20
"""Arrow bytes of collected batches freed between two returns of Arrow's pages to the OS."""


def _drain(batches: list[pa.RecordBatch]) -> Fingerprints:
    """The fingerprints of collected ``batches``, consumed: each batch goes once its lanes are
    copied out, and its pages go back to the OS every ``_DRAIN_BYTES``, so the driver never
    holds desired's fingerprints twice (16 bytes a row, not 32)."""
    n = sum(batch.num_rows for batch in batches)
    a, b = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    batches.reverse()
    at = freed = 0
    while batches:
        batch = batches.pop()
        end = at + batch.num_rows
        a[at:end] = batch.column(FP_A).to_numpy()
        b[at:end] = batch.column(FP_B).to_numpy()
        at, freed = end, freed + batch.nbytes
        del batch
        if freed >= _DRAIN_BYTES:
            # The heap too: the batches' buffers come from the socket's reads (measured: the
            # Arrow pool alone left a 10M-row steady epoch's peak at 52.5 B a row, not 47).
            give_back_memory()
            freed = 0
    give_back_memory()
    return Fingerprints(a, b)
