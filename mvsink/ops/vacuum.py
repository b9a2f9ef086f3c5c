"""Vacuum: delete what no version within the retention can reference. Dry run by default.

Three kinds of leftovers, and why deleting each cannot lose data:

* **Data files** no longer in the table: delegated to delta-rs's full vacuum (or, on a table
  only the session's JVM Delta writes, to Delta's own VACUUM, which also keeps every deletion
  vector a version references), which deletes a
  file only if the latest version does not reference it and it left the table (or, never
  committed, was last written) longer ago than the retention. The retention defaults to the
  table's ``delta.deletedFileRetentionDuration`` (7 days), and another is refused on either
  engine (``_retention_hours``): a shorter one could delete the staged files of an attempt
  about to commit, or files a reader of a recent version still needs; a longer one would
  not keep what it says, since Delta keeps the record of a removed file only as long as the
  table's retention (checkpoints drop older ones), after which only the file's age protects
  it. To keep history longer, raise the table's retention.
* **Staged folders of attempts that never committed** (``mvsink-<view>-e<epoch>-<id>``, left
  by a crash): the same rule, since their files are data files no version references. On
  ``apply``, a staging folder left empty is removed too (on local disk, with ``rmdir``, which
  refuses a folder that holds anything; an object store has no folders, one is gone with its
  last file).
* **Index entries** (``_mvsink/<view>/index/``, which Delta's vacuum never looks into) of files
  that left the table, or of an old table layout: an entry is only ever a cache of a file's
  fingerprints, so deleting one costs at worst a re-read. Entries written in the last hour
  (``index.FRESH_SECONDS``, which the sink's own sweep keeps too) are kept, so an attempt in
  flight does not have to recompute its own.

The report tells the data files apart, from the log (``table/log.log_actions``), so that
ordinary leftovers do not read as crashes. A file some commit added or removed **left the
table** (every epoch that rewrites a file leaves one, and a compaction many). A file that no
commit names was **never committed** (a crashed attempt's): claimed only with proof, that
every commit which could have added it is still in the log and was read. A commit is written
after the files it adds, so these are the commits written since the file was (read newest
first, until every file is accounted for), and the proof holds when the log reaches back to
version 0 or the file was written after the oldest commit the log keeps (``CLOCK_MARGIN``
allowing for clocks). A file the log no longer reaches back to counts as one that left the
table: log cleanup may have taken the commits that added and removed it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow.fs as pafs

from mvsink.errors import ConfigError, EngineRefused, StorageError, Where, first_line
from mvsink.table.catalog import locate
from mvsink.table.delta import Snapshot, delta_errors, load_snapshot, open_table
from mvsink.table.index import FRESH_SECONDS, HIDDEN, StoredIndex
from mvsink.table.layout import Layout
from mvsink.table.log import log_actions
from mvsink.table.properties import _US_PER_HOUR, RETENTION, table_retention_us
from mvsink.table.record import PREFIX
from mvsink.table.schema import target_struct
from mvsink.table.storage import Store
from mvsink.table.uris import is_local

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Vacuum:
    """What a vacuum deleted (``applied``) or would delete (a dry run)."""

    target: str
    applied: bool
    retention_hours: int | None
    """None: the table's own retention."""
    data_files: tuple[str, ...]
    data_bytes: int
    index_entries: tuple[str, ...]
    index_bytes: int
    never_committed: tuple[str, ...] = ()
    """Of ``data_files``, those no commit ever added (staged by attempts that never committed:
    a crash), proven from the log; the others left the table (see the module doc)."""
    staging_folders: tuple[str, ...] = ()
    """Staging folders (``mvsink-*``) left empty by the deletes: removed, or that would be."""

    def __str__(self) -> str:
        verb = "deleted" if self.applied else "would delete (dry run; --apply to delete)"
        left = len(self.data_files) - len(self.never_committed)
        folders = "removed" if self.applied else "would remove"
        return (
            f"{self.target}: {verb} {len(self.data_files):,} data file(s), {self.data_bytes:,} bytes "
            f"({left:,} no longer in the table, "
            f"{len(self.never_committed):,} staged by attempts that never committed), and "
            f"{len(self.index_entries):,} index entries, {self.index_bytes:,} bytes; "
            f"{folders} {len(self.staging_folders):,} staging folder(s) left empty"
        )


def vacuum(
    target: str,
    storage_options: Mapping[str, str] | None = None,
    *,
    retention_hours: int | None = None,
    apply: bool = False,
) -> Vacuum:
    """Vacuum the Delta table at ``target`` (see the module doc); only a dry run unless ``apply``."""
    options = dict(storage_options or {})
    where = Where(None, target)
    target = locate(target, where)
    snap = load_snapshot(target, PREFIX, options, where)
    if not snap.exists:
        raise ConfigError("there is no Delta table to vacuum", where)
    store = Store(snap.root, options)
    table = open_table(snap.root, options)
    hours = _retention_hours(retention_hours, table.metadata().configuration, where)
    listed = _listing(store, where)
    empty = _empty_folders(store, hours)  # before a data vacuum (Delta's removes empty folders)
    try:
        with delta_errors(where, "vacuum", refused=ConfigError, not_found=ConfigError):
            _refuse_nested_tables(listed, where)
            if snap.engine == "delta-spark":  # delta-rs's vacuum commits, and cannot to this table
                found = snap._jvm.vacuum(snap.root, dry_run=True)
                sizes = store.sizes(found)
                # Its dry run also lists folders, which it deletes only if empty: not data files.
                found = [p for p in found if p in sizes]
                if apply:
                    snap._jvm.vacuum(snap.root, dry_run=False)
                data = found  # what the dry run listed: Delta's VACUUM reports no list
            else:
                found = table.vacuum(retention_hours=hours, dry_run=True, full=True)
                sizes = store.sizes(found)
                data = table.vacuum(retention_hours=hours, dry_run=False, full=True) if apply else found
    except EngineRefused as exc:
        raise ConfigError(f"vacuum refused: {exc}", where) from None
    folders = _emptied_folders(listed, data, empty)
    if apply:
        folders = _remove_empty(store, folders)
    entries = _stale_entries(store, snap)
    if apply:
        store.delete(entries)
    return Vacuum(
        target=target,
        applied=apply,
        retention_hours=retention_hours,
        data_files=tuple(sorted(data)),
        data_bytes=sum(sizes.get(p, 0) for p in data),
        index_entries=tuple(sorted(entries)),
        index_bytes=sum(entries.values()),
        never_committed=tuple(sorted(_never_committed(store, listed, data))),
        staging_folders=tuple(folders),
    )


def _retention_hours(hours: int | None, configuration: Mapping[str, str | None], where: Where) -> int:
    """The retention, in whole hours, for delta-rs's vacuum: the table's (see the module doc);
    another asked for, or a table retention not read as Delta reads it, is refused before
    anything is listed or deleted."""
    table = table_retention_us(configuration)
    if table is None or table < 0:
        raise ConfigError(
            f"vacuum refused: cannot use the table's {RETENTION} ({configuration.get(RETENTION)!r}); "
            "set it as 'interval <n> days' (or hours), at least 0",
            where,
        )
    shown = f"{table / _US_PER_HOUR:g} hours"
    if hours is not None and hours * _US_PER_HOUR < table:
        raise ConfigError(
            f"vacuum refused: a retention of {hours} hours is below the table's {RETENTION} "
            f"({shown}); it could delete files an attempt about to commit or a reader of a recent "
            "version still needs",
            where,
        )
    if hours is not None and hours * _US_PER_HOUR > table:
        raise ConfigError(
            f"vacuum refused: a retention of {hours} hours is above the table's {RETENTION} "
            f"({shown}), which is all Delta keeps removed files on record for (checkpoints drop "
            "older ones): to keep history longer, raise the table's retention",
            where,
        )
    return -(-table // _US_PER_HOUR)  # whole hours, rounded up: never less than the table's


def _listing(store: Store, where: Where) -> dict[str, tuple[int, float]]:
    """Every file of the table, with its size and modification time: one listing, as the
    full vacuum makes itself."""
    try:
        return store.listing("")
    except OSError as exc:
        raise StorageError(f"cannot list the table to vacuum: {first_line(exc)}", where) from exc


def _refuse_nested_tables(listed: Mapping[str, object], where: Where) -> None:
    """Refuse to vacuum a table that holds another Delta table in a sub-folder: a full vacuum
    takes the inner table's log and data files for unreferenced files of the outer one. Any
    ``_delta_log/`` below the root gives the inner table away, however old its files are."""
    inner = sorted({p.split("/_delta_log/")[0] for p in listed if "/_delta_log/" in p})
    if inner:
        raise ConfigError(
            f"the table holds another Delta table in its folder ({inner[0]}/): a vacuum would delete "
            "that table's files. Move the inner table out of the target's folder, then vacuum.",
            where,
        )


CLOCK_MARGIN = 3600.0
"""Seconds by which a file must postdate the oldest commit the log keeps for its absence from
the log to prove it never committed: a commit is written after the files it adds, but the
two times are read off the store's clock (and a copy of the table may have shifted them)."""


def _never_committed(store: Store, listed: Mapping[str, tuple[int, float]], files: Sequence[str]) -> set[str]:
    """Those of ``files`` that no commit of the log ever added, proven (see the module doc).

    A commit names a file (adds it, later removes it) only after the file was written, so
    only the commits written since the oldest file not yet accounted for are read, newest
    first, until every file is: the cost is the log since that file, not the whole log."""
    unknown = {
        p: listed[p][1] for p in files if p in listed and not p.rpartition("/")[2].startswith(_VECTOR_FILE)
    }
    kept = _kept_commits(listed)
    if not kept:
        return set()
    start = min(kept)
    since = min(unknown.values(), default=0.0) - CLOCK_MARGIN
    read = 0
    for version in sorted(kept, reverse=True):
        if not unknown:
            break
        if kept[version] < since:
            continue  # written before every file left to account for: it names none of them
        if read == MAX_COMMITS_READ:
            start = version + 1  # what the commits read prove, as if the log began there
            break
        read += 1
        actions = log_actions(store, version)
        if actions is None:  # cleaned up since the listing: the log now starts after it
            start = version + 1
            break
        named = _named(actions)
        if any(_absolute(p) for p in named):
            return set()  # a file named by its URI (a shallow clone's): not matched against the listing
        named &= unknown.keys()
        for p in named:
            del unknown[p]
        if named:
            since = min(unknown.values(), default=0.0) - CLOCK_MARGIN
    if start == 0:
        return set(unknown)
    # Commits before ``start`` are gone: a file written before it may have been added there.
    return {p for p, written in unknown.items() if written - CLOCK_MARGIN > kept.get(start, float("inf"))}


def _absolute(path: str) -> bool:
    """Whether a log path is a URI or an absolute path (a file outside the table's folder)."""
    return "://" in path or path.startswith("/")


MAX_COMMITS_READ = 2_000
"""Commits one vacuum reads at most to tell never committed files apart (one GET each on an
object store): a file older than the commits read is not claimed never committed."""

_VECTOR_FILE = "deletion_vector_"
"""Deletion vector files are named by an encoded id in the log, never by their path: the log
cannot prove one never committed, so none is claimed to have."""


def _kept_commits(listed: Mapping[str, tuple[int, float]]) -> dict[int, float]:
    """The commits the log still holds without a gap up to the newest, as ``{version: time
    written}`` (log cleanup deletes the oldest; a gap would hide the commits before it)."""
    written = {
        int(name[:20]): mtime
        for path, (_, mtime) in listed.items()
        if path.startswith("_delta_log/")
        and len(name := path.removeprefix("_delta_log/")) == 25
        and name.endswith(".json")
        and name[:20].isdigit()
    }
    kept: dict[int, float] = {}
    version = max(written, default=-1)
    while version in written:
        kept[version] = written[version]
        version -= 1
    return kept


def _named(actions: Sequence[Mapping[str, Any]]) -> set[str]:
    """The paths (relative, unescaped) of the files a commit's actions add or remove."""
    paths = (a[kind].get("path") for a in actions for kind in ("add", "remove", "cdc") if kind in a)
    return {unquote(p) for p in paths if isinstance(p, str)}


def _emptied_folders(
    listed: Mapping[str, tuple[int, float]], deleted: Sequence[str], empty: set[str]
) -> list[str]:
    """The staging folders (``mvsink-*`` at the root) that hold no file once ``deleted`` are
    gone: those whose every file is among them, and those of ``empty`` (``_empty_folders``:
    already empty, an earlier vacuum's) the listing saw no file in."""
    holds: dict[str, bool] = {}
    gone = set(deleted)
    for path in listed:
        top, sep, _ = path.partition("/")
        if sep and top.startswith(_STAGING):
            holds[top] = holds.get(top, False) or path not in gone
    emptied = {folder for folder, keeps in holds.items() if not keeps}
    return sorted(emptied | (empty - holds.keys()))


def _empty_folders(store: Store, hours: int) -> set[str]:
    """Staging folders at the root that hold no file and were last changed longer ago than the
    retention, as a file of theirs would have to be: a folder made in the last moments may be
    an attempt's in flight, about to get its first file. None on an object store, which has no
    folder without a file. (The caller leaves out the folders the listing saw a file in.)"""
    if not is_local(store.root):
        return set()
    cutoff = time.time() - hours * 3600
    infos = store.fs.get_file_info(pafs.FileSelector("", allow_not_found=True))
    return {
        i.base_name
        for i in infos
        if i.type == pafs.FileType.Directory
        and i.base_name.startswith(_STAGING)
        and i.mtime is not None
        and i.mtime.timestamp() < cutoff
    }


_STAGING = "mvsink-"
"""How the folders attempts and compactions stage their files in are named (``table/staging.py``,
``ops/compact.py``)."""


def _remove_empty(store: Store, folders: Sequence[str]) -> list[str]:
    """Remove those of ``folders`` that hold no file; return the ones gone. On local disk each
    directory goes with ``rmdir``, deepest first, which refuses one that holds anything (a file
    written meanwhile keeps its folder); an object store has no folders, so there a folder is
    gone with its last file and nothing is deleted here."""
    removed = []
    for folder in folders:
        if is_local(store.root):
            _rmdir_tree(os.path.join(store.root, folder))
        if store.fs.get_file_info(folder).type == pafs.FileType.NotFound:
            removed.append(folder)
    return removed


def _rmdir_tree(path: str) -> None:
    """Remove ``path`` and the directories below it, deepest first, each only if empty (a
    best effort: a folder left behind is the next vacuum's)."""
    for folder, _, _ in os.walk(path, topdown=False):
        try:
            os.rmdir(folder)
        except OSError as exc:
            log.info("kept staging folder %s: %s", folder, first_line(exc))


def _stale_entries(store: Store, snap: Snapshot) -> dict[str, int]:
    """Index entries of no live file under the table's current layout, older than an hour."""
    assert snap.schema_json is not None
    arrow = Layout(snap.schema_json, target_struct(snap.schema_json), snap.partition_by).arrow
    listed = store.listing(HIDDEN)
    views = {p.split("/")[1] for p in listed if p.count("/") >= 3 and p.split("/")[2] == "index"}
    indexes = [StoredIndex.of(store, v, arrow) for v in views]  # one layout digest per view
    keep = {index.path(f.key) for index in indexes for f in snap.files}
    now = time.time()
    return {
        p: size
        for p, (size, mtime) in listed.items()
        if p.split("/")[2:3] == ["index"] and p not in keep and now - mtime > FRESH_SECONDS
    }
