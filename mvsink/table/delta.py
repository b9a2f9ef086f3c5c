"""The Delta shim: the only module that speaks the Delta log (``storage.py`` borrows delta-rs's
object store for bytes).

It speaks mvsink's verbs: load a snapshot (version, frontier, files, schema), create a table,
and commit a set of added and removed files together with the frontier as one strict
compare-and-append. Every delta-rs error is mapped to an mvsink error here.
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import json
import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, Field, Schema, write_deltalake
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.transaction import (
    AddAction,
    CommitProperties,
    PostCommitHookProperties,
    RemoveAction,
    Transaction,
    create_table_with_add_actions,
)

from mvsink import failpoints
from mvsink.errors import (
    CommitOutcomeUnknownError,
    ConfigError,
    ConflictError,
    InvariantViolation,
    MVSinkError,
    StorageError,
    UnsupportedTableError,
    Where,
    first_line,
)
from mvsink.table import record
from mvsink.table.log import LogFiles, commit_attempt
from mvsink.table.uris import is_local, table_root

log = logging.getLogger(__name__)

"""Commit metadata key holding the unique id of the attempt that made the commit."""
# delta-rs runs checkpointing and log cleanup after writing the commit file and reports their
# failure as the commit's: we turn them off and run them ourselves, best-effort.
_NO_HOOKS = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
_DEFAULT_CHECKPOINT_INTERVAL = 100

# Table features whose data mvsink would misread or corrupt with plain file rewrites.
_REFUSED_FEATURES = {
    "deletionVectors": "deletion vectors",
    "columnMapping": "column mapping",
    # UniForm: data files must also hold the partition columns, and nested field ids.
    "icebergCompatV1": "Iceberg compatibility (UniForm)",
    "icebergCompatV2": "Iceberg compatibility (UniForm)",
}
# ... of which the sink keeps these through the session's JVM Delta (``load_snapshot``).
_KEPT_THROUGH_THE_JVM = frozenset({"deletion vectors", "column mapping"})


CHANGE_FEED = "delta.enableChangeDataFeed"
DELETION_VECTORS = "delta.enableDeletionVectors"
COLUMN_MAPPING = "delta.columnMapping.mode"


def unique_id(descriptor: Mapping[str, Any] | None) -> str | None:
    """The descriptor's ``uniqueId`` (PROTOCOL.md): with the path, what tells two versions of a
    data file apart."""
    if not descriptor:
        return None
    base = f"{descriptor['storageType']}{descriptor['pathOrInlineDv']}"
    offset = descriptor.get("offset")
    return base if offset is None else f"{base}@{offset}"


@dataclass(frozen=True)
class DataFile:
    """A data file of a snapshot, as the Delta log lists it."""

    path: str
    """The path as the log lists it (percent-encoded, relative to the table root)."""
    size: int
    num_records: int | None
    partition_values: Mapping[str, str | None] = field(default_factory=dict)
    """Partition values as the log stores them (strings; None for null)."""
    deletion_vector: Mapping[str, Any] | None = None
    """The file's deletion vector (its descriptor, as the log holds it): rows of the file that
    this version does not hold. ``num_records`` counts only the rows it holds."""

    @property
    def key(self) -> str:
        """The path as it lies on storage relative to the root (decoded): what the store reads
        and a ``RemoveAction`` wants."""
        return unquote(self.path)

    @property
    def identity(self) -> str:
        """What tells this file's rows apart from any other's: its ``key``, and the id of its
        deletion vector (a file keeps its path when a deletion vector drops some of its rows).
        The index's key."""
        dv = unique_id(self.deletion_vector)
        return self.key if dv is None else f"{self.key}#{dv}"

    @property
    def deleted(self) -> int:
        """Rows of the Parquet file its deletion vector drops."""
        return 0 if not self.deletion_vector else int(self.deletion_vector["cardinality"])


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
    configuration: Mapping[str, str] = field(default_factory=dict)
    """The table's properties (``delta.*`` settings, CHECK constraints, ...)."""
    features: frozenset[str] = frozenset()
    """Reader and writer table features the protocol names."""
    storage_options: Mapping[str, str] = field(default_factory=dict)
    """The options the table was opened with (and commits use)."""
    table_id: str | None = None
    """The table's id (its metadata's): a table made again at the same path has another."""
    rows_known: bool = True
    """False when the table has deletion vectors that no session's Delta could list (delta-rs
    does not): its files' rows cannot be read exactly (``require_rows``)."""
    stats: pa.Table | None = field(default=None, repr=False, compare=False)
    """The files' statistics, row-aligned with ``files``: columns ``min.<col>`` and
    ``max.<col>`` (typed; null where unknown), as the writers of the files recorded them."""
    _table: Any = field(default=None, repr=False, compare=False)
    _jvm: Any = field(default=None, repr=False, compare=False)
    """The session's JVM Delta when it commits to this table (``jvm_delta``), else None."""
    _txns: dict[str, int | None] = field(default_factory=dict, repr=False, compare=False)
    """App transactions read so far: delta-rs reads the log for each (5-15 ms a call on a
    table 60 versions past its checkpoint), and an epoch asks for a dozen."""

    @property
    def deletion_vectors(self) -> bool:
        """Whether retractions are written as deletion vectors (the table turns them on, and the
        session's JVM Delta commits): a file keeps its bytes, a vector marks its dropped rows."""
        enabled = str(self.configuration.get(DELETION_VECTORS) or "false").lower() == "true"
        return enabled and self._jvm is not None

    @property
    def change_feed(self) -> bool:
        """Whether the table has Change Data Feed on: each commit that rewrites files must then
        carry its retracted and inserted rows as change files (``cdc`` actions)."""
        return change_feed(self.configuration)

    @property
    def engine(self) -> str:
        """What commits to this table: ``delta-rs`` or ``delta-spark``."""
        return "delta-rs" if self._jvm is None else "delta-spark"

    def bounds(self, column: str) -> tuple[pa.Array, pa.Array] | None:
        """The recorded (min, max) of top-level ``column`` per file, or None if no file has any.

        Bounds are what writers recorded, which may be truncated (timestamps to milliseconds,
        strings to a prefix): widen them before pruning on them.
        """
        lo, hi = f"min.{column}", f"max.{column}"
        if self.stats is None or lo not in self.stats.column_names or hi not in self.stats.column_names:
            return None
        return self.stats.column(lo).combine_chunks(), self.stats.column(hi).combine_chunks()

    @property
    def exists(self) -> bool:
        return self.version is not None

    def require_rows(self, where: Where) -> None:
        """Refuse to read rows of a table whose deletion vectors are unknown (``rows_known``)."""
        if not self.rows_known:
            raise UnsupportedTableError(
                "the table has deletion vectors, which mvsink reads through the session's JVM Delta: "
                "run with delta-spark in a classic Spark session",
                where,
            )

    def transaction(self, app_id: str) -> int | None:
        """The version the app transaction ``app_id`` records in this snapshot, or None."""
        if self._table is None:
            return None
        if app_id not in self._txns:
            found = self._table.transaction_version(app_id)
            self._txns[app_id] = None if found is None else int(found)
        return self._txns[app_id]


def load_snapshot(
    target: str,
    app_id: str,
    storage_options: Mapping[str, str],
    where: Where,
    *,
    writing: bool = True,
    engine: str = "auto",
    spark: Any = None,
) -> Snapshot:
    """Load the latest snapshot of ``target`` and refuse table features mvsink cannot keep.

    With ``writing``, also choose what commits to it (``engine``: ``auto``, ``delta-rs`` or
    ``delta-spark``, the JVM Delta of ``spark`` or of the active session) and refuse a table
    that none of them can write."""
    from mvsink.table.catalog import is_path

    if not is_path(target):
        raise ConfigError(
            f"{target!r} is a table name: here give the table's path or URI (only the sink resolves "
            f"names, through its Spark session), or './{target}' for a folder of that name",
            where,
        )
    root = table_root(target)
    try:
        dt = DeltaTable(root, storage_options=dict(storage_options) or None)
    except TableNotFoundError:
        if writing and engine == "delta-spark":  # a new table is made by delta-rs, but say now
            _engine(
                root, None, frozenset(), engine, spark, where
            )  # if the engine asked for cannot commit later
        return Snapshot(root, None, None, None, (), (), storage_options=dict(storage_options))
    except DeltaError as exc:
        raise UnsupportedTableError(f"cannot open the Delta table: {exc}", where) from exc
    except OSError as exc:  # the object store: endpoint, credentials, bucket
        raise StorageError(
            f"cannot read the Delta log at {root}: {first_line(exc)}",
            where,
        ) from exc
    features = _check_features(dt, where, allowed=_KEPT_THROUGH_THE_JVM)
    meta = dt.metadata()
    _check_transaction_retention(meta.configuration, where)
    jvm = _engine(root, dt, features, engine, spark, where) if writing else None
    vectors: Mapping[str, Mapping[str, Any]] | None = {}
    listed = None
    if "deletionVectors" in features:
        # delta-rs lists the files but not their deletion vectors: the session's Delta does.
        if jvm is None:
            jvm = _reader(spark)
        vectors = None  # unknown without the session's Delta (``Snapshot.rows_known``)
        if jvm is not None:
            vectors, *totals = jvm.deletion_vectors(root, dt.version())
            listed = tuple(totals)
    actions = pa.table(dt.get_add_actions(flatten=True))
    part_cols = [c for c in actions.column_names if c.startswith("partition.")]
    heads = actions.select(["path", "size_bytes", "num_records", *part_cols]).to_pylist()
    files = tuple(
        _data_file(row, part_cols, None if vectors is None else vectors.get(row["path"]), where)
        for row in heads
    )
    mine = (len(files), sum(f.size for f in files))
    if listed is not None and (
        len(vectors or {}) != sum(1 for f in files if f.deletion_vector) or listed != mine
    ):
        raise InvariantViolation(
            f"the session's Delta and delta-rs list different files at version {dt.version()} "
            f"(files and bytes: {listed} and {mine}, {len(vectors or {})} deletion vectors)",
            where,
        )
    stats = _logical_stats(
        actions.select([c for c in actions.column_names if c.startswith(("min.", "max."))]),
        dt.schema().to_json(),
    )
    return Snapshot(
        root=root,
        version=dt.version(),
        frontier=dt.transaction_version(app_id),
        schema_json=dt.schema().to_json(),
        partition_by=tuple(meta.partition_columns),
        files=files,
        configuration={k: v for k, v in meta.configuration.items() if v is not None},
        features=features,
        storage_options=dict(storage_options),
        table_id=str(meta.id),
        stats=stats,
        rows_known=vectors is not None,
        _table=dt,
        _jvm=jvm if writing else None,
    )


def _logical_stats(stats: pa.Table, schema_json: str) -> pa.Table:
    """Statistics columns (``min.<column>``, ``max.<column>``) named by the table's columns:
    the log keys them by physical names (column mapping), which delta-rs passes through, and a
    table may reuse a name another column has in its files (a rename, then an add)."""
    logical = {physical: name for name, physical in physical_names(schema_json).items()}
    if not logical:
        return stats
    names = []
    for column in stats.column_names:
        prefix, _, rest = column.partition(".")
        head, dot, tail = rest.partition(".")
        # A column without a physical name has no statistics the log could key by its name.
        names.append(f"{prefix}.{logical[head]}{dot}{tail}" if head in logical else f"{prefix}.~{rest}")
    return stats.rename_columns(names)


def _data_file(
    row: Mapping[str, Any], part_cols: Sequence[str], vector: Mapping[str, Any] | None, where: Where
) -> DataFile:
    """A snapshot's file from its row of delta-rs's add actions and its deletion vector."""
    records = row["num_records"]
    if vector is not None:
        if records is None:
            raise UnsupportedTableError(
                f"{row['path']} has a deletion vector but no row count in its statistics", where
            )
        records -= int(vector["cardinality"])
    return DataFile(
        path=row["path"],
        size=int(row["size_bytes"]),
        num_records=records,
        partition_values={c.removeprefix("partition."): partition_string(row[c]) for c in part_cols},
        deletion_vector=vector,
    )


def _reader(spark: Any) -> Any:
    """The JVM Delta of ``spark`` or the active session, for reading, or None."""
    from mvsink.errors import EngineUnavailable
    from mvsink.table.jvm_delta import JvmDelta

    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    try:
        return None if spark is None else JvmDelta(spark)
    except EngineUnavailable:
        return None


def change_feed(configuration: Mapping[str, str | None]) -> bool:
    """Whether a table's properties turn Change Data Feed on."""
    return str(configuration.get(CHANGE_FEED) or "false").lower() == "true"


def partition_string(value: Any) -> str | None:
    """A typed partition value as the Delta log stores it: a ``timestamp`` (an aware
    datetime) in UTC with its zone, ``yyyy-mm-ddThh:mm:ss.ffffffZ``; a ``timestamp_ntz`` (a
    naive one) as its wall clock, ``yyyy-mm-dd hh:mm:ss.ffffff``; decimals exact.

    A ``timestamp`` value without an offset is one that Spark's Delta resolves in the reading
    session's time zone (delta-io/delta#3398): a reader outside UTC would see it shifted and
    prune the wrong partitions. The ``Z`` form is the one the protocol recommends and Delta
    and delta-kernel write. mvsink wrote the offset-less form (in UTC) before; readers of the
    log (``storage.partition_array``, delta-rs) take both."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            return str(value.isoformat(sep=" ", timespec="microseconds"))
        utc = value.astimezone(datetime.UTC).replace(tzinfo=None)
        return f"{utc.isoformat(sep='T', timespec='microseconds')}Z"
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="surrogateescape")
    return str(value)


def check_features(dt: DeltaTable, where: Where) -> frozenset[str]:
    """Refuse tables whose files mvsink would misread (deletion vectors, column mapping)."""
    return _check_features(dt, where)


def _check_features(dt: DeltaTable, where: Where, allowed: frozenset[str] = frozenset()) -> frozenset[str]:
    proto = dt.protocol()
    features = set(proto.reader_features or ()) | set(proto.writer_features or ())
    config = dt.metadata().configuration
    refused = [label for name, label in _REFUSED_FEATURES.items() if name in features]
    if (config.get(DELETION_VECTORS) or "false").lower() == "true":
        refused.append("deletion vectors")
    if (config.get(COLUMN_MAPPING) or "none").lower() != "none":
        refused.append("column mapping")
    refused = [label for label in refused if label not in allowed]
    if refused:
        names = ", ".join(sorted(set(refused)))
        raise UnsupportedTableError(
            f"the target uses {names}; mvsink rewrites whole files and cannot keep such a table "
            "exact. Point the view at a table without these features.",
            where,
        )
    return frozenset(features)


_writable: dict[str, str | None] = {}
"""Per protocol and configuration: None if the installed delta-rs commits to such a table, else
its refusal (``_delta_rs_refusal``)."""


def _delta_rs_refusal(dt: DeltaTable, where: Where) -> str | None:
    """None if the installed delta-rs commits to a table like ``dt``, else its refusal.

    delta-rs decides which table features it writes when it is compiled and tells only when a
    commit is refused, after the files were staged. So the question is asked of it directly:
    once per protocol and configuration, an empty commit to a scratch table on local disk with
    the target's protocol and metadata (never the target). Its refusal names the features."""
    proto = dt.protocol()
    meta = dt.metadata()
    protocol: dict[str, Any] = {
        "minReaderVersion": proto.min_reader_version,
        "minWriterVersion": proto.min_writer_version,
    }
    if proto.reader_features is not None:
        protocol["readerFeatures"] = sorted(proto.reader_features)
    if proto.writer_features is not None:
        protocol["writerFeatures"] = sorted(proto.writer_features)
    configuration = {k: v for k, v in meta.configuration.items() if v is not None}
    key = json.dumps([protocol, configuration], sort_keys=True)
    if key not in _writable:
        refusal = _probe_commit(protocol, configuration, dt.schema().to_json(), list(meta.partition_columns))
        if refusal is not None and "unsupported" not in refusal.lower():
            # Not delta-rs refusing the table (a full /tmp, say): unknown, asked again next time.
            log.warning("%s: could not ask delta-rs whether it writes this table: %s", where, refusal)
            return None
        _writable[key] = refusal
    return _writable[key]


def delta_rs_refusal(target: str, storage_options: Mapping[str, str]) -> str | None:
    """Why the installed delta-rs cannot commit to the table at ``target``, or None (also for
    no table, or one it cannot open: loading the snapshot says what is wrong then)."""
    try:
        dt = DeltaTable(table_root(target), storage_options=dict(storage_options) or None)
    except Exception:
        return None
    return _delta_rs_refusal(dt, Where(None, target))


def _engine(
    root: str, dt: DeltaTable | None, features: frozenset[str], engine: str, spark: Any, where: Where
) -> Any:
    """The JVM Delta that commits to ``dt`` (``jvm_delta.JvmDelta``), or None for delta-rs.

    ``auto`` takes delta-rs when it writes the table, else the session's JVM Delta; a table
    neither can write is refused here, before anything is staged."""
    from mvsink.errors import EngineUnavailable
    from mvsink.table.jvm_delta import JvmDelta

    refusal = None if engine == "delta-spark" or dt is None else _delta_rs_refusal(dt, where)
    mode = "none" if dt is None else (dt.metadata().configuration.get(COLUMN_MAPPING) or "none").lower()
    if refusal is None and ("columnMapping" in features or mode != "none"):
        refusal = (
            "the table maps column names (column mapping), which mvsink writes through the session's "
            "Delta only"
        )
    if refusal is None and "deletionVectors" in features:
        refusal = (
            "the table has deletion vectors, which mvsink reads and writes through the session's "
            "Delta only (delta-rs does not list them)"
        )
    if refusal is None and dt is not None and change_feed(dt.metadata().configuration):
        refusal = (
            f"the table has Change Data Feed on ({CHANGE_FEED}) and mvsink's commits through delta-rs "
            "carry no change files, so the feed would report every row of each rewritten file"
        )
    if engine == "delta-rs" or (engine == "auto" and refusal is None):
        if refusal is None:
            return None
        import deltalake

        raise UnsupportedTableError(
            f"the installed deltalake {deltalake.__version__} cannot commit to the target ({refusal}); "
            "nothing was staged. Use engine='delta-spark' (the session's JVM Delta) or 'auto', point "
            "the view at a table without these features, or upgrade deltalake.",
            where,
        )
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    why = f"the installed deltalake cannot commit to the target ({refusal}), and " if refusal else ""
    if spark is None:
        raise UnsupportedTableError(
            f"{why}the delta-spark engine needs a Spark session with Delta; nothing was staged", where
        )
    try:
        jvm = JvmDelta(spark)
        jvm.check_store(root)
        if dt is not None:
            jvm.check_table(root, dt.version(), str(dt.metadata().id), features)
        return jvm
    except EngineUnavailable as exc:
        raise UnsupportedTableError(f"{why}{exc}; nothing was staged", where) from None


def _probe_commit(
    protocol: Mapping[str, Any], configuration: Mapping[str, str], schema: str, parts: list[str]
) -> str | None:
    """Commit nothing to a scratch table of this protocol and metadata: None if delta-rs does."""
    import tempfile
    import uuid

    with tempfile.TemporaryDirectory(prefix="mvsink-probe-") as scratch:
        os.makedirs(os.path.join(scratch, "_delta_log"))
        metadata = {
            "id": str(uuid.uuid4()),
            "format": {"provider": "parquet", "options": {}},
            "schemaString": schema,
            "partitionColumns": parts,
            "configuration": dict(configuration),
            "createdTime": int(time.time() * 1000),
        }
        with open(os.path.join(scratch, "_delta_log", f"{0:020d}.json"), "w") as fh:
            fh.write(json.dumps({"protocol": protocol}) + "\n" + json.dumps({"metaData": metadata}) + "\n")
        try:
            table = DeltaTable(scratch)
            table.create_write_transaction(
                [],
                mode="append",
                schema=table.schema(),
                partition_by=parts or None,
                commit_properties=CommitProperties(max_commit_retries=0),
                post_commithook_properties=_NO_HOOKS,
            )
        except Exception as exc:
            return first_line(exc)
    return None


TRANSACTION_RETENTION = "delta.setTransactionRetentionDuration"


def _check_transaction_retention(configuration: Mapping[str, str | None], where: Where) -> None:
    """Refuse a table whose app transactions expire. mvsink keeps every view's frontier, its
    lineages' fences and its active writer as app transactions; Delta drops those not written
    for this long when it loads the table, so a fenced job would take the view back and a
    query down for longer would replay a landed batch (twice the rows in append mode)."""
    retention = configuration.get(TRANSACTION_RETENTION)
    if retention:
        raise UnsupportedTableError(
            f"the target sets {TRANSACTION_RETENTION} = {retention!r}: Delta then forgets app "
            "transactions, and with them the view's frontier and fences, so batches could land "
            f"twice and fenced jobs write again. Unset it (ALTER TABLE ... UNSET TBLPROPERTIES "
            f"('{TRANSACTION_RETENTION}')) or point the view at another table.",
            where,
        )


def read_frontier(target: str, app_id: str, storage_options: Mapping[str, str]) -> int | None:
    """The upper recorded under ``app_id``, or None (no table, or never committed)."""
    from mvsink.table.catalog import is_path

    if not is_path(target):
        raise ConfigError(f"{target!r} is a table name: give the table's path or URI", Where(target=target))
    try:
        dt = DeltaTable(table_root(target), storage_options=dict(storage_options) or None)
    except TableNotFoundError:
        return None
    version = dt.transaction_version(app_id)
    return None if version is None else int(version)


@dataclass(frozen=True)
class Landed:
    """A commit that landed, as version ``version``."""

    version: int


@dataclass(frozen=True)
class Lost:
    """A commit that did not land: another commit held the version (``reason`` says which).
    Nothing can reference its files."""

    reason: str


def keeps_files_across_schema_change(snap: Snapshot) -> bool:
    """Whether a commit through ``snap``'s engine can change the table's schema and keep some
    of its files. The JVM Delta can: a ``metaData`` action beside any file actions. delta-rs
    commits a new schema only by replacing every file (its overwrite); its append keeps the
    old schema whatever it is handed (measured on deltalake 1.6: the new schema is dropped
    without an error), so ``compare_and_append`` never asks it to."""
    return snap._jvm is not None


def add_columns(
    snap: Snapshot,
    log_files: LogFiles,
    *,
    schema_json: str,
    attempt_id: str,
    metadata: Mapping[str, str],
    where: Where,
    transactions: Mapping[str, int] | None = None,
) -> Snapshot | Lost:
    """Add the columns of ``schema_json`` that the table lacks, in a commit of that alone
    (with the app ``transactions`` given),
    strictly on ``snap`` (as ``compare_and_append``: one attempt, the outcome read from the
    log when the call fails, the commit turn taken on local disk), through delta-rs; the
    snapshot of the version it made. How a view in upsert or append mode takes added columns
    on that engine, which cannot commit a schema change beside the epoch's removes
    (``keeps_files_across_schema_change``): right before the epoch's commit, which is then
    made on that snapshot. The version holds the table's rows as they were, null in the added
    columns, which is what those modes leave in rows an epoch does not touch."""
    assert snap.version is not None and snap.schema_json is not None
    version = snap.version + 1
    have = {f["name"] for f in json.loads(snap.schema_json)["fields"]}
    fields = [
        Field.from_json(json.dumps(f)) for f in json.loads(schema_json)["fields"] if f["name"] not in have
    ]
    props = CommitProperties(
        custom_metadata={**metadata, record.ATTEMPT: attempt_id},
        max_commit_retries=0,
        app_transactions=[
            Transaction(k, v, int(time.time() * 1000)) for k, v in (transactions or {}).items()
        ],
    )
    turn: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if is_local(snap.root):
        from mvsink.table.jvm_delta import commit_turn

        turn = commit_turn(snap.root)
    table: DeltaTable = snap._table
    try:
        with turn:
            table.alter.add_columns(fields, commit_properties=props, post_commithook_properties=_NO_HOOKS)
    except Exception as exc:
        try:
            _resolve(log_files, version, attempt_id, exc, where)
        except ConflictError as lost:
            return Lost(lost.message)
    _maintain_log(snap, version, where)
    table.load_as_version(version)
    return replace(snap, version=version, schema_json=table.schema().to_json(), _txns={})


def append(snap: Snapshot, log_files: LogFiles, **commit: Any) -> Landed | Lost:
    """``compare_and_append`` with its outcome as a value: ``Landed`` or ``Lost``. An outcome
    the log cannot tell raises ``CommitOutcomeUnknownError``: the commit may have landed."""
    try:
        return Landed(compare_and_append(snap, log_files, **commit))
    except ConflictError as exc:
        return Lost(exc.message)


def compare_and_append(
    snap: Snapshot,
    log_files: LogFiles,
    *,
    adds: Sequence[NewFile],
    removes: Sequence[DataFile],
    app_id: str,
    upper: int | None,
    attempt_id: str,
    metadata: Mapping[str, str],
    schema_json: str,
    partition_by: Sequence[str],
    where: Where,
    transactions: Mapping[str, int] | None = None,
    data_change: bool = True,
    changes: Sequence[NewFile] = (),
    updates: Sequence[DataFile] = (),
    _after_call: Callable[[], None] | None = None,
) -> int:
    """Commit ``adds``, ``removes`` and the frontier ``upper`` (None: left as it is) as one
    Delta version.

    ``data_change=False`` marks a commit that moves rows without changing them (a compaction:
    streaming readers skip it). ``changes`` are change files (the commit's retracted and
    inserted rows with ``_change_type``, for Change Data Feed), committed as ``cdc`` actions;
    ``updates`` are files of ``removes`` added again with another deletion vector. Only the
    session's JVM Delta commits those.

    Strict: it lands only if no commit at all landed since ``snap`` (delta-rs retries are
    off, because its rebase turns our removes of concurrently compacted files into silent
    no-ops). Returns the new version.

    A ``schema_json`` other than the snapshot's changes the table's schema in the same commit
    (a ``metaData`` action): through delta-rs only with every file of the snapshot removed
    (``keeps_files_across_schema_change``).

    Outcomes, and what they allow the caller to do with the staged files:

    * returns: the commit landed (possibly found in the log after the call failed);
    * ``ConflictError``: another commit holds the version; ours cannot land, delete the files;
    * ``CommitOutcomeUnknownError``: the log could not say; the files must be kept.

    ``attempt_id`` is written into the commit metadata (``record.ATTEMPT``); it is how a failed
    call is told apart from a landed one, read from the version's own log file in
    ``log_files`` (the table's storage). Checkpointing and log cleanup run after the commit,
    best-effort: their failure is logged, never the epoch's.
    """
    version = 0 if snap.version is None else snap.version + 1
    now = int(time.time() * 1000)
    add_actions = [
        AddAction(f.path, f.size, dict(f.partition_values), now, data_change, f.stats) for f in adds
    ]
    props = CommitProperties(
        custom_metadata={**metadata, record.ATTEMPT: attempt_id},
        max_commit_retries=0,
        app_transactions=[
            *([Transaction(app_id, upper, now)] if upper is not None else []),
            *(Transaction(k, v, now) for k, v in (transactions or {}).items()),
        ],
    )
    remove_actions = [
        RemoveAction(
            path=f.key,
            data_change=data_change,
            deletion_timestamp=now,
            size=f.size,
            partition_values=dict(f.partition_values) or None,
        )
        for f in removes
    ]
    parts = list(partition_by) or None
    new_schema = snap.version is not None and schema_json != snap.schema_json
    if new_schema and not keeps_files_across_schema_change(snap):
        left = {f.path for f in snap.files} - {f.path for f in removes}
        if left or updates:
            raise InvariantViolation(
                f"a schema change through delta-rs must replace every file, and {len(left)} "
                "of the table's would stay",
                where,
            )
    if (changes or updates) and snap._jvm is None:
        raise InvariantViolation(
            "change files or deletion vectors were staged for a commit through delta-rs, which "
            "cannot commit them",
            where,
        )
    # Through the session's JVM Delta, everything before its commit call (a failure there
    # cannot have landed anything) happens first.
    jvm_commit = None
    if snap._jvm is not None:
        changed = schema_json if new_schema else None
        jvm_commit = _prepare_jvm(snap, adds, removes, changes, updates, props, data_change, where, changed)
    landed: int | None = None
    # mvsink's delta-rs commits to a local table take the commit turn too: the JVM's local
    # store replaces a commit file it found free a moment before (``jvm_delta.commit_turn``).
    turn: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if jvm_commit is None and is_local(snap.root):
        from mvsink.table.jvm_delta import commit_turn

        turn = commit_turn(snap.root)
    # Only the commit call is inside: whatever it raises, the log decides what it did.
    try:
        with turn:
            if snap.version is None:
                create_table_with_add_actions(
                    snap.root,
                    Schema.from_json(schema_json),
                    add_actions,
                    mode="error",
                    partition_by=parts,
                    storage_options=dict(snap.storage_options) or None,
                    commit_properties=props,
                    post_commithook_properties=_NO_HOOKS,
                )
            elif jvm_commit is not None:
                landed = jvm_commit()
                # The JVM's store may replace a commit file (local disk: check, then rename), so
                # its success proves nothing the log does not show: raising lets the log decide.
                if landed == version and commit_attempt(log_files, version) != attempt_id:
                    raise MVSinkError(
                        f"the session's Delta reported version {version} committed, and its log file "
                        "holds another commit"
                    )
            elif new_schema:
                # delta-rs's overwrite: removes every file of the snapshot it was loaded at (the
                # same files as ``removes``, checked above) and writes the new schema.
                table: DeltaTable = snap._table
                table.create_write_transaction(
                    list[AddAction | RemoveAction](add_actions),
                    mode="overwrite",
                    schema=Schema.from_json(schema_json),
                    partition_by=parts,
                    commit_properties=props,
                    post_commithook_properties=_NO_HOOKS,
                )
            else:
                dt: DeltaTable = snap._table
                dt.create_write_transaction(
                    [*remove_actions, *add_actions],
                    mode="append",
                    schema=dt.schema(),
                    partition_by=parts,
                    commit_properties=props,
                    post_commithook_properties=_NO_HOOKS,
                )
        failpoints.hit("after_commit_call")
        if _after_call is not None:
            _after_call()
    except Exception as exc:
        # Even delta-rs's "version already exists" is not proof that ours did not land: on an
        # object store, a conditional put whose reply was lost may be retried by the client
        # and then find our own commit in place.
        _resolve(log_files, version, attempt_id, exc, where)
    if landed is not None and landed != version:
        # Landed, but not on top of the snapshot it was planned on: its files are referenced.
        raise InvariantViolation(
            f"the session's Delta committed version {landed}, not {version}: it rebased the commit "
            "over another one (is spark.databricks.delta.maxCommitAttempts=0 honoured?). The staged "
            "files are kept; the next epoch repairs the view.",
            where,
        )
    if new_schema and jvm_commit is None:
        _check_replaced_every_file(snap, log_files, version, where)
    if jvm_commit is None:  # the JVM Delta checkpoints its own commits
        _maintain_log(snap, version, where)
    return version


def _check_replaced_every_file(snap: Snapshot, log_files: LogFiles, version: int, where: Where) -> None:
    """delta-rs's overwrite removes the snapshot's files itself (not the removes it is handed):
    the version it made must remove every one of them, or its rows are there twice. Raises
    ``InvariantViolation`` if not (a delta-rs whose overwrite does not: the next epoch of a
    complete view retracts the rows it left)."""
    from mvsink.table.log import log_actions

    actions = log_actions(log_files, version) or []
    gone = {unquote(a["remove"]["path"]) for a in actions if "remove" in a}
    left = [f.key for f in snap.files if f.key not in gone]
    if left:
        raise InvariantViolation(
            f"version {version}, which changed the table's schema through delta-rs's overwrite, "
            f"left {len(left)} of the table's files in place (e.g. {left[0]}): this deltalake "
            "does not replace every file in an overwrite; the next epoch retracts their rows",
            where,
        )


def _prepare_jvm(
    snap: Snapshot,
    adds: Sequence[NewFile],
    removes: Sequence[DataFile],
    changes: Sequence[NewFile],
    updates: Sequence[DataFile],
    props: CommitProperties,
    data_change: bool,
    where: Where,
    schema_json: str | None = None,
) -> Callable[[], int]:
    """The commit of ``compare_and_append`` through the session's JVM Delta, up to its call.
    Removed and re-added files repeat what the snapshot's add actions say of them; a
    ``schema_json`` becomes the table's schema in the same commit."""
    from urllib.parse import quote

    from mvsink.table.jvm_delta import add_action, cdc_action, readd_action, remove_action, txn_action

    assert snap.version is not None
    metadata = dict(props.custom_metadata or {})
    user_metadata = metadata.pop("userMetadata", None)
    transactions = list(props.app_transactions or ())
    jvm = snap._jvm
    held = jvm.add_actions(snap.root, snap.version, [f.path for f in (*removes, *updates)])
    for f in removes:
        found = held.get(f.path)
        if found is None or unique_id(found.get("deletionVector")) != unique_id(f.deletion_vector):
            raise InvariantViolation(
                f"the session's Delta does not hold {f.path} as version {snap.version} of the table does",
                where,
            )
    # The log keys partition values by the columns' physical names (column mapping).
    names = physical_names(snap.schema_json)

    def keyed(values: Mapping[str, str | None]) -> dict[str, str | None]:
        return {names.get(k, k): v for k, v in values.items()}

    actions = [
        *(remove_action(held[f.path], data_change) for f in removes),
        *(readd_action(held[f.path], f.deletion_vector or {}, data_change) for f in updates),
        # Spelled as delta-rs spells it: partition folders are already escaped on disk.
        *(
            add_action(quote(f.path, safe="/="), f.size, keyed(f.partition_values), f.stats, data_change)
            for f in adds
        ),
        *(cdc_action(quote(f.path, safe="/="), f.size, keyed(f.partition_values)) for f in changes),
        *(txn_action(t.app_id, t.version) for t in transactions),
    ]
    changed = {} if schema_json is None else {"schema_json": schema_json}
    return snap._jvm.prepare(snap.root, snap.version, actions, metadata, user_metadata, **changed)  # type: ignore[no-any-return]


def physical_names(schema_json: str | None) -> dict[str, str]:
    """The top-level columns' physical names by name, where column mapping renames them."""
    if not schema_json:
        return {}
    out = {}
    for column in json.loads(schema_json).get("fields", []):
        physical = (column.get("metadata") or {}).get("delta.columnMapping.physicalName")
        if physical:
            out[column["name"]] = str(physical)
    return out


def _resolve(
    log_files: LogFiles,
    version: int,
    attempt_id: str,
    exc: Exception,
    where: Where,
) -> None:
    """Decide from the log what a commit call that raised ``exc`` did; return if it landed.

    Like persist's indeterminate ``compare_and_append``: the error alone proves nothing
    (delta-rs may fail after writing the commit file), so the log at ``version`` decides.
    """
    try:
        holder = commit_attempt(log_files, version)
    except Exception as read_exc:
        raise CommitOutcomeUnknownError(
            f"committing version {version} failed ({exc}) and the Delta log could not be read back "
            f"to see whether it landed ({read_exc}); the staged files are kept. Rerun the epoch: "
            "it commits, or finds the epoch already written.",
            where,
        ) from exc
    if holder == attempt_id:
        log.warning(
            "%s: the commit call failed (%s) but version %d is ours: the epoch committed", where, exc, version
        )
        return
    if holder is not None:
        raise ConflictError(f"another commit landed as version {version} first ({exc})", where) from exc
    raise CommitOutcomeUnknownError(
        f"committing version {version} failed ({exc}) and the version is not in the log yet; the "
        "staged files are kept in case the commit still lands. Rerun the epoch: it commits, or "
        "finds the epoch already written.",
        where,
    ) from exc


def _maintain_log(snap: Snapshot, version: int, where: Where) -> None:
    """Checkpoint (every ``delta.checkpointInterval`` versions) and clean up expired log files,
    as delta-rs's post-commit hooks would, but after the commit and never failing it."""
    configuration = snap.configuration
    try:
        interval = int(configuration.get("delta.checkpointInterval", _DEFAULT_CHECKPOINT_INTERVAL))
    except ValueError:
        interval = _DEFAULT_CHECKPOINT_INTERVAL
    if version == 0 or interval <= 0 or version % interval:
        return
    try:
        dt = DeltaTable(snap.root, version=version, storage_options=dict(snap.storage_options) or None)
        dt.create_checkpoint()
        if configuration.get("delta.enableExpiredLogCleanup", "true").lower() == "true":
            dt.cleanup_metadata()
    except Exception as exc:
        log.warning("%s: version %d committed, but checkpointing it failed: %s", where, version, exc)


def read_table(target: str, storage_options: Mapping[str, str] | None = None) -> pa.Table:
    """The target's current contents, read by delta-rs (an independent Delta reader)."""
    dt = DeltaTable(table_root(target), storage_options=dict(storage_options or {}) or None)
    return pa.table(dt.to_pyarrow_table())


def read_sample(target: str, storage_options: Mapping[str, str] | None, limit: int) -> tuple[pa.Table, int]:
    """Up to ``limit`` rows of the target (read by delta-rs, without reading the rest), and how
    many rows it holds by the log's statistics."""
    dt = DeltaTable(table_root(target), storage_options=dict(storage_options or {}) or None)
    actions = pa.table(dt.get_add_actions())
    total = pc.sum(actions.column("num_records")).as_py() if actions.num_rows else 0
    return dt.to_pyarrow_dataset().head(limit), int(total or 0)


def foreign_append(target: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Append rows as another writer would (the demo uses it to disturb a view)."""
    dt = DeltaTable(table_root(target))
    schema = pa.schema(dt.schema().to_arrow())
    write_deltalake(table_root(target), pa.Table.from_pylist(list(rows), schema=schema), mode="append")


def foreign_delete(target: str, predicate: str) -> None:
    """Delete rows as another writer would, with delta-rs's SQL-like predicate."""
    DeltaTable(table_root(target)).delete(predicate)


RETENTION = "delta.deletedFileRetentionDuration"
_US_PER_HOUR = 3_600_000_000
DEFAULT_RETENTION_US = 7 * 24 * _US_PER_HOUR
_UNIT_US = {
    "week": 7 * 24 * _US_PER_HOUR,
    "day": 24 * _US_PER_HOUR,
    "hour": _US_PER_HOUR,
    "minute": 60_000_000,
    "second": 1_000_000,
    "millisecond": 1_000,
    "microsecond": 1,
}


def table_retention_us(configuration: Mapping[str, str | None]) -> int | None:
    """The table's ``delta.deletedFileRetentionDuration`` in microseconds, read as the JVM
    Delta reads it (Spark's interval syntax: an optional ``interval``, then whole numbers with
    units from weeks to microseconds, a fraction on seconds only, any case; 7 days when
    unset), or None for a value it does not read so (months and years included). delta-rs
    reads only some of these forms (``30 days``, say, is 7 days to it): ``vacuum`` always
    hands delta-rs the retention read here."""
    text = (configuration.get(RETENTION) or "").strip().lower()
    if not text:
        return DEFAULT_RETENTION_US
    words = text.split()
    if words[0] == "interval":
        words = words[1:]
    if not words or len(words) % 2:
        return None
    total = 0
    for amount, word in zip(words[::2], words[1::2], strict=True):
        unit = word[:-1] if word.endswith("s") and word[:-1] in _UNIT_US else word
        found = re.fullmatch(r"([+-]?)(\d+)(?:\.(\d{1,6}))?", amount)
        if unit not in _UNIT_US or found is None or (found.group(3) and unit != "second"):
            return None
        sign, whole, fraction = found.groups()
        value = int(whole) * _UNIT_US[unit] + int((fraction or "").ljust(6, "0"))
        total += -value if sign == "-" else value
    return total
