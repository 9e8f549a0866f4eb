# Everyday targets:
#   make run     Caddy with this module on Caddyfile.example (memory store)
#   make test    every test, against real Redis and PostgreSQL (started if needed),
#                including the end-to-end suite (e2e/: real Caddy processes), a short
#                run of every fuzz target, and the documented xcaddy build
#   make bench   the load benchmark against plain Caddy (see docs/benchmarks.md);
#                BENCH_FLAGS="-write docs/benchmarks.md" records the result
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
# about this (unpublished) module; see xcaddy.md.
PSEUDO       := v0.0.0-00010101000000-000000000000
FUZZTIME     ?= 1m

.PHONY: run test services unit build check-build fuzz fuzz-short bench

run:
	$(GO) run ./cmd/caddy run --config Caddyfile.example

test: services unit fuzz-short check-build

services:
	bash scripts/services.sh

# The end-to-end tests run the xcaddy-built binary, so the documented build
# is what they prove.
unit: build
	IDEMPOTENCY_CADDY_BIN=$(CURDIR)/bin/caddy $(GO) test -race -count=1 -timeout 30m ./...

$(XCADDY):
	$(GO) install github.com/caddyserver/xcaddy/cmd/xcaddy@v0.4.5

# Builds bin/caddy exactly as xcaddy.md tells users to.
build: $(XCADDY)
	$(XCADDY) build $(CADDY_VERSION) --output bin/caddy --with $(MODULE)@$(PSEUDO)=.

check-build: build
	bin/caddy list-modules > bin/modules.txt
	@for m in http.handlers.idempotency http.idempotency.storage.memory \
		http.idempotency.storage.redis http.idempotency.storage.postgres admin.api.idempotency; do \
		grep -qx "$$m" bin/modules.txt || { echo "bin/caddy lacks module $$m"; exit 1; }; \
	done
	@export IDEMPOTENCY_POSTGRES_DSN=$${IDEMPOTENCY_POSTGRES_DSN:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}; \
	for f in Caddyfile.example Caddyfile.redis.example Caddyfile.postgres.example; do \
		echo "caddy adapt --config $$f"; \
		bin/caddy adapt --config $$f > /dev/null || exit 1; \
		bin/caddy validate --config $$f 2> bin/validate.log || { cat bin/validate.log; exit 1; }; \
	done

fuzz:
	$(GO) test ./fingerprint/ -run '^$$' -fuzz '^FuzzParseKey$$' -fuzztime $(FUZZTIME)
	$(GO) test ./fingerprint/ -run '^$$' -fuzz '^FuzzCanonicalJSON$$' -fuzztime $(FUZZTIME)
	$(GO) test ./storage/ -run '^$$' -fuzz '^FuzzDecodeResponse$$' -fuzztime $(FUZZTIME)
	$(GO) test ./storage/ -run '^$$' -fuzz '^FuzzAppendDecodeRoundTrip$$' -fuzztime $(FUZZTIME)

# Every fuzz target for about ten seconds' work each, as part of make test
# (their seed corpora also run as plain tests in unit). The budgets are
# execution counts, not durations: Go 1.26's fuzz coordinator can fail a
# run with "context deadline exceeded" when a duration budget ends while
# workers shut down (golang/go#75804), and CI must not fail by chance.
fuzz-short:
	$(GO) test ./fingerprint/ -run '^$$' -fuzz '^FuzzParseKey$$' -fuzztime 200000x
	$(GO) test ./fingerprint/ -run '^$$' -fuzz '^FuzzCanonicalJSON$$' -fuzztime 100000x
	$(GO) test ./storage/ -run '^$$' -fuzz '^FuzzDecodeResponse$$' -fuzztime 30000x
	$(GO) test ./storage/ -run '^$$' -fuzz '^FuzzAppendDecodeRoundTrip$$' -fuzztime 150000x

BENCH_FLAGS ?=

bench: services
	$(GO) run ./bench $(BENCH_FLAGS)
