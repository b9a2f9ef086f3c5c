"""The JVM Delta runtime beside mvsink, as Spark users run it, for the Delta lines.

Each Spark line has its Delta: delta-spark 4.4 on PySpark 4.2 (its own virtualenv,
``.venv-delta``), and delta-spark 3.3 on PySpark 3.5 (``.venv-spark35``), what EMR 7, Dataproc
2.2 and most self-managed 3.5 clusters run. The jars come from the folder ``MVSINK_DELTA_JARS``
names (``make test`` fetches the artifacts ``jvm/delta-4.4/pom.xml`` and
``jvm/delta-3.3/pom.xml`` list from Maven Central into ``.jvm/``; the 4.4 set falls back to
``../shared/delta-jvm/jars``, built from source, saying why), or from ``spark.jars.packages``
(as users add it) when ``MVSINK_DELTA_PACKAGES=1``. Otherwise every test of the line is skipped
with the reason.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pyspark
import pytest

DELTA_LINE = bool(os.environ.get("MVSINK_INTEROP"))
_PACKAGES = {"4.2.": "io.delta:delta-spark_2.13:4.4.0", "3.5.": "io.delta:delta-spark_2.12:3.3.2"}
"""The Delta each PySpark line runs beside, as users add it."""
DELTA_PACKAGE = next((p for line, p in _PACKAGES.items() if pyspark.__version__.startswith(line)), "")
DELTA_VERSION = DELTA_PACKAGE.rpartition(":")[2]


def delta_conf(warehouse: Path) -> dict[str, str]:
    """The session conf that loads the JVM Delta runtime, or a skip saying why it cannot."""
    if not DELTA_PACKAGE:
        pytest.skip(
            f"the Delta lines run on PySpark {' and '.join(p + 'x' for p in _PACKAGES)}, "
            f"this is {pyspark.__version__} (run `make test`)"
        )
    jars = sorted(glob.glob(os.path.join(os.environ.get("MVSINK_DELTA_JARS", ""), "*.jar")))
    if jars:
        source = {"spark.jars": ",".join(jars)}
    elif os.environ.get("MVSINK_DELTA_PACKAGES"):
        source = {"spark.jars.packages": DELTA_PACKAGE}
    else:
        pytest.skip(
            f"no JVM Delta: set MVSINK_DELTA_JARS to a folder of delta-spark {DELTA_VERSION} jars, or "
            "MVSINK_DELTA_PACKAGES=1 on a machine that reaches Maven Central"
        )
    return {
        **source,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.databricks.delta.snapshotPartitions": "2",  # log replay on 2 cores
        # Delta's VACUUM lists the table with this many tasks (default 10,000: a minute on 2 cores)
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": "4",
        "spark.sql.warehouse.dir": str(warehouse),
    }
