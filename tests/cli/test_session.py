"""The SparkSession jobs and commands run on (``mvsink.cli.session``): the launcher's settings
read as spark-submit reads them, and a running session taken as it is. Precedence end to end
(spark-submit, ``mvsink run``) is in tests/cli/test_runner.py."""

from __future__ import annotations

import logging

import pytest

from mvsink.cli.session import DEFAULTS, launcher_settings, local_session


@pytest.fixture
def launcher(tmp_path, monkeypatch):
    """A plain Python process's launcher: a conf folder of its own, no spark-submit."""
    folder = tmp_path / "spark-conf"
    folder.mkdir()
    monkeypatch.setenv("SPARK_CONF_DIR", str(folder))
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    return folder


def test_without_spark_defaults_or_submit_args_the_launcher_sets_nothing(launcher):
    assert launcher_settings() == {}


def test_spark_defaults_are_read_as_spark_submit_reads_them(launcher):
    (launcher / "spark-defaults.conf").write_text(
        "# the platform's defaults\n"
        "! also a comment\n"
        "\n"
        "spark.master   local[3]\n"
        "spark.sql.shuffle.partitions=4\n"
        "spark.sql.session.timeZone: Asia/Tokyo\n"
        "  spark.executor.memory  2g  \n"
        "other.setting 1\n"
    )
    assert launcher_settings() == {
        "spark.master": "local[3]",
        "spark.sql.shuffle.partitions": "4",
        "spark.sql.session.timeZone": "Asia/Tokyo",
        "spark.executor.memory": "2g",
    }


def test_submit_args_master_and_conf_win_over_spark_defaults(launcher, monkeypatch):
    (launcher / "spark-defaults.conf").write_text("spark.master local[3]\nspark.sql.shuffle.partitions 4\n")
    monkeypatch.setenv(
        "PYSPARK_SUBMIT_ARGS",
        "--master local[1] --conf spark.sql.shuffle.partitions=5 --conf 'spark.app.name=a b' "
        "--conf novalue --driver-memory 1g pyspark-shell",
    )
    assert launcher_settings() == {
        "spark.master": "local[1]",
        "spark.sql.shuffle.partitions": "5",
        "spark.app.name": "a b",
    }


def test_the_defaults_keep_a_local_session_small_and_in_utc():
    assert DEFAULTS["spark.ui.enabled"] == "false"
    assert DEFAULTS["spark.sql.session.timeZone"] == "UTC"
    assert int(DEFAULTS["spark.sql.shuffle.partitions"]) <= 4


def test_a_running_session_is_taken_as_it_is(spark, tmp_path):
    before = spark.conf.get("spark.sql.shuffle.partitions")
    taken = local_session("again", conf={"spark.sql.shuffle.partitions": "7"})
    assert taken.conf.get("spark.sql.shuffle.partitions") == before


def test_a_running_session_takes_only_the_explicit_settings_and_says_what_it_kept(spark, caplog):
    before = spark.conf.get("spark.sql.caseSensitive")
    flipped = "false" if before == "true" else "true"
    try:
        with caplog.at_level(logging.WARNING, logger="mvsink.cli.session"):
            taken = local_session(
                "again",
                conf={"spark.sql.caseSensitive": before, "spark.sql.shuffle.partitions": "7"},
                explicit={"spark.sql.caseSensitive": flipped},
            )
        assert taken is spark or taken.sparkContext is spark.sparkContext
        assert spark.conf.get("spark.sql.caseSensitive") == flipped
        assert "kept as it is, without spark.sql.shuffle.partitions" in caplog.text
    finally:
        spark.conf.set("spark.sql.caseSensitive", before)
