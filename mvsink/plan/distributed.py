"""The distributed path: the correction computed by Spark, for views bigger than the driver.

Nothing row-sized passes through the driver. For a complete-mode epoch:

1. Desired is fingerprinted by Spark itself, in the stage that computes it
   (``fingerprint.spark_lanes``), and cached, so that its rows are evaluated once per epoch,
   whatever the attempts.
2. The persisted side is read by tasks from the stored index (``index.StoredIndex``): one
   ``(file_no, pos, fingerprint)`` row per stored row; a file without an entry is read and
   hashed by the task, which stores its entry.
3. A sketch first settles most of the table. Fingerprints are bucketed by the top bits of
   lane a (``SKETCH_BITS``); each bucket is summarised, on each side, by its row count and the
   exact sums of the 32-bit halves of both lanes (desired's by Spark, the persisted side's by
   the index tasks in numpy, so no persisted row crosses into the JVM for it). A bucket whose
   summaries agree holds the same fingerprints on both sides: two multisets that differ and
   still agree need their 128 bits of fingerprints to sum alike, the fingerprint's own odds.
   Only the changed buckets, collected as at most ``2**20`` numbers, go on.
4. The diff is one aggregation of ``(fingerprint, +1 desired | +1 persisted)`` rows of the
   changed buckets: groups whose counts differ are the correction. Where desired holds ``d``
   copies of a fingerprint and persisted ``p``, ``d - p`` desired copies are inserted if
   ``d > p``; if ``p > d``, the persisted copies beyond the earliest ``d`` (by file order,
   then position: the driver path's rule, ``correction.py``) are retracted. Every copy of a
   fingerprint is in the same bucket, so the rule sees whole groups.
5. Retractions are grouped per file and handed, with the file's description, to rewrite tasks
   (``plan.TaskRewrites``); inserts are written by write tasks. Both write the new files'
   index entries; the driver receives each new file's add action only.

Only the file list (the Delta log's, which the commit needs anyway), the changed buckets'
numbers and a few totals are on the driver. Each collect and broadcast is bounded before it
runs, by the driver's result limit (``context.ResultLimit``): the sketch has at most as many
buckets as the limit lets the driver collect, and the changed groups are broadcast only when
they fit it; otherwise they are joined by a shuffle.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from mvsink.compat import KEEP, from_arrow, release, to_arrow
from mvsink.errors import InvariantViolation
from mvsink.plan.context import ResultLimit, long_row_bytes
from mvsink.table.delta import Snapshot
from mvsink.table.fingerprint import FP_A, FP_B, I64, fingerprints, quote, spark_lanes
from mvsink.table.index import FileEntry, StoredIndex
from mvsink.table.layout import Layout
from mvsink.table.plan import TaskRewrites
from mvsink.table.storage import Store
from mvsink.table.tasks import file_frame, in_task, task_files

FILE_NO = "file_no"
POS = "pos"
_D = "__mvsink_d"
_P = "__mvsink_p"
_RN = "__mvsink_rn"
BROADCAST_GROUPS = 500_000
"""Up to this many changed fingerprint groups are broadcast to the joins, if the driver's
result limit lets them (``ResultLimit.small_side``)."""
BROADCAST_FILES = 20_000
"""Up to this many files (a few MB of the log's file list) are broadcast to the join that
hands each rewritten file its description, if the driver's result limit lets them."""
SKETCH_BITS = (16, 20)
"""The sketch's buckets (step 3) are the top ``bits`` of lane a, ``bits`` in this range: one
bucket per 256 stored rows (``sketch_bits``). A change of ``c`` fingerprints leaves about
``exp(-c / buckets)`` of the table settled: 86% for 10K changes in 5M rows (65,536 buckets),
74% for 40K in 20M (131,072). Fewer under a driver result limit too small for the bucket
numbers (8 MB at 20 bits)."""
_SKETCH_ROWS = 1 << 22
"""Index rows a sketch task adds up at once (about 200 MB of temporaries), so that many small
files cost one pass, not one each."""
_BUCKET = "__mvsink_bucket"
_N = "__mvsink_n"
_SUMS = ("__mvsink_a_lo", "__mvsink_a_hi", "__mvsink_b_lo", "__mvsink_b_hi")
_SKETCH = StructType([StructField(n, LongType(), False) for n in (_BUCKET, _N, *_SUMS)])
_SKETCH_ARROW = pa.schema([pa.field(n, pa.int64(), nullable=False) for n in _SKETCH.names])
_PERSISTED = StructType([StructField(n, LongType(), False) for n in (FILE_NO, POS, FP_A, FP_B)])
_PERSISTED_ARROW = pa.schema([pa.field(n, pa.int64(), nullable=False) for n in _PERSISTED.names])


def with_fingerprints(rows: DataFrame, layout: Layout, extra: Sequence[StructField] = ()) -> DataFrame:
    """``rows``' table columns (then the ``extra`` ones, passed through) with the fingerprints
    of the table columns appended, computed by Spark in the same stage (``spark_lanes``)."""
    return rows.select(
        *[F.col(quote(f.name)) for f in (*layout.struct.fields, *extra)], *spark_lanes(layout.struct)
    )


def sketch_bits(snap: Snapshot, limit: ResultLimit | None = None) -> int:
    """The sketch's bits for ``snap``: one bucket per 256 stored rows, within ``SKETCH_BITS``,
    and few enough that every bucket's number ``fits`` the driver's result ``limit``."""
    rows = sum(f.num_records or 0 for f in snap.files)
    low, high = SKETCH_BITS
    bits = min(high, max(low, (max(1, rows) // 256).bit_length()))
    while limit is not None and bits > 1 and not limit.fits(1 << bits, long_row_bytes(1)):
        bits -= 1
    return bits


def persisted_rows(
    spark: Any, snap: Snapshot, index: StoredIndex, layout: Layout, buckets: np.ndarray | None = None
) -> DataFrame:
    """The persisted side: ``(file_no, pos, fingerprint)`` per stored row of ``snap``'s files,
    read from the stored index by tasks (file numbers index into ``snap.files``); with
    ``buckets`` (a mask over the sketch's buckets, ``changed_buckets``) only the rows of the
    buckets it marks."""
    return file_frame(spark, snap.files).mapInArrow(
        _IndexReader(index, layout.arrow, snap.partition_by, buckets), _PERSISTED
    )


def _bucket(lane: Any, bits: int) -> Any:
    return F.shiftrightunsigned(lane, 64 - bits)


def _sketch_terms(a: Any, b: Any) -> list[Any]:
    """The summed terms of a row: the 32-bit halves of both lanes, each below 2**32, so the
    sums of up to 2**31 rows never overflow (which ANSI mode would refuse)."""
    low = F.lit(0xFFFFFFFF)
    return [a.bitwiseAND(low), F.shiftrightunsigned(a, 32), b.bitwiseAND(low), F.shiftrightunsigned(b, 32)]


def changed_buckets(
    spark: Any, desired: DataFrame, snap: Snapshot, index: StoredIndex, layout: Layout, bits: int
) -> np.ndarray:
    """A mask over the sketch's ``2**bits`` buckets: those whose summaries differ between
    ``desired`` (``with_fingerprints``) and the stored index of ``snap``'s files (step 3)."""
    a, b = F.col(FP_A), F.col(FP_B)
    mine = desired.select(
        _bucket(a, bits).alias(_BUCKET),
        F.lit(1).cast("long").alias(_N),
        *[t.alias(n) for t, n in zip(_sketch_terms(a, b), _SUMS, strict=True)],
    )
    theirs = file_frame(spark, snap.files).mapInArrow(
        _IndexSketch(index, layout.arrow, snap.partition_by, bits), _SKETCH
    )
    signed = mine.unionByName(theirs.select(_BUCKET, *[(-F.col(n)).alias(n) for n in (_N, *_SUMS)]))
    sums = signed.groupBy(_BUCKET).agg(*[F.sum(n).alias(n) for n in (_N, *_SUMS)])
    differs = sums.where(F.greatest(*[F.abs(F.col(n)) for n in (_N, *_SUMS)]) != 0).select(_BUCKET)
    mask = np.zeros(1 << bits, dtype=np.bool_)
    # Bounded: at most 2**bits numbers, which ``sketch_bits`` keeps within the result limit.
    mask[to_arrow(differs).column(_BUCKET).to_numpy()] = True
    return mask


def _file_side(spark: Any, snap: Snapshot, limit: ResultLimit) -> DataFrame:
    """``file_frame`` of ``snap``'s files, the small side of a join: broadcast when the file
    list fits the driver's result limit (a row: three longs, and three strings no longer than
    the log's widest path, partition values and deletion vector)."""
    texts = [
        (f.path, json.dumps(dict(f.partition_values)), json.dumps(dict(f.deletion_vector or {})))
        for f in snap.files
    ]
    widest = sum(max((len(t[i].encode()) for t in texts), default=0) for i in range(3))
    frame = file_frame(spark, snap.files)
    return limit.small_side(frame, len(texts), long_row_bytes(6) + widest, most=BROADCAST_FILES)


def _buckets_of(a: I64, bits: int) -> np.ndarray:
    return (a.view(np.uint64) >> np.uint64(64 - bits)).astype(np.intp)


def _bits_of(mask: np.ndarray) -> int:
    """The sketch's bits, from a mask over its ``2**bits`` buckets."""
    return len(mask).bit_length() - 1


def _halves(a: I64, b: I64) -> Iterator[np.ndarray]:
    """``_sketch_terms`` in numpy, one at a time."""
    low, high = np.uint64(0xFFFFFFFF), np.uint64(32)
    for lane in (a.view(np.uint64), b.view(np.uint64)):
        yield lane & low
        yield lane >> high


@dataclass(frozen=True)
class _IndexSketch:
    """Runs in a Spark task: the summaries of its files' index entries per bucket (step 3),
    added up in numpy, so the rows themselves never leave Python."""

    index: StoredIndex
    schema: pa.Schema
    partition_by: tuple[str, ...]
    bits: int

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        size = 1 << self.bits
        totals = np.zeros((1 + len(_SUMS), size), dtype=np.int64)
        pending: list[FileEntry] = []
        for _, file in task_files(batches):
            with in_task(f"indexing {file.path}"):
                pending.append(self.index.load(file, self.schema, self.partition_by)[0])
            if sum(len(e) for e in pending) >= _SKETCH_ROWS:
                self._add(totals, pending)
                pending = []
        self._add(totals, pending)
        present = np.flatnonzero(totals[0])
        yield pa.RecordBatch.from_arrays(
            [pa.array(present.astype(np.int64)), *[pa.array(t[present]) for t in totals]],
            schema=_SKETCH_ARROW,
        )

    def _add(self, totals: np.ndarray, entries: list[FileEntry]) -> None:
        """Add ``entries``' rows to ``totals`` (count, then the four sums, per bucket)."""
        if not entries:
            return
        a = np.concatenate([e.a for e in entries])
        b = np.concatenate([e.b for e in entries])
        at = _buckets_of(a, self.bits)
        size = totals.shape[1]
        totals[0] += np.bincount(at, minlength=size)
        sixteen, mask = np.uint64(16), np.uint64(0xFFFF)
        for i, half in enumerate(_halves(a, b)):
            # bincount adds in float64: exact for 16-bit terms (up to 2**37 rows at once).
            low = np.bincount(at, weights=half & mask, minlength=size).astype(np.int64)
            high = np.bincount(at, weights=half >> sixteen, minlength=size).astype(np.int64)
            totals[1 + i] += low + (high << 16)


def stored_rows(spark: Any, snap: Snapshot, store: Store, layout: Layout) -> DataFrame:
    """Every stored row of ``snap``'s files, with its fingerprint, read by tasks: the table's
    columns then ``FP_A``, ``FP_B`` (the schema ``with_fingerprints`` gives desired)."""
    schema = StructType([*layout.struct.fields, StructField(FP_A, LongType()), StructField(FP_B, LongType())])
    return file_frame(spark, snap.files).mapInArrow(_RowReader(store, layout, snap.partition_by), schema)


@dataclass(frozen=True)
class _RowReader:
    """Runs in a Spark task: each file's rows and their fingerprints."""

    store: Store
    layout: Layout
    partition_by: tuple[str, ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _, file in task_files(batches):
            with in_task(f"reading {file.path}"):
                rows = self.store.read(file, self.layout.arrow, self.partition_by)
                a, b = fingerprints(rows)
            yield from rows.append_column(FP_A, pa.array(a)).append_column(FP_B, pa.array(b)).to_batches()


def mismatched_entries(spark: Any, snap: Snapshot, index: StoredIndex, layout: Layout) -> list[str]:
    """Paths of ``snap``'s files whose stored index entry is trusted (its path, size and row
    count match the log) but does not hold the file's rows' fingerprints: a file replaced in
    place, outside Delta's contract, or a damaged entry. Tasks read each file and its entry."""
    schema = StructType([StructField("path", StringType(), False)])
    found = file_frame(spark, snap.files).mapInArrow(
        _EntryChecker(index, layout.arrow, snap.partition_by), schema
    )
    # Bounded: some of the paths of the file list, which the driver holds already.
    return sorted(r["path"] for r in to_arrow(found).to_pylist())


@dataclass(frozen=True)
class _EntryChecker:
    """Runs in a Spark task: the files whose trusted entry differs from their rows."""

    index: StoredIndex
    schema: pa.Schema
    partition_by: tuple[str, ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        bad = []
        for _, file in task_files(batches):
            with in_task(f"checking the index entry of {file.path}"):
                entry = self.index.get(file)
                if entry is None:
                    continue  # no trusted entry: the sink computes one when it needs it
                a, b = fingerprints(self.index.store.read(file, self.schema, self.partition_by))
                if not (np.array_equal(a, entry.a) and np.array_equal(b, entry.b)):
                    bad.append(file.path)
        yield pa.RecordBatch.from_arrays([pa.array(bad, pa.string())], names=["path"])


@dataclass(frozen=True)
class _IndexReader:
    """Runs in a Spark task: each file's index entry, as rows."""

    index: StoredIndex
    schema: pa.Schema
    partition_by: tuple[str, ...]
    buckets: np.ndarray | None = None
    """A mask over the sketch's buckets: only their rows (None: every row)."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for row, file in task_files(batches):
            with in_task(f"indexing {file.path}"):
                entry, _ = self.index.load(file, self.schema, self.partition_by)
            if self.buckets is None:
                pos = np.arange(len(entry), dtype=np.int64)
            else:
                pos = np.flatnonzero(self.buckets[_buckets_of(entry.a, _bits_of(self.buckets))])
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(np.full(len(pos), row[FILE_NO], dtype=np.int64)),
                    pa.array(pos.astype(np.int64)),
                    pa.array(entry.a[pos]),
                    pa.array(entry.b[pos]),
                ],
                schema=_PERSISTED_ARROW,
            )


@dataclass
class SparkCorrection:
    """desired - persisted, held by Spark (see the module doc)."""

    inserts: DataFrame
    """The desired rows to insert (the table's columns, then their fingerprints)."""
    rewrites: TaskRewrites
    inserted: int
    retracted: int
    held: list[DataFrame]
    """What the correction cached (the groups whose counts differ, the persisted rows of the
    changed buckets): unpersisted when done."""

    def close(self) -> None:
        release(*self.held)


def correction(
    spark: Any,
    desired: DataFrame,
    snap: Snapshot,
    index: StoredIndex,
    layout: Layout,
    max_rows_per_file: int,
    limit: ResultLimit | None = None,
) -> SparkCorrection:
    """The correction of ``desired`` (``with_fingerprints``) against the stored index of
    ``snap``'s files. Two Spark jobs (the sketch, then the counts) settle it; the rest is lazy.
    Nothing it brings to the driver passes its result ``limit`` (by default the session's)."""
    limit = limit or ResultLimit.of(spark)
    buckets = changed_buckets(spark, desired, snap, index, layout, sketch_bits(snap, limit))
    if not buckets.any():
        nothing = file_frame(spark, []).select(FILE_NO)
        return SparkCorrection(desired.limit(0), TaskRewrites(nothing, snap.files, 0), 0, 0, [])
    held: list[DataFrame] = []
    try:
        return _exact(spark, desired, snap, index, layout, max_rows_per_file, buckets, held, limit)
    except BaseException:
        release(*held)
        raise


def _in_buckets(
    spark: Any,
    desired: DataFrame,
    snap: Snapshot,
    index: StoredIndex,
    layout: Layout,
    buckets: np.ndarray,
    held: list[DataFrame],
) -> tuple[DataFrame, DataFrame]:
    """Desired's and persisted's rows in the changed ``buckets`` (all rows, when most buckets
    changed); a persisted share it caches goes into ``held``."""
    if buckets.mean() > 0.5:  # a filter that keeps most rows costs more than it saves
        return desired, persisted_rows(spark, snap, index, layout)
    # Kept for the epoch: a small share of the table, read twice (the counts, the retractions).
    persisted = persisted_rows(spark, snap, index, layout, buckets).persist(KEEP)
    held.append(persisted)
    numbers = pa.table({_BUCKET: pa.array(np.flatnonzero(buckets).astype(np.int64))})
    # Bounded: fewer numbers than the sketch's buckets, which ``sketch_bits`` fits.
    keep = F.broadcast(from_arrow(spark, numbers, f"{_BUCKET} long"))
    desired = desired.join(keep, _bucket(F.col(FP_A), _bits_of(buckets)) == keep[_BUCKET], "left_semi")
    return desired, persisted


def _exact(
    spark: Any,
    desired: DataFrame,
    snap: Snapshot,
    index: StoredIndex,
    layout: Layout,
    max_rows_per_file: int,
    buckets: np.ndarray,
    held: list[DataFrame],
    limit: ResultLimit,
) -> SparkCorrection:
    """Step 4 over the rows of the changed ``buckets``; what it caches goes into ``held``."""
    desired, persisted = _in_buckets(spark, desired, snap, index, layout, buckets, held)
    fp = [FP_A, FP_B]
    one, zero = F.lit(1).cast("long"), F.lit(0).cast("long")
    counted = (
        desired.select(*fp, one.alias(_D), zero.alias(_P))
        .unionByName(persisted.select(*fp, zero.alias(_D), one.alias(_P)))
        .groupBy(*fp)
        .agg(F.sum(_D).alias(_D), F.sum(_P).alias(_P))
        .where(F.col(_D) != F.col(_P))
    )
    groups = counted.persist(KEEP)
    held.append(groups)
    totals = groups.agg(
        F.sum(F.greatest(F.col(_D) - F.col(_P), F.lit(0))).alias("inserted"),
        F.sum(F.greatest(F.col(_P) - F.col(_D), F.lit(0))).alias("retracted"),
    ).first()  # bounded: one row
    assert totals is not None
    inserted, retracted = int(totals["inserted"] or 0), int(totals["retracted"] or 0)

    # Few changed groups (a steady view): broadcast them, so neither side is shuffled again.
    # There are at most as many as rows inserted and retracted: (a, b, d, p) each.
    changed = limit.small_side(groups, inserted + retracted, long_row_bytes(4), most=BROADCAST_GROUPS)

    # Retract the persisted copies beyond the earliest d, by file order then position.
    by_position = Window.partitionBy(*fp).orderBy(FILE_NO, POS)
    retract = (
        persisted.join(changed.where(F.col(_P) > F.col(_D)), fp)
        .withColumn(_RN, F.row_number().over(by_position))
        .where(F.col(_RN) > F.col(_D))
    )
    drops = retract.groupBy(FILE_NO).agg(F.array_sort(F.collect_list(POS)).alias("drop"))
    rewrites = drops.join(_file_side(spark, snap, limit), FILE_NO)

    # Insert d - p of the desired copies (equal rows: which copies does not matter).
    any_copy = Window.partitionBy(*fp).orderBy(FP_A)
    inserts = (
        desired.join(changed.where(F.col(_D) > F.col(_P)), fp)
        .withColumn(_RN, F.row_number().over(any_copy))
        .where(F.col(_RN) <= F.col(_D) - F.col(_P))
        .select(*[F.col(quote(c)) for c in (*layout.struct.names, *fp)])
    )
    # About a file's worth of rows per write task, not one small file per shuffle partition.
    inserts = inserts.repartition(max(1, -(-inserted // max_rows_per_file)))
    if inserted < 0 or retracted < 0:
        raise InvariantViolation(f"a correction of {inserted} inserts and {retracted} retractions")
    return SparkCorrection(inserts, TaskRewrites(rewrites, snap.files, retracted), inserted, retracted, held)
