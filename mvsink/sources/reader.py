"""``mvsink-delta``: a Delta table as a Spark stream, version by version.

A Spark 4 Python data source (no connector jar): register it, then read a Delta table (on
local disk or an object store) as a stream whose offset is the Delta version::

    from mvsink.sources.reader import register
    register(spark)
    stream = (spark.readStream.format("mvsink-delta")
              .option("path", "s3://bucket/bronze/orders")
              .option("AWS_REGION", "eu-west-1")          # any other option: storage_options
              .load())

Each micro-batch reads the versions after the last one it read, up to the latest (at most
``maxVersionsPerTrigger`` of them when given), from ``startingVersion`` (default 0) on. The
offset, ``{"version": v, "from": s}``, orders batches by ``v``, the same for every query
reading the table, which is what replicas need to share a clock; ``s`` is the version before
the query's first (``startingVersion - 1``), so its checkpoint says where its first batch
started. Versions are read from the commit files of the Delta log
through the sink's I/O layer (``storage.Store``). Two modes (option ``mode``):

- ``"appends"`` (default): the rows of the files each version *adds with a data change*. A
  version that only rearranges rows (a compaction, ``dataChange = false``) adds nothing; a
  version that deletes or rewrites rows is not a pure append and is refused, since its removed
  rows cannot be told apart from rows that stay. One input partition per added file.
- ``"changes"``: the exact change feed of a table such as a view mvsink keeps. Each version
  yields the rows it inserted (``diff = +1``) and retracted (``diff = -1``), one row per unit,
  with its ``_commit_version``: the multiset difference of the rows of the files it adds and
  removes (``changes.py``), so the untouched rows of a rewritten file do not show up. Summed
  over versions from 0 the feed is the table; a compaction yields nothing. A version that only
  adds (or only removes) files is read one task per file; in a partition where it does both,
  the rows cancel by fingerprint: one task reads that partition's files and holds the
  fingerprints of the rows they hold (about 40 bytes a row), or, above ``rewriteRowsPerTask``
  rows (default 20M, from the log's row counts), the fingerprints are split into up to
  ``MAX_REWRITE_BUCKETS`` buckets, one task each: equal rows share a bucket, so each task
  cancels exactly and holds a share of the fingerprints, but reads every file of the
  partition (memory divided, reads multiplied by the bucket count).

Either mode refuses a version that changes the table's schema (start a new query from there)
and tables whose files do not hold rows as their names say (deletion vectors, column mapping).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable
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
from mvsink.table.delta import DataFile, check_features, log_actions, table_root
from mvsink.table.fingerprint import I64, fingerprints
from mvsink.table.schema import arrow_schema
from mvsink.table.storage import Store

NAME = "mvsink-delta"
MODES = ("appends", "changes")
DIFF = "diff"
VERSION = "_commit_version"
_OWN = {"path", "maxversionspertrigger", "startingversion", "mode", "rewriterowspertask"}
REWRITE_ROWS_PER_TASK = 20_000_000
"""Rows whose fingerprints one task of the change feed holds, if it can (``_Rewrite``)."""
MAX_REWRITE_BUCKETS = 16
"""At most this many tasks split one rewrite: each reads every file of it."""


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


class DeltaVersions(DataSource):
    """The ``mvsink-delta`` source (see the module doc)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def _settings(self) -> tuple[str, dict[str, str], str]:
        path = self.options.get("path")
        if not path:
            raise InputError("the mvsink-delta source needs option 'path' (the Delta table)")
        mode = str(self.options.get("mode") or "appends").lower()
        if mode not in MODES:
            raise InputError(f"the mvsink-delta source's option 'mode' is one of {MODES}, not {mode!r}")
        storage = {k: str(v) for k, v in self.options.items() if k.lower() not in _OWN}
        return table_root(str(path)), storage, mode

    def _table_schema(self) -> StructType:
        root, storage, _ = self._settings()
        table = DeltaTable(root, storage_options=storage or None)
        # Files of such tables do not hold rows as their names say: refuse, never misread.
        check_features(table, Where(target=root))
        return StructType.fromJson(json.loads(table.schema().to_json()))

    def schema(self) -> StructType:
        table = self._table_schema()
        if self._settings()[2] == "appends":
            return table
        taken = {f.name.lower() for f in table.fields} & {DIFF, VERSION.lower()}
        if taken:
            raise InputError(
                f"the table at {self._settings()[0]} has column(s) {sorted(taken)}, which the "
                f"change feed adds ({DIFF!r}, {VERSION!r}): rename them in the view"
            )
        return StructType(
            [*table.fields, StructField(DIFF, LongType(), False), StructField(VERSION, LongType(), False)]
        )

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        root, storage, mode = self._settings()
        limit = self.options.get("maxVersionsPerTrigger")
        start = self.options.get("startingVersion")
        per_task = self.options.get("rewriteRowsPerTask")
        if per_task is not None and (not str(per_task).isdigit() or int(per_task) < 1):
            raise InputError(f"option 'rewriteRowsPerTask' is a positive number of rows, not {per_task!r}")
        return _VersionReader(
            Store(root, storage),
            self._table_schema(),
            mode == "changes",
            int(limit) if limit else None,
            int(start) if start else 0,
            int(per_task) if per_task else REWRITE_ROWS_PER_TASK,
        )


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
    if str(config.get("delta.enableDeletionVectors", "false")).lower() == "true":
        found.append("delta.enableDeletionVectors")
    if str(config.get("delta.columnMapping.mode", "none")).lower() != "none":
        found.append("delta.columnMapping.mode")
    return found


class _VersionReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(
        self,
        store: Store,
        table_schema: StructType,
        changes: bool,
        limit: int | None,
        start: int,
        rewrite_rows_per_task: int = REWRITE_ROWS_PER_TASK,
    ) -> None:
        self.store = store
        self.rewrite_rows_per_task = rewrite_rows_per_task
        self.table_schema = table_schema
        self.changes = changes
        self.limit = limit
        self.start = start
        self.until: int | None = None  # availableNow: the version latest when the run began

    def initialOffset(self) -> dict[str, int]:
        # "from": where this query's first batch starts, carried in every offset so that the
        # checkpoint records it (a shared clock learns the first batch's start from it:
        # ``clock.batch_start``). Spark records no initial offset of a Python source.
        return {"version": self.start - 1, "from": self.start - 1}

    def _latest(self) -> int:
        table = DeltaTable(self.store.root, storage_options=dict(self.store.options) or None)
        return int(table.version())

    def prepareForTriggerAvailableNow(self) -> None:
        self.until = self._latest()

    def getDefaultReadLimit(self) -> Any:
        # maxVersionsPerTrigger travels as the engine's file limit, counted in versions.
        if self.limit and ReadMaxFiles is not None:
            return ReadMaxFiles(self.limit)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None) -> dict[str, int]:
        latest = self._latest() if self.until is None else self.until
        cap = self.limit if limit is None else getattr(limit, "max_files", None)
        if start is not None:
            # Never below where the stream stands (a startingVersion past the latest version).
            latest = max(latest, int(start["version"]))
            if cap:
                latest = min(latest, int(start["version"]) + int(cap))
        if start is not None and "from" in start:  # (a query started before "from" lacks it)
            return {"version": latest, "from": int(start["from"])}
        return {"version": latest}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        out: list[InputPartition] = []
        for version in range(int(start["version"]) + 1, int(end["version"]) + 1):
            added, removed = self._data_changes(version)
            # Rows cancel only within a partition: each partition that both adds and removes
            # files is one task; the others are read file by file.
            sides: dict[str, tuple[list[_File], list[_File]]] = {}
            for files, side in ((added, 0), (removed, 1)):
                for f in files:
                    sides.setdefault(json.dumps(dict(f.partition_values), sort_keys=True), ([], []))[
                        side
                    ].append(f)
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

    def _data_changes(self, version: int) -> tuple[list[_File], list[_File]]:
        """The files ``version`` adds and removes with a data change, in log order."""
        actions = log_actions(self.store, version)
        if actions is None:
            raise InputError(
                f"Delta version {version} of {self.store.root} is no longer in the log (log "
                "retention passed it): the stream cannot continue from there; start a new query "
                "with a later startingVersion"
            )
        added: list[_File] = []
        removed: list[_File] = []
        for action in actions:
            meta = action.get("metaData")
            if meta and StructType.fromJson(json.loads(meta["schemaString"])) != self.table_schema:
                raise InputError(
                    f"Delta version {version} of {self.store.root} changes the table's schema: the "
                    "stream keeps the schema it started with; start a new query (a new checkpoint) "
                    "from this version to read the new one"
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
                "removes, no longer exists (vacuumed): the stream cannot be read from there; "
                "start a new query with a later startingVersion"
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
