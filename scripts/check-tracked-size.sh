#!/usr/bin/env bash
# Fails when a tracked file is over 1 MiB: a build product (a binary, a
# results file) committed by mistake is carried by every clone for ever.
set -euo pipefail
cd "$(dirname "$0")/.."
limit=$((1024 * 1024))
big=$(git ls-files -z | xargs -0 stat -c '%s %n' 2>/dev/null | awk -v l="$limit" '$1 > l')
if [ -n "$big" ]; then
  echo "tracked files over 1 MiB (build products belong in .gitignore):" >&2
  echo "$big" >&2
  exit 1
fi
