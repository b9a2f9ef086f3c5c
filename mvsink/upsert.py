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
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from mvsink.delta import DataFile, Snapshot
from mvsink.errors import DuplicateKeyError, InputError, Where
from mvsink.files import POS, URI, LocalFile, read_files
from mvsink.fingerprint import FP_A, FP_B, fingerprint_columns, quote
from mvsink.plan import Plan
from mvsink.write import Rewrite, keys_frame

DEL = "__mvsink_delete"
_RN = "__mvsink_rn"
_RK = "__mvsink_rk"
_BROADCAST_KEYS = 1_000_000  # above this many touched keys, let Spark pick the join


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
    deleted = (
        F.coalesce(F.col(quote(spec.delete_column)), F.lit(False)) if spec.delete_column else F.lit(False)
    )
    a, b = fingerprint_columns(schema)
    return batch.select(
        *[F.col(quote(c)) for c in schema.names],
        deleted.alias(DEL),
        a,
        b,
        F.row_number().over(w).alias(_RN),
        (F.rank().over(w) if seq is not None else F.lit(1)).alias(_RK),
    )


def _check(ranked: DataFrame, spec: UpsertSpec, where: Where) -> None:
    """One Spark job finding null keys, null sequences and duplicate keys."""
    null_key = F.lit(False)
    for k in spec.key:
        null_key = null_key | F.col(quote(k)).isNull()
    null_seq = F.col(quote(spec.sequence_column)).isNull() if spec.sequence_column else F.lit(False)
    dup = (F.col(_RN) == 2) & (F.col(_RK) == 1)
    kind = F.when(null_key, "null key").when(null_seq, "null sequence").otherwise("duplicate")
    found = (
        ranked.where(null_key | null_seq | dup)
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
    if found:
        shown = ", ".join(str(tuple(r[k] for k in spec.key)) for r in found[:5])
        why = (
            f"with the same highest {spec.sequence_column}"
            if spec.sequence_column
            else "and no sequence_column to order them"
        )
        raise DuplicateKeyError(f"keys appear more than once in the batch {why}: {shown}", where)


def candidate_files(
    files: Sequence[DataFile], touched: pa.Table, key: Sequence[str], partition_by: Sequence[str]
) -> list[DataFile]:
    """The files whose partition values and key bounds can hold one of the touched keys."""
    # Delta stores partition values as strings, formatted as casting the key to string does.
    as_string = {k: pc.cast(touched.column(k), pa.string()) for k in key if k in partition_by}
    out = []
    for f in files:
        mask: Any = None
        for k in key:
            col = touched.column(k)
            if k in partition_by:
                pv = f.partition_values.get(k)
                m = pc.is_null(as_string[k]) if pv is None else pc.equal(as_string[k], pv)
            elif k in f.min_values and k in f.max_values:
                try:
                    lo = pa.scalar(f.min_values[k], col.type)
                    hi = pa.scalar(f.max_values[k], col.type)
                    m = pc.and_(pc.greater_equal(col, lo), pc.less_equal(col, hi))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError):
                    continue  # bounds we cannot compare prune nothing
            else:
                continue
            mask = m if mask is None else pc.and_(mask, m)
        if mask is None or pc.any(mask).as_py():
            out.append(f)
    return out


def plan_upsert(
    spark: SparkSession, ranked: DataFrame, *, schema: StructType, spec: UpsertSpec, snap: Snapshot
) -> Plan:
    """The plan for one prepared upsert batch against ``snap`` (see the module doc)."""
    latest = ranked.where(F.col(_RN) == 1)
    live = latest.where(~F.col(DEL))
    cols = [F.col(quote(c)) for c in schema.names]
    if not snap.files:
        n = live.count()
        return Plan(live.select(*cols) if n else None, n, (), False)

    key_cols = [quote(k) for k in spec.key]
    seq_cols = [quote(spec.sequence_column)] if spec.sequence_column else []
    touched = latest.select(*key_cols, *seq_cols, DEL, FP_A, FP_B).toArrow()
    files = candidate_files(snap.files, touched, spec.key, snap.partition_by)
    stored = _stored_rows(spark, latest, schema, spec, snap, files, len(touched))
    insert_fp, drops = _decide(touched, stored, spec)

    by_local = {f.local_path(snap.root): f for f in files}
    rewrites = []
    for uri, positions in sorted(drops.items()):
        local = unquote(urlparse(uri).path)
        f = by_local[local]
        rows = f.num_records if f.num_records is not None else pq.read_metadata(local).num_rows
        rewrites.append(Rewrite(f, local, uri, rows, np.array(sorted(positions), dtype=np.int64)))
    n_live = len(touched) - int(pc.sum(touched.column(DEL)).as_py() or 0)
    if not insert_fp:
        inserts = None
    elif len(insert_fp) == n_live:
        inserts = live.select(*cols)
    else:
        a = np.array([p[0] for p in insert_fp], dtype=np.int64)
        b = np.array([p[1] for p in insert_fp], dtype=np.int64)
        inserts = live.join(keys_frame(spark, **{FP_A: a, FP_B: b}), [FP_A, FP_B], "left_semi").select(*cols)
    return Plan(inserts, len(insert_fp), tuple(rewrites), False, files_read=len(files))


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
    if n_touched <= _BROADCAST_KEYS:
        keys = F.broadcast(keys)
    a, b = fingerprint_columns(schema)
    seq_cols = [quote(spec.sequence_column)] if spec.sequence_column else []
    return (
        rows.join(keys, list(spec.key), "left_semi")
        .select(*[quote(k) for k in spec.key], *seq_cols, URI, POS, a, b)
        .toArrow()
    )


def _decide(
    touched: pa.Table, stored: pa.Table | None, spec: UpsertSpec
) -> tuple[list[tuple[int, int]], dict[str, list[int]]]:
    """Per touched key: which batch rows to insert (by fingerprint) and which stored rows to drop."""
    keys = list(zip(*[touched.column(k).to_pylist() for k in spec.key], strict=True))
    seq = touched.column(spec.sequence_column).to_pylist() if spec.sequence_column else None
    deleted = touched.column(DEL).to_pylist()
    fa = touched.column(FP_A).to_pylist()
    fb = touched.column(FP_B).to_pylist()
    held: dict[tuple[Any, ...], list[tuple[Any, str, int, tuple[int, int]]]] = {}
    if stored is not None and stored.num_rows:
        s_keys = zip(*[stored.column(k).to_pylist() for k in spec.key], strict=True)
        s_seq = (
            stored.column(spec.sequence_column).to_pylist()
            if spec.sequence_column
            else [None] * stored.num_rows
        )
        for k, sq, uri, pos, a, b in zip(
            s_keys,
            s_seq,
            stored.column(URI).to_pylist(),
            stored.column(POS).to_pylist(),
            stored.column(FP_A).to_pylist(),
            stored.column(FP_B).to_pylist(),
            strict=True,
        ):
            held.setdefault(k, []).append((sq, uri, pos, (a, b)))
    inserts: list[tuple[int, int]] = []
    drops: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        rows = sorted(held.get(k, []), key=lambda r: (r[1], r[2]))
        want: tuple[int, int] | None = None if deleted[i] else (fa[i], fb[i])
        from_batch = True
        if seq is not None and rows:
            newest = max(rows, key=lambda r: r[0])
            if newest[0] is not None and newest[0] > seq[i]:
                # The target already holds a newer event for this key: an older one must not
                # roll it back. Keep the newest stored row.
                want, from_batch = newest[3], False
        kept = False
        for _seq, uri, pos, fp in rows:
            if not kept and want is not None and fp == want:
                kept = True
                continue
            drops.setdefault(uri, []).append(pos)
        if want is not None and not kept and from_batch:
            inserts.append(want)
    return inserts, drops
