"""Row fingerprints: 128 bits per row (two 64-bit lanes), computed from Arrow with numpy.

The correction compares fingerprints instead of rows, so a diff moves 16 bytes a row. Two rows
get the same fingerprint when they are equal under mvsink's row equality: all columns
null-safe, NaN equal to NaN, 0.0 equal to -0.0, maps equal regardless of entry order.

The same function runs wherever rows are held in Arrow: on the driver (desired collected, a
file read back) and inside Spark tasks (``mapInArrow``), so a row hashes the same whether it
came from Spark or from a file. It hashes logical values of the table's canonical Arrow types
(``schema.arrow_schema``), never physical layout: offsets, chunking, dictionary encoding and
the bytes behind nulls do not matter.

Injectivity under a fixed schema: every value carries a null flag; every list and string its
length; list elements and string words (8 bytes) their position; map entries are summed (order-free)
but each is a hashed (key, value) pair; columns and struct fields are chained in order. Each
atom goes through a 64-bit finaliser (murmur3's ``fmix64``) with a lane-specific seed, so two
different rows collide only by a 128-bit accident, not by structure (no polynomial hashing,
which crafted strings defeat).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt
import pyarrow as pa

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]

FINGERPRINT_VERSION = 1
"""Bumped whenever a row's fingerprint changes: stored index entries of another version are
not used (``index.py``)."""
FP_A = "__mvsink_fp_a"
FP_B = "__mvsink_fp_b"

_SEEDS = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F))
_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_K_NULL = np.uint64(0x27D4EB2F165667C5)
_K_POS = np.uint64(0x165667B19E3779F9)
_K_LEN = np.uint64(0xD6E8FEB86659FD93)
_K_COL = np.uint64(0x94D049BB133111EB)
_S33 = np.uint64(33)


def quote(name: str) -> str:
    """A Spark column reference that survives dots, spaces and backticks in names."""
    return "`" + name.replace("`", "``") + "`"


def _fmix(x: U64) -> U64:
    """murmur3's 64-bit finaliser: a bijection that spreads every input bit."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> _S33)
        x = x * _M1
        x = x ^ (x >> _S33)
        x = x * _M2
        return x ^ (x >> _S33)


def _chain(h: U64, part: U64, k: int) -> U64:
    with np.errstate(over="ignore"):
        return _fmix(h ^ (part + np.uint64(k) * _K_COL))


# Rows per slice hashed by one thread (numpy releases the GIL in its loops).
_SLICE_ROWS = 1 << 18


def fingerprints(rows: pa.Table) -> tuple[I64, I64]:
    """The fingerprint lanes ``(a, b)`` of every row of ``rows`` (in its column order)."""
    n = rows.num_rows
    if n <= _SLICE_ROWS:
        return _lanes(rows)
    slices = [rows.slice(i, _SLICE_ROWS) for i in range(0, n, _SLICE_ROWS)]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        parts = list(pool.map(_lanes, slices))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _lanes(rows: pa.Table) -> tuple[I64, I64]:
    n = rows.num_rows
    out = []
    for seed in _SEEDS:
        h = np.full(n, seed, dtype=np.uint64)
        for k, col in enumerate(rows.columns):
            h = _chain(h, _column(col, seed), k)
        out.append(h.view(np.int64))
    return out[0], out[1]


def _column(col: pa.ChunkedArray | pa.Array, seed: np.uint64) -> U64:
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks == 1:
            return _array(col.chunk(0), seed)
        if col.num_chunks == 0:
            return np.zeros(0, dtype=np.uint64)
        return np.concatenate([_array(c, seed) for c in col.chunks])
    return _array(col, seed)


def _nulls(arr: pa.Array) -> npt.NDArray[np.bool_]:
    if arr.null_count == 0:
        return np.zeros(len(arr), dtype=bool)
    return np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def _array(arr: pa.Array, seed: np.uint64) -> U64:
    """One lane of the hash of each value of ``arr``, null flag included."""
    if isinstance(arr, pa.DictionaryArray):
        arr = arr.dictionary_decode()
    null = _nulls(arr)
    value = _values(arr, seed, null)
    with np.errstate(over="ignore"):
        h = _fmix(value ^ seed) + null.astype(np.uint64) * _K_NULL
    return _fmix(h)


def _values(arr: pa.Array, seed: np.uint64, null: npt.NDArray[np.bool_]) -> U64:
    """A 64-bit digest of each non-null value (anything where null: the flag decides)."""
    t = arr.type
    n = len(arr)
    if pa.types.is_struct(t):
        h = np.full(n, seed, dtype=np.uint64)
        for k, child in enumerate(arr.flatten()):
            h = _chain(h, _array(child, seed), k)
        return h
    if pa.types.is_map(t):
        return _nested(arr, seed, ordered=False)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _nested(arr, seed, ordered=True)
    if (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    ):
        return _bytes(arr, seed)
    if pa.types.is_floating(t):
        v = np.asarray(arr.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False), dtype=np.float64)
        v = np.where(v == 0.0, 0.0, v)  # -0.0 is 0.0
        v = np.where(np.isnan(v), np.nan, v)  # one NaN
        return v.view(np.uint64)
    if pa.types.is_decimal(t):
        return _decimal(arr, seed)
    if pa.types.is_boolean(t):
        return np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), dtype=np.uint64)
    if pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_duration(t):
        arr = arr.cast(pa.int64()) if not pa.types.is_date32(t) else arr.cast(pa.int32())
    if pa.types.is_integer(arr.type):
        v = np.asarray(arr.fill_null(0).to_numpy(zero_copy_only=False))
        return v.astype(np.int64).view(np.uint64)
    if pa.types.is_null(t):
        return np.zeros(n, dtype=np.uint64)
    raise TypeError(f"mvsink cannot fingerprint values of type {t}")


def _decimal(arr: pa.Array, seed: np.uint64) -> U64:
    arr = (
        arr.cast(pa.decimal128(arr.type.precision, arr.type.scale))
        if not pa.types.is_decimal128(arr.type)
        else arr
    )
    filled = arr.fill_null(pa.scalar(0, arr.type)) if arr.null_count else arr
    words = np.frombuffer(filled.buffers()[1], dtype=np.uint64)
    words = words[2 * filled.offset : 2 * (filled.offset + len(filled))].reshape(-1, 2)
    return _chain(_fmix(words[:, 0] ^ seed), words[:, 1], 1)


def _segment_sums(parts: U64, lengths: npt.NDArray[np.int64]) -> U64:
    """Sum (mod 2**64) of consecutive runs of ``parts`` of the given lengths."""
    ends = np.cumsum(lengths)
    with np.errstate(over="ignore"):
        total = np.concatenate([np.zeros(1, dtype=np.uint64), np.cumsum(parts, dtype=np.uint64)])
        out: U64 = total[ends] - total[ends - lengths]
        return out


# Bytes of string data hashed at once: the word table takes eight times as much.
_BYTES_AT_ONCE = 1 << 24


def _bytes(arr: pa.Array, seed: np.uint64) -> U64:
    """Length, then each 8-byte little-endian word (the last one zero-padded) chained through
    the finaliser with its index: per value, as many steps as it has words."""
    n = len(arr)
    if n > 1 and arr.nbytes > _BYTES_AT_ONCE:
        # Row-local, so slices hash alike: bound the temporary word table.
        step = max(1, n * _BYTES_AT_ONCE // max(1, arr.nbytes))
        return np.concatenate([_bytes(arr.slice(i, step), seed) for i in range(0, n, step)])
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64 if large else np.int32)[arr.offset : arr.offset + n + 1]
    starts = offsets[:-1].astype(np.int64)
    lengths = np.diff(offsets).astype(np.int64)
    if arr.null_count:
        lengths = np.where(_nulls(arr), 0, lengths)
    with np.errstate(over="ignore"):
        h = _fmix(lengths.astype(np.uint64) * _K_LEN + seed)
    longest = int(lengths.max()) if n else 0
    if longest == 0:
        return h
    lo = int(starts[lengths > 0].min())
    hi = int((starts + lengths).max())
    # Every byte the values use, padded with 8 zero bytes so a word may start at any of them;
    # words[i] is the little-endian word starting at byte lo + i.
    raw = np.zeros(hi - lo + 8, dtype=np.uint8)
    raw[: hi - lo] = np.frombuffer(bufs[2], dtype=np.uint8)[lo:hi]
    words = np.lib.stride_tricks.as_strided(raw, shape=(hi - lo + 1, 8), strides=(1, 1)).copy()
    words = words.view("<u8").reshape(-1)
    rel = starts - lo
    for w in range((longest + 7) // 8):
        active = np.flatnonzero(lengths > 8 * w)
        left = lengths[active] - 8 * w
        word = words[rel[active] + 8 * w]
        short = left < 8
        if short.any():
            keep = (np.uint64(1) << (left[short].astype(np.uint64) * np.uint64(8))) - np.uint64(1)
            word[short] &= keep
        with np.errstate(over="ignore"):
            h[active] = _fmix(h[active] ^ (word + np.uint64(w + 1) * _K_POS))
    return h


def _nested(arr: pa.Array, seed: np.uint64, *, ordered: bool) -> U64:
    """Lists: length and each element keyed by its position. Maps: length and the sum of their
    entries' (key, value) hashes, so entry order does not matter."""
    n = len(arr)
    if pa.types.is_map(arr.type):
        entry = pa.struct([pa.field("key", arr.type.key_type), pa.field("value", arr.type.item_type)])
        arr = arr.cast(pa.list_(entry))
    offsets: I64 = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    lengths: I64 = offsets[1:] - offsets[:-1]
    if arr.null_count:
        lengths = np.where(_nulls(arr), 0, lengths)
    # flatten() honours the array's offset and skips the children of null entries; a map's
    # elements are its (key, value) entries.
    element = _array(arr.flatten(), seed)
    if len(element) != int(lengths.sum()):
        raise AssertionError("list elements do not match list lengths")
    if ordered and len(element):
        pos = np.arange(len(element), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        with np.errstate(over="ignore"):
            element = _fmix(element + pos.astype(np.uint64) * _K_POS)
    else:
        element = _fmix(element)
    sums = _segment_sums(element, lengths) if n else np.zeros(0, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return _fmix(sums ^ (lengths.astype(np.uint64) * _K_LEN + seed))


def with_fingerprints(rows: pa.Table) -> pa.Table:
    """``rows`` with the two fingerprint columns appended."""
    a, b = fingerprints(rows)
    return rows.append_column(FP_A, pa.array(a)).append_column(FP_B, pa.array(b))
