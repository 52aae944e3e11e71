#!/usr/bin/env bash
# make run: build inventoryd into bin/ and run it on the embedded stand-ins.
# `go run` says nothing while it compiles, and a cold build cache takes
# minutes: say what is happening, then exec the binary so its banner appears
# as soon as it listens (and signals reach it, not a go run wrapper).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
echo "building inventoryd into bin/ (the first build takes a few minutes, later ones seconds)..." >&2
"$GO" build -ldflags "-X main.version=$(git describe --always --dirty 2>/dev/null || echo devel)" -o bin/inventoryd ./cmd/inventoryd
exec bin/inventoryd "$@"
