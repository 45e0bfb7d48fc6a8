# maxtext-compat: `make demo` (set up + main job) and `make test` (set up + every test).
# Environments live in .envs/ (gitignored) and are rebuilt from uv's cache in seconds.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
UV_VERSION := 0.13.9
TOOLS := .tools
DEV := .envs/dev
MC := $(DEV)/bin/maxtext-compat

UV := $(shell command -v uv 2>/dev/null || echo $(TOOLS)/bin/uv)

# Registries behind a TLS-inspecting proxy: let uv (and the builds it runs) trust the system store.
export UV_SYSTEM_CERTS ?= 1
ifneq ($(wildcard /etc/ssl/certs/ca-certificates.crt),)
export SSL_CERT_FILE ?= /etc/ssl/certs/ca-certificates.crt
export REQUESTS_CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt
endif

# Compiled modules outside the tree, where env_runner.bytecode_cache_env puts the test runs' (make demo does not
# go through it): a machine that sets PYTHONDONTWRITEBYTECODE (CI does) would otherwise compile vllm and torch
# from source in every process.
unexport PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX ?= $(or $(MAXTEXT_COMPAT_COMPILE_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/maxtext-compat)/pycache

.PHONY: help setup envs demo test test-extended unit lint bench docs chromium clean tpu-wheels test-accel bench-accel test-tpu bench-tpu

help:
	@echo "make demo   - set up, then run the main job"
	@echo "make test   - set up, then run every test in every environment (writes build/compat-report.md)"
	@echo "make bench  - benchmarks (writes build/bench.md)"
	@echo "make docs   - the documentation site, strict (writes build/site/; open build/site/index.html)"
	@echo "make test-extended - beyond make test: real-model serving on 0.2.4, TP=3, 4 requests; the 32-client load run; full-depth churn and fuzz"
	@echo "make tpu-wheels - download the accelerator tier's wheels the TPU machine lacks into build/tpu-parts/ (tools/tpu/README.md)"
	@echo "make test-accel - install the accelerator tier and run its tests on the TPU or GPU found (MAXTEXT_COMPAT_ACCEL=dry|dry-gpu: on a CPU; alias test-tpu)"
	@echo "make bench-accel - its figures into docs/accelerators.md (MAXTEXT_COMPAT_ACCEL=dry|dry-gpu: a labelled CPU rehearsal in build/tpu; alias bench-tpu)"

$(TOOLS)/bin/uv:
	python3 -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet uv==$(UV_VERSION)

$(DEV)/.ok: pyproject.toml | $(UV)
	$(UV) venv --quiet --allow-existing --python "$$(tools/find-python.sh)" $(DEV)
	$(UV) pip install --quiet --python $(DEV)/bin/python -e '.[dev]'
	touch $@

setup: $(DEV)/.ok

envs: setup
	PATH="$(dir $(UV)):$$PATH" $(MC) envs build

lint: setup
	$(DEV)/bin/ruff check src tests benchmarks tools
	$(DEV)/bin/ruff format --check src tests benchmarks tools
	$(DEV)/bin/mypy

# The demo in every MaxText environment that runs its test: only those environments are built (each just before
# its demo), as many at once as cores and memory allow, then a table of what each proved (docs/getting-started.md).
demo: setup
	@PATH="$(dir $(UV)):$$PATH" $(MC) demo --all

# The site is built first (a broken link, a missing page or a failing generator fails it in seconds); Chromium
# opens the compat report page in tests/unit/test_report_page.py and photographs it at the end of the matrix.
# The matrix builds each environment as it starts it (one build at a time, beside the environments already
# running; a test that needs a partner environment first builds it then), so the builds overlap the tests.
test: setup lint docs chromium
	PATH="$(dir $(UV)):$$PATH" $(MC) matrix --jobs 3

# MkDocs + Material, --strict: every warning (a link to a missing page or anchor, a page left out of the nav) fails.
# tools/mkdocs_hooks.py generates the reference pages (CLI, matrix format, conventions, API, catalog, report) at build
# time. NO_MKDOCS_2_WARNING: Material's end-of-life notice (docs/about.md says what it means for us). No --quiet:
# it hides the warnings from --strict as well (a broken link then passes).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(DEV)/bin/mkdocs build --strict --config-file mkdocs.yml --site-dir build/site
	@echo "site: build/site/index.html"

# Debian's Chromium for the report page's browser test; nothing to do where it is installed (CI runs as root).
chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# Tests marked `extended` (deselected in make test: what another environment of make test already proves, the second
# server or model of a kind, the kernel's configuration sweep between its generations' ends), then the patching
# churn and the matrix fuzz at full depth. The kernel-only environments of the first line hold the configuration sweep
# outside the first and last form of each kernel generation (tests/helpers/kernel_envs.py SWEEP_ENVS); the second line
# runs whole the environments marked `extended: true` in tests/environments.yaml (make test leaves them out).
DEEP := MAXTEXT_COMPAT_RELIABILITY_CYCLES=10000 MAXTEXT_COMPAT_FUZZ_EXAMPLES=10000
test-extended: envs
	MAXTEXT_COMPAT_EXTENDED=1 PATH="$(dir $(UV)):$$PATH" $(MC) matrix --no-build \
	  maxtext-0.2.5 maxtext-0.2.4 maxtext-0.2.3 maxtext-0.2.2 maxtext-0.2.1 maxtext-0.2.0 maxtext-0.1.0 \
	  maxtext-0.1.0-jax011 unit tpu-inference-0.12.0 --pytest-args -m extended
	MAXTEXT_COMPAT_EXTENDED=1 PATH="$(dir $(UV)):$$PATH" $(MC) matrix --no-build --jobs 3 \
	  tpu-inference-0.13.3 tpu-inference-0.20.0 tpu-inference-0.21.0 tpu-inference-0.22.1 tpu-inference-0.23.0 \
	  tpu-inference-0.26.0 tpu-inference-0.27.0 tpu-inference-0.29.0 tpu-inference-0.30.0
	$(DEEP) PATH="$(dir $(UV)):$$PATH" $(MC) matrix --no-build --jobs 3 unit maxtext-0.2.5 maxtext-0.2.4 \
	  maxtext-0.2.3 maxtext-0.2.2 maxtext-0.1.0 maxtext-0.1.0-jax011 \
	  --pytest-args -k "fuzzed_documents or real_profile_churns"

# The accelerator tier (docs/accelerators.md; without PyPI: tools/tpu/README.md): no environment of the matrix, only the interpreter the
# machine has (with its jax) plus tools/tpu/*.txt installed into build/tpu-site; make test deselects the tests
# marked tpu. The TPU names are aliases.
tpu-wheels:
	tools/tpu/wheels.sh

test-accel test-tpu:
	tools/tpu/run.sh

bench-accel bench-tpu:
	tools/tpu/bench.sh

bench: envs
	$(DEV)/bin/python benchmarks/run_all.py --out build

clean:
	rm -rf .envs $(TOOLS) build
