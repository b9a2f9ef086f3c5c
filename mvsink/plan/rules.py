"""Rules rows must keep: the view's (options ``not_null``, ``checks``) and the target's own.

What to do with rows that break them is ``on_error``'s business (``quarantine.py``); here
they are found. The target's rules are what a table created by someone else may demand: a
Delta table can declare NOT NULL columns and CHECK constraints (``delta.constraints.<name>``
in its properties); every Delta writer must refuse rows that break them, or readers answer
wrong (Spark folds ``col IS NULL`` to false on a NOT NULL column). mvsink enforces both on the
rows it would store: a row that breaks one is an ``InputError`` naming the rule and the epoch,
and nothing is committed. As in Delta, a CHECK whose expression is null is broken. A CHECK is
evaluated as Spark's SQL, with the names delta-rs stores in SQL's double quotes read as the
columns they name (``schema.spark_sql``).

Features whose values the sink would have to compute are refused with
``UnsupportedTableError`` instead: generated and identity columns, and column invariants.
(Change Data Feed is the engine's business: ``delta._engine`` sends such tables to the
session's JVM Delta, which commits change files.)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from mvsink.errors import InputError, UnsupportedTableError, Where
from mvsink.table.delta import Snapshot
from mvsink.table.fingerprint import quote
from mvsink.table.schema import spark_sql
from mvsink.table.tasks import RULE as RULE  # re-exported: the rule column is made here

if TYPE_CHECKING:
    from mvsink.config import SinkOptions

_CHECK_PREFIX = "delta.constraints."


@dataclass(frozen=True)
class Rules:
    """The rules rows must keep: NOT NULL column paths and named CHECK expressions."""

    not_null: tuple[tuple[str, ...], ...] = ()
    checks: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.not_null or self.checks)

    def __add__(self, other: Rules) -> Rules:
        return Rules(
            tuple(dict.fromkeys(self.not_null + other.not_null)),
            tuple(dict.fromkeys(self.checks + other.checks)),
        )

    def broken(self) -> Column:
        """The name of the first rule a row breaks, or null; aliased ``RULE``."""
        conditions = [(_is_null(path), f"NOT NULL {'.'.join(path)}") for path in self.not_null] + [
            (~F.coalesce(F.expr(expression), F.lit(False)), f"CHECK {name} ({expression})")
            for name, expression in self.checks
        ]
        if not conditions:
            return F.lit(None).cast("string").alias(RULE)
        out = F.when(*conditions[0])
        for condition, label in conditions[1:]:
            out = out.when(condition, label)
        return out.alias(RULE)


def _is_null(path: Sequence[str]) -> Column:
    """A nested NOT NULL field binds only where its parents are present."""
    col = F.col(quote(path[0]))
    present = F.lit(True)
    for name in path[1:]:
        present = present & col.isNotNull()
        col = col.getField(name)
    return present & col.isNull()


def rules_for(snap: Snapshot, opts: SinkOptions, where: Where) -> Rules:
    """The rules an epoch's rows must keep: the view's (options ``not_null`` and ``checks``)
    and the target table's."""
    return view_rules(opts) + table_rules(snap, where)


def view_rules(opts: SinkOptions) -> Rules:
    """The view's own rules: ``not_null`` column paths (``a.b`` for a struct field) and
    ``checks``, SQL boolean expressions named ``check_1``, ``check_2`` ... in order."""
    return Rules(
        tuple(tuple(path.split(".")) for path in opts.not_null),
        tuple((f"check_{i}", expression) for i, expression in enumerate(opts.checks, 1)),
    )


def table_rules(snap: Snapshot, where: Where) -> Rules:
    """The rules of ``snap``'s table; refuses the features named in the module doc."""
    if not snap.exists or snap.schema_json is None:
        return Rules()
    config = snap.configuration
    refused: list[str] = []
    not_null: list[tuple[str, ...]] = []

    def walk(fields: list[dict[str, Any]], prefix: tuple[str, ...]) -> None:
        for field in fields:
            path = (*prefix, field["name"])
            meta = field.get("metadata") or {}
            label = ".".join(path)
            if "delta.generationExpression" in meta:
                refused.append(f"{label} is a generated column")
            if any(str(k).startswith("delta.identity.") for k in meta):
                refused.append(f"{label} is an identity column")
            if "delta.invariants" in meta:
                refused.append(f"{label} has a column invariant")
            if not field.get("nullable", True):
                not_null.append(path)
            kind = field["type"]
            if isinstance(kind, dict) and kind.get("type") == "struct":
                walk(kind["fields"], path)

    walk(json.loads(snap.schema_json)["fields"], ())
    if refused:
        raise UnsupportedTableError(
            "the target declares what mvsink cannot keep: " + "; ".join(refused) + ". Point the view "
            "at a table without them.",
            where,
        )
    columns = [f["name"] for f in json.loads(snap.schema_json)["fields"]]
    checks = tuple(
        sorted(
            (k.removeprefix(_CHECK_PREFIX), spark_sql(v, columns))
            for k, v in config.items()
            if k.startswith(_CHECK_PREFIX)
        )
    )
    return Rules(tuple(not_null), checks)


def check_rows(rows: DataFrame, rules: Rules, where: Where) -> None:
    """Raise ``InputError`` if a row of ``rows`` breaks one of ``rules`` (one Spark job)."""
    if not rules:
        return
    found = rows.select(rules.broken()).where(F.col(RULE).isNotNull()).limit(1).collect()
    if found:
        raise_broken(rows, rules, found[0][RULE], where)


def checked(rows: DataFrame, rules: Rules) -> DataFrame:
    """``rows``, to be written by Spark tasks (``tasks.write_frame``), with the rule each
    breaks (``RULE``): the tasks refuse a row that breaks one, so what is written keeps the
    rules even when Spark evaluates desired again after it was checked (a cache block lost,
    a nondeterministic query). ``rows`` as they are without rules."""
    return rows.select("*", rules.broken()) if rules else rows


def raise_broken(rows: DataFrame, rules: Rules, rule: str, where: Where) -> None:
    """Raise the ``InputError`` for rows breaking ``rule``, with a few of them as a sample."""
    sample = rows.select("*", rules.broken()).where(F.col(RULE) == rule).drop(RULE).limit(3).collect()
    raise broken_error(rule, [r.asDict() for r in sample], where)


def broken_error(rule: str, sample: list[dict[str, Any]], where: Where) -> InputError:
    """The ``InputError`` for rows breaking ``rule``, a few of them shown."""
    shown = "; ".join(str(row) for row in sample)
    return InputError(
        f"rows break the rule {rule}, e.g. {shown}. The view cannot hold them: fix or filter "
        "them in the query, or set on_error='table' to keep them in the errors table. Nothing "
        "was committed.",
        where,
    )
