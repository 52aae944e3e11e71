#!/usr/bin/env bash
# make secrets: writes the secrets docker compose needs to .env (compose
# reads .env beside docker-compose.yml): the admin token, one client
# credential, the payment secret, the buyer-token key and the database
# password, each 32 random bytes in hex. An existing file is kept (its
# secrets may be in use); FORCE=1 replaces it. The file is mode 0600, ignored
# by git and left out of the image (.dockerignore).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.env}
if [ -e "$out" ] && [ -z "${FORCE:-}" ]; then
  echo "$out exists; kept it (FORCE=1 make secrets writes new secrets)" >&2
  exit 0
fi
secret() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }
umask 077
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
cat >"$tmp" <<ENV
# Written by make secrets ($(date -u +%Y-%m-%dT%H:%M:%SZ)). docker compose reads it.
# Keep it private: it holds every credential of the stack.
INVENTORY_ADMIN_TOKEN=$(secret)
INVENTORY_CLIENT_TOKENS=$(secret)
INVENTORY_PAYMENT_SECRET=$(secret)
INVENTORY_BUYER_KEY=$(secret)
MYSQL_PASSWORD=$(secret)
ENV
mv "$tmp" "$out"
echo "wrote $out: admin token, client credential, payment secret, buyer key, database password" >&2
