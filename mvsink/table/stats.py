"""Delta file statistics from Parquet footers (pyarrow only; the data only to find NaN).

Delta readers skip files by these, so a wrong bound loses rows silently. A missing bound is
not safe either: delta-rs's PyArrow dataset turns a column without bounds into ``col >= null``
and drops the file from every filtered read on that column. So bounds are written for every
type Delta's writers bound, as they write them:

* integers, booleans; decimals as exact JSON numbers;
* floats and doubles when the file holds no NaN (Spark orders NaN above every number, the
  Parquet footer ignores it: no bound is right then); a zero bound widened to -0.0 below and
  0.0 above; infinities as the strings ``"Infinity"``/``"-Infinity"``, as Spark writes them;
* dates, and timestamps in milliseconds (the max rounded up; ``Z`` for ``timestamp``);
* strings: at most 32 characters; a longer min is cut to its first 32, a longer max cut and
  its last character bumped, so it still bounds every value with that prefix;
* the primitive leaves of structs likewise; nothing inside lists or maps; no bounds of binary
  (Delta's writers write none, and no reader prunes by them).

A value no bound can hold (a date past 9999-12-31, a timestamp past its last millisecond)
leaves that column's bounds out of the file: a statistic never fails an epoch.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

_MAX_STRING = 32
_LAST_CHAR = 0x10FFFF
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
    """A JSON-ready bound (``up``: a max), or None to leave the column out."""
    try:
        return _bound_of(raw, t, up)
    except (OverflowError, ValueError):
        return None  # past what a bound can hold: no bound is better than a wrong one


def _bound_of(raw: Any, t: pa.DataType, up: bool) -> Any:
    if pa.types.is_boolean(t):
        return bool(raw)
    if pa.types.is_integer(t):
        return int(raw)
    if pa.types.is_floating(t):
        value = float(raw)
        if value == 0.0:
            return 0.0 if up else -0.0
        if math.isinf(value):
            return _Exact(value, '"Infinity"' if value > 0 else '"-Infinity"')
        return None if math.isnan(value) else value
    if pa.types.is_decimal(t):
        exact = raw if isinstance(raw, decimal.Decimal) else None
        return None if exact is None else _Exact(exact, format(exact, "f"))
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        return _max_prefix(text) if up else text[:_MAX_STRING]
    if pa.types.is_date32(t):
        return (_EPOCH.date() + dt.timedelta(days=int(raw))).isoformat()
    if pa.types.is_timestamp(t):
        ms, _ = _ms(int(raw), t.unit, up)
        stamp = (_EPOCH + dt.timedelta(milliseconds=ms)).isoformat(timespec="milliseconds")
        return stamp + "Z" if t.tz is not None else stamp
    return None


def _max_prefix(text: str) -> str | None:
    """The shortest string of at most 32 characters at or above every string that starts
    with ``text``'s first 32 (``text`` itself when it is that short)."""
    if len(text) <= _MAX_STRING:
        return text
    chars = list(text[:_MAX_STRING])
    while chars:
        code = ord(chars.pop()) + 1
        if 0xD800 <= code <= 0xDFFF:  # surrogates are no characters: the next one is
            code = 0xE000
        if code <= _LAST_CHAR:
            return "".join(chars) + chr(code)
    return None  # every character is the last one: nothing bounds it within 32


class _Exact:
    """A bound written as given JSON text (an exact decimal, an infinity), ordered by value."""

    def __init__(self, value: decimal.Decimal | float, text: str) -> None:
        self.value = value
        self.text = text


def _put(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def metadata_stats(
    md: pq.FileMetaData, data: pa.Table | None = None, nan: set[str] | None = None
) -> tuple[int, str]:
    """``(num_records, stats_json)`` from a Parquet footer (e.g. one just written) and the
    rows written, with ``nan`` their float leaves holding NaN (``nan_leaves``; without the
    rows no float column is bounded, and a column whose footer has no null count has none)."""
    leaves = _leaves(md.schema.to_arrow_schema())
    if nan is None:
        nan = nan_leaves(data) if data is not None else set()
    bounded = {
        key
        for key, (_, t) in leaves.items()
        if key not in nan and (data is not None or not pa.types.is_floating(t))
    }
    footer = _Footer(leaves, bounded, data)
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        for c in range(rg.num_columns):
            col = rg.column(c)
            if col.path_in_schema in leaves:
                footer.add(col, rg.num_rows)
    footer.bound_long_strings()
    return md.num_rows, _dumps(footer.stats(md.num_rows))


@dataclass
class _Footer:
    """A file's statistics, leaf by leaf, summed up over its row groups."""

    leaves: dict[str, tuple[tuple[str, ...], pa.DataType]]
    bounded: set[str]
    """The leaves whose bounds may be recorded (not NaN-holding, floats only with the rows)."""
    data: pa.Table | None
    nulls: dict[str, int | None] = field(default_factory=dict)
    mins: dict[str, Any] = field(default_factory=dict)
    maxs: dict[str, Any] = field(default_factory=dict)
    unwritten: set[str] = field(default_factory=set)
    """Leaves some group has no bounds for (not for being all null)."""
    counted: set[str] = field(default_factory=set)
    """Leaves whose null count was taken from the rows, for the whole file."""

    def add(self, col: Any, group_rows: int) -> None:
        """One column chunk of a row group of ``group_rows`` rows."""
        key = col.path_in_schema
        parts, t = self.leaves[key]
        st = col.statistics
        if key in self.counted:
            pass  # counted from the rows already
        elif st is None or not st.has_null_count:
            # No count in the footer (its statistics left out, for NaN): the rows say.
            self.nulls[key] = None if self.data is None else _leaf(self.data, parts).null_count
            self.counted.add(key)
        else:
            self.nulls[key] = (self.nulls.get(key) or 0) + st.null_count
        if st is None or not st.has_min_max:
            # A group of nulls only has no bounds and narrows nothing; any other gap
            # (bounds not written) makes the column's bounds unknown.
            if not (st is not None and st.has_null_count and st.null_count == group_rows):
                self.mins[key] = self.maxs[key] = None
                self.unwritten.add(key)
            return
        lo, hi = _bound(_raw(st, "min", t), t, False), _bound(_raw(st, "max", t), t, True)
        if key not in self.bounded:
            lo = hi = None
        if lo is None or hi is None or self.mins.get(key, 0) is None:
            self.mins[key] = self.maxs[key] = None
            return
        self.mins[key] = lo if key not in self.mins else _lesser(self.mins[key], lo)
        self.maxs[key] = hi if key not in self.maxs else _greater(self.maxs[key], hi)

    def bound_long_strings(self) -> None:
        """Parquet writers leave out the bounds of long values (over 4 KiB in Arrow's): a
        string's come from the rows."""
        for key in self.unwritten:
            parts, t = self.leaves[key]
            if self.data is not None and (pa.types.is_string(t) or pa.types.is_large_string(t)):
                low, high = pc.min_max(_leaf(self.data, parts)).values()
                if low.is_valid and high.is_valid:
                    self.mins[key], self.maxs[key] = (
                        _bound(low.as_py(), t, False),
                        _bound(high.as_py(), t, True),
                    )

    def stats(self, rows: int) -> dict[str, Any]:
        stats: dict[str, Any] = {"numRecords": rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
        for key, (parts, _) in self.leaves.items():
            if self.nulls.get(key) is not None:
                _put(stats["nullCount"], parts, self.nulls[key])
            if self.mins.get(key) is not None and self.maxs.get(key) is not None:
                _put(stats["minValues"], parts, self.mins[key])
                _put(stats["maxValues"], parts, self.maxs[key])
        return stats


def nan_leaves(data: pa.Table) -> set[str]:
    """The Parquet paths of ``data``'s float leaves (through structs) that hold a NaN."""
    found: set[str] = set()

    def walk(parts: tuple[str, ...], t: pa.DataType) -> None:
        if pa.types.is_struct(t):
            for i in range(t.num_fields):
                walk((*parts, t.field(i).name), t.field(i).type)
        elif pa.types.is_floating(t) and pc.any(pc.is_nan(_leaf(data, parts))).as_py():
            found.add(".".join(parts))

    for f in data.schema:
        walk((f.name,), f.type)
    return found


def footer_statistics(schema: pa.Schema, nan: set[str]) -> bool | list[str]:
    """The columns whose Parquet footer statistics to write: every one, but the float leaves
    holding NaN (``nan_leaves``). Parquet writers leave NaN out of a footer's bounds, and
    Spark's Parquet reader skips row groups by them: ``x > 100`` would skip the group of a NaN,
    which Spark orders above every number. (``pyarrow.parquet.ParquetWriter``'s
    ``write_statistics``.)"""
    if not nan:
        return True
    empty = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), empty, use_compliant_nested_type=True)
    paths = pq.read_metadata(pa.BufferReader(empty.getvalue())).schema
    return [path for path in (paths.column(i).path for i in range(len(paths))) if path not in nan]


def _leaf(data: pa.Table, parts: tuple[str, ...]) -> Any:
    column: Any = data.column(parts[0])
    for name in parts[1:]:
        column = pc.struct_field(column, name)
    return column


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


def loosened(stats: str) -> str:
    """Statistics JSON with ``tightBounds: false`` (a file that a deletion vector narrows: its
    bounds still bound, no longer tightly), every number kept as written (a 38-digit decimal
    bound read as a float would no longer bound). Only the top-level key: a column may be
    named ``tightBounds`` too."""
    try:
        parsed = json.loads(stats, parse_float=_exact, parse_int=_exact, parse_constant=_exact)
    except ValueError as exc:
        raise ValueError(f"statistics that are not JSON: {stats[:80]!r}") from exc
    if not isinstance(parsed, dict):
        raise ValueError(f"statistics that are not a JSON object: {stats[:80]!r}")
    parsed["tightBounds"] = False
    return _dumps(parsed)


def _exact(text: str) -> _Exact:
    return _Exact(decimal.Decimal(text) if text[-1].isdigit() else float(text), text)


def _dumps(value: Any) -> str:
    """Compact JSON of the statistics; ``_Exact`` bounds as their own text."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{_dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, _Exact):
        return value.text
    return json.dumps(value, allow_nan=False)
