"""Targets with rules of their own: NOT NULL columns and CHECK constraints are enforced;
generated and identity columns and invariants are refused, and so is Change Data Feed without
Delta in the session (only the session's JVM Delta commits change files)."""

from __future__ import annotations

import json

import pytest
from deltalake import DeltaTable, Field, Schema

from mvsink import InputError, MVSink, UnsupportedTableError
from tests.helpers import assert_equal_to, data_files_on_disk, multiset, target_table, versions

SCHEMA = "id long, name string, amount double"


def strict_table(target: str) -> None:
    """A table made by another team: id NOT NULL, amount >= 0."""
    schema = Schema([Field("id", "long", nullable=False), Field("name", "string"), Field("amount", "double")])
    DeltaTable.create(target, schema=schema).alter.add_constraint({"amount_pos": "amount >= 0"})


def unchanged(target: str, before: tuple[list[int], set[str]]) -> bool:
    return (versions(target), data_files_on_disk(target)) == before


@pytest.mark.parametrize(
    ("rows", "rule"),
    [
        ([(1, "a", 1.0), (None, "b", 2.0)], "NOT NULL id"),
        ([(1, "a", 1.0), (2, "b", -2.0)], "CHECK amount_pos"),
        ([(1, "a", 1.0), (2, "b", None)], "CHECK amount_pos"),  # as in Delta: null breaks a CHECK
    ],
)
def test_complete_mode_refuses_rows_that_break_the_targets_rules(spark, target, rows, rule):
    strict_table(target)
    sink = MVSink(target, "strict")
    good = spark.createDataFrame([(1, "a", 1.0), (2, "b", 0.0)], SCHEMA)
    sink(good, 0)
    before = (versions(target), data_files_on_disk(target))
    with pytest.raises(InputError, match=rule) as err:
        sink(spark.createDataFrame(rows, SCHEMA), 1)
    assert err.value.epoch == 1 and err.value.view == "strict"
    assert unchanged(target, before)
    assert_equal_to(target, good)


def test_upsert_and_append_modes_enforce_the_rules_too(spark, target, tmp_path):
    strict_table(target)
    upsert = MVSink(target, "u", mode="upsert", key=["id"])
    upsert(spark.createDataFrame([(1, "a", 1.0)], SCHEMA), 0)
    before = (versions(target), data_files_on_disk(target))
    with pytest.raises(InputError, match="CHECK amount_pos"):
        upsert(spark.createDataFrame([(1, "a", -1.0)], SCHEMA), 1)
    assert unchanged(target, before)

    other = str(tmp_path / "appended")
    strict_table(other)
    append = MVSink(other, "a", mode="append")
    append(spark.createDataFrame([(1, "a", 1.0)], SCHEMA), 0)
    before = (versions(other), data_files_on_disk(other))
    with pytest.raises(InputError, match="NOT NULL id"):
        append(spark.createDataFrame([(None, "x", 1.0)], SCHEMA), 1)
    assert unchanged(other, before)
    assert multiset(target_table(other)) == multiset(target_table(other))  # still readable


def test_a_nested_not_null_field_is_enforced(spark, target):
    inner = {"type": "struct", "fields": [{"name": "v", "type": "long", "nullable": False, "metadata": {}}]}
    schema = {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "s", "type": inner, "nullable": True, "metadata": {}},
        ],
    }
    DeltaTable.create(target, schema=Schema.from_json(json.dumps(schema)))
    sink = MVSink(target, "nested")
    ok = spark.createDataFrame([(1, (5,)), (2, (6,))], "id long, s struct<v: long>")
    sink(ok, 0)
    assert_equal_to(target, ok)
    with pytest.raises(InputError, match=r"NOT NULL s\.v"):
        sink(spark.createDataFrame([(1, (None,))], "id long, s struct<v: long>"), 1)


@pytest.mark.parametrize(
    ("metadata", "configuration", "what"),
    [
        ({"delta.generationExpression": "id * 2"}, None, "generated column"),
        ({"delta.identity.start": 1, "delta.identity.step": 1}, None, "identity column"),
        ({"delta.invariants": json.dumps({"expression": {"expression": "x > 0"}})}, None, "invariant"),
        ({}, {"delta.enableChangeDataFeed": "true"}, "Change Data Feed on .* needs .*Delta"),
    ],
)
def test_tables_whose_values_or_change_data_the_sink_cannot_write_are_refused(
    spark, target, metadata, configuration, what
):
    fields = [Field("id", "long"), Field("x", "long", metadata=metadata)]
    DeltaTable.create(target, schema=Schema(fields), configuration=configuration)
    before = (versions(target), data_files_on_disk(target))
    with pytest.raises(UnsupportedTableError, match=what) as err:
        MVSink(target, "refused")(spark.createDataFrame([(1, 2)], "id long, x long"), 0)
    assert err.value.view == "refused"
    assert unchanged(target, before)
