"""Compact: merge a view's small files into full ones, through the sink's own strict commit.

Every epoch that inserts adds files, and every rewrite leaves a smaller one; nothing merges
them. ``compact`` picks the files holding fewer than ``small_rows`` rows (a quarter of
``max_rows_per_file`` by default), per partition, and rewrites each group as files of up to
``max_rows_per_file`` rows, sorted by ``cluster_by`` when given.

Why it cannot race a sink into losing data: the commit is the sink's strict compare-and-append
(``commit.append``): it lands only if nothing at all was committed since the
snapshot it read, so a sink epoch in between makes it retry from a fresh snapshot, and a
compaction landing first makes the sink's epoch retry (never the silent no-op remove of
DELTA_NOTES). It changes no row: the new files hold exactly the old files' rows (checked by
count before the commit), the actions say ``dataChange = false`` (streaming readers and the
change feed skip it), and the frontier is left as it is. The files' index entries are carried
over from the old files (no row is hashed again), so the sink's next epoch reads nothing.

The commit records the ``max_rows_per_file`` it wrote files of (``record.ROWS_PER_FILE``), so
that ``mvsink status`` judges small files as the compaction did: files it just wrote are not small
to it, whatever limit the sink itself writes with.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from mvsink.config import RetryPolicy
from mvsink.errors import ConfigError, ConflictError, InvariantViolation, Where
from mvsink.table.catalog import locate
from mvsink.table.commit import Lost, append, retrying
from mvsink.table.delta import DataFile, Snapshot, load_snapshot
from mvsink.table.fingerprint import I64
from mvsink.table.index import FileEntry, StoredIndex
from mvsink.table.layout import Layout
from mvsink.table.record import Keys, compact_metadata
from mvsink.table.schema import check_cluster_by, target_struct
from mvsink.table.staging import clustered
from mvsink.table.storage import Store, Written

log = logging.getLogger(__name__)

MAX_ROWS = 5_000_000
"""Rows one compaction reads at most (on the driver); run it again for more."""


def small_rows_of(max_rows_per_file: int) -> int:
    """The rows under which a file is small, to a compaction writing files of up to
    ``max_rows_per_file`` rows: a quarter of them (a file that full is not worth rewriting)."""
    return max(2, max_rows_per_file // 4)


@dataclass(frozen=True)
class Compaction:
    """What a compaction did: ``version`` None when there was nothing to merge."""

    target: str
    view: str
    version: int | None
    files_removed: int
    files_added: int
    rows: int
    attempts: int

    def __str__(self) -> str:
        if self.version is None:
            return f"{self.target}: nothing to compact for view {self.view}"
        return (
            f"{self.target}: compacted {self.files_removed:,} small file(s) into {self.files_added:,} "
            f"({self.rows:,} rows) as version {self.version}"
        )


def compact(
    target: str,
    name: str,
    storage_options: Mapping[str, str] | None = None,
    *,
    max_rows_per_file: int = 50_000,
    cluster_by: Sequence[str] = (),
    small_rows: int | None = None,
    max_rows: int = MAX_ROWS,
    retry: RetryPolicy | None = None,
    engine: str = "auto",
) -> Compaction:
    """Merge the small files of view ``name``'s table at ``target`` (see the module doc)."""
    options = dict(storage_options or {})
    where = Where(name, target)
    target = locate(target, where)
    policy = retry or RetryPolicy()
    keys = Keys.of(name)
    small = small_rows_of(max_rows_per_file) if small_rows is None else small_rows

    def one_attempt(attempt: int) -> Compaction | Lost:
        snap = load_snapshot(target, keys.frontier, options, where, engine=engine)
        if not snap.exists or snap.schema_json is None:
            raise ConfigError("there is no Delta table to compact", where)
        if "rowTracking" in snap.features:
            raise ConfigError(
                "the table tracks row ids, and a compaction here rewrites rows as new files with new "
                "ids (dataChange = false promises none changed): compact it with Delta's OPTIMIZE",
                where,
            )
        if snap.frontier is None:
            raise ConfigError(f"the table at {target} holds no view {name!r} (nothing it committed)", where)
        check_cluster_by(target_struct(snap.schema_json), cluster_by, where)
        groups = _small_groups(snap, small, max_rows)
        if not groups:
            return Compaction(target, name, None, 0, 0, 0, attempt)
        layout = Layout(snap.schema_json, target_struct(snap.schema_json), snap.partition_by)
        store = Store(snap.root, options)
        index = StoredIndex.of(store, name, layout.arrow)
        folder = f"mvsink-{name}-compact-{uuid.uuid4().hex[:12]}"
        removes = [f for group in groups for f in group]
        written: list[Written] = []
        try:
            after = _stage(
                groups, removes, store, index, layout, folder, max_rows_per_file, cluster_by, written
            )
        except BaseException:
            _discard(store, folder, index, written)  # nothing committed: nothing can reference them
            raise
        # From the commit call on, only a lost race says the files are unreferenced; any
        # other error (outcome unknown, an interrupt) keeps them for vacuum.
        outcome = append(
            snap,
            store,
            adds=[w.file for w in written],
            removes=removes,
            app_id=keys.app_id,
            upper=None,
            attempt_id=uuid.uuid4().hex,
            metadata=compact_metadata(name, len(removes), len(written), max_rows_per_file),
            schema_json=snap.schema_json,
            partition_by=snap.partition_by,
            where=where,
            transactions={keys.compacted: snap.frontier or 0},
            data_change=False,
        )
        if isinstance(outcome, Lost):  # known not to have landed
            _discard(store, folder, index, written)
            return outcome
        index.forget(f.key for f in removes)
        return Compaction(target, name, outcome.version, len(removes), len(written), after, attempt)

    def lost(n: int, race: Lost, pause: float) -> None:
        log.info("%s: compaction lost a commit race; retrying in %.2fs", where, pause)

    def exhausted(n: int) -> Exception:
        return ConflictError(f"compaction lost the commit race {n} times; nothing changed", where)

    return retrying(policy, one_attempt, lost=lost, exhausted=exhausted)


def _stage(
    groups: Sequence[Sequence[DataFile]],
    removes: Sequence[DataFile],
    store: Store,
    index: StoredIndex,
    layout: Layout,
    folder: str,
    max_rows_per_file: int,
    cluster_by: Sequence[str],
    written: list[Written],
) -> int:
    """Write each group's rows as full files (appending to ``written``) with their index
    entries; returns the rows written, checked equal to the rows removed."""
    for group in groups:
        merged, fps = _merged(group, store, index, layout)
        rows, sorted_fps = clustered(merged, fps, cluster_by)
        written += store.write(
            folder, rows, layout.partition_by, max_rows_per_file, sorted_fps, schema=layout.arrow
        )
    before = sum(f.num_records or 0 for f in removes)
    after = sum(w.file.num_records for w in written)
    if before != after:
        raise InvariantViolation(f"compaction wrote {after} rows of {before}")
    for w in written:
        assert w.fp_a is not None and w.fp_b is not None
        index.put(w.file.path, w.file.size, FileEntry(w.fp_a, w.fp_b))
    return after


def _small_groups(snap: Snapshot, small_rows: int, max_rows: int) -> list[list[DataFile]]:
    """Per partition, the small files worth merging (two or more), within ``max_rows``."""
    by_partition: dict[str, list[DataFile]] = {}
    for f in snap.files:
        if f.num_records is not None and f.num_records < small_rows:
            by_partition.setdefault(json.dumps(dict(f.partition_values), sort_keys=True), []).append(f)
    groups, budget = [], max_rows
    for files in by_partition.values():
        picked = []
        for f in files:
            if (f.num_records or 0) > budget:
                break
            picked.append(f)
            budget -= f.num_records or 0
        if len(picked) >= 2:
            groups.append(picked)
    return groups


def _merged(
    files: Sequence[DataFile], store: Store, index: StoredIndex, layout: Layout
) -> tuple[pa.Table, tuple[I64, I64]]:
    """The files' rows, concatenated, with their fingerprints from the index (computed only
    for a file that has no entry)."""
    tables, lanes_a, lanes_b = [], [], []
    for f in files:
        rows = store.read(f, layout.arrow, layout.partition_by)
        entry, _ = index.load(f, layout.arrow, layout.partition_by)
        if len(entry) != rows.num_rows:
            raise InvariantViolation(
                f"index entry of {f.path} has {len(entry)} rows, the file {rows.num_rows}"
            )
        tables.append(rows)
        lanes_a.append(entry.a)
        lanes_b.append(entry.b)
    return pa.concat_tables(tables), (np.concatenate(lanes_a), np.concatenate(lanes_b))


def _discard(store: Store, folder: str, index: StoredIndex, written: Sequence[Written]) -> None:
    store.delete_folder(folder)
    index.forget(w.file.path for w in written)
