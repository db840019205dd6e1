# Two commands matter: `make test` (whole setup + static checks + member check + suite) and
# `make demo`. `make test-fast` is the developer loop: lint and the suite without processes.
# Every install step lives here so a fresh machine with only python3/pip can run them.
SHELL := /bin/bash
UV_VERSION := 0.13.9
export UV_PYTHON_DOWNLOADS := never
export UV_PYTHON_PREFERENCE := only-system
UV := python3 -m uv
RUN := $(UV) run --no-sync

.PHONY: test test-fast members lint setup tools sync demo soak bench bench-system format fuzz \
	dev-certs images push-images

setup: tools sync

tools:
	@if [ "$$($(UV) --version 2>/dev/null | cut -d' ' -f2)" != "$(UV_VERSION)" ]; then \
		python3 -m pip install --quiet "uv==$(UV_VERSION)"; fi
	@if ! command -v kubectl >/dev/null 2>&1; then \
		(apt-get update -qq && apt-get install -y -qq kubectl) >/dev/null 2>&1 || \
		echo "kubectl could not be installed from Debian; kubectl tests will fail"; fi
	@if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then \
		(apt-get update -qq && apt-get install -y -qq prometheus) >/dev/null 2>&1 || \
		echo "prometheus (server, promtool) could not be installed from Debian; monitoring tests will fail"; fi

sync:
	$(UV) sync --locked --all-packages

# import-linter judges only the modules its contracts name: .ci/check-layers fails on a module of
# a service or of rgpu_placement that is in no layer of its package's contract.
lint: setup
	$(RUN) ruff check .
	$(RUN) ruff format --check .
	$(RUN) mypy libs/*/src services/*/src cli/src sim/src bench
	$(RUN) lint-imports
	.ci/check-layers

# Each member synced alone into its own environment and imported whole: an import its
# pyproject.toml does not declare fails here, not in the image built for that service.
members: tools
	.ci/check-members

test: lint members
	$(RUN) pytest -q

# No OS processes, no whole stack: ruff and the in-process suite, for the edit-test loop;
# property tests run a tenth of their examples (the full counts run in `make test`), test
# files are spread over one worker per core, and compiled test modules are cached.
# The slowest tests are listed so the loop stays under 90 s as tests are added.
test-fast: sync
	$(RUN) ruff check .
	$(RUN) ruff format --check .
	RGPU_HYPOTHESIS_PROFILE=quick RGPU_FUZZ_PROFILE=quick PYTHONDONTWRITEBYTECODE= \
		$(RUN) pytest -q -m "not e2e and not process" -n auto --dist loadfile --durations=10

demo: setup
	$(RUN) rgpu demo

# The proving ground at length: 5,000 pods under the standard faults, two replicas of each
# service; at least 28 minutes (its stream arrives over 1,653 s, paced to the fleet; the header
# prints the arithmetic). `rgpu soak --help` for a shorter or different run.
soak: setup
	$(RUN) rgpu soak --pods 5000

# Speed and memory targets live here, not in timed tests: each script prints its figures
# (medians) beside the target. Full-size runs take several minutes on 2 cores.
bench: setup
	@for script in bench/bench_*.py; do echo "== $$script"; $(RUN) python $$script || exit 1; done

# The fuzz suite runs in `make test` derandomized and bounded (about a minute); this runs it
# randomized with many more examples per endpoint (RGPU_FUZZ_PROFILE, tests/fuzz/conftest.py).
fuzz: setup
	RGPU_FUZZ_PROFILE=long $(RUN) pytest -q tests/fuzz

# The whole system at 1,000 servers x 8 cards, 5,000 client nodes, 100,000 background pods
# (about 15 minutes on 2 cores; smaller with ARGS="--servers 100 --clients 500 ...").
bench-system: setup
	$(RUN) python bench/bench_system.py $(ARGS)

format: setup
	$(RUN) ruff check --fix .
	$(RUN) ruff format .

# The dev overlay's webhook certificate (k8s/README.md); kustomize names this directory in its
# error until it exists.
dev-certs: setup
	$(RUN) python -m rgpu_kubesim certs --out k8s/overlays/dev/generated-by-make-dev-certs \
		--dns rgpu-extender.rgpu-system.svc

# One image per service from docker/Dockerfile, tagged $(REGISTRY)/rgpu-<service>:$(TAG);
# push-images pushes them. Needs a Docker (BuildKit) engine; pin the tag in your overlay's
# images: list afterwards (k8s/README.md).
REGISTRY ?= ghcr.io/rgpu
TAG ?= dev
SERVICES := discovery allocator extender metrics

images:
	@for svc in $(SERVICES); do \
		echo "docker build -f docker/Dockerfile --build-arg SERVICE=$$svc -t $(REGISTRY)/rgpu-$$svc:$(TAG) ."; \
		docker build -f docker/Dockerfile --build-arg SERVICE=$$svc -t $(REGISTRY)/rgpu-$$svc:$(TAG) . || exit 1; \
	done

push-images: images
	@for svc in $(SERVICES); do \
		echo "docker push $(REGISTRY)/rgpu-$$svc:$(TAG)"; \
		docker push $(REGISTRY)/rgpu-$$svc:$(TAG) || exit 1; \
	done
