"""``mvsink-delta``: a Delta table as a Spark stream, version by version.

A Spark 4 Python data source (no connector jar): register it, then read a Delta table (on
local disk or an object store) as a stream whose offset is the Delta version::

    from mvsink.sources.reader import register
    register(spark)
    stream = (spark.readStream.format("mvsink-delta")
              .option("path", "s3://bucket/bronze/orders")
              .option("storage.AWS_REGION", "eu-west-1")  # storage options: "storage." + key
              .load())

Options (``options.py`` checks them all; an unknown name is a ``ConfigError``): ``path``,
``mode``, ``startingVersion``, ``startingSnapshot``, ``maxVersionsPerTrigger`` (at least 1),
``rewriteRowsPerTask``, and storage options as ``storage.<key>`` (bare ``AWS_*``, ``AZURE_*``,
``GOOGLE_*`` keys too, as documented before the prefix).

**Where a query starts** (``_start``; a restarted query goes on from its checkpoint):

- ``startingVersion = n``: the versions from ``n`` on (``latest``: those after the latest
  version when the stream is defined);
- ``startingSnapshot = n``: the table as of version ``n`` (``latest``: the latest version) in
  the first batch, then the versions after it (what Delta's own source does for a new query);
- neither: version 0 on (the first batch rebuilds the view) while the log holds version 0 and
  its commit is younger than the table's ``delta.deletedFileRetentionDuration`` (7 days
  unless set), so that no file any version removed can have been vacuumed yet; otherwise
  (log cleanup, an older table) the snapshot at the latest version. One read of version 0's
  commit decides it, not a look at every file.

The start and the stream's schema are worked out once, when the stream is defined
(``DeltaVersions._plan``: Spark keeps the source object it asked the schema of and hands it
the reader's turn). Each micro-batch reads the versions after the last one it read, up to the
latest (at most ``maxVersionsPerTrigger`` of them when given; a snapshot is one batch of its
own).

**The offset** ``{"version": v, "from": s, "id": t}`` orders batches by ``v``, the same for
every query reading the table, which is what replicas need to share a clock. ``s`` is where
the query's first batch starts: the version before its first (``startingVersion - 1``), or for
a snapshot start at ``L``, ``L`` itself. A snapshot is the table's state at ``L``, not its
changes: it holds no retraction of a row removed before ``L`` (nor tells an append sink which
rows it already holds), so it proves nothing about the versions before ``L``, and a shared
clock (``epoch/clock.py``) lets such a batch write only over a view that stands at ``L`` or
later. ``t`` is the table's id (Delta's ``metaData.id``): a table dropped and made again at
the same path has a new id and versions that are not the ones the stream read, so a stream
whose offsets name another id than the table now at the path stops (``_same_table``), whether
Spark asks for new offsets or replays a batch of its checkpoint. An offset of a checkpoint
written before ``id`` was recorded is taken as it is and the next offset records the id of
the table found then (a table replaced before that restart goes unnoticed).

**Schema.** The stream's schema is the table's at the query's start (the starting version,
or the snapshot's; where log cleanup took the starting version, the latest version's, since
when Spark asks the schema the checkpoint is not known). A version that changes it stops the
stream there, on a fresh start and after a restart alike (start a new query from that version
to read on), so every version the stream reads is read under its own schema. A restarted
query checks the table's schema at the version its checkpoint stands at against the stream's,
and stops where they differ or where that schema can no longer be read (``_check_resumed``).

**Cost.** A trigger reads the log only: the commit file of the version last seen (to see it is
still the one seen: a table made again is not) and the names of those after it; the whole
table (every file's action) is loaded when the reader starts and when that commit changed.

Versions are read from the commit files of the Delta log through the sink's I/O layer
(``storage.Store``). Two modes (option ``mode``):

- ``"appends"`` (default): the rows of the files each version *adds with a data change*. A
  version that only rearranges rows (a compaction, ``dataChange = false``) adds nothing; a
  version that deletes or rewrites rows is not a pure append and is refused, since its removed
  rows cannot be told apart from rows that stay. One input partition per added file.
- ``"changes"``: the exact change feed of a table such as a view mvsink keeps. Each version
  yields the rows it inserted (``diff = +1``) and retracted (``diff = -1``), one row per unit,
  with its ``_commit_version``: the multiset difference of the rows of the files it adds and
  removes (``changes.py``), so the untouched rows of a rewritten file do not show up. Summed
  over versions from 0 the feed is the table (a snapshot start yields the table at its
  version as inserts); a compaction yields nothing. A version that only
  adds (or only removes) files is read one task per file; in a partition where it does both,
  the rows cancel by fingerprint: one task reads that partition's files and holds the
  fingerprints of the rows they hold (about 40 bytes a row), or, above ``rewriteRowsPerTask``
  rows (default 20M, from the log's row counts), the fingerprints are split into up to
  ``MAX_REWRITE_BUCKETS`` buckets, one task each: equal rows share a bucket, so each task
  cancels exactly and holds a share of the fingerprints, but reads every file of the
  partition (memory divided, reads multiplied by the bucket count).

Either mode refuses tables whose files do not hold rows as their names say (deletion
vectors, column mapping).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.types import LongType, StructField, StructType

from mvsink.compat import PYTHON_DATA_SOURCES, SPARK_LINE

if PYTHON_DATA_SOURCES:
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
else:  # Spark 3.5: the module imports, and ``register`` says why there is no source

    class DataSource:  # type: ignore[no-redef]
        pass

    class DataSourceStreamReader:  # type: ignore[no-redef]
        pass

    class InputPartition:  # type: ignore[no-redef]
        pass


try:  # Spark 4.2+: read limits and availableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxFiles,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - older Spark: every trigger reads all available
    ReadAllAvailable = ReadMaxFiles = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass


from mvsink.errors import ConfigError, InputError, Where
from mvsink.sources.changes import Mask, exact_change
from mvsink.sources.options import MODES, NAME, REWRITE_ROWS_PER_TASK, SourceOptions, parse
from mvsink.table.delta import (
    DataFile,
    DeltaTable,
    check_features,
    delta_errors,
    open_table,
    partition_string,
    table_retention_us,
)
from mvsink.table.fingerprint import I64, fingerprints
from mvsink.table.log import commit_info, log_actions
from mvsink.table.properties import COLUMN_MAPPING, DELETION_VECTORS, TableProperties
from mvsink.table.schema import arrow_schema
from mvsink.table.storage import Store, partition_array

__all__ = ["MODES", "NAME", "REWRITE_ROWS_PER_TASK", "DeltaVersions", "register"]

DIFF = "diff"
VERSION = "_commit_version"
MAX_REWRITE_BUCKETS = 16
"""At most this many tasks split one rewrite: each reads every file of it."""
_NEW_QUERY = (
    "start a new query (a new checkpoint) with startingSnapshot='latest' (the table as it is, "
    "then its versions) or a later startingVersion"
)


def register(spark: Any) -> None:
    """Make ``spark.readStream.format("mvsink-delta")`` available in this session (Spark 4.0+)."""
    if not PYTHON_DATA_SOURCES:
        raise ConfigError(
            f"format('{NAME}') is a Python data source, which Spark runs from 4.0 on; this is "
            f"PySpark {'.'.join(map(str, SPARK_LINE))}. On Spark 3.5 read a Delta table with Delta's "
            "own source (delta-spark in the session) or a file source: clock='source_offsets' "
            "works with those too (docs/replicas.md)"
        )
    spark.dataSource.register(DeltaVersions)


@dataclass(frozen=True)
class _Start:
    """Where a new query starts: the versions from ``version`` on, or (``snapshot``) the table
    as of ``version`` and then the versions after it."""

    version: int
    snapshot: bool


@dataclass(frozen=True)
class _Plan:
    """What a query is defined with: where a new one starts, and the stream's schema."""

    start: _Start
    schema: StructType
    """The table's at ``start.version`` (the latest version's for a start past it)."""
    exact: bool
    """Whether ``schema`` was read at the start's version. False where log cleanup took that
    version and the latest version's schema stands in: a restart checks it against the
    version its checkpoint stands at, a new query cannot start there (``_check_resumed``)."""


class DeltaVersions(DataSource):
    """The ``mvsink-delta`` source (see the module doc)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    @cached_property
    def _plan(self) -> tuple[SourceOptions, _Plan]:
        # ``schema`` and ``streamReader`` both need it. Spark pickles this object once it gave
        # the schema and builds the reader from that copy, so the log is read once (and the
        # schema the query was defined with goes with the start it was worked out for).
        opts = parse(self.options)
        return opts, _plan(opts)

    def schema(self) -> StructType:
        opts, plan = self._plan
        table = plan.schema
        if opts.mode == "appends":
            return table
        taken = {f.name.lower() for f in table.fields} & {DIFF, VERSION.lower()}
        if taken:
            raise InputError(
                f"the table at {opts.root} has column(s) {sorted(taken)}, which the "
                f"change feed adds ({DIFF!r}, {VERSION!r}): rename them in the view"
            )
        return StructType(
            [*table.fields, StructField(DIFF, LongType(), False), StructField(VERSION, LongType(), False)]
        )

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts, plan = self._plan
        return _VersionReader(
            Store(opts.root, dict(opts.storage)),
            plan,
            opts.mode == "changes",
            opts.max_versions_per_trigger,
            opts.rewrite_rows_per_task,
        )


def _open(store: Store, version: int | None = None) -> DeltaTable:
    """The table (as of ``version``; None: the latest), or an ``InputError`` saying why not."""
    doing = f"read {'' if version is None else f'version {version} of '}the Delta table at {store.root}"
    with delta_errors(Where(target=store.root), doing, refused=InputError, not_found=InputError):
        return open_table(store.root, store.options, version=version)


def _schema_of(table: DeltaTable) -> StructType:
    # Files of such tables do not hold rows as their names say: refuse, never misread.
    check_features(table, Where(target=table.table_uri))
    return StructType.fromJson(json.loads(table.schema().to_json()))


def _plan(opts: SourceOptions) -> _Plan:
    """Where a new query starts and the stream's schema, from one load of the latest version
    (and one of the start's version, if earlier)."""
    store = Store(opts.root, dict(opts.storage))
    latest = _open(store)
    start = _start(opts, store, latest)
    if start.version >= int(latest.version()):
        return _Plan(start, _schema_of(latest), exact=True)
    try:
        at_start = _open(store, start.version)
    except InputError:
        # Log cleanup took the start's version (a query restarted long after it started
        # there): the latest version's schema stands in. A restart checks it against the
        # version its checkpoint stands at and each version read against its own metaData
        # (``_data_changes``); a new query, which has no such version, stops.
        return _Plan(start, _schema_of(latest), exact=False)
    return _Plan(start, _schema_of(at_start), exact=True)


def _start(opts: SourceOptions, store: Store, latest: DeltaTable) -> _Start:
    """Where a new query starts (the module doc); only a query without a checkpoint uses it."""
    version = int(latest.version())
    if opts.starting_snapshot is not None:
        at = version if opts.starting_snapshot == "latest" else opts.starting_snapshot
        if at > version:
            raise ConfigError(
                f"the {NAME} source's startingSnapshot {at} is past the latest version of "
                f"{opts.root} ({version})"
            )
        return _Start(at, snapshot=True)
    if opts.starting_version == "latest":
        return _Start(version + 1, snapshot=False)
    if opts.starting_version is not None:
        return _Start(opts.starting_version, snapshot=False)
    if _history_kept(store, latest.metadata().configuration):
        return _Start(0, snapshot=False)
    return _Start(version, snapshot=True)


def _history_kept(store: Store, configuration: Mapping[str, str | None]) -> bool:
    """Whether the log holds version 0 and its commit is younger than the table's
    ``delta.deletedFileRetentionDuration``: then no file any version removed can have been
    vacuumed (a vacuum within the retention keeps them), and the history from version 0 can be
    read. A vacuum told to ignore the retention may still have taken some: the stream then
    stops naming the file, and a snapshot start is the way on. One read of version 0's
    commit, whatever the table's size."""
    info = commit_info(store, 0)
    retention = table_retention_us(configuration)
    committed = None if info is None else info.get("timestamp")
    if retention is None or not isinstance(committed, int) or isinstance(committed, bool):
        return False  # no version 0, an unread retention or no commit time: nothing proven
    return (time.time() * 1000 - committed) * 1000 < retention


def _schema_at(store: Store, version: int) -> StructType | None:
    """The table's schema as of ``version``, or None where the log no longer holds it."""
    try:
        return _schema_of(_open(store, version))
    except InputError:
        return None


@dataclass(frozen=True)
class _File:
    path: str
    size: int
    partition_values: Mapping[str, str | None]
    rows: int | None = None
    """From the action's statistics, if it has them."""

    @property
    def data_file(self) -> DataFile:
        return DataFile(self.path, self.size, None, dict(self.partition_values))


@dataclass(frozen=True)
class _WholeFile(InputPartition):
    """Every row of one file a version added (or, in the change feed, removed)."""

    version: int
    file: _File
    diff: int


@dataclass(frozen=True)
class _Rewrite(InputPartition):
    """A version that adds and removes files in one partition: the exact change of the two
    sides, for the rows whose fingerprint falls in ``bucket`` of ``buckets`` (all: one)."""

    version: int
    added: tuple[_File, ...]
    removed: tuple[_File, ...]
    bucket: int = 0
    buckets: int = 1


def _refused_features(action: Mapping[str, Any]) -> list[str]:
    """Deletion vectors or column mapping, if a protocol or metadata action turns them on."""
    protocol = action.get("protocol") or {}
    features = {*(protocol.get("readerFeatures") or ()), *(protocol.get("writerFeatures") or ())}
    config = (action.get("metaData") or {}).get("configuration") or {}
    found = sorted(features & {"deletionVectors", "columnMapping"})
    properties = TableProperties.parse(config)
    if properties.deletion_vectors:
        found.append(DELETION_VECTORS)
    if properties.column_mapping != "none":
        found.append(COLUMN_MAPPING)
    return found


class _VersionReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads the versions (or the first batch's snapshot) an offset range covers."""

    def __init__(
        self,
        store: Store,
        plan: _Plan,
        changes: bool,
        limit: int | None,
        rewrite_rows_per_task: int = REWRITE_ROWS_PER_TASK,
    ) -> None:
        self.store = store
        self.plan = plan
        self.start = plan.start
        """Where a new query starts (a restarted one goes on from its checkpoint)."""
        self.table_schema = plan.schema
        """The stream's schema, fixed when the query was defined."""
        self.changes = changes
        self.limit = limit
        self.rewrite_rows_per_task = rewrite_rows_per_task
        self.seen: tuple[int, bytes] | None = None
        """The latest version ``_head`` saw and the digest of its commit file."""
        self.table_id = ""
        """The id of the table at the path (as of ``seen``): what every offset must name."""
        self._head()  # sets both
        self.until: int | None = None  # availableNow: the version latest when the run began
        self.resumed = False
        """Whether this run checked where its checkpoint stands (``_check_resumed``)."""

    def initialOffset(self) -> dict[str, Any]:
        # "from": where this query's first batch starts, carried in every offset so that the
        # checkpoint records it (a shared clock learns the first batch's start from it:
        # ``clock.batch_start``). Spark records no initial offset of a Python source.
        if self.start.snapshot:
            # The first batch is the table's state at the snapshot's version L, not its
            # changes: no retraction of a row removed before L, so it proves nothing before L
            # and starts there ("from" L; the module doc). "snapshot" marks this offset, which
            # Spark never records, as the start of such a query (``partitions``).
            at = self.start.version
            return {"version": -1, "from": at, "id": self.table_id, "snapshot": at}
        return {"version": self.start.version - 1, "from": self.start.version - 1, "id": self.table_id}

    def _head(self) -> tuple[int, str]:
        """The table's latest version and its id (and ``table_id`` set to it). Reads the log
        from the version last seen: its commit file, which must be the one seen (a table made
        again at the path has other commits), then the names of the commits after it. The
        whole table is loaded (every file's action: delta-rs 1.6 ignores ``without_files``)
        the first time and where that commit changed or went (a table made again, log
        cleanup)."""
        if self.seen is not None:
            version, digest = self.seen
            if _digest(self.store.get(_commit_path(version))) == digest:
                while self.store.sizes([_commit_path(version + 1)]):
                    version += 1
                if version != self.seen[0]:
                    self._see(version)
                return version, self.table_id
        table = _open(self.store)
        version = int(table.version())
        self.table_id = str(table.metadata().id)
        self._see(version)
        return version, self.table_id

    def _see(self, version: int) -> None:
        raw = self.store.get(_commit_path(version))
        self.seen = None if raw is None else (version, _digest(raw))

    def prepareForTriggerAvailableNow(self) -> None:
        self.until = self._head()[0]

    def getDefaultReadLimit(self) -> Any:
        # maxVersionsPerTrigger travels as the engine's file limit, counted in versions.
        if self.limit and ReadMaxFiles is not None:
            return ReadMaxFiles(self.limit)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        latest, table_id = self._head()
        if start is not None:
            self._same_table(start, table_id)
            if "snapshot" in start:  # a snapshot start's first batch: the snapshot, alone
                at = int(start["snapshot"])
                return {"version": at, "from": at, "id": table_id}
        if self.until is not None:
            latest = self.until
        cap = self.limit if limit is None else getattr(limit, "max_files", None)
        if start is not None:
            # Never below where the stream stands (a startingVersion past the latest version).
            latest = max(latest, int(start["version"]))
            if cap is not None and int(cap) >= 1:
                latest = min(latest, int(start["version"]) + int(cap))
        out: dict[str, Any] = {"version": latest}
        if start is not None and "from" in start:  # (a query started before "from" lacks it)
            out["from"] = int(start["from"])
        # (An offset of a checkpoint from before "id" was recorded lacks it: the id found now
        # is recorded from here on.)
        out["id"] = table_id
        return out

    def _same_table(self, offset: Mapping[str, Any], table_id: str) -> None:
        """Refuse to go on when ``offset`` was taken on another table than ``table_id``."""
        recorded = offset.get("id")
        if recorded is not None and str(recorded) != table_id:
            raise InputError(
                f"the Delta table at {self.store.root} is not the table this stream was reading: "
                f"its id (metaData.id) is {table_id}, the stream's offsets name {recorded}. The "
                "table was dropped and made again, or another table now lives at that path, so "
                "its versions are not the ones the stream read. Start a new query (a new "
                "checkpoint) to read it, or point this query back at the table it read"
            )

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        # Both offsets must name the table now at the path: a batch replayed after a restart
        # comes here without ``latestOffset`` (``table_id`` was read when the reader started).
        for offset in (start, end):
            self._same_table(offset, self.table_id)
        table_id = end.get("id", start.get("id"))
        first = int(start["version"]) + 1
        if start == self.initialOffset() and "from" in end:
            # A new query's first batch (or its replay after a restart): its recorded end says
            # what it covers, even where the start resolves otherwise now (startingVersion
            # 'latest'; the default start, which turns to a snapshot as version 0 ages): a
            # snapshot's end starts where it ends, a history's before its first version (an
            # empty first batch, which Spark runs too, ends where it starts).
            if int(end["from"]) == int(end["version"]) != int(start["version"]):
                return self._snapshot(int(end["version"]), table_id)
            first = int(end["from"]) + 1
        elif "snapshot" in start:
            return self._snapshot(int(end["version"]), table_id)
        self._check_resumed(start, first)
        out: list[InputPartition] = []
        for version in range(first, int(end["version"]) + 1):
            added, removed = self._data_changes(version, table_id)
            # Rows cancel only within a partition: each partition that both adds and removes
            # files is one task; the others are read file by file.
            sides: dict[str, tuple[list[_File], list[_File]]] = {}
            schema = arrow_schema(self.table_schema)
            for files, side in ((added, 0), (removed, 1)):
                for f in files:
                    sides.setdefault(_partition_key(f.partition_values, schema), ([], []))[side].append(f)
            for adds, removes in sides.values():
                if self.changes and adds and removes:
                    rows = _rows_in(adds, removes)
                    buckets = min(MAX_REWRITE_BUCKETS, max(1, -(-rows // self.rewrite_rows_per_task)))
                    out.extend(
                        _Rewrite(version, tuple(adds), tuple(removes), b, buckets) for b in range(buckets)
                    )
                else:
                    out.extend(_WholeFile(version, f, +1) for f in adds)
                    out.extend(_WholeFile(version, f, -1) for f in removes)
        return out

    def _read_nothing(self, start: Mapping[str, Any], first: int) -> bool:
        """Whether a batch from ``start`` is its query's first to read a version: the query's
        initial offset (or the end of an empty first batch, which equals it). A snapshot's end
        ``{"version": L, "from": L}`` is not: the query read the table at L."""
        if first == 0:
            return True
        return (
            not self.start.snapshot
            and "from" in start
            and int(start["from"]) == int(start["version"]) == self.start.version - 1
        )

    def _check_resumed(self, start: Mapping[str, Any], first: int) -> None:
        """Once per run, before its first batch of versions: where the query already read
        some, the table's schema at the version its checkpoint stands at (``first - 1``) must
        be the stream's. It is not where the query is restarted with options that start it
        elsewhere, or where a run read across a schema change; it cannot be told where log
        cleanup took that version. A query that read nothing yet needs its schema read at its
        start (``_Plan.exact``)."""
        if self.resumed:
            return
        self.resumed = True
        if self._read_nothing(start, first):
            if not self.plan.exact:
                raise InputError(
                    f"version {self.start.version} of the Delta table at {self.store.root}, where "
                    "this query starts, can no longer be read (log cleanup took it), so the "
                    f"stream's schema cannot be told: {_NEW_QUERY}"
                )
            return
        held = _schema_at(self.store, first - 1)
        if held is None:
            raise InputError(
                f"the schema of the Delta table at {self.store.root} at version {first - 1}, where "
                "this query's checkpoint stands, can no longer be read (log cleanup took that "
                "version), so whether the stream's schema is the one the query read under cannot "
                f"be told: {_NEW_QUERY}"
            )
        if held != self.table_schema:
            raise InputError(
                f"the schema of the Delta table at {self.store.root} at version {first - 1}, where "
                "this query's checkpoint stands, is not the stream's schema (the table's where "
                "the query's options start it): the versions after it would be read under "
                "another schema than the one the query read under. Start a new query (a new "
                f"checkpoint) with startingVersion={first} to read on under the table's schema there"
            )

    def _snapshot(self, version: int, table_id: Any) -> list[InputPartition]:
        """The table as of ``version``: one partition per file, every row an insert."""
        try:
            table = _open(self.store, version)
        except InputError as exc:
            raise InputError(
                f"version {version} of the Delta table at {self.store.root}, where this query "
                f"starts, can no longer be read ({exc}): {_NEW_QUERY}"
            ) from exc
        if table_id is not None:
            self._same_table({"id": table_id}, str(table.metadata().id))
        if _schema_of(table) != self.table_schema:
            raise InputError(
                f"the schema of the Delta table at {self.store.root} at version {version} is not "
                f"the stream's: {_NEW_QUERY}"
            )
        files = pa.table(table.get_add_actions(flatten=False)).to_pylist()
        return [
            _WholeFile(
                version,
                _File(
                    f["path"],
                    int(f["size_bytes"]),
                    {k: partition_string(v) for k, v in (f.get("partition") or {}).items()},
                    f.get("num_records"),
                ),
                +1,
            )
            for f in files
        ]

    def _data_changes(self, version: int, table_id: Any = None) -> tuple[list[_File], list[_File]]:
        """The files ``version`` adds and removes with a data change, in log order."""
        actions = log_actions(self.store, version)
        if actions is None:
            raise InputError(
                f"Delta version {version} of {self.store.root} is no longer in the log (log "
                f"retention passed it): the stream cannot continue from there; {_NEW_QUERY}"
            )
        added: list[_File] = []
        removed: list[_File] = []
        for action in actions:
            meta = action.get("metaData")
            if meta and table_id is not None and meta.get("id") not in (None, table_id):
                self._same_table({"id": table_id}, str(meta["id"]))
            if meta and StructType.fromJson(json.loads(meta["schemaString"])) != self.table_schema:
                # Every version the stream reads is read under the schema it started with:
                # stopping here keeps that its own schema.
                raise InputError(
                    f"Delta version {version} of {self.store.root} changes the table's schema: the "
                    "stream reads the schema the table had where the query started and stops at "
                    "a version that changes it. To read on, start a new query (a new checkpoint) "
                    f"with startingVersion={version} (or startingSnapshot={version}: the table as "
                    "of that version, then its changes)"
                )
            if _refused_features(action):
                # A table that turns on deletion vectors or column mapping mid-stream: its files
                # would no longer hold rows as their names say.
                raise InputError(
                    f"Delta version {version} of {self.store.root} turns on "
                    f"{', '.join(_refused_features(action))}: the mvsink-delta source reads tables "
                    "whose files hold rows as written only"
                )
            for kind, into in (("add", added), ("remove", removed)):
                act = action.get(kind)
                if act and act.get("deletionVector"):
                    raise InputError(
                        f"Delta version {version} of {self.store.root} uses a deletion vector "
                        f"({act['path']}): the mvsink-delta source reads whole files only"
                    )
                if act and act.get("dataChange", True):
                    into.append(
                        _File(
                            act["path"],
                            int(act.get("size") or 0),
                            act.get("partitionValues") or {},
                            _num_records(act.get("stats")),
                        )
                    )
        if removed and not self.changes:
            raise InputError(
                f"Delta version {version} of {self.store.root} removes rows ({removed[0].path}): "
                "the mvsink-delta source reads appends only (option mode='changes' reads the "
                "exact inserts and retractions)"
            )
        return added, removed

    def _rows(self, file: _File, version: int) -> pa.Table:
        schema = arrow_schema(self.table_schema)
        try:
            return self.store.read(file.data_file, schema, list(file.partition_values))
        except FileNotFoundError:
            raise InputError(
                f"file {file.path}, which Delta version {version} of {self.store.root} adds or "
                f"removes, no longer exists (vacuumed): the stream cannot be read from there; {_NEW_QUERY}"
            ) from None

    def _out(self, rows: pa.Table, version: int, diff: int) -> Iterator[pa.RecordBatch]:
        if self.changes:
            n = rows.num_rows
            rows = rows.append_column(
                pa.field(DIFF, pa.int64(), nullable=False), pa.array(np.full(n, diff, dtype=np.int64))
            )
            rows = rows.append_column(
                pa.field(VERSION, pa.int64(), nullable=False), pa.array(np.full(n, version, dtype=np.int64))
            )
        yield from rows.to_batches()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, _WholeFile):
            yield from self._out(
                self._rows(partition.file, partition.version), partition.version, partition.diff
            )
            return
        assert isinstance(partition, _Rewrite)
        # Two passes: the fingerprints of both sides decide which rows carry the change, then
        # each file is read again and only those rows leave (memory: fingerprints, not rows).
        # In a bucket, each file keeps the fingerprints of its rows in the bucket only (equal
        # rows have equal fingerprints, so they cancel within one bucket), with their places.
        sides: list[list[tuple[I64, I64, I64 | None, int]]] = [[], []]
        for held, files in zip(sides, (partition.added, partition.removed), strict=True):
            for f in files:
                a, b = fingerprints(self._rows(f, partition.version))
                n, at = len(a), None
                if partition.buckets > 1:
                    at = np.flatnonzero(a.view(np.uint64) % np.uint64(partition.buckets) == partition.bucket)
                    a, b = a[at], b[at]
                held.append((a, b, at, n))
        picked = exact_change(*([(a, b) for a, b, _, _ in held] for held in sides))
        inserts, retracts = (
            [_spread(mask, at, n) for mask, (_, _, at, n) in zip(masks, held, strict=True)]
            for masks, held in zip(picked, sides, strict=True)
        )
        for side, masks, diff in ((partition.added, inserts, +1), (partition.removed, retracts, -1)):
            for file, mask in zip(side, masks, strict=True):
                if mask.any():
                    yield from self._out(
                        self._rows(file, partition.version).filter(pa.array(mask)), partition.version, diff
                    )

    def commit(self, end: dict[str, int]) -> None:
        pass


def _commit_path(version: int) -> str:
    return f"_delta_log/{version:020}.json"


def _digest(raw: pa.Buffer | None) -> bytes:
    return b"" if raw is None else hashlib.sha256(raw.to_pybytes()).digest()


def _partition_key(values: Mapping[str, str | None], schema: pa.Schema) -> str:
    """A file's partition, the same however a writer spelled its values (a timestamp with or
    without its zone, a number with or without padding): each value typed, then printed as
    mvsink prints it; one that does not parse as its type, as it is."""

    def typed(name: str, value: str | None) -> str | None:
        if name not in schema.names:
            return value
        try:
            return partition_string(partition_array(value, schema.field(name).type, 1)[0].as_py())
        except (ValueError, TypeError, pa.ArrowException):
            return value

    return json.dumps({name: typed(name, value) for name, value in values.items()}, sort_keys=True)


def _rows_in(adds: Sequence[_File], removes: Sequence[_File]) -> int:
    """About how many rows the files hold: counted where the log has statistics (adds, mostly),
    else by their bytes at the rows per byte of the counted files (removes seldom carry
    statistics), else a row per 8 bytes."""
    files = (*adds, *removes)
    counted = [f for f in files if f.rows is not None and f.size]
    per_byte = sum(f.rows or 0 for f in counted) / sum(f.size for f in counted) if counted else 1 / 8
    return sum(f.rows if f.rows is not None else int(f.size * per_byte) + 1 for f in files)


def _num_records(stats: Any) -> int | None:
    """``numRecords`` of an action's statistics (a JSON string), if present."""
    try:
        value = json.loads(stats)["numRecords"] if stats else None
    except (ValueError, KeyError, TypeError):
        return None
    return int(value) if isinstance(value, int) else None


def _spread(mask: Mask, at: I64 | None, n: int) -> Mask:
    """A bucket's mask over a whole file of ``n`` rows (``at``: the bucket's rows' places)."""
    if at is None:
        return mask
    whole = np.zeros(n, dtype=bool)
    whole[at[mask]] = True
    return whole
