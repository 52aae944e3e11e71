#!/usr/bin/env bash
# make bench: the side-by-side deduction table (cmd/benchtable) against the
# real servers, then the Go benchmarks. The table is also written to
# bench-results/results.md, its chart to bench-results/results.png, and the
# CPU profile of the phases whose targets are the durable sale's (seckill
# selling, the 2-line cart, the selling soak) to bench-results/http.cpu.pprof,
# and of the campaign group's (its selling phase, each opening before and
# after starts_at, the two extensions) to bench-results/campaign.cpu.pprof,
# and of the webhooks group's selling phases with no subscription and with
# one to bench-results/webhooks-none.cpu.pprof and webhooks-with.cpu.pprof
# (each one's top, or for the webhooks group their difference, is in the
# table when one of its targets is missed).
# The honest-load-generator check drives the seckill selling phase with
# two load generators nobody here wrote: wrk (Debian's package, installed
# here when missing) and vegeta (a Go module's CLI, installed into
# .cache/bin from the Go module proxy); the run stops here if either cannot
# be installed.
# Arguments go to cmd/benchtable and override these defaults.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
"$ROOT/scripts/up.sh"

load_generators

mkdir -p bench-results
go run ./cmd/benchtable -out bench-results/results.md -cpuprofile bench-results/http.cpu.pprof -wrk "$INVENTORY_WRK" -vegeta "$INVENTORY_VEGETA" \
  -cpuprofile-phases '^(seckill, selling|orders, 2-line cart|soak|campaign #[0-9]+, .*|(orders|stock) extend)$' "$@"
# A 50,000-line stock count during the seckill selling phase (issue 45),
# against the same phase without it: its table is bench-results/results-counts.md.
go run ./cmd/benchtable -only counts -out bench-results/results.md "$@"
go test -run '^$' -bench . -benchtime=1x ./...
