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

import logging
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from mvsink import failpoints
from mvsink.config import RetryPolicy
from mvsink.errors import StorageError, Where
from mvsink.table.commit import Lost, append_rows, retrying
from mvsink.table.delta import delta_errors, open_existing
from mvsink.table.log import history
from mvsink.table.record import EpochCommit, metrics_app_id
from mvsink.table.storage import Store
from mvsink.table.uris import table_root

log = logging.getLogger(__name__)

MAX_BACKFILL = 1000
_ATTEMPTS = 5
# A lost append reads again at once: replicas append after their own commits, already apart.
_RETRY = RetryPolicy(max_attempts=_ATTEMPTS, initial_backoff_s=0.0, max_backoff_s=0.0)
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


class _GaveUp(Exception):
    """The append lost the race ``_ATTEMPTS`` times (``retrying``'s exhaustion)."""


def app_id(view: str, target: str) -> str:
    return metrics_app_id(view, table_root(target))


def record(
    metrics_table: str,
    view: str,
    target: str,
    storage_options: Mapping[str, str],
    upto: int,
) -> int:
    """Append the rows of view ``view``'s commits in ``target`` up to version ``upto`` that the
    metrics table does not hold yet; returns how many were appended.

    The append is committed against the very snapshot the range was read from (strict, no
    delta-rs retry): a concurrent append of a replica makes it lose the race and start over
    (``table/commit.retrying``), never land on top with the same rows. The fail point
    ``metrics_before_commit`` comes before each append's commit."""
    options = dict(storage_options)
    app = app_id(view, target)
    where = Where(view, metrics_table)

    def attempt(_: int) -> int | Lost:
        table, rows = _missing(metrics_table, view, target, options, upto, app, where)
        if rows is None:
            return 0
        failpoints.hit("metrics_before_commit", where)
        lost = append_rows(table, rows, app_id=app, version=upto, storage_options=options, where=where)
        return rows.num_rows if lost is None else lost

    def gave_up(n: int) -> Exception:
        return _GaveUp()

    try:
        return retrying(_RETRY, attempt, lost=lambda *_: None, exhausted=gave_up)
    except _GaveUp:
        log.warning(
            "%s: metrics append lost the commit race %d times; the next epoch retries", where, _ATTEMPTS
        )
        return 0


def _missing(
    metrics_table: str,
    view: str,
    target: str,
    options: Mapping[str, str],
    upto: int,
    app: str,
    where: Where,
) -> tuple[Any, pa.Table | None]:
    """The metrics table (or its path, when there is none yet: the append creates it, and a
    second creator loses) and the rows it lacks up to ``upto`` (None: it lacks none)."""
    try:
        with delta_errors(where, "read the view's commits for the metrics table", refused=StorageError):
            table = open_existing(metrics_table, options)
            last = None if table is None else table.transaction_version(app)
            if last is not None and last >= upto:
                return table, None
            start = max(-1 if last is None else last, upto - MAX_BACKFILL)
            commits = history(Store(table_root(target), options), upto, upto - start)
            parsed = (EpochCommit.parse(c) for c in commits)
            mine = [c for c in parsed if c is not None and c.view == view]
            rows = [_row(c, target) for c in mine if start < c.version <= upto]
            rows.sort(key=lambda r: r["version"])
            return metrics_table if table is None else table, pa.Table.from_pylist(rows, schema=SCHEMA)
    except (pa.ArrowException, ValueError) as exc:
        raise StorageError(f"cannot read the view's commits for the metrics table: {exc}", where) from exc


def _row(commit: EpochCommit, target: str) -> dict[str, Any]:
    return {
        "view": commit.view,
        "target": target,
        "version": commit.version,
        "committed_at": commit.timestamp or 0,
        "epoch": commit.epoch,
        "lineage": commit.lineage,
        "writer": commit.writer,
        "inserted": commit.inserted,
        "retracted": commit.retracted,
        "files_added": commit.files_added,
        "files_removed": commit.files_removed,
        "attempts": commit.attempts,
        "seconds": commit.seconds,
        "phases": commit.phases,
    }
