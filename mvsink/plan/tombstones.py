"""Tombstones: the keys an upsert view deleted, and the sequence each was deleted at.

With both ``sequence_column`` and ``delete_column``, a late event never brings a deleted key
back: an event for a key is compared with the newest of what the table holds for it, its
stored rows and its tombstone (``upsert._decide_keys``). A delete that takes effect leaves a
tombstone ``(key, sequence)``; an event newer than the tombstone (or as new) re-inserts the key
and clears it; an older one is ignored.

A view's tombstones are a **set**: a folder in the table's hidden folder::

    _mvsink/<view>/tombstones/<number>/part-<n>.parquet ...   the key columns, the sequence
                                                               column, DELETED_AT (ms)
    _mvsink/<view>/tombstones/<number>/set.json               its parts, rows, oldest DELETED_AT

The set that is current is named by the app transaction ``mvsink:<view>#tombstones`` =
``<number>`` (a random positive number; none or 0: no tombstones). An epoch that changes the
set writes a new one with its attempt's files (``staging.stage``: on the driver, or by Spark
tasks on the distributed path, never collected) and names it in its own commit, so a delete
and its tombstone land in one version or not at all, and every version names the set true at
it. Readers of the view never see them. The set of an attempt that did not land is deleted
with the attempt's files; a set that stopped being current is swept (``sweep``) an hour after
(an attempt planning on a slightly older snapshot may still read it).

Tombstones are kept for ``tombstone_retention`` (default: the table's
``delta.deletedFileRetentionDuration``, 7 days unset) from their delete: past it a tombstone
counts for nothing, and the next set written leaves it out. An event older than an expired
tombstone's delete would insert its key again. An epoch that changes the set writes it whole
(its cost follows the number of tombstones the retention keeps); the driver path reads it
whole (kept while it does not change), the distributed path in Spark tasks.
"""

from __future__ import annotations

import io
import json
import logging
import random
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql.types import LongType, StringType, StructField, StructType

from mvsink.compat import from_arrow, map_in_arrow, to_arrow
from mvsink.errors import ConfigError, InvariantViolation, Where
from mvsink.table.delta import RETENTION, Snapshot, table_retention_us
from mvsink.table.index import HIDDEN
from mvsink.table.plan import SideFiles
from mvsink.table.record import Keys
from mvsink.table.storage import ParquetWriter, Store
from mvsink.table.tasks import in_task

log = logging.getLogger(__name__)

DELETED_AT = "__mvsink_deleted_at_ms"
MANIFEST = "set.json"
SWEEP_EVERY = 100
"""A sink's commits between sweeps of superseded sets (its first commit sweeps)."""
SWEEP_GRACE_MS = 3_600_000
"""How long the current set must have been written before others are swept: an attempt
still planning on a snapshot that named the one before reads it."""
DRIVER_TOMBSTONES = 2_000_000
"""Tombstones the driver path holds at most (each holds the key columns and more: a set of
more goes to the distributed path, where tasks read, join and write it)."""
PART_ROWS = 1_000_000
"""Tombstones a part file of a set written by tasks holds, about."""


def record(app_id: str) -> str:
    """The app transaction naming the view's current set."""
    return Keys(app_id).tombstones


def root(view: str) -> str:
    return f"{HIDDEN}/{view}/tombstones"


def folder(view: str, number: int) -> str:
    return f"{root(view)}/{number:016x}"


def current(snap: Snapshot, app_id: str) -> int | None:
    """The number of the view's current set at ``snap`` (None: no tombstones)."""
    return snap.transaction(record(app_id)) or None


def schema_of(arrow: pa.Schema, key: Sequence[str], sequence: str) -> pa.Schema:
    return pa.schema(
        [*(arrow.field(k) for k in key), arrow.field(sequence), pa.field(DELETED_AT, pa.int64())]
    )


def retention_ms(option: str | None, configuration: Mapping[str, str | None], where: Where) -> int:
    """How long tombstones are kept: the ``tombstone_retention`` option (a duration), else the
    table's ``delta.deletedFileRetentionDuration`` as Delta reads it (7 days unset). A table
    retention mvsink does not read as Delta does, or one that is not positive, is refused: a
    shorter retention than meant would let late events bring deleted keys back."""
    from mvsink.config import Cadence

    if option is not None:
        seconds = Cadence.parse(option).seconds
        assert seconds is not None  # (the option's validator refuses a number of epochs)
        return int(seconds * 1000)
    table = table_retention_ms(configuration)
    if table is None or table <= 0:
        raise ConfigError(
            f"the table's {RETENTION} ({configuration.get(RETENTION)!r}) is not a positive duration "
            "mvsink reads as Delta does, and tombstones are kept that long by default: set "
            "tombstone_retention (e.g. '7d') or the table property ('interval 7 days')",
            where,
        )
    return table


def table_retention_ms(configuration: Mapping[str, str | None]) -> int | None:
    """The table's ``delta.deletedFileRetentionDuration`` in ms (None: not read as Delta does)."""
    table = table_retention_us(configuration)
    return None if table is None else table // 1000


@dataclass(frozen=True)
class Manifest:
    """What a set holds: its part files (relative to the table) and rows, and the time of its
    oldest tombstone (None: it holds none)."""

    parts: tuple[str, ...]
    rows: int
    oldest: int | None
    under: tuple[str, ...] | None = None
    """The key columns and the sequence column the set was written under (None: a set written
    before sets named them, taken as the view's). A set written under another key counts for
    nothing (``Tombstones.manifest_at``): after a re-keying, a narrower key would merge
    several keys' tombstones, and one of them would decide at random."""

    @staticmethod
    def read(store: Store, view: str, number: int, where: Where | None = None) -> Manifest:
        data = store.get(f"{folder(view, number)}/{MANIFEST}")
        if data is None:
            raise InvariantViolation(
                f"the view's tombstones ({folder(view, number)}, named by the table) are missing: "
                "was the table's _mvsink folder deleted? Nothing was written",
                where,
            )
        doc = json.loads(data.to_pybytes())
        under = tuple(doc["under"]) if doc.get("under") is not None else None
        return Manifest(tuple(doc["parts"]), int(doc["rows"]), doc["oldest"], under)

    def dump(self) -> bytes:
        doc = {"parts": list(self.parts), "rows": self.rows, "oldest": self.oldest, "under": self.under}
        return json.dumps(doc).encode()


def count(store: Store, snap: Snapshot, view: str) -> int | None:
    """How many tombstones the view's current set holds (None: it keeps none)."""
    number = current(snap, Keys.of(view).app_id)
    return None if number is None else Manifest.read(store, view, number).rows


@dataclass
class Tombstones:
    """The sets a sink read, by number: a set never changes, so one read once (or written by
    this sink on the driver) is not read again."""

    number: int | None = None
    manifest: Manifest | None = None
    rows: pa.Table | None = None
    commits: int = 0

    def manifest_at(
        self, snap: Snapshot, store: Store, view: str, app_id: str, under: Sequence[str], where: Where
    ) -> Manifest | None:
        """The current set's manifest (None: no tombstones, or a set written under another key
        and sequence than ``under``: it counts for nothing, and the next set starts afresh)."""
        number = current(snap, app_id)
        if number is None:
            return None
        if number != self.number:
            self.number, self.manifest, self.rows = number, None, None
        if self.manifest is None:
            self.manifest = _with_under(store, Manifest.read(store, view, number, where))
        if self.manifest.under is not None and self.manifest.under != tuple(under):
            log.warning(
                "%s: the view's tombstones were written under key and sequence %s, not %s: they "
                "count for nothing (the view was re-keyed)",
                where,
                list(self.manifest.under),
                list(under),
            )
            return None
        return self.manifest

    def load(
        self, snap: Snapshot, store: Store, view: str, app_id: str, schema: pa.Schema, where: Where
    ) -> pa.Table:
        """The view's tombstones at ``snap``, on the driver."""
        manifest = self.manifest_at(snap, store, view, app_id, schema.names[:-1], where)
        if manifest is None:
            return schema.empty_table()
        if self.rows is None:
            tables = [_read_part(store, p, schema) for p in manifest.parts]
            self.rows = pa.concat_tables(tables) if tables else schema.empty_table()
        return self.rows

    def remember(self, number: int, rows: pa.Table | None) -> None:
        """The set this sink's commit made current (its rows, if they are on the driver)."""
        self.number, self.manifest, self.rows = number, None, rows

    def sweep_once(self, store: Store, view: str, keep: int | None, keep_ms: int, where: Where) -> None:
        """After a commit of this sink (never a standby's), once every ``SWEEP_EVERY`` commits
        from the first: ``sweep``, keeping sets written within ``keep_ms``."""
        self.commits += 1
        if keep is None or (self.commits - 1) % SWEEP_EVERY:
            return
        try:
            gone = sweep(store, view, keep, keep_ms)
            if gone:
                log.info("%s: swept %d superseded tombstone sets", where, gone)
        except Exception as exc:  # what stays behind is swept later
            log.warning("%s: could not sweep superseded tombstone sets: %s", where, exc)


def _with_under(store: Store, manifest: Manifest) -> Manifest:
    """A manifest written before sets named their key, with the key and sequence its first
    part holds (a part's columns are the key's, the sequence's, then ``DELETED_AT``)."""
    if manifest.under is not None or not manifest.parts:
        return manifest
    data = store.get(manifest.parts[0])
    if data is None:
        raise InvariantViolation(f"a part of the view's tombstones is missing: {manifest.parts[0]}")
    names = pq.read_schema(io.BytesIO(data.to_pybytes())).names
    return replace(manifest, under=tuple(n for n in names if n != DELETED_AT))


def _read_part(store: Store, path: str, schema: pa.Schema) -> pa.Table:
    data = store.get(path)
    if data is None:
        raise InvariantViolation(f"a part of the view's tombstones is missing: {path}")
    return pq.read_table(io.BytesIO(data.to_pybytes())).select(schema.names).cast(schema)


def frame(
    spark: Any, store: Store, manifest: Manifest, schema: pa.Schema, struct: StructType, since: int
) -> DataFrame:
    """The set's tombstones made at or after ``since`` (ms), read by Spark tasks (a part each),
    as rows of ``struct`` (``schema`` in Spark's terms)."""
    parts = from_arrow(spark, pa.table({"path": list(manifest.parts)}), "path string")
    parts = parts.repartition(max(1, len(manifest.parts)))
    read: DataFrame = parts.mapInArrow(_PartReader(store, schema, since), struct)
    return read


@dataclass(frozen=True)
class _PartReader:
    store: Store
    schema: pa.Schema
    since: int

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for path in batch.column(0).to_pylist():
                with in_task(f"reading {path}"):
                    rows = _read_part(self.store, path, self.schema)
                yield from rows.filter(pc.greater_equal(rows.column(DELETED_AT), self.since)).to_batches()


@dataclass(frozen=True)
class Changes:
    """What an epoch does to touched keys' tombstones: ``set``, keys (and the sequence) whose
    tombstone is new or newer; ``cleared``, keys whose tombstone goes."""

    set: pa.Table
    cleared: pa.Table

    @property
    def empty(self) -> bool:
        return bool(self.set.num_rows == 0 and self.cleared.num_rows == 0)


def next_set(live: pa.Table, changes: Changes, key: Sequence[str], now_ms: int) -> pa.Table:
    """The set after an epoch, on the driver: the ``live`` tombstones (within the retention)
    less the changed keys, plus the new ones (made ``now_ms``)."""
    keys = list(key)
    touched = pa.concat_tables([changes.set.select(keys), changes.cleared.select(keys)])
    kept = live
    if touched.num_rows and kept.num_rows:
        kept = kept.join(touched, keys, join_type="left anti").select(live.schema.names)
    made = changes.set.append_column(
        DELETED_AT, pa.array(np.full(changes.set.num_rows, now_ms, dtype=np.int64))
    )
    return pa.concat_tables([kept.cast(live.schema), made.select(live.schema.names).cast(live.schema)])


def next_frame(
    live: DataFrame | None, set_: DataFrame, cleared: DataFrame | None, key: Sequence[str], now_ms: int
) -> DataFrame:
    """``next_set`` in Spark: ``set_`` (key and sequence) and ``cleared`` (key) are frames."""
    from pyspark.sql import functions as F

    keys = list(key)
    made = set_.withColumn(DELETED_AT, F.lit(now_ms).cast("long"))
    if live is None:
        return made
    touched = set_.select(*keys)
    if cleared is not None:
        touched = touched.unionByName(cleared.select(*keys))
    return live.join(touched, keys, "left_anti").unionByName(made)


@dataclass(frozen=True)
class NewSet:
    """A set an attempt writes (``staging.stage``) and its commit names: its rows on the driver
    or in Spark."""

    number: int
    view: str
    app_id: str
    rows: pa.Table | DataFrame
    schema: pa.Schema

    def side(self) -> SideFiles:
        return SideFiles(folder(self.view, self.number), self, {record(self.app_id): self.number})

    def write(self, store: Store) -> list[str]:
        """Write the set's parts, then its manifest; the paths written."""
        base = folder(self.view, self.number)
        if isinstance(self.rows, pa.Table):
            written = [_write_part(store, base, self.rows.cast(self.schema))] if self.rows.num_rows else []
        else:
            # One part per task; what comes back is a row per task.
            done = to_arrow(map_in_arrow(self.rows, _PartWriter(store, base, self.schema), _WRITTEN))
            written = [
                (p, int(r), None if o is None else int(o))
                for p, r, o in zip(
                    *(done.column(c).to_pylist() for c in ("path", "rows", "oldest")), strict=True
                )
                if r
            ]
        ages = [o for _, _, o in written if o is not None]
        manifest = Manifest(
            tuple(p for p, _, _ in written),
            sum(r for _, r, _ in written),
            min(ages) if ages else None,
            tuple(self.schema.names[:-1]),  # the key columns and the sequence (``schema_of``)
        )
        store.put(f"{base}/{MANIFEST}", manifest.dump())
        return [*(p for p, _, _ in written), f"{base}/{MANIFEST}"]


def _write_part(store: Store, base: str, rows: pa.Table) -> tuple[str, int, int | None]:
    path = f"{base}/part-{uuid.uuid4().hex}.parquet"
    out = pa.BufferOutputStream()
    with ParquetWriter(out, rows.schema) as writer:
        writer.write_table(rows)
    store.put(path, out.getvalue())
    oldest = pc.min(rows.column(DELETED_AT)).as_py() if rows.num_rows else None
    return path, rows.num_rows, oldest


@dataclass(frozen=True)
class _PartWriter:
    """Runs in a Spark task: its rows of a set as one part file; yields (path, rows, oldest)."""

    store: Store
    base: str
    schema: pa.Schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        path = f"{self.base}/part-{uuid.uuid4().hex}.parquet"
        out = pa.BufferOutputStream()
        n, oldest = 0, None
        with in_task(f"writing tombstones under {self.base}"):
            with ParquetWriter(out, self.schema) as writer:  # batch by batch: rows stay compressed
                for batch in batches:
                    if batch.num_rows == 0:
                        continue
                    rows = pa.Table.from_batches([batch]).select(self.schema.names).cast(self.schema)
                    writer.write_table(rows)
                    n += rows.num_rows
                    low = pc.min(rows.column(DELETED_AT)).as_py()
                    oldest = low if oldest is None else min(oldest, low)
            if n:
                self.store.put(path, out.getvalue())
        if n:
            yield pa.RecordBatch.from_pydict(
                {"path": [path], "rows": [n], "oldest": [oldest]}, schema=_WRITTEN_ARROW
            )


_WRITTEN = StructType(
    [StructField("path", StringType()), StructField("rows", LongType()), StructField("oldest", LongType())]
)
_WRITTEN_ARROW = pa.schema([("path", pa.string()), ("rows", pa.int64()), ("oldest", pa.int64())])


def new_set(view: str, app_id: str, rows: pa.Table | DataFrame, schema: pa.Schema) -> NewSet:
    return NewSet(random.SystemRandom().randrange(1, 1 << 62), view, app_id, rows, schema)


def sweep(store: Store, view: str, keep: int, keep_ms: int, now_ms: int | None = None) -> int:
    """Delete the view's sets other than ``keep`` (the current one) written more than
    ``keep_ms`` ago (the table's retention, at least ``SWEEP_GRACE_MS``), once ``keep`` was
    written more than ``SWEEP_GRACE_MS`` ago; how many. Every set the log named before
    ``keep`` stopped being current about when ``keep`` was written, and an attempt that
    never landed, or is still staging, wrote its set within the retention (as ``vacuum``
    keeps staged data files)."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    written: dict[str, float] = {}
    for p, (_, mtime) in store.listing(root(view)).items():
        name = p.removeprefix(root(view) + "/").split("/", 1)[0]
        written[name] = max(written.get(name, 0.0), mtime * 1000)
    mine = f"{keep:016x}"
    if mine not in written or written[mine] > now - SWEEP_GRACE_MS:
        return 0
    oldest = now - max(keep_ms, SWEEP_GRACE_MS)
    gone = [n for n, at in written.items() if n != mine and at < oldest]
    for name in gone:
        store.delete_folder(f"{root(view)}/{name}")
    return len(gone)
