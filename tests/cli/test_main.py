"""The command line as a user runs it: processes started as a shell starts them (the installed
``mvsink`` script, no PYTHONPATH), their exit codes and what they print; a job's own module
found beside its job file and checked before Spark starts; Ctrl-C stopping a job cleanly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from mvsink import MVSink, __version__, frontier
from mvsink.cli.job import JobConfig
from mvsink.cli.main import main
from mvsink.cli.runner import run_job
from mvsink.epoch.query import output_mode_refusal
from mvsink.errors import SchemaMismatchError
from mvsink.ops.verify import desired_of_job, verify

MVSINK = os.path.join(os.path.dirname(sys.executable), "mvsink")
SPARK_STARTED = "log4j"  # the first line a starting Spark prints


def _env() -> dict[str, str]:
    """A user's shell: no PYTHONPATH (the job's folder must be found by mvsink itself)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
    return {**env, "PYSPARK_PYTHON": sys.executable}


def _mvsink(*args: str, cwd: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MVSINK, *args], capture_output=True, text=True, timeout=timeout, env=_env(), cwd=cwd
    )


def test_version_and_help_name_every_command():
    version = _mvsink("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"mvsink {__version__}"
    helped = _mvsink("--help")
    assert helped.returncode == 0
    for command in ("run", "status", "verify", "frontier", "promote", "compact", "vacuum"):
        assert re.search(rf"^mvsink {command}\b", helped.stdout, re.M), command
    assert "130 stopped by Ctrl-C" in helped.stdout


def test_frontier_of_a_view_that_never_committed_is_exit_1_and_of_no_table_exit_2(spark, tmp_path):
    target = str(tmp_path / "view")
    MVSink(target, "revenue")(spark.range(3), 0)
    assert _mvsink("frontier", target, "revenue").stdout.strip() == "1"
    missing = _mvsink("frontier", target, "nosuch")
    assert missing.returncode == 1 and missing.stdout == ""
    assert "view 'nosuch' has never committed" in missing.stderr and "revenue" in missing.stderr
    nothing = _mvsink("frontier", str(tmp_path / "nothing"), "revenue")
    assert nothing.returncode == 2 and "no Delta table" in nothing.stderr


def _job(folder, body: str) -> str:
    job = folder / "job.toml"
    job.write_text(body)
    return str(job)


def test_a_missing_query_module_and_a_job_typo_are_refused_before_spark_starts(tmp_path):
    ckpt = tmp_path / "ckpt"
    job = _job(
        tmp_path,
        f'[job]\nquery = "nosuchmodule:query"\ncheckpoint = "{ckpt}"\n'
        f'[sink]\ntarget = "{tmp_path / "view"}"\nname = "v"\n',
    )
    missing = _mvsink("run", job)
    assert missing.returncode == 2, missing.stderr
    assert "no module 'nosuchmodule' on the Python path, in the working folder or beside" in missing.stderr
    assert SPARK_STARTED not in missing.stderr and not ckpt.exists()

    typo = _job(tmp_path, f'[job]\nepochz = 2\n[sink]\ntarget = "{tmp_path / "view"}"\nname = "v"\n')
    refused = _mvsink("run", typo)
    assert refused.returncode == 2
    assert "invalid job file" in refused.stderr and "option 'job.epochz'" in refused.stderr
    assert "invalid sink options" not in refused.stderr and SPARK_STARTED not in refused.stderr


MODULE = """
import time

from pyspark.sql import functions as F

from mvsink.demo import revenue_query


@F.udf("string")
def slowly(product):
    time.sleep(0.4)  # an epoch long enough to be in flight when Ctrl-C comes
    return product


def revenue(spark, orders, scale=1):
    return revenue_query(spark, orders).withColumn("product", slowly("product"))
"""


def test_ctrl_c_stops_a_job_cleanly_where_its_view_stands(spark, tmp_path, monkeypatch):
    """A job without ``epochs`` runs until Ctrl-C; its module sits beside its job file (not
    on PYTHONPATH, run from another folder); ``--arg`` overrides its args; ``-v`` logs every
    phase and no py4j chatter; ``show = false`` still prints each epoch's figures."""
    jobs, elsewhere = tmp_path / "jobs", tmp_path / "elsewhere"
    jobs.mkdir()
    elsewhere.mkdir()
    (jobs / "myjobs.py").write_text(MODULE)
    orders, target = tmp_path / "orders", str(tmp_path / "view")
    job = _job(
        jobs,
        f'[job]\nquery = "myjobs:revenue"\nfeed = "mvsink.demo:feed_orders"\n'
        f'args = {{ orders = "{tmp_path / "not-these"}" }}\ncheckpoint = "{tmp_path / "ckpt"}"\n'
        f'trigger_seconds = 0.5\nshow = false\n[sink]\ntarget = "{target}"\nname = "revenue"\n'
        '[spark]\n"spark.master" = "local[2]"\n',
    )
    process = subprocess.Popen(
        [MVSINK, "run", job, "-v", "--arg", f"orders={orders}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=elsewhere,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    assert process.stderr is not None
    seen = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        seen.append(line)
        if not line or re.search(r"epoch 1: collect \.\.\.$", line):
            break  # epoch 1 is in flight: its desired is being computed
    assert re.search(r"epoch 1: collect \.\.\.$", seen[-1]), "".join(seen)[-3000:]
    os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends (to its process group)
    out, rest = process.communicate(timeout=120)
    err = "".join(seen) + rest
    assert process.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "StackOverflowError" not in err and "could not release" not in err
    assert "py4j" not in err and "ERROR" not in err
    assert "stopping after the epoch in flight" in err
    assert "view revenue epoch 1: committed" in out  # the epoch in flight finished, and printed
    stopped = [line for line in err.splitlines() if line.startswith("mvsink: stopped (")]
    assert len(stopped) == 1, err[-3000:]
    at = int(re.search(r"at frontier (\d+)", stopped[0]).group(1))  # type: ignore[union-attr]
    assert at == frontier(target, "revenue") == 2
    assert not (tmp_path / "not-these").exists()  # --arg won over the job file's orders

    # The next run goes on from there (Spark may replay the last epoch, whose end it had not
    # recorded: the sink writes nothing for it), and the view is the query over every order.
    monkeypatch.syspath_prepend(str(jobs))
    config = JobConfig.load(job)
    config = config.model_copy(
        update={"job": config.job.model_copy(update={"epochs": 2, "args": {"orders": str(orders)}})}
    )
    run_job(config, threading.Event())
    assert frontier(target, "revenue") > at  # type: ignore[operator]
    assert verify(desired_of_job(spark, config, str(tmp_path / "scratch")).rows, target, "revenue").ok


def test_an_append_mode_refusal_reads_right():
    refusal = output_mode_refusal("append", "complete")
    assert refusal is not None and "into an append-mode sink" in refusal
    assert "into a complete-mode sink" in (output_mode_refusal("complete", "append") or "")


def test_verify_of_another_schema_advises_the_verify_command_not_the_sinks_option(spark, tmp_path):
    target = str(tmp_path / "view")
    MVSink(target, "v")(spark.range(3), 0)
    with pytest.raises(SchemaMismatchError) as info:
        verify(spark.range(3).selectExpr("id", "id AS extra"), target, "v")
    assert "select and cast the view's columns" in info.value.message
    assert "schema_changes" not in info.value.message


def test_status_of_a_folder_that_is_no_delta_table_says_what_is_there(spark, tmp_path, capsys):
    folder = str(tmp_path / "parquet")
    spark.range(5).write.parquet(folder)
    assert main(["status", folder]) == 2
    err = capsys.readouterr().err
    assert "no _delta_log" in err and "Parquet" in err
    write_deltalake(str(tmp_path / "delta"), pa.table({"id": [1]}))
    assert main(["status", str(tmp_path / "delta")]) == 0
