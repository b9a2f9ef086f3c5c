"""The Delta and Spark pairs the ``delta-spark`` engine runs on (``jvm_delta.TESTED``, the table
in docs/engines.md): the line's own pair, read from the session's JVM, is accepted; any other is
refused naming both versions and what to install instead, before anything is staged. The
decision (``jvm_delta.pair_problem``) is a pure function of the two versions, tested directly on
the pairs a session here cannot have; on the real session, ``TESTED`` is made to pair the
session's Delta with another Spark to see the refusal reach the user."""

from __future__ import annotations

from pathlib import Path

import pyspark
import pytest

import mvsink.table.jvm_delta
from mvsink import MVSink, UnsupportedTableError
from mvsink.table.jvm_delta import TESTED, JvmDelta, Tested, pair_problem
from tests.delta_session import DELTA_VERSION
from tests.helpers import store

DOCS = Path(__file__).resolve().parents[2] / "docs" / "engines.md"


def test_the_lines_own_pair_is_read_from_the_sessions_jvm_and_accepted(spark, tmp_path):
    jvm = JvmDelta(spark)
    assert jvm.version == DELTA_VERSION  # the line's Delta (tests/delta_session.py)
    assert jvm.spark_version == pyspark.__version__  # the wheel's own Spark jars
    assert pair_problem(jvm.version, jvm.spark_version) is None
    # ...and a sink commits through it to a table only the JVM Delta writes (deletion vectors).
    target = str(tmp_path / "view")
    spark.sql(
        f"CREATE TABLE delta.`{target}` (id BIGINT) USING DELTA "
        "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    report = MVSink(target, "v", engine="delta-spark")(spark.range(0, 5), 0)
    assert report.outcome == "committed" and report.version == 1
    assert sorted(r.id for r in spark.read.format("delta").load(target).collect()) == [0, 1, 2, 3, 4]


def test_the_sessions_delta_on_a_spark_it_was_not_tested_with_is_refused_before_staging(
    spark, tmp_path, monkeypatch
):
    """The session's own pair, as if its Delta release had been tested on another Spark only
    (``TESTED`` says so; Spark and Delta are the real ones): a table that needs the engine is
    refused naming both versions and the Spark to run, with the folder as it was."""
    target = str(tmp_path / "view")
    spark.sql(
        f"CREATE TABLE delta.`{target}` (id BIGINT) USING DELTA "
        "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    before = sorted(store(target).files(""))
    release = ".".join(DELTA_VERSION.split(".")[:2])
    other = Tested("9.9", "io.delta:delta-spark_2.13:9.9.0", 'pip install "pyspark[sql]==9.9.*"')
    monkeypatch.setattr(mvsink.table.jvm_delta, "TESTED", {release: other})
    with pytest.raises(UnsupportedTableError) as info:
        MVSink(target, "v")(spark.range(0, 4), 0)
    message = str(info.value)
    assert f"the session runs Delta {DELTA_VERSION} on Spark {spark.version}" in message
    assert "is built for Spark 9.9" in message
    assert 'Run it on Spark 9.9 (pip install "pyspark[sql]==9.9.*")' in message
    assert "nothing was staged" in message
    assert sorted(store(target).files("")) == before


@pytest.mark.parametrize(
    ("delta", "spark"),
    [
        ("4.4.0", "4.2.0"),
        ("4.4.1", "4.2.3"),  # patch releases of the same pair
        ("3.3.2", "3.5.9"),
        ("3.3.0", "3.5.3"),
        ("3.3.2", "3.5.5-amzn-1"),  # a platform's build of Spark 3.5 (EMR 7)
    ],
)
def test_a_tested_pair_is_accepted(delta, spark):
    assert pair_problem(delta, spark) is None


@pytest.mark.parametrize(
    ("delta", "spark", "install"),
    [
        # The pair `pip install` makes today: delta-spark 4.4 in PySpark 4.3 (NoSuchMethodError).
        ("4.4.0", "4.3.0", 'Run it on Spark 4.2 (pip install "pyspark[sql]==4.2.*")'),
        # Delta ships 4.4 for Spark 4.1 too (delta-spark_4.1_2.13): not tested here.
        ("4.4.0", "4.1.0", 'Run it on Spark 4.2 (pip install "pyspark[sql]==4.2.*")'),
        ("3.3.2", "3.4.1", 'Run it on Spark 3.5 (pip install "mvsink[spark35]")'),
        # Another Delta on a tested Spark: the tested Delta for that Spark.
        ("3.2.0", "3.5.1", "Put io.delta:delta-spark_2.12:3.3.2 in the session's spark.jars.packages"),
        ("4.3.1", "4.2.0", "Put io.delta:delta-spark_2.13:4.4.0 in the session's spark.jars.packages"),
        ("4.4.0", "3.5.9", "Put io.delta:delta-spark_2.12:3.3.2 in the session's spark.jars.packages"),
        ("3.3.2", "4.2.0", "Put io.delta:delta-spark_2.13:4.4.0 in the session's spark.jars.packages"),
        # Neither tested: both pairs.
        (
            "4.0.0",
            "4.0.1",
            'Run Spark 4.2 (pip install "pyspark[sql]==4.2.*") with io.delta:delta-spark_2.13:4.4.0, or '
            'Spark 3.5 (pip install "mvsink[spark35]") with io.delta:delta-spark_2.12:3.3.2',
        ),
        ("4.4.0-SNAPSHOT", "unknown", "Run it on Spark 4.2"),
    ],
)
def test_any_other_pair_is_refused_naming_both_versions_and_what_to_install(delta, spark, install):
    problem = pair_problem(delta, spark)
    assert problem is not None
    assert f"Delta {delta} on Spark {spark}" in problem
    assert "Delta 4.4.x with Spark 4.2.x and Delta 3.3.x with Spark 3.5.x" in problem
    assert install in problem
    assert "engine='delta-rs'" in problem and "docs/engines.md" in problem


def test_a_tested_delta_on_another_spark_says_which_spark_it_is_built_for():
    problem = pair_problem("4.4.0", "4.3.0")
    assert problem is not None
    assert "io.delta:delta-spark_2.13:4.4.0, is built for Spark 4.2" in problem
    assert "NoSuchMethodError" in problem


def test_docs_list_every_tested_pair():
    """docs/engines.md's table is the one ``TESTED`` holds: a row per Delta release, with the
    artifact to add, the Spark it needs and what installs that PySpark."""
    lines = [line for line in DOCS.read_text().splitlines() if line.startswith("| ")]
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in ln.strip("| ").split("|")] for ln in lines)}
    for release, tested in TESTED.items():
        wanted = [f"`{tested.package}`", f"{tested.spark}.x", f"`{tested.pyspark}`"]
        assert rows.get(f"{release}.x") == wanted, f"docs/engines.md's row for Delta {release}.x"
