"""Status: what the target says about the views it holds, read from the Delta log alone.

Everything comes from the latest snapshot (frontier, lineage and promotion app transactions,
the file list) and the commit metadata mvsink writes with every commit (``mvsink.view``,
``mvsink.epoch``, ``mvsink.inserted`` ..., ``mvsink.attempts``) over the last ``history``
commits, plus the notes stalled sinks leave (``clock.Stall``). No data file is read, so it
is cheap on any table and store. Small files are those under the ``small_rows`` given, or under
the threshold of the view's last compaction within those commits (a quarter of the
``max_rows_per_file`` it recorded, ``ops/compact.py``) when that is lower.

Where there is no table, ``describe_missing_table`` says what is there instead.

``Status.to_json`` is the stable form behind ``mvsink status --json`` (docs/operations.md):
fields are only ever added, never renamed or removed, and ``"format"`` names its version.
"""

from __future__ import annotations

import json
import os
import posixpath
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs as pafs

from mvsink.epoch.clock import stall_notes
from mvsink.errors import Where, first_line
from mvsink.ops.compact import small_rows_of
from mvsink.ops.history import HistoryStatus, history_status
from mvsink.plan import tombstones
from mvsink.table.catalog import locate
from mvsink.table.delta import load_snapshot
from mvsink.table.log import history as delta_history
from mvsink.table.record import (
    HISTORY,
    HOLDER,
    PROMOTED,
    VIEW,
    EpochCommit,
    Keys,
    compacted_rows_per_file,
    holder_tag,
    promotions,
    views_of,
)
from mvsink.table.storage import Store
from mvsink.table.uris import is_local, table_root

FORMAT = 1
"""Version of the JSON form; bumped only if a field changes meaning."""


@dataclass(frozen=True)
class LastCommit:
    """The view's newest commit within the history read."""

    version: int
    timestamp_ms: int
    epoch: int | None
    inserted: int
    retracted: int
    lineage: str | None
    writer: str | None


@dataclass(frozen=True)
class ViewStatus:
    view: str
    frontier: int | None
    """The upper of the view's last commit (``mvsink:<view>``)."""
    owner_generation: int | None
    """The generation of the lineage that owns the view (None: no lineage recorded)."""
    active_writer: str | None
    """The writer promoted last (``mvsink promote``), if the promotion is within the history
    read; ``"#<n>"`` for promotion number n otherwise; None: never promoted (active-active)."""
    last_commit: LastCommit | None
    versions_behind: int | None
    """Table versions committed after the view's last commit (by anyone)."""
    seconds_since_commit: float | None
    commits: int
    """The view's commits within the history read."""
    retried_commits: int
    """Of those, commits that lost at least one commit race before landing."""
    conflicts: int
    """Commit races lost by those commits in all."""
    committed_time: dict[str, int] | None = None
    """Under a shared clock, the source offsets of the view's last commit within the history
    read (``clock.py``): where a new replica's query must start, or earlier."""
    tombstones: int | None = None
    """Upsert mode with sequences and deletes: the deleted keys the view remembers
    (``tombstones.py``), within their retention or not yet dropped. None: it keeps none."""
    stalled: tuple[dict[str, Any], ...] = ()
    """Sinks of the view stalled under a shared clock (``clock.Stall``): each says its writer,
    lineage, the epoch it stalled ``since_epoch``, its last ``epoch``, ``time``, the
    ``committed`` time it cannot pass and the ``verdict``. Empty: none."""
    kept_history: HistoryStatus | None = None
    """The view's history (``history_target``) named by its newest commit within the history
    read: what it holds (``ops/history.py``). None: it keeps none (or none was made yet)."""


@dataclass(frozen=True)
class Status:
    target: str
    table_version: int | None
    """None: there is no table yet."""
    rows: int | None
    """The rows the latest version holds. None: unknown, on a table with deletion vectors read
    without a Delta Spark session (delta-rs lists the files' row counts, not the rows their
    vectors remove)."""
    files: int
    bytes: int
    small_files: int
    """Files with fewer than ``small_rows`` rows (or no row count): what compaction looks at
    (it merges two or more in a partition, up to its row limit per run)."""
    small_rows: int
    """The threshold the caller gave, or a quarter of ``compacted_to`` when that is lower: a
    file is small only if it is small both to the sink's files and to its last compaction's."""
    views: tuple[ViewStatus, ...]
    history: int
    """How many of the newest commits were read for the per-commit figures."""
    holder: str | None = None
    """The view that holds the table (``epoch/holder.py``): its name; ``"#<tag>"`` for a view
    not named within the history read; None: no view holds it (a foreign table, or none yet)."""
    compacted_to: int | None = None
    """The ``max_rows_per_file`` of the newest compaction within the history read to record one
    (the files it wrote are not small to it, nor to ``small_rows``); None: none did."""

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self), "views": [asdict(v) for v in self.views]}

    def __str__(self) -> str:
        if self.table_version is None:
            return f"{self.target}: no Delta table"
        rows = (
            f"{self.rows:,} rows"
            if self.rows is not None
            else "rows unknown (deletion vectors: run with Delta in the Spark session to count them)"
        )
        judged = (
            ""
            if self.compacted_to is None
            else f"; the last compaction wrote files of up to {self.compacted_to:,} rows"
        )
        lines = [
            f"{self.target}: version {self.table_version}, {rows} in {self.files:,} files "
            f"({self.bytes:,} bytes; {self.small_files:,} with fewer than {self.small_rows:,} rows{judged})"
        ]
        lines.append(f"  held by view {self.holder}" if self.holder else "  held by no mvsink view")
        if not self.views:
            lines.append(f"  no mvsink view committed within the last {self.history} versions")
        for v in self.views:
            lines.append(f"  view {v.view}: frontier {v.frontier}")
            c = v.last_commit
            if c is not None:
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(c.timestamp_ms / 1000))
                lines.append(
                    f"    last commit: version {c.version} at {when} UTC (epoch {c.epoch}, +{c.inserted} "
                    f"-{c.retracted} rows, lineage {c.lineage}, writer {c.writer}); "
                    f"{v.versions_behind} version(s) behind the table, {v.seconds_since_commit:.0f}s ago"
                )
            lines.append(
                f"    lineage generation {v.owner_generation}; active writer "
                f"{v.active_writer or '(none: every replica writes)'}; {v.commits} commit(s) read, "
                f"{v.retried_commits} retried, {v.conflicts} race(s) lost"
            )
            if v.committed_time is not None:
                lines.append(f"    committed source offsets {json.dumps(v.committed_time, sort_keys=True)}")
            if v.tombstones is not None:
                lines.append(f"    {v.tombstones:,} tombstone(s) of deleted keys")
            h = v.kept_history
            if h is not None:
                since = f"since {h.known_since}" if h.known_since else "since the view's first version"
                lines.append(
                    f"    history {h.root}: versions {h.known_from}..{h.holds_to} ({h.open_lifetimes:,} "
                    f"open lifetimes, {h.closed_lifetimes:,} closed; {h.files:,} files, {h.bytes:,} bytes); "
                    f"oldest lifetime from {h.oldest}, the view known {since}"
                )
            for note in v.stalled:
                lines.append(
                    f"    STALLED: writer {note.get('writer')} (lineage {note.get('lineage')}) wrote nothing "
                    f"since its epoch {note.get('since_epoch')}: its time {json.dumps(note.get('time'))} "
                    f"is {note.get('verdict')} the committed {json.dumps(note.get('committed'))}"
                )
        return "\n".join(lines)


def status(
    target: str,
    name: str | None = None,
    storage_options: Mapping[str, str] | None = None,
    *,
    history: int = 200,
    small_rows: int = 12_500,
) -> Status:
    """The status of view ``name`` (or of every view committed within the last ``history``
    versions) in the Delta table at ``target``. ``small_rows`` is the small-file threshold
    when no compaction within those versions recorded its own (see the module doc)."""
    options = dict(storage_options or {})
    where = Where(name, target)
    target = locate(target, where)
    snap = load_snapshot(target, Keys.of(name or "").frontier, options, where, writing=False)
    if not snap.exists:
        return Status(target, None, 0, 0, 0, 0, small_rows, (), history)
    # The history ends at the version the figures describe.
    assert snap.version is not None
    commits = delta_history(Store(snap.root, options), snap.version, history)
    known = sorted(views_of(commits) | ({name} if name else set()))
    names = [name] if name else known
    assert snap.version is not None
    store = Store(snap.root, options)
    views = tuple(_view(snap, n, commits, stall_notes(store, snap, n), store) for n in names)
    compacted = _compacted_to(commits, names)
    if compacted is not None and small_rows_of(compacted) < small_rows:
        small_rows = small_rows_of(compacted)  # what compaction just wrote is not small to it
    return Status(
        target=target,
        table_version=snap.version,
        rows=sum(f.num_records or 0 for f in snap.files) if snap.rows_known else None,
        files=len(snap.files),
        bytes=sum(f.size for f in snap.files),
        small_files=sum(1 for f in snap.files if f.num_records is None or f.num_records < small_rows),
        small_rows=small_rows,
        views=views,
        history=history,
        holder=_holder(snap, known),
        compacted_to=compacted,
    )


def _compacted_to(commits: list[dict[str, Any]], views: list[str]) -> int | None:
    """The ``max_rows_per_file`` that the newest compaction of ``views`` among ``commits``
    (newest first) to record one recorded; None if none did."""
    found = (compacted_rows_per_file(c, views) for c in commits)
    return next((rows for rows in found if rows is not None), None)


def _holder(snap: Any, names: list[str]) -> str | None:
    """The view holding the table: the one ``mvsink#holder`` names, else (a table written
    before holders were recorded) the view whose frontier it records."""
    tag = snap.transaction(HOLDER)
    if tag is None:
        return next((n for n in names if snap.transaction(Keys.of(n).frontier) is not None), None)
    return next((n for n in names if holder_tag(n) == tag), f"#{tag}")


def _view(
    snap: Any, view: str, commits: list[dict[str, Any]], stalled: list[dict[str, Any]], store: Store
) -> ViewStatus:
    keys = Keys.of(view)
    parsed = (EpochCommit.parse(c) for c in commits)
    mine = [c for c in parsed if c is not None and c.view == view]
    newest = max(mine, key=lambda c: c.version) if mine else None
    last = None
    if newest is not None:
        last = LastCommit(
            version=newest.version,
            timestamp_ms=newest.timestamp or snap.transaction(keys.at) or 0,
            epoch=newest.epoch,
            inserted=newest.inserted or 0,
            retracted=newest.retracted or 0,
            lineage=newest.lineage,
            writer=newest.writer,
        )
    attempts = [c.attempts or 1 for c in mine]
    active = snap.transaction(keys.active)
    writer = None
    if active is not None:
        promoted = promotions(commits, view)
        newest_promotion = max(promoted, key=lambda c: int(c["version"])) if promoted else None
        writer = str(newest_promotion[PROMOTED]) if newest_promotion else f"#{active}"
    at = snap.transaction(keys.at) or (last.timestamp_ms if last else None)
    return ViewStatus(
        view=view,
        frontier=snap.transaction(keys.frontier),
        owner_generation=snap.transaction(keys.owner),
        active_writer=writer,
        last_commit=last,
        versions_behind=None if last is None else snap.version - last.version,
        seconds_since_commit=None if at is None else max(0.0, time.time() - at / 1000),
        commits=len(mine),
        retried_commits=sum(1 for a in attempts if a > 1),
        conflicts=sum(a - 1 for a in attempts),
        committed_time=newest.time if newest else None,
        tombstones=tombstones.count(store, snap, view),
        stalled=tuple(stalled),
        kept_history=_kept_history(view, commits, store.options),
    )


def _kept_history(
    view: str, commits: list[dict[str, Any]], options: Mapping[str, str]
) -> HistoryStatus | None:
    """The history the view's newest commit among ``commits`` names, if any."""
    root = next((str(c[HISTORY]) for c in commits if c.get(VIEW) == view and c.get(HISTORY)), None)
    return None if root is None else history_status(root, view, options)


def describe_missing_table(target: str, storage_options: Mapping[str, str] | None = None) -> str:
    """Why there is no Delta table at ``target`` (a path or URI), as a whole message starting
    "no Delta table at <target>": what is there instead and what to do, so that a Parquet
    folder, a misspelled path or a folder inside a table is told apart from a table not made
    yet. One listing of the folder, and a look for a ``_delta_log`` in each folder above it."""
    head = f"no Delta table at {target}"
    options = dict(storage_options or {})
    root = table_root(target)
    if is_local(root) and not os.path.isdir(root):
        what = "it is a file, not a folder" if os.path.exists(root) else "the folder does not exist"
        return f"{head}: {what}"
    try:
        listed = Store(root, options).files("")
        enclosing = _enclosing_table(root, options)
    except OSError as exc:
        return f"{head}: cannot list it ({first_line(exc)})"
    return f"{head}: {_what_is_there(listed, enclosing, is_local(root))}"


def _what_is_there(listed: list[str], enclosing: str | None, local: bool) -> str:
    """What a folder that holds no Delta table holds instead (its files, ``listed``), and what
    to do about it; ``enclosing``: the table the folder lies inside, if any."""
    if enclosing is not None:
        return f"it is a folder inside the Delta table at {enclosing}: point at the table's root"
    inner = sorted({p.split("/_delta_log/")[0] for p in listed if "/_delta_log/" in p})
    if inner:
        shown = ", ".join(f"{i}/" for i in inner[:3])
        return f"it holds Delta table(s) in sub-folders ({shown}): point at the table's root"
    if any(p.startswith("_delta_log/") for p in listed):
        return "its _delta_log holds no commit: the table's first commit never landed, or the log is damaged"
    visible = [p for p in listed if not any(part.startswith(("_", ".")) for part in p.split("/"))]
    parquet = sum(1 for p in visible if p.endswith(".parquet"))
    if parquet:
        return (
            f"it holds {parquet:,} Parquet file(s) but no _delta_log: not a Delta table (write it "
            "with Delta, or point at the table's root)"
        )
    if visible:
        return f"it holds {len(visible):,} file(s), none Parquet, and no _delta_log: not a Delta table"
    if local:
        return "the folder is empty (a sink makes the table at its first epoch)"
    return (
        "nothing is stored under it (an object store has no empty folders: check the path, or no "
        "sink has committed there yet)"
    )


def _enclosing_table(root: str, options: Mapping[str, str]) -> str | None:
    """The nearest folder above ``root`` that holds a ``_delta_log``, if any."""
    for parent in _parents(root):
        log = Store(parent, options).fs.get_file_info(pafs.FileSelector("_delta_log", allow_not_found=True))
        if log:
            return parent
    return None


def _parents(root: str) -> list[str]:
    """The folders above ``root``, nearest first: up to ``/`` on local disk, to the bucket (or
    container) of an object store."""
    if is_local(root):
        folders = []
        while (parent := os.path.dirname(root)) != root:
            folders.append(parent)
            root = parent
        return folders
    parsed = urlparse(root)
    path = posixpath.normpath("/" + parsed.path.lstrip("/"))
    above = []
    while path != "/":
        path = posixpath.dirname(path)
        above.append(f"{parsed.scheme}://{parsed.netloc}{path.rstrip('/')}")
    return above
