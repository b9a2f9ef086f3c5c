"""The Delta shim: snapshots, engine choice and Delta's errors, in mvsink's verbs.

With ``commit.py`` (the strict commit), ``jvm_delta.py`` (the session's JVM Delta) and
``storage.py``'s object-store handler, the only code that imports ``deltalake``
(``tests/test_layout.py`` keeps it so). Here: load a snapshot (version, frontier, files, schema,
properties parsed once into ``properties.TableProperties``), choose what commits to a table,
open a table (``open_table``) for the modules above, and map every delta-rs error to an
mvsink error, in one place (``delta_errors``).
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import functools
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable as DeltaTable
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.exceptions import DeltaError as DeltaError
from deltalake.transaction import CommitProperties, PostCommitHookProperties

from mvsink.errors import (
    ConfigError,
    ConflictError,
    InvariantViolation,
    MVSinkError,
    StorageError,
    UnsupportedTableError,
    Where,
    first_line,
)
from mvsink.table.log import LogFiles
from mvsink.table.log import unique_id as unique_id  # (the log's own: a file is its path and vector)
from mvsink.table.properties import CHANGE_FEED, TRANSACTION_RETENTION, TableProperties
from mvsink.table.properties import RETENTION as RETENTION  # for plan/tombstones.py
from mvsink.table.properties import table_retention_us as table_retention_us  # for the readers
from mvsink.table.uris import table_root

log = logging.getLogger(__name__)

# delta-rs runs checkpointing and log cleanup after writing the commit file and reports their
# failure as the commit's: mvsink turns them off and runs them itself, best-effort
# (``commit.after``).
NO_HOOKS = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)

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

    @functools.cached_property
    def properties(self) -> TableProperties:
        """The table's properties mvsink acts on, parsed once from ``configuration``."""
        return TableProperties.parse(self.configuration)

    @property
    def deletion_vectors(self) -> bool:
        """Whether retractions are written as deletion vectors (the table turns them on, and the
        session's JVM Delta commits): a file keeps its bytes, a vector marks its dropped rows."""
        return self.properties.deletion_vectors and self._jvm is not None

    @property
    def change_feed(self) -> bool:
        """Whether the table has Change Data Feed on: each commit that rewrites files must then
        carry its retracted and inserted rows as change files (``cdc`` actions)."""
        return self.properties.change_feed

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


def open_table(
    target: str, storage_options: Mapping[str, str] | None = None, *, version: int | None = None
) -> DeltaTable:
    """The Delta table at ``target`` (a path or URI), opened by delta-rs: for the modules above
    the shim that read what only delta-rs reads. Raises delta-rs's errors (``delta_errors``)."""
    options = dict(storage_options or {}) or None
    return DeltaTable(table_root(target), version=version, storage_options=options)


@contextlib.contextmanager
def delta_errors(
    where: Where,
    doing: str,
    *,
    missing: str | None = None,
    refused: type[MVSinkError] = UnsupportedTableError,
    not_found: type[MVSinkError] | None = None,
) -> Iterator[None]:
    """Map every delta-rs error raised in the block to an mvsink error, in one place: a lost
    commit race (``CommitFailedError``) to ``ConflictError``; no table (``TableNotFoundError``)
    to ``ConfigError`` saying ``missing``, or to ``not_found`` saying what failed (a table
    whose log no longer holds the version asked for is one too), else re-raised as is;
    another Delta error to
    ``refused`` (``UnsupportedTableError`` unless the caller's operation names another: a
    source's ``InputError``, the metrics table's ``StorageError``); an object store's
    ``OSError`` to ``StorageError``. ``doing`` says what failed: "cannot {doing}: {error}"."""
    try:
        yield
    except MVSinkError:
        raise
    except CommitFailedError as exc:
        raise ConflictError(
            f"cannot {doing}: another commit landed first ({first_line(exc)})", where
        ) from exc
    except TableNotFoundError as exc:
        if missing is not None:
            raise ConfigError(missing, where) from exc
        if not_found is not None:
            raise not_found(f"cannot {doing}: {first_line(exc)}", where) from exc
        raise
    except DeltaError as exc:
        raise refused(f"cannot {doing}: {exc}", where) from exc
    except OSError as exc:  # the object store: endpoint, credentials, bucket
        raise StorageError(f"cannot {doing}: {first_line(exc)}", where) from exc


def load_snapshot(
    target: str,
    app_id: str,
    storage_options: Mapping[str, str],
    where: Where,
    *,
    writing: bool = True,
    engine: str = "auto",
    spark: Any = None,
    log_files: LogFiles | None = None,
) -> Snapshot:
    """Load the latest snapshot of ``target`` and refuse table features mvsink cannot keep.

    With ``writing``, also choose what commits to it (``engine``: ``auto``, ``delta-rs`` or
    ``delta-spark``, the JVM Delta of ``spark`` or of the active session) and refuse a table
    that none of them can write. ``log_files`` (the table's storage) lets the session's Delta
    read which files have deletion vectors from the log's commit files (``log.Adds``);
    without, it lists them in a Spark job."""
    root = table_root(_path(target, where))
    dt = _open(root, storage_options, where)
    if dt is None:
        if writing and engine == "delta-spark":  # a new table is made by delta-rs, but say now
            _engine(root, None, frozenset(), engine, spark, where)  # if it cannot commit later
        return Snapshot(root, None, None, None, (), (), storage_options=dict(storage_options))
    features = _check_features(dt, where, allowed=_KEPT_THROUGH_THE_JVM)
    meta = dt.metadata()
    configuration = {k: v for k, v in meta.configuration.items() if v is not None}
    properties = TableProperties.parse(configuration)
    _check_transaction_retention(properties, where)
    jvm = _engine(root, dt, features, engine, spark, where) if writing else None
    actions = pa.table(dt.get_add_actions(flatten=True))
    reader = _reader(spark, features) if jvm is None else jvm
    files, rows_known = _files(root, dt, actions, features, reader, log_files, where)
    schema_json = dt.schema().to_json()
    stats = _logical_stats(
        actions.select([c for c in actions.column_names if c.startswith(("min.", "max."))]), schema_json
    )
    snap = Snapshot(
        root=root,
        version=dt.version(),
        frontier=dt.transaction_version(app_id),
        schema_json=schema_json,
        partition_by=tuple(meta.partition_columns),
        files=files,
        configuration=configuration,
        features=features,
        storage_options=dict(storage_options),
        table_id=str(meta.id),
        stats=stats,
        rows_known=rows_known,
        _table=dt,
        _jvm=jvm,
    )
    snap.__dict__["properties"] = properties  # parsed once (``Snapshot.properties``)
    return snap


def _path(target: str, where: Where) -> str:
    """``target``, refused if it is a table name (only the sink resolves names)."""
    from mvsink.table.catalog import is_path

    if not is_path(target):
        raise ConfigError(
            f"{target!r} is a table name: here give the table's path or URI (only the sink resolves "
            f"names, through its Spark session), or './{target}' for a folder of that name",
            where,
        )
    return target


def _open(root: str, storage_options: Mapping[str, str], where: Where) -> DeltaTable | None:
    """The table at ``root``, or None if there is none."""
    with delta_errors(where, "open the Delta table"):
        try:
            return DeltaTable(root, storage_options=dict(storage_options) or None)
        except TableNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"cannot read the Delta log at {root}: {first_line(exc)}", where) from exc


def _files(
    root: str,
    dt: DeltaTable,
    actions: pa.Table,
    features: frozenset[str],
    jvm: Any,
    log_files: LogFiles | None,
    where: Where,
) -> tuple[tuple[DataFile, ...], bool]:
    """The snapshot's files, and whether their rows are known: delta-rs lists the files but not
    their deletion vectors, which the log's add actions hold (``log.Adds``, kept by the
    session's Delta, ``jvm``, if any, which loads them when the log alone cannot)."""
    part_cols = [c for c in actions.column_names if c.startswith("partition.")]
    heads = actions.select(["path", "size_bytes", "num_records", *part_cols]).to_pylist()
    vectors: Mapping[str, Mapping[str, Any]] | None = {}
    if "deletionVectors" in features:
        # Unknown without the session's Delta (``Snapshot.rows_known``).
        vectors = None if jvm is None else _vectors(root, dt, heads, jvm, log_files, where)
    files = tuple(
        _data_file(row, part_cols, None if vectors is None else vectors.get(row["path"]), where)
        for row in heads
    )
    return files, vectors is not None


def _vectors(
    root: str,
    dt: DeltaTable,
    heads: Sequence[Mapping[str, Any]],
    jvm: Any,
    log_files: LogFiles | None,
    where: Where,
) -> Mapping[str, Mapping[str, Any]]:
    """The deletion vectors of the version's files, by path, from the log's add actions
    (``JvmDelta.adds``), checked against delta-rs's listing (``heads``: files and bytes) and
    the version's checksum file, if any (vectors and the rows they drop too). What does not
    agree is read again whole from the session's Delta, once, before it is an error. Without
    ``log_files``, the session's Delta lists them (one Spark job)."""
    table_id, version = str(dt.metadata().id), dt.version()
    mine = (len(heads), sum(int(row["size_bytes"]) for row in heads))
    problem = ""
    for fresh in (False, True):
        held = (
            None
            if log_files is None
            else jvm.adds(root, table_id, version, log_files, len(heads), fresh=fresh)
        )
        if held is None:  # too many files to keep: the session's Delta lists the vectors
            vectors, listed = jvm.deletion_vectors(root, version)
            problem = "" if listed == mine else f"files and bytes: {listed} and {mine}"
        else:
            vectors, listed = held.vectors(), held.totals()
            problem = held.checksum_problem(log_files) or (
                "" if listed == mine else f"files and bytes: {listed} and {mine}"
            )
        unknown = set(vectors) - {row["path"] for row in heads}
        if not problem and unknown:
            problem = f"vectors of files delta-rs does not list: {sorted(unknown)[:3]}"
        if not problem:
            return vectors  # type: ignore[no-any-return]
        jvm.forget(root, table_id)
        log.warning("%s: the files read at version %s do not agree (%s): read again", where, version, problem)
    raise InvariantViolation(
        f"the session's Delta and delta-rs list different files at version {version} ({problem})", where
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


def _reader(spark: Any, features: frozenset[str]) -> Any:
    """The JVM Delta of ``spark`` or the active session, for reading a table with deletion
    vectors (``features``), or None."""
    from mvsink.errors import EngineUnavailable
    from mvsink.table.jvm_delta import JvmDelta

    if "deletionVectors" not in features:
        return None
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    try:
        return None if spark is None else JvmDelta(spark)
    except EngineUnavailable:
        return None


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
    props = TableProperties.parse(dt.metadata().configuration)
    refused = [label for name, label in _REFUSED_FEATURES.items() if name in features]
    if props.deletion_vectors:
        refused.append("deletion vectors")
    if props.column_mapping != "none":
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
        dt = open_table(target, storage_options)
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
    props = TableProperties() if dt is None else TableProperties.parse(dt.metadata().configuration)
    if refusal is None and ("columnMapping" in features or props.column_mapping != "none"):
        refusal = (
            "the table maps column names (column mapping), which mvsink writes through the session's "
            "Delta only"
        )
    if refusal is None and "deletionVectors" in features:
        refusal = (
            "the table has deletion vectors, which mvsink reads and writes through the session's "
            "Delta only (delta-rs does not list them)"
        )
    if refusal is None and props.change_feed:
        refusal = (
            f"the table has Change Data Feed on ({CHANGE_FEED}) and mvsink's commits through delta-rs "
            "carry no change files, so the feed would report every row of each rewritten file"
        )
    if engine == "delta-rs" or (engine == "auto" and refusal is None):
        if refusal is None:
            return None
        raise UnsupportedTableError(
            f"the installed deltalake {deltalake_version()} cannot commit to the target ({refusal}); "
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
                post_commithook_properties=NO_HOOKS,
            )
        except Exception as exc:
            return first_line(exc)
    return None


def _check_transaction_retention(properties: TableProperties, where: Where) -> None:
    """Refuse a table whose app transactions expire. mvsink keeps every view's frontier, its
    lineages' fences and its active writer as app transactions; Delta drops those not written
    for this long when it loads the table, so a fenced job would take the view back and a
    query down for longer would replay a landed batch (twice the rows in append mode)."""
    retention = properties.transaction_retention
    if retention is not None:
        raise UnsupportedTableError(
            f"the target sets {TRANSACTION_RETENTION} = {retention!r}: Delta then forgets app "
            "transactions, and with them the view's frontier and fences, so batches could land "
            f"twice and fenced jobs write again. Unset it (ALTER TABLE ... UNSET TBLPROPERTIES "
            f"('{TRANSACTION_RETENTION}')) or point the view at another table.",
            where,
        )


def deltalake_version() -> str:
    """The installed deltalake's version (``importlib.metadata``, without importing it)."""
    from importlib.metadata import version

    return version("deltalake")


def read_frontier(target: str, app_id: str, storage_options: Mapping[str, str]) -> int | None:
    """The upper recorded under ``app_id``, or None (no table, or never committed)."""
    from mvsink.table.catalog import is_path

    if not is_path(target):
        raise ConfigError(f"{target!r} is a table name: give the table's path or URI", Where(target=target))
    try:
        dt = open_table(target, storage_options)
    except TableNotFoundError:
        return None
    version = dt.transaction_version(app_id)
    return None if version is None else int(version)


def keeps_files_across_schema_change(snap: Snapshot) -> bool:
    """Whether a commit through ``snap``'s engine can change the table's schema and keep some
    of its files. The JVM Delta can: a ``metaData`` action beside any file actions. delta-rs
    commits a new schema only by replacing every file (its overwrite); its append keeps the
    old schema whatever it is handed (measured on deltalake 1.6: the new schema is dropped
    without an error), so ``compare_and_append`` never asks it to."""
    return snap._jvm is not None


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


def read_table(target: str, storage_options: Mapping[str, str] | None = None) -> pa.Table:
    """The target's current contents, read by delta-rs (an independent Delta reader)."""
    dt = open_table(target, storage_options)
    return pa.table(dt.to_pyarrow_table())


def read_sample(target: str, storage_options: Mapping[str, str] | None, limit: int) -> tuple[pa.Table, int]:
    """Up to ``limit`` rows of the target (read by delta-rs, without reading the rest), and how
    many rows it holds by the log's statistics."""
    dt = open_table(target, storage_options)
    actions = pa.table(dt.get_add_actions())
    total = pc.sum(actions.column("num_records")).as_py() if actions.num_rows else 0
    return dt.to_pyarrow_dataset().head(limit), int(total or 0)


def write_rows(target: str, rows: pa.Table, storage_options: Mapping[str, str] | None = None) -> None:
    """Append ``rows`` to the table at ``target`` as a plain Delta writer would (delta-rs, none
    of mvsink's records): another writer, for the demo's tamper."""
    from deltalake import write_deltalake

    options = dict(storage_options or {}) or None
    write_deltalake(table_root(target), rows, mode="append", storage_options=options)


def open_existing(target: str, storage_options: Mapping[str, str] | None = None) -> DeltaTable | None:
    """``open_table``, or None when there is no table at ``target``."""
    try:
        return open_table(target, storage_options)
    except TableNotFoundError:
        return None


def storage_handler(root: str, options: Mapping[str, str]) -> Any:
    """delta-rs's object store for ``root`` as a pyarrow file system handler (wrap it in
    ``pyarrow.fs.PyFileSystem``): the store, options and credentials the commits use."""
    from deltalake.fs import DeltaStorageHandler

    return DeltaStorageHandler(root, dict(options))


def raw_storage_handler(root: str, options: Mapping[str, str]) -> Any:
    """delta-rs's own file system handler for ``root``, whose raw output streams take bytes.
    Private to deltalake (``deltalake._internal``): no public API hands it out, so this is its
    one use in mvsink, to change if deltalake moves it."""
    from deltalake._internal import DeltaFileSystemHandler

    return DeltaFileSystemHandler(root, dict(options))
