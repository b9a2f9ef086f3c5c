"""The statistics mvsink writes bound every value of their file (``table/stats.py``), from
Parquet footers written as the I/O layer writes them."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pyarrow.parquet as pq

from mvsink.table.jvm_delta import _wide
from mvsink.table.stats import _max_prefix, footer_statistics, metadata_stats, nan_leaves


def stats_of(table: pa.Table, row_group_size: int | None = None) -> dict:
    nan = nan_leaves(table)
    sink = pa.BufferOutputStream()
    writer = pq.ParquetWriter(
        sink,
        table.schema,
        use_compliant_nested_type=True,
        write_statistics=footer_statistics(table.schema, nan),
    )
    writer.write_table(table, row_group_size=row_group_size)
    writer.close()
    return json.loads(metadata_stats(writer.writer.metadata, table, nan)[1])


def test_bounds_span_every_row_group_and_nulls_add_up():
    table = pa.table({"k": [5, 1, None, None, 9, 3], "s": ["m", "b", None, None, "z", "c"]})
    stats = stats_of(table, row_group_size=2)  # groups: [5,1] [None,None] [9,3]
    assert stats["minValues"] == {"k": 1, "s": "b"} and stats["maxValues"] == {"k": 9, "s": "z"}
    assert stats["nullCount"] == {"k": 2, "s": 2}


def test_strings_too_long_for_the_footer_are_bounded_from_the_rows():
    long = ["a" * 5000 + "x", "q" * 5000, None]
    table = pa.table({"s": long, "n": pa.array([{"t": v} for v in long], pa.struct([("t", pa.string())]))})
    stats = stats_of(table)
    assert stats["minValues"]["s"] == "a" * 32 and stats["maxValues"]["s"] == "q" * 31 + "r"
    assert stats["minValues"]["n"]["t"] == "a" * 32 and stats["maxValues"]["n"]["t"] == "q" * 31 + "r"


def test_a_bumped_max_bounds_every_string_with_its_prefix():
    assert _max_prefix("a" * 31 + "\ud7ff" + "zzz") == "a" * 31 + "\ue000"  # past the surrogates
    assert _max_prefix("a" * 31 + "\U0010ffff" + "z") == "a" * 30 + "b"  # the last character: drop it
    assert _max_prefix("\U0010ffff" * 40) is None  # nothing within 32 characters bounds it
    assert _max_prefix("short") == "short"
    value = "y" * 32 + "\U0010ffff"
    assert value <= _max_prefix(value) and value.encode() <= _max_prefix(value).encode()


def test_values_no_bound_can_hold_leave_their_bound_out():
    table = pa.table({"d": pa.array([-800_000, 0], pa.date32()), "k": [1, 2]})  # a date before year 1
    stats = stats_of(table)
    assert "d" not in stats["minValues"] and stats["minValues"]["k"] == 1 and stats["nullCount"]["d"] == 0


def test_a_float_column_holding_nan_has_no_bounds_in_the_log_nor_the_footer_but_its_null_count():
    struct = pa.struct([("q", pa.float64())])
    table = pa.table(
        {"x": [1.0, float("nan"), None], "s": pa.array([{"q": 1.0}, None, {"q": float("nan")}], struct)}
    )
    stats = stats_of(table)
    assert "x" not in stats["minValues"] and "s" not in stats["minValues"]
    assert stats["nullCount"] == {"x": 1, "s": {"q": 1}}  # the struct's null counts for its field
    assert footer_statistics(table.schema, nan_leaves(table)) == []


def test_a_dotted_column_beside_a_struct_field_holding_nan_gets_no_footer_bounds():
    struct = pa.struct([("b", pa.float64())])
    table = pa.table({"a": pa.array([{"b": 1.0}], struct), "a.b": [float("nan")], "k": [1]})
    assert footer_statistics(table.schema, nan_leaves(table)) == ["k"]


def test_loosened_statistics_mark_the_file_only_and_keep_every_number():
    stats = (
        '{"numRecords":3,"minValues":{"tightBounds":false,"d":12345678901234567890123456789.12345678},'
        '"maxValues":{"tightBounds":true,"x":"Infinity"},"nullCount":{"a":{"b":1}}}'
    )
    wide = json.loads(_wide(stats))
    assert wide["tightBounds"] is False and wide["maxValues"]["tightBounds"] is True
    assert "12345678901234567890123456789.12345678" in _wide(stats)
    assert json.loads(_wide('{"numRecords":1,"tightBounds":true}')) == {"numRecords": 1, "tightBounds": False}


def test_timestamps_bound_to_the_millisecond_outward():
    stamps = [dt.datetime(2024, 1, 1, 0, 0, 0, 1500), dt.datetime(2024, 1, 1, 0, 0, 0, 2500)]
    stats = stats_of(pa.table({"t": pa.array(stamps, pa.timestamp("us", tz="UTC"))}))
    assert stats["minValues"]["t"] == "2024-01-01T00:00:00.001Z"
    assert stats["maxValues"]["t"] == "2024-01-01T00:00:00.003Z"
