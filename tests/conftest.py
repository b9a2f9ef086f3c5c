"""One SparkSession for the whole suite; each test gets its own table folder."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from mvsink.session import local_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = local_session("mvsink-tests", conf={"spark.driver.memory": "2g"})
    yield session
    session.stop()


@pytest.fixture
def target(tmp_path: os.PathLike[str]) -> str:
    return os.path.join(str(tmp_path), "view")
