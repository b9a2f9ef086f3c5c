"""Row fingerprints: 128 bits per row (two 64-bit lanes), defined as a Spark SQL expression.

The correction compares fingerprints instead of rows, so a diff moves 16 bytes a row. Two rows
get the same fingerprint when they are equal under mvsink's row equality: all columns
null-safe, NaN equal to NaN, 0.0 equal to -0.0, maps equal regardless of entry order.

One definition, two evaluators:

* ``spark_lanes``: Spark's own ``xxhash64`` over an encoding of the row (below), evaluated by
  the JVM in the stage that produces desired; only the 16 bytes leave it.
* ``fingerprints``: the same function over Arrow in numpy, for rows read from files (a foreign
  writer's, upsert candidates, the change feed), on the driver or in tasks. It reimplements
  Spark's XXH64 (``hashInt``, ``hashLong``, ``hashUnsafeBytes``) and Spark's way of hashing each
  type; the property tests run both over every supported type and require equal results.

The encoding (per lane, one ``xxhash64`` call, so Spark chains every atom through one hash
state; Spark skips null atoms, so each value brings its own null flag):

* the lane's constant first (it makes the two lanes two different functions);
* per column, in the table's order, ``atoms(value)``:
  - primitive: ``isnull``, then the value (floats with -0.0 made 0.0; Spark hashes every NaN
    alike);
  - struct: ``isnull``, then each field's atoms in order;
  - array: ``isnull``, its size (-1 when null), then each element's atoms as one struct
    (nothing when empty);
  - map: ``isnull``, its size, then over its entries the sums of the low and of the high 32
    bits of ``xxhash64(lane, atoms(key), atoms(value))``, so entry order does not matter and
    repeated entries count (sums of 32-bit halves cannot overflow a long, which Spark's ANSI
    mode would refuse).

Under a fixed schema the atoms parse back unambiguously (flags say which atoms are present,
sizes where lists end), so two different rows collide only by a 128-bit accident. It is not
a cryptographic hash: rows crafted against XXH64 could be made to collide.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, DoubleType, FloatType, MapType, StructType

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
Lanes = tuple[I64, I64]
"""Rows' fingerprints as their two lanes (``fingerprints``), without where the rows live
(``Fingerprints``)."""

FINGERPRINT_VERSION = 2
"""Bumped whenever a row's fingerprint changes: stored index entries of another version are
not used (``index.py``). Version 1 hashed rows in numpy only."""
FP_A = "__mvsink_fp_a"
FP_B = "__mvsink_fp_b"

_LANES = (0x5A17_C0DE_0000_0001, 0x5A17_C0DE_0000_0002)
_SPARK_SEED = np.uint64(42)  # xxhash64's seed in Spark SQL (not settable there)


@dataclass(frozen=True)
class Fingerprints:
    """Row fingerprints. Of persisted rows, where each lives: its file number and position
    (``file``, ``pos``), or each file's first row when the rows lie file after file
    (``starts``), the files in the order of their numbers unless ``numbers`` gives each one's."""

    a: I64
    b: I64
    file: I64 | None = None
    pos: I64 | None = None
    starts: I64 | None = None
    numbers: I64 | None = None

    def __len__(self) -> int:
        return len(self.a)

    @property
    def locatable(self) -> bool:
        return (self.file is not None and self.pos is not None) or self.starts is not None

    def locate(self, rows: I64) -> tuple[I64, I64]:
        """The file numbers and positions of the rows ``rows`` (indices into these)."""
        if self.file is not None and self.pos is not None:
            return self.file[rows], self.pos[rows]
        if self.starts is None:
            if len(rows):
                raise ValueError("these fingerprints do not say where their rows live")
            return rows, rows
        # An empty file starts where the next does: the last file starting at or before a row
        # holds it.
        file = np.searchsorted(self.starts, rows, side="right").astype(np.int64) - 1
        pos = rows - self.starts[file]
        return (file if self.numbers is None else self.numbers[file]), pos

    @staticmethod
    def empty() -> Fingerprints:
        z = np.zeros(0, dtype=np.int64)
        return Fingerprints(z, z, z, z)


def quote(name: str) -> str:
    """A Spark column reference that survives dots, spaces and backticks in names."""
    return "`" + name.replace("`", "``") + "`"


# ---------------------------------------------------------------------------------------------
# The definition, as Spark columns.


def spark_lanes(struct: StructType) -> tuple[Column, Column]:
    """The fingerprint lanes ``(a, b)`` of rows of the table schema ``struct`` (whose columns,
    of exactly these types, are in scope), as Spark columns named ``FP_A`` and ``FP_B``."""
    out = []
    for lane, name in zip(_LANES, (FP_A, FP_B), strict=True):
        atoms = [a for f in struct.fields for a in _atoms(F.col(quote(f.name)), f.dataType, lane)]
        out.append(F.xxhash64(F.lit(lane).cast("long"), *atoms).alias(name))
    return out[0], out[1]


def _atoms(x: Column, t: DataType, lane: int) -> list[Column]:
    flag = F.isnull(x)
    if isinstance(t, StructType):
        return [flag, *[a for f in t.fields for a in _atoms(x.getField(f.name), f.dataType, lane)]]
    if isinstance(t, ArrayType):
        elem = t.elementType

        def wrap(e: Column) -> Column:
            return F.struct(*[a.alias(f"_{i}") for i, a in enumerate(_atoms(e, elem, lane))])

        # Over the positions, not ``transform(x, ...)``: Spark 4's generated code for a lambda
        # over an array read by the vectorized Parquet reader reads a null element's value
        # (and fails on a dictionary with no entries); ``element_at`` checks for null first.
        size = F.size(x)
        positions = F.sequence(F.lit(1), size)
        elements = F.when(size > 0, F.transform(positions, lambda i: wrap(F.element_at(x, i))))
        return [flag, F.coalesce(size, F.lit(-1)), elements]
    if isinstance(t, MapType):
        kt, vt = t.keyType, t.valueType

        def entry(acc: Column, e: Column) -> Column:
            atoms = [*_atoms(e["key"], kt, lane), *_atoms(e["value"], vt, lane)]
            h = F.xxhash64(F.lit(lane).cast("long"), *atoms)
            return F.struct(
                (acc["lo"] + h.bitwiseAND(F.lit(0xFFFFFFFF))).alias("lo"),
                (acc["hi"] + F.shiftrightunsigned(h, 32)).alias("hi"),
            )

        zero = F.lit(0).cast("long")
        folded = F.aggregate(F.map_entries(x), F.struct(zero.alias("lo"), zero.alias("hi")), entry)
        return [flag, F.coalesce(F.size(x), F.lit(-1)), folded["lo"], folded["hi"]]
    if isinstance(t, (FloatType, DoubleType)):
        return [flag, F.when(x == F.lit(0.0), F.lit(0.0).cast(t)).otherwise(x)]
    return [flag, x]


# ---------------------------------------------------------------------------------------------
# The same function over Arrow: Spark's XXH64, vectorised over rows (one hash state per row).

_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)


def _rotl(x: U64, r: int) -> U64:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _fmix(h: U64) -> U64:
    h = h ^ (h >> np.uint64(33))
    h = h * _P2
    h = h ^ (h >> np.uint64(29))
    h = h * _P3
    return h ^ (h >> np.uint64(32))


def _hash_int(v: npt.NDArray[Any], seed: U64) -> U64:
    """Spark's ``XXH64.hashInt`` of 32-bit values ``v`` (any integer dtype, taken as int32)."""
    word = v.astype(np.int32).view(np.uint32).astype(np.uint64)
    h = seed + _P5 + np.uint64(4)
    h = h ^ (word * _P1)
    return _fmix(_rotl(h, 23) * _P2 + _P3)


def _hash_long(v: npt.NDArray[Any], seed: U64) -> U64:
    """Spark's ``XXH64.hashLong`` of 64-bit values ``v``."""
    word = v.astype(np.int64).view(np.uint64)
    h = seed + _P5 + np.uint64(8)
    h = h ^ (_rotl(word * _P2, 31) * _P1)
    return _fmix(_rotl(h, 27) * _P1 + _P4)


def _round(acc: U64, word: U64) -> U64:
    return _rotl(acc + word * _P2, 31) * _P1


def _hash_bytes(data: npt.NDArray[np.uint8], starts: I64, lengths: I64, seed: U64) -> U64:
    """Spark's ``XXH64.hashUnsafeBytes`` of each byte run ``data[starts[i]:][:lengths[i]]``.

    Every row advances through the same steps, each on the rows long enough for it: the
    32-byte stripes (4 accumulators), the 8-byte words, one 4-byte word, the last bytes."""
    padded = np.zeros(len(data) + 8, dtype=np.uint8)
    padded[: len(data)] = data
    # Unaligned little-endian loads at any byte: views with a one-byte stride.
    words = np.ndarray((len(data) + 1,), dtype="<u8", buffer=padded, strides=(1,))
    ints = np.ndarray((len(data) + 1,), dtype="<u4", buffer=padded, strides=(1,))
    n = len(starts)
    h = seed + _P5
    stripes = lengths // 32
    long_rows = np.flatnonzero(stripes)
    if len(long_rows):
        s = seed[long_rows]
        v = [s + _P1 + _P2, s + _P2, s.copy(), s - _P1]
        base = starts[long_rows]
        for k in range(int(stripes.max())):
            on = np.flatnonzero(stripes[long_rows] > k)
            at = base[on] + 32 * k
            for j in range(4):
                v[j][on] = _round(v[j][on], words[at + 8 * j])
        acc = _rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)
        for j in range(4):
            acc = (acc ^ _round(np.zeros_like(v[j]), v[j])) * _P1 + _P4
        h[long_rows] = acc
    h = h + lengths.astype(np.uint64)
    done = stripes * 32
    n_words = (lengths - done) // 8
    for k in range(int(n_words.max()) if n else 0):
        on = np.flatnonzero(n_words > k)
        word = words[starts[on] + done[on] + 8 * k]
        h[on] = _rotl(h[on] ^ _round(np.zeros(len(on), dtype=np.uint64), word), 27) * _P1 + _P4
    done = lengths & ~np.int64(7)
    on = np.flatnonzero(lengths - done >= 4)
    if len(on):
        word = ints[starts[on] + done[on]].astype(np.uint64)
        h[on] = _rotl(h[on] ^ (word * _P1), 23) * _P2 + _P3
        done[on] += 4
    for _ in range(3):
        on = np.flatnonzero(done < lengths)
        if not len(on):
            break
        byte = padded[starts[on] + done[on]].astype(np.uint64)
        h[on] = _rotl(h[on] ^ (byte * _P5), 11) * _P1
        done[on] += 1
    return _fmix(h)


# Rows per slice hashed by one thread (numpy releases the GIL in its loops).
_SLICE_ROWS = 1 << 18


def fingerprints(rows: pa.Table) -> tuple[I64, I64]:
    """The fingerprint lanes ``(a, b)`` of every row of ``rows`` (in its column order, of the
    table's canonical Arrow types): what ``spark_lanes`` gives the same rows in Spark."""
    n = rows.num_rows
    if n <= _SLICE_ROWS:
        return _lanes(rows)
    slices = [rows.slice(i, _SLICE_ROWS) for i in range(0, n, _SLICE_ROWS)]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        parts = list(pool.map(_lanes, slices))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _lanes(rows: pa.Table) -> tuple[I64, I64]:
    out = []
    with np.errstate(over="ignore"):
        for lane in _LANES:
            h = _hash_long(np.full(rows.num_rows, lane, dtype=np.int64), np.full(rows.num_rows, _SPARK_SEED))
            for col in rows.columns:
                h = _absorb(h, _single(col), lane)
            out.append(h.view(np.int64))
    return out[0], out[1]


def _single(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def _nulls(arr: pa.Array) -> npt.NDArray[np.bool_]:
    if arr.null_count == 0:
        return np.zeros(len(arr), dtype=bool)
    return np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def _absorb(h: U64, arr: pa.Array, lane: int) -> U64:
    """The hash states ``h`` (one per value of ``arr``) after the atoms of each value."""
    if isinstance(arr, pa.DictionaryArray):
        arr = arr.dictionary_decode()
    null = _nulls(arr)
    h = _hash_int(null.astype(np.int32), h)
    t = arr.type
    if pa.types.is_struct(t):
        for child in arr.flatten():  # a null struct's fields read as null, as in Spark
            h = _absorb(h, child, lane)
        return h
    if pa.types.is_map(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        return _nested(h, arr, null, lane)
    live = np.flatnonzero(~null)
    if len(live):
        h[live] = _value(arr, live, h[live])
    return h


def _value(arr: pa.Array, live: I64, seed: U64) -> U64:
    """The states after the value atom of the (non-null) values at ``live``."""
    t = arr.type
    large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    if large or pa.types.is_string(t) or pa.types.is_binary(t):
        bufs = arr.buffers()
        offsets = np.frombuffer(bufs[1], dtype=np.int64 if large else np.int32)
        offsets = offsets[arr.offset : arr.offset + len(arr) + 1]
        # Only the bytes these values use: a slice of a big array shares its whole buffer.
        lo, hi = int(offsets[0]), int(offsets[-1])
        data = np.frombuffer(bufs[2], dtype=np.uint8)[lo:hi] if bufs[2] is not None else np.zeros(0, np.uint8)
        starts = offsets[:-1].astype(np.int64)[live] - lo
        return _hash_bytes(data, starts, offsets[1:].astype(np.int64)[live] - lo - starts, seed)
    if pa.types.is_decimal(t):
        return _decimal(arr, live, seed)
    if pa.types.is_null(t):
        return seed
    taken = arr.take(pa.array(live))
    if pa.types.is_timestamp(t) or pa.types.is_duration(t):
        return _hash_long(taken.cast(pa.int64()).to_numpy(), seed)
    if pa.types.is_date32(t):
        return _hash_int(taken.cast(pa.int32()).to_numpy(), seed)
    v = taken.to_numpy(zero_copy_only=False)
    if pa.types.is_float32(t):
        v = np.where(v == 0, np.float32(0), v).astype(np.float32)
        bits = np.where(np.isnan(v), np.int32(0x7FC00000), v.view(np.int32))
        return _hash_int(bits, seed)
    if pa.types.is_float64(t):
        v = np.where(v == 0, 0.0, v).astype(np.float64)
        bits = np.where(np.isnan(v), np.int64(0x7FF8000000000000), v.view(np.int64))
        return _hash_long(bits, seed)
    if pa.types.is_boolean(t):
        return _hash_int(v.astype(np.int32), seed)
    if pa.types.is_int64(t) or pa.types.is_uint32(t) or pa.types.is_uint64(t):
        return _hash_long(v, seed)
    if pa.types.is_integer(t):  # byte, short, int: Spark hashes them as ints
        return _hash_int(v, seed)
    raise TypeError(f"mvsink cannot fingerprint values of type {t}")


def _decimal(arr: pa.Array, live: I64, seed: U64) -> U64:
    """Spark hashes a decimal of up to 18 digits as its unscaled long, a wider one as the bytes
    of its unscaled ``BigInteger`` (``toByteArray``: big-endian two's complement, shortest)."""
    t = arr.type
    if not pa.types.is_decimal128(t):
        arr = arr.cast(pa.decimal128(t.precision, t.scale))
    words = np.frombuffer(arr.buffers()[1], dtype=np.uint64)[2 * arr.offset : 2 * (arr.offset + len(arr))]
    words = words.reshape(-1, 2)[live]
    lo, hi = words[:, 0], words[:, 1]
    if t.precision <= 18:
        return _hash_long(lo.view(np.int64), seed)
    negative = hi.view(np.int64) < 0
    mag_lo, mag_hi = np.where(negative, ~lo, lo), np.where(negative, ~hi, hi)
    bits = np.where(mag_hi != 0, 64 + _bit_length(mag_hi), _bit_length(mag_lo))
    size = bits // 8 + 1
    big_endian = np.stack([hi, lo], axis=1).astype(">u8").view(np.uint8).reshape(-1, 16)
    keep = np.arange(16)[None, :] >= (16 - size)[:, None]
    data = big_endian[keep]
    starts = np.concatenate([[0], np.cumsum(size)[:-1]]).astype(np.int64)
    return _hash_bytes(data, starts, size.astype(np.int64), seed)


def _bit_length(x: U64) -> I64:
    x = x.copy()
    out = np.zeros(len(x), dtype=np.int64)
    for shift in (32, 16, 8, 4, 2, 1):
        big = (x >> np.uint64(shift)) != 0
        out[big] += shift
        x[big] >>= np.uint64(shift)
    out += x != 0
    return out


def _nested(h: U64, arr: pa.Array, null: npt.NDArray[np.bool_], lane: int) -> U64:
    """Arrays: the size (-1 when null), then each element's atoms, in order, through the row's
    state. Maps: the size, then the sums of their entries' own hashes' 32-bit halves."""
    is_map = pa.types.is_map(arr.type)
    if is_map:
        entry = pa.struct([pa.field("key", arr.type.key_type), pa.field("value", arr.type.item_type)])
        arr = arr.cast(pa.list_(entry))
    offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    sizes = np.where(null, 0, offsets[1:] - offsets[:-1])
    h = _hash_int(np.where(null, -1, sizes), h)
    # flatten() honours the array's offset and skips the children of null entries.
    values = arr.flatten()
    firsts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    live = np.flatnonzero(~null)
    if is_map:
        seeds = _hash_long(np.full(len(values), lane, dtype=np.int64), np.full(len(values), _SPARK_SEED))
        keys, items = values.flatten()
        e = _absorb(_absorb(seeds, keys, lane), items, lane)
        for half in (e & np.uint64(0xFFFFFFFF), e >> np.uint64(32)):  # summed apart: no overflow
            total = np.concatenate([np.zeros(1, np.uint64), np.cumsum(half, dtype=np.uint64)])
            h[live] = _hash_long((total[firsts + sizes] - total[firsts])[live], h[live])
        return h
    for k in range(int(sizes.max()) if len(sizes) else 0):
        on = np.flatnonzero(sizes > k)
        h[on] = _absorb(h[on], values.take(pa.array(firsts[on] + k)), lane)
    return h
