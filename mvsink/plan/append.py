"""Append mode: each micro-batch holds rows to add, exactly once per epoch.

Nothing is read or compared: Spark tasks write the batch as is (``tasks.write_frame``), and
the commit's frontier makes a replayed epoch write nothing. When the target has rules (NOT
NULL, CHECK), the batch is cached first (unless the caller cached it), so the rows checked are
the rows written; the write tasks check the rows they write again (``rules.checked``), should
Spark compute a lost cache block again.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from mvsink.compat import KEEP, cached, release
from mvsink.plan.context import EpochContext
from mvsink.plan.rules import checked, rules_for
from mvsink.table.delta import Snapshot
from mvsink.table.fingerprint import quote
from mvsink.table.layout import Layout
from mvsink.table.plan import Plan, Staged


class Append:
    """Plans append-mode attempts of one epoch."""

    def __init__(self, ctx: EpochContext) -> None:
        self.ctx = ctx
        self.cached: DataFrame | None = None

    def plan(self, snap: Snapshot, layout: Layout) -> Plan:
        rules = rules_for(snap, self.ctx.opts, self.ctx.where)
        rows = self.cached or self.ctx.batch
        # Checked, then written: cached for the two passes, unless the caller cached it.
        if rules and self.cached is None and not cached(rows):
            self.cached = rows = self.ctx.batch.persist(KEEP)
        self.ctx.enforce(rows, rules)
        return Plan(checked(rows.select(*[F.col(quote(c)) for c in layout.struct.names]), rules), None)

    def committed(self, staged: Staged) -> None:
        pass

    def close(self) -> None:
        if self.cached is not None:
            release(self.cached)
            self.cached = None
