# The front door. `make run` needs only Go; `make test` brings up the real
# servers (Redis, MariaDB, RocketMQ) on loopback, installing them if missing
# (as root, on Debian: see README "Tests"); `make secrets` writes .env for
# docker compose.
GO ?= go
# What `inventoryd --version` says (the commit, when git can tell).
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo devel)

.PHONY: run build test bench soak faults model lint up down secrets

run:
	@GO=$(GO) scripts/run.sh

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o bin/inventoryd ./cmd/inventoryd

# Fresh secrets for docker compose in .env (kept if it exists; FORCE=1 replaces it).
secrets:
	scripts/secrets.sh

test:
	scripts/test.sh

bench:
	scripts/bench.sh

# The history soak: ORDERS orders through one SKU, with flat-cost columns at
# each decade (cold init, Redis per order, reservation latency, DB work).
ORDERS ?= 1000000
soak:
	scripts/up.sh
	$(GO) run ./cmd/benchtable -only history -orders $(ORDERS)

# Faults with real processes: every scenario against private servers the
# driver starts (SEED replays a run; DURATION is the workload per scenario).
SEED ?=
DURATION ?= 20s
faults:
	scripts/up.sh install
	$(GO) run ./cmd/faults -duration $(DURATION) $(if $(SEED),-seed $(SEED))

# The model-based test, long: OPS random operations from a fresh seed (or
# SEED to replay one) against the real Redis and MariaDB; make test runs
# 10,000 from a fixed seed. 200,000 take about 30-40 minutes.
OPS ?= 200000
model:
	scripts/up.sh
	INVENTORY_MODEL_OPS=$(OPS) INVENTORY_MODEL_SEED=$(or $(SEED),$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')) \
		$(GO) test -race -count=1 -timeout 0 -run '^TestModel$$' -v ./testkit/systemtest

lint:
	scripts/check-tracked-size.sh
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

up:
	scripts/up.sh

down:
	scripts/down.sh
