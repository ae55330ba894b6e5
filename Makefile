# The developer and CI entry points. `make run` (the demo) and `make test` (the suite) are the README's commands.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CLUSTER_DIR ?= .local/cluster
RELEASE_DIR ?= out
export PYTHONUNBUFFERED := 1
# The image: its base (debian: a local Debian base, no registry needed; pinned: the Dockerfile's default,
# python:3.11-slim by digest; or any image) and its name.
IMAGE_BASE ?= debian
# The version is written once, in ipam_provider/version.py; the image tag follows it.
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' ipam_provider/version.py)
IMAGE ?= localhost/capi-ipam-provider-py:v$(VERSION)

.PHONY: venv binaries clusterctl capi-core prometheus netbox providers cluster-up cluster-down test test-fast lint run format generate release-manifests docker-build

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "Python 3.11+ is needed (set PYTHON=...)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,lint]'
	touch $@

binaries:
	hack/control-plane/build-binaries.sh

# clusterctl from the pinned Cluster API module (CAPI_VERSION in hack/versions.env), cached by version like the
# control-plane binaries; the tests marked `clusterctl` use it.
clusterctl:
	hack/clusterctl/build.sh

# Cluster API's core manager (the Cluster, topology and Runtime SDK controllers) from the same module and release,
# cached by version; the tests marked `capi_core` run it against the local control plane.
capi-core:
	hack/clusterctl/build.sh core-manager

# promtool and the Prometheus server from the pinned Prometheus module (PROMETHEUS_VERSION in hack/versions.env),
# cached by version; the tests marked `prometheus` (alert rules, dashboard) and the dashboard screenshot use them.
prometheus:
	hack/prometheus/build.sh

# The infrastructure providers' harnesses of the tests marked `providers` (hack/providers/<name>/: our wrapper Go
# modules over CAPV and CAPMOX), cached by provider version and wrapper content.
providers:
	hack/providers/build.sh capv >/dev/null
	hack/providers/build.sh capmox >/dev/null

# A real NetBox for the tests: Debian packages, a Python 3.12 venv and a migrated database, all cached by version.
netbox:
	hack/netbox/install.sh

# The Dockerfile, built with buildah (installed when missing) into buildah's local storage; see hack/image/.
docker-build:
	IMAGE_BASE=$(IMAGE_BASE) IMAGE=$(IMAGE) hack/image/build.sh

cluster-up: venv
	@$(BIN)/python -m tools.controlplane up --dir $(CLUSTER_DIR)

cluster-down: venv
	@$(BIN)/python -m tools.controlplane down --dir $(CLUSTER_DIR)

test: venv binaries clusterctl capi-core prometheus netbox providers
	$(BIN)/pytest $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check ipam_provider backends
	$(BIN)/mypy --strict ipam_provider backends tools tests benchmarks

# The Cluster API modules of every release in CAPI_COMPAT_VERSIONS (hack/versions.env), whose CRDs
# tests/system/test_capi_releases.py runs the contract flow against, and the cert-manager module of
# CERT_MANAGER_VERSION, whose CRDs the tests install before config/default, into the Go module cache (the tests also
# fetch them on first use).
.PHONY: capi-crds
capi-crds: venv
	$(BIN)/python -m tools.controlplane capi-crds

format: venv
	$(BIN)/ruff format ipam_provider backends
	$(BIN)/ruff check --fix .

run: venv
	hack/run-demo.sh

# The clusterctl release files: out/ipam-components.yaml (config/release) and out/metadata.yaml (docs/clusterctl.md).
release-manifests: venv binaries
	$(BIN)/python -m tools.release --out $(RELEASE_DIR)

generate: venv
	$(BIN)/python hack/gen_crds.py
	$(BIN)/python -m tools.prometheus_rules

# The fast lane: every test that needs no control plane, NetBox or Go toolchain, on every core (see docs/testing.md).
test-fast: venv
	$(BIN)/pytest -n auto -m "not apiserver and not netbox" --hypothesis-profile=fast $(PYTEST_ARGS)
