"""What differs between Spark lines (``mvsink.compat``): the reason a Spark error gives, frames
as Arrow both ways, ``mapInArrow`` over any column names, releasing cached frames best-effort.
The pure helpers without Spark; the rest on the suite's session."""

from __future__ import annotations

import logging

import pyarrow as pa
import pyspark
import pytest

from mvsink.compat import (
    SPARK_LINE,
    from_arrow,
    is_connect,
    is_dataframe,
    is_spark_error,
    logical_plan,
    map_in_arrow,
    release,
    spark_reason,
    to_arrow,
)


def test_the_spark_line_is_the_installed_pysparks():
    major, minor = pyspark.__version__.split(".")[:2]
    assert (int(major), int(minor)) == SPARK_LINE


def test_the_reason_of_a_python_workers_error_is_the_error_it_raised():
    text = (
        "An error occurred while calling o123.collect.\n"
        "Traceback (most recent call last):\n"
        '  File "worker.py", line 1, in main\n'
        "    raise ValueError('bad row')\n"
        "ValueError: bad row\n"
        "Caused by: org.apache.spark.SparkException: Job aborted\n"
    )
    assert spark_reason(RuntimeError(text)) == "ValueError: bad row"


def test_the_reason_of_a_jvm_error_is_its_root_cause_else_its_first_own_line():
    jvm = (
        "An error occurred while calling o1.save.\n: x.Wrapper: outer\n"
        "Caused by: a.B: middle\nCaused by: c.D: root\n"
    )
    assert spark_reason(RuntimeError(jvm)) == "c.D: root"
    plain = "An error occurred while calling o1.save.\nJVM stacktrace:\n: java.io.IOException: disk full\n"
    assert spark_reason(RuntimeError(plain)) == "java.io.IOException: disk full"
    assert spark_reason(RuntimeError("x" * 900), limit=10) == "x" * 10
    assert spark_reason(KeyError()) == "KeyError"


def test_only_connect_objects_are_connect_and_only_frames_are_frames(spark):
    df = spark.range(1)
    assert not is_connect(df) and not is_connect(spark)
    assert is_dataframe(df)
    assert not is_dataframe(to_arrow(df)) and not is_dataframe(object())


def test_a_spark_error_is_told_from_others(spark):
    with pytest.raises(Exception) as info:
        spark.sql("SELECT no_such_column FROM range(1)").collect()
    assert is_spark_error(info.value)
    assert not is_spark_error(ValueError("not Spark's"))
    assert "no_such_column" in spark_reason(info.value)


def test_to_arrow_and_from_arrow_round_trip_in_sparks_arrow_schema(spark):
    table = pa.table({"id": pa.array([1, 2, None], pa.int64()), "name": ["a", None, "c"]})
    df = from_arrow(spark, table, "id long, name string")
    assert df.schema.simpleString() == "struct<id:bigint,name:string>"
    back = to_arrow(df)
    assert back.schema == pa.schema([("id", pa.int64()), ("name", pa.string())])
    assert sorted(back.to_pylist(), key=repr) == sorted(table.to_pylist(), key=repr)
    assert to_arrow(df.limit(0)).num_rows == 0


def test_map_in_arrow_hands_columns_named_with_dots_and_backticks_under_their_names(spark):
    def total(batches):  # runs in Spark's Python workers: a name not restored fails the job
        for batch in batches:
            names = batch.schema.names
            v = pa.compute.add(batch.column(names[0]), batch.column(names[-1]))
            yield pa.RecordBatch.from_arrays([v, pa.array([",".join(names)] * len(v))], names=["v", "names"])

    df = spark.createDataFrame([(1, 2), (3, 4)], "`a.b` long, `c``d` long")
    out = map_in_arrow(df, total, "v long, names string")
    assert sorted((r.v, r.names) for r in out.collect()) == [(3, "a.b,c`d"), (7, "a.b,c`d")]
    plain = map_in_arrow(spark.createDataFrame([(5,)], "x long"), total, "v long, names string")
    assert [(r.v, r.names) for r in plain.collect()] == [(10, "x")]


def test_the_logical_plan_names_the_frames_source(spark, tmp_path):
    folder = str(tmp_path / "src")
    spark.range(3).write.parquet(folder)
    assert "parquet" in logical_plan(spark.read.parquet(folder)).lower()
    assert "== Analyzed Logical Plan ==" in logical_plan(spark.range(1))


def test_release_unpersists_and_a_failure_is_a_warning_not_an_error(spark, caplog):
    cached = spark.range(5).cache()
    cached.count()
    assert cached.is_cached

    with caplog.at_level(logging.WARNING, logger="mvsink.compat"):
        release(None, cached)  # None cannot be unpersisted: a warning, and the next is released
    assert not cached.is_cached
    assert "could not release a cached frame (left to the session): 'NoneType'" in caplog.text
