"""The write step: stage one correction as Parquet files that no Delta version references yet.

One Spark job writes, in one go, the inserted rows and the kept rows of every file that holds a
retracted row (copy-on-write); in complete mode a second job reads the staged files'
fingerprints back for the index. Files are staged in a fresh folder
``mvsink-<view>-e<epoch>-<id>`` under the table root (Hive-style partition folders below it):
never a ``_`` or ``.`` folder, which vacuum would not look into once the files are removed.
Nothing here is visible until the commit; ``discard_folder`` deletes a failed attempt's files.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from mvsink.correction import I64, Correction
from mvsink.delta import DataFile, NewFile
from mvsink.errors import InvariantViolation, Where
from mvsink.files import FILE, POS, LocalFile, read_files
from mvsink.fingerprint import FP_A, FP_B, quote
from mvsink.index import FileEntry, fingerprint_files
from mvsink.stats import file_stats

# Spark SQL settings every staged file needs: INT96 timestamps carry no statistics and map to
# the wrong Delta type.
_WRITE_CONF = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.compression.codec": "snappy",
}
# Above this many rows a driver-built table is joined as Spark sees fit, not broadcast.
BROADCAST_ROWS = 1_000_000
# How Spark names the folder of a null (or empty string) partition value.
_NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


@dataclass(frozen=True)
class Rewrite:
    """A file holding retracted rows: it is replaced by a copy without the rows at ``drop``."""

    file: DataFile
    local: str
    rows: int
    drop: I64
    """Positions (row indices) to drop, sorted."""


@dataclass(frozen=True)
class Staged:
    """The files one attempt staged, and the snapshot files they replace."""

    folder: str | None
    adds: tuple[NewFile, ...]
    entries: tuple[FileEntry, ...]
    """Fingerprints of each added file (empty when not asked for)."""
    removes: tuple[DataFile, ...]
    inserted: int
    retracted: int

    @property
    def bytes_written(self) -> int:
        return sum(f.size for f in self.adds)


NOTHING = Staged(None, (), (), (), 0, 0)


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


def keys_frame(spark: SparkSession, **columns: np.ndarray | pa.Array) -> DataFrame:
    """A table from driver arrays (Arrow: tuples would cost seconds), broadcast when small."""
    table = pa.table({k: pa.array(v) for k, v in columns.items()})
    frame = spark.createDataFrame(table)
    return F.broadcast(frame) if table.num_rows <= BROADCAST_ROWS else frame


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
        keys = keys_frame(spark, **{FP_A: corr.whole_a, FP_B: corr.whole_b})
        parts.append(desired.join(keys, [FP_A, FP_B], "left_semi").select(*cols))
    if len(corr.part_a):
        # Desired holds d identical copies of such a row and persisted p < d: add d - p.
        keys = keys_frame(spark, **{FP_A: corr.part_a, FP_B: corr.part_b, "__n": corr.part_n})
        one = desired.join(keys, [FP_A, FP_B], "inner").dropDuplicates([FP_A, FP_B])
        copies = F.explode(F.array_repeat(F.lit(True), F.col("__n").cast("int")))
        parts.append(one.withColumn("__copy", copies).select(*cols))
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def kept_rows(
    spark: SparkSession, schema: StructType, partition_by: Sequence[str], rewrites: Sequence[Rewrite]
) -> DataFrame | None:
    """The rows of every rewritten file, without the retracted positions."""
    if not rewrites:
        return None
    numbers = np.repeat(np.arange(len(rewrites), dtype=np.int32), [len(r.drop) for r in rewrites])
    drops = keys_frame(spark, **{FILE: numbers, POS: np.concatenate([r.drop for r in rewrites])})
    files = [LocalFile(r.local, r.file.partition_values) for r in rewrites]
    rows = read_files(spark, schema, partition_by, files)
    return rows.join(drops, [FILE, POS], "left_anti").select(*[F.col(quote(c)) for c in schema.names])


def stage(
    spark: SparkSession,
    *,
    inserts: DataFrame | None,
    inserted: int | None,
    rewrites: Sequence[Rewrite],
    root: str,
    schema: StructType,
    partition_by: Sequence[str],
    view: str,
    epoch: int,
    max_rows_per_file: int,
    cluster_by: Sequence[str],
    expected: tuple[I64, I64] | None,
    where: Where,
) -> Staged:
    """Write inserts and rewrites as new files; nothing becomes visible (see the module doc).

    ``inserted`` is the number of rows ``inserts`` holds, checked against what was written;
    None when it is not known in advance (append mode), and then not checked. ``expected``
    (complete mode): the fingerprints the staged rows must have, as a multiset (kept rows of
    rewritten files plus inserted rows); the staged files are then fingerprinted, checked
    against it, and their entries returned for the index.
    """
    retracted = sum(len(r.drop) for r in rewrites)
    if inserts is None and not rewrites:
        return NOTHING
    if inserts is not None:
        keys = [F.col(quote(c)) for c in cluster_by]
        if keys and inserted is None:
            inserts = inserts.sortWithinPartitions(*keys)
        elif keys:
            n_files = max(1, math.ceil((inserted or 1) / max_rows_per_file))
            # One file needs no range bounds (whose sampling is a Spark job of its own).
            spread = inserts.repartition(1) if n_files == 1 else inserts.repartitionByRange(n_files, *keys)
            inserts = spread.sortWithinPartitions(*keys)
        elif inserted is not None:
            # A shuffle of the inserted rows only; coalesce would pull the whole upstream plan
            # (a semi-join over all of desired) into as few tasks as files.
            inserts = inserts.repartition(max(1, math.ceil(inserted / max_rows_per_file)))
    kept = kept_rows(spark, schema, partition_by, rewrites)
    frames = [f for f in (kept, inserts) if f is not None]
    out = frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])

    folder = os.path.join(root, f"mvsink-{view}-e{epoch}-{uuid.uuid4().hex[:12]}")
    try:
        with _session_conf(spark, _WRITE_CONF):
            writer = (
                out.write.mode("errorifexists")
                .option("maxRecordsPerFile", max_rows_per_file)
                .option("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
            )
            if partition_by:
                writer = writer.partitionBy(*partition_by)
            writer.parquet(folder)
        local = _data_files(folder)
        adds: list[NewFile] = []
        paths: list[str] = []
        for path in local:
            n, stats = file_stats(path)
            if n == 0:
                os.remove(path)
                continue
            rel = os.path.relpath(path, root)
            adds.append(NewFile(rel, os.path.getsize(path), n, stats, _partition_values(rel, partition_by)))
            paths.append(path)
        entries: tuple[FileEntry, ...] = ()
        if expected is not None:
            located = [LocalFile(p, a.partition_values) for p, a in zip(paths, adds, strict=True)]
            entries = tuple(fingerprint_files(spark, schema, partition_by, located, where))
        kept_count = sum(r.rows for r in rewrites) - retracted
        written = sum(f.num_records for f in adds)
        needed = None if inserted is None else kept_count + inserted
        if (needed is not None and written != needed) or written < kept_count:
            raise InvariantViolation(
                f"staged {written} rows where the correction needs {needed} "
                f"({kept_count} kept from rewritten files + {inserted} inserted)",
                where,
            )
        if any(len(e) != f.num_records for e, f in zip(entries, adds, strict=False)):
            raise InvariantViolation("staged files read back with other row counts", where)
        if expected is not None:
            _check_content(entries, expected, where)
    except BaseException:
        discard_folder(folder)
        raise
    removes = tuple(r.file for r in rewrites)
    return Staged(folder, tuple(adds), entries, removes, written - kept_count, retracted)


def _check_content(entries: Sequence[FileEntry], expected: tuple[I64, I64], where: Where) -> None:
    """Staged rows must be exactly the expected multiset; equal counts are not enough (desired
    evaluated twice may yield other rows of the same number)."""
    z = np.zeros(0, dtype=np.int64)
    got = (np.concatenate([z, *[e.a for e in entries]]), np.concatenate([z, *[e.b for e in entries]]))
    if len(got[0]) == len(expected[0]):
        g, w = np.lexsort((got[1], got[0])), np.lexsort((expected[1], expected[0]))
        if np.array_equal(got[0][g], expected[0][w]) and np.array_equal(got[1][g], expected[1][w]):
            return
    raise InvariantViolation(
        "the staged rows differ from the correction (kept rows of rewritten files plus inserted "
        "rows) although the counts may agree: desired changed between its evaluations. Make "
        "desired deterministic, or leave cache_desired on. Nothing was committed.",
        where,
    )


def _partition_values(rel: str, partition_by: Sequence[str]) -> Mapping[str, str | None]:
    """Partition values from the Hive-style folders Spark wrote (``col=escaped``)."""
    if not partition_by:
        return {}
    found: dict[str, str | None] = {}
    for part in rel.split(os.sep)[:-1]:
        escaped, eq, raw = part.partition("=")
        name = unquote(escaped)  # Spark escapes the column name as it escapes the value
        if eq and name in partition_by:
            found[name] = None if raw == _NULL_PARTITION else unquote(raw)
    if set(found) != set(partition_by):
        raise InvariantViolation(f"staged file {rel} is not under one folder per partition column")
    return found


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


def discard_folder(folder: str | None) -> None:
    """Delete one attempt's staged files (they are referenced by no version)."""
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
