# Shared settings and helpers for the server scripts. Sourced, not run.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="$ROOT/.cache"            # this clone's server state and logs; ignored by git
# Downloads every clone of this user shares (the RocketMQ jars): a second
# clone's tests find them whichever clone started the servers.
SHARED_CACHE=${INVENTORY_SHARED_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/acme-inventory}
RUN="$CACHE/run"                # pid files of the servers these scripts started
mkdir -p "$RUN"

REDIS_PORT=${REDIS_PORT:-6379}
REDIS_CLUSTER_PORTS=${REDIS_CLUSTER_PORTS:-"7101 7102 7103"}
MYSQL_PORT=${MYSQL_PORT:-3306}
MYSQL_USER=${MYSQL_USER:-inventory}
MYSQL_PASSWORD=${MYSQL_PASSWORD:-inventory}
MYSQL_DATABASE=${MYSQL_DATABASE:-inventory}
ROCKETMQ_VERSION=${ROCKETMQ_VERSION:-5.3.3}
NAMESRV_PORT=9876
BROKER_PORT=10911

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FATAL: $*"; exit 1; }

# wait_for DESCRIPTION SECONDS COMMAND...: polls COMMAND until it succeeds.
# With WAIT_PID and WAIT_LOG set, gives up at once if that process dies.
wait_for() {
  local what=$1 secs=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [ -n "${WAIT_PID:-}" ] && ! kill -0 "$WAIT_PID" 2>/dev/null; then
      [ -n "${WAIT_LOG:-}" ] && grep -E "Exception|Error|error" "$WAIT_LOG" | grep -v "^[0-9:,]* |-" | tail -5 >&2
      die "$what exited before it answered (log: ${WAIT_LOG:-none})"
    fi
    [ $SECONDS -lt $deadline ] || die "$what did not answer within ${secs}s"
    sleep 0.3
  done
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

apt_updated=""
apt_install() {
  command -v apt-get >/dev/null || die "need $* but apt-get is not available (make test expects Debian); install it by hand"
  [ "$(id -u)" -eq 0 ] || die "need $* and installing it takes root (make test expects to run as root on Debian); install it, or run as root"
  if [ -z "$apt_updated" ]; then
    log "apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    apt_updated=1
  fi
  log "installing $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# load_generators: installs the two load generators nobody here wrote that
# make bench checks its own against (wrk, Debian's package; vegeta, a Go
# module's CLI, into .cache/bin from the Go module proxy), or dies; exports
# their paths as INVENTORY_WRK and INVENTORY_VEGETA (cmd/benchtable's
# tests run them: make test installs them too).
VEGETA_VERSION=v12.13.0 # cmd/benchtable/external.go's vegetaVersion
load_generators() {
  command -v wrk >/dev/null || apt_install wrk
  command -v wrk >/dev/null || die "wrk is not installed and could not be; the load-generator check needs it"
  local vegeta="$CACHE/bin/vegeta-$VEGETA_VERSION"
  if [ ! -x "$vegeta" ]; then
    log "installing vegeta $VEGETA_VERSION"
    mkdir -p "$CACHE/bin/vegeta-build"
    GOBIN="$CACHE/bin/vegeta-build" go install "github.com/tsenart/vegeta/v12@$VEGETA_VERSION" \
      || die "could not install vegeta $VEGETA_VERSION (go install github.com/tsenart/vegeta/v12@$VEGETA_VERSION); the load-generator check needs it"
    mv "$CACHE/bin/vegeta-build/vegeta" "$vegeta" && rmdir "$CACHE/bin/vegeta-build"
  fi
  INVENTORY_WRK="$(command -v wrk)"
  INVENTORY_VEGETA="$vegeta"
  export INVENTORY_WRK INVENTORY_VEGETA
}

# started NAME PID: remembers that these scripts started NAME, so down.sh stops only it.
started() { echo "$2" >"$RUN/$1.pid"; }
