# flashcoupon — the project's interface. `make help` lists the targets.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# uv is installed with pip when the machine lacks it; `python3 -m uv` works either way.
UV := $(shell command -v uv 2>/dev/null || echo "python3 -m uv")
RUN := $(UV) run --frozen
STACK := scripts/stack.sh
# Services, tools and tests started from here may default their connection settings to the
# local stack (scripts/stack.sh); in production each must be set (docs/local-stack.md).
export FLASHCOUPON_ENV ?= local

.PHONY: help install tools stack-up stack-status stack-down stack-reset migrate test test-unit lint fmt demo \
        bench bench-issuer bench-persister bench-gateway

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

install: ## install what the stack and services need on a fresh machine (apt, uv, Python deps, Kafka jars)
	@start=$$(date +%s); \
	if ! command -v uv >/dev/null && ! python3 -m uv --version >/dev/null 2>&1; then \
	  echo "[install] pip install uv"; python3 -m pip install -q uv; fi; \
	$(UV) sync --frozen --quiet; \
	$(STACK) install; \
	echo "[install] done in $$(( $$(date +%s) - start ))s"

# helm serves the deployment checks, jaeger the trace test: `make demo` waits for neither.
tools: ## build helm and jaeger (the trace backend) from the Go module proxy into .cache/bin
	scripts/tools.sh install helm jaeger

# Jaeger's cold build takes ~10 minutes on 2 cores: `make test` starts it first, in the
# background, so it overlaps install, stack-up and the unit and integration tiers; the trace
# test waits for it on a lock (scripts/tools.sh) when it is not done yet.
.PHONY: tools-background helm
helm: ## build only helm (the deployment checks) into .cache/bin
	scripts/tools.sh install helm

.PHONY: tools-background
tools-background: ## build jaeger in the background (what `make test` starts; log .stack/jaeger-build.log)
	@mkdir -p .stack
	nice -n 10 scripts/tools.sh install jaeger > .stack/jaeger-build.log 2>&1 &

stack-up: install ## start Redis Cluster, Kafka (KRaft) and MariaDB, wait for readiness, migrate; TRACING=1 also Jaeger
	$(STACK) up
	$(RUN) flashcoupon-migrate upgrade
	if [ "$(TRACING)" = 1 ]; then scripts/tracing.sh up; fi

.PHONY: tracing-up tracing-down tracing-status bench-tracing
tracing-up: ## start the local trace backend (Jaeger v2, in memory; UI :16686, OTLP :14318)
	scripts/tracing.sh up

tracing-down: ## stop the local Jaeger
	scripts/tracing.sh down

tracing-status: ## where the local Jaeger listens; exits non-zero when it is down
	scripts/tracing.sh status

stack-status: ## report what runs where; exits non-zero when anything is unhealthy
	$(STACK) status

stack-down: ## stop the processes the stack started
	$(STACK) down

stack-reset: ## stop the stack and wipe its data
	$(STACK) reset

migrate: ## run the MySQL schema migrations
	$(RUN) flashcoupon-migrate upgrade

.PHONY: audit
audit: ## compare Redis issued records with MySQL rows for every event (docs/auditor.md)
	$(RUN) flashcoupon-auditor --all

lint: ## ruff lint and format check, import layering contracts, mypy (strict)
	$(RUN) ruff check .
	$(RUN) ruff format --check .
	$(RUN) lint-imports
	$(RUN) mypy

fmt: ## ruff format and autofix
	$(RUN) ruff format .
	$(RUN) ruff check --fix .

test-unit: install ## only the tests that need no server
	$(RUN) pytest tests/unit

# The k8s tier runs last and needs the Kubernetes components (~15 min to compile on a cold
# 2-core machine): their build starts first, in the background at the lowest priority, so it
# overlaps the stack, lint and the other tiers; the tier's own `scripts/k8s.sh up` waits on the
# build's lock rather than building twice. Its log: .stack/k8s-build.log.
test: tools-background k8s-build-background stack-up helm lint ## everything: installs, the stack, lint, every test tier (tests/k8s last)
	@start=$$(date +%s); \
	$(RUN) pytest; \
	echo "[test] pytest took $$(( $$(date +%s) - start ))s"

demo: stack-up ## the main job: a coupon drop on the local stack with an invariant report
	$(RUN) python -m flashcoupon_loadtest.demo

bench-issuer: stack-up ## issuer vs hello-world vs naive EVALSHA, ratios in loadtest/results/
	$(RUN) python -m flashcoupon_loadtest.bench_issuer

bench-persister: stack-up ## persister rows/s vs plain executemany, in loadtest/results/
	$(RUN) python -m flashcoupon_loadtest.bench_persister

bench-gateway: stack-up ## gateway vs issuer direct vs hello-world (forwarded, sold-out, unbatched), in loadtest/results/
	$(RUN) python -m flashcoupon_loadtest.bench_gateway

.PHONY: bench-servers bench-revisions
bench-servers: stack-up ## uvicorn vs granian serving hello-world, the issuer and the gateway, same run
	$(RUN) python -m flashcoupon_loadtest.bench_servers

# BEFORE is checked out once under .cache/bench-revisions/<sha> with its own venv (docs/loadtest.md).
bench-revisions: stack-up ## bench-gateway's paths for BEFORE=<git rev> and this tree, interleaved: after/before
	@test -n "$(BEFORE)" || { echo "usage: make bench-revisions BEFORE=<git rev>" >&2; exit 2; }
	$(RUN) python -m flashcoupon_loadtest.bench_revisions --before "$(BEFORE)"

.PHONY: profile
# py-spy samples each path's serving process; docs/loadtest.md, "make profile".
profile: stack-up ## where the CPU per request goes (server, application, libraries) for hello-world, issuer, gateway
	$(RUN) python -m flashcoupon_loadtest.cpu_profile $(if $(PATHS),--paths $(PATHS)) $(if $(SAMPLE),--sample $(SAMPLE))

.PHONY: bench-relay bench-wallet bench-master
bench-relay: stack-up ## outbox relay records/s into Kafka (50k entries) vs naive send_and_wait
	$(RUN) python -m flashcoupon_loadtest.bench_relay

bench-wallet: stack-up ## wallet redemptions/s vs its own /healthz, one contended code
	$(RUN) python -m flashcoupon_loadtest.bench_wallet

bench-master: stack-up ## issue.lua's CPU per issue on the event's Redis master, and what each part of it costs
	$(RUN) python -m flashcoupon_loadtest.bench_master

bench-tracing: stack-up ## issuer req/s with tracing off vs on (to Jaeger) vs hello-world
	scripts/tracing.sh up
	$(RUN) python -m flashcoupon_loadtest.bench_tracing

bench: stack-up ## every benchmark plus the end-to-end burst, one table
	$(RUN) python -m flashcoupon_loadtest.bench_all

.PHONY: crd-check
crd-check: ## validate the CouponEvent CRD and examples with the API server's code (needs Go)
	k8s/tools/crdcheck.sh

# ---------------------------------------------------------------- deployment (docs/deploy.md)

HELM := .cache/bin/helm
CHART := charts/flashcoupon
KUBE_VERSION := 1.31.0

.PHONY: chart-check sync-crd
chart-check: ## helm lint + render the chart for Kubernetes 1.31 (default and ci/*-values.yaml); validate every object
	scripts/tools.sh install
	@for values in $(CHART)/values.yaml $(CHART)/ci/*-values.yaml; do \
	  echo "[chart-check] $$values"; \
	  $(HELM) lint --strict --kube-version $(KUBE_VERSION) -f $$values $(CHART); \
	  $(HELM) template chart-check $(CHART) --kube-version $(KUBE_VERSION) -f $$values \
	    > .cache/chart-check.yaml; \
	  $(RUN) kubernetes-validate --strict --quiet -k $(KUBE_VERSION) .cache/chart-check.yaml; \
	done
	$(RUN) pytest -q -p no:cacheprovider tests/unit/test_deploy_layout.py tests/integration/test_chart.py

sync-crd: ## copy the canonical CRD (k8s/crd/) into the chart's crds/
	cp k8s/crd/couponevents.flashcoupon.io.yaml $(CHART)/crds/couponevents.flashcoupon.io.yaml

# ---------------------------------------------------------------- observability (docs/metrics.md)

.PHONY: observe-check
observe-check: stack-up ## a private Prometheus scrapes a local run + burst; every dashboard query and rule returns data
	$(RUN) python -m flashcoupon_loadtest.observe

# ---------------------------------------------------------------- chaos (docs/reliability.md)

.PHONY: chaos
chaos: install ## fault rows on a private stack, one table + loadtest/results/chaos.json (FAULT=row[,row])
	$(RUN) python -m flashcoupon_loadtest.chaos $(if $(FAULT),--fault $(FAULT))

.PHONY: chaos-k8s
chaos-k8s: install ## pod-level fault rows on the dev release (make k8s-deploy first), table + loadtest/results/chaos-k8s.json (FAULT=row[,row])
	$(RUN) python -m flashcoupon_loadtest.chaos.k8s_run $(if $(FAULT),--fault $(FAULT))

# ---------------------------------------------------------------- dev Kubernetes (docs/deploy.md)

.PHONY: k8s-up k8s-status k8s-down k8s-reset k8s-images k8s-deploy k8s-demo k8s-test k8s-build-background
k8s-build-background: ## compile the Kubernetes components in the background (what `make test` starts)
	@mkdir -p .stack
	nice -n 19 scripts/k8s.sh build > .stack/k8s-build.log 2>&1 &

k8s-up: ## a single-node Kubernetes 1.31 from real components (etcd, control plane, containerd, kubelet)
	scripts/k8s.sh up

k8s-status: ## the dev cluster's processes, node and pods; exits non-zero when anything is down
	scripts/k8s.sh status

k8s-down: ## stop the dev cluster (pods included) and its stores; state stays under .stack/k8s
	scripts/k8s-deploy.sh stores-down
	scripts/k8s.sh down

k8s-reset: ## stop the dev cluster and its stores, wipe their state (certificates, etcd, containerd, data)
	scripts/k8s-deploy.sh stores-down
	scripts/k8s.sh reset

k8s-images: ## build the four images and the dev Prometheus image with podman (base from debootstrap), import them into the cluster
	scripts/k8s-images.sh build

k8s-deploy: install ## the chart with helm upgrade --install --wait, against a stack pods can reach
	scripts/k8s-deploy.sh up

k8s-demo: ## a CouponEvent through its phases and a shopper burst through the gateway Service
	$(RUN) python k8s/dev/demo.py

k8s-test: ## the tests/k8s tier (brings the cluster, images and release up as needed)
	$(RUN) pytest tests/k8s -p no:cacheprovider
