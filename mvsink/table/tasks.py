"""Spark tasks that write and rewrite files, and how their errors reach the driver.

Rows to insert that are a Spark DataFrame (an initial load, an append, a large correction) are
never collected: Spark tasks write them through the same ``Store.write`` (``mapInArrow``,
``write_frame``), and only each file's add action (and, when the index wants them, its
fingerprints) comes back. Files to rewrite that Spark decided (``TaskRewrites``) are rewritten
by tasks too (``rewrite_frame``). A snapshot's files reach tasks as a DataFrame of their add
actions (``file_frame``, ``task_files``).

A task cannot raise mvsink's errors through Spark: ``in_task`` marks them in a plain error's
message, which ``raise_task_errors`` turns back into the error on the driver.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from mvsink import failpoints
from mvsink.compat import from_arrow, map_in_arrow, to_arrow
from mvsink.errors import InputError, InvariantViolation, MVSinkError, StorageError, Where, first_line
from mvsink.table.change_feed import split_changes, with_change_type
from mvsink.table.delta import DataFile, NewFile
from mvsink.table.fingerprint import FP_A, FP_B, fingerprints, quote
from mvsink.table.index import FileEntry, StoredIndex
from mvsink.table.layout import Layout
from mvsink.table.plan import Rewrite, TaskRewrites
from mvsink.table.rewrite import Kept, write_kept
from mvsink.table.storage import Store, Written

RULE = "__mvsink_rule"
"""A column of a frame ``write_frame`` writes: the first rule its row breaks, or null
(``plan/rules.py`` makes it). A task that holds a row breaking one fails the attempt instead
of writing it, so the rows written are rows checked, whatever Spark evaluates again."""
# A Spark write task writes a file once it holds this many bytes, whatever max_rows_per_file.
TASK_BUFFER_BYTES = 256 << 20
# Marks an mvsink error raised inside a Spark task, so the driver can raise it as one:
# "mvsink-task-error: <class>: <message>".
_TASK_ERROR = "mvsink-task-error: "
_TASK_ERRORS: dict[str, type[MVSinkError]] = {
    "InputError": InputError,
    "InvariantViolation": InvariantViolation,
    "StorageError": StorageError,
}


@contextlib.contextmanager
def in_task(what: str) -> Iterator[None]:
    """Wraps the body of a Spark task: an mvsink error, or a storage error naming ``what``, is
    raised as a marked plain error that ``raise_task_errors`` turns back on the driver (a task
    cannot raise mvsink's errors through Spark)."""
    try:
        yield
    except MVSinkError as exc:
        kind = type(exc).__name__ if type(exc).__name__ in _TASK_ERRORS else "InvariantViolation"
        raise ValueError(f"{_TASK_ERROR}{kind}: {exc.message}") from None
    except OSError as exc:
        text = first_line(exc)
        raise ValueError(f"{_TASK_ERROR}StorageError: {what}: {text}") from None


_FILES = (
    "source long, path string, size long, rows long, stats string, partition_values string, "
    "deletion_vector string"
)
"""A task's report of the files it wrote, one row each; a row with a ``deletion_vector`` is a
snapshot file added again with that vector (``Kept.update``)."""
_FILES_SCHEMA = pa.schema(
    [
        ("source", pa.int64()),
        ("path", pa.string()),
        ("size", pa.int64()),
        ("rows", pa.int64()),
        ("stats", pa.string()),
        ("partition_values", pa.string()),
        ("deletion_vector", pa.string()),
    ]
)
FILE_COLUMNS = (
    "file_no long, path string, size long, rows long, partition_values string, deletion_vector string"
)
"""A snapshot's files as a Spark DataFrame (``file_frame``): what a task needs to read one."""


def file_frame(spark: Any, files: Sequence[DataFile], numbers: Sequence[int] | None = None) -> DataFrame:
    """``files`` (or those at ``numbers``) as a DataFrame of ``FILE_COLUMNS``, ``file_no``
    indexing into ``files``: tasks rebuild each ``DataFile`` from its row (``task_file``)."""
    picked = range(len(files)) if numbers is None else numbers
    table = pa.table(
        {
            "file_no": pa.array(list(picked), pa.int64()),
            "path": pa.array([files[i].path for i in picked], pa.string()),
            "size": pa.array([files[i].size for i in picked], pa.int64()),
            "rows": pa.array([files[i].num_records for i in picked], pa.int64()),
            "partition_values": pa.array([json.dumps(dict(files[i].partition_values)) for i in picked]),
            "deletion_vector": pa.array([_vector_json(files[i]) for i in picked], pa.string()),
        }
    )
    frame: DataFrame = from_arrow(spark, table, FILE_COLUMNS)
    # Spread the files over tasks: a few files per task, at least one task per core.
    parallelism = max(2, int(spark.conf.get("spark.sql.shuffle.partitions", "2")))
    slices = max(1, min(len(picked), max(parallelism * 4, min(len(picked) // 8, parallelism * 64))))
    return frame.repartition(slices) if slices > 1 else frame


def _vector_json(file: DataFile) -> str | None:
    return None if not file.deletion_vector else json.dumps(dict(file.deletion_vector))


def task_file(row: dict[str, Any]) -> DataFile:
    """The ``DataFile`` a ``file_frame`` row describes."""
    vector = row.get("deletion_vector")
    return DataFile(
        row["path"],
        row["size"],
        row["rows"],
        json.loads(row["partition_values"]),
        json.loads(vector) if vector else None,
    )


def task_files(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[dict[str, Any], DataFile]]:
    """In a task over a ``file_frame``: each row, with the ``DataFile`` it describes."""
    for batch in batches:
        for row in batch.to_pylist():
            yield row, task_file(row)


def raise_task_errors(exc: Exception, where: Where) -> None:
    """Raise the mvsink error a Spark task failed with (``in_task``), if it did."""
    text = str(exc)
    if _TASK_ERROR in text:
        kind, _, message = text.split(_TASK_ERROR, 1)[1].splitlines()[0].partition(": ")
        raise _TASK_ERRORS.get(kind, InvariantViolation)(message, where) from None


def _written(table: pa.Table) -> list[tuple[int | None, Written | DataFile | None]]:
    """Tasks' reports (``_FILES``): per row, its source file number and the file written, or
    the source file added again with a deletion vector."""
    out: list[tuple[int | None, Written | DataFile | None]] = []
    for r in table.to_pylist():
        new: Written | DataFile | None = None
        if r["deletion_vector"] is not None:
            new = task_file(r)
        elif r["path"] is not None:
            new = Written(
                NewFile(r["path"], r["size"], r["rows"], r["stats"], json.loads(r["partition_values"]))
            )
        out.append((r["source"], new))
    return out


def write_frame(
    frame: DataFrame,
    store: Store,
    folder: str,
    layout: Layout,
    *,
    max_rows_per_file: int,
    cluster_by: Sequence[str],
    index: StoredIndex | None,
    where: Where,
    changes: str | None = None,
) -> list[Written]:
    """Write a DataFrame's rows from Spark tasks, never collecting them: each task writes its
    rows through ``Store.write`` (and their index entries: from the frame's ``FP_A``/``FP_B``
    columns where it has them, else hashed), and under ``changes`` their change file, and
    returns one row per file."""
    carried = index is not None and {FP_A, FP_B} <= set(frame.columns)
    ruled = RULE in frame.columns
    names = (*layout.struct.names, *((FP_A, FP_B) if carried else ()), *((RULE,) if ruled else ()))
    rows = frame.select(*[F.col(quote(c)) for c in names])
    order = [F.col(quote(c)) for c in (*layout.partition_by, *cluster_by)]
    if order:
        rows = rows.sortWithinPartitions(*order)
    task = _TaskWriter(
        store, folder, layout.arrow, layout.partition_by, max_rows_per_file, index, changes, carried, ruled
    )
    try:
        table = to_arrow(map_in_arrow(rows, task, _FILES))
    except Exception as exc:
        raise_task_errors(exc, where)
        raise
    return [w for _, w in _written(table) if isinstance(w, Written)]


def _report(
    written: Sequence[Written], source: int | None = None, update: DataFile | None = None
) -> pa.RecordBatch:
    rows = [
        {
            "source": source,
            "path": w.file.path,
            "size": w.file.size,
            "rows": w.file.num_records,
            "stats": w.file.stats,
            "partition_values": json.dumps(dict(w.file.partition_values)),
            "deletion_vector": None,
        }
        for w in written
    ]
    if update is not None:
        rows.append(
            {
                "source": source,
                "path": update.path,
                "size": update.size,
                "rows": update.num_records,
                "stats": None,
                "partition_values": json.dumps(dict(update.partition_values)),
                "deletion_vector": _vector_json(update),
            }
        )
    if not rows and source is not None:  # a rewritten file that keeps nothing: still reported
        rows = [dict.fromkeys(_FILES_SCHEMA.names, None) | {"source": source}]
    return pa.RecordBatch.from_pylist(rows, schema=_FILES_SCHEMA)


def _put_entries(index: StoredIndex | None, written: Sequence[Written]) -> None:
    if index is None:
        return
    for w in written:
        assert w.fp_a is not None and w.fp_b is not None
        index.put(w.file.path, w.file.size, FileEntry(w.fp_a, w.fp_b))


@dataclass(frozen=True)
class _TaskWriter:
    """Runs in a Spark task (picklable): buffer up to a file's worth of rows, write them with
    ``Store.write`` (and their index entries), report the files (``_FILES``)."""

    store: Store
    folder: str
    schema: pa.Schema
    partition_by: tuple[str, ...]
    max_rows_per_file: int
    index: StoredIndex | None
    changes: str | None = None
    carried: bool = False
    """The rows come with their fingerprints (``FP_A``, ``FP_B``, computed by Spark)."""
    ruled: bool = False
    """The rows come with the rule each breaks (``RULE``): one that breaks any is not written."""

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
        with in_task(f"writing under {self.folder}"):
            failpoints.hit("write_task")
            rows = pa.Table.from_batches(buffer)
            if self.ruled:
                _refuse_broken(rows.column(RULE))
                rows = rows.drop_columns([RULE])
            fps = None
            if self.carried:
                fps = (rows.column(FP_A).to_numpy(), rows.column(FP_B).to_numpy())
                rows = rows.drop_columns([FP_A, FP_B])
            rows = rows.cast(self.schema)
            if self.index is not None and fps is None:
                fps = fingerprints(rows)
            written = self.store.write(
                self.folder, rows, self.partition_by, self.max_rows_per_file, fps, schema=self.schema
            )
            _put_entries(self.index, written)
            if self.changes is not None:
                inserted = with_change_type(rows, "insert")
                written += self.store.write(
                    self.changes, inserted, self.partition_by, self.max_rows_per_file, schema=self.schema
                )
        return _report(written)


def _refuse_broken(rules: pa.ChunkedArray) -> None:
    """Raise ``InputError`` if a row about to be written breaks a rule (``RULE``)."""
    broken = rules.drop_null()
    if len(broken):
        raise InputError(
            f"rows about to be written break the rule {broken[0].as_py()}, though the rows checked "
            "kept it: Spark evaluated desired again to write it and got other rows (a "
            "nondeterministic query: rand(), current_timestamp(), a changing source). Fix or "
            "filter them in the query, or set on_error='table'. Nothing was committed."
        )


def rewrite_frame(
    rewrites: TaskRewrites,
    store: Store,
    folder: str,
    layout: Layout,
    max_rows_per_file: int,
    index: StoredIndex | None,
    where: Where,
    changes: str | None = None,
    *,
    vectors: bool = False,
) -> tuple[list[Written], int, tuple[DataFile, ...], list[Kept]]:
    """Rewrite files from Spark tasks: each reads its file through the I/O layer, drops the
    positions and writes the rest (and the dropped rows' change file under ``changes``), or
    with ``vectors`` writes a deletion vector for it. Returns the files written, the rows
    kept, the files replaced, and the files added again with a deletion vector (their index
    entries written by the tasks)."""
    task = _TaskRewriter(store, folder, layout, max_rows_per_file, index, changes, vectors)
    try:
        table = to_arrow(map_in_arrow(rewrites.frame, task, _FILES))
    except Exception as exc:
        raise_task_errors(exc, where)
        raise
    done = _written(table)
    sources = sorted({s for s, _ in done if s is not None})
    written = [w for _, w in done if isinstance(w, Written)]
    updates = [Kept(w.num_records or 0, [], w) for _, w in done if isinstance(w, DataFile)]
    kept = sum(w.file.num_records for w in split_changes(folder, written)[0]) + sum(u.rows for u in updates)
    # The rows dropped must be the retractions counted when planning: the drops came from
    # another Spark job, which a recomputed (nondeterministic) input could have changed.
    replaced = tuple(rewrites.files[k] for k in sources)
    if all(f.num_records is not None for f in replaced):
        dropped = sum(f.num_records or 0 for f in replaced) - kept
        if dropped != rewrites.retracted:
            raise InvariantViolation(
                f"rewrite tasks dropped {dropped} rows where the plan retracts {rewrites.retracted}; "
                "was desired evaluated twice with different results (a nondeterministic query)?",
                where,
            )
    return written, kept, replaced, updates


@dataclass(frozen=True)
class _TaskRewriter:
    """Runs in a Spark task (picklable): ``write_kept`` for each row (a file and the positions
    to drop), then the new files' index entries."""

    store: Store
    folder: str
    layout: Layout
    max_rows_per_file: int
    index: StoredIndex | None
    changes: str | None = None
    vectors: bool = False

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for row, file in task_files(batches):
            with in_task(f"rewriting {file.path}"):
                failpoints.hit("rewrite_task")
                # The kept rows' fingerprints: the file's stored entry (the diff read it), so
                # only a file without one is hashed again.
                entry = self.index.get(file) if self.index is not None else None
                fps = None if entry is None else (entry.a, entry.b)
                rewrite = Rewrite(file, None, np.asarray(row["drop"], dtype=np.int64), fps)
                done = write_kept(
                    self.store,
                    self.folder,
                    rewrite,
                    self.layout,
                    self.max_rows_per_file,
                    Where(),
                    hash_kept=self.index is not None,
                    changes=self.changes,
                    vectors=self.vectors,
                )
                _put_entries(self.index, split_changes(self.folder, done.written)[0])
            yield _report(done.written, row["file_no"], done.update)
