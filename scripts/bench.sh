#!/usr/bin/env bash
# make bench: benchmarks side by side in one run against the real servers.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
"$ROOT/scripts/up.sh"
go test -run '^$' -bench . -benchmem ./...
