# The front door. `make run` needs only Go; `make test` brings up the real
# servers (Redis, MariaDB, RocketMQ) on loopback, installing them if missing.
GO ?= go

.PHONY: run build test bench lint up down

run:
	@GO=$(GO) scripts/run.sh

build:
	$(GO) build -o bin/inventoryd ./cmd/inventoryd

test:
	scripts/test.sh

bench:
	scripts/bench.sh

lint:
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

up:
	scripts/up.sh

down:
	scripts/down.sh
