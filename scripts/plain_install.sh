#!/usr/bin/env bash
# What a new user gets, as the README's quick start says: a wheel built from the clone, installed
# alone (no extras, no dev tools) in a fresh virtualenv, then the README's quick start block run
# as pasted by that virtualenv's python (not activated: the block sets its workers' Python), the
# view it made checked, and the console script's --version and status run.
# A missing runtime dependency (pandas for mapInArrow, say) fails here, not in a user's job.
set -euo pipefail
# A new user's shell: nothing pointing at this clone or another Python.
unset PYTHONPATH PYSPARK_PYTHON PYSPARK_DRIVER_PYTHON VIRTUAL_ENV
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python="${PYTHON:-python3}"
"$python" -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check --upgrade pip
"$work/venv/bin/pip" wheel --quiet --disable-pip-version-check --no-deps -w "$work/dist" "$root"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check "$work"/dist/mvsink-*.whl
cd "$work"  # never the repository's own mvsink
"$work/venv/bin/python" - "$root/README.md" > quickstart.py <<'PY'
import re
import sys

section = open(sys.argv[1], encoding="utf-8").read().split("## Quick start", 1)[1].split("\n## ", 1)[0]
print(re.search(r"```python\n(.*?)```", section, re.S).group(1))
PY
"$work/venv/bin/python" quickstart.py > quickstart.out 2> quickstart.err || { cat quickstart.err >&2; exit 1; }
cat quickstart.out
if grep -q "pandas >= 3" quickstart.err; then echo "PySpark warned about pandas 3" >&2; exit 1; fi
"$work/venv/bin/python" - "$work/venv" <<'PY'
import sys

import mvsink
from deltalake import DeltaTable

assert mvsink.__file__.startswith(sys.argv[1]), f"mvsink came from {mvsink.__file__}, not the wheel"

rows = sorted(DeltaTable("quickstart/views/revenue").to_pyarrow_table().to_pylist(), key=lambda r: r["product"])
assert rows == [{"product": "apple", "revenue": 4.5}, {"product": "pear", "revenue": 2.5}], rows
print("quick start: the view holds", rows)
PY
"$work/venv/bin/mvsink" --version
"$work/venv/bin/mvsink" status quickstart/views/revenue
