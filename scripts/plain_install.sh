#!/usr/bin/env bash
# What a new user gets from a bare `pip install mvsink`: the package alone (no extras, no dev
# tools) in a fresh, activated virtualenv, then one epoch in a plain local SparkSession.
# A missing runtime dependency (pandas for mapInArrow, say) fails here, not in a user's job.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"${PYTHON:-python3}" -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check "$root"
cd "$work"  # never the repository's own mvsink
PATH="$work/venv/bin:$PATH" python - <<'PY'
from deltalake import DeltaTable
from pyspark.sql import SparkSession, functions as F

from mvsink import MVSink

spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "1").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
view = spark.range(10).select("id", (F.col("id") % 3).alias("k"))
report = MVSink("./view", "plain")(view, 0)
rows = DeltaTable("./view").to_pyarrow_table().num_rows
assert report.outcome == "committed" and rows == 10, (report, rows)
print(f"plain install: one epoch committed, {rows} rows")
spark.stop()
PY
