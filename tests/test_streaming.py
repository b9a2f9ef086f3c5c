"""End to end: a real streaming query with foreachBatch, stopped and restarted."""

from __future__ import annotations

import os

from mvsink import MVSink, frontier
from mvsink.cli.main import main
from tests.helpers import assert_equal_to, expected, run_available, target_table, versions, write_orders


def test_a_complete_mode_query_keeps_the_view_across_restarts(spark, tmp_path, target):
    source, ckpt = str(tmp_path / "in"), str(tmp_path / "ckpt")
    write_orders(source, "a", [("p1", 5), ("p2", 7), ("p1", 1)])
    run_available(spark, source, target, ckpt)
    assert_equal_to(target, expected(spark, source))
    first = frontier(target, "revenue")
    assert first is not None
    write_orders(source, "b", [("p3", 2), ("p2", 1)])
    _, sink = run_available(spark, source, target, ckpt)  # a restarted job: new sink object
    assert_equal_to(target, expected(spark, source))
    assert frontier(target, "revenue") > first
    assert sink.last_report is not None and sink.last_report.outcome == "committed"


def test_a_restart_that_replays_a_committed_batch_writes_nothing(spark, tmp_path, target):
    source, ckpt = str(tmp_path / "in"), str(tmp_path / "ckpt")
    write_orders(source, "a", [("p1", 5)])
    run_available(spark, source, target, ckpt)
    # Forget that the batch committed in Spark's checkpoint: Spark runs it again on restart.
    commits = os.path.join(ckpt, "commits")
    for name in os.listdir(commits):
        os.remove(os.path.join(commits, name))
    before = versions(target)
    _, sink = run_available(spark, source, target, ckpt)
    assert sink.last_report is not None and sink.last_report.outcome == "replay"
    assert versions(target) == before
    assert_equal_to(target, expected(spark, source))


def test_cli_runs_a_job_file(spark, tmp_path, capsys):
    target = str(tmp_path / "views" / "revenue")
    conf = tmp_path / "job.toml"
    conf.write_text(
        "[job]\n"
        f'checkpoint = "{tmp_path / "ckpt"}"\n'
        "epochs = 3\ntrigger_seconds = 0.5\ntamper_after_epoch = 1\n"
        f'args = {{ orders = "{tmp_path / "orders"}" }}\n'
        "[sink]\n"
        f'target = "{target}"\nname = "revenue"\n'
    )
    assert main(["run", str(conf)]) == 0
    out = capsys.readouterr().out
    assert "tampered after epoch" in out and "view revenue epoch" in out
    table = target_table(target)
    assert "rogue" not in table.column("product").to_pylist()
    assert main(["frontier", target, "revenue"]) == 0
    assert capsys.readouterr().out.strip() == str(frontier(target, "revenue"))
    # The demo's orders folder holds every order the view read: verify computes desired again.
    assert main(["verify", "--job", str(conf)]) == 0
    assert "equals desired" in capsys.readouterr().out


def test_cli_reports_a_bad_job_file(tmp_path, capsys):
    conf = tmp_path / "job.toml"
    conf.write_text('[sink]\ntarget = "x"\nname = "bad name"\n')
    assert main(["run", str(conf)]) == 2
    assert "option 'sink.name'" in capsys.readouterr().err


def test_each_shipped_mode_example_runs(spark, tmp_path, capsys):
    import threading

    from mvsink.cli.job import JobConfig
    from mvsink.cli.runner import run_job

    for name in ("upsert.toml", "append.toml"):
        config = JobConfig.load(os.path.join("conf", name))
        target = str(tmp_path / name / "view")
        config = config.model_copy(
            update={
                "job": config.job.model_copy(
                    update={
                        "epochs": 3,
                        "trigger_seconds": 0.5,
                        "checkpoint": str(tmp_path / name / "ckpt"),
                        "args": {"orders": str(tmp_path / name / "orders")},
                    }
                ),
                "sink": config.sink.model_copy(update={"target": target}),
            }
        )
        reports = run_job(config, stop=threading.Event())
        assert [r.outcome for r in reports] == ["committed"] * 3
        assert frontier(target, config.sink.name) == reports[-1].epoch + 1
        table = target_table(target)
        assert table.num_rows > 0
        if config.sink.mode == "upsert":
            keys = table.column("product").to_pylist()
            assert len(keys) == len(set(keys))  # one row per key


def test_a_read_only_append_sink_runs_a_stateful_batch_without_writing(spark, tmp_path, target):
    source, ckpt = str(tmp_path / "in"), str(tmp_path / "ckpt")
    write_orders(source, "a", [("p1", 5), ("p2", 7), ("p1", 5)])
    orders = spark.readStream.schema("product string, amount long").csv(source)
    standby = MVSink(target, "dedup", mode="append", read_only=True)
    query = (
        orders.dropDuplicates(["product", "amount"])  # stateful: every partition must run
        .writeStream.outputMode("append")
        .foreachBatch(standby)
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None
    assert standby.last_report is not None and standby.last_report.outcome == "read_only"
    assert not os.path.exists(target)
