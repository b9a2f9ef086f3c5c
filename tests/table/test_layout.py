"""The layout an epoch writes (``Layout``) and the policy that picks it (``layout_for``)."""

from __future__ import annotations

import pytest
from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType

from mvsink.errors import ConfigError, SchemaMismatchError, Where
from mvsink.table.delta import Snapshot
from mvsink.table.layout import Layout, layout_for
from mvsink.table.schema import target_schema_json, target_struct

WHERE = Where("v", "/t", 1)
TABLE = StructType([StructField("k", LongType()), StructField("v", IntegerType())])


def table(struct: StructType = TABLE, partition_by: tuple[str, ...] = ()) -> Snapshot:
    return Snapshot("/t", 3, 2, target_schema_json(struct), partition_by, ())


def pick(stored: StructType, snap: Snapshot, **options: object) -> Layout:
    chosen = {
        "partition_by": None,
        "schema_changes": "evolve",
        "mode": "complete",
        "key": (),
        "sequence_column": None,
        **options,
    }
    return layout_for(stored, snap, where=WHERE, **chosen)  # type: ignore[arg-type]


def test_a_new_table_takes_desireds_schema_and_the_partition_option() -> None:
    none = Snapshot("/t", None, None, None, (), ())
    layout = pick(TABLE, none, partition_by=["k"])
    assert layout.partition_by == ("k",) and layout.replaces is None
    assert layout.struct == target_struct(target_schema_json(TABLE))
    assert layout.arrow.names == ["k", "v"]


def test_a_table_keeps_its_schema_and_partitioning_and_refuses_other_partition_columns() -> None:
    snap = table(partition_by=("k",))
    layout = pick(TABLE, snap)
    assert (layout.schema_json, layout.partition_by, layout.replaces) == (snap.schema_json, ("k",), None)
    with pytest.raises(ConfigError, match="partition_by"):
        pick(TABLE, snap, partition_by=["v"])


def test_an_added_column_evolves_the_schema_without_rewriting_every_file() -> None:
    wider = StructType([*TABLE.fields, StructField("s", StringType())])
    layout = pick(wider, table())
    assert layout.replaces == table().schema_json
    assert layout.struct.names == ["k", "v", "s"]
    assert not layout.rewrites_every_file


def test_a_widened_or_dropped_column_rewrites_every_file() -> None:
    widened = StructType([StructField("k", LongType()), StructField("v", LongType())])
    assert pick(widened, table()).rewrites_every_file
    dropped = StructType([StructField("k", LongType())])
    assert pick(dropped, table()).rewrites_every_file


def test_a_change_the_options_do_not_allow_is_refused() -> None:
    changed = StructType([StructField("k", LongType()), StructField("v", DoubleType())])
    with pytest.raises(SchemaMismatchError):
        pick(changed, table(), schema_changes="refuse")
    dropped = StructType([StructField("k", LongType())])
    with pytest.raises(SchemaMismatchError, match="upsert mode"):
        pick(dropped, table(), mode="upsert", key=["k"])
    wider = StructType([StructField("k", StringType()), *TABLE.fields[1:]])
    with pytest.raises(SchemaMismatchError, match="key column"):
        pick(wider, table(), key=["k"])
