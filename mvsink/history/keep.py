"""Keeping a view's history: each version of the view's table, in order, as one commit of the
history table (``History.catch_up``).

The history table's open lifetimes mirror the view's files: the open lifetimes of view file
``F`` (its path and deletion vector, ``DataFile.identity``) are the rows of one history file,
``o-<digest of F>.parquet``. So a version of the view that removes files and adds others is
followed, in the history, by removing their mirrors and adding the added files' (the rows each
holds, carrying the lifetimes of the rows they kept: ``lifetimes.carry``), plus one file of
the lifetimes it closed. The history writes about what the view wrote, and reads the mirrors
of what the view removed, never the whole view.

A version's changes are read from the view's log (its added and removed files, its commit
info), whoever made it: the sink's own epochs, a replica's, a compaction, a foreign write. So
one mechanism covers every way the view changes, and a history commit is idempotent by the
view's version it holds (its frontier, ``record.HistoryKeys``): a replica that lost the race
reads the frontier again and finds the version held. A sink completes the history before its
epoch plans (a crash between the view's commit and the history's is completed then, before
anything else) and follows it right after its commit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mvsink import failpoints
from mvsink.errors import (
    ConfigError,
    ConflictError,
    InvariantViolation,
    MVSinkError,
    SchemaMismatchError,
    UnsupportedTableError,
    Where,
)
from mvsink.history.lifetimes import (
    CLOSED_VERSION,
    COLUMNS,
    OPENED_VERSION,
    VALID_TO,
    By,
    Change,
    carry,
    close,
    history_struct,
    met_late,
    opened,
    view_struct,
)
from mvsink.plan import late
from mvsink.table.catalog import is_path
from mvsink.table.commit import Backoff, Lost, append, retrying
from mvsink.table.delta import DataFile, NewFile, Snapshot, load_snapshot, open_existing, physical_names
from mvsink.table.log import commit_info, log_actions
from mvsink.table.plan import Moved
from mvsink.table.record import (
    EPOCH,
    HISTORY,
    MODE,
    VIEW,
    HistoryKeys,
    Keys,
    history_metadata,
    metadata_int,
    now_ms,
    table_tag,
    tidy_metadata,
)
from mvsink.table.schema import arrow_schema, target_schema_json, target_struct
from mvsink.table.storage import Store
from mvsink.table.uris import table_root

log = logging.getLogger(__name__)


def mirror(file: DataFile) -> str:
    """The digest naming the history file of view file ``file``'s open lifetimes."""
    return hashlib.sha256(file.identity.encode()).hexdigest()[:32]


def _mirrored(path: str) -> str | None:
    """The digest a history file's name carries, if it holds open lifetimes."""
    name = path.rpartition("/")[2]
    return name[2:34] if name.startswith("o-") else None


@dataclass(frozen=True)
class View:
    """What the history needs of the view's table."""

    store: Store
    schema_json: str
    partition_by: tuple[str, ...]
    table_id: str | None
    tasks: Any = None
    """The Spark session whose tasks derive the history (``history/tasks.py``: the view is
    planned in Spark tasks, its versions too big for the driver); None: the driver does."""

    @property
    def arrow(self) -> pa.Schema:
        return arrow_schema(target_struct(self.schema_json))

    def file(self, action: Mapping[str, Any]) -> DataFile:
        """A file of an add or remove action of the view's log."""
        logical = {p: n for n, p in physical_names(self.schema_json).items()}
        values = {logical.get(k, k): v for k, v in (action.get("partitionValues") or {}).items()}
        vector = action.get("deletionVector")
        return DataFile(action["path"], int(action.get("size") or 0), _held_rows(action), values, vector)

    def rows(self, file: DataFile) -> pa.Table:
        return self.store.read(file, self.arrow, self.partition_by)


@dataclass
class History:
    """One view's history table (``history_target``), kept by that view's sink."""

    view: str
    root: str
    store: Store
    retry: Backoff
    where: Where
    commits: int = 0
    """History commits this sink made (``_sweep_late`` counts them)."""

    @classmethod
    def at(
        cls, view: str, location: str, options: Mapping[str, str], retry: Backoff, where: Where
    ) -> History:
        """The history at ``location``: a path or URI. A table name the sink did not resolve
        (``MVSink._locate``) would be a folder of that name: never written."""
        if not is_path(location):
            raise InvariantViolation(f"history_target {location!r} reached the epoch unresolved", where)
        root = table_root(location)
        return cls(view, root, Store(root, dict(options)), retry, where)

    @property
    def keys(self) -> HistoryKeys:
        return HistoryKeys(self.view)

    def catch_up(
        self, view: View, upto: int | None, start: Snapshot | None = None, moved: Sequence[Moved] = ()
    ) -> None:
        """Bring the history to hold every version of the view up to ``upto`` (None: the view
        has no table yet), one commit per version; refuse a history that is not this view's
        (``check``). A missing history begins: from ``start``, the view's snapshot at
        ``upto`` (its rows open lifetimes marked ``start``), or, without it, from the view's
        first version (the view's table was made since the epoch's snapshot, by its commit).
        ``moved``: where version ``upto``'s rewrites put their rows, as the sink that made it
        staged them (``_follow_moved``)."""
        self._arrow(view)  # (refuses a view with a column a lifetime has: ``history_struct``)
        if not self._behind(view, upto):
            return
        while True:
            done = retrying(
                self.retry,
                lambda n: self._step(view, upto, start, moved),
                lost=self._lost,
                exhausted=self._gave_up,
            )
            if done:
                return

    def _behind(self, view: View, upto: int | None) -> bool:
        """Whether the history lacks a version up to ``upto`` (or is missing, with a view's table
        to begin from), checked (``check``) from the table delta-rs opens, without the file
        list and statistics of a snapshot: the steady epoch's look."""
        table = open_existing(self.root, self.store.options)
        if table is None:
            self.check(None, view, upto)
            return upto is not None
        frontier = self.check(_Head.of(table, self.keys), view, upto)
        return upto is not None and (frontier is None or frontier <= upto)

    def check(self, head: _Head | None, view: View, upto: int | None) -> int | None:
        """Refuse a history table this view's sink did not make, one whose columns are not
        the view's, or one of another table of the view (its id, or versions where the view
        has no table: ``upto`` None); the first version of the view it does not hold (None:
        no history table yet). It may hold versions past ``upto``: a replica's, since."""
        if head is None:
            if self.store.foreign():
                raise UnsupportedTableError(
                    f"option 'history_target': {self.root} holds files but no Delta log: it is no "
                    "history table. Point it at an empty folder (mvsink makes the table).",
                    self.where,
                )
            return None
        if head.frontier is None:
            refusal = (
                head.unfit(self._schema_json(view), view.schema_json)
                or _ever_written(self.store, head.version)
                or _unwritable(self.root, self.store.options)
            )
            if refusal is None:
                return None  # an empty table with the history's columns (a platform made it): ours
            raise ConfigError(
                f"option 'history_target': {self.root} is a Delta table that holds no history of "
                f"view {self.view!r}, and {refusal}; nothing was written. mvsink keeps a history in "
                "a new folder, or in an empty, unpartitioned Delta table with the history's columns: "
                f"{_columns_sql(self._schema_json(view))} (docs/history.md).",
                self.where,
            )
        if head.table and view.table_id is not None and head.table != table_tag(view.table_id):
            raise ConfigError(
                f"option 'history_target': {self.root} holds the history of another table of "
                f"view {self.view!r} (one made again since, or elsewhere): its versions are not "
                "this table's. Give the view's history a new folder.",
                self.where,
            )
        _check_columns(head.schema_json, view.schema_json, self.root, self.where)
        if upto is None and head.frontier > 0 and commit_info(view.store, 0) is None:
            raise ConfigError(
                f"option 'history_target': {self.root} holds the view's versions up to "
                f"{head.frontier - 1}, and the view has no table: it is the history of another "
                "table of the view (one dropped since?). Give the view's history a new folder.",
                self.where,
            )
        return head.frontier

    def _lost(self, n: int, race: Lost, pause: float) -> None:
        log.info(
            "%s: the history's commit lost a race (%s); retrying in %.2fs", self.where, race.reason, pause
        )

    def _gave_up(self, n: int) -> Exception:
        return ConflictError(
            f"the history's commit lost the race {n} times in a row; the next epoch completes it",
            self.where,
        )

    def _step(
        self, view: View, upto: int | None, start: Snapshot | None, moved: Sequence[Moved] = ()
    ) -> bool | Lost:
        """One commit of the history: True when the history then holds ``upto``, False when
        there is more to do, ``Lost`` when the commit lost a race."""
        assert upto is not None
        snap = load_snapshot(self.root, self.keys.frontier, self.store.options, self.where, engine="delta-rs")
        frontier = self.check(_Head.of_snapshot(snap, self.keys) if snap.exists else None, view, upto)
        if frontier is None and start is not None and start.version == upto and not self._made_the_view(view):
            return self._start(snap, view, start) or True
        if frontier is not None and frontier > upto:
            return True
        at = frontier or 0
        return self._follow(snap, view, at, moved if at == upto else ()) or at >= upto

    def _made_the_view(self, view: View) -> bool:
        """Whether the view's first version is an epoch of this view keeping this history: its
        history then begins there (its sink stopped before the history's first commit), not at
        the rows held now."""
        info = commit_info(view.store, 0)
        return info is not None and info.get(VIEW) == self.view and info.get(HISTORY) == self.root

    def _start(self, snap: Snapshot, view: View, start: Snapshot) -> Lost | None:
        """Make the history from the view as ``start`` holds it: a lifetime per row."""
        assert start.version is not None
        start.require_rows(self.where)
        info = commit_info(view.store, start.version) or {}
        change = Change(start.version, _time_ms(info) * 1000, _epoch(info, self.view), "start")
        schema = self._arrow(view)
        folder = self._folder()
        written: list[NewFile] = []
        try:
            self._mirror(view, start.version, [], start.files, change, schema, folder, written)
        except BaseException:
            self.store.delete_folder(folder)
            raise
        keys, at_ms = self.keys, change.time_us // 1000
        marks = {keys.time: at_ms, keys.began: at_ms, keys.since: start.version + 1}
        if view.table_id is not None:
            marks[keys.table] = table_tag(view.table_id)
        counts = (sum(f.num_records for f in written), 0)
        schema_json = snap.schema_json or self._schema_json(view)  # (a table made for it keeps its own)
        return self._commit(snap, written, [], change, marks, folder, counts, schema_json)

    def _follow(self, snap: Snapshot, view: View, version: int, moved: Sequence[Moved] = ()) -> Lost | None:
        """Hold version ``version`` of the view in the history: one commit (which makes the
        history table, holding the view from its first version, when there is none); its
        rewrites followed by where they put their rows (``moved``) as far as that can be."""
        actions = log_actions(view.store, version)
        info = commit_info(view.store, version)
        if actions is None or info is None:
            raise MVSinkError(
                f"the history holds the view up to version {version - 1}, and the view's log no "
                f"longer has version {version} (log cleanup?): the history cannot be completed "
                "exactly. Give the view's history a new folder (it begins with the rows held then).",
                self.where,
            )
        meta = next((a["metaData"] for a in actions if "metaData" in a), None)
        if meta is not None and snap.schema_json is not None:
            _check_columns(snap.schema_json, meta["schemaString"], self.root, self.where, version)
        if meta is not None and tuple(meta.get("partitionColumns") or ()) != view.partition_by:
            raise SchemaMismatchError(
                f"version {version} of the view's table partitions it by "
                f"{list(meta.get('partitionColumns') or [])}, not {list(view.partition_by)}: the history "
                "does not follow a change of the view's partitioning. Give the view's history a new folder.",
                self.where,
            )
        keys = self.keys
        epoch = _epoch(info, self.view)
        foreign = info.get(VIEW) != self.view
        repairs = (snap.transaction(keys.foreign) or 0) > (snap.transaction(keys.epoch) or 0)
        # A complete view's next epoch undoes a foreign write (an append view's keeps its rows).
        repairs = repairs and info.get(MODE) == "complete"
        by: By = "foreign" if foreign else ("repair" if epoch is not None and repairs else "epoch")
        time_ms = max(_time_ms(info), snap.transaction(keys.time) or 0)
        change = Change(version, time_ms * 1000, epoch, by)
        removes = [view.file(a["remove"]) for a in actions if "remove" in a]
        adds = [view.file(a["add"]) for a in actions if "add" in a]
        mirrors = {_mirrored(f.key): f for f in snap.files}
        # An add of a file the table holds already (a re-add without a remove: new statistics,
        # say) replaces it: its mirror goes as a removed file's does.
        held = {mirror(f) for f in removes}
        replaced = [f for f in adds if mirror(f) in mirrors and mirror(f) not in held]
        gone_files, mirror_of = [], {}
        for f in [*removes, *replaced]:
            found = mirrors.get(mirror(f))
            if found is None:
                raise ConfigError(
                    f"version {version} of the view removes {f.key}, whose lifetimes the history "
                    f"at {self.root} does not hold where mvsink keeps them: something other than "
                    "mvsink rewrote the history table (an OPTIMIZE, say), or it is not this view's. "
                    "Only mvsink writes a history; give the view's history a new folder.",
                    self.where,
                )
            gone_files.append(found)
            mirror_of[f.identity] = found
        schema = self._arrow(view)
        late_parts = self._late(view, actions, version)
        folder = self._folder()
        written: list[NewFile] = []
        try:
            # (Every mirror of a removed file goes in the commit, however its rows were followed.)
            rest_gone, rest_adds, n_closed = self._follow_moved(
                moved, mirror_of, gone_files, adds, change, schema, folder, written
            )
            opened_n, carried = self._mirror(
                view, version, rest_gone, rest_adds, change, schema, folder, written
            )
            n_closed += carried
            closed_n = n_closed
            # Late events, a part at a time (a version may meet many): a file of lifetimes each.
            met = replace(change, by="late")
            columns = pa.schema([f for f in schema if f.name not in COLUMNS])
            for part in late_parts:
                rows = met_late(late.read(view.store, part, columns), met, schema)
                n_closed += rows.num_rows
                if rows.num_rows:
                    written.append(self.store.write_file(_closed_path(folder, change.time_us), rows))
        except BaseException:
            self.store.delete_folder(folder)
            raise
        marks = {keys.time: time_ms}
        if epoch is not None and not foreign:
            marks[keys.epoch] = version + 1
        if foreign and (opened_n or closed_n):
            marks[keys.foreign] = version + 1
        if meta is not None and meta.get("id"):
            marks[keys.table] = table_tag(str(meta["id"]))
        schema_json = snap.schema_json or self._schema_json(view)
        counts = (opened_n, n_closed)
        outcome = self._commit(snap, written, gone_files, change, marks, folder, counts, schema_json)
        if outcome is None:
            self._sweep_late(view)
        return outcome

    def _follow_moved(
        self,
        moved: Sequence[Moved],
        mirror_of: Mapping[str, DataFile],
        gone_files: Sequence[DataFile],
        adds: Sequence[DataFile],
        change: Change,
        schema: pa.Schema,
        folder: str,
        written: list[NewFile],
    ) -> tuple[list[DataFile], list[DataFile], int]:
        """Follow the rewrites ``moved`` says where their rows went (an upsert epoch's own, as
        it staged them) without matching a row: a rewritten file's mirror, less the lifetimes
        at the positions it dropped (which close), is its copies' mirrors, run after run (or
        the mirror of the file added again with a vector). That holds because a mirror's rows
        line up with its file's (both ``_mirror`` paths write them in the file's order) and
        the copies hold the kept rows in order (``rewrite.write_kept``); it is checked, by the
        count and the key columns of the rows (unique within the file: ``_lines_up``), and a
        rewrite that does not check out is left to ``carry``, as is every file ``moved`` does
        not name. The mirrors and added files
        left, and the lifetimes closed."""
        by_key = {f.key: f for f in adds}
        by_identity = {f.identity: f for f in adds}
        done_gone: set[str] = set()
        done_adds: set[str] = set()
        closed: list[pa.Table] = []
        for m in moved:
            held = mirror_of.get(m.source)
            targets = (
                [by_identity.get(m.update)] if m.update is not None else [by_key.get(p) for p, _ in m.copies]
            )
            if held is None or any(t is None for t in targets) or (m.keys is None and len(m.drop) < m.size):
                continue
            lifetimes = self.store.read(held, schema, ())
            if lifetimes.num_rows != m.size or (m.keys is not None and not _lines_up(lifetimes, m.keys)):
                log.info(
                    "%s: %s's lifetimes do not line up with its rows: matched by value", self.where, m.source
                )
                continue
            keep = np.ones(m.size, dtype=bool)
            keep[m.drop] = False
            kept = lifetimes.filter(pa.array(keep))
            runs = [kept.num_rows] if m.update is not None else [n for _, n in m.copies]
            if sum(runs) != kept.num_rows:
                continue
            start = 0
            for target, n in zip(targets, runs, strict=True):
                assert target is not None
                written.append(self.store.write_file(_mirror_path(folder, target), kept.slice(start, n)))
                done_adds.add(target.identity)
                start += n
            closed.append(close(lifetimes.take(pa.array(m.drop)), change, schema))
            done_gone.add(held.identity)
        closed_n = sum(t.num_rows for t in closed)
        if closed_n:  # one file of the lifetimes closed, whatever the files they came from
            written.append(
                self.store.write_file(_closed_path(folder, change.time_us), pa.concat_tables(closed))
            )
        if moved:
            log.debug(
                "%s: version %d: %d of %d rewritten file(s) followed by where their rows went",
                self.where,
                change.version,
                len(done_gone),
                len(moved),
            )
        return (
            [h for h in gone_files if h.identity not in done_gone],
            [f for f in adds if f.identity not in done_adds],
            closed_n,
        )

    def _mirror(
        self,
        view: View,
        version: int,
        gone_files: Sequence[DataFile],
        adds: Sequence[DataFile],
        change: Change,
        schema: pa.Schema,
        folder: str,
        written: list[NewFile],
    ) -> tuple[int, int]:
        """Write the mirrors of the files ``change`` added under ``folder`` (onto ``written``):
        their rows' open lifetimes, carried from those of the files it removed (``carry``),
        and a file of the lifetimes it closed. How many lifetimes it opened and closed. In
        Spark tasks when the view is planned there (``View.tasks``); on the driver otherwise,
        where a version that removes nothing (a first load, an append) is read and written a
        file at a time, so the driver holds one file's rows, not the version's."""
        if view.tasks is not None and (gone_files or adds):
            return self._mirror_in_tasks(view, gone_files, adds, change, schema, folder, written)
        if not gone_files:
            n = 0
            for f in adds:
                rows = opened(self._rows(view, f, version), change, schema)
                written.append(self.store.write_file(_mirror_path(folder, f), rows))
                n += rows.num_rows
            return n, 0
        gone = pa.concat_tables([self.store.read(h, schema, ()) for h in gone_files])
        kept, closed = carry(gone, [self._rows(view, f, version) for f in adds], change, schema)
        for f, rows in zip(adds, kept, strict=True):  # (a file of no rows too: a later remove finds it)
            written.append(self.store.write_file(_mirror_path(folder, f), rows))
        if closed.num_rows:
            written.append(self.store.write_file(_closed_path(folder, change.time_us), closed))
        opened_n = sum(int(pc.sum(pc.equal(t.column(OPENED_VERSION), version)).as_py() or 0) for t in kept)
        return opened_n, closed.num_rows

    def _mirror_in_tasks(
        self,
        view: View,
        gone_files: Sequence[DataFile],
        adds: Sequence[DataFile],
        change: Change,
        schema: pa.Schema,
        folder: str,
        written: list[NewFile],
    ) -> tuple[int, int]:
        """``_mirror`` in Spark tasks: no row of the version comes to the driver."""
        from mvsink.history.tasks import mirror_in_tasks

        done = mirror_in_tasks(
            view.tasks,
            view_store=view.store,
            view_arrow=view.arrow,
            partition_by=view.partition_by,
            history_store=self.store,
            schema=schema,
            removed=gone_files,
            added=adds,
            mirror_paths=[_mirror_path(folder, f) for f in adds],
            closed_path=_closed_path(folder, change.time_us, unique="{}"),
            change=change,
            where=self.where,
        )
        for i, f in enumerate(adds):  # (a file of no rows too: a later remove finds it)
            found = done.mirrors.get(i)
            written.append(found or self.store.write_file(_mirror_path(folder, f), schema.empty_table()))
        written.extend(done.closed)
        return done.opened, sum(f.num_records for f in done.closed)

    def _late(self, view: View, actions: Sequence[Mapping[str, Any]], version: int) -> list[str]:
        """The part files of the late events version ``version`` met (``plan/late.py``; none:
        it met none). Their folder is kept while the view's log can name the version."""
        key = Keys.of(self.view).late
        number = next(
            (int(a["txn"]["version"]) for a in actions if "txn" in a and a["txn"].get("appId") == key), None
        )
        if number is None:
            return []
        found = late.parts(view.store, self.view, number)
        if found is not None:
            return found
        raise MVSinkError(
            f"version {version} of the view met late events, and their files "
            f"({late.folder(self.view, number)}) are gone (kept {late.KEEP_MS // 86_400_000} days): "
            "the history cannot be completed exactly. Give the view's history a new folder (it "
            "begins with the rows held then).",
            self.where,
        )

    def _sweep_late(self, view: View) -> None:
        """After a history commit of this sink, every ``late.SWEEP_EVERY`` from its first: the
        view's late folders past their keeping (``late.sweep``)."""
        self.commits += 1
        if (self.commits - 1) % late.SWEEP_EVERY:
            return
        try:
            gone = late.sweep(view.store, self.view)
            if gone:
                log.info("%s: swept %d folder(s) of late events past their keeping", self.where, gone)
        except Exception as exc:  # what stays behind is swept later
            log.warning("%s: could not sweep folders of late events: %s", self.where, exc)

    def tidy(self, *, kept_from_us: int | None, rows_per_file: int, max_rows: int) -> Tidied | None:
        """Compact the history: its files of closed lifetimes (``c-``) that are small (under a
        quarter of ``rows_per_file``), or hold a lifetime that ended before ``kept_from_us``,
        rewritten as files of up to ``rows_per_file`` lifetimes without those that ended
        before it (never an open lifetime: those are in the mirrors, ``o-``, which it leaves
        alone). At most ``max_rows`` lifetimes a run. One strict commit (the frontier as it is:
        it holds the same versions of the view), retried on a lost race; None when there is
        nothing to do. Dropping lifetimes moves the history's first known version and time
        (H1: ``#since``, ``#began``) past every lifetime dropped, so ``as_of`` refuses what it
        no longer knows."""
        done = retrying(
            self.retry,
            lambda n: self._tidy(kept_from_us, rows_per_file, max_rows),
            lost=self._lost,
            exhausted=self._gave_up,
        )
        return done if done.version is not None else None

    def _tidy(self, kept_from_us: int | None, rows_per_file: int, max_rows: int) -> Tidied | Lost:
        keys = self.keys
        snap = load_snapshot(self.root, keys.frontier, self.store.options, self.where, engine="delta-rs")
        frontier = snap.transaction(keys.frontier) if snap.exists else None
        if frontier is None:
            return NOTHING_TIDIED
        assert snap.schema_json is not None
        first_ends = _first_ends(snap)
        closed = [i for i, f in enumerate(snap.files) if f.key.rpartition("/")[2].startswith("c-")]
        small = max(2, rows_per_file // 4)
        expired = [i for i in closed if _before(first_ends[i], kept_from_us)]
        gone = set(expired)
        rest = [i for i in closed if i not in gone and (snap.files[i].num_records or 0) < small]
        picked = [snap.files[i] for i in (*expired, *rest)]
        if not expired and len(picked) < 2:
            return NOTHING_TIDIED
        taken: list[DataFile] = []
        n = 0
        for f in picked:
            if taken and n + (f.num_records or 0) > max_rows:
                break
            taken.append(f)
            n += f.num_records or 0
        schema = arrow_schema(target_struct(snap.schema_json))
        rows = pa.concat_tables([self.store.read(f, schema, ()) for f in taken])
        cut = kept_from_us if kept_from_us is not None else -(1 << 62)  # (none: nothing ended before it)
        old = pc.fill_null(pc.less(rows.column(VALID_TO).cast(pa.int64()), cut), False)
        dropped, kept = rows.filter(old), rows.filter(pc.invert(old))
        marks: dict[str, int] = {}
        if dropped.num_rows:
            # The first version (and time) every lifetime still kept tells whole.
            last = int(pc.max(dropped.column(CLOSED_VERSION)).as_py())
            end_us = int(pc.max(dropped.column(VALID_TO).cast(pa.int64())).as_py())
            marks[keys.since] = max(snap.transaction(keys.since) or 0, last + 1)
            marks[keys.began] = max(snap.transaction(keys.began) or 0, -(-end_us // 1000))
        folder = self._folder()
        written: list[NewFile] = []
        try:
            for start in range(0, kept.num_rows, rows_per_file):
                part = kept.slice(start, rows_per_file)
                first_end = int(pc.min(part.column(VALID_TO).cast(pa.int64())).as_py())
                written.append(self.store.write_file(_closed_path(folder, first_end), part))
        except BaseException:
            self.store.delete_folder(folder)
            raise
        try:
            failpoints.hit("history_before_commit", self.where, snap)
        except BaseException:
            self.store.delete_folder(folder)
            raise
        outcome = append(
            snap,
            self.store,
            adds=written,
            removes=taken,
            app_id=keys.frontier,
            upper=None,  # the same versions of the view
            attempt_id=uuid.uuid4().hex,
            metadata=tidy_metadata(self.view, len(taken), len(written), dropped.num_rows),
            schema_json=snap.schema_json,
            partition_by=(),
            where=self.where,
            transactions=marks,
            data_change=bool(dropped.num_rows),
        )
        if isinstance(outcome, Lost):
            self.store.delete_folder(folder)
            return outcome
        return Tidied(outcome.version, len(taken), len(written), kept.num_rows, dropped.num_rows)

    def _rows(self, view: View, file: DataFile, version: int) -> pa.Table:
        """The rows of a file version ``version`` added, which must still be in storage."""
        try:
            return view.rows(file)
        except FileNotFoundError:
            raise MVSinkError(
                f"the history holds the view up to version {version - 1}, and {file.key}, which "
                f"version {version} added, is gone (a VACUUM since?): the history cannot be "
                "completed exactly. Give the view's history a new folder (it begins with the rows "
                "held then).",
                self.where,
            ) from None

    def _commit(
        self,
        snap: Snapshot,
        adds: Sequence[NewFile],
        removes: Sequence[DataFile],
        change: Change,
        marks: Mapping[str, int],
        folder: str,
        counts: tuple[int, int],
        schema_json: str,
    ) -> Lost | None:
        """Commit the history's version holding ``change``'s version of the view (its files
        staged under ``folder``): None when it landed, ``Lost`` when another commit landed
        first (its files are deleted then: nothing references them). Any other error keeps
        them (the commit may have landed: I4)."""
        try:
            failpoints.hit("history_before_commit", self.where, snap)
        except BaseException:
            self.store.delete_folder(folder)  # not committed: nothing can reference them
            raise
        outcome = append(
            snap,
            self.store,
            adds=list(adds),
            removes=list(removes),
            app_id=self.keys.frontier,
            upper=change.version + 1,
            attempt_id=uuid.uuid4().hex,
            metadata=history_metadata(self.view, change.version, change.by, *counts),
            schema_json=schema_json,
            partition_by=(),
            where=self.where,
            transactions=dict(marks),
        )
        if isinstance(outcome, Lost):
            self.store.delete_folder(folder)  # known not to have landed
            return outcome
        return None

    def _arrow(self, view: View) -> pa.Schema:
        return arrow_schema(history_struct(target_struct(view.schema_json), self.where))

    def _schema_json(self, view: View) -> str:
        return target_schema_json(history_struct(target_struct(view.schema_json), self.where))

    def _folder(self) -> str:
        return f"mvsink-history-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class Tidied:
    """What ``History.tidy`` did: its commit, the files it merged and wrote, the lifetimes it
    kept and dropped (past the retention)."""

    version: int | None
    """None: there was nothing to do."""
    files_removed: int
    files_added: int
    kept: int
    dropped: int


NOTHING_TIDIED = Tidied(None, 0, 0, 0, 0)


def _held_rows(action: Mapping[str, Any]) -> int | None:
    """The rows an add action's file holds (its statistics' count, less those its deletion
    vector drops); None: its writer recorded no count."""
    try:
        count = json.loads(action.get("stats") or "{}").get("numRecords")
    except ValueError:
        return None
    if count is None:
        return None
    return int(count) - int((action.get("deletionVector") or {}).get("cardinality") or 0)


def _lines_up(lifetimes: pa.Table, keys: pa.Table) -> bool:
    """Whether ``lifetimes`` are the rows whose key columns are ``keys``, one for one in their
    order, as told by keys unique within them (a key held twice could be swapped unseen)."""
    names = keys.column_names
    if any(not lifetimes.column(n).equals(keys.column(n)) for n in names):
        return False
    distinct: int = keys.group_by(names, use_threads=False).aggregate([]).num_rows
    return bool(distinct == keys.num_rows)


def _mirror_path(folder: str, file: DataFile) -> str:
    """The history file under ``folder`` of view file ``file``'s open lifetimes."""
    return f"{folder}/o-{mirror(file)}.parquet"


def _closed_path(folder: str, first_end_us: int, unique: str | None = None) -> str:
    """A new file of closed lifetimes under ``folder``, named by the earliest ``valid_to`` it
    holds (microseconds): what the retention needs of it, without statistics (delta-rs lists
    those of a table's first 32 columns only, and the lifetime columns come after the view's).
    ``unique`` ends the name (default: a new one)."""
    return f"{folder}/c-{first_end_us:017d}-{unique or uuid.uuid4().hex}.parquet"


def _first_ends(snap: Snapshot) -> list[int | None]:
    """The earliest ``valid_to`` of each of ``snap``'s files, microseconds: by its name
    (``_closed_path``), else by the statistics its writer recorded (truncated down: never later
    than the true one); None: not known."""
    bounds = snap.bounds(VALID_TO)
    stats: list[int | None] = [None] * len(snap.files)
    if bounds is not None:
        low = bounds[0]
        if pa.types.is_timestamp(low.type):
            low = low.cast(pa.timestamp("us", low.type.tz))
        stats = [None if v is None else int(v) for v in low.cast(pa.int64()).to_pylist()]
    out = []
    for f, by_stats in zip(snap.files, stats, strict=True):
        parts = f.key.rpartition("/")[2].split("-")
        out.append(int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else by_stats)
    return out


def _before(first_end: int | None, kept_from_us: int | None) -> bool:
    """Whether a file whose earliest ``valid_to`` is ``first_end`` (None: not known) may hold a
    lifetime that ended before ``kept_from_us`` (None: every lifetime is kept)."""
    return kept_from_us is not None and (first_end is None or first_end < kept_from_us)


@dataclass(frozen=True)
class _Head:
    """What checking a history table needs of it (``History.check``), read from its log's tail
    or from a snapshot. A table mvsink has not begun a history in (``frontier`` None) also
    says what it holds: whether the history may begin there (``unfit``)."""

    frontier: int | None
    schema_json: str
    table: int
    version: int = 0
    files: int = 0
    partition_by: tuple[str, ...] = ()
    configuration: Mapping[str, str | None] = field(default_factory=dict)

    @staticmethod
    def of(table: Any, keys: HistoryKeys) -> _Head:
        frontier = table.transaction_version(keys.frontier)
        tag = table.transaction_version(keys.table)
        head = _Head(None if frontier is None else int(frontier), table.schema().to_json(), int(tag or 0))
        if frontier is not None:
            return head
        meta = table.metadata()
        return replace(
            head,
            version=int(table.version()),
            files=len(table.file_uris()),
            partition_by=tuple(meta.partition_columns),
            configuration=dict(meta.configuration),
        )

    @staticmethod
    def of_snapshot(snap: Snapshot, keys: HistoryKeys) -> _Head:
        assert snap.schema_json is not None
        return _Head(
            snap.transaction(keys.frontier),
            snap.schema_json,
            snap.transaction(keys.table) or 0,
            snap.version or 0,
            len(snap.files),
            snap.partition_by,
            snap.configuration,
        )

    def unfit(self, history_json: str, view_json: str) -> str | None:
        """Why a history of columns ``history_json`` cannot begin in this table that holds
        none (None: it may, as far as its newest version tells: ``_ever_written`` reads the
        rest). Only an empty, unpartitioned table of exactly those columns (by name and type),
        nullable where the history may write a null (every lifetime column, and each view
        column the view's table, ``view_json``, lets be null), none generated, with an identity
        or a default, that names them as they
        are, with no constraint, and none of the properties a history's commits cannot keep
        (append-only, deletion vectors, the change feed): one made for it (``CREATE TABLE``,
        a platform's catalog), never a table anything wrote."""
        if self.files:
            return f"it holds {self.files} file(s)"
        if self.partition_by:
            return f"it is partitioned (by {list(self.partition_by)})"
        settings = {k: str(v).lower() for k, v in self.configuration.items() if v is not None}
        mapping = settings.get("delta.columnMapping.mode")
        if mapping not in (None, "none"):
            return f"it maps column names (delta.columnMapping.mode = {mapping})"
        for key, what in _UNKEPT.items():
            if settings.get(key) == "true":
                return f"{what} ({key} = true)"
        constraints = sorted(k for k in settings if k.startswith("delta.constraints."))
        if constraints:
            return f"it has CHECK constraints ({', '.join(constraints)})"
        have, want = _column_types(self.schema_json), _column_types(history_json)
        differ = sorted(n for n in have.keys() | want.keys() if have.get(n) != want.get(n))
        if differ:
            return f"its columns are not the history's (they differ in {', '.join(differ)})"
        required = {f["name"] for f in json.loads(view_json)["fields"] if not f.get("nullable", True)}
        for f in json.loads(self.schema_json)["fields"]:
            if not f.get("nullable", True) and f["name"] not in required:
                return f"its column {f['name']} is NOT NULL (the history writes nulls there)"
            made = sorted(k for k in f.get("metadata") or {} if k.startswith(_MADE_COLUMN))
            if made:
                return f"its column {f['name']} is made by the table ({', '.join(made)})"
        return None


_UNKEPT = {
    "delta.appendOnly": "it is append-only (a history's commits remove files)",
    "delta.enableDeletionVectors": "it turns deletion vectors on (the history commits through delta-rs)",
    "delta.enableChangeDataFeed": "it turns the change data feed on (the history writes no change files)",
}
"""Table properties a history's commits cannot keep, with why."""
_MADE_COLUMN = ("delta.generationExpression", "delta.identity", "CURRENT_DEFAULT", "EXISTS_DEFAULT")
"""Column metadata of a column the table fills itself (generated, identity, default)."""


def _unwritable(root: str, options: Mapping[str, str]) -> str | None:
    """Why the history's commits (through delta-rs) could not write the table at ``root``: a
    table feature the installed delta-rs does not write."""
    from mvsink.table.delta import delta_rs_refusal

    refusal = delta_rs_refusal(root, options)
    return None if refusal is None else f"the history's commits (delta-rs) cannot write it: {refusal}"


def _ever_written(store: Store, version: int) -> str | None:
    """Why a table without a history cannot take one because of what its versions up to
    ``version`` did: added a file, or carried an application's transaction (mvsink's, or
    any other writer's). None: no version did (a table made and left empty)."""
    for v in range(version + 1):
        actions = log_actions(store, v)
        if actions is None:
            return f"its log no longer shows version {v} (what it held then cannot be told)"
        if any("add" in a for a in actions):
            return f"its version {v} added files"
        txn = next((a["txn"].get("appId") for a in actions if "txn" in a), None)
        if txn is not None:
            return f"an application wrote it (transaction {txn!r} at version {v})"
    return None


def _epoch(info: Mapping[str, Any], view: str) -> int | None:
    """The epoch a commit of ``view``'s table is, if it is one."""
    return metadata_int(info.get(EPOCH)) if info.get(VIEW) == view else None


def _time_ms(info: Mapping[str, Any]) -> int:
    """A commit's time (its in-commit timestamp, else its commit info's; now, for a commit
    that records neither), milliseconds since 1970."""
    return metadata_int(info.get("inCommitTimestamp")) or metadata_int(info.get("timestamp")) or now_ms()


def _column_types(schema_json: str) -> dict[str, Any]:
    """A schema's columns by name: their types, nullability aside (``target_schema_json``)."""
    return {
        f["name"]: f["type"] for f in json.loads(target_schema_json(target_struct(schema_json)))["fields"]
    }


def _columns_sql(schema_json: str) -> str:
    """A schema's columns as a ``CREATE TABLE`` lists them."""
    return (
        "(" + ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in target_struct(schema_json)) + ")"
    )


def _check_columns(
    history_json: str, view_json: str, root: str, where: Where, version: int | None = None
) -> None:
    """Refuse a history whose view columns are not the view's (``SchemaMismatchError``)."""
    held_cols = _column_types(target_schema_json(view_struct(target_struct(history_json))))
    view_cols = _column_types(view_json)
    if held_cols == view_cols:
        return
    differ = sorted(n for n in held_cols.keys() | view_cols.keys() if held_cols.get(n) != view_cols.get(n))
    when = (
        f"version {version} of the view's table changed its columns"
        if version is not None
        else (f"the history at {root} keeps other columns than the view's table")
    )
    raise SchemaMismatchError(
        f"option 'history_target': {when} ({', '.join(differ)}): the history does not follow a "
        "change of the view's columns yet. Nothing was written. Give the view's history a new "
        "folder (it begins with the rows held then), or keep the view's columns.",
        where,
    )
