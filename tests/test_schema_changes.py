"""A view whose query changes (``schema_changes``): columns added, dropped and widened in place,
each change exact in the version that makes it, every version readable, and what no change of
the table can make refused with nothing written."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame, SparkSession

from mvsink import MVSink, SchemaMismatchError, failpoints
from mvsink.compat import to_arrow
from tests.helpers import (
    added,
    assert_equal_to,
    commit_info,
    live_files,
    multiset,
    once,
    removed,
    spark_read_listed,
    store,
    target_table,
    versions,
)

# Runs on both engines (tests/conftest.py: each line runs the engine it has).
pytestmark = pytest.mark.usefixtures("engine")

OLD = "id long, name string, x double"
NEW = "id long, name string, x double, tier string"


def old_query(spark: SparkSession, ids: range) -> DataFrame:
    return spark.createDataFrame([(i, f"n{i}", i / 2) for i in ids], OLD)


def new_query(spark: SparkSession, ids: range, tier: str | None = "gold") -> DataFrame:
    """The query with a column added: ``tier`` is ``tier`` for even ids, else null."""
    return spark.createDataFrame([(i, f"n{i}", i / 2, tier if i % 2 == 0 else None) for i in ids], NEW)


def columns(target: str, version: int | None = None) -> dict[str, str]:
    return {f.name: str(f.type) for f in target_table(target, version).schema}


def test_a_column_added_to_a_complete_view_is_in_the_table_in_one_exact_version(spark, target, placement):
    sink = MVSink(target, "v", placement=placement, schema_changes="evolve", max_rows_per_file=4)
    sink(old_query(spark, range(0, 10)), 0)
    report = sink(new_query(spark, range(0, 12)), 1)
    assert report.outcome == "committed" and versions(target) == [0, 1]
    assert list(columns(target)) == ["id", "name", "x", "tier"]
    assert_equal_to(target, new_query(spark, range(0, 12)))
    assert_equal_to(target, old_query(spark, range(0, 10)), version=0)  # the old version reads as it was
    assert "tier" not in columns(target, 0)
    assert multiset(to_arrow(spark_read_listed(spark, target))) == multiset(target_table(target))
    # The next epochs of the new query are epochs like any other.
    assert sink(new_query(spark, range(0, 12)), 2).outcome == "unchanged"
    sink(new_query(spark, range(3, 14), tier="silver"), 3)
    assert_equal_to(target, new_query(spark, range(3, 14), tier="silver"))


def test_an_added_column_that_is_null_everywhere_keeps_every_file_where_the_engine_can(spark, engine, target):
    """The JVM Delta commits the new schema beside the files it keeps: a column null in every
    row changes no row, and the version adds and removes no file. delta-rs commits a schema
    only by replacing every file (``delta.keeps_files_across_schema_change``)."""
    sink = MVSink(target, "v", schema_changes="evolve", max_rows_per_file=4)
    sink(old_query(spark, range(0, 10)), 0)
    before = sorted(live_files(target))
    report = sink(new_query(spark, range(0, 10), tier=None), 1)
    assert report.version == 1 and "tier" in columns(target)
    assert_equal_to(target, new_query(spark, range(0, 10), tier=None))
    if engine == "delta-spark":
        assert (added(target, 1), removed(target, 1)) == ([], []) and report.inserted == 0
    else:
        assert sorted(removed(target, 1)) == before and report.whole


def test_a_dropped_column_leaves_the_table_and_every_file(spark, local_target):
    """A column dropped from a complete view leaves the schema and, its values with it, every
    data file: what was dropped is no longer stored anywhere the table's version references."""
    sink = MVSink(local_target, "v", schema_changes="evolve", max_rows_per_file=4)
    sink(new_query(spark, range(0, 10)), 0)
    dropped = spark.createDataFrame([(i, f"n{i}", i / 2) for i in range(0, 10)], OLD)
    report = sink(dropped, 1)
    assert report.version == 1 and list(columns(local_target)) == ["id", "name", "x"]
    assert_equal_to(local_target, dropped)
    assert_equal_to(local_target, new_query(spark, range(0, 10)), version=0)
    for path in live_files(local_target):
        with store(local_target).fs.open_input_file(path) as fh:
            assert "tier" not in pq.read_schema(fh).names, path
    assert commit_info(local_target, 1)["mvsink.retracted"] == "10"


def test_widened_types_hold_desireds_values_in_the_new_types(spark, local_target):
    """int to long, float to double, decimal(10,2) to decimal(12,2), date to timestamp_ntz
    (on a table that has the timestampNtz feature: its ``seen`` column made it so): the epoch
    rewrites every file from desired, values past the old types' ranges included, and Spark
    reads them."""
    sink = MVSink(local_target, "v", schema_changes="evolve")
    narrow = "id int, f float, d decimal(10,2), day date, seen timestamp_ntz"
    wide = "id long, f double, d decimal(12,2), day timestamp_ntz, seen timestamp_ntz"
    day, seen = dt.date(2026, 11, 27), dt.datetime(2026, 1, 1, 12)
    rows = [(1, 0.5, Decimal("12345678.91"), day, seen), (2, None, Decimal("-0.01"), None, None)]
    sink(spark.createDataFrame(rows, narrow), 0)
    moved = [(i, f, d, None if t is None else dt.datetime.combine(t, dt.time()), s) for i, f, d, t, s in rows]
    widened = spark.createDataFrame([*moved, (2**40, 1e300, Decimal("9999999999.99"), None, None)], wide)
    sink(widened, 1)
    assert columns(local_target) == {
        "id": "int64",
        "f": "double",
        "d": "decimal128(12, 2)",
        "day": "timestamp[us]",
        "seen": "timestamp[us]",
    }
    assert_equal_to(local_target, widened)
    assert multiset(to_arrow(spark_read_listed(spark, local_target))) == multiset(target_table(local_target))


@pytest.mark.parametrize(
    ("mode", "before", "after", "why"),
    [
        ("complete", "id long, v long", "id long, v int", "'v' is long in the target and integer in desired"),
        ("complete", "id long, v string", "id long, v long", "not a widening"),
        ("complete", "id long, v decimal(12,2)", "id long, v decimal(12,3)", "not a widening"),
        ("upsert", "id int, v long", "id long, v long", "'id' is the view's key column"),
        ("upsert", "id long, v long", "id long, v long, w long not null", "'w' is added non-nullable"),
        ("upsert", "id long, v long, w long", "id long, v long", "only takes added columns"),
        ("append", "id long, v int", "id long, v long", "only takes added columns"),
        ("complete", "id long, v date", "id long, v timestamp_ntz", "needs the table feature timestampNtz"),
    ],
    ids=[
        "narrowed",
        "string-to-long",
        "decimal-scale",
        "key",
        "non-nullable",
        "upsert-drop",
        "append-widen",
        "ntz-feature",
    ],
)
def test_what_no_change_of_the_table_makes_is_refused_with_nothing_written(
    spark, local_target, mode, before, after, why
):
    options = {"key": ["id"]} if mode == "upsert" else {}
    sink = MVSink(local_target, "v", mode=mode, schema_changes="evolve", **options)
    sink(_row(spark, before), 0)
    files = sorted(store(local_target).files(""))
    with pytest.raises(SchemaMismatchError, match=why) as info:
        sink(_row(spark, after), 1)
    print(info.value)
    assert "Nothing was written" in str(info.value) and "epoch 1" in str(info.value)
    assert versions(local_target) == [0] and sorted(store(local_target).files("")) == files


def _row(spark: SparkSession, schema: str) -> DataFrame:
    """One row of ``schema`` (``_one`` of each column's type)."""
    frame = spark.createDataFrame([], schema)
    values = [_one(t) for _, t in frame.dtypes]
    return spark.createDataFrame([tuple(values)], frame.schema)


def _one(spark_type: str) -> object:
    if spark_type == "string":
        return "a"
    if spark_type.startswith("decimal"):
        return Decimal(1)
    if spark_type == "date":
        return dt.date(2026, 1, 1)
    if spark_type == "timestamp_ntz":
        return dt.datetime(2026, 1, 1)
    return 1


def test_a_partition_column_change_is_refused(spark, local_target):
    sink = MVSink(local_target, "v", partition_by=["p"], schema_changes="evolve")
    sink(spark.createDataFrame([(1, "a")], "id long, p string"), 0)
    with pytest.raises(SchemaMismatchError, match="'p' is the view's partition column"):
        sink(spark.createDataFrame([(1, 2)], "id long, p long"), 1)
    assert versions(local_target) == [0]


def test_by_default_a_changed_query_is_refused_naming_the_option(spark, local_target):
    sink = MVSink(local_target, "v")
    sink(old_query(spark, range(0, 3)), 0)
    with pytest.raises(SchemaMismatchError, match="schema_changes is 'refuse'") as info:
        sink(new_query(spark, range(0, 3)), 1)
    assert info.value.columns == ("tier",)
    assert versions(local_target) == [0]


def test_a_replica_on_the_old_query_conflicts_and_is_refused_rather_than_changing_it_back(
    spark, local_target
):
    """Two replicas of one view, both with ``schema_changes = "evolve"``: the redeployed one
    changes the schema inside the old one's commit window. The old one loses the race, plans
    again on the new schema, and is refused (it would have changed the table back and written
    old-shaped rows), as is each of its later epochs; an epoch of it that only replays what is
    committed writes nothing and is not refused. The view stays the new query's."""
    old = MVSink(local_target, "v", schema_changes="evolve", lineage="q")
    new = MVSink(local_target, "v", schema_changes="evolve", lineage="q")
    old(old_query(spark, range(0, 6)), 0)

    def redeployed_commits_first() -> None:
        new(new_query(spark, range(0, 6)), 1)

    armed = failpoints.armed({"before_commit": once(redeployed_commits_first)}, view="v")
    with armed, pytest.raises(SchemaMismatchError, match="runs the query the view's query replaced") as info:
        old(old_query(spark, range(0, 7)), 2)
    print(info.value)
    assert "left at version 1" in str(info.value) and "epoch 2" in str(info.value)
    assert versions(local_target) == [0, 1] and "tier" in columns(local_target)
    assert old(old_query(spark, range(0, 7)), 1).outcome == "replay"  # behind: skips, no error
    with pytest.raises(SchemaMismatchError, match="left at version 1"):
        old(old_query(spark, range(0, 7)), 3)
    assert versions(local_target) == [0, 1]
    assert_equal_to(local_target, new_query(spark, range(0, 6)))
    new(new_query(spark, range(0, 8)), 2)
    assert_equal_to(local_target, new_query(spark, range(0, 8)))


def test_an_epoch_that_fails_before_its_commit_leaves_the_schema_as_it_was(spark, local_target):
    """The columns go into the table only with an epoch that commits: a batch refused as bad
    input (one key twice) changes nothing, the schema included, on either engine."""
    from mvsink import DuplicateKeyError

    up = MVSink(local_target, "v", mode="upsert", key=["id"], schema_changes="evolve")
    up(spark.createDataFrame([(1, "a")], "id long, name string"), 0)
    twice = spark.createDataFrame([(2, "b", "x"), (2, "c", "y")], "id long, name string, note string")
    with pytest.raises(DuplicateKeyError):
        up(twice, 1)
    assert versions(local_target) == [0] and "note" not in columns(local_target)


@pytest.mark.parametrize(
    ("column", "constraint"),
    [("v", "v > 0"), ("größe", "`größe` > 0"), ('q"x', '`q"x` > 0'), ("a-b", "`a-b` > 0")],
    ids=["plain", "non-ascii", "quote-in-name", "dash"],
)
def test_a_dropped_column_that_a_constraint_names_is_refused(spark, local_target, column, constraint):
    """Whatever quoting the constraint's name needs: delta-rs stores `` `größe` > 0 `` as
    ``"größe" > 0`` (SQL's double-quoted name)."""
    from deltalake import DeltaTable

    from mvsink.table.uris import table_root

    sink = MVSink(local_target, "v", schema_changes="evolve")
    quoted = "`" + column.replace("`", "``") + "`"
    sink(spark.createDataFrame([(1, 2)], f"id long, {quoted} long"), 0)
    DeltaTable(table_root(local_target)).alter.add_constraint({"positive": constraint})
    with pytest.raises(SchemaMismatchError, match=r"constraint delta\.constraints\.positive names it"):
        sink(spark.createDataFrame([(1,)], "id long"), 1)
    assert versions(local_target) == [0, 1]  # the constraint's version; nothing of the sink's


@pytest.mark.parametrize("stats", ["s.a", "`s`.`a`", "id, `s`.a", "s"])
def test_a_dropped_struct_that_the_stats_columns_name_through_a_field_is_refused(spark, local_target, stats):
    """``delta.dataSkippingStatsColumns`` names columns by path (``s.a``, a field of ``s``),
    each part backtick-quoted or not: dropping ``s`` would leave it naming nothing."""
    from deltalake import DeltaTable

    from mvsink.table.uris import table_root

    sink = MVSink(local_target, "v", schema_changes="evolve")
    sink(spark.createDataFrame([(1, (2, "b"))], "id long, s struct<a: long, b: string>"), 0)
    DeltaTable(table_root(local_target)).alter.set_table_properties({"delta.dataSkippingStatsColumns": stats})
    with pytest.raises(
        SchemaMismatchError, match=r"'s' is dropped, and the table's delta\.dataSkippingStatsColumns"
    ) as info:
        sink(spark.createDataFrame([(1,)], "id long"), 1)
    print(info.value)
    assert info.value.columns == ("s",) and "Nothing was written" in str(info.value)
    assert versions(local_target) == [0, 1]  # the property's version; nothing of the sink's


@pytest.mark.parametrize(
    ("before", "after", "rows", "why", "types"),
    [
        (
            "id long, s struct<a: int, b: string>",
            "id long, s struct<a: int, b: string, c: int>",
            ((1, (1, "b")), (1, (1, "b", 3))),
            "adds field s.c inside struct s",
            "'s' is struct<a:int,b:string> in the target and struct<a:int,b:string,c:int> in desired",
        ),
        (
            "id long, items array<struct<a: int>>",
            "id long, items array<struct<a: int, c: int>>",
            ((1, [(1,)]), (1, [(1, 3)])),
            "adds field items[].c inside struct items[]",
            "'items' is array<struct<a:int>> in the target and array<struct<a:int,c:int>> in desired",
        ),
    ],
    ids=["struct", "array-of-structs"],
)
def test_a_field_added_inside_a_struct_is_refused_saying_so(
    spark, local_target, before, after, rows, why, types
):
    """A schema change adds top-level columns; a field inside a struct (or the structs of an
    array) is refused with a reason that says so, the types in Spark's own notation."""
    sink = MVSink(local_target, "v", schema_changes="evolve")
    sink(spark.createDataFrame([rows[0]], before), 0)
    with pytest.raises(SchemaMismatchError) as info:
        sink(spark.createDataFrame([rows[1]], after), 1)
    print(info.value)
    message = str(info.value)
    assert why in message and types in message and "add a top-level column instead" in message
    assert '{"' not in message and "Nothing was written" in message
    with pytest.raises(SchemaMismatchError, match="schema_changes is 'refuse'") as info:
        MVSink(local_target, "v")(spark.createDataFrame([rows[1]], after), 1)
    assert types.replace(" and ", ", ") in str(info.value) and '{"' not in str(info.value)
    assert versions(local_target) == [0]


def test_upsert_and_append_views_take_an_added_column_and_untouched_rows_keep_null(spark, engine, target):
    """MERGE's schema evolution: rows the epoch does not touch hold null in the added column.
    The JVM Delta commits the column with the epoch's rows; delta-rs in a version just before
    it, which holds the rows as they were (``delta.add_columns``)."""
    up = MVSink(target, "v", mode="upsert", key=["id"], schema_changes="evolve")
    up(spark.createDataFrame([(i, f"n{i}") for i in range(1, 6)], "id long, name string"), 0)
    report = up(
        spark.createDataFrame([(2, "N2", "vip"), (6, "n6", None)], "id long, name string, note string"), 1
    )
    want = [
        (1, "n1", None),
        (2, "N2", "vip"),
        (3, "n3", None),
        (4, "n4", None),
        (5, "n5", None),
        (6, "n6", None),
    ]
    assert multiset(target_table(target)) == multiset(
        pa.Table.from_pylist([dict(zip(["id", "name", "note"], r, strict=True)) for r in want])
    )
    schema_only = [0, 1] if engine == "delta-spark" else [0, 1, 2]
    assert versions(target) == schema_only and report.version == schema_only[-1]
    if engine != "delta-spark":
        assert commit_info(target, 1)["mvsink.operation"] == "schema" and added(target, 1) == []
        assert multiset(target_table(target, 1).select(["id", "note"])) == multiset(
            pa.table({"id": [1, 2, 3, 4, 5], "note": pa.nulls(5, pa.string())})
        )

    log = target + "-log"
    app = MVSink(log, "log", mode="append", schema_changes="evolve")
    app(spark.createDataFrame([(1, "a")], "id long, name string"), 0)
    app(spark.createDataFrame([(2, "b", 2.5)], "id long, name string, amount double"), 1)
    assert multiset(target_table(log)) == multiset(
        pa.table({"id": [1, 2], "name": ["a", "b"], "amount": [None, 2.5]})
    )


def test_a_column_added_under_connect(connect, local_target, placement):
    sink = MVSink(local_target, "v", placement=placement, schema_changes="evolve")
    sink(old_query(connect, range(0, 5)), 0)
    sink(new_query(connect, range(0, 6)), 1)
    assert_equal_to(local_target, new_query(connect, range(0, 6)))
    assert versions(local_target) == [0, 1]


def test_the_columns_a_change_keeps_keep_their_comments_and_place(spark, local_target):
    """A schema change keeps the table's own description of the columns it keeps (field
    metadata such as comments, nested ones too) and their order; added columns come after."""
    from deltalake import DeltaTable, write_deltalake

    from mvsink.table.uris import table_root

    inner = pa.struct([pa.field("a", pa.int64(), metadata={"comment": "inside"})])
    fields = [
        pa.field("name", pa.string(), metadata={"comment": "who"}),
        pa.field("id", pa.int64()),
        pa.field("s", inner),
    ]
    first = pa.table({"name": ["a"], "id": [1], "s": [{"a": 1}]}, schema=pa.schema(fields))
    write_deltalake(table_root(local_target), first)
    sink = MVSink(local_target, "v", schema_changes="evolve", take_over="foreign")  # a platform's table
    schema = "id long, name string, s struct<a: long>, tier string"
    sink(spark.createDataFrame([(1, "a", (1,), "x")], schema), 0)
    held = DeltaTable(table_root(local_target)).schema()
    assert [f.name for f in held.fields] == ["name", "id", "s", "tier"]
    assert held.fields[0].metadata == {"comment": "who"}
    assert held.fields[2].type.fields[0].metadata == {"comment": "inside"}
    assert_equal_to(local_target, spark.createDataFrame([(1, "a", (1,), "x")], schema))
