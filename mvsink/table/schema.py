"""Schemas: what desired may look like, whether it fits the target, and how it may change.

The target's schema is desired's with every field made nullable (Spark's nullability
inference changes with the plan; a view must not fail because an aggregate became nullable).
Desired fits the target when it has the same column names and, column by column, the same
types up to nullability; column order may differ (rows are selected in the target's order).

When it does not fit, ``schema_change`` says how: columns added, dropped, widened (a type
every old value converts to exactly: ``WIDENINGS``), and what no change of the table can
make (a narrowed or otherwise changed type). ``check_evolution`` holds the rules of
``schema_changes = "evolve"``. The invariant they keep with ``epoch/run.py``: a view's table
only takes a schema that desired has, with the epoch that writes desired's rows in it (in its
commit; through delta-rs in upsert and append mode, in a version of its own right before it,
made once the epoch's files are staged), and never goes back to a schema it left (a replica
still on the old query is refused, ``schema_digest``). Refusals say what a person needs: a
struct, array or map column that changed, which field inside it did (``_inside``); a dropped
column, which of the table's rules or settings names it (``named_by_the_table``, reading a
CHECK constraint as the engine that added it wrote it: ``_sql_tokens``, and ``spark_sql``
hands it to Spark).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from mvsink.compat import to_arrow_schema
from mvsink.errors import ConfigError, InputError, SchemaMismatchError, Where

_PRIMITIVES = (
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    TimestampNTZType,
    TimestampType,
)
# Without column mapping, Delta (and Parquet readers) reject these in column names.
_BAD_NAME_CHARS = set(" ,;{}()\n\t=")


def _unsupported(t: DataType, path: str) -> list[str]:
    if isinstance(t, StructType):
        return [p for f in t.fields for p in _unsupported(f.dataType, f"{path}.{f.name}")]
    if isinstance(t, ArrayType):
        return _unsupported(t.elementType, f"{path}[]")
    if isinstance(t, MapType):
        return _unsupported(t.keyType, f"{path}{{key}}") + _unsupported(t.valueType, f"{path}{{value}}")
    if isinstance(t, _PRIMITIVES):
        return []
    return [f"{path.lstrip('.')} ({t.simpleString()})"]


def _field_names(t: DataType, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], str]]:
    """Every struct field's path and name in ``t``, top-level columns first, through arrays
    and maps (Delta checks nested names as it checks columns)."""
    out: list[tuple[tuple[str, ...], str]] = []
    if isinstance(t, StructType):
        out += [((*path, f.name), f.name) for f in t.fields]
        for f in t.fields:
            out += _field_names(f.dataType, (*path, f.name))
    elif isinstance(t, ArrayType):
        out += _field_names(t.elementType, (*path[:-1], f"{path[-1]}[]") if path else path)
    elif isinstance(t, MapType):
        key = (*path[:-1], f"{path[-1]}{{key}}") if path else path
        value = (*path[:-1], f"{path[-1]}{{value}}") if path else path
        out += _field_names(t.keyType, key) + _field_names(t.valueType, value)
    return out


def check_supported(schema: StructType, where: Where) -> None:
    """Raise ``InputError`` if desired cannot be stored as a Delta table mvsink keeps."""
    if not schema.fields:
        raise InputError("desired has no columns", where)
    lowered: dict[str, str] = {}
    for name in schema.names:
        if name.lower() in lowered:
            raise InputError(
                f"desired has columns {lowered[name.lower()]!r} and {name!r}, which Delta treats "
                "as the same column; rename one",
                where,
            )
        lowered[name.lower()] = name
    for path, name in _field_names(schema, ()):
        bad = sorted(set(name) & _BAD_NAME_CHARS)
        if not name or bad:
            what = f"column name {name!r}" if len(path) == 1 else f"field name {'.'.join(path)!r}"
            fix = "alias the column" if len(path) == 1 else "rename the field (cast to a struct type)"
            raise InputError(
                f"{what} has characters Delta refuses without column mapping ({''.join(bad)!r}); {fix}",
                where,
            )
    bad_types = _unsupported(schema, "")
    if bad_types:
        raise InputError(
            "Delta cannot store these columns: " + ", ".join(bad_types) + "; cast or drop them",
            where,
        )


def _relaxed(node: Any) -> Any:
    """A schema JSON node with every nullability set to true and field metadata emptied."""
    if isinstance(node, dict):
        out = {k: _relaxed(v) for k, v in node.items()}
        for key in ("nullable", "containsNull", "valueContainsNull"):
            if key in out:
                out[key] = True
        if "nullable" in out:  # a struct field
            out["metadata"] = {}
        return out
    if isinstance(node, list):
        return [_relaxed(v) for v in node]
    return node


def target_schema_json(desired: StructType) -> str:
    """The schema a new target gets for ``desired`` (Delta's schema JSON is Spark's)."""
    return json.dumps(_relaxed(json.loads(desired.json())))


def target_struct(schema_json: str) -> StructType:
    """The target's schema as a Spark ``StructType``."""
    return StructType.fromJson(json.loads(schema_json))


SINK_ADVICE = (
    "The sink's schema_changes is 'refuse': cast desired, set schema_changes = 'evolve' to change the "
    "view's table in place (docs/modes.md), or write the view to a new target."
)
"""What a sink whose desired does not fit its table can do (``check_fits``'s default advice)."""


def check_fits(desired: StructType, schema_json: str, where: Where, advice: str = SINK_ADVICE) -> None:
    """Raise ``SchemaMismatchError`` naming every column where desired and target differ, then
    ``advice``: what the caller (a sink, ``verify``) can do about it."""
    want = {f["name"]: f["type"] for f in _relaxed(json.loads(schema_json))["fields"]}
    have = {f["name"]: f["type"] for f in _relaxed(json.loads(desired.json()))["fields"]}
    problems, columns = [], []
    for name in want.keys() - have.keys():
        problems.append(f"{name!r} is in the target but not in desired")
        columns.append(name)
    for name in have.keys() - want.keys():
        problems.append(f"{name!r} is in desired but not in the target")
        columns.append(name)
    for name in want.keys() & have.keys():
        if want[name] != have[name]:
            problems.append(f"{name!r} is {_show(want[name])} in the target, {_show(have[name])} in desired")
            columns.append(name)
    if problems:
        raise SchemaMismatchError(
            "desired's schema differs from the target's: " + "; ".join(sorted(problems)) + ". " + advice,
            where,
            columns=tuple(sorted(columns)),
        )


_INTEGRAL = ("byte", "short", "integer", "long")
WIDENINGS = frozenset(
    {(a, b) for i, a in enumerate(_INTEGRAL) for b in _INTEGRAL[i + 1 :]}
    | {("float", "double"), ("date", "timestamp_ntz")}
)
"""Type changes (Delta's type names) that convert every value of the old type exactly; a
decimal widens when neither its integer digits nor its scale shrink (``_widens``)."""
_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")


def _widens(old: Any, new: Any) -> bool:
    if not isinstance(old, str) or not isinstance(new, str):
        return False
    if (old, new) in WIDENINGS:
        return True
    a, b = _DECIMAL.fullmatch(old), _DECIMAL.fullmatch(new)
    if a is None or b is None:
        return False
    (p1, s1), (p2, s2) = (int(a[1]), int(a[2])), (int(b[1]), int(b[2]))
    return (p2, s2) != (p1, s1) and s2 >= s1 and p2 - s2 >= p1 - s1


@dataclass(frozen=True)
class SchemaChange:
    """How desired's columns differ from the target's (``schema_change``)."""

    added: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    widened: tuple[tuple[str, str, str], ...] = ()
    """(column, the target's type, desired's type)."""
    changed: tuple[tuple[str, str, str], ...] = ()
    """Types no change of the table keeps every value of: narrowed, or another type."""
    nested: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(column, how fields inside it differ) for each changed column that is a struct, array
    or map in both schemas: ``adds field s.c inside struct s``, ... (``_inside``)."""

    def __bool__(self) -> bool:
        return bool(self.added or self.dropped or self.widened or self.changed)

    def says(self) -> str:
        parts = [f"{c!r} added" for c in self.added] + [f"{c!r} dropped" for c in self.dropped]
        parts += [f"{c!r} widened from {a} to {b}" for c, a, b in self.widened]
        parts += [f"{c!r} changed from {a} to {b}" for c, a, b in self.changed]
        return ", ".join(parts)


def schema_change(desired: StructType, schema_json: str) -> SchemaChange:
    """How ``desired`` (the columns the view stores) differs from the target's schema, up to
    nullability and column order: empty when it fits."""
    want = {f["name"]: f["type"] for f in _relaxed(json.loads(schema_json))["fields"]}
    have = {f["name"]: f["type"] for f in _relaxed(json.loads(desired.json()))["fields"]}
    widened: list[tuple[str, str, str]] = []
    changed: list[tuple[str, str, str]] = []
    nested: list[tuple[str, tuple[str, ...]]] = []
    for name in sorted(want.keys() & have.keys()):
        if want[name] != have[name]:
            kind = widened if _widens(want[name], have[name]) else changed
            kind.append((name, _show(want[name]), _show(have[name])))
            if _kind(want[name]) == _kind(have[name]) != "primitive":
                nested.append((name, tuple(_inside(want[name], have[name], name))))
    return SchemaChange(
        added=tuple(n for n in desired.names if n not in want),
        dropped=tuple(sorted(want.keys() - have.keys())),
        widened=tuple(widened),
        changed=tuple(changed),
        nested=tuple(nested),
    )


def _kind(t: Any) -> str:
    """A schema JSON type's kind: ``struct``, ``array``, ``map`` or ``primitive``."""
    return str(t.get("type")) if isinstance(t, dict) else "primitive"


def _inside(old: Any, new: Any, path: str) -> list[str]:
    """How a nested type differs inside, field by field (``path`` names the field, ``s.a``,
    ``items[]`` for an array's elements, ``m{value}`` for a map's values): what a reader of
    the refusal needs rather than two whole types to compare."""
    kind = _kind(old)
    if kind != _kind(new) or kind == "primitive":
        return [] if old == new else [f"changes {path} from {_show(old)} to {_show(new)}"]
    if kind == "array":
        return _inside(old["elementType"], new["elementType"], f"{path}[]")
    if kind == "map":
        return _inside(old["keyType"], new["keyType"], f"{path}{{key}}") + _inside(
            old["valueType"], new["valueType"], f"{path}{{value}}"
        )
    before = {f["name"]: f["type"] for f in old["fields"]}
    after = {f["name"]: f["type"] for f in new["fields"]}
    out = [f"adds field {path}.{n} inside struct {path}" for n in after if n not in before]
    out += [f"drops field {path}.{n} from struct {path}" for n in before if n not in after]
    for n in (n for n in before if n in after):
        out += _inside(before[n], after[n], f"{path}.{n}")
    if not out and list(before) != list(after):
        out.append(f"orders the fields of struct {path} otherwise")
    return out


def evolved_schema_json(schema_json: str, desired: StructType) -> str:
    """The table's schema with desired's columns: each column the table keeps as the table has
    it (its comment, generation expression and other field metadata, its place), with
    desired's type where that widened; desired's added columns after them, nullable, as a new
    target gets them; dropped columns gone."""
    table = json.loads(schema_json)
    have = {f["name"]: f for f in _relaxed(json.loads(desired.json()))["fields"]}
    widened = {c for c, _, _ in schema_change(desired, schema_json).widened}
    kept = [
        {**f, "type": have[f["name"]]["type"]} if f["name"] in widened else f
        for f in table["fields"]
        if f["name"] in have
    ]
    names = {f["name"] for f in kept}
    added = [f for name, f in have.items() if name not in names]
    return json.dumps({**table, "fields": kept + added})


def named_by_the_table(schema_json: str, configuration: Mapping[str, str | None]) -> list[tuple[str, str]]:
    """The columns the table's own rules and settings name, with what names them: a NOT NULL
    column, a CHECK constraint (``delta.constraints.*``: a column any name in its expression
    may be, quoted or not, ``sql_names``: a conservative reading), the statistics columns
    (``delta.dataSkippingStatsColumns``, a struct column also through one of its fields)."""
    out: list[tuple[str, str]] = []
    fields = json.loads(schema_json)["fields"]
    columns = [f["name"] for f in fields]
    out += [(f["name"], "NOT NULL constraint") for f in fields if not f.get("nullable", True)]
    for key, value in configuration.items():
        if key.startswith("delta.constraints.") and value:
            names = sql_names(value, columns)
            out += [(c, f"constraint {key}") for c in columns if c.lower() in names]
    stats = stats_columns(configuration.get("delta.dataSkippingStatsColumns") or "")
    out += [
        (c, f"delta.dataSkippingStatsColumns ({stats[c.lower()]})") for c in columns if c.lower() in stats
    ]
    return out


def stats_columns(value: str) -> dict[str, str]:
    """The top-level columns a ``delta.dataSkippingStatsColumns`` value names, lowercased (Delta
    matches names so), each with the entry that names it. An entry is a column's path, its
    parts separated by dots and backtick-quoted where they need it (a doubled backtick inside
    is one): ``s.a`` and `` `s`.`a` `` both name column ``s``, through its field ``a``."""
    out: dict[str, str] = {}
    for entry in _STATS_ENTRY.findall(value):
        first = _STATS_FIRST.match(entry)
        assert first is not None  # the pattern matches any text
        quoted, bare = first.groups()
        name = quoted.replace("``", "`") if quoted is not None else bare.strip()
        if name:
            out.setdefault(name.lower(), entry.strip())
    return out


_STATS_ENTRY = re.compile(r"(?:`(?:[^`]|``)*`?|[^,`])+")
_STATS_FIRST = re.compile(r"\s*(?:`((?:[^`]|``)*)`?|([^.]*))")

# A CHECK constraint's text is SQL of the engine that added it. The JVM Delta keeps what its
# author wrote in Spark's SQL (backtick-quoted names; a double-quoted text is a string);
# delta-rs parses it and stores it re-rendered in SQL's standard quoting, a name double-quoted
# where it needs quoting (``"größe"``, ``"Amount"``, ``"q""x"``). Tokens of either, as far as
# telling names from string literals goes:
_SQL_TOKEN = re.compile(
    r"""'(?:[^'\\]|\\.)*'?     # a string literal (Spark's escapes; '' reads as two: alike here)
      | "(?:[^"]|"")*"?        # a name in SQL's quoting ("" is one "), or Spark's string
      | `(?:[^`]|``)*`?        # a name in Spark's quoting (`` is one `)
      | \w+                    # a bare name, keyword or number (any script's letters)
      | .""",
    re.VERBOSE | re.DOTALL,
)
_SPARK_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.DOTALL)


def _sql_tokens(expression: str, columns: Collection[str]) -> Iterator[tuple[str, str | None]]:
    """``expression``'s tokens as ``(text, the name it is)``; the name is None for a string
    literal, a number or an operator. A double-quoted token is a name only if it names one
    of ``columns`` (as Spark resolves names: case-insensitively), else it is Spark's string
    literal: so a constraint reads as each engine that may have written it means it."""
    lowered = {c.lower() for c in columns}
    pos = 0
    while pos < len(expression):
        token = _SQL_TOKEN.match(expression, pos)
        assert token is not None  # ``.`` matches any character
        text, name = token.group(), None
        if text[0] in '`"':
            name = _unquote(text)
            if text[0] == '"' and name.lower() not in lowered:
                token, name = _SPARK_STRING.match(expression, pos), None
                assert token is not None
                text = token.group()
        elif text[0].isalpha() or text[0] == "_":
            name = text
        yield text, name
        pos = token.end()


def _unquote(text: str) -> str:
    quote = text[0]
    inner = text[1:-1] if len(text) > 1 and text.endswith(quote) else text[1:]
    return inner.replace(quote * 2, quote)


def spark_sql(expression: str, columns: Collection[str]) -> str:
    """A table's CHECK constraint as Spark's SQL (what ``F.expr`` parses): each name of one of
    ``columns`` in SQL's double quotes, as delta-rs stores it, in backticks instead (a
    backtick inside it doubled); the rest as written, string literals included."""
    return "".join(
        "`" + name.replace("`", "``") + "`" if name is not None and text[0] == '"' else text
        for text, name in _sql_tokens(expression, columns)
    )


def sql_names(expression: str, columns: Collection[str]) -> set[str]:
    """Every name (lowercased) a CHECK constraint's ``expression`` may refer to a column by:
    bare (in any script), backtick-quoted, or double-quoted (``_sql_tokens``); and, to err
    on the side of naming, each word inside its string literals."""
    out: set[str] = set()
    for text, name in _sql_tokens(expression, columns):
        if name is not None:
            out.add(name.lower())
        elif text[0] in "'\"":
            out.update(w.lower() for w in re.findall(r"\w+", text))
    return out


def schema_digest(schema: StructType | str) -> str:
    """A schema as mvsink records it (``record.Keys.retired_schema``): its columns' names and
    types up to nullability and column order."""
    node = json.loads(schema if isinstance(schema, str) else schema.json())
    fields = sorted((f["name"], f["type"]) for f in _relaxed(node)["fields"])
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def check_evolution(
    change: SchemaChange,
    *,
    mode: str,
    desired: StructType,
    roles: Sequence[tuple[str, str]],
    mapped: bool,
    features: frozenset[str],
    named: Sequence[tuple[str, str]] = (),
    where: Where,
) -> None:
    """Raise ``SchemaMismatchError`` naming every part of ``change`` that
    ``schema_changes = "evolve"`` does not make: a changed or narrowed type; a change to a
    column with a role (``roles``: (column, role) pairs: key, sequence, partition column),
    for which a new target is the honest answer; on a table with column mapping, any change
    (not built yet); a column that needs a table feature the table's protocol (``features``)
    lacks; a dropped column that the table's own rules or settings name (``named``: (column,
    what names it)); in upsert and append mode, anything but added nullable columns."""
    inside = dict(change.nested)
    problems = [
        f"{c!r} is {a} in the target and {b} in desired: desired {'; '.join(inside[c])}; a "
        "schema change adds, drops and widens top-level columns only, not fields inside a "
        "struct, array or map: add a top-level column instead"
        if inside.get(c)
        else f"{c!r} is {a} in the target and {b} in desired, which is not a widening"
        for c, a, b in change.changed
    ]
    touched = {*change.added, *change.dropped, *(c for c, _, _ in (*change.widened, *change.changed))}
    problems += [f"{c!r} is the view's {role} column" for c, role in roles if c in touched]
    if mapped:
        problems.append("the table has column mapping, whose schema changes mvsink does not make yet")
    for column, rule in named:
        if column in change.dropped:
            problems.append(f"{column!r} is dropped, and the table's {rule} names it: drop that first")
    ntz = [c for c in touched if c in desired.names and "timestamp_ntz" in desired[c].dataType.json()]
    if ntz and "timestampNtz" not in features:
        # A table holding timestamp_ntz needs the feature in its protocol, or no reader opens it.
        problems.append(
            f"{', '.join(map(repr, sorted(ntz)))} would be timestamp_ntz, which needs the table "
            "feature timestampNtz that the table lacks: add it first (ALTER TABLE ... SET "
            "TBLPROPERTIES ('delta.feature.timestampNtz' = 'supported'))"
        )
    if mode != "complete":
        problems += _beyond_added_columns(change, mode, desired)
    if problems:
        raise SchemaMismatchError(
            f"schema_changes is 'evolve', but this change ({change.says()}) is refused: "
            + "; ".join(problems)
            + ". Nothing was written: cast desired, or write the view to a new target.",
            where,
            columns=tuple(sorted(touched)),
        )


def _beyond_added_columns(change: SchemaChange, mode: str, desired: StructType) -> list[str]:
    """What of ``change`` upsert and append mode (``mode``) refuse: anything but added
    nullable columns, since the rows an epoch does not touch are never rewritten."""
    problems = []
    if change.dropped or change.widened:
        problems.append(
            f"in {mode} mode a view's table only takes added columns "
            f"({change.says()}); a dropped or widened column needs its rows rewritten, "
            "which only complete mode does"
        )
    strict = [c for c in change.added if not desired[c].nullable]
    if strict:
        problems.append(
            f"{', '.join(map(repr, strict))} is added non-nullable: in {mode} mode the rows "
            "the epoch does not touch keep null in an added column; make it nullable in the "
            "query (e.g. F.when(F.lit(True), column))"
        )
    return problems


def _show(t: Any) -> str:
    """A schema JSON type as a person reads it: Delta's name of a primitive type (``long``),
    Spark's ``simpleString`` of a nested one (``struct<a:int,b:string>``)."""
    if isinstance(t, str):
        return t
    try:
        field = {"name": "t", "type": t, "nullable": True, "metadata": {}}
        return StructType.fromJson({"type": "struct", "fields": [field]})["t"].dataType.simpleString()
    except Exception:  # a type this PySpark does not know: its JSON, rather than no message
        return json.dumps(t, separators=(",", ":"))


CLUSTER_TYPES = _PRIMITIVES
"""Types ``cluster_by`` sorts by: Spark's order for them is Arrow's (``write.clustered``);
Arrow sorts no nested type, and Spark orders strings of another collation by it."""
_PARTITION_TYPES = (StringType, ByteType, ShortType, IntegerType, LongType, DateType, BooleanType)
_SEQUENCE_TYPES = (
    ByteType,
    ShortType,
    IntegerType,
    LongType,
    DecimalType,
    FloatType,
    DoubleType,
    DateType,
    TimestampType,
    TimestampNTZType,
    StringType,
)


def _field(schema: StructType, name: str, option: str, where: Where) -> DataType:
    if name not in schema.names:
        raise InputError(
            f"option {option!r} names {name!r}, which desired does not have "
            f"(columns: {', '.join(schema.names)})",
            where,
        )
    return schema[name].dataType


def stored_struct(desired: StructType, delete_column: str | None) -> StructType:
    """The columns the target stores: desired's, less the delete marker."""
    return StructType([f for f in desired.fields if f.name != delete_column])


def check_roles(
    desired: StructType,
    *,
    key: tuple[str, ...],
    delete_column: str | None,
    sequence_column: str | None,
    partition_by: tuple[str, ...],
    cluster_by: tuple[str, ...] = (),
    where: Where,
) -> None:
    """Raise ``InputError`` unless the named key, marker and partition columns fit desired,
    and ``ConfigError`` unless each ``cluster_by`` column is one the view stores and rows sort
    by alike in Spark's tasks and on the driver (``CLUSTER_TYPES``)."""
    for name in key:
        t = _field(desired, name, "key", where)
        if not isinstance(t, _PRIMITIVES) or isinstance(t, FloatType | DoubleType):
            raise InputError(f"key column {name!r} is {t.simpleString()}; keys must be exact scalars", where)
        _check_binary_collation(t, f"key column {name!r}", where)
    if delete_column is not None and not isinstance(
        _field(desired, delete_column, "delete_column", where), BooleanType
    ):
        raise InputError(f"delete_column {delete_column!r} must be boolean", where)
    if sequence_column is not None:
        t = _field(desired, sequence_column, "sequence_column", where)
        if not isinstance(t, _SEQUENCE_TYPES):
            raise InputError(
                f"sequence_column {sequence_column!r} is {t.simpleString()}, which does not order", where
            )
        _check_binary_collation(t, f"sequence_column {sequence_column!r}", where)
    stored = stored_struct(desired, delete_column)
    for name in partition_by:
        t = _field(stored, name, "partition_by", where)
        if not isinstance(t, _PARTITION_TYPES):
            raise InputError(
                f"partition column {name!r} is {t.simpleString()}; partition by string, integer, date "
                "or boolean columns",
                where,
            )
    if partition_by and len(partition_by) >= len(stored.fields):
        raise InputError("every column is a partition column; keep at least one data column", where)
    check_cluster_by(stored, cluster_by, where)


def check_cluster_by(stored: StructType, cluster_by: Sequence[str], where: Where) -> None:
    """``ConfigError`` unless each ``cluster_by`` column is one the view stores and rows sort by
    alike in Spark's tasks and on the driver (``CLUSTER_TYPES``)."""
    for name in cluster_by:
        if name not in stored.names:
            raise ConfigError(
                f"option 'cluster_by' names {name!r}, which the view does not store "
                f"(columns: {', '.join(stored.names)})",
                where,
            )
        t = stored[name].dataType
        collation = getattr(t, "collation", "UTF8_BINARY") if isinstance(t, StringType) else "UTF8_BINARY"
        if not isinstance(t, CLUSTER_TYPES) or collation != "UTF8_BINARY":
            raise ConfigError(
                f"option 'cluster_by': column {name!r} is {t.simpleString()}, which rows are not "
                "sorted by alike in Spark's tasks and on the driver; cluster by scalar columns "
                "(numbers, strings of the default collation, binary, booleans, dates, timestamps), "
                "e.g. one derived from it in the query",
                where,
            )


def _check_binary_collation(t: DataType, what: str, where: Where) -> None:
    """Upsert mode compares keys and sequences in Spark (grouping, ordering) and in Arrow
    (joins, chunks), byte by byte: a string with another collation (Spark 4's
    ``UTF8_LCASE``, ``UNICODE_CI``, ...) would be one key to Spark and two to Arrow."""
    collation = getattr(t, "collation", "UTF8_BINARY") if isinstance(t, StringType) else "UTF8_BINARY"
    if collation != "UTF8_BINARY":
        raise InputError(
            f"{what} is {t.simpleString()}: upsert mode compares strings byte by byte, so it needs "
            "the default collation (UTF8_BINARY); cast it (e.g. lower() it for a case-insensitive key)",
            where,
        )


PHYSICAL_NAME = "delta.columnMapping.physicalName"
"""Field metadata of a table with column mapping: the column's name in the data files."""
COLUMN_ID = "delta.columnMapping.id"
"""... and its Parquet field id (what readers in ``id`` mode match columns by)."""
_ARROW_PHYSICAL = PHYSICAL_NAME.encode()
_ARROW_FIELD_ID = b"PARQUET:field_id"


def arrow_schema(struct: StructType) -> pa.Schema:
    """The Arrow schema of the target's rows, wherever they are held (driver, task, file):
    the types Spark exchanges with Arrow (timestamps in microseconds, UTC). On a table with
    column mapping each field (nested ones too) carries its physical name and field id in its
    Arrow metadata, which the I/O layer reads and writes files by (``physical_field``)."""
    arrow = to_arrow_schema(struct)
    if not any(_mapped(f) for f in struct.fields):
        return arrow
    return pa.schema([_with_mapping(a, f) for a, f in zip(arrow, struct.fields, strict=True)])


def _mapped(field: Any) -> bool:
    if PHYSICAL_NAME in (field.metadata or {}):
        return True
    return any(_mapped(f) for f in _struct_fields(field.dataType))


def _struct_fields(t: DataType) -> list[Any]:
    if isinstance(t, StructType):
        return list(t.fields)
    if isinstance(t, ArrayType):
        return _struct_fields(t.elementType)
    if isinstance(t, MapType):
        return _struct_fields(t.keyType) + _struct_fields(t.valueType)
    return []


def _with_mapping(arrow: pa.Field, field: Any) -> pa.Field:
    """``arrow`` (the Arrow form of Spark's ``field``) with the field's column mapping as Arrow
    metadata, nested fields included."""
    meta = field.metadata or {}
    extra = {}
    if PHYSICAL_NAME in meta:
        extra[_ARROW_PHYSICAL] = str(meta[PHYSICAL_NAME]).encode()
    if COLUMN_ID in meta:
        extra[_ARROW_FIELD_ID] = str(meta[COLUMN_ID]).encode()
    out = arrow.with_type(_type_with_mapping(arrow.type, field.dataType))
    return out.with_metadata({**(arrow.metadata or {}), **extra}) if extra else out


def _type_with_mapping(arrow: pa.DataType, spark: DataType) -> pa.DataType:
    if isinstance(spark, StructType):
        return pa.struct([_with_mapping(arrow.field(i), f) for i, f in enumerate(spark.fields)])
    if isinstance(spark, ArrayType):
        return pa.list_(arrow.value_field.with_type(_type_with_mapping(arrow.value_type, spark.elementType)))
    if isinstance(spark, MapType):
        key = arrow.key_field.with_type(_type_with_mapping(arrow.key_type, spark.keyType))
        item = arrow.item_field.with_type(_type_with_mapping(arrow.item_type, spark.valueType))
        return pa.map_(key, item)
    return arrow


def is_mapped(schema: pa.Schema) -> bool:
    """Whether an ``arrow_schema`` carries column mapping (its files name columns otherwise)."""
    return any(_physical_differs(f) for f in schema)


def _physical_differs(field: pa.Field) -> bool:
    return (field.metadata is not None and _ARROW_PHYSICAL in field.metadata) or any(
        _physical_differs(f) for f in _children(field.type)
    )


def _children(t: pa.DataType) -> list[pa.Field]:
    if pa.types.is_struct(t):
        return [t.field(i) for i in range(t.num_fields)]
    if pa.types.is_map(t):
        return [t.key_field, t.item_field]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [t.value_field]
    return []


def physical_name(field: pa.Field) -> str:
    """The name of ``field``'s column in the table's data files."""
    if field.metadata and _ARROW_PHYSICAL in field.metadata:
        return str(field.metadata[_ARROW_PHYSICAL].decode())
    return str(field.name)


def field_id(field: pa.Field) -> str | None:
    """``field``'s Parquet field id (column mapping's ``id``), if it has one."""
    if field.metadata and _ARROW_FIELD_ID in field.metadata:
        return str(field.metadata[_ARROW_FIELD_ID].decode())
    return None


def physical_field(field: pa.Field) -> pa.Field:
    """``field`` as the table's data files hold it: physical names all the way down, and field
    ids; the same type layout, so a column converts either way by a zero-copy ``view``."""
    return pa.field(
        physical_name(field),
        _physical_type(field.type),
        field.nullable,
        {k: v for k, v in (field.metadata or {}).items() if k == _ARROW_FIELD_ID} or None,
    )


def _physical_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(t):
        return pa.struct([physical_field(t.field(i)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(physical_field(t.key_field), physical_field(t.item_field))
    if pa.types.is_list(t):
        return pa.list_(physical_field(t.value_field))
    return t
