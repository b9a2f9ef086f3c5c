"""The JVM Delta runtime as Spark users add it: ``spark.jars.packages`` resolved by Spark itself
from Maven Central, not the jars the rest of the Delta line loads (``tests/delta_session.py``).

A session of its own (a new JVM, in a subprocess) with the line's package in
``spark.jars.packages`` (``io.delta:delta-spark_2.13:4.4.0`` on Spark 4.2,
``io.delta:delta-spark_2.12:3.3.2`` on 3.5) and Delta's extensions keeps a view on
the ``delta-spark`` engine for two epochs; Spark's own Delta reader reads every version back.
Spark resolves from Maven Central alone (``spark.jars.ivySettings``): its default settings
try the machine's ``~/.m2`` first, where ``mvn`` may have left a pom without its jar, which
fails the resolution. Skipped, with the reason, where Spark cannot reach Maven Central."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.delta_session import DELTA_PACKAGE

SCRIPT = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
from mvsink import MVSink
from mvsink.cli.session import local_session

root, ivy, package = sys.argv[1], sys.argv[2], sys.argv[3]
settings = os.path.join(root, "ivysettings.xml")
with open(settings, "w") as fh:  # Maven Central alone, as on a machine with no ~/.m2 of its own
    fh.write(
        '<ivysettings><settings defaultResolver="central"/><caches defaultCacheDir="' + ivy + '/cache"/>'
        '<resolvers><ibiblio name="central" m2compatible="true" root="https://repo1.maven.org/maven2/"/>'
        "</resolvers></ivysettings>"
    )
spark = local_session("mvsink-packages", conf={
    "spark.jars.packages": package,
    "spark.jars.ivy": ivy,
    "spark.jars.ivySettings": settings,
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.snapshotPartitions": "2",
})
target = os.path.join(root, "view")
# A table only the JVM Delta writes (deletion vectors): the engine has to be the session's.
spark.sql(
    f"CREATE TABLE delta.`{target}` (id BIGINT, k STRING) USING DELTA "
    "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
)
sink = MVSink(target, "v", engine="delta-spark", placement="driver")
out = []
for epoch, rows in enumerate([range(0, 20), range(5, 25)]):
    report = sink(spark.range(rows.start, rows.stop).selectExpr("id", "cast(id % 3 AS string) AS k"), epoch)
    read = sorted(r.id for r in spark.read.format("delta").load(target).collect())
    out.append({"outcome": report.outcome, "version": report.version, "ids": read})
versions = [r.version for r in spark.sql(f"DESCRIBE HISTORY delta.`{target}`").collect()]
print("RESULT " + json.dumps({"epochs": out, "versions": sorted(versions)}))
"""


def _central() -> bool:
    """Whether Maven Central answers from here."""
    import urllib.request

    try:
        urllib.request.urlopen("https://repo1.maven.org/maven2/io/delta/", timeout=15).close()
        return True
    except OSError:
        return False


@pytest.mark.newest_line  # the route users take, tested once: on the Delta 4.4 line
def test_a_view_on_the_jvm_engine_with_delta_from_spark_jars_packages(tmp_path: Path) -> None:
    ivy = Path(os.environ.get("MVSINK_IVY_HOME", Path.home() / ".ivy2.mvsink"))
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), str(ivy), DELTA_PACKAGE],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=900,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_SUBMIT")},
    )
    text = run.stderr + run.stdout
    if run.returncode and ("unresolved dependency" in text or "download failed" in text) and not _central():
        pytest.skip(f"Spark could not resolve {DELTA_PACKAGE}: Maven Central is out of reach here")
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert [e["outcome"] for e in found["epochs"]] == ["committed", "committed"]
    assert [e["ids"] for e in found["epochs"]] == [list(range(0, 20)), list(range(5, 25))]
    # The table Spark made (0), then one version an epoch.
    assert found["versions"] == [0, 1, 2]
