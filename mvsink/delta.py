"""The Delta shim: the only module that imports ``deltalake``.

It speaks mvsink's verbs: load a snapshot (version, frontier, files, schema), create a table,
and commit a set of added and removed files together with the frontier as one strict
compare-and-append. Every delta-rs error is mapped to an mvsink error here.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
from deltalake import DeltaTable, Schema, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import (
    AddAction,
    CommitProperties,
    RemoveAction,
    Transaction,
    create_table_with_add_actions,
)

from mvsink.errors import ConflictError, MVSinkError, UnsupportedTableError, Where

# Table features whose data mvsink would misread or corrupt with plain file rewrites.
_REFUSED_FEATURES = {
    "deletionVectors": "deletion vectors",
    "columnMapping": "column mapping",
}


def table_root(target: str) -> str:
    """The absolute local path of a target given as a path or a ``file://`` URI."""
    parsed = urlparse(target)
    path = unquote(parsed.path) if parsed.scheme == "file" else target
    return os.path.abspath(path).rstrip("/") or "/"


@dataclass(frozen=True)
class DataFile:
    """A data file of a snapshot, as the Delta log lists it."""

    path: str
    """The path as the log lists it (percent-encoded, relative to the table root)."""
    size: int
    num_records: int | None
    partition_values: Mapping[str, str | None] = field(default_factory=dict)
    """Partition values as the log stores them (strings; None for null)."""
    min_values: Mapping[str, Any] = field(default_factory=dict)
    max_values: Mapping[str, Any] = field(default_factory=dict)
    """Top-level column bounds from the file's statistics (absent: unknown)."""

    def local_path(self, root: str) -> str:
        """Where the file lies on disk."""
        raw = unquote(self.path)
        return raw if os.path.isabs(raw) else os.path.join(root, raw)


@dataclass(frozen=True)
class NewFile:
    """A staged file to add: ``path`` is the raw relative path on disk (delta-rs encodes it)."""

    path: str
    size: int
    num_records: int
    stats: str
    partition_values: Mapping[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """One version of the target as mvsink needs it. ``version is None``: no table yet."""

    root: str
    version: int | None
    frontier: int | None
    schema_json: str | None
    partition_by: tuple[str, ...]
    files: tuple[DataFile, ...]
    _table: Any = field(default=None, repr=False, compare=False)

    @property
    def exists(self) -> bool:
        return self.version is not None


def load_snapshot(target: str, app_id: str, storage_options: Mapping[str, str], where: Where) -> Snapshot:
    """Load the latest snapshot of ``target`` and refuse table features mvsink cannot keep."""
    root = table_root(target)
    try:
        dt = DeltaTable(root, storage_options=dict(storage_options) or None)
    except TableNotFoundError:
        return Snapshot(root, None, None, None, (), ())
    except DeltaError as exc:
        raise UnsupportedTableError(f"cannot open the Delta table: {exc}", where) from exc
    _check_features(dt, where)
    meta = dt.metadata()
    actions = pa.table(dt.get_add_actions(flatten=False))
    files = tuple(
        DataFile(
            path=row["path"],
            size=int(row["size_bytes"]),
            num_records=row.get("num_records"),
            partition_values=_partition_strings(row.get("partition")),
            min_values=_bounds(row.get("min")),
            max_values=_bounds(row.get("max")),
        )
        for row in actions.to_pylist()
    )
    return Snapshot(
        root=root,
        version=dt.version(),
        frontier=dt.transaction_version(app_id),
        schema_json=dt.schema().to_json(),
        partition_by=tuple(meta.partition_columns),
        files=files,
        _table=dt,
    )


def _partition_strings(values: Any) -> dict[str, str | None]:
    """delta-rs hands partition values back typed; the log (and a remove) wants strings."""
    if not values:
        return {}
    return {k: partition_string(v) for k, v in values.items()}


def partition_string(value: Any) -> str | None:
    """A partition value as Delta serialises it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.date | datetime.datetime):
        return value.isoformat()
    return str(value)


def _bounds(values: Any) -> dict[str, Any]:
    return {k: v for k, v in (values or {}).items() if v is not None and not isinstance(v, dict)}


def _check_features(dt: DeltaTable, where: Where) -> None:
    proto = dt.protocol()
    features = set(proto.reader_features or ()) | set(proto.writer_features or ())
    config = dt.metadata().configuration
    refused = [label for name, label in _REFUSED_FEATURES.items() if name in features]
    if config.get("delta.enableDeletionVectors", "false").lower() == "true":
        refused.append("deletion vectors")
    if config.get("delta.columnMapping.mode", "none").lower() != "none":
        refused.append("column mapping")
    if refused:
        names = ", ".join(sorted(set(refused)))
        raise UnsupportedTableError(
            f"the target uses {names}; mvsink rewrites whole files and cannot keep such a table "
            "exact. Point the view at a table without these features.",
            where,
        )


def read_frontier(target: str, app_id: str, storage_options: Mapping[str, str]) -> int | None:
    """The upper recorded under ``app_id``, or None (no table, or never committed)."""
    try:
        dt = DeltaTable(table_root(target), storage_options=dict(storage_options) or None)
    except TableNotFoundError:
        return None
    version = dt.transaction_version(app_id)
    return None if version is None else int(version)


def compare_and_append(
    snap: Snapshot,
    *,
    adds: Sequence[NewFile],
    removes: Sequence[DataFile],
    app_id: str,
    upper: int,
    metadata: Mapping[str, str],
    schema_json: str,
    partition_by: Sequence[str],
    where: Where,
) -> int:
    """Commit ``adds``, ``removes`` and the frontier ``upper`` as one Delta version.

    Strict: it lands only if no commit at all landed since ``snap`` (delta-rs retries are
    off, because its rebase turns our removes of concurrently compacted files into silent
    no-ops). Returns the new version; raises ``ConflictError`` if another commit came first.
    """
    now = int(time.time() * 1000)
    add_actions = [AddAction(f.path, f.size, dict(f.partition_values), now, True, f.stats) for f in adds]
    props = CommitProperties(
        custom_metadata=dict(metadata),
        max_commit_retries=0,
        app_transactions=[Transaction(app_id, upper)],
    )
    try:
        if snap.version is None:
            create_table_with_add_actions(
                snap.root,
                Schema.from_json(schema_json),
                add_actions,
                mode="error",
                partition_by=list(partition_by) or None,
                commit_properties=props,
            )
            return 0
        remove_actions = [
            RemoveAction(
                path=unquote(f.path),
                data_change=True,
                deletion_timestamp=now,
                size=f.size,
                partition_values=dict(f.partition_values) or None,
            )
            for f in removes
        ]
        dt: DeltaTable = snap._table
        dt.create_write_transaction(
            [*remove_actions, *add_actions],
            mode="append",
            schema=dt.schema(),
            partition_by=list(partition_by) or None,
            commit_properties=props,
        )
        return snap.version + 1
    except CommitFailedError as exc:
        raise ConflictError(f"another commit landed after version {snap.version}: {exc}", where) from exc
    except DeltaError as exc:
        if snap.version is None and "already exists" in str(exc):
            raise ConflictError("the table was created concurrently", where) from exc
        raise MVSinkError(f"delta-rs refused the commit: {exc}", where) from exc


def read_table(target: str, storage_options: Mapping[str, str] | None = None) -> pa.Table:
    """The target's current contents, read by delta-rs (an independent Delta reader)."""
    dt = DeltaTable(table_root(target), storage_options=dict(storage_options or {}) or None)
    return pa.table(dt.to_pyarrow_table())


def foreign_append(target: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Append rows as another writer would (the demo uses it to disturb a view)."""
    dt = DeltaTable(table_root(target))
    schema = pa.schema(dt.schema().to_arrow())
    write_deltalake(table_root(target), pa.Table.from_pylist(list(rows), schema=schema), mode="append")


def foreign_delete(target: str, predicate: str) -> None:
    """Delete rows as another writer would, with delta-rs's SQL-like predicate."""
    DeltaTable(table_root(target)).delete(predicate)
