"""What a mode's planner hands staging, and what staging hands the commit.

A ``Plan`` (``mvsink.plan``: what a mode decided) is rows to insert and files to rewrite
without some rows, with what the planner found making it (files it read, whether it writes
desired in place of every file, whether a Spark job ran the whole batch). ``stage``
(``staging.py``) writes it as files nothing references yet: a ``Staged``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
from pyspark.sql import DataFrame

from mvsink.table.delta import DataFile, NewFile
from mvsink.table.fingerprint import I64
from mvsink.table.index import FileEntry, StoredIndex
from mvsink.table.storage import Store


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
class Moved:
    """What staging made of one rewritten file's rows, for what follows the commit (the
    history, ``history/keep.py``): the rows of ``source`` (its identity; ``size`` rows) but
    those at ``drop`` went, in order, to ``copies`` (paths and row counts: each copy a run of
    the kept rows, in the file's order), or stayed in ``update`` (the file added again with a
    vector dropping them). ``keys``: the key columns of the file's rows, in its order, that
    tell a follower its own copy of them lines up (None: the rows were never read)."""

    source: str
    size: int
    drop: I64
    copies: tuple[tuple[str, int], ...] = ()
    update: str | None = None
    keys: pa.Table | None = None


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
    commits: bool = False
    """The attempt commits for these files alone (it commits a version even if it changes no
    row): what they record happens nowhere else."""


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
    sides: tuple[SideFiles, ...] = ()
    # What the planner found making it (the epoch's report reads them):
    files_read: int = 0
    """Data files of the snapshot this attempt reads: to plan, or to write back a rewritten
    file's kept rows (``EpochReport.files_read``)."""
    replaces_all: bool = False
    """Desired is written in place of every file of the snapshot, rather than a correction file
    by file (``EpochReport.whole``)."""
    ran_batch: bool = False
    """Planning ran a Spark job over every partition of the batch (``EpochContext.drain``
    need not)."""

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
    sides: tuple[SideFiles, ...] = ()
    side_paths: tuple[str, ...] = ()
    """The files ``sides`` wrote."""
    replaces_all: bool = False
    """The plan's ``Plan.replaces_all``: the commit replaces every file with desired."""
    moved: tuple[Moved, ...] = ()
    """Where the rewritten files' rows went, when staging was asked to say (``stage``'s
    ``moves``): the driver's rewrites."""

    @property
    def bytes_written(self) -> int:
        vectors = sum(int((f.deletion_vector or {}).get("sizeInBytes", 0)) + 8 for f in self.updates)
        return sum(f.size for f in (*self.adds, *self.changes)) + vectors


NOTHING = Staged(None, (), {}, (), 0, 0)
