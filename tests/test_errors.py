"""Bad input gets a clear mvsink error naming view, target and epoch, and the target is unchanged."""

from __future__ import annotations

import os
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from mvsink import (
    InputError,
    MVSink,
    SchemaMismatchError,
    TableHeldError,
    UnsupportedTableError,
)
from mvsink.table.storage import wait_for_cleanup
from tests.helpers import assert_equal_to, frame, people, store, target_table, versions


def unchanged_after(target, action):
    before = versions(target)
    action()
    assert versions(target) == before


def test_a_schema_change_is_refused_naming_the_columns(spark, target, placement):
    sink = MVSink(target, "schema", placement=placement)
    desired = people(spark, range(5))
    sink(desired, 0)
    other = spark.createDataFrame([(1, 2, "x")], "id long, name int, extra string")
    with pytest.raises(SchemaMismatchError) as info:
        sink(other, 1)
    err = info.value
    assert err.columns == ("extra", "name", "x")
    assert "'name' is string in the target" in str(err) and "'extra' is in desired" in str(err)
    assert (err.view, err.epoch) == ("schema", 1) and target in str(err)
    assert versions(target) == [0]
    assert_equal_to(target, desired)


def test_column_order_and_nullability_may_differ(spark, target, placement):
    sink = MVSink(target, "order", placement=placement)
    sink(people(spark, range(5)), 0)
    reordered = people(spark, range(3, 8)).select("x", "id", "name")
    sink(reordered, 1)
    assert_equal_to(target, people(spark, range(3, 8)))


@pytest.mark.parametrize(
    "configuration, feature",
    [
        ({"delta.enableDeletionVectors": "true"}, "deletion vectors"),
        ({"delta.columnMapping.mode": "name"}, "column mapping"),
    ],
)
def test_tables_with_deletion_vectors_or_column_mapping_are_refused(spark, target, configuration, feature):
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("x", pa.float64())])
    DeltaTable.create(target, schema, configuration=configuration)
    with pytest.raises(UnsupportedTableError, match=feature) as info:
        unchanged_after(target, lambda: MVSink(target, "feat")(people(spark, range(3)), 0))
    assert info.value.target == target and info.value.epoch == 0


def test_verify_refuses_a_table_with_deletion_vectors_it_cannot_read_exactly(spark, target):
    """delta-rs lists a table's files but not their deletion vectors: without the session's
    Delta, verify would count rows the table no longer holds, so it says why instead."""
    from mvsink import verify

    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("x", pa.float64())])
    DeltaTable.create(target, schema, configuration={"delta.enableDeletionVectors": "true"})
    with pytest.raises(UnsupportedTableError, match="deletion vectors, which mvsink reads through"):
        verify(people(spark, range(3)), target)


@pytest.mark.parametrize("feature", ["RowTracking", "DomainMetadata"])
def test_a_table_feature_deltalake_cannot_write_is_refused_before_staging(spark, target, feature):
    """Spark makes such tables (delta.enableRowTracking, CLUSTER BY); delta-rs refuses to commit
    to them only after everything was staged. The installed delta-rs is asked first, on a
    scratch table, so the refusal names the feature and leaves the table's folder as it was."""
    from deltalake._internal import TableFeatures

    MVSink(target, "feat")(people(spark, range(3)), 0)
    DeltaTable(target).alter.add_feature(
        [getattr(TableFeatures, feature)], allow_protocol_versions_increase=True
    )
    assert wait_for_cleanup(timeout=None)
    files = store(target).files("")
    with pytest.raises(
        UnsupportedTableError, match=f"Unsupported table features required: \\[{feature}\\]"
    ) as info:
        unchanged_after(target, lambda: MVSink(target, "feat")(people(spark, range(5)), 1))
    assert info.value.epoch == 1 and "nothing was staged" in str(info.value)
    # engine='auto' would commit through the session's JVM Delta, which this session lacks.
    assert "the delta-spark engine needs Delta in the Spark session" in str(info.value)
    assert store(target).files("") == files  # the folder as it was: no staged file


def test_under_connect_a_table_that_needs_the_jvm_engine_is_refused_naming_it(spark, connect, local_target):
    """The delta-spark engine reaches the JVM through py4j, which Spark Connect has not: a table
    only it can write is refused before staging, and every other table stays on delta-rs."""
    from deltalake._internal import TableFeatures

    MVSink(local_target, "feat")(people(connect, range(3)), 0)
    DeltaTable(local_target).alter.add_feature(
        [TableFeatures.RowTracking], allow_protocol_versions_increase=True
    )
    assert wait_for_cleanup(timeout=None)
    files = store(local_target).files("")
    for engine in ("auto", "delta-spark"):
        with pytest.raises(UnsupportedTableError, match="Spark Connect session does not have") as info:
            MVSink(local_target, "feat", engine=engine)(people(connect, range(5)), 1)
        assert "nothing was staged" in str(info.value)
    assert store(local_target).files("") == files


def test_an_append_only_table_takes_append_mode_only(spark, local_target):
    """delta.appendOnly refuses removes, and delta-rs says so only at the commit, after staging:
    complete and upsert mode are refused first; append mode goes on."""
    MVSink(local_target, "a", mode="append")(people(spark, range(3)), 0)
    DeltaTable(local_target).alter.set_table_properties({"delta.appendOnly": "true"})
    files = store(local_target).files("")
    for options in ({"mode": "complete"}, {"mode": "upsert", "key": ["id"]}):
        with pytest.raises(UnsupportedTableError, match=r"append-only \(delta\.appendOnly"):
            unchanged_after(
                local_target, lambda o=options: MVSink(local_target, "a", **o)(people(spark, range(2)), 1)
            )
    assert store(local_target).files("") == files
    assert MVSink(local_target, "a", mode="append")(people(spark, range(3, 5)), 1).outcome == "committed"
    assert target_table(local_target).num_rows == 5


def test_a_table_whose_app_transactions_expire_is_refused(spark, local_target, caplog):
    """With delta.setTransactionRetentionDuration, delta-rs forgets app transactions not
    written for that long: the frontier of a query that was down longer goes, and an append
    mode replay lands twice; so do fences. The table is refused, whenever the property
    appears, and left as it was."""
    sink = MVSink(local_target, "expiring", mode="append")
    sink(people(spark, [1]), 0)
    DeltaTable(local_target).alter.set_table_properties(
        {"delta.setTransactionRetentionDuration": "interval 1 seconds"}
    )
    time.sleep(1.5)
    replay = MVSink(local_target, "expiring", mode="append")  # a restart replaying batch 0
    with pytest.raises(UnsupportedTableError, match=r"delta\.setTransactionRetentionDuration") as info:
        unchanged_after(local_target, lambda: replay(people(spark, [1]), 0))
    assert info.value.epoch == 0 and "UNSET TBLPROPERTIES" in str(info.value)
    assert target_table(local_target).num_rows == 1


@pytest.mark.parametrize(
    "schema, rows, message",
    [
        ("id long, `bad name` string", [(1, "a")], "characters Delta refuses"),
        ("id long, s struct<`bad name`:string>", [(1, ("a",))], "field name 's.bad name' has characters"),
        ("id long, ID string", [(1, "a")], "the same column"),
        ("id long, span interval day to second", None, "Delta cannot store"),
    ],
)
def test_desired_that_delta_cannot_store_is_refused(spark, target, schema, rows, message):
    MVSink(target, "bad")(people(spark, range(3)), 0)
    if rows is None:
        df = spark.sql("select 1L as id, interval '1' day as span")
    else:
        with_case = spark.conf.get("spark.sql.caseSensitive")
        spark.conf.set("spark.sql.caseSensitive", "true")
        try:
            df = spark.createDataFrame(rows, schema)
        finally:
            spark.conf.set("spark.sql.caseSensitive", with_case)
    with pytest.raises(InputError, match=message):
        unchanged_after(target, lambda: MVSink(target, "bad")(df, 1))
    assert_equal_to(target, people(spark, range(3)))


@pytest.mark.parametrize(
    ("schema", "rows", "field", "chars"),
    [
        ("id long, s struct<`a b`:string>", [(1, ("x",))], "s.a b", " "),
        ("id long, l array<struct<ok:struct<`k=v`:int>>>", [(1, [((1,),)])], "l[].ok.k=v", "="),
        ("id long, m map<string,struct<`x;y`:int>>", [(1, {"a": (1,)})], "m{value}.x;y", ";"),
        ("id long, s struct<`(n)`:int>", [(1, (1,))], "s.(n)", "()"),
    ],
)
def test_struct_field_names_delta_refuses_are_refused_before_any_table_exists(
    spark, target, schema, rows, field, chars
):
    """Delta refuses these characters in nested field names as in column names."""
    df = spark.createDataFrame(rows, schema)
    with pytest.raises(InputError, match="characters Delta refuses") as info:
        MVSink(target, "nested")(df, 0)
    assert f"field name {field!r}" in info.value.message and repr(chars) in info.value.message
    assert (info.value.view, info.value.epoch) == ("nested", 0)
    assert not DeltaTable.is_deltatable(target)


def test_a_null_typed_column_is_refused_before_any_table_exists(spark, target):
    df = spark.sql("select 1L as id, null as nothing")
    with pytest.raises(InputError, match="nothing"):
        MVSink(target, "void")(df, 0)
    assert not os.path.exists(target)


@pytest.mark.parametrize("epoch", [-1, 1.5, "3", True])
def test_a_bad_epoch_is_refused(spark, target, epoch):
    with pytest.raises(InputError, match="epoch"):
        MVSink(target, "ep")(people(spark, range(3)), epoch)
    assert not os.path.exists(target)


def test_a_foreign_table_with_other_columns_is_left_alone(spark, target):
    from deltalake import write_deltalake

    write_deltalake(target, pa.table({"a": [1, 2]}))
    with pytest.raises(TableHeldError):  # a foreign table: refused before its columns matter
        unchanged_after(target, lambda: MVSink(target, "foreign")(frame(spark, [(1, "a", 1.0)]), 0))
    with pytest.raises(SchemaMismatchError):  # taken over on purpose, it still needs the columns
        unchanged_after(
            target, lambda: MVSink(target, "foreign", take_over="foreign")(frame(spark, [(1, "a", 1.0)]), 0)
        )
    assert DeltaTable(target).to_pyarrow_table().num_rows == 2


def test_the_tree_in_the_docstring_is_the_class_tree() -> None:
    """``errors.py``'s docstring draws every error class under its parent, and only those:
    the drawing is what users read to choose what to catch."""
    import inspect
    import re

    import mvsink.errors as errors

    drawn: dict[str, str | None] = {}
    parents: list[str] = []
    for line in (errors.__doc__ or "").splitlines():
        found = re.match(r"^    ((?:[│ ]   )*)(?:[├└]── )?([A-Z]\w+)\b", line)
        if not found or not found.group(2).endswith(
            ("Error", "Violation", "Unavailable", "Refused", "Vector")
        ):
            continue
        depth = len(found.group(1)) // 4 + (1 if "──" in line else 0)
        parents[depth:] = [found.group(2)]
        drawn[found.group(2)] = parents[depth - 1] if depth else None
    classes = {
        name: next((b.__name__ for b in cls.__bases__ if issubclass(b, errors.MVSinkError)), None)
        for name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.MVSinkError)
    }
    assert drawn == classes
    # ... and no error class of mvsink lives elsewhere.
    import pkgutil

    import mvsink

    for info in pkgutil.walk_packages(mvsink.__path__, "mvsink."):
        if info.name == "mvsink.errors" or info.name.endswith("__main__"):
            continue
        module = __import__(info.name, fromlist=["_"])
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, errors.MVSinkError) and cls.__module__ == info.name:
                raise AssertionError(f"{info.name}.{name} is an MVSinkError outside errors.py")
