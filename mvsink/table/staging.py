"""The write step: stage one plan as Parquet files that no Delta version references yet.

A ``Plan`` (``plan.py``) is rows to insert and files to rewrite without some rows. Rows to
insert are either an Arrow table already on the driver, written here, or a Spark DataFrame
that is never collected, written by Spark tasks (``tasks.py``). A rewritten file's kept rows
are written from the copy read for planning (``rewrite.py``). Files are staged in a fresh
folder ``mvsink-<view>-e<epoch>-<id>`` under the table root: never a ``_`` or ``.`` folder,
which vacuum would not look into once the files are removed. Nothing here is visible until
the commit; ``discard`` removes a failed attempt's files (I4).

On a table with Change Data Feed, an attempt that rewrites files also stages its change files
(``change_feed.py``).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import pyarrow as pa

from mvsink.errors import InputError, InvariantViolation, StorageError, Where, first_line
from mvsink.table.change_feed import CHANGE_DIR, split_changes, with_change_type
from mvsink.table.delta import DataFile
from mvsink.table.fingerprint import I64
from mvsink.table.index import FileEntry, StoredIndex
from mvsink.table.layout import Layout
from mvsink.table.plan import NOTHING, Moved, Plan, SideFiles, Staged, TaskRewrites
from mvsink.table.rewrite import Kept, write_kept
from mvsink.table.storage import Store, Written
from mvsink.table.tasks import raise_task_errors, rewrite_frame, write_frame

# Threads moving files on the driver (object stores are latency-bound).
IO_THREADS = 8


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
    moves: Sequence[str] = (),
) -> Staged:
    """Write ``plan``'s inserts and rewrites as new files (and their index entries, if the plan
    is indexed); with ``change_feed``, also the change files a commit that rewrites files needs
    (``change_feed.py``); with ``deletion_vectors``, a file that keeps some rows gets a deletion
    vector instead of being rewritten; with ``moves`` (key columns), where each rewritten
    file's rows went (``Staged.moved``: the driver's rewrites). Nothing becomes visible. The
    steps: the rewrites start (``_start_rewrites``), the inserts are written meanwhile
    (``_write_inserts``), the rewrites end, the new files are indexed (``_index``) and every
    row counted (``_check_counts``)."""
    if plan.inserts is None and not plan.rewrites:
        if not plan.sides:
            return NOTHING
        return replace(NOTHING, sides=plan.sides, side_paths=_write_sides(store, plan.sides, where))
    folder = f"mvsink-{view}-e{epoch}-{uuid.uuid4().hex[:12]}"
    changes = f"{folder}/{CHANGE_DIR}" if change_feed and plan.rewrites else None
    at = _Attempt(store, layout, folder, changes, max_rows_per_file, where, deletion_vectors, tuple(moves))
    side_paths = _write_sides(store, plan.sides, where)
    written: list[Written] = []
    with _discarded_on_failure(store, folder, plan, written, where):
        with ThreadPoolExecutor(IO_THREADS) as pool:
            rewritten, jobs = _start_rewrites(plan, at, pool)
            written += rewritten.written
            written += _write_inserts(plan, at, cluster_by)
            for job in jobs:
                done = job.result()
                written += done.written
                rewritten.add(done)
            written[:], changed = split_changes(folder, [w for w in written if w.file.num_records > 0])
            entries = _index(plan.index, written, rewritten.updates, pool)
        inserted = _check_counts(plan, written, changed, rewritten, at)
    return Staged(
        folder,
        tuple(w.file for w in written),
        entries,
        rewritten.removes,
        inserted,
        plan.retracted,
        tuple(w.file for w in changed),
        tuple(u.update for u in rewritten.updates if u.update is not None),
        plan.sides,
        side_paths,
        replaces_all=plan.replaces_all,
        moved=tuple(rewritten.moved),
    )


@contextlib.contextmanager
def _discarded_on_failure(
    store: Store, folder: str, plan: Plan, written: list[Written], where: Where
) -> Iterator[None]:
    """Run the staging in the block; if it fails, its files (``written`` so far) go, and an
    input or storage error is raised naming ``where``."""
    try:
        yield
    except InputError as exc:
        _discard(store, folder, plan.index, written, plan.sides)
        if str(exc.where):
            raise
        raise InputError(exc.message, where) from None
    except OSError as exc:  # the store refused a write: read-only, full, unreachable
        _discard(store, folder, plan.index, written, plan.sides)
        raise StorageError(
            f"cannot write this attempt's files under {folder}: {first_line(exc)}. Nothing was committed.",
            where,
        ) from exc
    except BaseException:
        _discard(store, folder, plan.index, written, plan.sides)
        raise


@dataclass(frozen=True)
class _Attempt:
    """Where and how one attempt stages its files."""

    store: Store
    layout: Layout
    folder: str
    changes: str | None
    """The change files' folder (Change Data Feed, when the attempt rewrites files), if any."""
    max_rows_per_file: int
    where: Where
    vectors: bool
    """A rewritten file that keeps some rows gets a deletion vector (``rewrite.mark``)."""
    moves: tuple[str, ...] = ()
    """Say where each rewritten file's rows went, by these key columns (``Moved``)."""


@dataclass
class _Rewritten:
    """The rewrites' outcome so far: the files written for them, the rows they keep, the
    snapshot files they replace, and those added again with a deletion vector."""

    written: list[Written] = field(default_factory=list)
    kept: int = 0
    removes: tuple[DataFile, ...] = ()
    updates: list[Kept] = field(default_factory=list)
    moved: list[Moved] = field(default_factory=list)

    def add(self, done: Kept) -> None:
        """One driver rewrite's outcome (``rewrite.write_kept``)."""
        self.kept += done.rows
        if done.update is not None:
            self.updates.append(done)
        if done.moved is not None:
            self.moved.append(done.moved)


def _start_rewrites(
    plan: Plan, at: _Attempt, pool: ThreadPoolExecutor
) -> tuple[_Rewritten, list[Future[Kept]]]:
    """Rewrites decided in Spark, done by Spark tasks (``tasks.rewrite_frame``) before this
    returns; rewrites decided on the driver, started on ``pool`` (their outcomes: the futures)."""
    if isinstance(plan.rewrites, TaskRewrites):
        files, kept, removes, updates = rewrite_frame(
            plan.rewrites,
            at.store,
            at.folder,
            at.layout,
            at.max_rows_per_file,
            plan.index,
            at.where,
            at.changes,
            vectors=at.vectors,
        )
        return _Rewritten(files, kept, removes, updates), []
    jobs = [
        pool.submit(
            write_kept,
            at.store,
            at.folder,
            r,
            at.layout,
            at.max_rows_per_file,
            at.where,
            changes=at.changes,
            vectors=at.vectors,
            moves=at.moves,
        )
        for r in plan.rewrites
    ]
    return _Rewritten(removes=tuple(r.file for r in plan.rewrites)), jobs


def _write_inserts(plan: Plan, at: _Attempt, cluster_by: Sequence[str]) -> list[Written]:
    """The plan's rows to insert (and, with Change Data Feed, their change file): written here
    when on the driver, clustered; by Spark tasks (``tasks.write_frame``) when a DataFrame."""
    layout, parts = at.layout, at.layout.partition_by
    if isinstance(plan.inserts, pa.Table):
        rows, fps = clustered(plan.inserts, plan.insert_fps, cluster_by)
        written = at.store.write(at.folder, rows, parts, at.max_rows_per_file, fps, schema=layout.arrow)
        if at.changes is not None:
            inserted = with_change_type(rows, "insert")
            written += at.store.write(at.changes, inserted, parts, at.max_rows_per_file, schema=layout.arrow)
        return written
    if plan.inserts is None:
        return []
    return write_frame(
        plan.inserts,
        at.store,
        at.folder,
        layout,
        max_rows_per_file=at.max_rows_per_file,
        cluster_by=cluster_by,
        index=plan.index,
        where=at.where,
        changes=at.changes,
    )


def _index(
    index: StoredIndex | None, written: list[Written], updates: list[Kept], pool: ThreadPoolExecutor
) -> dict[str, FileEntry]:
    """Store the index entries of the data files written on the driver (tasks stored their
    own), if the plan is indexed: those entries, by path, for the driver's index, with those of
    the files a new deletion vector drops rows of."""
    entries: dict[str, FileEntry] = {}
    if index is None:
        return entries
    for w in written:
        if w.fp_a is not None and w.fp_b is not None:
            entries[w.file.path] = FileEntry(w.fp_a, w.fp_b)
    sizes = {w.file.path: w.file.size for w in written}
    list(pool.map(lambda p: index.put(p, sizes[p], entries[p]), entries))
    # A file with a new vector keeps its stored entry (every row of its Parquet file); the
    # driver's index holds what it now holds.
    for u in updates:
        if u.update is not None and u.entry is not None:
            entries[u.update.identity] = u.entry
    return entries


def _check_counts(
    plan: Plan, written: list[Written], changed: list[Written], rewritten: _Rewritten, at: _Attempt
) -> int:
    """The rows inserted; ``InvariantViolation`` unless the staged files hold exactly the rows
    the plan needs (kept plus inserted) and the change files exactly those it changes."""
    kept = rewritten.kept
    total = sum(w.file.num_records for w in written) + sum(u.rows for u in rewritten.updates)
    needed = None if plan.inserted is None else kept + plan.inserted
    if (needed is not None and total != needed) or total < kept:
        raise InvariantViolation(
            f"staged {total} rows where the plan needs {needed} "
            f"({kept} kept from rewritten files + {plan.inserted} inserted)",
            at.where,
        )
    in_changes = sum(w.file.num_records for w in changed)
    if at.changes is not None and in_changes != total - kept + plan.retracted:
        raise InvariantViolation(
            f"staged change files hold {in_changes} rows where the attempt retracts "
            f"{plan.retracted} and inserts {total - kept}",
            at.where,
        )
    return total - kept


def _write_sides(store: Store, sides: Sequence[SideFiles], where: Where) -> tuple[str, ...]:
    """Write each of ``sides``; the paths written. On a failure, every side's folder goes."""
    paths: list[str] = []
    for side in sides:
        try:
            paths += side.writer.write(store)
        except OSError as exc:
            _drop_sides(store, sides)
            raise StorageError(
                f"cannot write {side.folder}: {first_line(exc)}. Nothing was committed.", where
            ) from exc
        except BaseException as exc:
            _drop_sides(store, sides)
            if isinstance(exc, Exception):
                raise_task_errors(exc, where)
            raise
    return tuple(paths)


def _drop_sides(store: Store, sides: Sequence[SideFiles]) -> None:
    for side in sides:
        store.delete_folder(side.folder)


def discard(staged: Staged, store: Store, index: StoredIndex | None) -> None:
    """Delete an attempt's staged files (and their index entries): it did not commit (I4)."""
    if staged.folder:
        store.delete_folder(staged.folder)
        if index is not None:
            index.forget(f.path for f in staged.adds)
    _drop_sides(store, staged.sides)


def _discard(
    store: Store,
    folder: str,
    index: StoredIndex | None,
    written: list[Written],
    sides: Sequence[SideFiles],
) -> None:
    store.delete_folder(folder)
    if index is not None:
        index.forget(w.file.path for w in written)
    _drop_sides(store, sides)


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
