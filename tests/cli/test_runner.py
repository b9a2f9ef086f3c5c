"""Jobs: ``mvsink run`` and spark-submit run a job file with the settings the user gave, refuse
an output mode the sink cannot read right, and say why an epoch failed (``mvsink.cli``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
from pyspark.sql import functions as F

from mvsink import MVSink, frontier
from mvsink.cli.job import JobConfig
from mvsink.cli.main import main
from mvsink.cli.runner import SHOWN_ROWS, run_job, show_table
from mvsink.table import delta
from tests.helpers import versions, write_orders

SEEN = "seen_settings"
QUERY = """
import json, os
from mvsink.demo import revenue_query

def query(spark, orders):
    keys = ("spark.sql.session.timeZone", "spark.sql.shuffle.partitions", "spark.sql.caseSensitive")
    seen = {k: spark.conf.get(k) for k in keys}
    seen["master"] = spark.sparkContext.master
    with open(os.environ["MVSINK_TEST_SEEN"], "w") as fh:
        json.dump(seen, fh)
    return revenue_query(spark, orders)
"""


def _job(tmp_path, **extra: str) -> str:
    (tmp_path / f"{SEEN}.py").write_text(QUERY)
    conf = tmp_path / "job.toml"
    conf.write_text(
        f'[job]\nquery = "{SEEN}:query"\ncheckpoint = "{tmp_path / "ckpt"}"\nepochs = 2\n'
        f'trigger_seconds = 0.5\nshow = false\nfeed = "mvsink.demo:feed_orders"\n'
        f'args = {{ orders = "{tmp_path / "orders"}" }}\n'
        f'[sink]\ntarget = "{tmp_path / "view"}"\nname = "revenue"\n'
        '[spark]\n"spark.master" = "local[2]"\n"spark.sql.shuffle.partitions" = "2"\n'
        '"spark.sql.caseSensitive" = "true"\n'
    )
    return str(conf)


def _launch(tmp_path, command: list[str], **environ: str) -> dict[str, str]:
    env = {
        **os.environ,
        **environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()]),
        "MVSINK_TEST_SEEN": str(tmp_path / "seen.json"),
    }
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert frontier(str(tmp_path / "view"), "revenue") is not None
    return json.loads((tmp_path / "seen.json").read_text())  # type: ignore[no-any-return]


def test_spark_submit_settings_win_over_the_job_file(tmp_path):
    submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    seen = _launch(
        tmp_path,
        [
            submit,
            "--master",
            "local[1]",
            "--conf",
            "spark.sql.session.timeZone=America/New_York",
            "--conf",
            "spark.sql.shuffle.partitions=3",
            "examples/spark_submit.py",
            _job(tmp_path),
        ],
    )
    # spark-submit's master and --conf; the job file's [spark] only where they say nothing.
    assert seen == {
        "master": "local[1]",
        "spark.sql.session.timeZone": "America/New_York",
        "spark.sql.shuffle.partitions": "3",
        "spark.sql.caseSensitive": "true",
    }


def test_mvsink_run_takes_the_launchers_settings_and_conf_over_the_job_file(tmp_path):
    (tmp_path / "spark-conf").mkdir()
    (tmp_path / "spark-conf" / "spark-defaults.conf").write_text(
        "# the platform's defaults\nspark.sql.session.timeZone   Asia/Tokyo\n"
        "spark.sql.shuffle.partitions=4\nspark.master local[1]\n"
    )
    seen = _launch(
        tmp_path,
        [
            sys.executable,
            "-m",
            "mvsink.cli",
            "run",
            _job(tmp_path),
            "--conf",
            "spark.sql.shuffle.partitions=5",
        ],
        SPARK_CONF_DIR=str(tmp_path / "spark-conf"),
        PYSPARK_SUBMIT_ARGS="--conf spark.sql.caseSensitive=false pyspark-shell",
    )
    assert seen == {
        "master": "local[1]",  # spark-defaults.conf's, over the job file's
        "spark.sql.session.timeZone": "Asia/Tokyo",
        "spark.sql.shuffle.partitions": "5",  # --conf, over spark-defaults.conf
        "spark.sql.caseSensitive": "false",  # PYSPARK_SUBMIT_ARGS, over the job file
    }


@pytest.mark.parametrize(
    ("output_mode", "mode"), [("update", "complete"), ("complete", "append"), ("update", "append")]
)
def test_run_refuses_an_output_mode_the_sink_mode_cannot_read(tmp_path, capsys, output_mode, mode):
    conf = tmp_path / "job.toml"
    conf.write_text(
        f'[job]\noutput_mode = "{output_mode}"\ncheckpoint = "{tmp_path / "ckpt"}"\n'
        f'[sink]\ntarget = "{tmp_path / "view"}"\nname = "v"\nmode = "{mode}"\n'
    )
    assert main(["run", str(conf)]) == 2
    err = capsys.readouterr().err
    assert "job.output_mode" in err and "sink.mode" in err and f'outputMode("{output_mode}")' in err
    assert not os.path.exists(tmp_path / "view") and not os.path.exists(tmp_path / "ckpt")


@pytest.mark.parametrize("epochs", ["0", "-1", "x"])
def test_run_refuses_a_bad_epoch_count(capsys, epochs):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--epochs", epochs])
    assert exit_.value.code == 2 and "--epochs" in capsys.readouterr().err


def test_the_sink_refuses_a_query_whose_output_mode_does_not_fit(spark, tmp_path):
    if "connect" in type(spark).__module__:
        pytest.skip("Spark Connect does not show a query's output mode (docs/operations.md)")
    source = str(tmp_path / "in")
    write_orders(source, "a", [("p1", 5), ("p2", 7)])
    orders = spark.readStream.schema("product string, amount long").csv(source)
    view = orders.groupBy("product").agg(F.sum("amount").alias("revenue"))
    cases = [
        ("update", MVSink(str(tmp_path / "c"), "v")),
        ("complete", MVSink(str(tmp_path / "a"), "v", mode="append")),
    ]
    for output_mode, sink in cases:
        query = (
            view.writeStream.outputMode(output_mode)
            .foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / f"ckpt-{output_mode}"))
            .trigger(availableNow=True)
            .start()
        )
        with pytest.raises(Exception, match="ConfigError") as info:
            query.awaitTermination(300)
        assert f'outputMode("{output_mode}")' in str(info.value)
        assert not versions(sink.target)  # nothing written


def test_show_reads_a_sample_through_the_sinks_store(spark, tmp_path, capsys, s3_target, s3_options):
    config = JobConfig.load(None)
    config = config.model_copy(
        update={
            "job": config.job.model_copy(
                update={
                    "epochs": 2,
                    "trigger_seconds": 0.5,
                    "checkpoint": str(tmp_path / "ckpt"),
                    "show": True,
                    "args": {"orders": str(tmp_path / "orders")},
                }
            ),
            "sink": config.sink.model_copy(
                update={
                    "target": s3_target,
                    "history_target": f"{s3_target}_history",
                    "storage_options": s3_options,
                }
            ),
        }
    )
    reports = run_job(config, stop=threading.Event())
    assert [r.outcome for r in reports][:2] == ["committed", "committed"]
    out = capsys.readouterr().out
    assert "== view revenue after epoch 1\n  product" in out and "not shown" not in out
    assert "the view as of epoch 1, from its history (mvsink.as_of)" in out

    # A large view: a sample of 12 rows, and the count the log gives.
    big = str(tmp_path / "big")
    MVSink(big, "big", max_rows_per_file=40)(spark.range(1000).withColumnRenamed("id", "k"), 0)
    sample, total = delta.read_sample(big, None, SHOWN_ROWS)
    assert (sample.num_rows, total) == (SHOWN_ROWS, 1000)
    assert show_table(sample, "t", total=total).endswith("... and 988 more rows")


def test_a_failing_epoch_ends_with_the_sinks_reason(spark, tmp_path, capsys):
    conf = tmp_path / "job.toml"
    conf.write_text(
        f'[job]\nquery = "mvsink.demo:latest_order_query"\noutput_mode = "update"\n'
        f'checkpoint = "{tmp_path / "ckpt"}"\ntrigger_seconds = 0.5\nepochs = 2\nshow = false\n'
        f'feed = "mvsink.demo:feed_orders"\nargs = {{ orders = "{tmp_path / "orders"}" }}\n'
        f'[sink]\ntarget = "{tmp_path / "view"}"\nname = "latest"\nmode = "upsert"\n'
        'key = ["no_such_column"]\n'
    )
    assert main(["run", str(conf)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("mvsink: ") and "no_such_column" in last and "view 'latest'" in last, last
    assert "StreamingQueryException" not in last and "Traceback" not in last


def test_a_job_whose_args_do_not_fit_its_query_is_refused_before_anything_runs(tmp_path, capsys):
    conf = tmp_path / "job.toml"
    conf.write_text(
        f'[job]\nquery = "mvsink.demo:revenue_query"\nargs = {{ orders = "{tmp_path / "o"}", nope = 1 }}\n'
        f'checkpoint = "{tmp_path / "ckpt"}"\n[sink]\ntarget = "{tmp_path / "view"}"\nname = "v"\n'
    )
    assert main(["run", str(conf)]) == 2
    err = capsys.readouterr().err
    assert "option 'job.args' does not fit mvsink.demo:revenue_query" in err and "nope" in err
    assert not (tmp_path / "view").exists() and not (tmp_path / "o").exists()


def test_the_sink_checks_the_output_mode_only_of_a_desired_made_from_the_batch(spark, tmp_path):
    if "connect" in type(spark).__module__:
        pytest.skip("classic sessions only")
    source = str(tmp_path / "in")
    write_orders(source, "a", [("p1", 5), ("p2", 7)])
    orders = spark.readStream.schema("product string, amount long").csv(source)
    sink = MVSink(str(tmp_path / "view"), "v")

    def whole_view(batch, epoch):  # an append query's batch only triggers a full recompute
        spark_ = batch.sparkSession
        view = spark_.read.schema("product string, amount long").csv(source).groupBy("product").count()
        sink(view, epoch)

    query = (
        orders.writeStream.outputMode("append")
        .foreachBatch(whole_view)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None and sink.last_report is not None
    assert sink.last_report.outcome == "committed"


@pytest.mark.parametrize(
    "command", [[], ["run"], ["frontier"], ["promote"], ["status"], ["verify"], ["vacuum"], ["compact"]]
)
def test_the_cli_help_is_plain_text(command, capsys) -> None:
    """What ``--help`` prints is read in a terminal: no reStructuredText markup."""
    from mvsink.cli.main import main as cli_main

    with pytest.raises(SystemExit):
        cli_main([*command, "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: mvsink") and "``" not in out
