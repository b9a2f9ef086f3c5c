"""The docs are true: every command line in README.md and docs/ is run by a test (``RUN_BY``
says which, and the job files they name run here) or is marked as an illustration (a fenced
block ```` ```sh illustration ```` or ```` ```console ````: a cluster, a broker or a cloud store
it needs, or a transcript)."""

from __future__ import annotations

import glob
import os
import re
import threading

import pytest

from mvsink import frontier, verify
from mvsink.cli.job import JobConfig, importable
from mvsink.cli.runner import run_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMAND = re.compile(r"^(\$ )?(mvsink|make|spark-submit|pip|python3?|PYTHONPATH=\S+ mvsink|\.)(\s|$)")

RUN_BY = {
    "python3 -m venv .venv && . .venv/bin/activate": "scripts/plain_install.sh",
    "pip install .": "scripts/plain_install.sh",
    "make demo": "tests/test_docs.py",
    "make test": ".ci/run",
    "mvsink run conf/upsert.toml": "tests/test_docs.py",
    "spark-submit examples/spark_submit.py conf/upsert.toml": "tests/cli/test_runner.py",
    "PYTHONPATH=examples mvsink run conf/kafka.toml --arg bootstrap=broker:9092 --conf "
    "spark.jars.packages=org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0": "tests/test_kafka.py",
}
"""Each runnable command line of the docs (continuation lines joined, comments dropped) and the
test or script that runs it (or, for ``make test``, CI)."""


def _blocks() -> list[tuple[str, str, str]]:
    """Every fenced block of README.md and docs/*.md: (file, info string, text)."""
    found = []
    for path in [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        for match in re.finditer(r"^```([^\n]*)\n(.*?)^```", text, re.S | re.M):
            found.append((os.path.relpath(path, ROOT), match[1].strip(), match[2]))
    return found


def _command_lines(text: str) -> list[str]:
    """A shell block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", "", text)
    lines = (re.sub(r"\s+#.*$", "", line).strip() for line in joined.splitlines())
    return [re.sub(r"\s+", " ", line) for line in lines if line and not line.startswith("#")]


def test_every_command_line_in_the_docs_is_run_by_a_test_or_marked_an_illustration():
    runnable, unmarked = [], []
    for path, info, text in _blocks():
        words = info.split()
        if words[:1] == ["sh"] and "illustration" not in words:
            runnable += [(path, line) for line in _command_lines(text)]
        elif not words and any(COMMAND.match(line) for line in text.splitlines()):
            unmarked.append(f"{path}: {text.splitlines()[0]}")
    assert not unmarked, f"command blocks with no info string (sh, sh illustration or console): {unmarked}"
    untested = [f"{path}: {line}" for path, line in runnable if line not in RUN_BY]
    assert not untested, f"run these in a test and add them to RUN_BY, or mark them: {untested}"
    stale = set(RUN_BY) - {line for _, line in runnable}
    assert not stale, f"RUN_BY names command lines the docs no longer hold: {stale}"
    for line, runner in RUN_BY.items():
        with open(os.path.join(ROOT, runner), encoding="utf-8") as fh:
            source = fh.read()
        named = re.findall(r"examples/\w+\.py|make demo|pip wheel|-m venv", line)
        missing = [n for n in named if n.split("/")[-1] not in source]
        assert not missing, f"{runner} does not run {missing} ({line})"
        jobs = {j.removeprefix("conf/").removesuffix(".toml") for j in re.findall(r"conf/\w+\.toml", line)}
        assert jobs <= {*SHIPPED_JOBS, "kafka"}, f"no test runs {jobs - set(SHIPPED_JOBS)} ({line})"


def _rooted(value: object, folder: str) -> object:
    """A job file's relative ``data/...`` path under ``folder``: Spark's JVM resolves relative
    paths against its own working folder, which a test cannot move."""
    if isinstance(value, str) and re.match(r"(\./)?data/", value):
        return os.path.join(folder, value.removeprefix("./"))
    return value


SHIPPED_JOBS = ("demo", "upsert", "append")
"""The job files in conf/ that run here (conf/kafka.toml needs a broker: tests/test_kafka.py)."""


@pytest.mark.parametrize("conf", SHIPPED_JOBS)
def test_the_shipped_job_files_run_as_the_docs_say(spark, tmp_path, conf, capsys):
    """``mvsink run conf/upsert.toml`` (docs/operations.md), ``make demo`` (the embedded
    default, which is conf/demo.toml) and conf/append.toml, their ``data/...`` paths under a
    fresh folder. Two epochs each; a complete view is verified against its query; the demo
    shows the view as of its second epoch from its history (README)."""
    path = os.path.join(ROOT, "conf", f"{conf}.toml")
    config = JobConfig.load(None if conf == "demo" else path)
    job = config.job.model_copy(
        update={
            "epochs": 2,
            "trigger_seconds": 0.5,
            "show": conf == "demo",
            "checkpoint": _rooted(config.job.checkpoint, str(tmp_path)),
            "args": {k: _rooted(v, str(tmp_path)) for k, v in config.job.args.items()},
        }
    )
    rooted = {"target": _rooted(config.sink.target, str(tmp_path))}
    if config.sink.history_target is not None:
        rooted["history_target"] = _rooted(config.sink.history_target, str(tmp_path))
        assert rooted["history_target"].startswith(str(tmp_path))
    sink = config.sink.model_copy(update=rooted)
    assert sink.target.startswith(str(tmp_path)) and job.checkpoint.startswith(str(tmp_path))
    config = config.model_copy(update={"job": job, "sink": sink})
    importable(config.job, path)
    reports = run_job(config, threading.Event())
    assert [r.outcome for r in reports] == ["committed", "committed"]
    assert frontier(config.sink.target, config.sink.name) == reports[-1].epoch + 1
    if conf == "demo":
        shown = capsys.readouterr().out
        assert f"the view as of epoch {reports[1].epoch}, from its history (mvsink.as_of)" in shown
        assert "not shown" not in shown
    if config.sink.mode == "complete":
        from mvsink.ops.verify import desired_of_job

        assert verify(desired_of_job(spark, config, str(tmp_path / "scratch")).rows, config.sink.target).ok
