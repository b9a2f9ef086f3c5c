"""The persisted side, kept as an index: for each data file, its row fingerprints in order.

Delta data files are immutable and their paths unique, so an entry, once computed, stays true
for as long as the file is in the table; the index never needs invalidating, only extending.
Each epoch ``sync`` drops entries of files that left the snapshot and reads, through the I/O
layer, only the files it has not seen (another writer's commit, a compaction, a restart),
hashing them where they are read. Files this sink stages are indexed as they are written. The
persisted side of an epoch is then the concatenation of the entries of the snapshot's files.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mvsink.correction import I64, Fingerprints
from mvsink.delta import DataFile, Snapshot
from mvsink.errors import InvariantViolation, Where
from mvsink.fingerprint import fingerprints

if TYPE_CHECKING:
    import pyarrow as pa

    from mvsink.storage import Store

log = logging.getLogger(__name__)
_THREADS = 8


@dataclass(frozen=True)
class FileEntry:
    """Fingerprints of one file's rows, in row order."""

    a: I64
    b: I64

    def __len__(self) -> int:
        return len(self.a)


class PersistedIndex:
    """Fingerprints of the target's files, keyed by their decoded path (``DataFile.key``;
    the log lists paths percent-encoded, staged files are known by their raw path)."""

    def __init__(self) -> None:
        self._files: dict[str, FileEntry] = {}

    def entry(self, path: str) -> FileEntry:
        return self._files[path]

    def put(self, path: str, entry: FileEntry) -> None:
        self._files[path] = entry

    def forget(self, paths: Iterable[str]) -> None:
        for p in paths:
            self._files.pop(p, None)

    def sync(self, store: Store, snap: Snapshot, schema: pa.Schema, where: Where) -> int:
        """Make the index cover exactly ``snap``'s files; returns how many files it read."""
        live = {f.key for f in snap.files}
        self.forget([p for p in self._files if p not in live])
        missing = [f for f in snap.files if f.key not in self._files]
        if not missing:
            return 0
        log.info("%s: indexing %d file(s) not seen before", where, len(missing))

        def index(f: DataFile) -> FileEntry:
            a, b = fingerprints(store.read(f, schema, snap.partition_by))
            return FileEntry(a, b)

        with ThreadPoolExecutor(_THREADS) as pool:
            entries = list(pool.map(index, missing))
        for f, entry in zip(missing, entries, strict=True):
            if f.num_records is not None and f.num_records != len(entry):
                raise InvariantViolation(
                    f"{f.path} holds {len(entry)} rows but the Delta log says {f.num_records}", where
                )
            self._files[f.key] = entry
        return len(missing)

    def persisted(self, files: Sequence[DataFile]) -> Fingerprints:
        """The persisted side over ``files``: file numbers index into ``files``."""
        entries = [self._files[f.key] for f in files]
        if not entries:
            return Fingerprints.empty()
        sizes = np.array([len(e) for e in entries], dtype=np.int64)
        return Fingerprints(
            a=np.concatenate([e.a for e in entries]),
            b=np.concatenate([e.b for e in entries]),
            file=np.repeat(np.arange(len(entries), dtype=np.int64), sizes),
            pos=np.concatenate([np.arange(n, dtype=np.int64) for n in sizes]),
        )
