"""The I/O layer: every read and write of the target's data files, on the driver or in a task.

The target's bytes move through Arrow, never through Spark's Hadoop file system: a ``Store``
is the table root plus the sink's ``storage_options``, and gives a ``pyarrow`` file system
whose paths are relative to the root:

* local paths and ``file://`` URIs: pyarrow's own local file system (memory-mapped reads);
* ``s3://``, ``az://``/``abfss://``, ``gs://`` ...: delta-rs's object store
  (``deltalake.fs.DeltaStorageHandler``) wrapped in ``pyarrow.fs.PyFileSystem``, so files move
  with exactly the credentials, endpoint and options the commits use, and no connector jar or
  second credential scheme is needed.

A ``Store`` is a small picklable value: Spark tasks (``mapInArrow``) receive it and open their
own file system on first use (one per process). Files are written whole into memory, then put
with one request; their size and Parquet footer (hence their Delta statistics) are in hand, so
no file is ever read back.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import decimal
import functools
import logging
import queue
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote as url_quote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from mvsink.errors import InputError, InvariantViolation, StorageError, Where, first_line
from mvsink.table.delta import DataFile, NewFile, partition_string, raw_storage_handler, storage_handler
from mvsink.table.schema import field_id, is_mapped, physical_field, physical_name
from mvsink.table.stats import footer_statistics, metadata_stats, nan_leaves
from mvsink.table.uris import is_local

log = logging.getLogger(__name__)

DELETE_THREADS = 16
"""Local deletes in flight at once."""
# How Hive-style folders name a null partition value.
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
_COMPRESSION = "snappy"

SPARK_CALENDAR = {"org.apache.spark.version": "3.5.0"}
"""Footer metadata of every data, rewrite, change and tombstone file mvsink writes: that its
dates and timestamps are proleptic Gregorian, as Spark 3.0 and later write them (so does Arrow).
Spark decides how to read a file's dates from this key: a file without it gets
``datetimeRebaseModeInRead``, which on 3.5 defaults to ``EXCEPTION``, so a view holding
``date '0001-01-01'`` or a timestamp before 1900 would fail every read on Spark 3.5 and Delta 3.x
(``READ_ANCIENT_DATETIME``). With the key and no ``org.apache.spark.legacyDateTime``, Spark reads
dates and INT64 timestamps as written (a version from 3.0.0 on) and INT96 timestamps too (from
3.1.0 on; mvsink writes none), whatever its settings."""


class ParquetWriter(pq.ParquetWriter):  # type: ignore[misc]  # pyarrow is untyped
    """pyarrow's Parquet writer, whose every file carries ``SPARK_CALENDAR`` in its footer: the
    one writer of mvsink's data, rewrite, change and tombstone files."""

    def close(self) -> None:
        if self.is_open:
            self.add_key_value_metadata(SPARK_CALENDAR)
        super().close()


_DISTINCT_SAMPLE = 8192
"""Rows, evenly spaced, on which ``dictionary_columns`` judges a bigger file's columns."""


def dictionary_columns(data: pa.Table) -> list[str] | bool:
    """The columns of ``data`` worth a dictionary in Parquet: those whose distinct values are
    at most half its rows. A dictionary of mostly distinct values adds its indices to the
    values themselves, and Arrow's writer, unlike Spark's, does not fall back for that (only
    once the dictionary passes its page size limit): files of a few ten thousand unique ids,
    strings or measures came out 40% bigger than Delta's own. A table
    with nested columns keeps Arrow's default (every column), whose leaves this does not
    name."""
    if not data.num_rows or any(pa.types.is_nested(f.type) for f in data.schema):
        return True
    # Judged on evenly spaced rows: counting every value cost 50 ms a column at 125K rows.
    rows = data.num_rows
    sample = data
    if rows > _DISTINCT_SAMPLE:
        try:
            sample = data.take(np.linspace(0, rows - 1, _DISTINCT_SAMPLE, dtype=np.int64))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # chunks too big to join: all rows
            sample = data

    def few(column: pa.ChunkedArray) -> bool:
        try:
            return bool(2 * pc.count_distinct(column, mode="all").as_py() <= len(column))
        except pa.ArrowNotImplementedError:  # a type Arrow cannot count (all nulls): as Arrow
            return True

    return [name for name, column in zip(sample.column_names, sample.columns, strict=True) if few(column)]


@dataclass(frozen=True)
class Written:
    """One file written: its add action and, when asked for, its rows' fingerprints."""

    file: NewFile
    fp_a: np.ndarray | None = None
    fp_b: np.ndarray | None = None


@dataclass(frozen=True)
class Store:
    """Where a target's files live: ``root`` (a local path or a URI) and the options delta-rs
    and the file system get. Picklable; ``fs`` is opened per process on first use."""

    root: str
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def fs(self) -> pafs.FileSystem:
        return _filesystem(self.root, tuple(sorted(self.options.items())))

    def read(
        self, file: DataFile, schema: pa.Schema, partition_by: Sequence[str], *, every_row: bool = False
    ) -> pa.Table:
        """All rows of ``file`` in ``schema`` (the table's columns in order), partition columns
        filled in from the values the log gives the file, less those its deletion vector
        drops (unless ``every_row``: every row of the Parquet file)."""
        parts = set(partition_by)
        with self.fs.open_input_file(file.key) as fh:
            raw = pq.read_table(fh, columns=None)
        if file.deletion_vector and not every_row:
            raw = raw.filter(pa.array(self.alive(file, raw.num_rows)))
        stored = _by_name(raw.column_names, file.key)
        ids = _by_field_id(raw.schema)
        columns: dict[str, pa.Array | pa.ChunkedArray] = {}
        for f in schema:
            # The column's name in files (column mapping), or the column with its field id.
            name = ids.get(field_id(f) or "", physical_name(f)).lower()
            if f.name in parts:
                columns[f.name] = partition_array(file.partition_values.get(f.name), f.type, raw.num_rows)
            elif name in stored:
                held = physical_field(f).type
                columns[f.name] = _view(_cast(raw.column(stored[name]), held), f.type)
            else:
                # A column added to the table after this file was written: null in its rows.
                columns[f.name] = pa.nulls(raw.num_rows, f.type)
        return pa.table(columns, schema=schema)

    def rows(self, file: DataFile) -> int:
        """The rows ``file`` holds in its version: its Parquet footer's count, less those its
        deletion vector drops (for a file the log gives no count of; nothing but the footer is
        read)."""
        with self.fs.open_input_file(file.key) as fh:
            return int(pq.ParquetFile(fh).metadata.num_rows) - file.deleted

    def alive(self, file: DataFile, physical: int) -> np.ndarray:
        """Which of the ``physical`` rows of ``file``'s Parquet file the version holds (a
        boolean mask): all but those its deletion vector drops."""
        from mvsink.table.deletion_vectors import read

        keep = np.ones(physical, dtype=bool)
        if file.deletion_vector:
            dropped = read(self, file.deletion_vector)
            if len(dropped) and int(dropped[-1]) >= physical:
                raise InvariantViolation(
                    f"the deletion vector of {file.path} drops row {int(dropped[-1])} of {physical}"
                )
            keep[dropped] = False
        if file.num_records is not None and int(keep.sum()) != file.num_records:
            raise InvariantViolation(
                f"{file.path} holds {int(keep.sum())} rows past its deletion vector where the Delta "
                f"log says {file.num_records}"
            )
        return keep

    def write(
        self,
        folder: str,
        rows: pa.Table,
        partition_by: Sequence[str],
        max_rows_per_file: int,
        fingerprints: tuple[np.ndarray, np.ndarray] | None = None,
        *,
        schema: pa.Schema,
    ) -> list[Written]:
        """Write ``rows`` (the table's columns, and any others after them) under ``folder`` as
        Parquet files of at most ``max_rows_per_file`` rows, one Hive-style folder per
        partition value; fingerprints aligned with ``rows`` are sliced along with them. The
        table's ``schema`` (an ``arrow_schema``) names the columns in the files: on a table with
        column mapping, by their physical names and field ids."""
        out: list[Written] = []
        for values, idx in _partition_groups(rows, partition_by):
            part = rows if idx is None else rows.take(idx)
            fa = fb = None
            if fingerprints is not None:
                fa, fb = (
                    (fingerprints[0], fingerprints[1])
                    if idx is None
                    else (fingerprints[0][idx], fingerprints[1][idx])
                )
            data = _physical(part.drop_columns(list(partition_by)) if partition_by else part, schema)
            sub = "/".join(f"{_escape(c)}={_escape_value(values[c])}" for c in partition_by)
            for start in range(0, part.num_rows, max_rows_per_file):
                stop = min(part.num_rows, start + max_rows_per_file)
                name = f"part-{uuid.uuid4().hex}.snappy.parquet"
                path = "/".join(p for p in (folder, sub, name) if p)
                new = self._put(path, data.slice(start, stop - start), values)
                out.append(
                    Written(
                        new, None if fa is None else fa[start:stop], None if fb is None else fb[start:stop]
                    )
                )
        return out

    def write_file(self, path: str, rows: pa.Table) -> NewFile:
        """Write ``rows`` (a table without partitions or column mapping) as the one Parquet
        file at ``path``, whatever its row count: its add action."""
        return self._put(path, rows, {})

    def _put(self, path: str, data: pa.Table, values: Mapping[str, str | None]) -> NewFile:
        sink = pa.BufferOutputStream()
        nan = nan_leaves(data)
        writer = ParquetWriter(
            sink,
            data.schema,
            compression=_COMPRESSION,
            use_dictionary=dictionary_columns(data),
            use_compliant_nested_type=True,
            store_schema=False,
            write_statistics=footer_statistics(data.schema, nan),
        )
        writer.write_table(data, row_group_size=1 << 20)
        writer.close()
        buf = sink.getvalue()
        n, stats = metadata_stats(writer.writer.metadata, data, nan)
        self.put(path, buf)
        return NewFile(path, buf.size, n, stats, dict(values))

    def put(self, path: str, data: pa.Buffer | bytes) -> None:
        """Write ``data`` as the whole file at ``path``: readers see all of it or nothing (one
        request on an object store; a temporary file renamed into place on local disk)."""
        if is_local(self.root):
            fs = self.fs
            fs.create_dir(path.rpartition("/")[0], recursive=True)
            temp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
            with fs.open_output_stream(temp) as fh:
                fh.write(data)
            fs.move(temp, path)
        else:
            # Straight to delta-rs's object store: pyarrow's Python-file wrapper hands it Arrow
            # buffers, which it does not take.
            out = _handler(self.root, tuple(sorted(self.options.items()))).open_output_stream(path, None)
            out.write(data.to_pybytes() if isinstance(data, pa.Buffer) else data)
            out.close()

    def get(self, path: str) -> pa.Buffer | None:
        """The whole file at ``path``, or None if there is none."""
        try:
            with self.fs.open_input_file(path) as fh:
                return fh.read_buffer()
        except FileNotFoundError:
            return None

    def files(self, folder: str) -> list[str]:
        """Paths (relative to the root) of the files under ``folder``, at any depth."""
        infos = self.fs.get_file_info(pafs.FileSelector(folder, recursive=True, allow_not_found=True))
        return [self._relative(i.path) for i in infos if i.type == pafs.FileType.File]

    def foreign(self) -> list[str]:
        """What the root holds that neither Delta nor mvsink put there: entries whose names do
        not start with ``_`` or ``.`` (the log, mvsink's folder, hidden files) or ``mvsink-``
        (the staging folders of attempts that never committed). One listing of the root."""
        infos = self.fs.get_file_info(pafs.FileSelector("", recursive=False, allow_not_found=True))
        names = [self._relative(i.path).rstrip("/").rpartition("/")[2] for i in infos]
        return sorted(n for n in names if n and not n.startswith(("_", ".", "mvsink-")))

    def listing(self, folder: str) -> dict[str, tuple[int, float]]:
        """``files(folder)`` with each file's size and modification time (seconds since 1970)."""
        infos = self.fs.get_file_info(pafs.FileSelector(folder, recursive=True, allow_not_found=True))
        return {
            self._relative(i.path): (int(i.size or 0), i.mtime.timestamp() if i.mtime else 0.0)
            for i in infos
            if i.type == pafs.FileType.File
        }

    def sizes(self, paths: Sequence[str]) -> dict[str, int]:
        """The sizes of those of ``paths`` that exist."""
        infos = self.fs.get_file_info(list(paths)) if paths else []
        return {self._relative(i.path): int(i.size or 0) for i in infos if i.type == pafs.FileType.File}

    def delete(self, paths: Iterable[str], *, threads: bool = True) -> None:
        """Delete files, many at a time (``threads``: on local disk, over a pool of threads,
        which the interpreter waits for at exit); one already gone is no error. After trying
        every file, a ``StorageError`` saying how many failed and naming the first."""
        todo = list(paths)
        if not todo:
            return
        if not is_local(self.root):
            _delete_remote(self.root, self.options, todo)
            return
        fs = self.fs

        def one(path: str) -> str | None:
            try:
                fs.delete_file(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                return f"{path}: {first_line(exc)}"
            return None

        if threads:
            with ThreadPoolExecutor(min(DELETE_THREADS, len(todo))) as pool:
                failed = [f for f in pool.map(one, todo) if f is not None]
        else:
            failed = [f for f in map(one, todo) if f is not None]
        _raise_failed(self.root, failed, len(todo))

    def delete_later(self, paths: Iterable[str], what: str) -> None:
        """Delete files off the caller's path, in a background thread: for cleanup nothing
        depends on (index entries of files that left the table). A failure is a WARNING, and
        no process waits long for them (``wait_for_cleanup``): what stays behind is swept
        later."""
        todo = list(paths)
        if not todo:
            return

        def run() -> None:
            try:
                if is_local(self.root):  # on the cleanup thread only, which exit does not wait for
                    self.delete(todo, threads=False)
                else:  # never in this process: its deletes would hold the GIL the epoch needs
                    _delete_remote(self.root, self.options, todo, background=True)
            except Exception as exc:
                log.warning("could not delete %d %s under %s: %s", len(todo), what, self.root, exc)

        try:
            _cleanup_pool().submit(run)
        except RuntimeError as exc:  # the interpreter is shutting down: a sweep catches them
            log.warning("could not queue the deletes of %d %s under %s: %s", len(todo), what, self.root, exc)

    def _relative(self, path: str) -> str:
        path = path.lstrip("/")
        if is_local(self.root):
            path = path.removeprefix(self.root.strip("/") + "/")
        return path

    def missing(self, folder: str, files: Sequence[NewFile]) -> list[str]:
        """Staged files not (or not wholly) in storage under ``folder``: checked before a
        commit references them (one listing)."""
        infos = self.fs.get_file_info(pafs.FileSelector(folder, recursive=True, allow_not_found=True))
        sizes = {self._relative(i.path): i.size for i in infos if i.type == pafs.FileType.File}
        return [f.path for f in files if sizes.get(f.path) != f.size]

    def delete_folder(self, folder: str) -> None:
        """Delete every file under ``folder`` (one attempt's staged files); best-effort."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(folder, recursive=True, allow_not_found=True))
            if not infos and self.fs.get_file_info(folder).type == pafs.FileType.NotFound:
                return
            self.delete([self._relative(i.path) for i in infos if i.type == pafs.FileType.File])
            if is_local(self.root):
                self.fs.delete_dir(folder)
        except Exception as exc:  # a leftover folder is vacuum's to remove, never an error
            log.warning("could not delete staged folder %s under %s: %s", folder, self.root, exc)

    def probe(self, where: Where) -> None:
        """Fail fast, naming the target, when the store cannot be listed (credentials, bucket,
        endpoint): before any Spark job runs and before anything is written."""
        try:
            self.fs.get_file_info(pafs.FileSelector("_delta_log", allow_not_found=True))
        except Exception as exc:
            raise StorageError(
                f"cannot reach the target's storage at {self.root}: {first_line(exc)}. Check the "
                "sink's storage_options (endpoint, credentials, region) and that the bucket or "
                "container exists.",
                where,
            ) from exc


@functools.lru_cache(maxsize=16)
def _filesystem(root: str, options: tuple[tuple[str, str], ...]) -> pafs.FileSystem:
    if is_local(root):
        return pafs.SubTreeFileSystem(root, pafs.LocalFileSystem())
    return pafs.PyFileSystem(storage_handler(root, dict(options)))


DELETE_PROCESSES = 8
"""Helper processes deleting a large batch of files from an object store at once."""
_PER_PROCESS = 64  # fewer files than this per helper are not worth starting one
BACKGROUND_HELPERS = 4
"""Long-lived helper processes the background deletes on object stores are spread over."""
CLEANUP_WAIT = 10.0
"""Seconds ``wait_for_cleanup`` waits by default (the CLI before it exits, and any process at
exit): index entries are only a cache, so deletes still running then are dropped, and the next
sweep finds what they would have deleted."""

# delta-rs's file system handler holds the GIL while it waits on the network, so threads do
# not overlap its deletes; helper processes do. A helper is a plain interpreter (-P: nothing
# from the working directory) that imports only delta-rs (never the user's main module, nor
# Spark) and reads jobs as JSON lines on stdin, each {root, options, paths}, deleting each with
# exactly the options and environment the commits use, and answering each with a JSON line:
# the failures.
_DELETER = """
import json, sys
import pyarrow.fs as pafs
from deltalake.fs import DeltaStorageHandler
stores = {}
for line in sys.stdin:
    job = json.loads(line)
    key = json.dumps([job["root"], job["options"]], sort_keys=True)
    if key not in stores:
        stores[key] = pafs.PyFileSystem(DeltaStorageHandler(job["root"], job["options"]))
    fs, failed = stores[key], []
    for path in job["paths"]:
        try:
            fs.delete_file(path)
        except FileNotFoundError:
            pass
        except Exception as exc:
            failed.append(path + ": " + (str(exc).splitlines() or [""])[0])
    print(json.dumps(failed), flush=True)
"""


def _start_deleter() -> Any:
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-P", "-c", _DELETER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


class _BackgroundDeleter:
    """Up to ``BACKGROUND_HELPERS`` long-lived helper processes for the deletes
    ``Store.delete_later`` queues on object stores (used from the one cleanup thread only):
    started once, not per epoch, and each job's files spread over them, so its deletes run in
    parallel (a store that answers slowly costs one request's time per share, not per file)."""

    def __init__(self) -> None:
        self.procs: list[Any] = []

    def delete(self, root: str, options: Mapping[str, str], paths: list[str]) -> list[str]:
        import json

        shares = min(BACKGROUND_HELPERS, len(paths))
        self.procs = [p for p in self.procs if p.poll() is None]
        while len(self.procs) < shares:
            self.procs.append(_start_deleter())
        job = {"root": root, "options": dict(options)}
        busy = self.procs[:shares]
        failed: list[str] = []
        try:
            for i, proc in enumerate(busy):
                proc.stdin.write(json.dumps({**job, "paths": paths[i::shares]}) + "\n")
                proc.stdin.flush()
            answers = [proc.stdout.readline() for proc in busy]
        except (OSError, ValueError) as exc:  # a pipe closed (``stop``: the wait gave up)
            self.stop()
            raise StorageError(f"the delete helper processes stopped: {exc}") from exc
        for answer in answers:
            if not answer:
                self.stop()
                raise StorageError("a delete helper process stopped before answering")
            failed.extend(json.loads(answer))
        return failed

    def stop(self) -> None:
        """End the helpers now, deletes in flight or not (what they leave, a sweep finds)."""
        procs, self.procs = self.procs, []
        for proc in procs:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(5)


_background_deleter = _BackgroundDeleter()


def _delete_remote(
    root: str, options: Mapping[str, str], paths: list[str], *, background: bool = False
) -> None:
    """Delete ``paths`` from an object store. In the background: through the long-lived
    helper processes (the GIL stays the epoch's). Else in this process below ``_PER_PROCESS``
    files, or spread over up to ``DELETE_PROCESSES`` helper processes. Raises ``StorageError``
    naming the first failure, after trying every file."""
    helpers = min(DELETE_PROCESSES, len(paths) // _PER_PROCESS)
    if background:
        failed = _background_deleter.delete(root, options, paths)
    elif helpers < 2:
        fs = _filesystem(root, tuple(sorted(options.items())))
        failed = []
        for path in paths:
            try:
                fs.delete_file(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                failed.append(f"{path}: {first_line(exc)}")
    else:
        import json

        job = {"root": root, "options": dict(options)}
        procs = [(_start_deleter(), json.dumps({**job, "paths": paths[i::helpers]})) for i in range(helpers)]
        # Every helper at once, each with its share; closing stdin ends it after its answer.
        with ThreadPoolExecutor(len(procs)) as pool:
            answers = list(pool.map(lambda pj: pj[0].communicate(pj[1] + "\n"), procs))
        failed = []
        for (proc, _), (out, _err) in zip(procs, answers, strict=True):
            if proc.returncode != 0 or not out:
                failed.append(f"a delete helper exited with {proc.returncode}")
                continue
            failed.extend(json.loads(out))
    _raise_failed(root, failed, len(paths))


def _raise_failed(root: str, failed: Sequence[str], tried: int) -> None:
    if failed:
        raise StorageError(f"{len(failed)} of {tried} deletes under {root} failed, e.g. {failed[0]}")


class _Cleanup:
    """The one background thread that runs queued cleanup, in order. A daemon thread, unlike
    a ``ThreadPoolExecutor``'s (which the interpreter joins at exit, however long the store
    takes to answer): how long a process waits for it is ``wait_for_cleanup``'s to bound."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]]
        self._jobs = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Queue ``fn(*args)``; its future. ``RuntimeError`` at interpreter shutdown."""
        future: Future[Any] = Future()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="mvsink-cleanup", daemon=True)
                self._thread.start()
            self._jobs.put((future, fn, args))
        return future

    def drop(self) -> int:
        """Cancel every job not yet started; how many."""
        dropped = 0
        while True:
            try:
                future, _, _ = self._jobs.get_nowait()
            except queue.Empty:
                return dropped
            dropped += future.cancel()

    def _run(self) -> None:
        while True:
            future, fn, args = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)


@functools.lru_cache(maxsize=1)
def _cleanup_pool() -> _Cleanup:
    atexit.register(wait_for_cleanup)
    return _Cleanup()


def wait_for_cleanup(timeout: float | None = CLEANUP_WAIT) -> bool:
    """Wait until the deletes ``Store.delete_later`` queued so far are done (one background
    thread runs them, in order), for at most ``timeout`` seconds (None: however long it
    takes); whether they all finished. Past the timeout the rest are dropped: those queued are
    cancelled and the helper processes of those in flight ended, so a store that accepts
    connections and never answers cannot hold the process. What they would have deleted (index
    entries: only a cache) stays for the next sweep or ``vacuum``. Runs at exit by itself."""
    pool = _cleanup_pool()
    try:
        pool.submit(lambda: None).result(timeout)
        return True
    except RuntimeError:  # the interpreter is shutting down and the thread is gone
        return False
    except FutureTimeout:
        dropped = pool.drop()
        _background_deleter.stop()
        log.warning(
            "background deletes of index entries still running after %gs (%d more queued): left "
            "for the next sweep",
            timeout,
            dropped,
        )
        return False


@functools.lru_cache(maxsize=16)
def _handler(root: str, options: tuple[tuple[str, str], ...]) -> Any:
    """delta-rs's own file system handler for ``root`` (its raw output streams take bytes)."""
    return raw_storage_handler(root, dict(options))


def _by_name(names: Sequence[str], path: str) -> dict[str, str]:
    """A file's columns by lower-cased name: Delta matches column names without regard to case
    (a foreign writer may store ``amount`` for the table's ``Amount``)."""
    out: dict[str, str] = {}
    for name in names:
        if name.lower() in out:
            raise InvariantViolation(f"data file {path} holds columns {out[name.lower()]!r} and {name!r}")
        out[name.lower()] = name
    return out


def _by_field_id(schema: pa.Schema) -> dict[str, str]:
    """A file's top-level columns by their Parquet field id, where it has them."""
    out = {}
    for f in schema:
        found = field_id(f)
        if found:
            out[found] = f.name
    return out


def _cast(column: pa.ChunkedArray, to: pa.DataType) -> pa.ChunkedArray:
    return column if column.type == to else column.cast(to)


def _view(column: pa.ChunkedArray, to: pa.DataType) -> pa.ChunkedArray:
    """``column`` as the same layout with other field names (never ``cast``: a struct cast
    matches fields by name and fills the others with nulls, silently)."""
    if column.type == to and str(column.type) == str(to):
        return column
    return pa.chunked_array([chunk.view(to) for chunk in column.chunks], to)


def _physical(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` with the table's columns named as its files name them (column mapping)."""
    if not is_mapped(schema):
        return rows
    fields, columns = [], []
    for name, column in zip(rows.column_names, rows.columns, strict=True):
        field = schema.field(name) if name in schema.names else rows.schema.field(name)
        held = physical_field(field)
        fields.append(held)
        columns.append(_view(_cast(column, field.type), held.type))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _escape(name: str) -> str:
    return url_quote(name, safe="")


def _escape_value(value: str | None) -> str:
    return NULL_PARTITION if value is None else url_quote(value, safe="")


def _partition_groups(
    rows: pa.Table, partition_by: Sequence[str]
) -> Iterable[tuple[dict[str, str | None], pa.Array | None]]:
    """Each partition value of ``rows`` (as Delta strings) with the indices of its rows."""
    if not partition_by:
        yield {}, None
        return
    if rows.num_rows == 0:
        return
    keyed = rows.select(list(partition_by)).append_column("__i", pa.array(np.arange(rows.num_rows)))
    groups = keyed.group_by(list(partition_by), use_threads=False).aggregate([("__i", "list")])
    lists = groups.column("__i_list").combine_chunks()
    offsets = lists.offsets.to_numpy()
    members = lists.values
    for g, key in enumerate(groups.select(list(partition_by)).to_pylist()):
        values = {c: partition_string(key[c]) for c in partition_by}
        for c, v in values.items():
            if v == "":
                raise InputError(
                    f"an empty string in partition column {c}: Delta partitions store it as null, so "
                    "the target could not equal desired; map it to null or another value"
                )
        yield values, members.slice(offsets[g], offsets[g + 1] - offsets[g])


def partition_array(value: str | None, to: pa.DataType, n: int) -> pa.Array:
    """``n`` copies of a partition value from the log, typed as ``to``."""
    if value is None:
        return pa.nulls(n, to)
    typed: Any
    if pa.types.is_timestamp(to):
        stamp = dt.datetime.fromisoformat(value.strip())
        if to.tz is not None:
            stamp = stamp.replace(tzinfo=dt.UTC) if stamp.tzinfo is None else stamp.astimezone(dt.UTC)
        elif stamp.tzinfo is not None:
            stamp = stamp.astimezone(dt.UTC).replace(tzinfo=None)
        typed = stamp
    elif pa.types.is_date(to):
        typed = dt.date.fromisoformat(value[:10])
    elif pa.types.is_boolean(to):
        typed = value.lower() == "true"
    elif pa.types.is_integer(to):
        typed = int(value)
    elif pa.types.is_floating(to):
        typed = float(value)
    elif pa.types.is_decimal(to):
        typed = decimal.Decimal(value)
    elif pa.types.is_binary(to) or pa.types.is_large_binary(to):
        typed = value.encode("utf-8", errors="surrogateescape")
    else:
        typed = value
    one = pa.array([typed], to)
    return one.take(pa.array(np.zeros(n, dtype=np.int64))) if n != 1 else one
