"""Status: what the target says about the views it holds, read from the Delta log alone.

Everything comes from the latest snapshot (frontier, lineage and promotion app transactions,
the file list) and the commit metadata mvsink writes with every commit (``mvsink.view``,
``mvsink.epoch``, ``mvsink.inserted`` ..., ``mvsink.attempts``) over the last ``history``
commits, plus the notes stalled sinks leave (``clock.Stall``). No data file is read, so it
is cheap on any table and store.

``Status.to_json`` is the stable form behind ``mvsink status --json`` (docs/operations.md):
fields are only ever added, never renamed or removed, and ``"format"`` names its version.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from mvsink.epoch.clock import stall_notes
from mvsink.errors import Where
from mvsink.plan import tombstones
from mvsink.table.catalog import locate
from mvsink.table.delta import load_snapshot
from mvsink.table.log import history as delta_history
from mvsink.table.record import HOLDER, PROMOTED, EpochCommit, Keys, holder_tag, promotions, views_of
from mvsink.table.storage import Store

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
    views: tuple[ViewStatus, ...]
    history: int
    """How many of the newest commits were read for the per-commit figures."""
    holder: str | None = None
    """The view that holds the table (``epoch/holder.py``): its name; ``"#<tag>"`` for a view
    not named within the history read; None: no view holds it (a foreign table, or none yet)."""

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
        lines = [
            f"{self.target}: version {self.table_version}, {rows} in {self.files:,} files "
            f"({self.bytes:,} bytes; {self.small_files:,} with fewer than {self.small_rows:,} rows)"
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
    versions) in the Delta table at ``target``."""
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
    )


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
    )
