#!/usr/bin/env bash
# make test: bring up the real servers, run the whole suite with -race, then
# stop the servers this run started (servers that were already up stay up).
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

"$ROOT/scripts/check-tracked-size.sh"

shopt -s nullglob
before=$(cd "$RUN" && echo *.pid)
t0=$SECONDS
"$ROOT/scripts/up.sh"
load_generators # cmd/benchtable's tests run wrk and vegeta
log "servers ready in $((SECONDS - t0))s"

cleanup() {
  [ -n "${KEEP_SERVERS:-}" ] && return
  local f
  for f in "$RUN"/*.pid; do
    case " $before " in *" $(basename "$f") "*) continue ;; esac
    "$ROOT/scripts/down.sh" "$(basename "$f" .pid)"
  done
}
trap cleanup EXIT

t1=$SECONDS
set +e
go test -race -count=1 -timeout 30m ./... "$@"
rc=$?
# Second pass: the tests that drive the real RocketMQ client, which is itself
# racy (see mq/rocketmq_test.go), without -race.
if [ $rc -eq 0 ]; then
  log "second pass: RocketMQ client tests (built without -race)"
  go test -count=1 -timeout 20m -run RocketMQ ./... "$@"
  rc=$?
fi
set -e
log "go test finished in $((SECONDS - t1))s (exit $rc); make test took $((SECONDS - t0))s"
exit $rc
