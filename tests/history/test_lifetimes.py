"""``carry``: one version's rows in against its rows out, as lifetimes (no Spark: Arrow only)."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from mvsink.errors import ConfigError, Where
from mvsink.history.lifetimes import COLUMNS, Change, carry, history_struct, opened, view_struct
from mvsink.table.schema import arrow_schema

VIEW = StructType(
    [StructField("id", LongType()), StructField("name", StringType()), StructField("x", DoubleType())]
)
SCHEMA = arrow_schema(history_struct(VIEW, Where()))


def rows(*values: tuple) -> pa.Table:
    return pa.table(
        {"id": [v[0] for v in values], "name": [v[1] for v in values], "x": [v[2] for v in values]},
        schema=arrow_schema(VIEW),
    )


def view_rows(t: pa.Table) -> Counter:
    return Counter((r["id"], r["name"], r["x"]) for r in t.select(["id", "name", "x"]).to_pylist())


def test_the_history_has_the_views_columns_then_the_lifetimes():
    struct = history_struct(VIEW, Where())
    assert struct.fieldNames() == [*VIEW.fieldNames(), *COLUMNS]
    assert view_struct(struct).fieldNames() == VIEW.fieldNames()


def test_a_view_column_named_as_a_lifetime_column_is_refused():
    clashing = StructType([*VIEW.fields, StructField("valid_from", LongType())])
    with pytest.raises(ConfigError, match="valid_from"):
        history_struct(clashing, Where("v", "/t"))


def test_a_kept_row_keeps_its_lifetime_a_new_one_opens_and_a_gone_one_closes():
    first = opened(rows((1, "a", 1.0), (2, "b", 2.0)), Change(0, 1_000, 0, "epoch"), SCHEMA)
    # Version 1 rewrites the file: keeps (1, a), drops (2, b), adds (3, c), into two files.
    kept, closed = carry(
        first, [rows((3, "c", 3.0)), rows((1, "a", 1.0))], Change(1, 2_000, 1, "epoch"), SCHEMA
    )
    assert [t.num_rows for t in kept] == [1, 1]
    new, moved = kept[0].to_pylist()[0], kept[1].to_pylist()[0]
    assert (new["id"], new["opened_version"], new["opened_epoch"], new["valid_to"]) == (3, 1, 1, None)
    assert (moved["id"], moved["opened_version"], moved["opened_by"]) == (1, 0, "epoch")
    assert moved["valid_from"] == first.to_pylist()[0]["valid_from"]
    [gone] = closed.to_pylist()
    assert (gone["id"], gone["opened_version"], gone["closed_version"], gone["closed_epoch"]) == (2, 0, 1, 1)
    assert gone["valid_to"] > gone["valid_from"]


def test_a_row_held_twice_has_two_lifetimes_and_the_newest_closes_first():
    a = rows((1, "a", 1.0))
    first = opened(a, Change(0, 1_000, 0, "epoch"), SCHEMA)
    kept, closed = carry(first, [pa.concat_tables([a, a])], Change(1, 2_000, 1, "epoch"), SCHEMA)
    assert sorted(r["opened_version"] for r in kept[0].to_pylist()) == [0, 1] and closed.num_rows == 0
    kept2, closed2 = carry(kept[0], [a], Change(2, 3_000, 2, "epoch"), SCHEMA)
    assert [r["opened_version"] for r in kept2[0].to_pylist()] == [0]
    assert [(r["opened_version"], r["closed_version"]) for r in closed2.to_pylist()] == [(1, 2)]


def test_rows_differing_in_any_column_or_in_null_are_other_rows():
    first = opened(rows((1, "a", 1.0), (2, None, float("nan"))), Change(0, 1_000, 0, "epoch"), SCHEMA)
    kept, closed = carry(
        first, [rows((1, "a", 1.5), (2, None, float("nan")))], Change(1, 2_000, 1, "epoch"), SCHEMA
    )
    by_id = {r["id"]: r for r in kept[0].to_pylist()}
    assert by_id[1]["opened_version"] == 1 and by_id[2]["opened_version"] == 0  # NaN equals NaN
    assert [r["x"] for r in closed.to_pylist()] == [1.0]


def test_a_version_that_moves_every_row_closes_and_opens_nothing():
    many = rows(*[(i, str(i % 3), float(i % 5)) for i in range(1000)])
    first = opened(many, Change(0, 1_000, 0, "epoch"), SCHEMA)
    shuffled = many.take(pa.array(list(reversed(range(1000)))))
    kept, closed = carry(
        first, [shuffled.slice(0, 400), shuffled.slice(400)], Change(1, 2_000, None, "foreign"), SCHEMA
    )
    assert closed.num_rows == 0
    assert all(r["opened_version"] == 0 for t in kept for r in t.to_pylist())
    assert sum(map(view_rows, kept), Counter()) == view_rows(many)
