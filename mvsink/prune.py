"""Pruning: which of a snapshot's files may hold one of a set of keys.

A file is skipped only when the log proves it holds none of the keys: its partition values
differ from every key's, or for some key column every key lies outside the file's recorded
[min, max]. Vectorised: one pass over the files, one sort of the keys per partition group.

Recorded bounds are taken as possibly truncated, since other writers (delta-rs, Delta on the
JVM) truncate them, and a bound read as exact would skip the file holding a stored row:
timestamps are widened by a millisecond on each side, and a string max ``m`` is read as
"every string that starts with ``m``" (the bound may be a prefix of the real max).
Bounds of other types (integers, dates, decimals) are exact in every writer we know.
Columns whose bounds are unknown for a file, or of a type not listed, prune nothing there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mvsink.delta import Snapshot

_MS = 1000  # microseconds in the truncation step of timestamp statistics
_TOP = "\U0010ffff"


def candidate_files(snap: Snapshot, keys: pa.Table, key: Sequence[str]) -> list[int]:
    """Indices into ``snap.files`` of the files that may hold a row whose key is in ``keys``."""
    n = len(snap.files)
    if n == 0 or keys.num_rows == 0:
        return []
    part_keys = [k for k in key if k in snap.partition_by]
    range_keys = [k for k in key if k not in snap.partition_by]
    # Group keys and files by the key's partition columns (as the log writes them, strings).
    key_groups: dict[tuple[str | None, ...], np.ndarray] = {}
    if part_keys:
        texts = [pc.cast(keys.column(k), pa.string()).to_pylist() for k in part_keys]
        grouped: dict[tuple[str | None, ...], list[int]] = {}
        for i, group in enumerate(zip(*texts, strict=True)):
            grouped.setdefault(group, []).append(i)
        key_groups = {g: np.asarray(rows, dtype=np.int64) for g, rows in grouped.items()}
    else:
        key_groups[()] = np.arange(keys.num_rows)
    file_groups: dict[tuple[str | None, ...], list[int]] = {}
    for i, f in enumerate(snap.files):
        group = tuple(f.partition_values.get(k) for k in part_keys)
        if group in key_groups:
            file_groups.setdefault(group, []).append(i)
    if not range_keys:
        return sorted(i for rows in file_groups.values() for i in rows)
    columns: dict[str, np.ndarray] = {}
    bounds: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for k in range_keys:
        values, found = _comparable(keys.column(k).combine_chunks()), _file_bounds(snap, k)
        if (
            values is not None
            and found is not None
            and (values.dtype == object) == (found[0].dtype == object)
        ):
            columns[k], bounds[k] = values, found
    out: list[int] = []
    for group, file_rows in file_groups.items():
        idx = np.asarray(file_rows, dtype=np.int64)
        keep = np.ones(len(idx), dtype=bool)
        for k, values in columns.items():
            lo, hi, known = (b[idx] for b in bounds[k])
            keep &= ~known | _any_between(np.sort(values[key_groups[group]]), lo, hi, known)
        out.extend(idx[keep].tolist())
    return sorted(out)


def _comparable(values: pa.Array) -> np.ndarray | None:
    """Key values as a numpy array ordered like the column, or None (a type we do not prune)."""
    t = values.type
    if pa.types.is_timestamp(t):
        ints = values.cast(pa.timestamp("us", tz=t.tz)).cast(pa.int64())
    elif pa.types.is_date(t):
        ints = values.cast(pa.date32()).cast(pa.int32()).cast(pa.int64())
    elif pa.types.is_integer(t):
        ints = values.cast(pa.int64())
    else:
        ints = None
    if ints is not None:
        return np.asarray(ints.to_numpy(zero_copy_only=False), dtype=np.int64)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_decimal(t):
        return np.array(values.to_pylist(), dtype=object)
    return None


def _file_bounds(snap: Snapshot, column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per file: an inclusive lower bound, an upper bound (exclusive, except for decimals), and
    whether both are known; None if the column's statistics are of a type we do not prune on.

    Widened for truncation as the module doc says.
    """
    found = snap.bounds(column)
    if found is None:
        return None
    lo_arr, hi_arr = found
    t = lo_arr.type
    known = lo_arr.is_valid().to_numpy(zero_copy_only=False) & hi_arr.is_valid().to_numpy(
        zero_copy_only=False
    )
    mask = pa.array(known)
    lo_known, hi_known = _comparable(lo_arr.filter(mask)), _comparable(hi_arr.filter(mask))
    if lo_known is None or hi_known is None:
        return None
    lo = np.zeros(len(known), dtype=lo_known.dtype)
    hi = np.zeros(len(known), dtype=hi_known.dtype)
    lo[known], hi[known] = lo_known, hi_known
    if pa.types.is_timestamp(t):
        return lo - _MS, hi + _MS + 1, known
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        hi[known] = [_after_prefix(str(v)) for v in hi_known]
        return lo, hi, known
    if hi.dtype == object:  # decimals: compared inclusively
        return lo, hi, known
    return lo, hi + 1, known


def _after_prefix(text: str) -> str | None:
    """The least string greater than every string that starts with ``text`` (None: none)."""
    chars = list(text)
    while chars and chars[-1] == _TOP:
        chars.pop()
    if not chars:
        return None
    chars[-1] = chr(ord(chars[-1]) + 1)
    return "".join(chars)


def _any_between(sorted_keys: np.ndarray, lo: np.ndarray, hi: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Per file: whether some key k has lo <= k < hi (for decimals lo <= k <= hi; a string hi
    of None: no upper bound)."""
    out = np.zeros(len(lo), dtype=bool)
    if not len(sorted_keys):
        return out
    where = np.flatnonzero(known)
    if sorted_keys.dtype == object:
        for i in where:
            start = np.searchsorted(sorted_keys, lo[i], side="left")
            if start >= len(sorted_keys):
                continue
            upper = hi[i]
            first = sorted_keys[start]
            if upper is None:
                out[i] = True
            elif isinstance(upper, str):
                out[i] = first < upper
            else:
                out[i] = first <= upper  # decimals: hi is inclusive
        return out
    start = np.searchsorted(sorted_keys, lo[where], side="left")
    stop = np.searchsorted(sorted_keys, hi[where], side="left")
    out[where] = stop > start
    return out
