"""Job files (``mvsink.cli.job``): TOML with ``[job]``, ``[sink]`` and ``[spark]``, loaded and
checked before Spark starts, the demo by default, a job's own modules found beside its file.
No Spark."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

from mvsink import ConfigError, SinkOptions
from mvsink.cli.job import DEFAULT, JobConfig, JobOptions, importable


def test_the_shipped_job_files_are_valid():
    for name in os.listdir("conf"):
        JobConfig.load(os.path.join("conf", name))
    assert JobConfig.load(None) == JobConfig.model_validate(DEFAULT)


def test_a_job_naming_no_query_is_the_demo_and_one_naming_the_demos_query_gets_its_feed():
    demo = JobOptions()
    assert (demo.query, demo.feed, demo.epochs) == ("mvsink.demo:revenue_query", "mvsink.demo:feed_orders", 6)
    assert demo.args == {"orders": "data/orders"}
    own_args = JobOptions(query="mvsink.demo:revenue_query", args={"orders": "/in"})
    assert (own_args.feed, own_args.epochs, own_args.args) == (
        "mvsink.demo:feed_orders",
        None,
        {"orders": "/in"},
    )
    mine = JobOptions(query="jobs.mine:query")
    assert (mine.feed, mine.epochs, mine.args) == (None, None, {})


def test_a_job_file_loads_its_three_tables(tmp_path):
    conf = tmp_path / "job.toml"
    conf.write_text(
        textwrap.dedent(
            f"""
            [job]
            query = "jobs.mine:query"
            args = {{ limit = 3, ratio = 0.5, strict = true, name = "x" }}
            output_mode = "update"
            trigger_seconds = 0.25
            epochs = 2
            [sink]
            target = "{tmp_path / "view"}"
            name = "v"
            mode = "upsert"
            key = ["id"]
            [spark]
            "spark.master" = "local[1]"
            """
        )
    )
    job = JobConfig.load(conf)
    assert (job.job.query, job.job.output_mode, job.job.trigger_seconds, job.job.epochs) == (
        "jobs.mine:query",
        "update",
        0.25,
        2,
    )
    assert job.job.args == {"limit": 3, "ratio": 0.5, "strict": True, "name": "x"}
    assert job.sink == SinkOptions.build(target=str(tmp_path / "view"), name="v", mode="upsert", key=["id"])
    assert job.spark == {"spark.master": "local[1]"}


@pytest.mark.parametrize(
    "text, message",
    [
        ('[sink]\ntarget = "x"\nname = "bad name"\n', "option 'sink.name'"),
        ('[job]\nquery = "no_colon"\n[sink]\ntarget = "x"\nname = "v"\n', "option 'job.query'"),
        ('[job]\nfeed = "a:b:c"\n[sink]\ntarget = "x"\nname = "v"\n', "option 'job.feed'"),
        ('[job]\nepochs = 0\n[sink]\ntarget = "x"\nname = "v"\n', "option 'job.epochs'"),
        ('[job]\ntrigger_seconds = 0\n[sink]\ntarget = "x"\nname = "v"\n', "option 'job.trigger_seconds'"),
        ('[job]\nquery = "a:b"\nwhat = 1\n[sink]\ntarget = "x"\nname = "v"\n', "option 'job.what'"),
        ('[job]\nquery = "a:b"\n', "option 'sink'"),
        ('[sink]\ntarget = "x"\nname = "v"\n[other]\n', "option 'other'"),
        (
            '[job]\nquery = "a:b"\noutput_mode = "append"\n[sink]\ntarget = "x"\nname = "v"\n',
            "job.output_mode and sink.mode do not fit",
        ),
    ],
)
def test_a_bad_job_file_is_a_config_error_naming_the_file_and_the_option(tmp_path, text, message):
    conf = tmp_path / "job.toml"
    conf.write_text(text)
    with pytest.raises(ConfigError) as info:
        JobConfig.load(conf)
    assert f"invalid job file {str(conf)!r}" in str(info.value)
    assert message in str(info.value)


def test_a_missing_job_file_or_bad_toml_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        JobConfig.load(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("[job\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        JobConfig.load(tmp_path / "bad.toml")


@pytest.fixture
def clean_path(monkeypatch):
    """sys.path, PYTHONPATH and the modules a test's job imports, as they were before it."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        sys.modules.pop(name, None)


def test_a_jobs_module_beside_its_file_is_found_and_its_args_checked(tmp_path, monkeypatch, clean_path):
    folder = tmp_path / "jobdir"
    folder.mkdir()
    (folder / "jobmod_beside.py").write_text("def query(spark, limit=1):\n    return ('query', limit)\n")
    monkeypatch.chdir(tmp_path)
    job = JobOptions(query="jobmod_beside:query", args={"limit": 3})
    importable(job, folder / "job.toml")
    assert str(folder) in sys.path and str(tmp_path) in sys.path
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), str(folder)]
    assert job.query_of("spark") == ("query", 3)
    with pytest.raises(ConfigError, match=r"option 'job\.args' does not fit jobmod_beside:query"):
        importable(JobOptions(query="jobmod_beside:query", args={"nope": 1}), folder / "job.toml")


def test_a_module_found_nowhere_or_a_missing_function_is_refused(tmp_path, monkeypatch, clean_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"option 'job\.query': no module 'jobmod_nowhere'"):
        importable(JobOptions(query="jobmod_nowhere:query"), None)
    (tmp_path / "jobmod_here.py").write_text("def other(spark):\n    pass\n")
    with pytest.raises(ConfigError, match=r"option 'job\.feed': no module 'nopkg_x\.mod'"):
        importable(JobOptions(query="jobmod_here:other", feed="nopkg_x.mod:feed"), None)
    with pytest.raises(ConfigError, match=r"option 'job\.query': cannot load 'jobmod_here:query'"):
        importable(JobOptions(query="jobmod_here:query"), None)


def test_a_module_that_needs_spark_to_import_is_checked_once_it_runs(tmp_path, monkeypatch, clean_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "jobmod_spark.py").write_text(
        "raise RuntimeError('needs a running Spark')\ndef query(spark):\n    pass\n"
    )
    importable(JobOptions(query="jobmod_spark:query"), None)  # no error yet
    assert "jobmod_spark" not in sys.modules
    with pytest.raises(RuntimeError, match="needs a running Spark"):
        JobOptions(query="jobmod_spark:query").query_of("spark")


def test_the_feed_runs_only_if_the_job_has_one(tmp_path, monkeypatch, clean_path):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "fed"
    (tmp_path / "jobmod_feed.py").write_text(
        "def feed(spark, path):\n    open(path, 'a').write(spark)\ndef query(spark, path):\n    pass\n"
    )
    fed = JobOptions(query="jobmod_feed:query", feed="jobmod_feed:feed", args={"path": str(out)})
    importable(fed, None)
    fed.feed_once("x")
    JobOptions(query="jobmod_feed:query", args={"path": str(out)}).feed_once("y")
    assert out.read_text() == "x"
