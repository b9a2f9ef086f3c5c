"""Complete mode: each micro-batch is the whole view; the target is made equal to it.

On the driver, per epoch:

1. One Spark job brings desired to the driver as Arrow (checking the target's rules in the
   same pass); it is fingerprinted there (``fingerprint.py``) once, whatever the attempts.
2. Per attempt, the index (``index.py``) is brought level with the snapshot, and the numpy
   diff (``correction.py``) says which desired rows to insert and which stored rows (file,
   position) to retract.
3. The inserted rows are taken from the Arrow in hand; each file holding a retracted row is
   read through the I/O layer, and its kept rows and their fingerprints (its index entry less
   the dropped positions: nothing is re-hashed) are written back.

A first epoch on an empty target is an initial load, possibly large: desired is written by
Spark tasks and never collected; the tasks hand back each file's fingerprints for the index.
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
from mvsink.fingerprint import fingerprints, quote
from mvsink.index import PersistedIndex
from mvsink.rules import RULE, Rules, raise_broken, table_rules
from mvsink.write import Layout, Plan, Rewrite, Staged

log = logging.getLogger(__name__)


class Complete:
    """Plans complete-mode attempts of one epoch, keeping the sink's index current."""

    def __init__(self, ctx: EpochContext, index: PersistedIndex) -> None:
        self.ctx = ctx
        self.index = index
        self.rows: pa.Table | None = None
        self.fps: Fingerprints | None = None
        self.cached: DataFrame | None = None

    def plan(self, snap: Snapshot, layout: Layout) -> Plan:
        ctx = self.ctx
        rules = table_rules(snap, ctx.where)
        desired = ctx.batch.select(*[F.col(quote(c)) for c in layout.struct.names])
        if not snap.files and self.rows is None:
            if rules:  # the rows checked must be the rows written: one evaluation, cached
                if self.cached is None:
                    self.cached = desired.persist(StorageLevel.MEMORY_AND_DISK)
                desired = self.cached
            ctx.enforce(desired, rules)
            return Plan(desired, None, indexed=True)
        held = sum(f.num_records or 0 for f in snap.files)
        if held > ctx.opts.driver_max_rows and self.rows is None:
            log.warning(
                "%s: the target holds %d rows, above driver_max_rows=%d; planning on the driver "
                "anyway (the distributed path is not built yet), which needs memory for them",
                ctx.where,
                held,
                ctx.opts.driver_max_rows,
            )
        self._collect(layout, rules)
        assert self.rows is not None and self.fps is not None
        with ctx.phase("index"):
            ctx.files_read += self.index.sync(ctx.store, snap, layout.arrow, ctx.where)
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
            indexed=True,
        )

    def _collect(self, layout: Layout, rules: Rules) -> None:
        """Bring desired (and the rule each row breaks, if any) to the driver, once."""
        if self.rows is not None and rules == self.ctx.checked_rules:
            return
        ctx = self.ctx
        cols = [F.col(quote(c)) for c in layout.struct.names]
        with ctx.phase("collect"):
            table = ctx.batch.select(*cols, rules.broken()).toArrow()
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

    def _rewrites(self, snap: Snapshot, drops: dict[int, I64]) -> tuple[Rewrite, ...]:
        """Files holding retracted rows, with their index entries; staging reads them."""
        out = []
        for k in sorted(drops):
            entry = self.index.entry(snap.files[k].key)
            out.append(Rewrite(snap.files[k], None, drops[k], (entry.a, entry.b)))
        self.ctx.files_read += sum(1 for r in out if len(r.drop) < (r.size or 0))
        return tuple(out)

    def committed(self, staged: Staged) -> None:
        """Keep the index equal to the new version's files (the snapshot's, less removes, plus
        ours) so the next epoch reads nothing back."""
        self.index.forget(f.key for f in staged.removes)
        for add, entry in zip(staged.adds, staged.entries, strict=True):
            self.index.put(add.path, entry)

    def close(self) -> None:
        self.rows = None
        if self.cached is not None:
            self.cached.unpersist()
            self.cached = None
