"""A rewritten file's kept rows: what becomes of a file an attempt retracts rows of.

Its kept rows are written as new files (from the copy read for planning, else read here), or,
on a table with deletion vectors, the dropped rows are marked in a new deletion vector of the
file (``mark``), which the commit adds again. With Change Data Feed, the dropped rows also go
into a change file (``change_feed.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa

from mvsink.errors import InvariantViolation, Where
from mvsink.table.change_feed import with_change_type
from mvsink.table.delta import DataFile
from mvsink.table.fingerprint import fingerprints
from mvsink.table.index import FileEntry
from mvsink.table.layout import Layout
from mvsink.table.plan import Moved, Rewrite
from mvsink.table.storage import Store, Written


@dataclass(frozen=True)
class Kept:
    """What became of one rewritten file: the rows it keeps, the files written for it (its
    kept rows, or its dropped rows' change file), and, when a deletion vector drops its rows
    instead, the file as the commit adds it again and its index entry."""

    rows: int
    written: list[Written]
    update: DataFile | None = None
    entry: FileEntry | None = None
    moved: Moved | None = None
    """Where its rows went, when asked (``write_kept``'s ``moves``)."""


def write_kept(
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
    moves: Sequence[str] = (),
) -> Kept:
    """Drop a rewritten file's rows at ``rewrite.drop``: write its kept rows as new files, or,
    with ``vectors``, mark the dropped rows in a new deletion vector of the file (``mark``).
    The file is read here unless planning read it, and released once written (one file per
    thread at a time); a file whose every row goes is not read at all, unless its dropped rows
    go into a change file under ``changes``. The kept rows' fingerprints come from the
    rewrite's, or are computed if ``hash_kept``. With ``moves`` (key columns), it says where
    the rows went (``Moved``, keyed by those columns of the rows it read).

    The kept rows' copies hold them in the file's order, each copy the next run of them
    (``Store.write`` of one partition's rows slices them in order): what ``Moved`` says."""
    drop = rewrite.drop
    if len(drop) and (drop[0] < 0 or (len(drop) > 1 and not bool(np.all(drop[1:] > drop[:-1])))):
        raise InvariantViolation(
            f"positions to drop from {rewrite.file.path} are not distinct and sorted", where
        )
    drops_all = rewrite.size is not None and len(drop) == rewrite.size
    if changes is None and (drops_all or (vectors and rewrite.file.num_records is not None)):
        if drops_all:
            return Kept(0, [], moved=_moved(rewrite, moves, None, [], None))
        return _marked(mark(store, folder, rewrite, [], where), rewrite, moves, rewrite.rows)
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
        return Kept(0, out, moved=_moved(rewrite, moves, rows, [], None))
    if vectors and rewrite.file.num_records is not None:
        return _marked(mark(store, folder, rewrite, out, where), rewrite, moves, rows)
    kept = rows.filter(pa.array(keep))
    fps = None
    if rewrite.fps is not None:
        fps = (rewrite.fps[0][keep], rewrite.fps[1][keep])
    elif hash_kept:
        fps = fingerprints(kept)
    copies = store.write(folder, kept, layout.partition_by, max_rows_per_file, fps, schema=layout.arrow)
    return Kept(kept.num_rows, out + copies, moved=_moved(rewrite, moves, rows, copies, None))


def _moved(
    rewrite: Rewrite,
    moves: Sequence[str],
    rows: pa.Table | None,
    copies: list[Written],
    update: DataFile | None,
) -> Moved | None:
    """``Moved`` for a rewrite, when asked (``moves``) and its size is known."""
    size = rewrite.size if rows is None else rows.num_rows
    if not moves or size is None:
        return None
    return Moved(
        rewrite.file.identity,
        size,
        rewrite.drop,
        tuple((w.file.path, w.file.num_records) for w in copies),
        None if update is None else update.identity,
        None if rows is None else rows.select(list(moves)),
    )


def _marked(kept: Kept, rewrite: Rewrite, moves: Sequence[str], rows: pa.Table | None) -> Kept:
    return replace(kept, moved=_moved(rewrite, moves, rows, [], kept.update))


def mark(store: Store, folder: str, rewrite: Rewrite, written: list[Written], where: Where) -> Kept:
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
    return Kept(update.num_records or 0, written, update, entry)
