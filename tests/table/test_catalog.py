"""Targets given as table names (``catalog.py``): a name is never a folder.

Sessions here have no Delta: a name resolves to nothing, and the sink says so before anything
is written. Resolving names of Delta tables is tested beside the JVM Delta runtime
(tests/interop).
"""

from __future__ import annotations

import os

import pytest

from mvsink import ConfigError, MVSink
from mvsink.errors import Where
from mvsink.table.catalog import is_path
from tests.helpers import people


def test_what_is_a_path_and_what_is_a_name():
    for path in ("/lake/v", "./v", "../v", "data/views/v", "s3://b/v", "file:///v", "abfss://c@a/v"):
        assert is_path(path), path
    names = ("revenue", "default.revenue", "spark_catalog.default.revenue", "`my table`.`x.y`", "`a/b`")
    for name in (*names, "delta.`/lake/t`", "sales.`q1/q2`", "delta.`s3://b/t`"):
        assert not is_path(name), name
    with pytest.raises(ConfigError, match=r"neither a path .* nor a table name"):
        MVSink("sales.`q1/q2", "v")  # a backquote makes it a name, and this one is not well formed
    with pytest.raises(ConfigError, match=r"neither a path .* nor a table name"):
        MVSink("my revenue", "v")
    with pytest.raises(ConfigError, match="must be a path or URI"):
        MVSink("./v", "v", metrics_table="ops.metrics")
    with pytest.raises(ConfigError, match=r"errors_target.*table name needs"):
        MVSink("sales.revenue", "v", on_error="table")
    # A history may be named (catalog.py resolves it as it does the target), but not ill-formed,
    # nor as the target itself.
    assert MVSink("sales.revenue", "v", history_target="sales.revenue_history").options.history_target
    with pytest.raises(ConfigError, match=r"history_target.*neither a path"):
        MVSink("./v", "v", history_target="revenue history")
    with pytest.raises(ConfigError, match=r"history_target.*is the target itself"):
        MVSink("sales.revenue", "v", history_target="sales.revenue")


@pytest.mark.parametrize("name", ["revenue", "default.revenue", "`default`.`revenue`", "default.`q1/q2`"])
def test_a_name_the_catalog_does_not_know_is_an_error_never_a_folder(spark, tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    sink = MVSink(name, "revenue")
    with pytest.raises(ConfigError, match=r"catalog does not know.*'\./") as info:
        sink(people(spark, range(3)), 0)
    assert info.value.view == "revenue"
    assert os.listdir(tmp_path) == []  # no folder made from the name
    # The explicit path form is a folder of that name.
    assert MVSink("./revenue", "revenue")(people(spark, range(3)), 0).outcome == "committed"
    assert os.listdir(tmp_path) == ["revenue"]


def test_a_history_named_that_the_catalog_does_not_know_is_an_error_never_a_folder(
    spark, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ConfigError, match=r"history_target 'revenue_history' is a table name the session's catalog does not know"
    ):
        MVSink("./revenue", "revenue", history_target="revenue_history")(people(spark, range(3)), 0)
    assert os.listdir(tmp_path) == []  # neither the view's table nor a folder made from the name


def test_a_name_needs_delta_in_the_session_to_resolve(spark, tmp_path, monkeypatch):
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    spark.sql(f"CREATE TABLE people_now (id long) USING parquet LOCATION '{tmp_path / 'elsewhere'}'")
    try:
        with pytest.raises(ConfigError, match="needs Delta in the Spark session"):
            MVSink("people_now", "v")(people(spark, range(3)), 0)
        assert os.listdir(tmp_path / "cwd") == []
        # Both a catalog entry and a Delta table in a folder of that name: ambiguous, refused.
        MVSink("./people_now", "v")(people(spark, range(3)), 0)
        with pytest.raises(ConfigError, match="both a table in the session's catalog and a Delta table"):
            MVSink("people_now", "v")(people(spark, range(5)), 1)
    finally:
        spark.sql("DROP TABLE IF EXISTS people_now")


@pytest.mark.parametrize("kind", ["temporary", "global temporary", "persistent"])
def test_a_view_named_as_the_target_is_refused_as_a_view(spark, tmp_path, monkeypatch, kind):
    """A view has no location to keep: the error says so (not that Delta is missing), for the
    sink and the operations alike, and nothing is written."""
    from mvsink import status

    monkeypatch.chdir(tmp_path)
    name, create = {
        "temporary": ("recent", "CREATE TEMPORARY VIEW recent AS SELECT 1 AS id"),
        "global temporary": ("global_temp.recent", "CREATE GLOBAL TEMPORARY VIEW recent AS SELECT 1 AS id"),
        "persistent": ("default.recent", "CREATE VIEW default.recent AS SELECT 1 AS id"),
    }[kind]
    spark.sql(create)
    try:
        with pytest.raises(ConfigError, match=r"'[a-z_.]*recent' is a view, not a table") as info:
            MVSink(name, "v")(people(spark, range(3)), 0)
        assert info.value.view == "v"
        with pytest.raises(ConfigError, match="is a view, not a table"):
            status(name)
    finally:
        spark.sql(f"DROP VIEW IF EXISTS {name}")
    assert os.listdir(tmp_path) == []


def test_a_location_is_kept_exactly_or_refused():
    """Hadoop prints a location decoded, ``#`` and ``?`` included: on local disk they are part
    of the path (delta-rs keeps them so), in an object store URI delta-rs would drop what
    follows them (another folder), so such a location is refused."""
    from mvsink.table.catalog import _hadoop_location

    where = Where("v", "sales.orders")
    for given, kept in [
        ("file:/lake/orders#v2", "/lake/orders#v2"),
        ("file:///lake/orders?v=2", "/lake/orders?v=2"),
        ("file://localhost/lake/a b#c?d", "/lake/a b#c?d"),
        ("s3a://bucket/lake/orders", "s3a://bucket/lake/orders"),
    ]:
        assert _hadoop_location("sales.orders", given, where) == kept
    for given in ("s3a://bucket/lake/orders#v2", "abfss://c@a.dfs.core.windows.net/orders?v=2"):
        with pytest.raises(
            ConfigError, match=r"delta-rs would read as the start of a URL's (fragment|query)"
        ):
            _hadoop_location("sales.orders", given, where)
    with pytest.raises(ConfigError, match="not a local absolute path"):
        _hadoop_location("sales.orders", "file://otherhost/lake/orders", where)


def test_the_operations_resolve_names_through_the_session_and_make_no_folder(
    spark, tmp_path, monkeypatch, capsys
):
    from mvsink import frontier, promote, status, vacuum
    from mvsink.cli.main import main
    from mvsink.ops.compact import compact

    monkeypatch.chdir(tmp_path)
    for call in (
        lambda: status("default.revenue"),
        lambda: frontier("default.revenue", "revenue"),
        lambda: vacuum("default.revenue"),
        lambda: compact("default.revenue", "revenue"),
        lambda: promote("default.revenue", "revenue", "blue"),
    ):
        with pytest.raises(ConfigError, match="catalog does not know"):
            call()
    assert main(["status", "default.revenue", "--conf", "spark.sql.shuffle.partitions=2"]) == 2
    assert "catalog does not know" in capsys.readouterr().err
    assert main(["status", "default.revenue", "--conf", "novalue"]) == 2
    assert "--conf takes KEY=VALUE" in capsys.readouterr().err
    spark.sql(f"CREATE TABLE people_now (id long) USING parquet LOCATION '{tmp_path}/../elsewhere'")
    try:  # known to the catalog, but this session has no Delta to say where it is
        assert main(["frontier", "people_now", "v"]) == 2
        assert "needs Delta in the Spark session" in capsys.readouterr().err
    finally:
        spark.sql("DROP TABLE IF EXISTS people_now")
    assert os.listdir(tmp_path) == []


def test_under_connect_a_name_resolves_through_the_batchs_session(connect, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="catalog does not know"):
        MVSink("nowhere.revenue", "v")(connect.range(3).selectExpr("id", "'a' AS name", "0.5 AS x"), 0)
    assert os.listdir(tmp_path) == []


def test_compact_refuses_a_table_that_holds_no_commit_of_the_view(spark, tmp_path):
    from mvsink.ops.compact import compact
    from tests.helpers import foreign_append

    target = str(tmp_path / "view")
    MVSink(target, "revenue", max_rows_per_file=2)(people(spark, range(6)), 0)
    foreign_append(target, [{"id": 100, "name": "x", "x": 0.5}])
    with pytest.raises(ConfigError, match="holds no view 'orders'"):
        compact(target, "orders")
    assert compact(target, "revenue").files_removed > 0
