"""How the table's own rules and settings are read for the columns they name: a CHECK
constraint in either engine's quoting, the statistics columns by path. (The sink's behaviour
with them, on real tables: tests/plan/test_rules.py, tests/test_schema_changes.py.)"""

from __future__ import annotations

import pytest

from mvsink.table.schema import spark_sql, sql_names, stats_columns

COLUMNS = ["id", "größe", "Amount", 'q"x', "a`b", "note"]


@pytest.mark.parametrize(
    ("stored", "spark"),
    [
        ('"größe" > 0', "`größe` > 0"),
        ('"AMOUNT" >= 0', "`AMOUNT` >= 0"),  # Spark resolves names case-insensitively
        ('"q""x" > 0', '`q"x` > 0'),  # SQL's doubled quote is one
        ('"a`b" > 0', "`a``b` > 0"),  # Spark's doubled backtick is one
        ("`größe` > 0 AND id > 0", "`größe` > 0 AND id > 0"),  # Spark's own quoting stays
        # A double quote inside a string literal is the literal's, in either engine's escapes.
        ("note != 'say \"größe\"'", "note != 'say \"größe\"'"),
        ("note != 'it''s \"größe\"'", "note != 'it''s \"größe\"'"),
        ('note != \'it\\\'s "größe"\' AND "größe" > 0', "note != 'it\\'s \"größe\"' AND `größe` > 0"),
        # Not a column: a string in Spark's SQL, as the JVM Delta keeps what its author wrote.
        ('note != "closed"', 'note != "closed"'),
        ('note != "a\\"größe" AND "größe" > 0', 'note != "a\\"größe" AND `größe` > 0'),
    ],
)
def test_a_constraint_becomes_sparks_sql_with_only_its_names_requoted(stored, spark):
    assert spark_sql(stored, COLUMNS) == spark


@pytest.mark.parametrize(
    ("expression", "named"),
    [
        ('"größe" > 0', {"größe"}),
        ("`größe` > 0", {"größe"}),
        ('"q""x" > 0 AND "a`b" < 1', {'q"x', "a`b"}),
        ("amount >= 0", {"amount"}),
        ("note != 'id'", {"note", "id"}),  # a word in a literal counts: a conservative reading
    ],
)
def test_the_names_a_constraint_may_refer_to_a_column_by(expression, named):
    assert named <= sql_names(expression, COLUMNS)


@pytest.mark.parametrize(
    ("value", "columns"),
    [
        ("s.a", {"s": "s.a"}),
        ("`s`.`a`", {"s": "`s`.`a`"}),
        ("id, `s`.a", {"id": "id", "s": "`s`.a"}),
        ("`x.y`", {"x.y": "`x.y`"}),  # a name with a dot, quoted
        ("`a``b`.c , Größe", {"a`b": "`a``b`.c", "größe": "Größe"}),
        (" , ", {}),
    ],
)
def test_the_stats_columns_name_top_level_columns_by_path(value, columns):
    assert stats_columns(value) == columns
