"""The persisted side, kept as an index: for each data file, its row fingerprints in order.

Delta data files are immutable and their paths unique, so an entry, once computed, stays true
for as long as the file is in the table; the index never needs invalidating, only extending.
An entry holds every row of its Parquet file, so a deletion vector never changes it: the rows
the file's vector drops are dropped from the entry when it is used (``StoredIndex.get``), and
on the driver ``DriverIndex`` holds the result under ``DataFile.identity`` (the path and the
vector's id).

The index lives in storage (``StoredIndex``), one small Parquet file per data file under the
table's hidden folder::

    _mvsink/<view>/index/<layout digest>/<digest of the data file's path>.parquet

It is written by whoever writes the data file (the driver or a Spark task), before the commit,
so a restarted sink reads the index and not the table. A file first seen in the table without
an entry (another writer's, a compaction's, a crash's) is read and hashed once, and its entry
written. An entry names its data file's path, size and row count, and is used only when they
match the log's; an entry of a file that never committed, or left the table, is harmless and is
swept (``StoredIndex.sweep``). The layout digest covers the table's Arrow schema and the
fingerprint version, so a schema change starts a new index instead of misreading the old.
Vacuum leaves ``_``-prefixed folders alone: the sink prunes them itself.

On the driver (``DriverIndex``) the entries of the snapshot's files are also held in memory,
so a steady epoch reads nothing at all.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mvsink.errors import InvariantViolation, StorageError, Where
from mvsink.table.delta import DataFile, Snapshot
from mvsink.table.fingerprint import FINGERPRINT_VERSION, I64, Fingerprints, fingerprints
from mvsink.table.schema import is_mapped, physical_field
from mvsink.table.storage import Store

log = logging.getLogger(__name__)
_THREADS = 8
SWEEP_EVERY = 100
"""Epochs between sweeps of the stored index (the first epoch of a sink sweeps)."""
FRESH_SECONDS = 3600.0
"""Index entries (and temporary files of entries being written) younger than this are never
deleted, by the sink's sweep or by ``vacuum``: another writer's attempt in flight may have just
written them (and store clocks may run a few minutes apart)."""
HIDDEN = "_mvsink"
"""The table's folder for mvsink's own files (Delta readers and vacuum ignore ``_`` folders)."""
_ENTRY_SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.int64())])


@dataclass(frozen=True)
class FileEntry:
    """Fingerprints of one file's rows, in row order."""

    a: I64
    b: I64

    def __len__(self) -> int:
        return len(self.a)


@dataclass(frozen=True)
class StoredIndex:
    """The index entries of one view and table layout, in the table's storage. Picklable:
    Spark tasks write and read entries through it."""

    store: Store
    view: str
    digest: str
    """Of the table's Arrow schema and the fingerprint version (see the module doc)."""
    fingerprint_version: int = FINGERPRINT_VERSION
    """The fingerprint version of the process that made this value (the driver). A Spark
    worker whose mvsink hashes rows another way must never write or use entries under it."""

    @staticmethod
    def of(store: Store, view: str, schema: pa.Schema, version: int = FINGERPRINT_VERSION) -> StoredIndex:
        """The index of ``view`` for tables of ``schema``, hashed with fingerprint ``version``
        (another version than this process's is for reading where old entries lie only)."""
        text = f"{version}\n{schema.remove_metadata().to_string(show_field_metadata=False)}"
        if is_mapped(schema):
            # Which columns of the files hold each field: a column dropped and added again
            # under column mapping has a new physical name, and old files none of its values.
            held = pa.schema([physical_field(f) for f in schema])
            text += f"\n{held.to_string(show_field_metadata=True)}"
        return StoredIndex(store, view, hashlib.sha256(text.encode()).hexdigest()[:16])

    def _check_version(self) -> None:
        if self.fingerprint_version != FINGERPRINT_VERSION:
            raise InvariantViolation(
                f"this process hashes rows with fingerprint version {FINGERPRINT_VERSION}, the driver "
                f"with {self.fingerprint_version}: the Spark workers run another mvsink than the "
                "driver. Install the driver's mvsink version on the workers."
            )

    @property
    def root(self) -> str:
        return f"{HIDDEN}/{self.view}/index"

    def path(self, key: str) -> str:
        """Where the entry of the data file at ``key`` (``DataFile.key``) lives."""
        return f"{self.root}/{self.digest}/{hashlib.sha256(key.encode()).hexdigest()[:32]}.parquet"

    def put(self, key: str, size: int, entry: FileEntry) -> None:
        """Write the entry of the data file at ``key`` (of ``size`` bytes): every row of it."""
        self._check_version()
        table = pa.table([pa.array(entry.a), pa.array(entry.b)], schema=_ENTRY_SCHEMA)
        table = table.replace_schema_metadata(
            {"mvsink.file": key, "mvsink.size": str(size), "mvsink.rows": str(len(entry))}
        )
        sink = pa.BufferOutputStream()
        # Fingerprints are random bits: compression and dictionaries only cost time.
        pq.write_table(table, sink, compression="none", use_dictionary=False)
        self.store.put(self.path(key), sink.getvalue())

    def get(self, file: DataFile) -> FileEntry | None:
        """The stored entry of ``file``, if there is one and it describes this very file, less
        the rows its deletion vector drops."""
        self._check_version()
        data = self.store.get(self.path(file.key))
        if data is None:
            return None
        try:
            table = pq.read_table(pa.BufferReader(data), use_threads=False)  # small: threads cost more
            meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
            a = table.column("a").to_numpy().astype(np.int64, copy=False)
            b = table.column("b").to_numpy().astype(np.int64, copy=False)
        except Exception as exc:  # a damaged entry is recomputed, never trusted
            log.warning("index entry of %s is unreadable (%s); recomputing it", file.key, exc)
            return None
        rows = None if file.num_records is None else file.num_records + file.deleted
        if (
            meta.get("mvsink.file") != file.key
            or meta.get("mvsink.size") != str(file.size)
            or (rows is not None and rows != len(a))
        ):
            return None
        return _held(self.store, file, FileEntry(a, b))

    def load(self, file: DataFile, schema: pa.Schema, partition_by: Sequence[str]) -> tuple[FileEntry, bool]:
        """The entry of ``file``: stored, or computed by reading the file (then stored).
        Also says whether the data file was read."""
        entry = self.get(file)
        if entry is not None:
            return entry, False
        a, b = fingerprints(self.store.read(file, schema, partition_by, every_row=True))
        entry = FileEntry(a, b)
        physical = None if file.num_records is None else file.num_records + file.deleted
        if physical is not None and physical != len(entry):
            raise InvariantViolation(f"{file.path} holds {len(entry)} rows but the Delta log says {physical}")
        try:
            self.put(file.key, file.size, entry)
        except Exception as exc:  # the entry is a cache: failing to store it loses no data
            log.warning("could not store the index entry of %s: %s", file.key, exc)
        return _held(self.store, file, entry), True

    def forget(self, keys: Iterable[str], *, wait: bool = True) -> None:
        """Delete the entries of data files that left the table (best-effort); with
        ``wait=False`` in the background (nothing needs them gone: a sweep catches leftovers)."""
        paths = [self.path(k) for k in keys]
        if not wait:
            self.store.delete_later(paths, "index entries")
            return
        try:
            self.store.delete(paths)
        except Exception as exc:
            log.warning("could not delete index entries under %s: %s", self.root, exc)

    def sweep(self, live: Iterable[str], *, now: float | None = None) -> int:
        """Delete every entry that is not of a file in ``live`` (keys) under this layout and
        was last written more than ``FRESH_SECONDS`` before ``now`` (default: the clock):
        leftovers of attempts that never committed, files compacted away, old layouts.
        Returns how many went. A younger one may be another writer's in flight: an entry it is
        about to commit with, or the temporary file of a put about to be renamed into place
        (``Store.put``), whose loss would fail that writer's epoch; like ``vacuum``, the sweep
        leaves it to a later sweep."""
        keep = {self.path(k) for k in live}
        try:
            listed = self.store.listing(self.root)
        except Exception as exc:
            log.warning("could not sweep index entries under %s: %s", self.root, exc)
            return 0
        cutoff = (time.time() if now is None else now) - FRESH_SECONDS
        stale = [p for p, (_, mtime) in listed.items() if p not in keep and mtime < cutoff]
        self.store.delete_later(stale, "stale index entries")  # nothing waits for them to go
        return len(stale)


def _held(store: Store, file: DataFile, entry: FileEntry) -> FileEntry:
    """The entry of the rows ``file`` holds: all of its Parquet file's, less its vector's."""
    if not file.deletion_vector:
        return entry
    keep = store.alive(file, len(entry))
    return FileEntry(entry.a[keep], entry.b[keep])


class DriverIndex:
    """The entries of the target's files held on the driver, keyed by their decoded path
    (``DataFile.identity``; the log lists paths percent-encoded, staged files are known by their
    raw path), backed by the ``StoredIndex``."""

    def __init__(self) -> None:
        self._files: dict[str, FileEntry] = {}
        self._packed: tuple[tuple[str, ...], FileEntry, frozenset[str], I64] | None = None
        """The files last packed, in order; their entries in one pair of arrays (the entries
        held are views of it); the same files as a set; where each file's rows start. It is
        dropped whenever an entry it packed is forgotten or replaced."""
        self._digest: str | None = None
        self._calls = 0

    def entry(self, path: str) -> FileEntry:
        return self._files[path]

    def put(self, path: str, entry: FileEntry) -> None:
        if self._packed is not None and path in self._packed[2] and self._files.get(path) is not entry:
            self._packed = None  # the packing must hold exactly the entries held
        self._files[path] = entry

    def forget(self, paths: Iterable[str]) -> None:
        for p in paths:
            if self._files.pop(p, None) is not None and self._packed is not None and p in self._packed[2]:
                self._packed = None  # the packing must hold exactly the entries held

    def clear(self) -> None:
        """Hold no entry (the next ``sync`` loads them all again)."""
        self._files.clear()
        self._packed = None

    def sweep_once(self, stored: StoredIndex, snap: Snapshot, where: Where) -> None:
        """Sweep the stored index (``StoredIndex.sweep``) once per ``SWEEP_EVERY`` calls, from
        the first on: entries of files gone since, or never committed, only take space."""
        self._calls += 1
        if (self._calls - 1) % SWEEP_EVERY:
            return
        gone = stored.sweep(f.key for f in snap.files)
        if gone:
            log.info("%s: swept %d index entries of files not in the table", where, gone)

    def sync(self, stored: StoredIndex, snap: Snapshot, schema: pa.Schema, where: Where) -> int:
        """Make the index cover exactly ``snap``'s files, loading entries from storage or
        computing them; returns how many data files it had to read."""
        if stored.digest != self._digest:  # a new table layout: every fingerprint changes
            self._files.clear()
            self._packed = None
            self._digest = stored.digest
        live = {f.identity for f in snap.files}
        self.forget([p for p in self._files if p not in live])
        missing = [f for f in snap.files if f.identity not in self._files]
        if not missing:
            return 0
        log.info("%s: loading the index entries of %d file(s)", where, len(missing))

        def load(f: DataFile) -> tuple[FileEntry, bool]:
            try:
                return stored.load(f, schema, snap.partition_by)
            except InvariantViolation as exc:
                raise InvariantViolation(exc.message, where) from None
            except OSError as exc:
                raise StorageError(f"cannot read data file {f.path} to index it: {exc}", where) from exc

        with ThreadPoolExecutor(_THREADS) as pool:
            loaded = list(pool.map(load, missing))
        for f, (entry, _) in zip(missing, loaded, strict=True):
            self.put(f.identity, entry)
        return sum(1 for _, read in loaded if read)

    def persisted(self, files: Sequence[DataFile]) -> Fingerprints:
        """The persisted side over ``files`` (file numbers index into ``files``).

        The entries are packed into one pair of arrays, and from then on held as views of it:
        the driver holds each row's fingerprint once (16 bytes), not a copy per epoch. Packed
        already over these files (in any order), nothing is copied."""
        if not files:
            return Fingerprints.empty()
        numbered = {f.identity: k for k, f in enumerate(files)}
        if len(numbered) != len(files):
            raise ValueError("a file is listed twice")
        if self._packed is None or self._packed[2] != numbered.keys():
            self._pack(tuple(numbered))
        assert self._packed is not None
        identities, whole, _, starts = self._packed
        numbers = np.array([numbered[i] for i in identities], dtype=np.int64)
        return Fingerprints(whole.a, whole.b, starts=starts, numbers=numbers)

    def pack(self) -> None:
        """Pack the entries held now, ahead of the next ``persisted``: called once an epoch's
        own arrays are gone, so that the old packing and the new never meet desired's
        fingerprints in memory (the old one goes once every entry is a view of the new)."""
        self._pack(tuple(self._files))

    def _pack(self, identities: tuple[str, ...]) -> None:
        # An identity names one file's rows for good: the same files, the same packing.
        if self._packed is not None and self._packed[2] == set(identities):
            return
        sizes = np.array([len(self._files[i]) for i in identities], dtype=np.int64)
        starts = np.cumsum(sizes) - sizes
        total = int(sizes.sum())
        a, b = np.empty(total, dtype=np.int64), np.empty(total, dtype=np.int64)
        self._packed = None
        for i, start, n in zip(identities, starts.tolist(), sizes.tolist(), strict=True):
            entry = self._files[i]  # each entry as it is copied becomes a view: a loaded one goes
            a[start : start + n], b[start : start + n] = entry.a, entry.b
            self._files[i] = FileEntry(a[start : start + n], b[start : start + n])
        self._packed = (identities, FileEntry(a, b), frozenset(identities), starts)
