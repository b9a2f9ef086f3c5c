"""Upsert mode: each micro-batch carries the new rows of the keys that changed.

For a batch, per key:

1. Several rows for one key: with ``sequence_column`` the highest sequence wins (a tie at the
   top is ambiguous and an error); without it, ``DuplicateKeyError``. A null key or a null
   sequence is bad input. All of this is checked before anything is written.
2. The touched keys go to the driver; the snapshot's files are pruned to those whose partition
   values and key min/max statistics can hold one of them, and only those are read back,
   keeping only rows of touched keys. Cost follows the touched keys, not the table.
3. For each touched key the desired row is the batch's winner, unless the target already
   holds a newer sequence for the key (then the stored newest row stays), or the winner is a
   delete (then nothing). Whatever the target holds for the key (nothing, several rows, a
   stale value) becomes exactly that: one stored copy equal to it is kept, every other stored
   row of the key is retracted, and the winner is inserted if no copy was kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from mvsink.correction import I64
from mvsink.delta import DataFile, Snapshot
from mvsink.errors import DuplicateKeyError, InputError, Where
from mvsink.files import FILE, POS, LocalFile, read_files
from mvsink.fingerprint import FP_A, FP_B, fingerprint_columns, quote
from mvsink.plan import Plan
from mvsink.prune import candidate_files
from mvsink.write import BROADCAST_ROWS, Rewrite, keys_frame

DEL = "__mvsink_delete"
_RN = "__mvsink_rn"
_RK = "__mvsink_rk"
_TI = "__mvsink_touched"


@dataclass(frozen=True)
class UpsertSpec:
    key: tuple[str, ...]
    delete_column: str | None
    sequence_column: str | None


def prepare(batch: DataFrame, schema: StructType, spec: UpsertSpec, where: Where) -> DataFrame:
    """The batch ranked within each key, cached, and checked (rule 1 of the module doc).

    The caller unpersists it when the epoch ends; retries of the epoch reuse it.
    """
    ranked = _ranked(batch, schema, spec).persist()
    try:
        _check(ranked, spec, where)
    except BaseException:
        ranked.unpersist()
        raise
    return ranked


def _ranked(batch: DataFrame, schema: StructType, spec: UpsertSpec) -> DataFrame:
    keys = [F.col(quote(k)) for k in spec.key]
    seq = F.col(quote(spec.sequence_column)) if spec.sequence_column else None
    w = Window.partitionBy(*keys).orderBy(seq.desc() if seq is not None else F.lit(1))
    # A null marker is refused by _check; it is never read as "not deleted".
    deleted = F.col(quote(spec.delete_column)) if spec.delete_column else F.lit(False)
    a, b = fingerprint_columns(schema)
    return batch.select(
        *[F.col(quote(c)) for c in schema.names],
        deleted.alias(DEL),
        a,
        b,
        F.row_number().over(w).alias(_RN),
        (F.rank().over(w) if seq is not None else F.lit(1)).alias(_RK),
    )


def stored_rows(ranked: DataFrame, schema: StructType) -> DataFrame:
    """The rows of a prepared batch that the target would hold: each key's winner, unless a
    delete."""
    return ranked.where((F.col(_RN) == 1) & ~F.col(DEL)).select(*[F.col(quote(c)) for c in schema.names])


def _check(ranked: DataFrame, spec: UpsertSpec, where: Where) -> None:
    """One Spark job finding null keys, null sequences and duplicate keys."""
    null_key = F.lit(False)
    for k in spec.key:
        null_key = null_key | F.col(quote(k)).isNull()
    null_seq = F.col(quote(spec.sequence_column)).isNull() if spec.sequence_column else F.lit(False)
    null_del = F.col(DEL).isNull()
    dup = (F.col(_RN) == 2) & (F.col(_RK) == 1)
    kind = (
        F.when(null_key, "null key")
        .when(null_seq, "null sequence")
        .when(null_del, "null delete marker")
        .otherwise("duplicate")
    )
    found = (
        ranked.where(null_key | null_seq | null_del | dup)
        .select(kind.alias("kind"), *[F.col(quote(k)) for k in spec.key])
        .limit(20)
        .collect()
    )
    kinds = {r["kind"] for r in found}
    if "null key" in kinds:
        raise InputError(
            f"a row has a null in key column(s) {', '.join(spec.key)}; keys must not be null", where
        )
    if "null sequence" in kinds:
        raise InputError(f"a row has a null sequence ({spec.sequence_column})", where)
    if "null delete marker" in kinds:
        raise InputError(
            f"a row has a null delete marker ({spec.delete_column}); say true or false, so that a "
            "delete is never taken for an update",
            where,
        )
    duplicates = [r for r in found if r["kind"] == "duplicate"]
    if duplicates:
        shown = ", ".join(str(tuple(r[k] for k in spec.key)) for r in duplicates[:5])
        why = (
            f"with the same highest {spec.sequence_column}"
            if spec.sequence_column
            else "and no sequence_column to order them"
        )
        raise DuplicateKeyError(f"keys appear more than once in the batch {why}: {shown}", where)


def plan_upsert(
    spark: SparkSession, ranked: DataFrame, *, schema: StructType, spec: UpsertSpec, snap: Snapshot
) -> Plan:
    """The plan for one prepared upsert batch against ``snap`` (see the module doc)."""
    latest = ranked.where(F.col(_RN) == 1)
    live = latest.where(~F.col(DEL))
    cols = [F.col(quote(c)) for c in schema.names]
    if not snap.files:
        n = live.count()
        return Plan(live.select(*cols) if n else None, n, ())

    key_cols = [quote(k) for k in spec.key]
    seq_cols = [quote(spec.sequence_column)] if spec.sequence_column else []
    touched = latest.select(*key_cols, *seq_cols, DEL, FP_A, FP_B).toArrow()
    files = [snap.files[i] for i in candidate_files(snap, touched, spec.key)]
    stored = _stored_rows(spark, latest, schema, spec, snap, files, len(touched))
    insert_a, insert_b, drop_file, drop_pos = _decide(touched, stored, spec)

    rewrites = []
    if len(drop_file):
        order = np.lexsort((drop_pos, drop_file))
        drop_file, drop_pos = drop_file[order], drop_pos[order]
        bounds = np.flatnonzero(np.diff(drop_file)) + 1
        for numbers, positions in zip(np.split(drop_file, bounds), np.split(drop_pos, bounds), strict=True):
            f = files[int(numbers[0])]
            local = f.local_path(snap.root)
            rows = f.num_records if f.num_records is not None else pq.read_metadata(local).num_rows
            rewrites.append(Rewrite(f, local, rows, positions.astype(np.int64)))
    n_live = len(touched) - int(pc.sum(touched.column(DEL)).as_py() or 0)
    if not len(insert_a):
        inserts = None
    elif len(insert_a) == n_live:
        inserts = live.select(*cols)
    else:
        keys = keys_frame(spark, **{FP_A: insert_a, FP_B: insert_b})
        inserts = live.join(keys, [FP_A, FP_B], "left_semi").select(*cols)
    return Plan(inserts, len(insert_a), tuple(rewrites), files_read=len(files))


def _stored_rows(
    spark: SparkSession,
    latest: DataFrame,
    schema: StructType,
    spec: UpsertSpec,
    snap: Snapshot,
    files: Sequence[DataFile],
    n_touched: int,
) -> pa.Table | None:
    """Rows of the candidate files whose key was touched: key, sequence, address, fingerprint."""
    if not files:
        return None
    located = [LocalFile(f.local_path(snap.root), f.partition_values) for f in files]
    rows = read_files(spark, schema, snap.partition_by, located)
    keys = latest.select(*[quote(k) for k in spec.key])
    if n_touched <= BROADCAST_ROWS:
        keys = F.broadcast(keys)
    a, b = fingerprint_columns(schema)
    seq_cols = [quote(spec.sequence_column)] if spec.sequence_column else []
    return (
        rows.join(keys, list(spec.key), "left_semi")
        .select(*[quote(k) for k in spec.key], *seq_cols, FILE, POS, a, b)
        .toArrow()
    )


def _decide(touched: pa.Table, stored: pa.Table | None, spec: UpsertSpec) -> tuple[I64, I64, I64, I64]:
    """Per touched key (rule 3 of the module doc), vectorised: the fingerprints of the batch
    rows to insert, and the stored rows to drop as (file number, position)."""
    n = touched.num_rows
    want_a = touched.column(FP_A).to_numpy().copy()
    want_b = touched.column(FP_B).to_numpy().copy()
    want = ~touched.column(DEL).to_numpy(zero_copy_only=False).astype(bool)
    from_batch = np.ones(n, dtype=bool)
    z = np.zeros(0, dtype=np.int64)
    if stored is None or stored.num_rows == 0:
        return want_a[want], want_b[want], z, z
    # Tie each stored row to its touched key, then order rows by key, file and position: the
    # earliest stored copy equal to the wanted row is the one kept.
    index = touched.select(list(spec.key)).append_column(_TI, pa.array(np.arange(n, dtype=np.int64)))
    rows = stored.join(index, list(spec.key), join_type="inner")
    rows = rows.take(pc.sort_indices(rows, [(_TI, "ascending"), (FILE, "ascending"), (POS, "ascending")]))
    if rows.num_rows == 0:
        return want_a[want], want_b[want], z, z
    ti = rows.column(_TI).to_numpy()
    sa, sb = rows.column(FP_A).to_numpy(), rows.column(FP_B).to_numpy()
    starts = np.flatnonzero(np.concatenate([[True], ti[1:] != ti[:-1]]))
    if spec.sequence_column:
        # A stored row newer than the batch's for its key stays (an old event never rolls a
        # key back). Rows with a null sequence are older than any.
        seq = spec.sequence_column
        by_seq = pc.sort_indices(
            rows,
            [(_TI, "ascending"), (seq, "descending", "at_end"), (FILE, "ascending"), (POS, "ascending")],
        ).to_numpy()
        newest = by_seq[starts]  # per key present in stored, its newest stored row
        keys_of = ti[starts]
        newer = pc.fill_null(
            pc.greater(rows.column(seq).take(pa.array(newest)), touched.column(seq).take(pa.array(keys_of))),
            False,
        ).to_numpy(zero_copy_only=False)
        k, r = keys_of[newer], newest[newer]
        want_a[k], want_b[k], want[k], from_batch[k] = sa[r], sb[r], True, False
    match = want[ti] & (sa == want_a[ti]) & (sb == want_b[ti])
    seen = np.cumsum(match)
    before_group = np.repeat(seen[starts] - match[starts], np.diff(np.append(starts, len(ti))))
    kept = match & (seen - before_group == 1)
    has_kept = np.zeros(n, dtype=bool)
    has_kept[ti[kept]] = True
    insert = want & from_batch & ~has_kept
    drop = pa.array(~kept)
    return (
        want_a[insert],
        want_b[insert],
        rows.column(FILE).filter(drop).to_numpy().astype(np.int64),
        rows.column(POS).filter(drop).to_numpy(),
    )
