#!/usr/bin/env bash
# make bench: the side-by-side deduction table (cmd/benchtable) against the
# real servers, then the Go benchmarks. The table is also written to
# bench-results/results.md.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
"$ROOT/scripts/up.sh"
go run ./cmd/benchtable "$@"
go test -run '^$' -bench . -benchtime=1x ./...
