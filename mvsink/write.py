"""The write step: stage one correction as Parquet files that no Delta version references yet.

One Spark job writes, in one go, the inserted rows and the kept rows of every file that holds a
retracted row (copy-on-write); a second reads the staged files' fingerprints back for the index.
Files are staged in a fresh folder ``mvsink-<view>-e<epoch>-<id>`` under the table root: never a
``_`` or ``.`` folder, which vacuum would not look into once the files are removed again.
Nothing here is visible until ``append`` commits it; ``discard`` deletes a failed attempt's files.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from mvsink.correction import Correction
from mvsink.delta import DataFile, NewFile, Snapshot
from mvsink.errors import InvariantViolation, Where
from mvsink.fingerprint import FP_A, FP_B, quote
from mvsink.index import FileEntry, PersistedIndex, fingerprint_files, read_rows
from mvsink.stats import file_stats

# Spark SQL settings every staged file needs: INT96 timestamps carry no statistics and map to
# the wrong Delta type; a _SUCCESS marker would be an unreferenced file in the table.
_WRITE_CONF = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.compression.codec": "snappy",
}


@dataclass(frozen=True)
class Staged:
    """The files one attempt staged, and the snapshot files they replace."""

    folder: str | None
    adds: tuple[NewFile, ...]
    entries: tuple[FileEntry, ...]
    removes: tuple[DataFile, ...]
    inserted: int
    retracted: int

    @property
    def bytes_written(self) -> int:
        return sum(f.size for f in self.adds)


@contextlib.contextmanager
def _session_conf(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    saved: dict[str, str | None] = {k: spark.conf.get(k, None) for k in settings}
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, old in saved.items():
            if old is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, old)


def _keys_frame(spark: SparkSession, **columns: np.ndarray) -> DataFrame:
    # Arrow keeps this cheap: tuples through createDataFrame cost seconds for 10K rows.
    return F.broadcast(spark.createDataFrame(pa.table({k: pa.array(v) for k, v in columns.items()})))


def inserted_rows(
    spark: SparkSession, desired: DataFrame, corr: Correction, columns: Sequence[str]
) -> DataFrame | None:
    """The rows the correction inserts, from desired (which carries the fingerprint columns)."""
    cols = [F.col(quote(c)) for c in columns]
    if corr.inserted == 0:
        return None
    if corr.inserts_all_desired:
        return desired.select(*cols)
    parts: list[DataFrame] = []
    if len(corr.whole_a):
        keys = _keys_frame(spark, **{FP_A: corr.whole_a, FP_B: corr.whole_b})
        parts.append(desired.join(keys, [FP_A, FP_B], "left_semi").select(*cols))
    if len(corr.part_a):
        # Desired holds d identical copies of such a row and persisted p < d: add d - p.
        keys = _keys_frame(spark, **{FP_A: corr.part_a, FP_B: corr.part_b, "__n": corr.part_n})
        one = desired.join(keys, [FP_A, FP_B], "inner").dropDuplicates([FP_A, FP_B])
        parts.append(
            one.withColumn("__copy", F.explode(F.array_repeat(F.lit(True), F.col("__n").cast("int")))).select(
                *cols
            )
        )
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def kept_rows(
    spark: SparkSession,
    schema: StructType,
    snap: Snapshot,
    rewrite: dict[int, np.ndarray],
    index: PersistedIndex,
) -> DataFrame | None:
    """The rows of every file holding a retracted row, without the retracted positions."""
    if not rewrite:
        return None
    files = [snap.files[k] for k in sorted(rewrite)]
    uris, positions = [], []
    for k in sorted(rewrite):
        uri = index.entry(snap.files[k].path).uri
        uris.append(np.full(len(rewrite[k]), uri, dtype=object))
        positions.append(rewrite[k])
    drops = _keys_frame(spark, __f=np.concatenate(uris).astype(str), __i=np.concatenate(positions))
    meta = F.col("_metadata")
    rows = read_rows(spark, schema, [f.local_path(snap.root) for f in files]).select(
        "*", meta.getField("file_path").alias("__f"), meta.getField("row_index").alias("__i")
    )
    return rows.join(drops, ["__f", "__i"], "left_anti").select(*[F.col(quote(c)) for c in schema.names])


def stage(
    spark: SparkSession,
    *,
    desired: DataFrame,
    corr: Correction,
    snap: Snapshot,
    index: PersistedIndex,
    schema: StructType,
    view: str,
    epoch: int,
    max_rows_per_file: int,
    cluster_by: Sequence[str],
    where: Where,
) -> Staged:
    """Write the correction's files; nothing becomes visible (see the module doc)."""
    rewrite = corr.retracted_positions()
    removes = tuple(snap.files[k] for k in sorted(rewrite))
    if corr.is_empty:
        return Staged(None, (), (), (), 0, 0)
    inserts = inserted_rows(spark, desired, corr, schema.names)
    if inserts is not None:
        n_files = max(1, math.ceil(corr.inserted / max_rows_per_file))
        if cluster_by:
            keys = [F.col(quote(c)) for c in cluster_by]
            inserts = inserts.repartitionByRange(n_files, *keys).sortWithinPartitions(*keys)
        else:
            inserts = inserts.coalesce(n_files)
    kept = kept_rows(spark, schema, snap, rewrite, index)
    frames = [f for f in (kept, inserts) if f is not None]
    out = frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])

    folder = os.path.join(snap.root, f"mvsink-{view}-e{epoch}-{uuid.uuid4().hex[:12]}")
    try:
        with _session_conf(spark, _WRITE_CONF):
            (
                out.write.mode("errorifexists")
                .option("maxRecordsPerFile", max_rows_per_file)
                .option("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
                .parquet(folder)
            )
        local = _data_files(folder)
        entries = fingerprint_files(spark, schema, local, where)
        adds, kept_entries = [], []
        for path in local:
            n, stats = file_stats(path)
            if n == 0:
                os.remove(path)
                continue
            rel = os.path.relpath(path, snap.root)
            adds.append(NewFile(rel, os.path.getsize(path), n, stats))
            kept_entries.append(entries[path])
    except BaseException:
        discard_folder(folder)
        raise
    staged = Staged(folder, tuple(adds), tuple(kept_entries), removes, corr.inserted, corr.retracted)
    _check_counts(staged, index, where)
    return staged


def _data_files(folder: str) -> list[str]:
    """The staged data files; Spark's side files (.crc, _SUCCESS) are deleted."""
    out = []
    for root, _dirs, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            if name.endswith(".parquet") and not name.startswith((".", "_")):
                out.append(path)
            else:
                os.remove(path)
    return sorted(out)


def _check_counts(staged: Staged, index: PersistedIndex, where: Where) -> None:
    """Rows staged = rows of rewritten files - retracted + inserted, or nothing is committed."""
    rewritten = sum(len(index.entry(f.path)) for f in staged.removes)
    expected = rewritten - staged.retracted + staged.inserted
    written = sum(f.num_records for f in staged.adds)
    if written != expected or any(
        len(e) != f.num_records for e, f in zip(staged.entries, staged.adds, strict=True)
    ):
        discard_folder(staged.folder)
        raise InvariantViolation(
            f"staged {written} rows where the correction needs {expected} "
            f"({rewritten} kept from rewritten files - {staged.retracted} + {staged.inserted})",
            where,
        )


def discard_folder(folder: str | None) -> None:
    """Delete one attempt's staged files (they are referenced by no version)."""
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
