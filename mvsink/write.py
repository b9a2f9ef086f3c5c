"""The write step: stage one plan as Parquet files that no Delta version references yet.

A ``Plan`` (what a mode decided) is rows to insert and files to rewrite without some rows.
Rows to insert are either an Arrow table already on the driver, or a Spark DataFrame that is
never collected (an initial load, an append): Spark tasks then write it through the same
``Store.write`` (``mapInArrow``), and only each file's add action (and, when the index wants
them, its fingerprints) comes back. A rewritten file's kept rows are written from the copy
read for planning. Files are staged in a fresh folder ``mvsink-<view>-e<epoch>-<id>`` under
the table root: never a ``_`` or ``.`` folder, which vacuum would not look into once the files
are removed. Nothing here is visible until the commit; ``Store.delete_folder`` removes a failed
attempt's files.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from mvsink.correction import I64
from mvsink.delta import DataFile, NewFile
from mvsink.errors import InputError, InvariantViolation, Where
from mvsink.fingerprint import fingerprints, quote
from mvsink.index import FileEntry
from mvsink.schema import arrow_schema
from mvsink.storage import Store, Written

# Threads moving files on the driver (object stores are latency-bound).
IO_THREADS = 8
# A Spark write task writes a file once it holds this many bytes, whatever max_rows_per_file.
TASK_BUFFER_BYTES = 256 << 20
# Marks an mvsink input error raised inside a Spark task, so the driver can raise it as one.
_TASK_INPUT_ERROR = "mvsink-input-error: "


@dataclass(frozen=True)
class Layout:
    """The target's shape as an epoch writes it: Delta schema JSON, Spark and Arrow schemas,
    partition columns."""

    schema_json: str
    struct: StructType
    partition_by: tuple[str, ...]

    @functools.cached_property
    def arrow(self) -> pa.Schema:
        return arrow_schema(self.struct)


@dataclass(frozen=True)
class Rewrite:
    """A file holding retracted rows: it is replaced by a copy without the rows at ``drop``."""

    file: DataFile
    rows: pa.Table | None
    """The file's rows if read for planning (the table's columns); None: read when staging."""
    drop: I64
    """Positions (row indices) to drop, sorted."""
    fps: tuple[I64, I64] | None = None
    """The rows' fingerprints (complete mode), so the kept rows' need no hashing."""

    @property
    def size(self) -> int | None:
        """Rows in the file, if known without reading it."""
        if self.rows is not None:
            return int(self.rows.num_rows)
        if self.fps is not None:
            return len(self.fps[0])
        return self.file.num_records


@dataclass(frozen=True)
class Plan:
    """Rows to insert (``inserted`` of them; None: not known before writing) and rewrites."""

    inserts: pa.Table | DataFrame | None
    inserted: int | None
    rewrites: tuple[Rewrite, ...] = ()
    insert_fps: tuple[I64, I64] | None = None
    """Fingerprints of a driver-held ``inserts``, when the staged files are to be indexed."""
    indexed: bool = False
    """Whether the staged files' fingerprints are wanted (complete mode keeps an index)."""
    files_read: int = 0
    """Data files of the snapshot read to make this plan."""

    @property
    def retracted(self) -> int:
        return sum(len(r.drop) for r in self.rewrites)


@dataclass(frozen=True)
class Staged:
    """The files one attempt staged, and the snapshot files they replace."""

    folder: str | None
    adds: tuple[NewFile, ...]
    entries: tuple[FileEntry, ...]
    """Fingerprints of each added file (empty when the plan is not indexed)."""
    removes: tuple[DataFile, ...]
    inserted: int
    retracted: int

    @property
    def bytes_written(self) -> int:
        return sum(f.size for f in self.adds)


NOTHING = Staged(None, (), (), (), 0, 0)


def stage(
    plan: Plan,
    store: Store,
    layout: Layout,
    *,
    view: str,
    epoch: int,
    max_rows_per_file: int,
    cluster_by: Sequence[str],
    where: Where,
) -> Staged:
    """Write ``plan``'s inserts and rewrites as new files; nothing becomes visible."""
    if plan.inserts is None and not plan.rewrites:
        return NOTHING
    folder = f"mvsink-{view}-e{epoch}-{uuid.uuid4().hex[:12]}"
    parts = layout.partition_by
    try:
        written: list[Written] = []
        with ThreadPoolExecutor(IO_THREADS) as pool:
            jobs = [
                pool.submit(_write_kept, store, folder, r, layout, max_rows_per_file, where)
                for r in plan.rewrites
            ]
            if isinstance(plan.inserts, pa.Table):
                rows, fps = _clustered(plan.inserts, plan.insert_fps, cluster_by)
                written += store.write(folder, rows, parts, max_rows_per_file, fps)
            elif plan.inserts is not None:
                written += write_frame(
                    plan.inserts,
                    store,
                    folder,
                    layout,
                    max_rows_per_file=max_rows_per_file,
                    cluster_by=cluster_by,
                    indexed=plan.indexed,
                    where=where,
                )
            kept = 0
            for job in jobs:
                n, files = job.result()
                kept += n
                written += files
        written = [w for w in written if w.file.num_records > 0]
        total = sum(w.file.num_records for w in written)
        needed = None if plan.inserted is None else kept + plan.inserted
        if (needed is not None and total != needed) or total < kept:
            raise InvariantViolation(
                f"staged {total} rows where the plan needs {needed} "
                f"({kept} kept from rewritten files + {plan.inserted} inserted)",
                where,
            )
        entries: tuple[FileEntry, ...] = ()
        if plan.indexed:
            if any(w.fp_a is None or w.fp_b is None for w in written):
                raise InvariantViolation("a staged file came back without its fingerprints", where)
            entries = tuple(FileEntry(w.fp_a, w.fp_b) for w in written)  # type: ignore[arg-type]
    except InputError as exc:
        store.delete_folder(folder)
        if str(exc.where):
            raise
        raise InputError(exc.message, where) from None
    except BaseException:
        store.delete_folder(folder)
        raise
    return Staged(
        folder,
        tuple(w.file for w in written),
        entries,
        tuple(r.file for r in plan.rewrites),
        total - kept,
        plan.retracted,
    )


def _clustered(
    rows: pa.Table, fps: tuple[I64, I64] | None, cluster_by: Sequence[str]
) -> tuple[pa.Table, tuple[I64, I64] | None]:
    """Rows (and their fingerprints) sorted by ``cluster_by``, so rows that change together
    share few files."""
    if not cluster_by or rows.num_rows < 2:
        return rows, fps
    order = pa.compute.sort_indices(rows, [(c, "ascending") for c in cluster_by]).to_numpy()
    return rows.take(order), None if fps is None else (fps[0][order], fps[1][order])


def _write_kept(
    store: Store, folder: str, rewrite: Rewrite, layout: Layout, max_rows_per_file: int, where: Where
) -> tuple[int, list[Written]]:
    """Write a rewritten file's kept rows; returns how many rows it kept. The file is read here
    unless planning read it, and released once written (one file per thread at a time); a
    file whose every row goes is not read at all."""
    drop = rewrite.drop
    if len(drop) and (drop[0] < 0 or (len(drop) > 1 and not bool(np.all(drop[1:] > drop[:-1])))):
        raise InvariantViolation(
            f"positions to drop from {rewrite.file.path} are not distinct and sorted", where
        )
    if rewrite.size is not None and len(drop) == rewrite.size:
        return 0, []
    rows = rewrite.rows
    if rows is None:
        rows = store.read(rewrite.file, layout.arrow, layout.partition_by)
        if rewrite.size is not None and rows.num_rows != rewrite.size:
            raise InvariantViolation(
                f"{rewrite.file.path} read back with {rows.num_rows} rows, indexed with {rewrite.size}",
                where,
            )
    keep = np.ones(rows.num_rows, dtype=bool)
    keep[rewrite.drop] = False
    if not keep.any():
        return 0, []
    kept = rows.filter(pa.array(keep))
    fps = None if rewrite.fps is None else (rewrite.fps[0][keep], rewrite.fps[1][keep])
    return kept.num_rows, store.write(folder, kept, layout.partition_by, max_rows_per_file, fps)


# --- Spark tasks -----------------------------------------------------------------------------

_FILES = "path string, size long, rows long, stats string, partition_values string, fp_a binary, fp_b binary"


def write_frame(
    frame: DataFrame,
    store: Store,
    folder: str,
    layout: Layout,
    *,
    max_rows_per_file: int,
    cluster_by: Sequence[str],
    indexed: bool,
    where: Where,
) -> list[Written]:
    """Write a DataFrame's rows from Spark tasks, never collecting them: each task writes its
    rows through ``Store.write`` and returns one row per file."""
    rows = frame.select(*[F.col(quote(c)) for c in layout.struct.names])
    order = [F.col(quote(c)) for c in (*layout.partition_by, *cluster_by)]
    if order:
        rows = rows.sortWithinPartitions(*order)
    task = _TaskWriter(store, folder, layout.arrow, layout.partition_by, max_rows_per_file, indexed)
    try:
        table = rows.mapInArrow(task, _FILES).toArrow()
    except Exception as exc:
        text = str(exc)
        if _TASK_INPUT_ERROR in text:
            message = text.split(_TASK_INPUT_ERROR, 1)[1].splitlines()[0]
            raise InputError(message, where) from None
        raise
    out = []
    for r in table.to_pylist():
        new = NewFile(r["path"], r["size"], r["rows"], r["stats"], json.loads(r["partition_values"]))
        fa = None if r["fp_a"] is None else np.frombuffer(r["fp_a"], dtype=np.int64)
        fb = None if r["fp_b"] is None else np.frombuffer(r["fp_b"], dtype=np.int64)
        out.append(Written(new, fa, fb))
    return out


_FILES_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("size", pa.int64()),
        ("rows", pa.int64()),
        ("stats", pa.string()),
        ("partition_values", pa.string()),
        ("fp_a", pa.binary()),
        ("fp_b", pa.binary()),
    ]
)


@dataclass(frozen=True)
class _TaskWriter:
    """Runs in a Spark task (picklable): buffer up to a file's worth of rows, write them with
    ``Store.write``, report the files (``_FILES``)."""

    store: Store
    folder: str
    schema: pa.Schema
    partition_by: tuple[str, ...]
    max_rows_per_file: int
    indexed: bool

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        buffer: list[pa.RecordBatch] = []
        held = size = 0
        for batch in batches:
            buffer.append(batch)
            held += batch.num_rows
            size += batch.nbytes
            if held >= self.max_rows_per_file or size >= TASK_BUFFER_BYTES:
                yield self._flush(buffer)
                buffer, held, size = [], 0, 0
        if held:
            yield self._flush(buffer)

    def _flush(self, buffer: list[pa.RecordBatch]) -> pa.RecordBatch:
        rows = pa.Table.from_batches(buffer).cast(self.schema)
        fps = fingerprints(rows) if self.indexed else None
        try:
            written = self.store.write(self.folder, rows, self.partition_by, self.max_rows_per_file, fps)
        except InputError as exc:
            raise ValueError(_TASK_INPUT_ERROR + exc.message) from None
        return pa.RecordBatch.from_pylist(
            [
                {
                    "path": w.file.path,
                    "size": w.file.size,
                    "rows": w.file.num_records,
                    "stats": w.file.stats,
                    "partition_values": json.dumps(dict(w.file.partition_values)),
                    "fp_a": None if w.fp_a is None else w.fp_a.tobytes(),
                    "fp_b": None if w.fp_b is None else w.fp_b.tobytes(),
                }
                for w in written
            ],
            schema=_FILES_SCHEMA,
        )
