"""The target's layout as an epoch writes it (``Layout``), and the policy that picks it
(``layout_for``): the table's schema and partition columns, a new table's, or the schema the
epoch's commit evolves the table to (``schema_changes = "evolve"``, ``schema.py``)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.types import StructType

from mvsink.errors import ConfigError, Where
from mvsink.table.delta import Snapshot, physical_names
from mvsink.table.schema import (
    arrow_schema,
    check_evolution,
    check_fits,
    evolved_schema_json,
    named_by_the_table,
    schema_change,
    target_schema_json,
    target_struct,
)


@dataclass(frozen=True)
class Layout:
    """The target's shape as an epoch writes it: Delta schema JSON, Spark and Arrow schemas,
    partition columns."""

    schema_json: str
    struct: StructType
    partition_by: tuple[str, ...]
    replaces: str | None = None
    """The table's schema JSON when the epoch's commit changes it to ``schema_json``
    (``schema_changes = "evolve"``); None: the commit keeps the table's schema."""

    @property
    def rewrites_every_file(self) -> bool:
        """Whether the schema change needs every file of the table rewritten in its commit: a
        widened column (files of the old type are unreadable as the new one without Delta's
        type widening) or a dropped one (its values would come back were it added again).
        Added columns read as null from older files."""
        if self.replaces is None:
            return False
        change = schema_change(self.struct, self.replaces)
        return bool(change.dropped or change.widened)

    @functools.cached_property
    def arrow(self) -> pa.Schema:
        return arrow_schema(self.struct)


def layout_for(
    stored: StructType,
    snap: Snapshot,
    *,
    partition_by: Sequence[str] | None,
    schema_changes: str,
    mode: str,
    key: Sequence[str],
    sequence_column: str | None,
    where: Where,
) -> Layout:
    """The layout an epoch writes desired's rows (``stored``: desired as the table stores it)
    in: a new table's from desired and ``partition_by``; else the table's, whose partition
    columns ``partition_by`` (when given) must name; when desired's schema differs, the
    table's schema evolved to desired's, if ``schema_changes`` lets it (``check_evolution``,
    with the columns of the view's ``key``, ``sequence_column`` and partitioning as roles)."""
    if not snap.exists:
        schema_json = target_schema_json(stored)
        return Layout(schema_json, target_struct(schema_json), tuple(partition_by or ()))
    assert snap.schema_json is not None
    if partition_by is not None and tuple(partition_by) != snap.partition_by:
        raise ConfigError(
            f"option 'partition_by' is {list(partition_by)} but the target is partitioned by "
            f"{list(snap.partition_by)}; drop the option to keep the target's partitioning",
            where,
        )
    change = schema_change(stored, snap.schema_json)
    if not change:
        return Layout(snap.schema_json, target_struct(snap.schema_json), snap.partition_by)
    if schema_changes == "refuse":
        check_fits(stored, snap.schema_json, where)
    roles = [(c, "key") for c in key] + [(c, "partition") for c in snap.partition_by]
    roles += [(sequence_column, "sequence")] if sequence_column else []
    check_evolution(
        change,
        mode=mode,
        desired=stored,
        roles=roles,
        mapped=bool(physical_names(snap.schema_json)),
        features=snap.features,
        named=named_by_the_table(snap.schema_json, snap.configuration),
        where=where,
    )
    schema_json = evolved_schema_json(snap.schema_json, stored)
    return Layout(schema_json, target_struct(schema_json), snap.partition_by, replaces=snap.schema_json)
