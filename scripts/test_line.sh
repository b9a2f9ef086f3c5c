#!/usr/bin/env bash
# Run one line of the test suite (a pytest command) with its output in build/test/NAME.log, and
# say in one line when it starts and how it ended; when it fails, print its failures and leave
# build/test/NAME.failed. `make test` runs two tracks of lines side by side, so each line's
# output stays whole in its own log, and fails at the end if any line left that file.
#
#   scripts/test_line.sh NAME COMMAND...
#   scripts/test_line.sh 4.x .venv/bin/python -m pytest -q
set -uo pipefail
name="${1:?usage: scripts/test_line.sh NAME COMMAND...}"
shift
root="$(cd "$(dirname "$0")/.." && pwd)"
log="$root/build/test/$name.log"
mkdir -p "$(dirname "$log")"
rm -f "$root/build/test/$name.failed"
start=$(date +%s)
echo "[$(date +%H:%M:%S)] $name: started (log: build/test/$name.log)"
"$@" > "$log" 2>&1
rc=$?
[ "$rc" -eq 0 ] || echo "$rc" > "$root/build/test/$name.failed"
took=$(( $(date +%s) - start ))
summary="$(grep -E '^[=]* ?[0-9]+ (passed|failed|error|skipped|deselected)|no tests ran' "$log" | tail -1 | tr -d '=' | sed 's/^ *//;s/ *$//')"
when="$(date +%H:%M:%S)"
if [ "$rc" -eq 0 ]; then
  echo "[$when] $name: ok in $((took / 60)) min $((took % 60)) s: ${summary:-see the log}"
  exit 0
fi
echo "[$when] $name: FAILED (exit $rc) in $((took / 60)) min $((took % 60)) s: ${summary:-see the log}"
# Pytest's failure report and summary when there is one, else the log's last lines.
if grep -q -E '^=+ (FAILURES|ERRORS) =+$' "$log"; then
  sed -n -E '/^=+ (FAILURES|ERRORS) =+$/,$p' "$log" | sed "s/^/$name| /"
else
  tail -50 "$log" | sed "s/^/$name| /"
fi
exit "$rc"
