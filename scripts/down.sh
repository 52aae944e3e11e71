#!/usr/bin/env bash
# Stops the servers scripts/up.sh started (and nothing it merely reused).
# With names (redis, mariadb, rocketmq-broker, ...), stops only those.
source "$(dirname "$0")/lib.sh"

shopt -s nullglob
if [ $# -gt 0 ]; then
  files=(); for n in "$@"; do [ -f "$RUN/$n.pid" ] && files+=("$RUN/$n.pid"); done
else
  files=("$RUN"/*.pid)
fi
for f in "${files[@]}"; do
  name=$(basename "$f" .pid) pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping $name (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
done
