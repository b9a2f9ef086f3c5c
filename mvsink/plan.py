"""What an epoch writes, per mode: rows to insert and files to rewrite without some rows.

A ``Plan`` is the correction turned into things Spark can write: an inserts DataFrame and a
list of ``Rewrite``s. ``complete`` derives it from the fingerprint diff (``correction.py``)
against the index; ``append`` inserts the batch as is; ``upsert`` lives in ``upsert.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from mvsink.correction import I64, Correction
from mvsink.delta import Snapshot
from mvsink.fingerprint import quote
from mvsink.index import PersistedIndex
from mvsink.write import Rewrite, inserted_rows


@dataclass(frozen=True)
class Plan:
    """Rows to insert (``inserted`` of them; None: not known before writing) and rewrites."""

    inserts: DataFrame | None
    inserted: int | None
    rewrites: tuple[Rewrite, ...]
    expected: tuple[I64, I64] | None = None
    """Complete mode: the fingerprints the staged files must hold (kept + inserted); the staged
    files are read back, checked against them and indexed."""
    files_read: int = 0
    """Data files of the snapshot read back to make this plan (upsert mode)."""

    @property
    def retracted(self) -> int:
        return sum(len(r.drop) for r in self.rewrites)


def plan_complete(
    spark: SparkSession,
    desired: DataFrame,
    corr: Correction,
    snap: Snapshot,
    index: PersistedIndex,
    schema: StructType,
) -> Plan:
    """Insert what desired has more of, rewrite every file holding a row it has less of."""
    rewrites = []
    kept_a, kept_b = [corr.inserted_a()], [corr.inserted_b()]
    for k, drop in sorted(corr.retracted_positions().items()):
        f = snap.files[k]
        entry = index.entry(f.key)
        rewrites.append(Rewrite(f, f.local_path(snap.root), len(entry), drop))
        keep = np.ones(len(entry), dtype=bool)
        keep[drop] = False
        kept_a.append(entry.a[keep])
        kept_b.append(entry.b[keep])
    inserts = inserted_rows(spark, desired, corr, schema.names)
    expected = (np.concatenate(kept_a), np.concatenate(kept_b))
    return Plan(inserts, corr.inserted, tuple(rewrites), expected=expected)


def plan_append(batch: DataFrame, schema: StructType) -> Plan:
    """Every row of the batch is added; nothing is read back or rewritten."""
    return Plan(batch.select(*[F.col(quote(c)) for c in schema.names]), None, ())
