"""Tombstones: the keys an upsert view deleted, and the sequence each was deleted at.

With both ``sequence_column`` and ``delete_column``, a late event never brings a deleted key
back: an event for a key is compared with the newest of what the table holds for it, its
stored rows and its tombstone (``upsert._decide``). A delete that takes effect leaves a
tombstone ``(key, sequence)``; an event newer than the tombstone re-inserts the key and clears
it; an older (or equal) one is ignored.

The tombstones of a view are one Parquet file in the table's hidden folder::

    _mvsink/<view>/tombstones/<id>.parquet

holding the key columns, the sequence column and when each tombstone was made
(``DELETED_AT``, ms). The file the view's current set is in is named by the app transaction
``mvsink:<view>#tombstones`` = ``<id>`` (a random positive number; none or 0: no tombstones).
An epoch that changes the set writes a new file with its attempt's files and names it in its
own commit, so a delete and its tombstone land together or not at all, and every version names
the set that was true at it. Readers of the view never see them. A file of an attempt that did
not land is deleted with the attempt's files; a file that stopped being current is swept
(``sweep``) once it is older than the retention (an attempt planning on a slightly older
snapshot may still be reading it).

Tombstones are kept for ``tombstone_retention`` (default: the table's
``delta.deletedFileRetentionDuration``, 7 days unset) from their delete, and dropped by the
next epoch that writes the set after that: an event older than a dropped tombstone's delete
would then insert its key again. The whole set is read on the driver and rewritten by an epoch
that changes it (its cost follows the number of tombstones, kept by the retention).
"""

from __future__ import annotations

import io
import logging
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mvsink.errors import InvariantViolation, Where
from mvsink.table.delta import Snapshot
from mvsink.table.index import HIDDEN
from mvsink.table.storage import Store
from mvsink.table.write import SideFile

log = logging.getLogger(__name__)

DELETED_AT = "__mvsink_deleted_at_ms"
SWEEP_EVERY = 100
_RECORD = "#tombstones"


def record(app_id: str) -> str:
    """The app transaction naming the view's current tombstone file."""
    return f"{app_id}{_RECORD}"


def folder(view: str) -> str:
    return f"{HIDDEN}/{view}/tombstones"


def path(view: str, number: int) -> str:
    return f"{folder(view)}/{number:016x}.parquet"


def current(snap: Snapshot, app_id: str) -> int | None:
    """The number of the view's current tombstone file at ``snap`` (None: no tombstones)."""
    number = snap.transaction(record(app_id))
    return number or None


def count(store: Store, snap: Snapshot, view: str) -> int | None:
    """How many tombstones the view's current set holds (its file's row count; None: none)."""
    number = current(snap, f"mvsink:{view}")
    if number is None:
        return None
    with store.fs.open_input_file(path(view, number)) as fh:
        return int(pq.ParquetFile(fh).metadata.num_rows)


def schema_of(arrow: pa.Schema, key: Sequence[str], sequence: str) -> pa.Schema:
    return pa.schema(
        [*(arrow.field(k) for k in key), arrow.field(sequence), pa.field(DELETED_AT, pa.int64())]
    )


def retention_ms(option: str | None, configuration: Mapping[str, str | None]) -> int:
    """How long tombstones are kept: the ``tombstone_retention`` option (a duration), else the
    table's ``delta.deletedFileRetentionDuration`` as Delta reads it (7 days unset)."""
    from mvsink.epoch.cadence import Cadence
    from mvsink.ops.vacuum import DEFAULT_RETENTION_US, table_retention_us

    if option is not None:
        seconds = Cadence.parse(option).seconds
        assert seconds is not None  # (the option's validator refuses a number of epochs)
        return int(seconds * 1000)
    table = table_retention_us(configuration)
    return (DEFAULT_RETENTION_US if table is None else table) // 1000


@dataclass
class Tombstones:
    """The tombstone sets a sink read, by file number: a file never changes, so a set read once
    (or written by this sink) is not read again."""

    number: int | None = None
    rows: pa.Table | None = None
    loads: int = 0

    def load(
        self, snap: Snapshot, store: Store, view: str, app_id: str, schema: pa.Schema, where: Where
    ) -> pa.Table:
        """The view's tombstones at ``snap``. Once every ``SWEEP_EVERY`` loads (from the
        first), superseded sets are swept (``sweep``)."""
        number = current(snap, app_id)
        self.loads += 1
        if number is not None and (self.loads - 1) % SWEEP_EVERY == 0:
            try:
                sweep(store, view, number)
            except Exception as exc:  # what stays behind is swept later
                log.warning("%s: could not sweep superseded tombstone files: %s", where, exc)
        if number is None:
            return schema.empty_table()
        if number == self.number and self.rows is not None:
            return self.rows
        data = store.get(path(view, number))
        if data is None:
            raise InvariantViolation(
                f"the view's tombstones ({path(view, number)}, named by version {snap.version}) are "
                "missing: was the table's _mvsink folder deleted? Nothing was written",
                where,
            )
        rows = pq.read_table(io.BytesIO(data.to_pybytes())).select(schema.names).cast(schema)
        self.number, self.rows = number, rows
        return rows

    def remember(self, number: int, rows: pa.Table) -> None:
        """The set this sink's commit made current."""
        self.number, self.rows = number, rows


@dataclass(frozen=True)
class Changes:
    """What an epoch does to touched keys' tombstones: ``set``, keys (and the sequence) whose
    tombstone is new or newer; ``cleared``, keys whose tombstone goes."""

    set: pa.Table
    cleared: pa.Table

    @property
    def empty(self) -> bool:
        return bool(self.set.num_rows == 0 and self.cleared.num_rows == 0)


def next_set(
    live: pa.Table, changes: Changes, key: Sequence[str], *, expired: bool, now_ms: int | None = None
) -> pa.Table | None:
    """The tombstone set after an epoch: the ``live`` ones (within the retention) less the
    changed keys, plus the new ones (made now). None: the set stays as it is (no change, and
    none ``expired``)."""
    if changes.empty and not expired:
        return None
    now = int(time.time() * 1000) if now_ms is None else now_ms
    keys = list(key)
    touched = pa.concat_tables([changes.set.select(keys), changes.cleared.select(keys)])
    kept = live
    if touched.num_rows and kept.num_rows:
        kept = kept.join(touched, keys, join_type="left anti").select(live.schema.names)
    made = changes.set.append_column(DELETED_AT, pa.array(np.full(changes.set.num_rows, now, dtype=np.int64)))
    return pa.concat_tables([kept.cast(live.schema), made.select(live.schema.names).cast(live.schema)])


@dataclass(frozen=True)
class NewSet:
    """A tombstone set an attempt writes and its commit names."""

    number: int
    rows: pa.Table
    app_id: str
    view: str

    def side(self) -> SideFile:
        """The file, as the attempt stages it (``write.stage``), and what its commit records."""
        out = io.BytesIO()
        pq.write_table(self.rows, out)
        return SideFile(path(self.view, self.number), out.getvalue(), {record(self.app_id): self.number})


def new_set(view: str, app_id: str, rows: pa.Table) -> NewSet:
    return NewSet(random.SystemRandom().randrange(1, 1 << 62), rows, app_id, view)


SWEEP_GRACE_MS = 3_600_000
"""How long a tombstone file that stopped being current is kept: an attempt still planning on a
snapshot that named it reads it (one that plans longer fails, and its epoch is retried)."""


def sweep(store: Store, view: str, keep: int, now_ms: int | None = None) -> int:
    """Delete the view's tombstone files other than the current one (``keep``, which this sink
    just committed) that are older than ``SWEEP_GRACE_MS``, once the current one is too (a
    file stopped being current about when the current one was written); how many."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    ages = {p: mtime * 1000 for p, (_, mtime) in store.listing(folder(view)).items()}
    written = ages.get(path(view, keep))
    if written is None or written > now - SWEEP_GRACE_MS:
        return 0
    gone = [p for p, at in ages.items() if p != path(view, keep) and at < now - SWEEP_GRACE_MS]
    store.delete_later(gone, "superseded tombstone files")
    return len(gone)


def reader_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f for f in schema if f.name != DELETED_AT])


@dataclass(frozen=True)
class TaskReader:
    """Runs in a Spark task: a tombstone file's keys and sequences (the distributed path)."""

    store: Store
    path: str
    schema: pa.Schema
    since: int
    """Tombstones made before this (ms) are past the retention."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            pass
        data = self.store.get(self.path)
        if data is None:
            raise InvariantViolation(f"the view's tombstones ({self.path}) are missing")
        rows = pq.read_table(io.BytesIO(data.to_pybytes()))
        live = rows.filter(pc.greater_equal(rows.column(DELETED_AT), self.since))
        yield from live.select(self.schema.names).cast(self.schema).to_batches()
