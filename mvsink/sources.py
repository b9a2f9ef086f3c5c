"""``mvsink-delta``: a Delta table's appended rows as a Spark stream, version by version.

A Spark 4 Python data source (no connector jar): register it, then read a Delta table (on
local disk or an object store) as a stream whose offset is the Delta version::

    from mvsink.sources import register
    register(spark)
    stream = (spark.readStream.format("mvsink-delta")
              .option("path", "s3://bucket/bronze/orders")
              .option("AWS_REGION", "eu-west-1")          # any other option: storage_options
              .load())

Each micro-batch reads the versions after the last one it read, up to the latest (at most
``maxVersionsPerTrigger`` of them when given): the rows of the files each version *adds with a
data change*. A version that only rearranges rows (a compaction, ``dataChange = false``) adds
nothing; a version that deletes or rewrites rows is not a pure append and is refused, since its
removed rows cannot be told apart from rows that stay (use a view over the table instead). The
offset, ``{"version": v}``, is the same for every query reading the table, which is what
replicas need to share a clock. Versions are read from the commit files of the Delta log
through the sink's I/O layer (``storage.Store``), one input partition per added file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

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


from mvsink.delta import DataFile, check_features, table_root
from mvsink.errors import InputError, Where
from mvsink.schema import arrow_schema
from mvsink.storage import Store

NAME = "mvsink-delta"
_OWN = {"path", "maxversionspertrigger", "startingversion"}


def register(spark: Any) -> None:
    """Make ``spark.readStream.format("mvsink-delta")`` available in this session."""
    spark.dataSource.register(DeltaVersions)


class DeltaVersions(DataSource):
    """The ``mvsink-delta`` source (see the module doc)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def _settings(self) -> tuple[str, dict[str, str]]:
        path = self.options.get("path")
        if not path:
            raise InputError("the mvsink-delta source needs option 'path' (the Delta table)")
        storage = {k: str(v) for k, v in self.options.items() if k.lower() not in _OWN}
        return table_root(str(path)), storage

    def schema(self) -> StructType:
        root, storage = self._settings()
        table = DeltaTable(root, storage_options=storage or None)
        # Files of such tables do not hold rows as their names say: refuse, never misread.
        check_features(table, Where(target=root))
        return StructType.fromJson(json.loads(table.schema().to_json()))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        root, storage = self._settings()
        limit = self.options.get("maxVersionsPerTrigger")
        start = self.options.get("startingVersion")
        return _VersionReader(
            root, storage, schema, int(limit) if limit else None, int(start) if start else 0
        )


@dataclass(frozen=True)
class _AddedFile(InputPartition):
    """One file a version added: the unit of work of one task."""

    version: int
    path: str
    size: int
    partition_values: Mapping[str, str | None]


class _VersionReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(
        self, root: str, storage: dict[str, str], schema: StructType, limit: int | None, start: int
    ) -> None:
        self.store = Store(root, storage)
        self.schema = schema
        self.limit = limit
        self.start = start
        self.until: int | None = None  # availableNow: the version latest when the run began

    def initialOffset(self) -> dict[str, int]:
        return {"version": self.start - 1}

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
        return {"version": latest}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        out: list[InputPartition] = []
        for version in range(int(start["version"]) + 1, int(end["version"]) + 1):
            out.extend(self._added(version))
        return out

    def _added(self, version: int) -> list[_AddedFile]:
        data = self.store.get(f"_delta_log/{version:020d}.json")
        if data is None:
            raise InputError(
                f"Delta version {version} of {self.store.root} is no longer in the log (log "
                "retention passed it): the stream cannot continue from there; start a new query "
                "with a later startingVersion"
            )
        added = []
        for line in data.to_pybytes().decode().splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            meta = action.get("metaData")
            if meta and StructType.fromJson(json.loads(meta["schemaString"])) != self.schema:
                raise InputError(
                    f"Delta version {version} of {self.store.root} changes the table's schema: the "
                    "stream keeps the schema it started with; start a new query (a new checkpoint) "
                    "from this version to read the new one"
                )
            if "remove" in action and action["remove"].get("dataChange", True):
                raise InputError(
                    f"Delta version {version} of {self.store.root} removes rows "
                    f"({action['remove']['path']}): the mvsink-delta source reads appends only"
                )
            add = action.get("add")
            if add and add.get("dataChange", True):
                added.append(
                    _AddedFile(version, add["path"], int(add["size"]), add.get("partitionValues") or {})
                )
        return added

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _AddedFile)
        file = DataFile(partition.path, partition.size, None, dict(partition.partition_values))
        schema = arrow_schema(self.schema)
        rows = self.store.read(file, schema, list(partition.partition_values))
        yield from rows.to_batches()

    def commit(self, end: dict[str, int]) -> None:
        pass
