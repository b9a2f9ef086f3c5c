"""Pruning: which of a snapshot's files may hold one of a set of keys.

A file is skipped only when the log proves it holds none of the keys: its partition values
differ from every key's, or for some key column every key lies outside the file's recorded
[min, max]. Vectorised: one pass over the files, one sort of the keys per partition group.

Recorded bounds are taken as possibly truncated, since other writers (delta-rs, Delta on the
JVM) truncate them, and a bound read as exact would skip the file holding a stored row:

* timestamps are widened by a millisecond on each side;
* a string max ``m`` is read as "every string that starts with ``m``" (it may be a prefix);
* integers and dates are exact in every writer we know;
* anything else prunes nothing (decimals, for one, pass through a float in delta-rs).

Partition values are compared as the log writes them (strings) for key columns of the types
mvsink partitions by (string, integers, date, boolean); a key column that partitions a foreign
table by another type prunes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mvsink.table.delta import Snapshot

_MS = 1000  # microseconds in the truncation step of timestamp statistics
_TOP = "\U0010ffff"
_I64 = np.iinfo(np.int64)
_ROW = "__mvsink_row"


def candidate_files(snap: Snapshot, keys: pa.Table, key: Sequence[str]) -> list[int]:
    """Indices into ``snap.files`` of the files that may hold a row whose key is in ``keys``."""
    if not snap.files or keys.num_rows == 0:
        return []
    part_keys = [k for k in key if k in snap.partition_by and _text_partition(keys.column(k).type)]
    key_groups = _key_groups(keys, part_keys)
    file_groups: dict[tuple[str | None, ...], list[int]] = {}
    for i, f in enumerate(snap.files):
        group = tuple(f.partition_values.get(k) for k in part_keys)
        if group in key_groups:
            file_groups.setdefault(group, []).append(i)
    columns: dict[str, np.ndarray] = {}
    bounds: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for k in key:
        if k in snap.partition_by:
            continue
        values, found = _comparable(keys.column(k).combine_chunks()), _file_bounds(snap, k)
        if values is not None and found is not None and values.dtype == found[0].dtype:
            columns[k], bounds[k] = values, found
    out: list[int] = []
    for group, file_rows in file_groups.items():
        idx = np.asarray(file_rows, dtype=np.int64)
        keep = np.ones(len(idx), dtype=bool)
        for k, values in columns.items():
            lo, hi, known = (b[idx] for b in bounds[k])
            keep &= ~known | _any_within(np.sort(values[key_groups[group]]), lo, hi, known)
        out.extend(idx[keep].tolist())
    return sorted(out)


def files_in_ranges(snap: Snapshot, ranges: pa.Table, key: Sequence[str]) -> list[int]:
    """Indices into ``snap.files`` of the files that may hold a key within ``ranges``: a row per
    group of touched keys sharing their partition key values (key columns that partition the
    table, as the log writes them), with the group's least and greatest value of every other
    key column in ``lo.<column>`` and ``hi.<column>``. Coarser than ``candidate_files`` (a
    file between two touched keys is read), but needs no key on the driver."""
    if not snap.files or ranges.num_rows == 0:
        return []
    part_keys = [k for k in key if k in snap.partition_by and k in ranges.column_names]
    groups = ranges.select(part_keys).to_pylist() if part_keys else [{}] * ranges.num_rows
    by_group: dict[tuple[str | None, ...], list[int]] = {}
    for row, values in enumerate(groups):
        by_group.setdefault(tuple(values[k] for k in part_keys), []).append(row)
    file_groups: dict[tuple[str | None, ...], list[int]] = {}
    for i, f in enumerate(snap.files):
        group = tuple(f.partition_values.get(k) for k in part_keys)
        if group in by_group:
            file_groups.setdefault(group, []).append(i)
    bounds = {}
    for k in key:
        if k in snap.partition_by or f"lo.{k}" not in ranges.column_names:
            continue
        lo_keys = _comparable(ranges.column(f"lo.{k}").combine_chunks())
        hi_keys = _comparable(ranges.column(f"hi.{k}").combine_chunks())
        found = _file_bounds(snap, k)
        if (
            lo_keys is not None
            and hi_keys is not None
            and found is not None
            and lo_keys.dtype == found[0].dtype
        ):
            bounds[k] = (lo_keys, hi_keys, found)
    out: list[int] = []
    for group, file_rows in file_groups.items():
        idx = np.asarray(file_rows, dtype=np.int64)
        keep = np.zeros(len(idx), dtype=bool)
        for row in by_group[group]:
            hit = np.ones(len(idx), dtype=bool)
            for lo_keys, hi_keys, (lo, hi, known) in bounds.values():
                kmin, kmax = lo_keys[row], hi_keys[row]
                f_lo, f_hi, f_known = lo[idx], hi[idx], known[idx]
                if hi.dtype == object:  # an exclusive upper bound, None: none
                    overlap = np.array(
                        [
                            bool(k) and lo_ <= kmax and (u is None or kmin < u)
                            for lo_, u, k in zip(f_lo, f_hi, f_known, strict=True)
                        ],
                        dtype=bool,
                    )
                else:
                    overlap = (f_lo <= kmax) & (kmin <= f_hi)
                hit &= ~f_known | overlap
            keep |= hit
        out.extend(idx[keep].tolist())
    return sorted(out)


def _text_partition(t: pa.DataType) -> bool:
    """Whether casting a key of type ``t`` to string gives the log's partition value."""
    return bool(
        pa.types.is_string(t) or pa.types.is_integer(t) or pa.types.is_date32(t) or pa.types.is_boolean(t)
    )


def _key_groups(keys: pa.Table, part_keys: Sequence[str]) -> dict[tuple[str | None, ...], np.ndarray]:
    """Row numbers of ``keys`` per tuple of partition values (as the log writes them)."""
    if not part_keys:
        return {(): np.arange(keys.num_rows)}
    texts = pa.table(
        {
            **{k: pc.cast(keys.column(k), pa.string()) for k in part_keys},
            _ROW: pa.array(np.arange(keys.num_rows)),
        }
    )
    grouped = texts.group_by(list(part_keys), use_threads=False).aggregate([(_ROW, "list")])
    values = zip(*[grouped.column(k).to_pylist() for k in part_keys], strict=True)
    rows = grouped.column(f"{_ROW}_list").to_pylist()
    return {tuple(v): np.asarray(r, dtype=np.int64) for v, r in zip(values, rows, strict=True)}


def _comparable(values: pa.Array) -> np.ndarray | None:
    """Values as a numpy array ordered like the column, or None (a type we do not prune on)."""
    t = values.type
    if pa.types.is_timestamp(t):
        ints = values.cast(pa.timestamp("us", tz=t.tz)).cast(pa.int64())
    elif pa.types.is_date(t):
        ints = values.cast(pa.date32()).cast(pa.int32()).cast(pa.int64())
    elif pa.types.is_integer(t) and not pa.types.is_uint64(t):
        ints = values.cast(pa.int64())
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        return np.array(values.to_pylist(), dtype=object)
    else:
        return None
    return np.asarray(ints.to_numpy(zero_copy_only=False), dtype=np.int64)


def _file_bounds(snap: Snapshot, column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per file: inclusive lower and upper bounds and whether both are known, widened as the
    module doc says; None if no file has bounds of a type we prune on. A string upper bound is
    exclusive (None: no upper bound)."""
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
        # Saturating, so that a bound near the ends of int64 cannot wrap around.
        lo = np.where(lo < _I64.min + _MS, _I64.min, lo - _MS)
        hi = np.where(hi > _I64.max - _MS, _I64.max, hi + _MS)
    elif hi.dtype == object:
        hi[known] = [_after_prefix(str(v)) for v in hi_known]
    return lo, hi, known


def _after_prefix(text: str) -> str | None:
    """The least string greater than every string that starts with ``text`` (None: none)."""
    chars = list(text)
    while chars and chars[-1] == _TOP:
        chars.pop()
    if not chars:
        return None
    chars[-1] = chr(ord(chars[-1]) + 1)
    return "".join(chars)


def _any_within(sorted_keys: np.ndarray, lo: np.ndarray, hi: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Per file: whether some key k has lo <= k <= hi (strings: lo <= k < hi, None: no hi)."""
    out = np.zeros(len(lo), dtype=bool)
    where = np.flatnonzero(known)
    if not len(sorted_keys) or not len(where):
        return out
    start = np.searchsorted(sorted_keys, lo[where], side="left")
    if sorted_keys.dtype != object:
        out[where] = np.searchsorted(sorted_keys, hi[where], side="right") > start
        return out
    for i, s in zip(where, start, strict=True):
        upper = hi[i]
        out[i] = s < len(sorted_keys) and (upper is None or sorted_keys[s] < upper)
    return out
