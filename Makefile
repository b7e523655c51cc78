# Makefile for the ingestor. `make test` is the test command (the README and
# .ci/run use it); `make run` shows the daemon and the example processor at
# work on the example config.

GO       ?= go
FUZZTIME ?= 30s
BIN      := bin

# Test servers are pinned and installed into a project-local tools
# directory, one folder per version, so a fresh machine runs every test and
# a version bump installs the new one beside the old.
TOOLS             := $(CURDIR)/.tools
VERSITYGW_VERSION := v1.8.0
VERSITYGW         := $(TOOLS)/versitygw-$(VERSITYGW_VERSION)/versitygw
# PYTHON3 runs the Python processor of PROTOCOL.md and the Python client in
# clients/python in the tests. Debian's
# python3-zmq installs for the system interpreter, which may not be the
# first python3 on PATH.
PYTHON3           ?= /usr/bin/python3

.PHONY: all deps test-deps build run test bench bench-baseline fmt vet fuzz image clean schema

all: build

# deps installs libzmq and pkg-config (github.com/pebbe/zmq4 finds libzmq
# through pkg-config) when they are missing, with sudo when not root.
deps:
	@if ! command -v pkg-config >/dev/null 2>&1 || ! pkg-config --exists libzmq; then \
		echo "make deps: installing libzmq3-dev pkg-config" >&2; \
		sudo=; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
		$$sudo apt-get update -qq && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libzmq3-dev pkg-config; \
	fi

# test-deps installs what the tests use beyond the build: python3-zmq for
# the Python processor example, python3-venv, python3-setuptools and
# python3-wheel for the Python client's tests (they pip install
# clients/python, offline, into a fresh virtual environment; ensurepip is
# in python3-venv, and this setuptools builds wheels with python3-wheel),
# promtool (Debian's prometheus package) for the alert rules in deploy/
# (the package also has a prometheus service, which Debian starts where
# systemd runs), chromium for the status page test (headless), etcd
# (Debian's etcd-server, for the cluster tests; its service, where
# systemd starts it, listens on 127.0.0.1:2379, which the tests leave
# alone: each starts its own etcd on free ports), the versitygw S3
# server, and Debian's fuse3 for the power-loss tests (their file system,
# internal/powercut, is ours, on go-fuse; fuse3 gives it fusermount3).
test-deps: deps
	@if ! $(PYTHON3) -c 'import zmq' >/dev/null 2>&1; then \
		echo "make test-deps: installing python3 python3-zmq" >&2; \
		sudo=; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
		$$sudo apt-get update -qq && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-zmq; \
	fi
	@if ! $(PYTHON3) -c 'import ensurepip, setuptools, wheel' >/dev/null 2>&1; then \
		echo "make test-deps: installing python3-venv python3-setuptools python3-wheel (the Python client's package tests)" >&2; \
		sudo=; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
		$$sudo apt-get update -qq && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv python3-setuptools python3-wheel; \
	fi
	@if ! command -v promtool >/dev/null 2>&1; then \
		echo "make test-deps: installing prometheus (for promtool)" >&2; \
		sudo=; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
		$$sudo apt-get update -qq && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; \
	fi
	@if ! command -v chromium >/dev/null 2>&1; then \
		echo "make test-deps: installing chromium (the status page test)" >&2; \
		sudo=; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
		$$sudo apt-get update -qq && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; \
	fi
	@if ! command -v etcd >/dev/null 2>&1; then \
		echo "make test-deps: installing etcd-server (the cluster tests)" >&2; \
		sudo=; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
		$$sudo apt-get update -qq && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server; \
	fi
	@if [ ! -x $(VERSITYGW) ]; then \
		echo "make test-deps: installing versitygw $(VERSITYGW_VERSION) into $(dir $(VERSITYGW))" >&2; \
		GOBIN=$(dir $(VERSITYGW)) $(GO) install github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION); \
	fi
	@if ! command -v fusermount3 >/dev/null 2>&1; then \
		echo "make test-deps: installing fuse3 (the power-loss tests' file system)" >&2; \
		sudo=; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
		$$sudo apt-get update -qq && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends fuse3; \
	fi

# REVISION is the commit `ingestor version`, /status and ingestor_build_info
# name (internal/buildinfo), passed in because builds here do not stamp it
# (GOFLAGS=-buildvcs=false on some machines).
REVISION := $(shell git rev-parse HEAD 2>/dev/null)

build: deps
	@mkdir -p $(BIN)
	$(GO) build -ldflags "-X github.com/ingestorhq/ingestor/internal/buildinfo.revision=$(REVISION)" -o $(BIN)/ingestor ./cmd/ingestor
	$(GO) build -o $(BIN)/processor ./cmd/processor
	$(GO) build -o $(BIN)/ingestor-bench ./cmd/ingestor-bench

# bench-baseline builds bin/ingestor and bin/processor of the commit
# BASELINE into $(BASELINE_DIR), for `ingestor-bench -mode compare`
# (make bench compares this build with it). It checks BASELINE out into a
# temporary detached worktree, removed afterwards, and builds it with the
# same toolchain and flags as `build`; the -X of the revision is ignored by
# commits older than internal/buildinfo. BASELINE_DIR/REVISION names the
# commit built, so a second run with the same commit does nothing.
BASELINE     ?= 86fa679
BASELINE_DIR := .bench/baseline-$(BASELINE)

bench-baseline: deps
	@set -e; \
	rev=$$(git rev-parse --verify --quiet '$(BASELINE)^{commit}') || { echo "make bench-baseline: $(BASELINE) is not a commit of this repository" >&2; exit 1; }; \
	out='$(CURDIR)/$(BASELINE_DIR)'; \
	if [ -x "$$out/ingestor" ] && [ -x "$$out/processor" ] && [ "$$(cat "$$out/REVISION" 2>/dev/null)" = "$$rev" ]; then \
		echo "make bench-baseline: $(BASELINE_DIR) already holds $$rev"; exit 0; \
	fi; \
	wt=$$(mktemp -d "$${TMPDIR:-/tmp}/ingestor-baseline-XXXXXX"); \
	trap 'git worktree remove --force "$$wt" 2>/dev/null || rm -rf "$$wt"' EXIT; \
	git worktree add --quiet --detach "$$wt" "$$rev"; \
	rm -f "$$out/REVISION"; mkdir -p "$$out"; \
	echo "make bench-baseline: building $$rev into $(BASELINE_DIR)"; \
	cd "$$wt"; \
	$(GO) build -ldflags "-X github.com/ingestorhq/ingestor/internal/buildinfo.revision=$$rev" -o "$$out/ingestor" ./cmd/ingestor; \
	$(GO) build -o "$$out/processor" ./cmd/processor; \
	echo "$$rev" > "$$out/REVISION"

# run starts the example processor in the background (it logs events/s and
# totals every 2s) and the daemon in the foreground on the example config.
# Ctrl-C stops the daemon gracefully. The processor runs in its own session
# (setsid), so Ctrl-C does not reach it and it keeps acking while the daemon
# drains; the trap stops it with SIGTERM once the daemon has exited, however
# that happens.
run: build
	@setsid $(BIN)/processor -log-every 2s & pid=$$!; \
	trap 'kill $$pid 2>/dev/null; wait $$pid' EXIT; \
	trap 'exit 130' INT TERM HUP; \
	$(BIN)/ingestor run -c ingestor.example.toml

# test runs every test verbosely into $(BIN)/test.log, prints the package
# results and the number of skipped tests (0 on a machine test-deps set up:
# no test skips for a missing dependency), and on failure the whole log.
# The status page test leaves its screenshot in $(BIN)/status-page.png.
test: test-deps
	@mkdir -p $(BIN)
	@echo "go test -race -count=1 -v ./... (full output in $(BIN)/test.log)"
	@VERSITYGW=$(VERSITYGW) PYTHON3=$(PYTHON3) INGESTOR_SCREENSHOT_DIR=$(CURDIR)/$(BIN) $(GO) test -race -count=1 -timeout 30m -v ./... > $(BIN)/test.log 2>&1; \
	status=$$?; \
	if [ $$status -ne 0 ]; then cat $(BIN)/test.log; fi; \
	grep -E '^(ok|FAIL|\?) ' $(BIN)/test.log; \
	skipped=$$(grep -c -- '--- SKIP' $(BIN)/test.log); \
	grep -- '--- SKIP' $(BIN)/test.log; \
	echo "make test: $$(grep -c -- '--- PASS' $(BIN)/test.log) passed, $$(grep -c -- '--- FAIL' $(BIN)/test.log) failed, $$skipped skipped"; \
	exit $$status

# bench runs the Go micro-benchmarks of the hot-path encoders, the
# queue's append-and-ack cost per event and its check at start
# (quick_check of 200,000 events), the ledger study (each ledger schema
# variant of docs/ledger-design.md on 2M events, twice, interleaved, and
# the cost of migrating 500,000 events), the processor client's CPU per
# event on real sockets, then the
# whole-pipeline bench: throughput with defaults, the drain of a backlog
# queued while no processor ran, and webhook ingestion (64 keep-alive
# clients, one event per request, each answered once durable, then
# alternating with the least a durable webhook server can do, 3 rounds,
# for their ratio, best and per round: -mode webhook-ceiling), push
# overload (200, then 1,000 devices on a ws_ingress source beside webhook
# senders, failing when goodput drops below 80% of the unloaded commit
# rate in a 5-second window, a device does not finish or a sender
# starves); last the real path through the built binaries, each in its
# own process: a firehose upstream polled by bin/ingestor, acked by
# bin/processor (see docs/performance.md), with OpenTelemetry tracing at
# 1% and 100% sampling between two runs with it off (its cost, compared in
# the same sitting), then this build against the baseline commit BASELINE
# (built by bench-baseline; -mode compare: 3 runs of each, interleaved,
# and the ratios of their medians), the memory formula of
# docs/performance.md against the real path's peak RSS at inflight_batches
# 2, 4 and 8 (-mode memory), then the same on a cluster
# of 1, 2 and 3 members on etcd (installed by test-deps), and cluster mode
# at scale (20 in-process members sharing 10,000 stub sources on one etcd
# for 10 minutes, then one killed, failing when etcd's writes or size, the
# spread or the time to re-own miss their targets); and the 20-minute
# soak (every kind of source at once with retentions of a minute, failing
# when a store, the RSS, open files or goroutines grow or an event is
# lost; its chart in $(BIN)/soak.svg).
bench: build test-deps bench-baseline
	$(GO) test -run '^$$' -bench 'Extract|EncodeFrame|DecodeFrame$$|Parse1KiB' -benchmem -cpu 1 ./internal/jsonscan/ ./internal/wire/ ./sources/
	$(GO) test -run '^$$' -bench 'AckAfterMaximal' -benchtime 20x ./internal/delivery/
	$(GO) test -run '^$$' -bench 'AppendAndAck' -benchtime 1000x ./internal/queue/
	$(GO) test -run '^$$' -bench 'QuickCheck' -benchtime 5x ./internal/queue/
	LEDGER_REPEAT=2 $(GO) test -run '^$$' -bench '^BenchmarkLedgerStudy' -benchtime 1x -count=1 -v -timeout 60m ./internal/queue/
	$(GO) test -run '^$$' -bench 'Run$$' -benchmem ./processor/
	$(BIN)/ingestor-bench
	$(BIN)/ingestor-bench -mode processor-down -events 400000
	$(BIN)/ingestor-bench -mode rehydrate
	$(BIN)/ingestor-bench -exactly-once -events 300000
	$(BIN)/ingestor-bench -mode webhook
	$(BIN)/ingestor-bench -mode webhook -signature github
	$(BIN)/ingestor-bench -mode webhook-ceiling -runs 3
	$(BIN)/ingestor-bench -mode overload -devices 200
	$(BIN)/ingestor-bench -mode overload -devices 1000
	$(BIN)/ingestor-bench -mode real
	$(BIN)/ingestor-bench -mode real -events 1000000 -trace-ratio 0.01
	$(BIN)/ingestor-bench -mode real -events 1000000 -trace-ratio 1
	$(BIN)/ingestor-bench -mode real -events 1000000
	$(BIN)/ingestor-bench -mode real -events 2000000 -dedupe-window 6s
	$(BIN)/ingestor-bench -mode compare -baseline $(BASELINE_DIR) -events 1000000 -runs 3
	$(BIN)/ingestor-bench -mode memory -events 500000
	$(BIN)/ingestor-bench -mode cluster
	$(BIN)/ingestor-bench -mode cluster-scale
	$(BIN)/ingestor-bench -mode soak -chart $(BIN)/soak.svg
	INGESTOR_OAUTH2_RUN=5m INGESTOR_OAUTH2_TTL=30s $(GO) test -run '^TestOAuth2TokensExpireMidRun$$' -count=1 -v ./cmd/ingestor/

# fmt fails, listing the files, when gofmt would change anything.
fmt:
	@files="$$(gofmt -l .)"; \
	if [ -n "$$files" ]; then \
		echo "gofmt would change these files (run gofmt -w on them):" >&2; \
		echo "$$files" >&2; \
		exit 1; \
	fi

vet: deps
	$(GO) vet ./...

# schema regenerates config/ingestor.schema.json, the JSON Schema of the
# daemon's config, from the config types and docs/configuration.md;
# `config` TestSchemaIsCurrent fails until it is rerun after a change.
schema:
	$(GO) generate ./config

# fuzz runs every fuzz target for FUZZTIME each; go test -list finds them,
# printing each package's targets before its "ok" line.
fuzz: deps
	@list="$$($(GO) test -list '^Fuzz' ./...)" || { echo "$$list" >&2; exit 1; }; \
	echo "$$list" | \
	awk '/^Fuzz/ { t[n++] = $$1; next } /^ok/ { for (i = 0; i < n; i++) print $$2, t[i]; n = 0 }' | \
	while read -r pkg target; do \
		echo "fuzz $$pkg $$target for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) "$$pkg" </dev/null || exit 1; \
	done

# image builds the container image of deploy/Dockerfile as $(IMAGE), from
# the repository root (see deploy/README.md). It needs Docker, and network
# access for the golang and debian base images; without Docker it says so
# and fails.
IMAGE ?= ingestor:dev
image:
	@if ! command -v docker >/dev/null 2>&1; then \
		echo "make image: docker is not installed (or not on PATH); install Docker to build $(IMAGE) from deploy/Dockerfile" >&2; \
		exit 1; \
	fi
	@if ! docker info >/dev/null 2>&1; then \
		echo "make image: docker cannot reach its daemon (not running, or no permission on its socket)" >&2; \
		exit 1; \
	fi
	docker build -f deploy/Dockerfile --build-arg VCS_REVISION="$$(git rev-parse HEAD 2>/dev/null)" -t $(IMAGE) .

clean:
	rm -rf $(BIN) $(TOOLS) .bench
