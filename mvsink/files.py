"""Reading the target's data files with Spark, partition values included.

Delta data files of a partitioned table do not hold their partition columns; the values live
in the log. Spark's path-based partition discovery garbles escaped and non-ASCII values and
guesses types, so the values are joined in instead, from a small broadcast table keyed by the
URI Spark gives each file (``_metadata.file_path``; file names repeat across partition folders).
Every row also carries the number of its file (its index in the list read) and its position
in that file: the address a retraction uses, 12 bytes instead of a path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from mvsink.errors import InvariantViolation
from mvsink.fingerprint import quote

FILE = "__mvsink_file"
POS = "__mvsink_pos"
_URI = "__mvsink_uri"
# Characters Hadoop's path globbing interprets; a backslash makes them literal.
_GLOB = re.compile(r"([\\\[\]{}*?])")


@dataclass(frozen=True)
class LocalFile:
    """A data file on local disk and the partition values the Delta log gives it."""

    path: str
    partition_values: Mapping[str, str | None] = field(default_factory=dict)


def literal_path(path: str) -> str:
    """``path`` escaped so that Spark's reader takes it literally, not as a glob pattern."""
    return _GLOB.sub(r"\\\1", path)


def _canonical_uri(uri: str) -> str:
    """Spark lists local files as ``file:///p`` but reports rows' files as ``file:/p``: one form
    for both (the same rewrite is applied in Spark, so a form Spark changes stays matched)."""
    return "file:/" + uri.removeprefix("file:///") if uri.startswith("file:///") else uri


def read_files(
    spark: SparkSession, schema: StructType, partition_by: Sequence[str], files: Sequence[LocalFile]
) -> DataFrame:
    """Rows of ``files`` in the table's columns, plus ``FILE`` (the file's index in ``files``)
    and ``POS`` (the row's index in its file)."""
    parts = set(partition_by)
    data_schema = StructType([f for f in schema.fields if f.name not in parts])
    reader = spark.read.schema(data_schema).parquet(*[literal_path(f.path) for f in files])
    # Spark names each file by a URI of its own making; ask it for them once (no job), so rows
    # are matched to files by plain string equality instead of decoding a path per row.
    number = {f.path: i for i, f in enumerate(files)}
    uris = [_canonical_uri(u) for u in reader.inputFiles()]
    try:
        numbers = [number[unquote(urlparse(u).path)] for u in uris]
    except KeyError as exc:
        raise InvariantViolation(f"Spark lists a file that was not asked for: {exc}") from None
    if len(set(numbers)) != len(files):
        raise InvariantViolation(f"Spark lists {len(set(numbers))} of the {len(files)} files asked for")
    values: dict[str, pa.Array] = {
        _URI: pa.array(uris, pa.string()),
        FILE: pa.array(numbers, pa.int32()),
    }
    for col in partition_by:
        values[col] = pa.array([files[i].partition_values.get(col) for i in numbers], pa.string())
    types = {f.name: f.dataType for f in schema.fields}
    by_uri = spark.createDataFrame(pa.table(values)).select(
        F.col(_URI), F.col(FILE), *[F.col(quote(c)).cast(types[c]).alias(c) for c in partition_by]
    )
    meta = F.col("_metadata")
    uri = F.regexp_replace(meta.getField("file_path"), "^file:///", "file:/")
    rows = reader.select("*", uri.alias(_URI), meta.getField("row_index").alias(POS))
    rows = rows.join(F.broadcast(by_uri), _URI)
    return rows.select(*[F.col(quote(c)) for c in schema.names], F.col(FILE), F.col(POS))
