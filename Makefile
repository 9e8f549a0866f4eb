# Everyday targets:
#   make run     bin/caddy with this module on Caddyfile.example (memory store);
#                CONFIG=other.Caddyfile serves another config (and other ports)
#   make test    every test, including the end-to-end suite (e2e/: real Caddy
#                processes), the handler's allocation budgets (make budgets: without
#                -race), a short run of every fuzz target, and the documented
#                xcaddy build. Every part runs even when one fails, and the end of
#                the output lists every failure (bin/failures.txt). The tests run
#                Caddy in a home directory of their own (HOME, XDG_*), never the
#                user's. Redis and PostgreSQL are private throwaway instances
#                on free loopback ports, started for the run and removed after it
#                (internal/testkit/cmd/testservers: needs redis-server, initdb and postgres),
#                or the servers named by IDEMPOTENCY_REDIS_URL and
#                IDEMPOTENCY_POSTGRES_DSN. Nothing of the system's is configured.
#                Run as root (CI, a container), testservers installs a missing
#                redis-server or postgresql with apt-get, and says so first; as
#                anyone else it stops and prints the apt-get command to run.
#                The Prometheus rules' unit tests need promtool: the one on PATH,
#                or else bin/promtool, unpacked from Debian's prometheus package
#                (apt-get download: nothing installed; as root, apt-get update
#                first when the package lists are missing), by the promtool
#                target, which says which it does. Without either they are
#                skipped (they fail under CI=true). Go modules and xcaddy
#                (go install, into GOPATH/bin) are fetched by the go command.
#   make check   gofmt, go vet, go mod tidy -diff and staticcheck
#   make bench   the load benchmark (see docs/performance.md; needs wrk, about
#                40 minutes): the handler's Go benchmarks, lease renewal as
#                leases grow, then the load runs; BENCH_FLAGS="-only renewals"
#                (or go, load) runs one part, "-write docs/performance.md"
#                records the result
#   make soak    the chaos soak (not part of make test; a few minutes: about 4
#                for the soak's 3 minutes of faults, its quiet period and sweep):
#                Caddy instances (plain HTTP/1.1 and h2c, TLS with HTTP/2 and
#                HTTP/3), a persistent Redis and a PostgreSQL of its own, retrying
#                clients, a scale wave of 300 long requests per instance, clients
#                that read slowly, stall or hang up over every protocol, made-up
#                credentials filling a memory store, and a seeded nemesis (kills,
#                pauses, store restarts, black holes, cuts, latency, rows locked
#                by an outside transaction); ends with "N anomalies" and fails on
#                any. SOAK_FLAGS="-seed 42" replays a run; SOAK_FLAGS="-scale 1500
#                -store-latency 30ms" is production's scale and timing (go run
#                ./soak -h). Then a run of the randomized test on new seeds
#                (internal/testkit/model; about 3 minutes), MODEL_FLAGS.
#   make soak-failover  the failover soaks: private PostgreSQL primaries with a
#                streaming standby promoted under load (kill -9, pg_promote),
#                async and with a synchronous standby (PG_FAILOVER_FLAGS), and
#                with that standby cut off 3s before each kill
#                (PG_FAILOVER_CUT_FLAGS), then Redis Sentinel and Cluster
#                failovers (kill -9, CLUSTER FAILOVER) with and without
#                durability replicas 1 (FAILOVER_FLAGS; and Sentinel with the
#                replica cut 1s before each kill); counts the duplicate
#                executions of each failover and names them; about 30 minutes
#   make mutants plants each bug of internal/testkit/mutants in a copy of the tree and
#                says which tier of tests catches it (the randomized test at its
#                make test budget, its regression seeds, the package tests, e2e),
#                and how fast; MUTANTS_FLAGS="-only renew-cadence -tiers model";
#                about two hours for all of them (docs/guarantees.md, "How we know")
#   make fuzz    longer fuzzing runs of every fuzz target (FUZZTIME each, default 1m)
#                A duration budget can end in a spurious "context deadline exceeded"
#                on Go 1.26 (golang/go#75804); make test therefore uses fuzz-short,
#                whose budgets are execution counts.

GO           ?= go
GOBIN        := $(shell $(GO) env GOPATH)/bin
XCADDY       := $(GOBIN)/xcaddy
CADDY_VERSION := v2.11.9
MODULE       := github.com/caddy-idempotency/caddy-idempotency
# A pinned pseudo-version keeps the Go command from asking the module proxy
# about this (unpublished) module; see xcaddy.md. It is computed from the
# checkout's commit (its time in UTC and 12 hex digits of its hash), so that
# `caddy list-modules --versions` tells which commit a binary was built
# from; outside a git checkout it is the zero pseudo-version.
PSEUDO       := $(shell TZ=UTC git log -1 --date=format-local:%Y%m%d%H%M%S --format=v0.0.0-%cd-%h --abbrev=12 2>/dev/null || echo v0.0.0-00010101000000-000000000000)
FUZZTIME     ?= 1m
STATICCHECK  := honnef.co/go/tools/cmd/staticcheck@v0.8.2
# Runs a command with IDEMPOTENCY_REDIS_URL and IDEMPOTENCY_POSTGRES_DSN
# set to private servers started for it (unless already set), then stops
# them and removes their files, whatever the command's outcome.
WITH_SERVERS := bin/testservers --

.PHONY: run test check testservers testsummary promtool unit budgets build check-build fuzz fuzz-short bench soak soak-failover mutants

# The Caddyfile make run serves, and so its ports (Caddyfile.example:
# 8080, its stand-in upstream 9001, the admin API 2019): make run
# CONFIG=my.Caddyfile to use others.
CONFIG ?= Caddyfile.example

run: build
	bin/caddy run --config $(CONFIG)

# Every part runs, whichever fails; the failures of all of them are
# listed at the end (bin/failures.txt: each failed test with its package,
# each package that did not build or crashed, each failed part).
TEST_PARTS := unit budgets fuzz-short check-build

test:
	@mkdir -p bin; rm -f bin/failures.txt; status=0; \
	for part in $(TEST_PARTS); do \
		$(MAKE) --no-print-directory $$part || { status=1; echo "FAIL make $$part" >> bin/failures.txt; }; \
	done; \
	if [ -s bin/failures.txt ]; then echo; echo "== make test: every failure"; cat bin/failures.txt; fi; \
	exit $$status

check:
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then \
		echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) mod tidy -diff
	$(GO) run $(STATICCHECK) ./...

testservers:
	$(GO) build -o bin/testservers ./internal/testkit/cmd/testservers

testsummary:
	$(GO) build -o bin/testsummary ./internal/testkit/cmd/testsummary

# promtool for the rules' unit tests (contrib/prometheus), at bin/promtool:
# a link to the one on PATH, or the one of Debian's prometheus package
# (internal/testkit/cmd/getpromtool prints which, and what it downloads).
promtool:
	$(GO) run ./internal/testkit/cmd/getpromtool bin/promtool

# The end-to-end tests run the xcaddy-built binary, so the documented build
# is what they prove.
unit: build testservers promtool testsummary
	IDEMPOTENCY_CADDY_BIN=$(CURDIR)/bin/caddy IDEMPOTENCY_PROMTOOL=$$([ -e bin/promtool ] && echo $(CURDIR)/bin/promtool) \
		$(WITH_SERVERS) bin/testsummary -failures bin/failures.txt -- $(GO) test -json -race -count=1 -timeout 30m ./...

# The allocation budgets of the handler (alloc_budget_test.go), which
# unit's run skips: the race detector changes allocation counts.
budgets:
	@mkdir -p bin; echo "$(GO) test -count=1 -run '^TestAllocationBudget' ."; \
	$(GO) test -count=1 -run '^TestAllocationBudget' . || \
		{ echo "FAIL budgets TestAllocationBudget (allocations over a budget: alloc_budget_test.go)" >> bin/failures.txt; exit 1; }

$(XCADDY):
	$(GO) install github.com/caddyserver/xcaddy/cmd/xcaddy@v0.4.5

# Builds bin/caddy exactly as xcaddy.md tells users to.
build: $(XCADDY)
	$(XCADDY) build $(CADDY_VERSION) --output bin/caddy --with $(MODULE)@$(PSEUDO)=.

# Caddyfile.postgres.example reads its DSN from IDEMPOTENCY_POSTGRES_DSN.
check-build: build testservers
	bin/caddy list-modules > bin/modules.txt
	@for m in http.handlers.idempotency http.idempotency.storage.memory \
		http.idempotency.storage.redis http.idempotency.storage.postgres admin.api.idempotency idempotency; do \
		grep -qx "$$m" bin/modules.txt || { echo "bin/caddy lacks module $$m"; exit 1; }; \
	done
	@bin/caddy list-modules --versions | grep -qx "http.handlers.idempotency $(PSEUDO)" || \
		{ echo "bin/caddy does not carry the module version $(PSEUDO)"; exit 1; }
	@home=$$(mktemp -d); trap 'rm -rf "$$home"' EXIT; \
	HOME=$$home XDG_CONFIG_HOME=$$home/.config XDG_DATA_HOME=$$home/.local/share \
	$(WITH_SERVERS) sh -c 'for f in Caddyfile.example Caddyfile.redis.example Caddyfile.postgres.example; do \
		echo "caddy adapt --config $$f"; \
		bin/caddy adapt --config $$f > /dev/null || exit 1; \
		bin/caddy validate --config $$f 2> bin/validate.log || { cat bin/validate.log; exit 1; }; \
	done'

# Longer runs of the same fuzz targets, FUZZTIME each.
fuzz:
	@status=0; for spec in $(FUZZ_SHORT); do \
		pkg=$${spec%%:*}; rest=$${spec#*:}; target=$${rest%%:*}; \
		echo "$(GO) test $$pkg -run '^$$' -fuzz '^$$target\$$' -fuzztime $(FUZZTIME)"; \
		$(GO) test $$pkg -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) || status=1; \
	done; exit $$status

# Every fuzz target for about ten seconds' work each, as part of make test
# (their seed corpora also run as plain tests in unit). The budgets are
# execution counts, not durations: Go 1.26's fuzz coordinator can fail a
# run with "context deadline exceeded" when a duration budget ends while
# workers shut down (golang/go#75804), and CI must not fail by chance.
FUZZ_SHORT := ./fingerprint/:FuzzParseKey:200000x \
	./fingerprint/:FuzzCanonicalJSON:100000x \
	./fingerprint/:FuzzDiffers:50000x \
	./fingerprint/:FuzzPointerLookup:100000x \
	./fingerprint/:FuzzDecodeContent:20000x \
	./storage/:FuzzDecodeResponse:30000x \
	./storage/:FuzzAppendDecodeRoundTrip:150000x \
	./inprocess/:FuzzConfigSpace:5000x

fuzz-short:
	@mkdir -p bin; status=0; for spec in $(FUZZ_SHORT); do \
		pkg=$${spec%%:*}; rest=$${spec#*:}; target=$${rest%%:*}; count=$${rest#*:}; \
		echo "$(GO) test $$pkg -run '^$$' -fuzz '^$$target\$$' -fuzztime $$count"; \
		$(GO) test $$pkg -run '^$$' -fuzz "^$$target\$$" -fuzztime $$count || \
			{ status=1; echo "FAIL fuzz $$pkg $$target" >> bin/failures.txt; }; \
	done; exit $$status

BENCH_FLAGS ?=

bench: testservers
	$(WITH_SERVERS) $(GO) run ./bench $(BENCH_FLAGS)

SOAK_FLAGS ?=

# The randomized test's run after the soak: make test's budget (3 trials of
# 15 random steps and their share of the store's scenarios on each of the
# six stores and settings), on new seeds (make test's are fixed): about 3
# minutes on two cores. A failing trial is shrunk, which re-runs it and
# takes longer. -model.all puts every scenario in every trial (about 10).
MODEL_FLAGS ?= -model.base 0

# The soak starts its own servers (a persistent Redis it restarts), and
# runs the xcaddy-built binary.
soak: build testservers
	IDEMPOTENCY_CADDY_BIN=$(CURDIR)/bin/caddy $(GO) run ./soak $(SOAK_FLAGS)
	$(WITH_SERVERS) $(GO) test -count=1 -timeout 60m ./internal/testkit/model/ -run '^TestModel$$' $(MODEL_FLAGS)

# The failover soaks. PostgreSQL (soak/failover_postgres.go): private
# primaries and streaming standbys promoted under load through real Caddy
# instances, each mode's duplicate executions counted per promotion and
# named; about 2 minutes a mode of 10 promotions; flags in
# PG_FAILOVER_FLAGS (go run ./soak -h: -pg-modes, -pg-promotions, -pg-lag).
# Redis (soak/failover): Sentinel and Cluster, each with and without
# durability replicas 1, 20 failovers under load each (about 15 minutes);
# FAILOVER_FLAGS adds flags to every Redis run (go run ./soak/failover -h).
PG_FAILOVER_FLAGS ?= -pg-modes async,sync,remote_apply -v
# PG_FAILOVER_CUT_FLAGS: the synchronous standby cut off 3s before each
# kill (commits wait for it until the store's timeout cancels the wait).
PG_FAILOVER_CUT_FLAGS ?= -pg-modes sync,remote_apply -pg-promotions 3 -pg-workers 16 -pg-cut 3s -v
FAILOVER_FLAGS ?= -failovers 20 -lag 300ms

soak-failover: build
	IDEMPOTENCY_CADDY_BIN=$(CURDIR)/bin/caddy $(GO) run ./soak -failover postgres $(PG_FAILOVER_FLAGS)
	IDEMPOTENCY_CADDY_BIN=$(CURDIR)/bin/caddy $(GO) run ./soak -failover postgres $(PG_FAILOVER_CUT_FLAGS)
	$(GO) run ./soak/failover -topology sentinel -durability -lag 1s -failovers 3
	$(GO) run ./soak/failover -topology sentinel -durability $(FAILOVER_FLAGS)
	$(GO) run ./soak/failover -topology cluster -durability $(FAILOVER_FLAGS)
	$(GO) run ./soak/failover -topology sentinel $(FAILOVER_FLAGS)
	$(GO) run ./soak/failover -topology cluster $(FAILOVER_FLAGS)

MUTANTS_FLAGS ?=

# The planted bugs, each against the tiers of tests (internal/testkit/cmd/mutants).
mutants: testservers
	$(WITH_SERVERS) $(GO) run ./internal/testkit/cmd/mutants $(MUTANTS_FLAGS)
