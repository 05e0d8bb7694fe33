# Two commands do all set-up on a fresh Debian 12 machine: `make train` and `make test`.
# Both install only what is missing (apt packages, then Python packages into .venv) and are idempotent.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
APT_PACKAGES := libvulkan1 mesa-vulkan-drivers spirv-tools spirv-headers vulkan-tools vulkan-validationlayers
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=
CONFIG ?= configs/shakespeare.toml
RUN_DIR ?= runs/shakespeare

.PHONY: train test system info lint clean

# Prepare the dataset, train the default config (resuming if a run exists), sample, and plot.
train: $(VENV)/.installed
	$(PY) -m helios info
	$(PY) -m trainer prepare $(CONFIG)
	$(PY) -m trainer run $(CONFIG)
	$(PY) -m trainer sample --run $(RUN_DIR) --prompt "ROMEO:" --tokens 120
	$(PY) -m telemetry plot $(RUN_DIR) -o $(RUN_DIR)/plot.png
	$(PY) -m telemetry summary $(RUN_DIR)

test: $(VENV)/.installed
	$(PY) -m pytest $(PYTEST_ARGS)

info: $(VENV)/.installed
	$(PY) -m helios info

lint: $(VENV)/.installed
	$(PY) -m ruff check .

# System packages: checked with dpkg, installed only when one is missing.
system:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(VENV)/.installed: pyproject.toml | system
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
