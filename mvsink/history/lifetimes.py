"""Lifetimes: the history table's rows, and how one version of the view's table moves them.

A lifetime is a row of the view with the span it was held: ``valid_from`` (inclusive) to
``valid_to`` (exclusive; null while the row is held), and the versions, epochs and kinds of
commit (``Change.by``) that opened and closed it. The view at time ``t`` is the multiset of
rows whose lifetime holds ``t``; a row held twice has two lifetimes.

``carry`` is the one rule: a version's rows in (its added files) are matched, one for one and
by whole-row fingerprint, against its rows out (the lifetimes of its removed files). A matched
row keeps its lifetime (a row moved to another file, by a rewrite or a compaction, did not
change); an unmatched added row opens one; an unmatched removed lifetime closes. Of a row held
several times, the oldest lifetimes are kept: which ones close does not change the multiset
at any time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from mvsink.errors import ConfigError, Where
from mvsink.table.fingerprint import fingerprints
from mvsink.table.schema import target_schema_json, target_struct

VALID_FROM = "valid_from"
VALID_TO = "valid_to"
OPENED_VERSION = "opened_version"
OPENED_EPOCH = "opened_epoch"
OPENED_BY = "opened_by"
CLOSED_VERSION = "closed_version"
CLOSED_EPOCH = "closed_epoch"
CLOSED_BY = "closed_by"

LIFETIME = StructType(
    [
        StructField(VALID_FROM, TimestampType()),
        StructField(VALID_TO, TimestampType()),
        StructField(OPENED_VERSION, LongType()),
        StructField(OPENED_EPOCH, LongType()),
        StructField(OPENED_BY, StringType()),
        StructField(CLOSED_VERSION, LongType()),
        StructField(CLOSED_EPOCH, LongType()),
        StructField(CLOSED_BY, StringType()),
    ]
)
"""The columns a history row has after the view's own."""
COLUMNS = tuple(LIFETIME.fieldNames())
_OPENING = (VALID_FROM, OPENED_VERSION, OPENED_EPOCH, OPENED_BY)
_CLOSING = (VALID_TO, CLOSED_VERSION, CLOSED_EPOCH, CLOSED_BY)

By = Literal["epoch", "repair", "foreign", "start", "late"]
"""What made a version, as its lifetimes say: an epoch of the view; the first epoch after a
foreign write (its changes repair it, with the epoch's own); a write by anything else; the
rows the view held when its history began; an upsert view's late event (``met_late``)."""


@dataclass(frozen=True)
class Change:
    """One version of the view's table, as the history records it."""

    version: int
    time_us: int
    """Its time, microseconds since 1970 (``valid_from`` of what it opens, ``valid_to`` of
    what it closes)."""
    epoch: int | None
    by: By


def history_struct(view: StructType, where: Where) -> StructType:
    """The history table's schema for a view of columns ``view``: the view's, then
    ``LIFETIME``'s. A view with a column of those names has no history (``ConfigError``)."""
    clash = sorted(set(view.fieldNames()) & set(COLUMNS))
    if clash:
        raise ConfigError(
            f"option 'history_target': the view has column(s) {clash}, which the history adds to "
            "every row (its lifetime); rename them in the query to keep a history",
            where,
        )
    # The view's columns without their metadata (a column-mapped view's physical names, at
    # any depth): the history is a plain table of its own.
    plain = target_struct(target_schema_json(view)).fields
    return StructType([*plain, *LIFETIME.fields])


def view_struct(history: StructType) -> StructType:
    """The view's columns of a history schema."""
    return StructType([f for f in history.fields if f.name not in COLUMNS])


def opened(rows: pa.Table, change: Change, schema: pa.Schema) -> pa.Table:
    """``rows`` of the view (its columns) as lifetimes ``change`` opens."""
    n = rows.num_rows
    values = _values(change, schema, n)
    columns = {}
    for name in schema.names:
        if name not in COLUMNS:
            columns[name] = rows.column(name)
        else:  # what it opens; nothing closes it yet
            columns[name] = values[name] if name in _OPENING else pa.nulls(n, schema.field(name).type)
    return pa.table(columns, schema=schema)


def met_late(rows: pa.Table, change: Change, schema: pa.Schema) -> pa.Table:
    """``rows`` of the view, late events ``change`` met (``plan/late.py``): lifetimes that close
    as they open, since the view never held them. They say when each came, and no time holds
    them: a late event reopens nothing, and the view at any time or version is unchanged."""
    return close(opened(rows, change, schema), change, schema)


def carry(
    gone: pa.Table, added: Sequence[pa.Table], change: Change, schema: pa.Schema
) -> tuple[list[pa.Table], pa.Table]:
    """What ``change`` does to lifetimes: ``gone`` (the open lifetimes of the files it removed,
    in the history's ``schema``) against ``added`` (the rows of each file it added, the view's
    columns): the open lifetimes of each added file, and the lifetimes it closed."""
    view = [n for n in schema.names if n not in COLUMNS]
    sizes = [t.num_rows for t in added]
    rows = (
        pa.concat_tables(added) if added else pa.table({n: pa.array([], schema.field(n).type) for n in view})
    )
    rows = rows.select(view)
    ga, gb = fingerprints(gone.select(view)) if gone.num_rows else (np.empty(0, np.int64),) * 2
    ra, rb = fingerprints(rows) if rows.num_rows else (np.empty(0, np.int64),) * 2
    oldest_first = gone.column(OPENED_VERSION).to_numpy(zero_copy_only=False).astype(np.int64)
    pairs = pa.table({"a": ga, "b": gb, "r": _ranks(ga, gb, oldest_first), "i": np.arange(len(ga))}).join(
        pa.table({"a": ra, "b": rb, "r": _ranks(ra, rb, np.arange(len(ra))), "j": np.arange(len(ra))}),
        keys=["a", "b", "r"],
        join_type="inner",
        use_threads=False,
    )
    kept_from = np.full(len(ra), -1, np.int64)
    kept_from[pairs.column("j").to_numpy()] = pairs.column("i").to_numpy()
    matched = kept_from >= 0
    carried = gone.take(pa.array(np.where(matched, kept_from, 0))) if gone.num_rows else None
    new = opened(rows, change, schema)
    if carried is not None and matched.any():
        mask = pa.array(matched)
        new = pa.table(
            {
                n: pc.if_else(mask, carried.column(n), new.column(n)) if n in COLUMNS else new.column(n)
                for n in schema.names
            },
            schema=schema,
        )
    still = np.ones(len(ga), bool)
    still[pairs.column("i").to_numpy()] = False
    closed = close(gone.filter(pa.array(still)), change, schema)
    out, start = [], 0
    for size in sizes:
        out.append(new.slice(start, size))
        start += size
    return out, closed


def _ranks(a: np.ndarray, b: np.ndarray, tie: np.ndarray) -> np.ndarray:
    """Each row's place among the rows of its fingerprint, in ``tie`` order (0: first)."""
    n = len(a)
    if n == 0:
        return np.empty(0, np.int64)
    order = np.lexsort((np.arange(n), tie, b, a))
    sa, sb = a[order], b[order]
    first = np.ones(n, bool)
    first[1:] = (sa[1:] != sa[:-1]) | (sb[1:] != sb[:-1])
    starts = np.flatnonzero(first)
    begins = np.repeat(starts, np.diff(np.append(starts, n)))
    ranks = np.empty(n, np.int64)
    ranks[order] = np.arange(n) - begins
    return ranks


def close(lifetimes: pa.Table, change: Change, schema: pa.Schema) -> pa.Table:
    """``lifetimes`` closed by ``change``."""
    n = lifetimes.num_rows
    values = _values(change, schema, n)
    return pa.table(
        {name: values[name] if name in _CLOSING else lifetimes.column(name) for name in schema.names},
        schema=schema,
    )


def _values(change: Change, schema: pa.Schema, n: int) -> dict[str, pa.Array]:
    """The lifetime columns ``change`` sets, ``n`` times (as it opens and as it closes)."""
    time = pa.array(np.full(n, change.time_us, np.int64)).cast(schema.field(VALID_FROM).type)
    version = pa.array(np.full(n, change.version, np.int64))
    epoch = pa.nulls(n, pa.int64()) if change.epoch is None else pa.array(np.full(n, change.epoch, np.int64))
    by = pa.array([change.by] * n, pa.string())
    return {
        VALID_FROM: time,
        VALID_TO: time,
        OPENED_VERSION: version,
        CLOSED_VERSION: version,
        OPENED_EPOCH: epoch,
        CLOSED_EPOCH: epoch,
        OPENED_BY: by,
        CLOSED_BY: by,
    }
