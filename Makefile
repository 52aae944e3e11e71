# The front door. `make run` needs only Go; `make test` brings up the real
# servers (Redis, MariaDB, RocketMQ) on loopback, installing them if missing.
GO ?= go

.PHONY: run build test bench soak faults lint up down

run:
	@GO=$(GO) scripts/run.sh

build:
	$(GO) build -o bin/inventoryd ./cmd/inventoryd

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

lint:
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

up:
	scripts/up.sh

down:
	scripts/down.sh
