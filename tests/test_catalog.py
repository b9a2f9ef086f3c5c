"""Targets given as table names (``catalog.py``): a name is never a folder.

Sessions here have no Delta: a name resolves to nothing, and the sink says so before anything
is written. Resolving names of Delta tables is tested beside the JVM Delta runtime
(tests/interop).
"""

from __future__ import annotations

import os

import pytest

from mvsink import ConfigError, MVSink
from mvsink.table.catalog import is_path
from tests.test_sink import people


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


def test_a_name_needs_delta_in_the_session_to_resolve(spark, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    people(spark, range(3)).createOrReplaceTempView("people_now")
    try:
        with pytest.raises(ConfigError, match="needs Delta in the Spark session"):
            MVSink("people_now", "v")(people(spark, range(3)), 0)
        assert os.listdir(tmp_path) == []
        # Both a catalog entry and a Delta folder of that name: ambiguous, refused.
        MVSink("./people_now", "v")(people(spark, range(3)), 0)
        with pytest.raises(ConfigError, match="both a table in the session's catalog and a Delta table"):
            MVSink("people_now", "v")(people(spark, range(5)), 1)
    finally:
        spark.catalog.dropTempView("people_now")


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
    people(spark, range(3)).createOrReplaceTempView("people_now")
    try:  # known to the catalog, but this session has no Delta to say where it is
        assert main(["frontier", "people_now", "v"]) == 2
        assert "needs Delta in the Spark session" in capsys.readouterr().err
    finally:
        spark.catalog.dropTempView("people_now")
    assert os.listdir(tmp_path) == []


def test_under_connect_a_name_resolves_through_the_batchs_session(connect, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="catalog does not know"):
        MVSink("nowhere.revenue", "v")(connect.range(3).selectExpr("id", "'a' AS name", "0.5 AS x"), 0)
    assert os.listdir(tmp_path) == []


def test_compact_refuses_a_table_that_holds_no_commit_of_the_view(spark, tmp_path):
    from mvsink.ops.compact import compact
    from mvsink.table.delta import foreign_append

    target = str(tmp_path / "view")
    MVSink(target, "revenue", max_rows_per_file=2)(people(spark, range(6)), 0)
    foreign_append(target, [{"id": 100, "name": "x", "x": 0.5}])
    with pytest.raises(ConfigError, match="holds no view 'orders'"):
        compact(target, "orders")
    assert compact(target, "revenue").files_removed > 0
