"""The ``delta-spark`` engine: commits through the JVM Delta runtime of the user's own session.

delta-rs cannot write some tables Spark users have (row tracking, liquid clustering, ...). The
session's JVM Delta can, and gives the same strict compare-and-append: a transaction started
on the snapshot an epoch planned on, with every file read (``readWholeTable``), and one
attempt only (``maxCommitAttempts = 0`` on a cloned session made active just around the
commit, so the user's session is untouched). Any commit that landed since that snapshot, of
any kind, makes it fail; the caller then decides from the log what happened
(``commit.py``).

Actions are given as their Delta-log JSON (``Action.fromJson``): the JSON is the protocol and
stable across releases, the Scala constructors are not. mvsink's commit metadata goes into the
commit's ``tags`` (the JVM writes only its own ``commitInfo`` fields) and the one-line summary
into ``userMetadata``. The JVM fills in what the table's features need (row ids and their
high-water mark, ...).

A commit is only as exclusive as the log store Delta writes it with: ``check_store`` asks
Delta which one it resolves for the table's path and refuses one two writers could both "win"
a version through. On local disk Delta's store checks, then renames (which replaces there):
exclusive within one JVM only, so mvsink's commits to a local table take turns across
processes (``commit_turn``), and ``commit.py`` reads every commit back.

Everything here is a Delta internal reached through py4j: classic sessions only (Spark Connect
has no py4j), on the Delta and Spark pairs it was tested with (``TESTED``, ``pair_problem``),
checked before anything is staged. This is the only module that knows them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from mvsink.compat import from_arrow, to_arrow
from mvsink.errors import EngineRefused, EngineUnavailable, MVSinkError, first_line
from mvsink.table import record
from mvsink.table.log import ADD_FIELDS, REPLAYED, Adds, LogFiles
from mvsink.table.stats import loosened


class Tested(NamedTuple):
    """The Spark a tested Delta release runs on here, and how to install each."""

    spark: str
    """Spark's major.minor (``4.2`` for the JVM's ``4.2.0``)."""
    package: str
    """The Delta artifact's Maven coordinates, for ``spark.jars.packages``."""
    pyspark: str
    """What installs that Spark's PySpark (mvsink's own pins with it)."""


TESTED: dict[str, Tested] = {
    "4.4": Tested("4.2", "io.delta:delta-spark_2.13:4.4.0", 'pip install "pyspark[sql]==4.2.*"'),
    "3.3": Tested("3.5", "io.delta:delta-spark_2.12:3.3.2", 'pip install "mvsink[spark35]"'),
}
"""The Delta releases (major.minor) whose internals this module was tested against, each with
the one Spark (major.minor) it was tested on. Delta's classes call Spark's own internals, and
each Delta artifact is built for one Spark (``delta-spark_2.13`` 4.4.0 for Spark 4.2.0,
``delta-spark_2.12`` 3.3.2 for 3.5): in another Spark they can fail inside Delta, mid-epoch (a
``NoSuchMethodError`` in a Spark job, as delta-spark 4.4 does in Spark 4.3). So any other pair
is refused before anything is staged (``pair_problem``); docs/engines.md has the table."""
ENGINES = ("auto", "delta-rs", "delta-spark")
COMMIT_CONF = "spark.databricks.delta.maxCommitAttempts"
COMMIT_ROUTING_FEATURES = ("catalogManaged", "catalogOwned", "coordinatedCommits")
"""Table features (prefixes) whose commits do not simply land in ``_delta_log``."""
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"


class JvmDelta:
    """The JVM Delta of one classic Spark session (a ``foreachBatch`` call gets a session
    object of its own each batch). The Delta and Spark versions it reads of the JVM are kept
    for the JVM's life (``_JVMS``), what it read of a table's files for the table's
    (``_TABLES``); each instance asks for the log store anew (a store set in the JVM's
    startup conf after it started is Delta's too)."""

    def __init__(self, spark: Any) -> None:
        _usable(spark)
        jspark = spark._jsparkSession
        self._spark = spark
        self._jvm = spark._jvm
        self._jspark = jspark
        with _LOCK:
            checked = _JVMS.get(spark.sparkContext)
        if checked is None:
            try:
                version = str(self._module("io.delta.package$").VERSION())
            except Exception:
                raise EngineUnavailable(
                    "the delta-spark engine needs Delta in the Spark session (delta-spark's jars, "
                    "'spark.sql.extensions' = io.delta.sql.DeltaSparkSessionExtension)"
                ) from None
            checked = _Checked(version, str(jspark.version()))
            with _LOCK:
                _JVMS[spark.sparkContext] = checked
        self.version = checked.delta
        self.spark_version = checked.spark
        """The session's Spark, as its JVM reports it (PySpark's own version may differ)."""
        self._stores: dict[str, str] = {}
        """``check_store``'s verdicts by URI scheme, for this instance's life (an epoch's)."""
        problem = pair_problem(self.version, self.spark_version)
        if problem is not None:
            raise EngineUnavailable(problem)

    def _module(self, name: str) -> Any:
        """A Scala object (``Foo$.MODULE$``) by class name."""
        jvm = self._jvm
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        return jvm.java.lang.Class.forName(name, True, loader).getField("MODULE$").get(None)

    # Scala collections built with what Scala 2.12 (Delta 3.3) and 2.13 (Delta 4) share: their
    # Java converters differ, a List's ``::`` and an immutable Map's ``updated`` do not.
    def _seq(self, items: Sequence[Any]) -> Any:
        out = self._module("scala.collection.immutable.Nil$")
        for item in reversed(items):
            out = getattr(out, "$colon$colon")(item)
        return out

    def _map(self, items: Mapping[str, str]) -> Any:
        out = self._module("scala.collection.immutable.Map$").empty()
        for key, value in items.items():
            out = out.updated(key, value)
        return out

    def check_table(self, root: str, version: int, table_id: str, features: frozenset[str]) -> None:
        """Refuse, before anything is staged, a table this engine must not commit to: one the
        JVM does not see as delta-rs does (another store, another table, an older version),
        one whose commits go through a catalog or coordinator (delta-rs reads only the
        ``_delta_log`` folder, so it would plan on a stale version). The store: ``check_store``."""
        routed = sorted(f for f in features if f.startswith(COMMIT_ROUTING_FEATURES))
        if routed:
            raise EngineUnavailable(
                f"the table's commits go through a catalog or commit coordinator ({', '.join(routed)}), "
                "which mvsink's reading of the Delta log does not follow"
            )
        none = self._jvm.scala.Option.empty()
        snapshot = self._log(root).update(False, none, none)
        seen, seen_id = int(snapshot.version()), str(snapshot.metadata().id())
        if seen < version or seen_id != table_id:
            raise EngineUnavailable(
                f"the session's Delta sees another table at {jvm_path(root)} (version {seen}, id "
                f"{seen_id}) than mvsink reads (version {version}, id {table_id}): check that both "
                "reach the same store"
            )

    def check_store(self, root: str) -> str:
        """Refuse, before anything is staged, a store where the session's Delta cannot commit a
        version exclusively across writers (also for a table not made yet: delta-rs makes it,
        and the next epoch would be refused); else say how its commits are exclusive:
        ``"store"`` (Delta's log store makes them so, across processes and machines) or
        ``"local"`` (local disk: Delta's store does within one JVM only, and mvsink's commits
        to the table take turns across processes, ``commit_turn``).

        The store is the one Delta itself resolves for the table's log path as the JVM is
        handed it (``jvm_path``: ``s3a://`` for an ``s3://`` target), from the JVM's startup
        conf (``SparkEnv``'s, which ``spark.conf.set`` does not reach), as ``DeltaLog`` does."""
        path = jvm_path(root).rstrip("/") + "/_delta_log"
        scheme = path.split("://", 1)[0].lower() if "://" in path else "file"
        known = self._stores.get(scheme)
        if known is None:
            missing = self._missing_file_system(scheme)
            try:
                known = _store_kind(self._store_class(path, scheme), scheme)
            except EngineUnavailable as exc:
                raise EngineUnavailable(f"{exc}{'; and ' + missing if missing else ''}") from None
            if missing:
                raise EngineUnavailable(missing)
            self._stores[scheme] = known
        return known

    def _missing_file_system(self, scheme: str) -> str:
        """What the session lacks to reach ``scheme`` paths at all, and what to add; ``""``
        when nothing. Only S3 is checked: Hadoop's S3A is a jar of its own, ``hadoop-aws``,
        that a Spark session does not have unless it is added; a session whose Hadoop
        resolves another file system for the scheme (``fs.s3a.impl``: a platform's own) has
        what it needs."""
        if scheme not in _S3_SCHEMES:
            return ""
        try:
            conf = self._jspark.sessionState().newHadoopConf()
            self._jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, conf)
            return ""
        except Exception:
            pass
        hadoop = str(self._jvm.org.apache.hadoop.util.VersionInfo.getVersion())
        return (
            f"the session has no Hadoop S3A file system ({_S3A}), which Delta reads and writes "
            f"s3a:// paths with: add org.apache.hadoop:hadoop-aws:{hadoop} (the session's Hadoop "
            "version) to spark.jars.packages when the session starts"
        )

    def _store_class(self, path: str, scheme: str) -> str:
        """The class of the log store Delta commits through for ``path`` (a delegating
        store's delegate for the path's scheme, a Java store's own class, not its adaptor)."""
        try:
            store = self._module("org.apache.spark.sql.delta.storage.LogStore$").apply(self._jspark)
            if store.getClass().getName().endswith(".DelegatingLogStore"):
                store = store.getDelegate(self._jvm.org.apache.hadoop.fs.Path(path))
            if store.getClass().getName().endswith(".LogStoreAdaptor"):
                store = store.logStoreImpl()
            return str(store.getClass().getName())
        except Exception as exc:
            java = getattr(exc, "java_exception", None)  # py4j's error: the JVM's is the news
            raise EngineUnavailable(
                f"the session's Delta cannot make its log store for {scheme}:// paths "
                f"({_STORE_CONF.format(scheme=scheme)}): "
                f"{first_line(exc) if java is None else str(java.toString())[:500]}"
            ) from None

    def _files(self, root: str, version: int) -> Any:
        """The add actions of the table at ``root`` as of ``version``: a PySpark DataFrame over
        the snapshot's own state (Delta caches it per snapshot)."""
        from pyspark.sql import DataFrame

        snapshot = self._snapshot_at(self._log(root), version)
        return DataFrame(snapshot.allFiles().toDF(), self._spark)

    def _log(self, root: str) -> Any:
        return self._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(self._jspark, jvm_path(root))

    def _snapshot_at(self, delta_log: Any, version: int) -> Any:
        """The snapshot of ``version``: Delta 4 takes a catalog table and a flag more than 3.3."""
        none = self._jvm.scala.Option.empty()
        if self.version.startswith("3."):
            return delta_log.getSnapshotAt(version, none, none)
        return delta_log.getSnapshotAt(version, none, none, False)

    def adds(
        self, root: str, table_id: str, version: int, log_files: LogFiles, files: int, *, fresh: bool = False
    ) -> Adds | None:
        """The add actions of ``version`` of the table at ``root`` (``log.Adds``), which holds
        ``files`` files: the last answer for the table carried forward through the log's
        commit files since, or read from them alone for a young table; else (or ``fresh``)
        the version's whole state as the JVM's snapshot holds it (one Spark job). None when
        that would be more than ``FILES_KEPT`` files (the caller asks for what it needs,
        ``deletion_vectors``, ``add_actions``). The caller checks the answer, and ``forget``s
        it if it does not hold."""
        key = (root, table_id)
        with _LOCK:
            known = _TABLES.get(key)
        found = None if known is None or fresh else known.at(log_files, version)
        if found is None and not fresh and version <= REPLAYED:
            found = Adds.empty().at(log_files, version)
        if found is None:
            if files > FILES_KEPT:
                return None
            found = Adds(version, self._snapshot_adds(root, version))
        with _LOCK:
            newest = _TABLES.get(key)
            if len(found.by_path) <= FILES_KEPT and (newest is None or newest.version <= found.version):
                _TABLES[key] = found
                _TABLES.move_to_end(key)
                while len(_TABLES) > _TABLES_KEPT:
                    _TABLES.popitem(last=False)
        return found

    @staticmethod
    def forget(root: str, table_id: str) -> None:
        """Drop what was read of the table's files: the next ``adds`` reads them anew."""
        with _LOCK:
            _TABLES.pop((root, table_id), None)

    def _snapshot_adds(self, root: str, version: int) -> dict[str, Mapping[str, Any]]:
        """Every add action of ``version``, by path, from the JVM's snapshot state."""

        return _by_path(self._files(root, version))

    def deletion_vectors(self, root: str, version: int) -> tuple[dict[str, dict[str, Any]], tuple[int, int]]:
        """The deletion vector descriptors of the files of ``version`` that have one, by the
        path the log lists, with the version's number of files and their total size (to check
        against another reader's listing); one Spark job, one row back. (For a table too big
        to keep its ``adds``.)"""
        from pyspark.sql import functions as F

        dv = F.col("deletionVector")
        vector = F.struct(*(dv[f].alias(f) for f in _DV_FIELDS))
        found = (
            self._files(root, version)
            .agg(
                F.collect_list(F.when(dv.isNotNull(), F.struct("path", F.to_json(vector).alias("dv")))),
                F.count(F.lit(1)),
                F.coalesce(F.sum("size"), F.lit(0)),
            )
            .collect()[0]
        )
        vectors = {row["path"]: json.loads(row["dv"]) for row in found[0]}
        return vectors, (int(found[1]), int(found[2]))

    def add_actions(self, root: str, version: int, paths: Sequence[str]) -> dict[str, Mapping[str, Any]]:
        """The add actions of the files at ``paths`` in ``version``, by path; one Spark job.
        (For a table too big to keep its ``adds``.)"""

        if not paths:
            return {}
        import pyarrow as pa

        # From Arrow: a DataFrame built from Python rows costs seconds at ten thousand files.
        wanted = from_arrow(self._spark, pa.table({"path": sorted(set(paths))}), "path string")
        return _by_path(self._files(root, version).join(wanted, "path", "left_semi"))

    def _operation(self, tags: Mapping[str, str]) -> Any:
        """The Delta operation a commit records: a sink's epoch as Delta's own streaming sink
        records a micro-batch (``STREAMING UPDATE``, with the output mode, the lineage as the
        query and the epoch), anything else (compaction, promotion) as ``Manual Update``.
        Delta derives a streaming update's checksum (``.crc``) from the last one; a manual
        update's it computes from the whole table state, a Spark job at every commit (0.6 s
        of a 0.8 s commit at 200K rows, measured)."""
        jvm = self._jvm
        epoch = tags.get(record.EPOCH)
        if epoch is None:
            return self._module("org.apache.spark.sql.delta.DeltaOperations$ManualUpdate$")
        mode = _OUTPUT_MODES[tags.get(record.MODE, "complete")]
        output = getattr(jvm.org.apache.spark.sql.streaming.OutputMode, mode)()
        streaming = self._module("org.apache.spark.sql.delta.DeltaOperations$StreamingUpdate$")
        query = tags.get(record.LINEAGE, "")
        return streaming.apply(output, query, int(epoch), jvm.scala.Option.empty())

    def prepare(
        self,
        root: str,
        read_version: int,
        actions: Sequence[Mapping[str, Any]],
        tags: Mapping[str, str],
        user_metadata: str | None,
        *,
        schema_json: str | None = None,
    ) -> Callable[[], int]:
        """Everything up to the commit call (whose failure cannot have landed anything): a
        transaction on ``read_version`` of the table at ``root`` with ``actions`` (Delta-log
        JSON objects), and with ``schema_json`` as the table's schema if given (the
        snapshot's ``metaData``, its schema replaced). The returned call commits it, strictly
        as ``read_version + 1``, one attempt, and returns the version it landed as. On local
        disk the call first waits for the table's commit turn (``commit_turn``)."""
        jvm = self._jvm
        delta_log = self._log(root)
        snapshot = self._snapshot_at(delta_log, read_version)
        if schema_json is not None:
            meta = json.loads(str(snapshot.metadata().json()))
            meta["metaData"]["schemaString"] = schema_json
            actions = [*actions, meta]
        txn = delta_log.startTransaction(jvm.scala.Option.empty(), jvm.scala.Some(snapshot))
        # One attempt (``COMMIT_CONF``): the call fails if any commit holds the version, data
        # or app transactions alike, so nothing is registered as read. (Reading an app
        # transaction's version, ``txnVersion``, made Delta compute the whole table's state, a
        # Spark job at every commit.)
        txn.readWholeTable()
        from_json = jvm.org.apache.spark.sql.delta.actions.Action.fromJson
        seq = self._seq([from_json(json.dumps(a, separators=(",", ":"))) for a in actions])
        operation = self._operation(tags)
        tag_map = self._map(tags)
        clone = self._jspark.cloneSession()
        clone.conf().set(COMMIT_CONF, "0")
        # The commit's attempt id lives in its commitInfo: how a failed call is resolved.
        clone.conf().set("spark.databricks.delta.commitInfo.enabled", "true")
        if user_metadata:
            clone.conf().set(USER_METADATA_CONF, user_metadata)
        else:
            clone.conf().unset(USER_METADATA_CONF)
        sessions = jvm.org.apache.spark.sql.SparkSession
        local = self.check_store(root) == "local"

        def commit() -> int:
            previous = sessions.getActiveSession()
            sessions.setActiveSession(clone)
            try:
                with commit_turn(root) if local else contextlib.nullcontext():
                    return int(txn.commit(seq, operation, tag_map))
            finally:
                if previous.isDefined():
                    sessions.setActiveSession(previous.get())
                else:
                    sessions.clearActiveSession()

        return commit

    def vacuum(self, root: str, *, dry_run: bool) -> list[str]:
        """Delta's own full VACUUM of the table at ``root`` with the table's retention (it
        keeps every file, deletion vectors included, that a version within the retention
        references): the files and empty folders it would delete, relative to ``root`` (a dry
        run), or nothing. (Delta 4.x ignores ``RETAIN`` unless it is 0; ``vacuum.py`` refuses
        any retention but the table's.)"""
        table = jvm_path(root).replace("`", "``")
        statement = f"VACUUM delta.`{table}` FULL{' DRY RUN' if dry_run else ''}"
        try:
            rows = self._jspark.sql(statement).collectAsList()
        except Exception as exc:
            raise EngineRefused(f"Delta's VACUUM refused: {first_line(exc)}") from None
        if not dry_run:
            return []
        return [_relative(root, str(row.getString(0))) for row in rows]


def pair_problem(delta: str, spark: str) -> str | None:
    """Why the delta-spark engine must not run with Delta ``delta`` in Spark ``spark`` (their
    versions as the session's JVM reports them, ``4.4.0`` and ``4.2.0``), naming both and what
    to install instead; None for a pair it was tested with (``TESTED``)."""
    release, line = _minor(delta), _minor(spark)
    tested = TESTED.get(release)
    if tested is not None and tested.spark == line:
        return None
    pairs = " and ".join(f"Delta {d}.x with Spark {t.spark}.x" for d, t in TESTED.items())
    why = (
        f"the session runs Delta {delta} on Spark {spark}, a pair the delta-spark engine was not "
        f"tested with: it reaches Delta's internals, and runs on {pairs}"
    )
    if tested is not None:
        why += (
            f" (Delta {release} as tested here, {tested.package}, is built for Spark {tested.spark}; "
            "in another Spark its calls into Spark can fail inside a job with NoSuchMethodError)"
        )
    fits = next((t for t in TESTED.values() if t.spark == line), None)
    if fits is not None:
        fix = f"Put {fits.package} in the session's spark.jars.packages instead"
    elif tested is not None:
        fix = f"Run it on Spark {tested.spark} ({tested.pyspark})"
    else:
        each = (f"Spark {t.spark} ({t.pyspark}) with {t.package}" for t in TESTED.values())
        fix = "Run " + ", or ".join(each)
    return (
        f"{why}. {fix}, or use engine='delta-rs' where delta-rs can write the table (docs/engines.md "
        "lists the pairs)"
    )


def _minor(version: str) -> str:
    """The ``major.minor`` of a version (``3.5`` of ``3.5.5-amzn-1``), or the whole string."""
    found = re.match(r"\d+\.\d+", version.strip())
    return found.group(0) if found else version


_STORE_CONF = "spark.delta.logStore.{scheme}.impl"
_S3_SCHEMES = ("s3", "s3a", "s3n")
_S3A = "org.apache.hadoop.fs.s3a.S3AFileSystem"
"""Hadoop's S3 file system, in ``hadoop-aws``."""
_DELTA_STORES = ("io.delta.storage.", "org.apache.spark.sql.delta.storage.")
"""Packages of Delta's own log stores (the Java ones and their older Scala twins)."""
_EXCLUSIVE = {
    "S3DynamoDBLogStore": _S3_SCHEMES,
    "GCSLogStore": ("gs",),
    "AzureLogStore": ("abfs", "abfss", "adl", "wasb", "wasbs"),
    "HDFSLogStore": ("hdfs",),
}
"""Delta's log stores that commit a version exclusively across processes and machines, by the
schemes they do so on (Delta's documentation: a DynamoDB lock; GCS preconditions; Azure's and
HDFS's rename, which refuses an existing target)."""
_LOCAL = ("HDFSLogStore", "LocalLogStore")
"""Delta's log stores on local disk: they check that the version is free, then rename, which
replaces on a local (or NFS) file system; Delta serializes the two within one JVM only."""
COMMIT_LOCK = "_mvsink/commit.lock"
"""The file whose lock is a local table's commit turn (``commit_turn``), under its root."""
COMMIT_TURN_TIMEOUT_S = 600.0
"""How long a commit waits for another process's commit to the same local table."""


def _store_kind(name: str, scheme: str) -> str:
    """``JvmDelta.check_store``'s verdict on the log store class ``name`` for ``scheme`` paths."""
    short = name.rsplit(".", 1)[-1] if name.startswith(_DELTA_STORES) else name
    if scheme == "file" and short in _LOCAL:
        if importlib.util.find_spec("fcntl") is None:
            raise EngineUnavailable(
                f"on local disk the session's Delta commits with {short}, which is exclusive within "
                "one JVM only, and mvsink's commit turn across processes needs POSIX file locks, "
                "which this platform does not have"
            )
        return "local"
    if scheme in _EXCLUSIVE.get(short, ()):
        return "store"
    key = _STORE_CONF.format(scheme=scheme)
    if short == "S3SingleDriverLogStore":
        raise EngineUnavailable(
            f"on S3 the session's Delta commits {scheme}:// paths with S3SingleDriverLogStore, which "
            "two writers can both 'win' (no conditional put): configure S3DynamoDBLogStore "
            f"({key}; Delta is handed an s3:// target as s3a://) when the session starts (a "
            "value set later with spark.conf.set is not read) to commit through the JVM Delta "
            "on S3"
        )
    accepted = ", ".join(f"{store} on {'/'.join(schemes)}" for store, schemes in _EXCLUSIVE.items())
    raise EngineUnavailable(
        f"the session's Delta commits {scheme}:// paths with {name} ({key}), which mvsink does not "
        f"know to commit a version exclusively across writers (two could both 'win' it); it "
        f"accepts {accepted}, and {' or '.join(_LOCAL)} on local disk"
    )


@contextlib.contextmanager
def commit_turn(root: str) -> Iterator[None]:
    """Hold the commit turn of the local table at ``root``: an exclusive ``flock`` on its
    ``COMMIT_LOCK``, taken by every mvsink commit through the JVM to the table, for as long as
    Delta's commit call runs (its check that the version is free, its rename, and the files it
    writes for that version after it: checksum, checkpoint).

    Delta's local store checks that the version is free and then renames into place, which
    replaces a file on a local file system: two JVMs committing at once can both land the
    same version, the second replacing the first, and both report success. Taking turns
    makes the second see the version taken. It binds only writers that take the turn: a
    commit by another Delta writer (a Spark job's own write) can still race mvsink's, and on
    NFS the lock holds across machines only where the mount supports locks (``lockd`` or
    NFSv4); ``commit.py`` reads every commit back to catch what is left."""
    import fcntl

    local = root.removeprefix("file://")
    lock = os.path.join(local, COMMIT_LOCK)
    os.makedirs(os.path.dirname(lock), exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + COMMIT_TURN_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise EngineRefused(
                        f"another process held the commit turn of {local} ({lock}) for "
                        f"{COMMIT_TURN_TIMEOUT_S:.0f} s; nothing was committed"
                    ) from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # releases the lock


_OUTPUT_MODES = {"complete": "Complete", "upsert": "Update", "append": "Append"}
"""Spark's output mode (``OutputMode``) a sink mode's epochs are recorded with."""


class _Checked(NamedTuple):
    """The versions a ``JvmDelta`` read of its JVM (fixed while it runs)."""

    delta: str
    spark: str


_JVMS: weakref.WeakKeyDictionary[Any, _Checked] = weakref.WeakKeyDictionary()
"""What was checked of each JVM, by its Python ``SparkContext`` (one a JVM, while it runs)."""
_TABLES: OrderedDict[tuple[str, str], Adds] = OrderedDict()
"""The last ``adds`` answer of each table (root and id), the least recently used first."""
_LOCK = threading.Lock()
_TABLES_KEPT = 64
FILES_KEPT = 200_000
"""The most files a table's kept ``adds`` hold (a few hundred bytes each, their statistics
most); a bigger table's are asked for each epoch, as needed."""
_DV_FIELDS = ("storageType", "pathOrInlineDv", "offset", "sizeInBytes", "cardinality")
"""A deletion vector descriptor's fields in the protocol."""


def _by_path(files: Any) -> dict[str, Mapping[str, Any]]:
    """The add actions of a frame of the JVM snapshot's files (``ADD_FIELDS``), by path."""
    from pyspark.sql import functions as F

    present = [c for c in ADD_FIELDS if c in files.columns]
    table = to_arrow(files.select(F.to_json(F.struct(*present)).alias("add")))
    found = [json.loads(text) for text in table.column("add").to_pylist()]
    return {add["path"]: add for add in found}


def _usable(spark: Any) -> None:
    """Refuse a session whose JVM Delta this engine cannot reach or use."""
    if getattr(spark, "_jsparkSession", None) is None:
        raise EngineUnavailable(
            "the delta-spark engine commits through the session's JVM Delta over py4j, which a "
            "Spark Connect session does not have"
        )
    if os.environ.get("PYSPARK_PIN_THREAD", "true").lower() == "false":
        raise EngineUnavailable(
            "the delta-spark engine makes its one-attempt session active around the commit, "
            "which needs PySpark's pinned threads (PYSPARK_PIN_THREAD is false here)"
        )


def _relative(root: str, path: str) -> str:
    """A path Hadoop printed (``file:/lake/t/x``, ``s3a://b/t/x``), relative to ``root``."""
    from urllib.parse import urlparse

    base = urlparse(jvm_path(root))
    found = urlparse(path)
    prefix = (base.path if base.scheme in ("", "file") else base.netloc + base.path).rstrip("/") + "/"
    full = found.path if found.scheme in ("", "file") else found.netloc + found.path
    if not full.startswith(prefix):
        raise MVSinkError(f"Delta's VACUUM listed {path}, outside the table at {root}")
    return full[len(prefix) :]


def jvm_path(root: str) -> str:
    """The table's root as Hadoop names it: ``file:`` for local disk (not the session's default
    file system), ``s3a://`` for ``s3://``; Azure's ``az://`` has no Hadoop form."""
    if root.startswith("/"):
        return "file://" + root
    if root.startswith("s3://"):
        return "s3a://" + root.removeprefix("s3://")
    if root.startswith(("az://", "azure://")):
        raise EngineUnavailable(
            f"{root}: give the table's abfss:// URI for the session's Delta (Hadoop has no az://)"
        )
    return root


def add_action(
    path: str, size: int, partition_values: Mapping[str, str | None], stats: str, data_change: bool
) -> dict[str, Any]:
    """An ``add`` as the log writes it (``path`` already percent-encoded, relative)."""
    now = int(time.time() * 1000)
    return {
        "add": {
            "path": path,
            "partitionValues": dict(partition_values),
            "size": size,
            "modificationTime": now,
            "dataChange": data_change,
            "stats": stats,
        }
    }


def remove_action(add: Mapping[str, Any], data_change: bool) -> dict[str, Any]:
    """The ``remove`` of the file an ``add`` (as the snapshot holds it) put in the table: the
    same path and deletion vector (together they name the file), with its row ids and tags."""
    kept = ("path", "partitionValues", "size", "stats", "tags", "deletionVector", "baseRowId")
    remove = {k: add[k] for k in (*kept, "defaultRowCommitVersion") if add.get(k) is not None}
    remove.update(
        deletionTimestamp=int(time.time() * 1000), dataChange=data_change, extendedFileMetadata=True
    )
    return {"remove": remove}


def readd_action(
    add: Mapping[str, Any], deletion_vector: Mapping[str, Any], data_change: bool
) -> dict[str, Any]:
    """The ``add`` of a file already in the table with a new ``deletion_vector``: everything
    else as it was (row ids included, so its other rows keep theirs), its statistics marked
    as no longer tight (they may describe rows the vector drops)."""
    again = {k: v for k, v in add.items() if v is not None}
    text = str(again.get("stats") or "{}")
    if "numRecords" not in json.loads(text):
        raise MVSinkError(
            f"{add['path']} has no row count in its statistics: no deletion vector can be added"
        )
    again.update(deletionVector=dict(deletion_vector), stats=_wide(text), dataChange=data_change)
    return {"add": again}


def _wide(stats: str) -> str:
    """``stats.loosened``, its complaint an ``MVSinkError``."""
    try:
        return loosened(stats)
    except ValueError as exc:
        raise MVSinkError(str(exc)) from None


def cdc_action(path: str, size: int, partition_values: Mapping[str, str | None]) -> dict[str, Any]:
    """A ``cdc`` action: a change file (the table's columns and ``_change_type``) that Change
    Data Feed readers take as the commit's changes instead of its added and removed files."""
    return {
        "cdc": {"path": path, "partitionValues": dict(partition_values), "size": size, "dataChange": False}
    }


def txn_action(app_id: str, version: int) -> dict[str, Any]:
    return {"txn": {"appId": app_id, "version": version, "lastUpdated": int(time.time() * 1000)}}
