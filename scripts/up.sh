#!/usr/bin/env bash
# Brings up the real servers the tests use, on loopback: Redis (single node and
# a three-node cluster), MariaDB, and an Apache RocketMQ name server and broker.
# Installs each from the package registries when missing, reuses one that
# already answers, waits until each answers, and records what it started so
# scripts/down.sh stops only that.
source "$(dirname "$0")/lib.sh"

install_redis() {
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null || apt_install redis-server redis-tools
}

install_mariadb() {
  command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || apt_install mariadb-server
}

start_redis() {
  install_redis
  if redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; then
    log "redis :$REDIS_PORT already running, reusing it"
  else
    # --databases is testkit/redislease's Databases (0 make run's, 1-30 the
    # test processes', 31 make bench's); its test reads it here.
    redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no \
      --databases 32 --pidfile "$RUN/redis.pidfile" --logfile "$CACHE/redis.log"
    wait_for "redis :$REDIS_PORT" 10 redis-cli -p "$REDIS_PORT" ping
    started redis "$(cat "$RUN/redis.pidfile")"
  fi
  log "redis: $(redis-cli -p "$REDIS_PORT" info server | grep -m1 redis_version | tr -d '\r')"

  local p nodes=() fresh=""
  for p in $REDIS_CLUSTER_PORTS; do
    nodes+=("127.0.0.1:$p")
    if redis-cli -p "$p" ping 2>/dev/null | grep -q PONG; then continue; fi
    local dir="$CACHE/redis-cluster/$p"
    rm -rf "$dir" && mkdir -p "$dir"
    redis-server --daemonize yes --bind 127.0.0.1 --port "$p" --save "" --appendonly no \
      --cluster-enabled yes --cluster-config-file "$dir/nodes.conf" --dir "$dir" \
      --pidfile "$RUN/redis-$p.pidfile" --logfile "$dir/redis.log"
    wait_for "redis cluster node :$p" 10 redis-cli -p "$p" ping
    started "redis-$p" "$(cat "$RUN/redis-$p.pidfile")"
    fresh=1
  done
  local first=${REDIS_CLUSTER_PORTS%% *}
  if ! redis-cli -p "$first" cluster info | grep -q 'cluster_state:ok'; then
    [ -n "$fresh" ] || die "redis cluster nodes run but the cluster is not formed; run scripts/down.sh or stop them"
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >/dev/null
    wait_for "redis cluster" 20 bash -c "redis-cli -p $first cluster info | grep -q cluster_state:ok"
  fi
  log "redis cluster: ${nodes[*]} ok"
}

start_mariadb() {
  install_mariadb
  if mariadb-admin --protocol=tcp -h127.0.0.1 -P"$MYSQL_PORT" -u"$MYSQL_USER" -p"$MYSQL_PASSWORD" ping >/dev/null 2>&1 \
     || mariadb-admin ping >/dev/null 2>&1; then
    log "mariadb already running, reusing it"
  else
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
    nohup /usr/sbin/mariadbd --user=mysql --bind-address=127.0.0.1 --port="$MYSQL_PORT" \
      --innodb-buffer-pool-size=256M --max-connections=500 >"$CACHE/mariadb.log" 2>&1 &
    started mariadb $!
    WAIT_PID=$! WAIT_LOG="$CACHE/mariadb.log" wait_for "mariadb" 60 mariadb-admin ping
  fi
  # Root authenticates by the unix socket only; the service and tests use a TCP user.
  mariadb -uroot <<SQL
CREATE USER IF NOT EXISTS '$MYSQL_USER'@'127.0.0.1' IDENTIFIED BY '$MYSQL_PASSWORD';
CREATE USER IF NOT EXISTS '$MYSQL_USER'@'localhost' IDENTIFIED BY '$MYSQL_PASSWORD';
GRANT ALL PRIVILEGES ON *.* TO '$MYSQL_USER'@'127.0.0.1';
GRANT ALL PRIVILEGES ON *.* TO '$MYSQL_USER'@'localhost';
CREATE DATABASE IF NOT EXISTS \`$MYSQL_DATABASE\`;
SQL
  log "mariadb: $(mariadb -N -uroot -e 'SELECT VERSION()')"
}

# rocketmq_classpath makes sure the RocketMQ jars are in the per-user
# shared cache (downloading them once, under a lock, so two clones never
# fetch into one directory at once) and that this clone's
# .cache/rocketmq-VERSION points at them, where the private brokers of the
# tests and make faults look first (testkit/servers, which falls back on
# the shared cache itself); it prints the classpath.
rocketmq_classpath() {
  local shared="$SHARED_CACHE/rocketmq-$ROCKETMQ_VERSION" dir="$CACHE/rocketmq-$ROCKETMQ_VERSION"
  if [ ! -f "$dir/.complete" ]; then # a link to the shared jars, or a clone's own from before
    mkdir -p "$SHARED_CACHE"
    (
      flock 9
      if [ ! -f "$shared/.complete" ]; then
        command -v java >/dev/null || apt_install openjdk-17-jre-headless
        command -v mvn >/dev/null || apt_install maven
        log "resolving Apache RocketMQ $ROCKETMQ_VERSION from Maven Central into $shared"
        rm -rf "$shared" && mkdir -p "$shared"
        sed "s/@VERSION@/$ROCKETMQ_VERSION/g" "$ROOT/scripts/rocketmq/pom.xml" >"$shared/pom.xml"
        (cd "$shared" && mvn -B -q dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$shared/lib") >&2
        touch "$shared/.complete"
      fi
    ) 9>"$SHARED_CACHE/.rocketmq-$ROCKETMQ_VERSION.lock"
    rm -rf "$dir"
    ln -s "$shared" "$dir"
  fi
  command -v java >/dev/null || apt_install openjdk-17-jre-headless
  echo "$dir/lib/*"
}

# rocketmq.broker.rebalance.lockMaxLiveTime: a queue lock its consumer stops
# renewing (it died) lapses after 1 s instead of 60 s, so another node takes
# its queues over within seconds; the consumer renews its locks every 200 ms
# and relies on this lifetime (mq.BrokerLockLifetime, docs/operations.md).
java_opts() {
  echo -Xms128m -Xmx512m -XX:MaxDirectMemorySize=256m \
    --add-opens java.base/java.nio=ALL-UNNAMED --add-opens java.base/jdk.internal.ref=ALL-UNNAMED \
    --add-opens java.base/java.util=ALL-UNNAMED --add-exports java.base/sun.nio.ch=ALL-UNNAMED \
    -Drocketmq.broker.rebalance.lockMaxLiveTime=1000 \
    -Drocketmq.home.dir="$CACHE/rocketmq-home" -Duser.home="$CACHE/rocketmq-home"
}

start_rocketmq() {
  if port_open "$NAMESRV_PORT" && port_open "$BROKER_PORT"; then
    log "rocketmq name server :$NAMESRV_PORT and broker :$BROKER_PORT already running, reusing them"
    return
  fi
  local cp; cp=$(rocketmq_classpath)
  local home="$CACHE/rocketmq-home"
  mkdir -p "$home"
  if ! port_open "$NAMESRV_PORT"; then
    printf 'listenPort=%s\n' "$NAMESRV_PORT" >"$home/namesrv.conf"
    # shellcheck disable=SC2046
    nohup java $(java_opts) -Drmq.logback.configurationFile=rmq.namesrv.logback.xml -cp "$cp" \
      org.apache.rocketmq.namesrv.NamesrvStartup -c "$home/namesrv.conf" >"$home/namesrv.out" 2>&1 &
    started rocketmq-namesrv $!
    WAIT_PID=$! WAIT_LOG="$home/namesrv.out" wait_for "rocketmq name server" 60 grep -q 'boot success' "$home/namesrv.out"
  fi
  if ! port_open "$BROKER_PORT"; then
    rm -rf "$home/store"
    sed "s#@STORE@#$home/store#g; s#@NAMESRV@#127.0.0.1:$NAMESRV_PORT#g; s#@PORT@#$BROKER_PORT#g" \
      "$ROOT/scripts/rocketmq/broker.conf" >"$home/broker.conf"
    # shellcheck disable=SC2046
    nohup java $(java_opts) -Drmq.logback.configurationFile=rmq.broker.logback.xml -cp "$cp" \
      org.apache.rocketmq.broker.BrokerStartup -c "$home/broker.conf" >"$home/broker.out" 2>&1 &
    started rocketmq-broker $!
    WAIT_PID=$! WAIT_LOG="$home/broker.out" wait_for "rocketmq broker" 120 grep -q 'boot success' "$home/broker.out"
  fi
  log "rocketmq $ROCKETMQ_VERSION: $(grep -m1 -o 'The broker.*boot success.*' "$home/broker.out" || echo "broker $ROCKETMQ_VERSION up")"
}

# The documented examples (README.md, docs/examples.md; cmd/inventoryd/readme_test.go
# runs them) call the API with curl, read answers with jq and sign payment
# callbacks with openssl; promtool checks the alerting rules in deploy/.
ensure_tools() {
  local tool missing=()
  for tool in jq curl openssl; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
  command -v promtool >/dev/null || install_promtool
}

# deploy/deploy_test.go checks the alerting rules with promtool, which
# Debian ships in the prometheus package. Installing it may start a
# Prometheus server; the tests want only the tool, so stop that one.
install_promtool() {
  apt_install --no-install-recommends prometheus
  if [ -d /run/systemd/system ]; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
  elif [ -x /etc/init.d/prometheus ]; then
    /etc/init.d/prometheus stop >/dev/null 2>&1 || true
  fi
}

# A RocketMQ 5.x broker refuses every message once its disk is 90% full
# (diskSpaceWarningLevelRatio): the sync then stops with no error a test can
# name, and every test that pays an order times out. Say it before.
check_disk() {
  local used
  used=$(df -P "$CACHE" 2>/dev/null | awk 'NR == 2 { sub("%", "", $5); print $5 }')
  [ -n "$used" ] || return 0
  [ "$used" -lt 88 ] || die "the disk holding $CACHE is ${used}% full: the RocketMQ broker refuses messages past 90%; free space (go clean -cache is often the most)"
}

what=${1:-all}
check_disk
case $what in
  # The jars too when the servers were already up (another clone's): the
  # tests start private brokers from them.
  all) ensure_tools; start_redis; start_mariadb; start_rocketmq; rocketmq_classpath >/dev/null ;;
  redis) start_redis ;;
  mariadb) start_mariadb ;;
  rocketmq) start_rocketmq ;;
  # Installs what make faults starts privately, without starting anything.
  install) install_redis; install_mariadb; rocketmq_classpath >/dev/null ;;
  *) die "usage: $0 [all|redis|mariadb|rocketmq|install]" ;;
esac
