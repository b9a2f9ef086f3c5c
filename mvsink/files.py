"""Reading the target's data files with Spark, partition values included.

Delta data files of a partitioned table do not hold their partition columns; the values live
in the log. Spark's path-based partition discovery garbles escaped and non-ASCII values and
guesses types, so the values are joined in instead, from a small broadcast table keyed by the
file's local path (Spark's file URI, decoded; file names repeat across partition folders).
Every row also carries the URI Spark read it from and its position in that file: the address
a retraction uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from mvsink.fingerprint import quote

URI = "__mvsink_uri"
POS = "__mvsink_pos"
_LOCAL = "__mvsink_local_path"


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


def read_files(
    spark: SparkSession, schema: StructType, partition_by: Sequence[str], files: Sequence[LocalFile]
) -> DataFrame:
    """Rows of ``files`` in the table's columns, plus ``URI`` and ``POS`` (row index in file)."""
    parts = set(partition_by)
    data_schema = StructType([f for f in schema.fields if f.name not in parts])
    meta = F.col("_metadata")
    rows = (
        spark.read.schema(data_schema)
        .parquet(*[f.path for f in files])
        .select("*", meta.getField("file_path").alias(URI), meta.getField("row_index").alias(POS))
    )
    if parts:
        values: dict[str, list[str | None]] = {_LOCAL: [f.path for f in files]}
        for col in partition_by:
            values[col] = [f.partition_values.get(col) for f in files]
        table = pa.table({k: pa.array(v, pa.string()) for k, v in values.items()})
        types = {f.name: f.dataType for f in schema.fields}
        by_path = spark.createDataFrame(table).select(
            F.col(_LOCAL), *[F.col(quote(c)).cast(types[c]).alias(c) for c in partition_by]
        )
        rows = rows.withColumn(_LOCAL, local_path(F.col(URI))).join(F.broadcast(by_path), _LOCAL)
    return rows.select(*[F.col(quote(c)) for c in schema.names], F.col(URI), F.col(POS))
