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

On a table with Change Data Feed, an attempt that rewrites files also stages change files
under ``<folder>/_change_data/``: exactly the rows it retracts (``_change_type`` ``delete``)
and inserts (``insert``), never the kept rows of a rewritten file. Delta's feed then reads the
commit from them instead of from its whole added and removed files. An attempt that only adds
files needs none: the feed reads its added files as inserts.
"""

from __future__ import annotations

import contextlib
import functools
import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from mvsink import failpoints
from mvsink.compat import from_arrow, map_in_arrow, to_arrow
from mvsink.errors import InputError, InvariantViolation, MVSinkError, StorageError, Where, first_line
from mvsink.table.delta import DataFile, NewFile
from mvsink.table.fingerprint import FP_A, FP_B, I64, fingerprints, quote
from mvsink.table.index import FileEntry, StoredIndex
from mvsink.table.schema import arrow_schema, schema_change
from mvsink.table.storage import Store, Written

RULE = "__mvsink_rule"
"""A column of a frame ``write_frame`` writes: the first rule its row breaks, or null
(``plan/rules.py`` makes it). A task that holds a row breaking one fails the attempt instead
of writing it, so the rows written are rows checked, whatever Spark evaluates again."""
CHANGE_DIR = "_change_data"
"""The staged change files' folder inside an attempt's folder (Delta's own name for them)."""
CHANGE_TYPE = "_change_type"
"""The change files' column saying what happened to each row."""
# Threads moving files on the driver (object stores are latency-bound).
IO_THREADS = 8
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


@dataclass(frozen=True)
class Layout:
    """The target's shape as an epoch writes it: Delta schema JSON, Spark and Arrow schemas,
    partition columns."""

    schema_json: str
    struct: StructType
    partition_by: tuple[str, ...]
    replaces: str | None = None
    """The table's schema JSON when the epoch's commit changes it to ``schema_json``
    (``schema_changes = "evolve"``); None: the commit keeps the table's schema."""

    @property
    def rewrites_every_file(self) -> bool:
        """Whether the schema change needs every file of the table rewritten in its commit: a
        widened column (files of the old type are unreadable as the new one without Delta's
        type widening) or a dropped one (its values would come back were it added again).
        Added columns read as null from older files."""
        if self.replaces is None:
            return False
        change = schema_change(self.struct, self.replaces)
        return bool(change.dropped or change.widened)

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
    counted: int | None = None
    """The file's rows, counted where the log gives no count (``Store.rows``)."""

    @property
    def size(self) -> int | None:
        """Rows in the file, if known without reading it."""
        if self.rows is not None:
            return int(self.rows.num_rows)
        if self.fps is not None:
            return len(self.fps[0])
        return self.file.num_records if self.counted is None else self.counted


@dataclass(frozen=True)
class TaskRewrites:
    """Rewrites decided in Spark (the distributed path), done by Spark tasks: ``frame`` has a
    row per file to rewrite, ``file_no`` (into ``files``) and ``drop`` (positions, sorted)."""

    frame: DataFrame
    files: tuple[DataFile, ...]
    retracted: int


class SideWriter(Protocol):
    def write(self, store: Store) -> list[str]:
        """Write the files; the paths written."""
        ...


@dataclass(frozen=True)
class SideFiles:
    """Files of mvsink's own (in its hidden folder, under ``folder``) that an attempt writes
    with its data files (``writer``, on the driver or in Spark tasks) and its commit names by
    the app transactions it records: they are current exactly when that commit landed, and
    deleted with the attempt's files when it did not."""

    folder: str
    writer: SideWriter
    transactions: Mapping[str, int]


@dataclass(frozen=True)
class Plan:
    """Rows to insert (``inserted`` of them; None: not known before writing) and rewrites."""

    inserts: pa.Table | DataFrame | None
    inserted: int | None
    rewrites: tuple[Rewrite, ...] | TaskRewrites = ()
    insert_fps: tuple[I64, I64] | None = None
    """Fingerprints of a driver-held ``inserts``, when the staged files are to be indexed."""
    index: StoredIndex | None = None
    """Where the staged files' index entries go (complete mode keeps an index), if anywhere."""
    files_read: int = 0
    """Data files of the snapshot read to make this plan."""
    side: SideFiles | None = None

    @property
    def retracted(self) -> int:
        if isinstance(self.rewrites, TaskRewrites):
            return self.rewrites.retracted
        return sum(len(r.drop) for r in self.rewrites)


@dataclass(frozen=True)
class Staged:
    """The files one attempt staged, and the snapshot files they replace."""

    folder: str | None
    adds: tuple[NewFile, ...]
    entries: Mapping[str, FileEntry]
    """Fingerprints of the added files written on the driver, by path (files written by tasks
    have theirs in the stored index only)."""
    removes: tuple[DataFile, ...]
    inserted: int
    retracted: int
    changes: tuple[NewFile, ...] = ()
    """Change files (Change Data Feed): the retracted and inserted rows, with ``CHANGE_TYPE``."""
    updates: tuple[DataFile, ...] = ()
    """Files of ``removes`` added again with a new deletion vector (which drops rows of theirs)."""
    side: SideFiles | None = None
    side_paths: tuple[str, ...] = ()
    """The files ``side`` wrote."""

    @property
    def bytes_written(self) -> int:
        vectors = sum(int((f.deletion_vector or {}).get("sizeInBytes", 0)) + 8 for f in self.updates)
        return sum(f.size for f in (*self.adds, *self.changes)) + vectors


NOTHING = Staged(None, (), {}, (), 0, 0)


def with_change_type(rows: pa.Table, kind: str) -> pa.Table:
    """``rows`` as a change file holds them: with ``CHANGE_TYPE`` = ``kind`` (``delete``,
    ``insert``)."""
    return rows.append_column(CHANGE_TYPE, pa.repeat(pa.scalar(kind, pa.string()), rows.num_rows))


def _split_changes(folder: str, written: Sequence[Written]) -> tuple[list[Written], list[Written]]:
    """Staged files as (data files, change files)."""
    prefix = f"{folder}/{CHANGE_DIR}/"
    data = [w for w in written if not w.file.path.startswith(prefix)]
    return data, [w for w in written if w.file.path.startswith(prefix)]


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
    change_feed: bool = False,
    deletion_vectors: bool = False,
) -> Staged:
    """Write ``plan``'s inserts and rewrites as new files (and their index entries, if the plan
    is indexed); with ``change_feed``, also the change files a commit that rewrites files needs
    (module doc); with ``deletion_vectors``, a file that keeps some rows gets a deletion vector
    instead of being rewritten. Nothing becomes visible."""
    if plan.inserts is None and not plan.rewrites:
        if plan.side is None:
            return NOTHING
        return replace(NOTHING, side=plan.side, side_paths=_write_side(store, plan.side, where))
    folder = f"mvsink-{view}-e{epoch}-{uuid.uuid4().hex[:12]}"
    changes = change_feed and bool(plan.rewrites)
    changes_folder = f"{folder}/{CHANGE_DIR}" if changes else None
    parts = layout.partition_by
    removes: tuple[DataFile, ...] = ()
    written: list[Written] = []
    updates: list[_Kept] = []
    side_paths = _write_side(store, plan.side, where) if plan.side is not None else ()
    try:
        kept = 0
        with ThreadPoolExecutor(IO_THREADS) as pool:
            jobs = []
            if isinstance(plan.rewrites, TaskRewrites):
                files, kept, removes, updates = rewrite_frame(
                    plan.rewrites,
                    store,
                    folder,
                    layout,
                    max_rows_per_file,
                    plan.index,
                    where,
                    changes_folder,
                    vectors=deletion_vectors,
                )
                written += files
            else:
                removes = tuple(r.file for r in plan.rewrites)
                jobs = [
                    pool.submit(
                        _write_kept,
                        store,
                        folder,
                        r,
                        layout,
                        max_rows_per_file,
                        where,
                        changes=changes_folder,
                        vectors=deletion_vectors,
                    )
                    for r in plan.rewrites
                ]
            if isinstance(plan.inserts, pa.Table):
                rows, fps = clustered(plan.inserts, plan.insert_fps, cluster_by)
                written += store.write(folder, rows, parts, max_rows_per_file, fps, schema=layout.arrow)
                if changes_folder is not None:
                    inserted = with_change_type(rows, "insert")
                    written += store.write(
                        changes_folder, inserted, parts, max_rows_per_file, schema=layout.arrow
                    )
            elif plan.inserts is not None:
                written += write_frame(
                    plan.inserts,
                    store,
                    folder,
                    layout,
                    max_rows_per_file=max_rows_per_file,
                    cluster_by=cluster_by,
                    index=plan.index,
                    where=where,
                    changes=changes_folder,
                )
            for job in jobs:
                done = job.result()
                kept += done.rows
                written += done.written
                if done.update is not None:
                    updates.append(done)
            written, changed = _split_changes(folder, [w for w in written if w.file.num_records > 0])
            entries: dict[str, FileEntry] = {}
            sizes = {w.file.path: w.file.size for w in written}
            if plan.index is not None:
                for w in written:
                    if w.fp_a is not None and w.fp_b is not None:
                        entries[w.file.path] = FileEntry(w.fp_a, w.fp_b)
                index = plan.index
                list(pool.map(lambda p: index.put(p, sizes[p], entries[p]), entries))
                # A file with a new vector keeps its stored entry (every row of its Parquet
                # file); the driver's index holds what it now holds.
                for u in updates:
                    if u.update is not None and u.entry is not None:
                        entries[u.update.identity] = u.entry
        total = sum(w.file.num_records for w in written) + sum(u.rows for u in updates)
        needed = None if plan.inserted is None else kept + plan.inserted
        if (needed is not None and total != needed) or total < kept:
            raise InvariantViolation(
                f"staged {total} rows where the plan needs {needed} "
                f"({kept} kept from rewritten files + {plan.inserted} inserted)",
                where,
            )
        in_changes = sum(w.file.num_records for w in changed)
        if changes and in_changes != total - kept + plan.retracted:
            raise InvariantViolation(
                f"staged change files hold {in_changes} rows where the attempt retracts "
                f"{plan.retracted} and inserts {total - kept}",
                where,
            )
    except InputError as exc:
        _discard(store, folder, plan.index, written, plan.side)
        if str(exc.where):
            raise
        raise InputError(exc.message, where) from None
    except OSError as exc:  # the store refused a write: read-only, full, unreachable
        _discard(store, folder, plan.index, written, plan.side)
        raise StorageError(
            f"cannot write this attempt's files under {folder}: {first_line(exc)}. Nothing was committed.",
            where,
        ) from exc
    except BaseException:
        _discard(store, folder, plan.index, written, plan.side)
        raise
    return Staged(
        folder,
        tuple(w.file for w in written),
        entries,
        removes,
        total - kept,
        plan.retracted,
        tuple(w.file for w in changed),
        tuple(u.update for u in updates if u.update is not None),
        plan.side,
        side_paths,
    )


def _write_side(store: Store, side: SideFiles, where: Where) -> tuple[str, ...]:
    try:
        return tuple(side.writer.write(store))
    except OSError as exc:
        store.delete_folder(side.folder)
        raise StorageError(
            f"cannot write {side.folder}: {first_line(exc)}. Nothing was committed.", where
        ) from exc
    except Exception as exc:
        store.delete_folder(side.folder)
        raise_task_errors(exc, where)
        raise


def discard(staged: Staged, store: Store, index: StoredIndex | None) -> None:
    """Delete an attempt's staged files (and their index entries): it did not commit (I4)."""
    if staged.folder:
        store.delete_folder(staged.folder)
        if index is not None:
            index.forget(f.path for f in staged.adds)
    if staged.side is not None:
        store.delete_folder(staged.side.folder)


def _discard(
    store: Store, folder: str, index: StoredIndex | None, written: list[Written], side: SideFiles | None
) -> None:
    store.delete_folder(folder)
    if index is not None:
        index.forget(w.file.path for w in written)
    if side is not None:
        store.delete_folder(side.folder)


def clustered(
    rows: pa.Table, fps: tuple[I64, I64] | None, cluster_by: Sequence[str]
) -> tuple[pa.Table, tuple[I64, I64] | None]:
    """Rows (and their fingerprints) sorted by ``cluster_by``, so rows that change together
    share few files. In Spark's order, as tasks sort (``write_frame``): ascending, nulls
    first, NaN above every number (``schema.CLUSTER_TYPES`` are the columns it sorts by)."""
    if not cluster_by or rows.num_rows < 2:
        return rows, fps
    keys: dict[str, pa.ChunkedArray | pa.Array] = {}
    for i, c in enumerate(cluster_by):
        column = rows.column(c)
        # Arrow puts nulls last (after NaN); a key "is valid" before the value puts them first.
        keys[f"valid{i}"] = pa.compute.is_valid(column)
        keys[f"value{i}"] = column
    order = pa.compute.sort_indices(pa.table(keys), [(k, "ascending") for k in keys]).to_numpy()
    return rows.take(order), None if fps is None else (fps[0][order], fps[1][order])


@dataclass(frozen=True)
class _Kept:
    """What became of one rewritten file: the rows it keeps, the files written for it (its
    kept rows, or its dropped rows' change file), and, when a deletion vector drops its rows
    instead, the file as the commit adds it again and its index entry."""

    rows: int
    written: list[Written]
    update: DataFile | None = None
    entry: FileEntry | None = None


def _write_kept(
    store: Store,
    folder: str,
    rewrite: Rewrite,
    layout: Layout,
    max_rows_per_file: int,
    where: Where,
    *,
    hash_kept: bool = False,
    changes: str | None = None,
    vectors: bool = False,
) -> _Kept:
    """Drop a rewritten file's rows at ``rewrite.drop``: write its kept rows as new files, or,
    with ``vectors``, mark the dropped rows in a new deletion vector of the file (``_mark``).
    The file is read here unless planning read it, and released once written (one file per
    thread at a time); a file whose every row goes is not read at all, unless its dropped rows
    go into a change file under ``changes``. The kept rows' fingerprints come from the
    rewrite's, or are computed if ``hash_kept``."""
    drop = rewrite.drop
    if len(drop) and (drop[0] < 0 or (len(drop) > 1 and not bool(np.all(drop[1:] > drop[:-1])))):
        raise InvariantViolation(
            f"positions to drop from {rewrite.file.path} are not distinct and sorted", where
        )
    whole = rewrite.size is not None and len(drop) == rewrite.size
    if changes is None and (whole or (vectors and rewrite.file.num_records is not None)):
        if whole:
            return _Kept(0, [])
        return _mark(store, folder, rewrite, [], where)
    rows = rewrite.rows
    if rows is None:
        rows = store.read(rewrite.file, layout.arrow, layout.partition_by)
        if rewrite.size is not None and rows.num_rows != rewrite.size:
            raise InvariantViolation(
                f"{rewrite.file.path} read back with {rows.num_rows} rows, indexed with {rewrite.size}",
                where,
            )
    if len(drop) and drop[-1] >= rows.num_rows:
        raise InvariantViolation(
            f"a position to drop from {rewrite.file.path} is past its {rows.num_rows} rows", where
        )
    keep = np.ones(rows.num_rows, dtype=bool)
    keep[rewrite.drop] = False
    out: list[Written] = []
    if changes is not None and len(drop):
        deleted = with_change_type(rows.take(pa.array(drop)), "delete")
        out = store.write(changes, deleted, layout.partition_by, max_rows_per_file, schema=layout.arrow)
    if not keep.any():
        return _Kept(0, out)
    if vectors and rewrite.file.num_records is not None:
        return _mark(store, folder, rewrite, out, where)
    kept = rows.filter(pa.array(keep))
    fps = None
    if rewrite.fps is not None:
        fps = (rewrite.fps[0][keep], rewrite.fps[1][keep])
    elif hash_kept:
        fps = fingerprints(kept)
    return _Kept(
        kept.num_rows,
        out + store.write(folder, kept, layout.partition_by, max_rows_per_file, fps, schema=layout.arrow),
    )


def _mark(store: Store, folder: str, rewrite: Rewrite, written: list[Written], where: Where) -> _Kept:
    """Drop a file's rows at ``rewrite.drop`` (positions among the rows it holds) with a
    deletion vector: its current vector plus those rows' positions in the Parquet file,
    written under ``folder``. The file's bytes, and so its stored index entry, stay; the
    commit removes the file as it was and adds it again with the new vector. With the rows'
    fingerprints at hand (the driver's plan), the entry of the rows it now holds comes back
    for the driver's index."""
    from mvsink.table.deletion_vectors import read, write

    file = rewrite.file
    assert file.num_records is not None
    before = read(store, file.deletion_vector) if file.deletion_vector else np.zeros(0, dtype=np.int64)
    last = int(rewrite.drop[-1]) if len(rewrite.drop) else -1
    if last >= file.num_records:
        raise InvariantViolation(
            f"{file.path}: the plan drops row {last} of the {file.num_records} its deletion vector leaves",
            where,
        )
    # The k-th row the file holds is its Parquet row k + (rows the vector drops at or before it):
    # ``gaps[i]`` is how many held rows come before the i-th dropped one.
    gaps = before - np.arange(len(before), dtype=np.int64)
    physical = rewrite.drop + np.searchsorted(gaps, rewrite.drop, side="right")
    (vector,) = write(store, folder, [np.union1d(before, physical)])
    update = replace(file, deletion_vector=vector, num_records=file.num_records - len(rewrite.drop))
    entry = None
    if rewrite.fps is not None:
        keep = np.ones(file.num_records, dtype=bool)
        keep[rewrite.drop] = False
        entry = FileEntry(rewrite.fps[0][keep], rewrite.fps[1][keep])
    return _Kept(update.num_records or 0, written, update, entry)


# --- Spark tasks -----------------------------------------------------------------------------

_FILES = (
    "source long, path string, size long, rows long, stats string, partition_values string, "
    "deletion_vector string"
)
"""A task's report of the files it wrote, one row each; a row with a ``deletion_vector`` is a
snapshot file added again with that vector (``_Kept.update``)."""
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
) -> tuple[list[Written], int, tuple[DataFile, ...], list[_Kept]]:
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
    updates = [_Kept(w.num_records or 0, [], w) for _, w in done if isinstance(w, DataFile)]
    kept = sum(w.file.num_records for w in _split_changes(folder, written)[0]) + sum(u.rows for u in updates)
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
    """Runs in a Spark task (picklable): ``_write_kept`` for each row (a file and the positions
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
                done = _write_kept(
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
                _put_entries(self.index, _split_changes(self.folder, done.written)[0])
            yield _report(done.written, row["file_no"], done.update)
