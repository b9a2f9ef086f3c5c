"""``verify`` (``mvsink.ops.verify``): the target against desired, from a DataFrame, from SQL
and from a job file's query run once, with its index entries checked against their files."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import functions as F

from mvsink import MVSink
from mvsink.cli.main import main
from mvsink.ops.verify import verify
from tests.helpers import expected, foreign_append, people, versions, write_orders

# Runs on both engines (tests/conftest.py: each line runs the engine it has).
pytestmark = pytest.mark.usefixtures("engine")


def test_verify_counts_and_samples_missing_and_extra_rows(spark, target):
    sink = MVSink(target, "people")
    desired = people(spark, range(30))
    sink(desired, 0)
    same = verify(desired, target, "people")
    assert same.equal and same.target_rows == same.desired_rows == 30
    # A rogue duplicate of a real row and a rogue row in; nothing out.
    foreign_append(target, [{"id": 3, "name": "n3", "x": 1.5}, {"id": 77, "name": "rogue", "x": 0.0}])
    bigger = people(spark, range(32))  # desired has two rows the target lacks
    got = verify(bigger, target, "people")
    assert not got.equal and (got.missing, got.extra) == (2, 2)
    assert sorted(r["id"] for r in got.missing_sample) == [30, 31]
    assert sorted(r["id"] for r in got.extra_sample) == [3, 77]


def test_verify_reports_index_entries_that_contradict_their_files(spark, local_target, capsys):
    """An entry is trusted when its path, size and row count match the log: one whose
    fingerprints are not its file's (a file replaced in place by one of the same size, a
    damaged entry) goes unnoticed by the sink, so verify checks every entry against its file."""
    from mvsink.errors import Where
    from mvsink.table.delta import load_snapshot
    from mvsink.table.index import FileEntry, StoredIndex
    from mvsink.table.layout import Layout
    from mvsink.table.schema import target_struct
    from mvsink.table.storage import Store

    MVSink(local_target, "people", max_rows_per_file=4)(people(spark, range(10)), 0)
    spark.range(10).selectExpr("id", "concat('n', id) as name", "id / 2 as x").createOrReplaceTempView("ten")
    assert main(["verify", local_target, "--name", "people", "--sql", "SELECT * FROM ten"]) == 0
    snap = load_snapshot(local_target, "mvsink:people", {}, Where())
    assert snap.schema_json is not None
    layout = Layout(snap.schema_json, target_struct(snap.schema_json), snap.partition_by)
    index = StoredIndex.of(Store(snap.root), "people", layout.arrow)
    victim = snap.files[1]
    entry = index.get(victim)
    assert entry is not None
    index.put(victim.key, victim.size, FileEntry(entry.a + 1, entry.b))  # right length, wrong rows

    got = verify(people(spark, range(10)), local_target, "people")
    assert got.equal and not got.ok and got.index_mismatches == (victim.path,)
    assert main(["verify", local_target, "--name", "people", "--sql", "SELECT * FROM ten"]) == 1
    assert (
        f"index entry contradicts its data file (delete the entry; the sink recomputes it): {victim.path}"
        in (capsys.readouterr().out)
    )


def test_verify_cli_exit_codes_with_sql_and_a_job_file(spark, tmp_path, local_target, capsys):
    sink = MVSink(local_target, "people")
    sink(people(spark, range(5)), 0)
    spark.range(5).selectExpr("id", "concat('n', id) as name", "id / 2 as x").createOrReplaceTempView("want")
    assert main(["verify", local_target, "--name", "people", "--sql", "SELECT * FROM want"]) == 0
    assert "equals desired" in capsys.readouterr().out
    assert main(["verify", local_target, "--sql", "SELECT * FROM want WHERE id < 4", "--json"]) == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed["equal"] is False and printed["extra"] == 1 and printed["extra_sample"][0]["id"] == 4
    assert main(["verify", local_target, "--sql", "SELECT 1 AS other"]) == 2  # does not fit the table
    assert "mvsink:" in capsys.readouterr().err
    assert main(["verify", local_target + "-typo", "--sql", "SELECT * FROM want"]) == 2
    assert "no Delta table" in capsys.readouterr().err
    assert main(["verify", local_target, "--sql", "SELECT nope FROM want"]) == 2  # a bad query
    assert main(["status", local_target, "--storage-option", "oops"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err

    # A job file: its query is run once over what its source holds now.
    source = tmp_path / "in"
    write_orders(str(source), "a", [("p1", 5), ("p2", 7), ("p1", 1)])
    view = tmp_path / "revenue-view"
    job = tmp_path / "job.toml"
    job.write_text(
        f"""
[job]
query = "tests.ops.test_verify:orders_revenue"
args = {{ orders = "{source}" }}
checkpoint = "{tmp_path / "ckpt"}"
epochs = 1
show = false

[sink]
target = "{view}"
name = "revenue"
"""
    )
    MVSink(str(view), "revenue")(expected(spark, str(source)), 0)
    assert main(["verify", "--job", str(job)]) == 0
    write_orders(str(source), "b", [("p3", 2)])  # the source moved on; the view did not
    assert main(["verify", "--job", str(job)]) == 1
    assert "1 row(s) missing" in capsys.readouterr().out


def orders_revenue(spark, orders):
    orders = spark.readStream.schema("product string, amount long").csv(orders)
    return orders.groupBy("product").agg(F.sum("amount").alias("revenue"), F.count(F.lit(1)).alias("n"))


def rate_revenue(spark):
    rate = spark.readStream.format("rate").load()
    return rate.groupBy((F.col("value") % 3).alias("product")).agg(F.count(F.lit(1)).alias("n"))


def test_verify_of_a_job_whose_source_cannot_replay_says_so_instead_of_a_difference(
    spark, tmp_path, local_target, capsys
):
    # A fresh run of a rate source holds none of what the view read: not a difference to report.
    MVSink(local_target, "rate")(spark.range(3).selectExpr("id AS product", "1L AS n"), 0)
    job = tmp_path / "job.toml"
    job.write_text(
        f'[job]\nquery = "tests.ops.test_verify:rate_revenue"\ncheckpoint = "{tmp_path / "c"}"\n'
        f'[sink]\ntarget = "{local_target}"\nname = "rate"\n'
    )
    before = versions(local_target)
    assert main(["verify", "--job", str(job)]) == 2
    out, err = capsys.readouterr()
    assert "cannot know desired" in err and "rate source" in err and "--sql" in err
    assert "differs" not in out and versions(local_target) == before


@pytest.mark.spark4("mvsink-delta is a Python data source")
def test_verify_sees_an_mvsink_delta_source_read_from_latest(spark, tmp_path):
    from mvsink.compat import logical_plan
    from mvsink.ops.verify import replay_refusal
    from mvsink.sources import register

    register(spark)
    source = str(tmp_path / "source")
    write_deltalake(source, pa.table({"a": [1]}))
    reader = spark.readStream.format("mvsink-delta").option("path", source)
    assert replay_refusal(logical_plan(reader.load())) is None  # from its first version
    latest = replay_refusal(logical_plan(reader.option("startingVersion", "latest").load()))
    assert latest is not None and "mvsink-delta from startingVersion latest" in latest
