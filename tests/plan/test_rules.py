"""Targets with rules of their own: NOT NULL columns and CHECK constraints are enforced;
generated and identity columns and invariants are refused, and so is Change Data Feed without
Delta in the session (only the session's JVM Delta commits change files)."""

from __future__ import annotations

import json
import os

import pytest
from deltalake import DeltaTable, Field, Schema
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from mvsink import InputError, MVSink, UnsupportedTableError
from mvsink.table.plan import Plan
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
def test_complete_mode_refuses_rows_that_break_the_targets_rules(spark, target, placement, rows, rule):
    strict_table(target)
    sink = MVSink(target, "strict", placement=placement)
    good = spark.createDataFrame([(1, "a", 1.0), (2, "b", 0.0)], SCHEMA)
    sink(good, 0)
    before = (versions(target), data_files_on_disk(target))
    with pytest.raises(InputError, match=rule) as err:
        sink(spark.createDataFrame(rows, SCHEMA), 1)
    assert err.value.epoch == 1 and err.value.view == "strict"
    assert unchanged(target, before)
    assert_equal_to(target, good)
    better = spark.createDataFrame([(1, "a", 1.0), (3, "c", 3.0)], SCHEMA)  # inserted by either path
    assert sink(better, 1).inserted == 1
    assert_equal_to(target, better)


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


def test_append_checks_a_batch_the_caller_cached_and_leaves_it_cached(spark, target):
    """With rules, append caches the batch to check and write the same rows, unless the caller
    cached it: Spark keys a cache by plan, so releasing its own would release the caller's."""
    strict_table(target)
    append = MVSink(target, "a", mode="append")
    batch = spark.createDataFrame([(1, "a", 1.0), (2, "b", 2.0)], SCHEMA).cache()
    batch.count()
    cached = spark.sparkContext._jsc.sc().getPersistentRDDs().size()  # other tests' too
    assert append(batch, 0).inserted == 2
    assert batch.storageLevel.useMemory
    assert spark.sparkContext._jsc.sc().getPersistentRDDs().size() == cached
    bad = spark.createDataFrame([(None, "x", 1.0)], SCHEMA).cache()
    with pytest.raises(InputError, match="NOT NULL id"):
        append(bad, 1)
    assert bad.storageLevel.useMemory
    bad.unpersist()
    batch.unpersist()
    assert_equal_to(target, spark.createDataFrame([(1, "a", 1.0), (2, "b", 2.0)], SCHEMA))


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


@pytest.mark.parametrize("path", ["initial load", "whole rewrite", "append"])
def test_rows_written_keep_the_rules_when_spark_evaluates_desired_again(
    spark, local_target, tmp_path, monkeypatch, path
):
    """A nondeterministic desired, checked on its cached rows, then its cache blocks lost
    before the write (Spark computes them again, and they break a rule now): the rows the
    tasks write are checked again, and nothing is committed."""
    import mvsink.epoch.run
    import mvsink.plan.complete

    flip = str(tmp_path / "flip")

    def amount(i: int) -> float:  # the query's answer changes between evaluations
        return -1.0 if os.path.exists(flip) else float(i)

    shaky = F.udf(amount, "double").asNondeterministic()

    def view(changed: bool) -> DataFrame:
        # Changed: one row in each file of 5, so writing desired whole is cheaper than a correction.
        name = F.when(F.lit(changed) & (F.col("id") % 5 == 2), "b").otherwise("a")
        return spark.range(40).select("id", name.alias("name"), shaky("id").alias("amount"))

    strict_table(local_target)
    mode = "append" if path == "append" else "complete"
    sink = MVSink(local_target, "shaky", mode=mode, max_rows_per_file=5, placement="driver")
    if path != "initial load":
        sink(view(False), 0)
    monkeypatch.setattr(mvsink.plan.complete, "WHOLE_MIN_BYTES", 0)  # the table here is small
    stage, plans = mvsink.epoch.run.stage, []

    def evaluated_again(plan: Plan, *args: object, **kwargs: object) -> object:
        plans.append(plan)
        open(flip, "w").close()
        spark.catalog.clearCache()  # the cached batch's blocks are gone: Spark computes them again
        return stage(plan, *args, **kwargs)

    monkeypatch.setattr(mvsink.epoch.run, "stage", evaluated_again)
    before = (versions(local_target), data_files_on_disk(local_target))
    with pytest.raises(InputError, match="break the rule CHECK amount_pos") as err:
        sink(view(True), 0 if path == "initial load" else 1)
    assert "evaluated desired again" in str(err.value)
    assert err.value.view == "shaky" and err.value.epoch == (0 if path == "initial load" else 1)
    assert unchanged(local_target, before)
    if path == "whole rewrite":  # the plan replaced every file with desired
        assert plans[0].inserted == 40 and len(plans[0].rewrites) == 8
    assert all(r["amount"] >= 0 for r in target_table(local_target).to_pylist())


@pytest.mark.parametrize("placement", ["driver", "distributed"])
def test_upsert_writes_only_winners_that_keep_the_rules_when_spark_evaluates_desired_again(
    spark, local_target, tmp_path, monkeypatch, placement
):
    """As above, in upsert mode after its first epoch: the batch's rows checked, then its
    cache lost before the winners are collected (driver) or decided (tasks)."""
    from mvsink.plan.context import EpochContext

    flip = str(tmp_path / "flip")

    def amount(i: int) -> float:
        return -1.0 if os.path.exists(flip) else float(i)

    shaky = F.udf(amount, "double").asNondeterministic()
    strict_table(local_target)
    sink = MVSink(local_target, "shaky", mode="upsert", key=["id"], placement=placement)
    sink(
        spark.range(10).select("id", F.lit("a").alias("name"), F.col("id").cast("double").alias("amount")), 0
    )
    enforce = EpochContext.enforce

    def then_lost(self: EpochContext, rows: DataFrame, rules: object) -> None:
        enforce(self, rows, rules)
        open(flip, "w").close()
        spark.catalog.clearCache()

    monkeypatch.setattr(EpochContext, "enforce", then_lost)
    before = (versions(local_target), data_files_on_disk(local_target))
    changed = spark.range(3).select("id", F.lit("b").alias("name"), shaky("id").alias("amount"))
    with pytest.raises(InputError, match="break the rule CHECK amount_pos"):
        sink(changed, 1)
    assert unchanged(local_target, before)


@pytest.mark.parametrize("placement", ["driver", "distributed"])
def test_upsert_keeps_a_table_with_not_null_columns_on_both_placements(spark, local_target, placement):
    strict_table(local_target)
    sink = MVSink(local_target, "strict", mode="upsert", key=["id"], placement=placement)
    first = spark.range(10).select("id", F.lit("a").alias("name"), F.col("id").cast("double").alias("amount"))
    assert sink(first, 0).outcome == "committed"
    changed = spark.range(3).select(
        "id", F.lit("b").alias("name"), (F.col("id") + 100).cast("double").alias("amount")
    )
    assert sink(changed, 1).outcome == "committed"
    rows = sorted((r["id"], r["name"], r["amount"]) for r in target_table(local_target).to_pylist())
    assert rows == [(i, "b", i + 100.0) for i in range(3)] + [(i, "a", float(i)) for i in range(3, 10)]


def _ddl(name: str) -> str:
    """A view's columns with ``name`` (quoted as Spark's DDL quotes it) between an id and a note."""
    return "id long, `" + name.replace("`", "``") + "` long, note string"


@pytest.mark.parametrize(
    "name", ["größe", "Amount", 'q"x', "a`b"], ids=["non-ascii", "upper", "quote", "backtick"]
)
def test_a_check_on_a_name_that_needs_quoting_is_enforced_as_the_table_states_it(spark, local_target, name):
    """delta-rs stores a CHECK in SQL's own quoting: `` `größe` > 0 `` as ``"größe" > 0``
    (``"q""x"`` for ``q"x``), where Spark would read a string compared to 0 and fail every
    epoch. mvsink reads the names it quotes as the columns they are; a double quote inside a
    string literal stays in the literal."""
    quoted = "`" + name.replace("`", "``") + "`"
    schema = Schema([Field("id", "long"), Field(name, "long"), Field("note", "string")])
    table = DeltaTable.create(local_target, schema=schema)
    table.alter.add_constraint({"positive": f"{quoted} > 0 AND note != 'say \"{name}\"'"})
    stored = DeltaTable(local_target).metadata().configuration["delta.constraints.positive"]
    assert stored.startswith('"')  # as delta-rs stores it: SQL's quoting, not Spark's
    sink = MVSink(local_target, "quoted")
    good = spark.createDataFrame([(1, 5, "ok"), (2, 1, f"say {name}")], _ddl(name))
    assert sink(good, 0).outcome == "committed"
    assert_equal_to(local_target, good)
    before = (versions(local_target), data_files_on_disk(local_target))
    for bad in ([(3, -1, "ok")], [(3, 1, f'say "{name}"')]):
        with pytest.raises(InputError, match="CHECK positive"):
            sink(spark.createDataFrame([(1, 5, "ok"), *bad], _ddl(name)), 1)
        assert unchanged(local_target, before)


def test_rows_breaking_a_quoted_check_go_to_the_errors_table(spark, local_target):
    """``on_error = "table"`` splits the batch by the same rules, the table's quoted ones too."""
    table = DeltaTable.create(local_target, schema=Schema([Field("id", "long"), Field("größe", "long")]))
    table.alter.add_constraint({"positive": "`größe` > 0"})
    sink = MVSink(local_target, "quoted", on_error="table")
    sink(spark.createDataFrame([(1, 5), (2, -1)], "id long, `größe` long"), 0)
    assert multiset(target_table(local_target)) == {(1, 5): 1}
    assert [(r["id"], r["mvsink_rule"]) for r in target_table(local_target + "_errors").to_pylist()] == [
        (2, "CHECK positive (`größe` > 0)")
    ]


def test_a_double_quoted_string_in_a_check_the_jvm_delta_stored_stays_a_string(spark, local_target):
    """The JVM Delta stores a CHECK as its author wrote it, in Spark's SQL, where ``"closed"``
    is a string: only a double-quoted name of one of the table's columns is read as that
    column (``schema.spark_sql``)."""
    DeltaTable.create(local_target, schema=Schema([Field("id", "long"), Field("status", "string")]))
    _jvm_constraint(local_target, "open", 'status != "closed"')
    assert DeltaTable(local_target).metadata().configuration["delta.constraints.open"] == 'status != "closed"'
    sink = MVSink(local_target, "jvm")
    good = spark.createDataFrame([(1, "open"), (2, "closed?")], "id long, status string")
    sink(good, 0)
    assert_equal_to(local_target, good)
    with pytest.raises(InputError, match="CHECK open"):
        sink(spark.createDataFrame([(1, "open"), (2, "closed")], "id long, status string"), 1)
    assert versions(local_target) == [0, 1, 2]


def _jvm_constraint(target: str, name: str, expression: str) -> None:
    """Commit the metadata of a new table (its version 0 holds it) with a CHECK as the JVM
    Delta's ALTER TABLE ... ADD CONSTRAINT does (the expression's text in
    ``delta.constraints.<name>``): delta-rs parses and re-renders the expressions it adds, and
    refuses one whose double quotes are a string."""
    import time

    dt = DeltaTable(target)
    version = dt.version() + 1
    with open(os.path.join(target, "_delta_log", f"{dt.version():020d}.json")) as fh:
        meta = next(a["metaData"] for a in map(json.loads, fh) if "metaData" in a)
    meta["configuration"] = {**meta.get("configuration", {}), f"delta.constraints.{name}": expression}
    info = {"timestamp": int(time.time() * 1000), "operation": "ADD CONSTRAINT"}
    with open(os.path.join(target, "_delta_log", f"{version:020d}.json"), "x") as fh:
        fh.write(json.dumps({"commitInfo": info}) + "\n" + json.dumps({"metaData": meta}) + "\n")
