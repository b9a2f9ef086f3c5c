"""Spark's Python workers without mvsink, or with another one (``workers.py``).

Spark starts the workers of a Python function with the ``pythonExec`` of the SparkContext at
the time the function is made; pointing it at a wrapper script gives the suite's one session
workers of another environment for the length of a test, without a second Spark.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from mvsink import ConfigError, MVSink
from mvsink.epoch import workers
from mvsink.errors import InvariantViolation
from mvsink.table.index import FileEntry, StoredIndex
from mvsink.table.storage import Store
from tests.helpers import people


def _wrapper(folder: Path, name: str, env: str, flags: str = "") -> str:
    """A Python for the workers: this interpreter, started in ``folder`` (not the repository,
    whose mvsink a worker would find on its path) with ``env`` set."""
    path = folder / name
    path.write_text(f'#!/bin/sh\ncd "{folder}"\n{env} exec "{sys.executable}" {flags} "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.fixture
def workers_run(spark, monkeypatch) -> Iterator[object]:
    """Set the workers' Python for one test; the session's own afterwards."""
    context = spark.sparkContext
    saved = context.pythonExec
    monkeypatch.setattr(workers, "_checked", set())  # check again, whatever ran before

    def use(python: str) -> None:
        context.pythonExec = python

    yield use
    context.pythonExec = saved


def _site_packages() -> str:
    return next(p for p in sys.path if p.endswith("site-packages"))


def test_workers_without_mvsink_are_a_clear_error_before_anything_is_written(
    spark, tmp_path, local_target, workers_run
):
    # -S: no site processing, so the editable install of mvsink is not on the path.
    workers_run(_wrapper(tmp_path, "bare", f'PYTHONPATH="{_site_packages()}"', "-S"))
    with pytest.raises(ConfigError, match="No module named 'mvsink'") as info:
        MVSink(local_target, "v")(people(spark, range(3)), 0)
    assert "PYSPARK_PYTHON" in str(info.value) and sys.executable in str(info.value)
    assert info.value.view == "v" and not os.path.exists(local_target)


def test_workers_without_pyarrow_are_a_clear_error(spark, tmp_path, local_target, workers_run):
    only = tmp_path / "only-pyspark"
    only.mkdir()
    for package in ("pyspark", "py4j"):
        (only / package).symlink_to(Path(_site_packages()) / package)
    workers_run(_wrapper(tmp_path, "nopyarrow", f'PYTHONPATH="{only}"', "-S"))
    with pytest.raises(ConfigError, match=r"cannot run mvsink's tasks.*pyarrow") as info:
        MVSink(local_target, "v")(people(spark, range(3)), 0)
    assert "PYSPARK_PYTHON" in str(info.value)
    assert not os.path.exists(local_target)


def test_workers_with_another_mvsink_are_refused(spark, tmp_path, local_target, workers_run):
    other = tmp_path / "elsewhere" / "mvsink"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("__version__ = '0.0.1'\n")
    (other / "table").mkdir()
    (other / "table" / "__init__.py").write_text("")
    (other / "table" / "fingerprint.py").write_text("FINGERPRINT_VERSION = 99\n")
    workers_run(_wrapper(tmp_path, "other", f'PYTHONPATH="{other.parent}"'))
    with pytest.raises(ConfigError, match=r"run mvsink 0\.0\.1 \(fingerprint version 99\)"):
        MVSink(local_target, "v")(people(spark, range(3)), 0)
    assert not os.path.exists(local_target)


def test_the_workers_own_environment_passes_and_the_view_is_written(spark, local_target, workers_run):
    sink = MVSink(local_target, "v")
    assert sink(people(spark, range(3)), 0).outcome == "committed"


def test_an_index_of_another_fingerprint_version_is_never_written_or_read(tmp_path):
    store = Store(str(tmp_path))
    index = StoredIndex.of(store, "v", pa.schema([("id", pa.int64())]))
    foreign = StoredIndex(store, "v", index.digest, fingerprint_version=index.fingerprint_version + 1)
    entry = FileEntry(np.array([1], dtype=np.int64), np.array([2], dtype=np.int64))
    with pytest.raises(InvariantViolation, match="another mvsink than the driver"):
        foreign.put("part-0.parquet", 10, entry)
    assert not list(tmp_path.rglob("*.parquet"))
