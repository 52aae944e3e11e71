#!/usr/bin/env bash
# make bench: the side-by-side deduction table (cmd/benchtable) against the
# real servers, then the Go benchmarks. The table is also written to
# bench-results/results.md, its chart to bench-results/results.png, and the
# CPU profile of the phases whose targets are the durable sale's (seckill
# selling, the 2-line cart, the selling soak) to bench-results/http.cpu.pprof,
# and of the campaign group's (its selling phase, each opening before and
# after starts_at, the two extensions) to bench-results/campaign.cpu.pprof
# (each one's top is in the table when one of its targets is missed).
# The honest-load-generator check drives the seckill selling phase with
# two load generators nobody here wrote: wrk (Debian's package, installed
# here when missing) and vegeta (a Go module's CLI, installed into
# .cache/bin from the Go module proxy); the run stops here if either cannot
# be installed.
# Arguments go to cmd/benchtable and override these defaults.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
"$ROOT/scripts/up.sh"

VEGETA_VERSION=v12.13.0 # cmd/benchtable/external.go's vegetaVersion
command -v wrk >/dev/null || apt_install wrk
command -v wrk >/dev/null || die "wrk is not installed and could not be; the load-generator check needs it"
VEGETA="$CACHE/bin/vegeta-$VEGETA_VERSION"
if [ ! -x "$VEGETA" ]; then
  log "installing vegeta $VEGETA_VERSION"
  mkdir -p "$CACHE/bin/vegeta-build"
  GOBIN="$CACHE/bin/vegeta-build" go install "github.com/tsenart/vegeta/v12@$VEGETA_VERSION" \
    || die "could not install vegeta $VEGETA_VERSION (go install github.com/tsenart/vegeta/v12@$VEGETA_VERSION); the load-generator check needs it"
  mv "$CACHE/bin/vegeta-build/vegeta" "$VEGETA" && rmdir "$CACHE/bin/vegeta-build"
fi

mkdir -p bench-results
go run ./cmd/benchtable -out bench-results/results.md -cpuprofile bench-results/http.cpu.pprof -wrk "$(command -v wrk)" -vegeta "$VEGETA" \
  -cpuprofile-phases '^(seckill, selling|orders, 2-line cart|soak|seckill, selling, beside the campaign|campaign #[0-9]+, .*|(orders|stock) extend)$' "$@"
go test -run '^$' -bench . -benchtime=1x ./...
