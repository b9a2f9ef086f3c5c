"""A version's lifetimes derived in Spark tasks: what ``keep.History`` does on the driver
(``lifetimes.carry`` over the removed files' mirrors and the added files' rows), for a view
planned in Spark tasks, whose versions the driver should not hold (a whole rewrite of a large
complete view holds the view twice).

One Spark job of three stages; no row reaches the driver:

1. **read**: each removed file's mirror (its open lifetimes) and each added file's rows, a few
   files a task (``file_frame``), each row tagged with its file's number and place;
2. **carry**: shuffled by the fingerprint of the rows' view columns, so the rows equal under
   mvsink's row equality meet in one task, which runs ``carry`` over them in a fixed order (a
   task run again matches the same rows the same way): a removed lifetime no added row takes
   closes, and is written there as a file of closed lifetimes;
3. **mirror**: the added files' rows with their lifetimes, shuffled by the added file, each
   file's written as its mirror, its rows in the file's order (as the driver writes them).

Rows travel between the stages as Arrow IPC chunks in a binary column, never as Spark rows:
the view's columns keep their exact Arrow types whatever Spark's conversions would make of
them, and a shuffle moves a few large values instead of a value per column and row.

What comes back is the written files' add actions, and how many lifetimes each opened. An added
file none of whose rows reached stage 3 (it holds none) gets its empty mirror from the driver.
A version that removes nothing (a first load, an append) needs no matching: each task opens
the rows of the files it reads and writes their mirrors (``_Open``), with no shuffle.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from mvsink.compat import map_in_arrow, to_arrow
from mvsink.errors import MVSinkError, Where
from mvsink.history.lifetimes import COLUMNS, OPENED_VERSION, Change, carry, opened
from mvsink.table.delta import DataFile, NewFile
from mvsink.table.fingerprint import fingerprints
from mvsink.table.storage import Store
from mvsink.table.tasks import file_frame, in_task, raise_task_errors, task_files

FILE = "__mvsink_file"
"""The number of the file a row came from (the removed files' mirrors first)."""
POS = "__mvsink_pos"
"""A row's place in its file."""

BYTES_PER_TASK = 64 << 20
ROWS_PER_TASK = 1_000_000
"""Parquet bytes (of the files read), and rows where the log counts them, a carry task is
given, about: the version's files are spread over tasks of at most this much (at least two;
well-compressed files count by their rows). Rows equal to each other all meet in one task,
whatever their number: what matching by value needs."""
CHUNK_ROWS = 64 << 10
CHUNK_BYTES = 64 << 20
"""Rows, and Arrow bytes, a chunk carries at most between two stages (one binary value: far
below the 2 GiB an Arrow binary array holds)."""

_CHUNKS = StructType(
    [
        StructField("key", LongType()),  # stage 1: the carry task; stage 2: the added file (-1: a report)
        StructField("chunk", BinaryType()),  # rows, Arrow IPC
        StructField("written", StringType()),  # stage 2: a file of closed lifetimes, its add action
    ]
)
_CHUNKS_ARROW = pa.schema([("key", pa.int64()), ("chunk", pa.binary()), ("written", pa.string())])
_REPORT = StructType(
    [
        StructField("file_no", LongType()),  # among the added files; -1: a file of closed lifetimes
        StructField("written", StringType()),
        StructField("opened", LongType()),
    ]
)
_REPORT_ARROW = pa.schema([("file_no", pa.int64()), ("written", pa.string()), ("opened", pa.int64())])


@dataclass(frozen=True)
class Mirrored:
    """What the tasks wrote: the mirror of each added file that held a row (by its number
    among the added files), the files of closed lifetimes, and the lifetimes they opened."""

    mirrors: dict[int, NewFile]
    closed: list[NewFile]
    opened: int


def mirror_in_tasks(
    spark: Any,
    *,
    view_store: Store,
    view_arrow: pa.Schema,
    partition_by: tuple[str, ...],
    history_store: Store,
    schema: pa.Schema,
    removed: Sequence[DataFile],
    added: Sequence[DataFile],
    mirror_paths: Sequence[str],
    closed_path: str,
    change: Change,
    where: Where,
) -> Mirrored:
    """Carry ``change``'s lifetimes in Spark tasks: the lifetimes of ``removed`` (mirrors in
    the history, of the history's ``schema``) against the rows of ``added`` (view files),
    written where the history's files go: each added file's open lifetimes at
    ``mirror_paths[i]``, closed lifetimes at paths from ``closed_path`` (a format string taking a
    unique ``{}``)."""
    if not removed:
        opener = _Read(view_store, view_arrow, partition_by, history_store, schema, 0, 1)
        return _open_in_tasks(spark, opener, added, mirror_paths, change, where)
    files = [*removed, *added]
    rows = sum(f.num_records or 0 for f in files)
    carriers = max(2, -(-sum(f.size for f in files) // BYTES_PER_TASK), -(-rows // ROWS_PER_TASK))
    # Chunks keyed finer than the tasks: Spark hashes the keys to tasks, evenly when there are many.
    read = _Read(view_store, view_arrow, partition_by, history_store, schema, len(removed), carriers * 8)
    chunks = map_in_arrow(file_frame(spark, files), read, _CHUNKS).repartition(carriers, F.col("key"))
    carried = map_in_arrow(chunks, _Carry(schema, len(removed), change, history_store, closed_path), _CHUNKS)
    writers = max(1, min(len(added) + 1, carriers))
    by_file = carried.repartition(writers, F.col("key")).sortWithinPartitions("key")
    task = _Mirror(schema, tuple(mirror_paths), history_store, change.version)
    try:
        report = to_arrow(map_in_arrow(by_file, task, _REPORT))
    except Exception as exc:
        raise_task_errors(exc, where)
        raise
    mirrors: dict[int, NewFile] = {}
    closed: list[NewFile] = []
    opened = 0
    for r in report.to_pylist():
        if r["file_no"] < 0:
            closed.append(_new_file(r["written"]))
        else:
            mirrors[r["file_no"]] = _new_file(r["written"])
            opened += r["opened"]
    return Mirrored(mirrors, closed, opened)


def _open_in_tasks(
    spark: Any,
    read: _Read,
    added: Sequence[DataFile],
    mirror_paths: Sequence[str],
    change: Change,
    where: Where,
) -> Mirrored:
    """A version that removes nothing (a first load, an append): every row it adds opens a
    lifetime, so each file's mirror is written by the task that reads it (``read``: with no
    removed files), with no shuffle."""
    task = _Open(read, tuple(mirror_paths), change)
    try:
        report = to_arrow(map_in_arrow(file_frame(spark, added), task, _REPORT))
    except Exception as exc:
        raise_task_errors(exc, where)
        raise
    rows = report.to_pylist()
    return Mirrored({r["file_no"]: _new_file(r["written"]) for r in rows}, [], sum(r["opened"] for r in rows))


def _pack(rows: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write_table(rows)
    packed: bytes = sink.getvalue().to_pybytes()
    return packed


def _unpack(chunks: Sequence[bytes]) -> pa.Table:
    return pa.concat_tables([pa.ipc.open_stream(c).read_all() for c in chunks])


def _new_file(text: str) -> NewFile:
    d = json.loads(text)
    return NewFile(d["path"], d["size"], d["num_records"], d["stats"], d["partition_values"])


def _file_json(new: NewFile) -> str:
    fields = ("path", "size", "num_records", "stats")
    return json.dumps(
        {**{k: getattr(new, k) for k in fields}, "partition_values": dict(new.partition_values)}
    )


def _chunks(key: int, rows: pa.Table) -> Iterator[pa.RecordBatch]:
    step = min(CHUNK_ROWS, max(1, CHUNK_BYTES * rows.num_rows // max(rows.nbytes, 1)))
    for start in range(0, rows.num_rows, step):
        part = _pack(rows.slice(start, step))
        yield pa.RecordBatch.from_pylist([{"key": key, "chunk": part, "written": None}], schema=_CHUNKS_ARROW)


@dataclass(frozen=True)
class _Read:
    """Stage 1 (picklable): a file's rows as lifetimes, tagged (``FILE``, ``POS``), in a chunk
    per key their fingerprints give (one of ``keys``; the shuffle to stage 2 is by key). A
    removed file's mirror holds its lifetimes; an added file's rows have none yet (nulls)."""

    view_store: Store
    view_arrow: pa.Schema
    partition_by: tuple[str, ...]
    history_store: Store
    schema: pa.Schema
    removed: int
    keys: int

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        view = [n for n in self.schema.names if n not in COLUMNS]
        for row, file in task_files(batches):
            number = int(row["file_no"])
            with in_task(f"reading {file.path} for the history"):
                rows = self._lifetimes(number, file)
                n = rows.num_rows
                if not n:
                    continue
                carrier = np.mod(fingerprints(rows.select(view))[0], self.keys)
                rows = rows.append_column(FILE, pa.array(np.full(n, number, np.int64)))
                rows = rows.append_column(POS, pa.array(np.arange(n, dtype=np.int64)))
                order = np.argsort(carrier, kind="stable")
                rows, carrier = rows.take(pa.array(order)), carrier[order]
                cuts = [0, *(np.flatnonzero(carrier[1:] != carrier[:-1]) + 1).tolist(), n]
            for start, end in itertools.pairwise(cuts):
                yield from _chunks(int(carrier[start]), rows.slice(start, end - start))

    def _lifetimes(self, number: int, file: DataFile) -> pa.Table:
        if number < self.removed:
            return self.history_store.read(file, self.schema, ())
        try:
            held = self.view_store.read(file, self.view_arrow, self.partition_by)
        except FileNotFoundError:
            raise MVSinkError(
                f"{file.path}, which the version the history follows added, is gone (a VACUUM "
                "since?): the history cannot be completed exactly. Give the view's history a new "
                "folder (it begins with the rows held then)."
            ) from None
        n = held.num_rows
        columns = {
            name: pa.nulls(n, self.schema.field(name).type) if name in COLUMNS else held.column(name)
            for name in self.schema.names
        }
        return pa.table(columns, schema=self.schema)


@dataclass(frozen=True)
class _Open:
    """A task of a version that removes nothing (picklable): each added file's rows, opened
    as lifetimes and written as its mirror."""

    read: _Read
    paths: tuple[str, ...]
    change: Change

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        view = [n for n in self.read.schema.names if n not in COLUMNS]
        for row, file in task_files(batches):
            number = int(row["file_no"])
            with in_task(f"writing the history's mirror of {file.path}"):
                rows = opened(self.read._lifetimes(number, file).select(view), self.change, self.read.schema)
                new = self.read.history_store.write_file(self.paths[number], rows)
            yield _report(number, _file_json(new), rows.num_rows)


@dataclass(frozen=True)
class _Carry:
    """Stage 2 (picklable): ``carry`` over the rows of one task, which hold every row of their
    fingerprints, in the order of their files and places (so a task run again pairs the same
    rows); writes the lifetimes it closes, and passes on each added file's lifetimes."""

    schema: pa.Schema
    removed: int
    change: Change
    history_store: Store
    closed_path: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        chunks = [c for b in batches for c in b.column("chunk").to_pylist()]
        if not chunks:
            return
        with in_task("carrying the history's lifetimes"):
            rows = _unpack(chunks)
            numbers, places = rows.column(FILE).to_numpy(), rows.column(POS).to_numpy()
            order = np.lexsort((places, numbers))
            rows, numbers = rows.take(pa.array(order)), numbers[order]
            split = int(np.searchsorted(numbers, self.removed))
            gone = rows.slice(0, split).select(self.schema.names)
            adds, owners = rows.slice(split), numbers[split:]
            cuts = [0, *(np.flatnonzero(owners[1:] != owners[:-1]) + 1).tolist(), len(owners)]
            view = [n for n in self.schema.names if n not in COLUMNS]
            parts = [adds.slice(a, b - a).select(view) for a, b in itertools.pairwise(cuts) if b > a]
            kept, closed = carry(gone, parts, self.change, self.schema)
            written = None
            if closed.num_rows:
                new = self.history_store.write_file(self.closed_path.format(uuid.uuid4().hex), closed)
                written = _file_json(new)
        for start, lifetimes in zip(cuts, kept, strict=False):
            places = adds.column(POS).slice(start, lifetimes.num_rows)
            yield from _chunks(int(owners[start]) - self.removed, lifetimes.append_column(POS, places))
        if written is not None:
            yield pa.RecordBatch.from_pylist(
                [{"key": -1, "chunk": None, "written": written}], schema=_CHUNKS_ARROW
            )


@dataclass(frozen=True)
class _Mirror:
    """Stage 3 (picklable): each added file's lifetimes (their chunks arrive sorted by file),
    written as its mirror; reports each file written, and those stage 2 wrote."""

    schema: pa.Schema
    paths: tuple[str, ...]
    history_store: Store
    version: int

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        current, held = -1, list[bytes]()
        for batch in batches:
            for r in batch.to_pylist():
                if r["key"] < 0:
                    yield _report(-1, r["written"], 0)
                    continue
                if r["key"] != current and held:
                    yield self._write(current, held)
                    held = []
                current = r["key"]
                held.append(r["chunk"])
        if held:
            yield self._write(current, held)

    def _write(self, added: int, chunks: list[bytes]) -> pa.RecordBatch:
        with in_task("writing the history's mirrors"):
            rows = _unpack(chunks)
            # In its view file's order, as on the driver: a mirror's rows line up with its file's.
            rows = rows.take(pc.sort_indices(rows.column(POS))).select(self.schema.names).cast(self.schema)
            new = self.history_store.write_file(self.paths[added], rows)
            opened = int(pc.sum(pc.equal(rows.column(OPENED_VERSION), self.version)).as_py() or 0)
        return _report(added, _file_json(new), opened)


def _report(file_no: int, written: str, opened: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"file_no": file_no, "written": written, "opened": opened}], schema=_REPORT_ARROW
    )
