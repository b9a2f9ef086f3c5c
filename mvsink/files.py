"""Reading the target's data files with Spark, partition values included.

Delta data files of a partitioned table do not hold their partition columns; the values live
in the log. Spark's path-based partition discovery garbles escaped and non-ASCII values and
guesses types, so the values are joined in instead, from a small broadcast table keyed by the
file's local path (Spark's file URI, decoded; file names repeat across partition folders).
Every row also carries the number of its file (its index in the list read) and its position
in that file: the address a retraction uses, 12 bytes instead of a path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from mvsink.fingerprint import quote

FILE = "__mvsink_file"
POS = "__mvsink_pos"
_LOCAL = "__mvsink_local_path"
# Characters Hadoop's path globbing interprets; a backslash makes them literal.
_GLOB = re.compile(r"([\\\[\]{}*?])")


@dataclass(frozen=True)
class LocalFile:
    """A data file on local disk and the partition values the Delta log gives it."""

    path: str
    partition_values: Mapping[str, str | None] = field(default_factory=dict)


def local_path(uri: Column) -> Column:
    """Spark's ``file:`` URI of a file as the local path it names (as ``urllib``'s unquote would).

    ``url_decode`` reads '+' as a space, so a literal '+' is protected first.
    """
    path = F.regexp_replace(uri, r"^file:(//)?", "")
    return F.url_decode(F.regexp_replace(path, r"\+", "%2B"))


def literal_path(path: str) -> str:
    """``path`` escaped so that Spark's reader takes it literally, not as a glob pattern."""
    return _GLOB.sub(r"\\\1", path)


def read_files(
    spark: SparkSession, schema: StructType, partition_by: Sequence[str], files: Sequence[LocalFile]
) -> DataFrame:
    """Rows of ``files`` in the table's columns, plus ``FILE`` (the file's index in ``files``)
    and ``POS`` (the row's index in its file)."""
    parts = set(partition_by)
    data_schema = StructType([f for f in schema.fields if f.name not in parts])
    meta = F.col("_metadata")
    rows = (
        spark.read.schema(data_schema)
        .parquet(*[literal_path(f.path) for f in files])
        .select(
            "*", local_path(meta.getField("file_path")).alias(_LOCAL), meta.getField("row_index").alias(POS)
        )
    )
    values: dict[str, pa.Array] = {
        _LOCAL: pa.array([f.path for f in files], pa.string()),
        FILE: pa.array(range(len(files)), pa.int32()),
    }
    for col in partition_by:
        values[col] = pa.array([f.partition_values.get(col) for f in files], pa.string())
    types = {f.name: f.dataType for f in schema.fields}
    by_path = spark.createDataFrame(pa.table(values)).select(
        F.col(_LOCAL), F.col(FILE), *[F.col(quote(c)).cast(types[c]).alias(c) for c in partition_by]
    )
    rows = rows.join(F.broadcast(by_path), _LOCAL)
    return rows.select(*[F.col(quote(c)) for c in schema.names], F.col(FILE), F.col(POS))
