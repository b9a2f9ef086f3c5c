"""Row fingerprints: two 64-bit hashes of all columns, computed by Spark.

The correction compares fingerprints instead of rows, so a diff moves 16 bytes a row. Two rows
get the same fingerprint when they are equal under mvsink's row equality: all columns
null-safe, NaN equal to NaN, 0.0 equal to -0.0, maps equal regardless of entry order.

Spark's ``xxhash64`` alone is not injective over rows: it skips nulls, so ``(1, NULL)`` and
``(NULL, 1)`` collide, and it does not mix in array lengths, so ``[[1], [2]]`` and
``[[1, 2]]`` collide. Each value is therefore wrapped in a canonical form before hashing:
a null flag in front of every value, the size in front of every array, and maps turned into
arrays of entries sorted by their canonical form. Under a fixed schema the sequence of hashed
atoms then determines the row, and only a 128-bit hash collision could equate two rows.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, MapType, StructType

FP_A = "__mvsink_fp_a"
FP_B = "__mvsink_fp_b"
# Hashing a constant first gives the second hash an independent starting state.
_SECOND_SEED = "mvsink:fingerprint:b"


def quote(name: str) -> str:
    """A column reference that survives dots, spaces and backticks in names."""
    return "`" + name.replace("`", "``") + "`"


def _canonical(col: Column, dtype: DataType) -> Column:
    if isinstance(dtype, StructType):
        if not dtype.fields:
            return col.isNull()
        inner = F.struct(
            *[_canonical(col.getField(f.name), f.dataType).alias(f"f{i}") for i, f in enumerate(dtype.fields)]
        )
        return F.struct(col.isNull(), inner)
    if isinstance(dtype, ArrayType):
        elem = dtype.elementType
        return F.struct(col.isNull(), F.size(col), F.transform(col, lambda e: _canonical(e, elem)))
    if isinstance(dtype, MapType):
        kt, vt = dtype.keyType, dtype.valueType
        entries = F.transform(
            F.map_entries(col),
            lambda e: F.struct(_canonical(e.getField("key"), kt), _canonical(e.getField("value"), vt)),
        )
        return F.struct(col.isNull(), F.size(col), F.array_sort(entries))
    return F.struct(col.isNull(), col)


def fingerprint_columns(schema: StructType) -> tuple[Column, Column]:
    """The two fingerprint columns (``FP_A``, ``FP_B``) of rows of ``schema``."""
    parts = [_canonical(F.col(quote(f.name)), f.dataType) for f in schema.fields]
    a = F.xxhash64(*parts).alias(FP_A)
    b = F.xxhash64(F.lit(_SECOND_SEED), *parts).alias(FP_B)
    return a, b
