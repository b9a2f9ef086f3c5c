"""The ``delta-spark`` engine: commits through the JVM Delta runtime of the user's own session.

delta-rs cannot write some tables Spark users have (row tracking, liquid clustering, ...). The
session's JVM Delta can, and gives the same strict compare-and-append: a transaction started
on the snapshot an epoch planned on, with every file read (``readWholeTable``), and one
attempt only (``maxCommitAttempts = 0`` on a cloned session made active just around the
commit, so the user's session is untouched). Any commit that landed since that snapshot, of
any kind, makes it fail; the caller then decides from the log what happened
(``delta.compare_and_append``).

Actions are given as their Delta-log JSON (``Action.fromJson``): the JSON is the protocol and
stable across releases, the Scala constructors are not. mvsink's commit metadata goes into the
commit's ``tags`` (the JVM writes only its own ``commitInfo`` fields) and the one-line summary
into ``userMetadata``. The JVM fills in what the table's features need (row ids and their
high-water mark, ...).

Everything here is a Delta internal reached through py4j: classic sessions only (Spark Connect
has no py4j), checked against the Delta versions it was tested with (``TESTED``). This is the
only module that knows them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from mvsink.errors import MVSinkError

TESTED = ("4.4.",)
"""Delta releases (prefixes) whose internals this module was tested against."""
ENGINES = ("auto", "delta-rs", "delta-spark")
COMMIT_CONF = "spark.databricks.delta.maxCommitAttempts"
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"


class Unavailable(MVSinkError):
    """The session has no JVM Delta this engine can use (the message says why)."""


class JvmDelta:
    """The JVM Delta of one classic Spark session."""

    def __init__(self, spark: Any) -> None:
        jspark = getattr(spark, "_jsparkSession", None)
        if jspark is None:
            raise Unavailable(
                "the delta-spark engine commits through the session's JVM Delta over py4j, which a "
                "Spark Connect session does not have"
            )
        self._jvm = spark._jvm
        self._jspark = jspark
        try:
            self.version = str(self._module("io.delta.package$").VERSION())
        except Exception:
            raise Unavailable(
                "the delta-spark engine needs Delta in the Spark session (delta-spark's jars, "
                "'spark.sql.extensions' = io.delta.sql.DeltaSparkSessionExtension)"
            ) from None
        if not self.version.startswith(TESTED):
            raise Unavailable(
                f"the delta-spark engine was tested with Delta {', '.join(t + 'x' for t in TESTED)}; "
                f"this session runs Delta {self.version}, whose internals it does not know"
            )

    def _module(self, name: str) -> Any:
        """A Scala object (``Foo$.MODULE$``) by class name."""
        jvm = self._jvm
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        return jvm.java.lang.Class.forName(name, True, loader).getField("MODULE$").get(None)

    def _seq(self, items: Sequence[Any]) -> Any:
        array = self._jvm.java.util.ArrayList()
        for item in items:
            array.add(item)
        return self._jvm.scala.jdk.javaapi.CollectionConverters.asScala(array).toList()

    def _map(self, items: Mapping[str, str]) -> Any:
        table = self._jvm.java.util.HashMap()
        for key, value in items.items():
            table.put(key, value)
        scala = self._jvm.scala.jdk.javaapi.CollectionConverters.asScala(table)
        return getattr(self._module("scala.collection.immutable.Map$"), "from")(scala)

    def commit(
        self,
        root: str,
        read_version: int,
        actions: Sequence[Mapping[str, Any]],
        tags: Mapping[str, str],
        user_metadata: str | None,
    ) -> int:
        """Commit ``actions`` (Delta-log JSON objects) as version ``read_version + 1`` of the
        table at ``root``, or raise: strictly on top of ``read_version``, one attempt."""
        jvm = self._jvm
        none = jvm.scala.Option.empty()
        delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(self._jspark, jvm_path(root))
        snapshot = delta_log.getSnapshotAt(read_version, none, none, False)
        txn = delta_log.startTransaction(none, jvm.scala.Some(snapshot))
        txn.readWholeTable()  # any data change since read_version conflicts
        from_json = jvm.org.apache.spark.sql.delta.actions.Action.fromJson
        seq = self._seq([from_json(json.dumps(a, separators=(",", ":"))) for a in actions])
        operation = self._module("org.apache.spark.sql.delta.DeltaOperations$ManualUpdate$")
        clone = self._jspark.cloneSession()
        clone.conf().set(COMMIT_CONF, "0")
        if user_metadata:
            clone.conf().set(USER_METADATA_CONF, user_metadata)
        else:
            clone.conf().unset(USER_METADATA_CONF)
        sessions = jvm.org.apache.spark.sql.SparkSession
        previous = sessions.getActiveSession()
        sessions.setActiveSession(clone)
        try:
            return int(txn.commit(seq, operation, self._map(tags)))
        finally:
            if previous.isDefined():
                sessions.setActiveSession(previous.get())
            else:
                sessions.clearActiveSession()


def jvm_path(root: str) -> str:
    """The table's root as Hadoop names it (``s3://`` is ``s3a://`` to Spark users' Hadoop)."""
    return "s3a://" + root.removeprefix("s3://") if root.startswith("s3://") else root


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


def remove_action(
    path: str, size: int, partition_values: Mapping[str, str | None], data_change: bool
) -> dict[str, Any]:
    """A ``remove`` of a file the log lists as ``path``."""
    return {
        "remove": {
            "path": path,
            "deletionTimestamp": int(time.time() * 1000),
            "dataChange": data_change,
            "extendedFileMetadata": True,
            "partitionValues": dict(partition_values),
            "size": size,
        }
    }


def txn_action(app_id: str, version: int) -> dict[str, Any]:
    return {"txn": {"appId": app_id, "version": version, "lastUpdated": int(time.time() * 1000)}}
