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
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from mvsink import failpoints
from mvsink.errors import (
    ConfigError,
    ConflictError,
    MVSinkError,
    SchemaMismatchError,
    UnsupportedTableError,
    Where,
)
from mvsink.history.lifetimes import OPENED_VERSION, By, Change, carry, history_struct, opened, view_struct
from mvsink.table.commit import Backoff, Lost, append, retrying
from mvsink.table.delta import DataFile, NewFile, Snapshot, load_snapshot, open_existing, physical_names
from mvsink.table.log import commit_info, log_actions
from mvsink.table.record import (
    EPOCH,
    HISTORY,
    MODE,
    VIEW,
    HistoryKeys,
    history_metadata,
    metadata_int,
    now_ms,
    table_tag,
)
from mvsink.table.schema import arrow_schema, target_schema_json, target_struct
from mvsink.table.storage import Store

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

    @property
    def arrow(self) -> pa.Schema:
        return arrow_schema(target_struct(self.schema_json))

    def file(self, action: Mapping[str, Any]) -> DataFile:
        """A file of an add or remove action of the view's log."""
        logical = {p: n for n, p in physical_names(self.schema_json).items()}
        values = {logical.get(k, k): v for k, v in (action.get("partitionValues") or {}).items()}
        return DataFile(
            action["path"], int(action.get("size") or 0), None, values, action.get("deletionVector")
        )

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

    @property
    def keys(self) -> HistoryKeys:
        return HistoryKeys(self.view)

    def catch_up(self, view: View, upto: int | None, start: Snapshot | None = None) -> None:
        """Bring the history to hold every version of the view up to ``upto`` (None: the view
        has no table yet), one commit per version; refuse a history that is not this view's
        (``check``). A missing history begins: from ``start``, the view's snapshot at
        ``upto`` (its rows open lifetimes marked ``start``), or, without it, from the view's
        first version (the view's table was made since the epoch's snapshot, by its commit)."""
        self._arrow(view)  # (refuses a view with a column a lifetime has: ``history_struct``)
        if not self._behind(view, upto):
            return
        while True:
            done = retrying(
                self.retry, lambda n: self._step(view, upto, start), lost=self._lost, exhausted=self._gave_up
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
            raise ConfigError(
                f"option 'history_target': {self.root} is a Delta table that holds no history of "
                f"view {self.view!r} (mvsink made no such history there); nothing was written. "
                "Point it at a new folder.",
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

    def _step(self, view: View, upto: int | None, start: Snapshot | None) -> bool | Lost:
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
        return self._follow(snap, view, at) or at >= upto

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
            for f in start.files:
                rows = opened(view.rows(f), change, schema)
                written.append(self.store.write_file(f"{folder}/o-{mirror(f)}.parquet", rows))
        except BaseException:
            self.store.delete_folder(folder)
            raise
        keys, at_ms = self.keys, change.time_us // 1000
        marks = {keys.time: at_ms, keys.began: at_ms, keys.since: start.version + 1}
        if view.table_id is not None:
            marks[keys.table] = table_tag(view.table_id)
        counts = (sum(f.num_records for f in written), 0)
        return self._commit(snap, written, [], change, marks, folder, counts, self._schema_json(view))

    def _follow(self, snap: Snapshot, view: View, version: int) -> Lost | None:
        """Hold version ``version`` of the view in the history: one commit (which makes the
        history table, holding the view from its first version, when there is none)."""
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
        gone_files = []
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
        schema = self._arrow(view)
        reads = [self.store.read(h, schema, ()) for h in gone_files]
        gone = pa.concat_tables(reads) if reads else schema.empty_table()
        kept, closed = carry(gone, [self._rows(view, f, version) for f in adds], change, schema)
        opened_n = sum(int(pc.sum(pc.equal(t.column(OPENED_VERSION), version)).as_py() or 0) for t in kept)
        folder = self._folder()
        written: list[NewFile] = []
        try:
            for f, rows in zip(adds, kept, strict=True):  # (a file of no rows too: a later remove finds it)
                written.append(self.store.write_file(f"{folder}/o-{mirror(f)}.parquet", rows))
            if closed.num_rows:
                written.append(self.store.write_file(f"{folder}/c-{uuid.uuid4().hex}.parquet", closed))
        except BaseException:
            self.store.delete_folder(folder)
            raise
        marks = {keys.time: time_ms}
        if epoch is not None and not foreign:
            marks[keys.epoch] = version + 1
        if foreign and (opened_n or closed.num_rows):
            marks[keys.foreign] = version + 1
        if meta is not None and meta.get("id"):
            marks[keys.table] = table_tag(str(meta["id"]))
        schema_json = snap.schema_json or self._schema_json(view)
        counts = (opened_n, closed.num_rows)
        return self._commit(snap, written, gone_files, change, marks, folder, counts, schema_json)

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
class _Head:
    """What checking a history table needs of it (``History.check``), read from its log's tail
    or from a snapshot."""

    frontier: int | None
    schema_json: str
    table: int

    @staticmethod
    def of(table: Any, keys: HistoryKeys) -> _Head:
        frontier = table.transaction_version(keys.frontier)
        tag = table.transaction_version(keys.table)
        return _Head(None if frontier is None else int(frontier), table.schema().to_json(), int(tag or 0))

    @staticmethod
    def of_snapshot(snap: Snapshot, keys: HistoryKeys) -> _Head:
        assert snap.schema_json is not None
        return _Head(snap.transaction(keys.frontier), snap.schema_json, snap.transaction(keys.table) or 0)


def _epoch(info: Mapping[str, Any], view: str) -> int | None:
    """The epoch a commit of ``view``'s table is, if it is one."""
    return metadata_int(info.get(EPOCH)) if info.get(VIEW) == view else None


def _time_ms(info: Mapping[str, Any]) -> int:
    """A commit's time (its in-commit timestamp, else its commit info's; now, for a commit
    that records neither), milliseconds since 1970."""
    return metadata_int(info.get("inCommitTimestamp")) or metadata_int(info.get("timestamp")) or now_ms()


def _check_columns(
    history_json: str, view_json: str, root: str, where: Where, version: int | None = None
) -> None:
    """Refuse a history whose view columns are not the view's (``SchemaMismatchError``)."""
    held = json.loads(target_schema_json(view_struct(target_struct(history_json))))["fields"]
    view = json.loads(target_schema_json(target_struct(view_json)))["fields"]
    held_cols = {f["name"]: f["type"] for f in held}
    view_cols = {f["name"]: f["type"] for f in view}
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
