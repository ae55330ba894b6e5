# The developer and CI entry points. `make run` (the demo) and `make test` (the suite) are the README's commands.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CLUSTER_DIR ?= .local/cluster
export PYTHONUNBUFFERED := 1

.PHONY: venv binaries netbox cluster-up cluster-down test lint run format generate

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "Python 3.11+ is needed (set PYTHON=...)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,lint]'
	touch $@

binaries:
	hack/control-plane/build-binaries.sh

# A real NetBox for the tests: Debian packages, a Python 3.12 venv and a migrated database, all cached by version.
netbox:
	hack/netbox/install.sh

cluster-up: venv
	@$(BIN)/python -m tools.controlplane up --dir $(CLUSTER_DIR)

cluster-down: venv
	@$(BIN)/python -m tools.controlplane down --dir $(CLUSTER_DIR)

test: venv binaries netbox
	$(BIN)/pytest $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check ipam_provider backends
	$(BIN)/mypy --strict ipam_provider backends tools tests

# The Cluster API modules of every release in CAPI_COMPAT_VERSIONS (hack/versions.env), whose CRDs tests/compat runs
# the contract flow against, into the Go module cache (the tests also fetch them on first use).
.PHONY: capi-crds
capi-crds: venv
	$(BIN)/python -m tools.controlplane capi-crds

format: venv
	$(BIN)/ruff format ipam_provider backends
	$(BIN)/ruff check --fix .

run: venv
	hack/run-demo.sh

generate: venv
	$(BIN)/python hack/gen_crds.py
	$(BIN)/python hack/gen_netbox_crds.py
	$(BIN)/python hack/gen_infoblox_crds.py
