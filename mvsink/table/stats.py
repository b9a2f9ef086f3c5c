"""Delta file statistics from Parquet footers (pyarrow only, no data read).

Delta readers skip files by these, so a wrong bound loses rows silently; when in doubt a
column is left out. Kept: numRecords; nullCount of top-level and struct-nested primitives;
min/max of integers, decimals (exact JSON numbers), dates, timestamps (milliseconds, max rounded
up) and strings of at most 32 characters. Left out: floats (NaN ordering), binary, boolean and
anything inside lists or maps. The JSON never contains NaN (``allow_nan=False``).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

_MAX_STRING = 32
_EPOCH = dt.datetime(1970, 1, 1)


def _leaves(schema: pa.Schema) -> dict[str, tuple[tuple[str, ...], pa.DataType]]:
    """Primitive leaves reachable through structs only, by their Parquet dotted path."""
    out: dict[str, tuple[tuple[str, ...], pa.DataType]] = {}
    ambiguous: set[str] = set()

    def walk(prefix: tuple[str, ...], t: pa.DataType) -> None:
        if pa.types.is_struct(t):
            for i in range(t.num_fields):
                f = t.field(i)
                walk((*prefix, f.name), f.type)
        elif not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t)):
            key = ".".join(prefix)
            if key in out or key in ambiguous:
                # A column "a.b" beside a struct "a" with a field "b": Parquet names both
                # "a.b", so neither's statistics can be told apart. Leave both out.
                ambiguous.add(key)
                out.pop(key, None)
            else:
                out[key] = (prefix, t)

    for f in schema:
        walk((f.name,), f.type)
    return out


def _ms(micros: int, unit: str, up: bool) -> tuple[int, int]:
    per_ms = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[unit]
    if per_ms is None:
        return micros * 1000, 0
    q, r = divmod(micros, per_ms)
    return q + (1 if up and r else 0), 0


def _bound(raw: Any, t: pa.DataType, up: bool) -> Any:
    """A JSON-ready bound, or None to leave the column out."""
    if pa.types.is_integer(t):
        return int(raw)
    if pa.types.is_decimal(t):
        value = raw if isinstance(raw, decimal.Decimal) else None
        return None if value is None else _Exact(value)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        return text if len(text) <= _MAX_STRING else None
    if pa.types.is_date32(t):
        return (_EPOCH.date() + dt.timedelta(days=int(raw))).isoformat()
    if pa.types.is_timestamp(t):
        ms, _ = _ms(int(raw), t.unit, up)
        try:
            stamp = (_EPOCH + dt.timedelta(milliseconds=ms)).isoformat(timespec="milliseconds")
        except OverflowError:
            # The max of 9999-12-31 23:59:59.999999 rounds up past the last representable
            # millisecond: no bound is better than a wrong one.
            return None
        return stamp + "Z" if t.tz is not None else stamp
    return None


class _Exact:
    """A decimal written as an exact JSON number."""

    def __init__(self, value: decimal.Decimal) -> None:
        self.value = value


def _put(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def metadata_stats(md: pq.FileMetaData) -> tuple[int, str]:
    """``(num_records, stats_json)`` from a Parquet footer (e.g. one just written)."""
    leaves = _leaves(md.schema.to_arrow_schema())
    nulls: dict[str, int | None] = {}
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        for c in range(rg.num_columns):
            col = rg.column(c)
            key = col.path_in_schema
            if key not in leaves:
                continue
            _, t = leaves[key]
            st = col.statistics
            if st is None or not st.has_null_count:
                nulls[key] = None
            elif key not in nulls or nulls[key] is not None:
                nulls[key] = (nulls.get(key) or 0) + st.null_count
            if st is None or not st.has_min_max:
                # A group of nulls only has no bounds and narrows nothing; any other gap
                # (bounds not written) makes the column's bounds unknown.
                if not (st is not None and st.has_null_count and st.null_count == rg.num_rows):
                    mins[key] = maxs[key] = None
                continue
            lo, hi = _bound(_raw(st, "min", t), t, False), _bound(_raw(st, "max", t), t, True)
            if lo is None or hi is None or mins.get(key, 0) is None:
                mins[key] = maxs[key] = None
                continue
            mins[key] = lo if key not in mins else _lesser(mins[key], lo)
            maxs[key] = hi if key not in maxs else _greater(maxs[key], hi)
    stats: dict[str, Any] = {"numRecords": md.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    for key, (parts, _) in leaves.items():
        if nulls.get(key) is not None:
            _put(stats["nullCount"], parts, nulls[key])
        if mins.get(key) is not None and maxs.get(key) is not None:
            _put(stats["minValues"], parts, mins[key])
            _put(stats["maxValues"], parts, maxs[key])
    return md.num_rows, _dumps(stats)


def _raw(st: Any, which: str, t: pa.DataType) -> Any:
    if pa.types.is_decimal(t):
        return getattr(st, which)
    if pa.types.is_timestamp(t) or pa.types.is_date32(t):
        return getattr(st, which + "_raw")
    return getattr(st, which + "_raw") if pa.types.is_string(t) else getattr(st, which)


def _key(v: Any) -> Any:
    return v.value if isinstance(v, _Exact) else v


def _lesser(a: Any, b: Any) -> Any:
    return a if _key(a) <= _key(b) else b


def _greater(a: Any, b: Any) -> Any:
    return a if _key(a) >= _key(b) else b


def _dumps(stats: dict[str, Any]) -> str:
    exact: list[str] = []

    def default(o: Any) -> Any:
        if isinstance(o, _Exact):
            exact.append(format(o.value, "f"))
            return f"\x00{len(exact) - 1}\x00"
        raise TypeError(type(o).__name__)

    text = json.dumps(stats, default=default, allow_nan=False, separators=(",", ":"))
    for i, number in enumerate(exact):
        text = text.replace(f'"\\u0000{i}\\u0000"', number)
    return text
