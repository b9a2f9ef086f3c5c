"""The JVM Delta runtime beside mvsink, as Spark users run it, for the Delta line.

The jars come from the folder ``MVSINK_DELTA_JARS`` names (``.ci/run`` and ``make test`` fetch
the artifacts ``jvm/delta-4.4/pom.xml`` lists from Maven Central into ``.jvm/delta-4.4``, and
fall back to ``../shared/delta-jvm/jars``, delta-spark 4.4 built from source, saying why), or
from ``spark.jars.packages`` (as users add it) when ``MVSINK_DELTA_PACKAGES=1``. Otherwise
every test of the line is skipped with the reason. delta-spark 4.4 needs PySpark 4.2.x: the
line runs in its own virtualenv (``.venv-delta``).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pyspark
import pytest

DELTA_LINE = bool(os.environ.get("MVSINK_INTEROP"))
DELTA_PACKAGE = "io.delta:delta-spark_2.13:4.4.0"


def delta_conf(warehouse: Path) -> dict[str, str]:
    """The session conf that loads the JVM Delta runtime, or a skip saying why it cannot."""
    jars = sorted(glob.glob(os.path.join(os.environ.get("MVSINK_DELTA_JARS", ""), "*.jar")))
    if jars:
        source = {"spark.jars": ",".join(jars)}
    elif os.environ.get("MVSINK_DELTA_PACKAGES"):
        source = {"spark.jars.packages": DELTA_PACKAGE}
    else:
        pytest.skip(
            "no JVM Delta: set MVSINK_DELTA_JARS to a folder of delta-spark 4.4 jars, or "
            "MVSINK_DELTA_PACKAGES=1 on a machine that reaches Maven Central"
        )
    if not pyspark.__version__.startswith("4.2."):
        pytest.skip(f"delta-spark 4.4 needs PySpark 4.2.x, this is {pyspark.__version__} (run `make test`)")
    return {
        **source,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.databricks.delta.snapshotPartitions": "2",  # log replay on 2 cores
        # Delta's VACUUM lists the table with this many tasks (default 10,000: a minute on 2 cores)
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": "4",
        "spark.sql.warehouse.dir": str(warehouse),
    }
