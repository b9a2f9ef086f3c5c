#!/usr/bin/env bash
# Print the folder of the JVM jars that set NAME of jvm/NAME/pom.xml lists, fetching them from
# Maven Central with the machine's `mvn` into .jvm/NAME the first time (again when the pom
# changes). When Maven cannot fetch them, say why on stderr and print the fallback folder
# ../shared/delta-jvm/jars (delta-spark 4.4 built from source beside the repository) if it
# holds jars; print nothing when neither is there (the tests that need them are then skipped).
#
#   scripts/jvm_jars.sh delta-4.4
set -uo pipefail
name="${1:?usage: scripts/jvm_jars.sh NAME (a folder of jvm/)}"
root="$(cd "$(dirname "$0")/.." && pwd)"
pom="$root/jvm/$name/pom.xml"
out="$root/.jvm/$name"
stamp="$out/.fetched"
fallback="$(cd "$root/.." && pwd)/shared/delta-jvm/jars"
[ -f "$pom" ] || { echo "jvm_jars: no $pom" >&2; exit 2; }
digest="$(sha256sum "$pom" | cut -c1-64)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ]; then
  echo "$out"
  exit 0
fi
rm -rf "$out"
mkdir -p "$out"
if ! command -v mvn >/dev/null 2>&1; then
  reason="no mvn on this machine"
elif log="$(mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies -DexcludeTransitive=true \
      -DoutputDirectory="$out" 2>&1)"; then
  echo "$digest" > "$stamp"
  echo "$out"
  exit 0
else
  reason="mvn could not fetch them: $(echo "$log" | grep -m1 -E 'ERROR|Could not' || echo "$log" | tail -1)"
fi
rm -rf "$out"
if ls "$fallback"/*.jar >/dev/null 2>&1; then
  echo "jvm_jars: the $name jars from Maven Central: $reason; using $fallback instead" >&2
  echo "$fallback"
else
  echo "jvm_jars: the $name jars from Maven Central: $reason; and $fallback holds none" >&2
fi
