#!/usr/bin/env bash
# Print the folder of the JVM jars that set NAME of jvm/NAME/pom.xml lists, fetching them from
# Maven Central with the machine's `mvn` into .jvm/NAME the first time (again when the pom
# changes). When Maven cannot fetch them, say why on stderr and print FALLBACK if it holds jars
# (for delta-4.4: ../shared/delta-jvm/jars, delta-spark 4.4 built from source beside the
# repository); print nothing when neither is there (the tests that need them are then skipped).
#
#   scripts/jvm_jars.sh NAME [FALLBACK]
#   scripts/jvm_jars.sh delta-4.4 ../shared/delta-jvm/jars
set -uo pipefail
name="${1:?usage: scripts/jvm_jars.sh NAME [FALLBACK] (NAME: a folder of jvm/)}"
fallback="${2:-}"
root="$(cd "$(dirname "$0")/.." && pwd)"
pom="$root/jvm/$name/pom.xml"
out="$root/.jvm/$name"
stamp="$out/.fetched"
[ -f "$pom" ] || { echo "jvm_jars: no $pom" >&2; exit 2; }
digest="$(sha256sum "$pom" | cut -c1-64)"
# A set run in a JVM of its own (the Kafka broker) needs its whole classpath: its pom says so
# with <mvsink.transitive>true</mvsink.transitive>; the others list every artifact they add.
exclude_transitive=true
grep -q '<mvsink.transitive>true</mvsink.transitive>' "$pom" && exclude_transitive=false
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ]; then
  echo "$out"
  exit 0
fi
rm -rf "$out"
mkdir -p "$out"
if ! command -v mvn >/dev/null 2>&1; then
  reason="no mvn on this machine"
elif log="$(mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies -DexcludeTransitive="$exclude_transitive" \
      -DoutputDirectory="$out" 2>&1)"; then
  echo "$digest" > "$stamp"
  echo "$out"
  exit 0
else
  log="$(echo "$log" | sed 's/\x1b\[[0-9;]*m//g')"
  reason="mvn could not fetch them: $(echo "$log" | grep -m1 -E 'ERROR|Could not' || echo "$log" | tail -1)"
fi
rm -rf "$out"
if [ -n "$fallback" ] && ls "$fallback"/*.jar >/dev/null 2>&1; then
  fallback="$(cd "$fallback" && pwd)"
  echo "jvm_jars: the $name jars from Maven Central: $reason; using $fallback instead" >&2
  echo "$fallback"
else
  echo "jvm_jars: the $name jars from Maven Central: $reason; and ${fallback:-no fallback folder} holds none" >&2
fi
