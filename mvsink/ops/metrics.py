"""The metrics table: one row per committed epoch of a view, exactly once, in a Delta table.

Rows are not taken from the sink's memory but rebuilt from the view's commit metadata (every
mvsink commit records its epoch, rows inserted and retracted, files, attempts, seconds and
seconds per phase), so nothing a crash loses is missing for long. After each committed epoch
the sink appends the rows of every view commit after the last one the metrics table holds,
and records that version in the same commit as the app transaction
``mvsink-metrics:<view>@<digest of the view's table>``. The append is strict (no delta-rs
retry): two replicas appending the same range at once, or an append whose range changed,
loses the race, reloads and appends only what is still missing. So each commit of the view
appears once, whoever committed it and whatever crashed in between.

A gap of more than ``MAX_BACKFILL`` versions (the metrics table dropped, or left behind) is
filled with the view commits among the newest ``MAX_BACKFILL`` versions only. The metrics
row of a commit is keyed by the target as spelled in the options: replicas must spell it
alike (``s3://`` and ``s3a://`` are two targets here).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from mvsink.errors import StorageError, Where
from mvsink.table.delta import history, metadata_int, table_root
from mvsink.table.storage import Store

log = logging.getLogger(__name__)

MAX_BACKFILL = 1000
_ATTEMPTS = 5
SCHEMA = pa.schema(
    [
        ("view", pa.string()),
        ("target", pa.string()),
        ("version", pa.int64()),
        ("committed_at", pa.timestamp("ms", tz="UTC")),
        ("epoch", pa.int64()),
        ("lineage", pa.string()),
        ("writer", pa.string()),
        ("inserted", pa.int64()),
        ("retracted", pa.int64()),
        ("files_added", pa.int64()),
        ("files_removed", pa.int64()),
        ("attempts", pa.int64()),
        ("seconds", pa.float64()),
        ("phases", pa.string()),
    ]
)
"""The metrics table's columns; ``phases`` is a JSON object of seconds per step."""


def app_id(view: str, target: str) -> str:
    digest = hashlib.sha256(table_root(target).encode()).hexdigest()[:16]
    return f"mvsink-metrics:{view}@{digest}"


def record(
    metrics_table: str,
    view: str,
    target: str,
    storage_options: Mapping[str, str],
    upto: int,
    *,
    _before_commit: Callable[[], None] | None = None,
) -> int:
    """Append the rows of view ``view``'s commits in ``target`` up to version ``upto`` that the
    metrics table does not hold yet; returns how many were appended.

    The append is committed against the very snapshot the range was read from (strict, no
    delta-rs retry): a concurrent append of a replica makes it conflict and start over,
    never land on top with the same rows."""
    options = dict(storage_options) or None
    app = app_id(view, target)
    where = Where(view, metrics_table)
    for _ in range(_ATTEMPTS):
        try:
            table: DeltaTable | str
            try:
                table = DeltaTable(metrics_table, storage_options=options)
                last = table.transaction_version(app)
            except TableNotFoundError:
                table, last = metrics_table, None  # created by the append: a second creator conflicts
            if last is not None and last >= upto:
                return 0
            start = max(-1 if last is None else last, upto - MAX_BACKFILL)
            commits = history(Store(table_root(target), options or {}), upto, upto - start)
            rows = [
                _row(c, view, target)
                for c in commits
                if start < int(c["version"]) <= upto and c.get("mvsink.view") == view and "mvsink.epoch" in c
            ]
            rows.sort(key=lambda r: r["version"])
            rows_table = pa.Table.from_pylist(rows, schema=SCHEMA)
        except (DeltaError, OSError, pa.ArrowException, ValueError) as exc:
            raise StorageError(f"cannot read the view's commits for the metrics table: {exc}", where) from exc
        try:
            if _before_commit is not None:
                _before_commit()
            write_deltalake(
                table,
                rows_table,
                # Creating the table: "error", so a replica that created it meanwhile is a
                # conflict (read again), not a table to append the same rows to.
                mode="append" if isinstance(table, DeltaTable) else "error",
                storage_options=options,
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(app, upto)], max_commit_retries=0
                ),
            )
            return len(rows)
        except CommitFailedError:
            continue  # another append landed first: reload, append what is still missing
        except DeltaError as exc:
            if not isinstance(table, DeltaTable) and "exists" in str(exc).lower():
                continue  # another writer created the table first: read it, append what is missing
            raise StorageError(f"cannot append to the metrics table: {exc}", where) from exc
        except OSError as exc:
            raise StorageError(f"cannot append to the metrics table: {exc}", where) from exc
    log.warning("%s: metrics append lost the commit race %d times; the next epoch retries", where, _ATTEMPTS)
    return 0


def _row(commit: Mapping[str, Any], view: str, target: str) -> dict[str, Any]:
    def number(key: str) -> int | None:
        return metadata_int(commit.get(key))

    seconds = commit.get("mvsink.seconds")
    return {
        "view": view,
        "target": target,
        "version": int(commit["version"]),
        "committed_at": int(commit.get("timestamp") or 0),
        "epoch": number("mvsink.epoch"),
        "lineage": commit.get("mvsink.lineage"),
        "writer": commit.get("mvsink.writer"),
        "inserted": number("mvsink.inserted"),
        "retracted": number("mvsink.retracted"),
        "files_added": number("mvsink.files_added"),
        "files_removed": number("mvsink.files_removed"),
        "attempts": number("mvsink.attempts"),
        "seconds": float(seconds) if seconds not in (None, "") else None,
        "phases": commit.get("mvsink.phases") or json.dumps({}),
    }
