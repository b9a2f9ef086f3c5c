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
  by a crash): the same rule, since their files are data files no version references.
* **Index entries** (``_mvsink/<view>/index/``, which Delta's vacuum never looks into) of files
  that left the table, or of an old table layout: an entry is only ever a cache of a file's
  fingerprints, so deleting one costs at worst a re-read. Entries written in the last hour
  (``index.FRESH_SECONDS``, which the sink's own sweep keeps too) are kept, so an attempt in
  flight does not have to recompute its own.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from mvsink.errors import ConfigError, EngineRefused, StorageError, Where, first_line
from mvsink.table.catalog import locate
from mvsink.table.delta import _US_PER_HOUR, RETENTION, Snapshot, load_snapshot, table_retention_us
from mvsink.table.index import FRESH_SECONDS, HIDDEN, StoredIndex
from mvsink.table.record import PREFIX
from mvsink.table.schema import target_struct
from mvsink.table.storage import Store
from mvsink.table.write import Layout


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

    def __str__(self) -> str:
        verb = "deleted" if self.applied else "would delete (dry run; --apply to delete)"
        staged = sum(1 for p in self.data_files if p.startswith("mvsink-"))
        return (
            f"{self.target}: {verb} {len(self.data_files):,} data file(s), {self.data_bytes:,} bytes "
            f"({staged:,} of them staged by attempts that never committed), and "
            f"{len(self.index_entries):,} index entries, {self.index_bytes:,} bytes"
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
    table = DeltaTable(snap.root, storage_options=options or None)
    hours = _retention_hours(retention_hours, table.metadata().configuration, where)
    try:
        _refuse_nested_tables(store, where)
        if snap.engine == "delta-spark":  # delta-rs's vacuum commits, and cannot to this table
            listed = snap._jvm.vacuum(snap.root, dry_run=True)
            sizes = store.sizes(listed)
            # Its dry run also lists folders, which it deletes only if empty: not data files.
            found = [p for p in listed if p in sizes]
            if apply:
                snap._jvm.vacuum(snap.root, dry_run=False)
            data = found  # what the dry run listed: Delta's VACUUM reports no list
        else:
            found = table.vacuum(retention_hours=hours, dry_run=True, full=True)
            sizes = store.sizes(found)
            data = table.vacuum(retention_hours=hours, dry_run=False, full=True) if apply else found
    except (DeltaError, EngineRefused) as exc:
        raise ConfigError(f"vacuum refused: {exc}", where) from None
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


def _refuse_nested_tables(store: Store, where: Where) -> None:
    """Refuse to vacuum a table that holds another Delta table in a sub-folder: a full vacuum
    takes the inner table's log and data files for unreferenced files of the outer one. Any
    ``_delta_log/`` below the root gives the inner table away, however old its files are (one
    listing of the table, as the full vacuum makes itself)."""
    try:
        listed = store.files("")
    except OSError as exc:
        raise StorageError(f"cannot list the table to vacuum: {first_line(exc)}", where) from exc
    inner = sorted({p.split("/_delta_log/")[0] for p in listed if "/_delta_log/" in p})
    if inner:
        raise ConfigError(
            f"the table holds another Delta table in its folder ({inner[0]}/): a vacuum would delete "
            "that table's files. Move the inner table out of the target's folder, then vacuum.",
            where,
        )


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
