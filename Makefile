# Two commands do all set-up on a fresh Debian 12 machine: `make train` and `make test`.
# Both install only what is missing (apt packages, then Python packages into .venv) and are idempotent.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# chromium: the headless browser test of `telemetry serve`'s page (tests/telemetry/test_browser.py).
APT_PACKAGES := libvulkan1 mesa-vulkan-drivers spirv-tools spirv-headers vulkan-tools vulkan-validationlayers chromium
# Mesa >= 25 lavapipe is 2-2.5x faster than Debian 12's 22.3. On Debian 12 it comes from Debian's own
# bookworm-backports suite (added as one sources file, only when no backports entry exists yet).
# `make MESA_BACKPORTS=0 ...` keeps the distribution's Mesa and touches no apt source.
MESA_BACKPORTS ?= 1
MESA_MIN_MAJOR := 25
BACKPORTS_SOURCES := /etc/apt/sources.list.d/helios-bookworm-backports.sources
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=
# Tests run on every core (pytest-xdist): lavapipe compiles a pipeline on one thread, and a cold suite is mostly
# compiling. worksteal hands each worker a contiguous run of tests (shared pipelines stay in one process) and
# rebalances the tail. `make test XDIST=` runs in one process.
XDIST ?= -n auto --dist worksteal
# The suite starts hundreds of Python processes (CLI runs, ranks, crash loops): with bytecode caching each starts
# ~0.3 s sooner than when it compiles helios's sources again (where the environment sets PYTHONDONTWRITEBYTECODE,
# the warm suite's half that trains took 235 s instead of 181 s on 2 cores). The .pyc files go to __pycache__/
# folders, which git ignores.
unexport PYTHONDONTWRITEBYTECODE
CONFIG ?= configs/shakespeare.toml
# The run `make train` samples, plots and summarises: CONFIG's own ([run] out_dir/name) unless RUN_DIR is given;
# asked of the trainer once, when the train recipe first needs it (after .venv exists).
RUN_DIR ?= $(eval RUN_DIR := $(shell $(PY) -m trainer config $(CONFIG) --get run.dir 2>/dev/null))$(RUN_DIR)

.PHONY: train test test-gpu-profile test-subgroups test-swiftshader system mesa info lint clean

# Prepare the dataset, train the default config (resuming if a run exists), sample, and plot.
train: $(VENV)/.installed
	$(PY) -m helios info
	$(PY) -m trainer prepare $(CONFIG)
	$(PY) -m trainer run $(CONFIG)
	$(PY) -m trainer sample --run $(RUN_DIR) --prompt "ROMEO:" --tokens 120
	$(PY) -m telemetry plot $(RUN_DIR) -o $(RUN_DIR)/plot.png
	$(PY) -m telemetry summary $(RUN_DIR)
	@echo "plot: $(RUN_DIR)/plot.png"
	@echo "live dashboard in the browser (also while training): $(PY) -m telemetry serve $(RUN_DIR)"

# The whole suite, then the GPU's code paths on lavapipe (docs/GPU.md): the kernel and autograd tests in the GPU
# profile (tiled kernels, GPU row layouts, staging memory, emulated cooperative matrices), and the tests whose
# kernels use subgroup operations at lavapipe's other honest subgroup sizes, 4 and 16, with a short training
# parity at 16. helios keys its caches per vector width, so each width compiles its own kernels once.
#
# The kernel-level tests (every variant and dtype of every op at awkward shapes, fed small tensors) compile with
# lavapipe's LLVM optimization passes off (GALLIVM_PERF=nopt): the same SPIR-V and the same IEEE arithmetic in
# about half the compile time, which is most of a cold run. Everything the main suite trains (tests/trainer, the
# other reliability tests) runs the optimized code users get; the later stages check the GPU's code paths and
# other subgroup sizes, and compile unoptimized too (the loss parity at 16 lanes included). Mesa keys its shader
# cache on the flag, so neither kind of run reuses the other's binaries. PYTEST_ARGS holds options (-k, -x, ...),
# not paths.
KERNEL_TESTS := tests/kernels tests/autograd tests/spirv tests/reliability/test_fuzz_kernels.py
NOPT := GALLIVM_PERF=nopt

test: $(VENV)/.installed
	$(NOPT) $(PY) -m pytest $(XDIST) $(KERNEL_TESTS) $(PYTEST_ARGS)
	$(PY) -m pytest $(XDIST) $(addprefix --ignore=,$(KERNEL_TESTS)) $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory test-gpu-profile test-subgroups test-swiftshader

# Cases that run the same whatever the profile are left out: module validity, tests that force a variant (marked
# `forced` by tests/conftest.py: the profile changes only what the rules choose, and memory, which every case left
# still reads through staging), the benchmarks' test, and the cooperative-matrix tests, which force their emulated
# variants in the default run already.
test-gpu-profile: $(VENV)/.installed
	$(NOPT) $(PY) -m pytest -q $(XDIST) --profile=gpu tests/kernels tests/autograd -k "not spirv_valid" -m "not forced" \
	  --ignore=tests/kernels/matmul/test_matmul_coopmat.py --ignore=tests/kernels/attention/test_attention_coopmat.py \
	  --ignore=tests/kernels/test_bench_half.py $(PYTEST_ARGS)

test-subgroups: $(VENV)/.installed
	$(NOPT) LP_NATIVE_VECTOR_WIDTH=128 $(PY) -m pytest -q $(XDIST) -m subgroup tests/kernels tests/autograd tests/spirv $(PYTEST_ARGS)
	$(NOPT) LP_NATIVE_VECTOR_WIDTH=512 $(PY) -m pytest -q $(XDIST) -m subgroup tests/kernels tests/autograd tests/spirv \
	  tests/trainer/test_loss_parity.py $(PYTEST_ARGS)

# SwiftShader (Google's CPU Vulkan driver, shipped in the chromium package above): a second conformant driver with
# a compiler of its own and a strict device: no 64-bit or 16-bit types, a 256-byte offset alignment, subgroups of 4,
# 256 invocations (docs/GPU.md, "SwiftShader in CI"). What differs there from lavapipe runs again: the kernel tests
# (f32 at the choices the rules make without int64, and the forced choices that fit; the half dtypes and the 64-bit
# variants skip, naming the feature), the autograd tests (the GPT twins, odd widths on 256-byte aligned arenas) and
# the runtime tests in the default profile, and the autograd tests in the GPU profile. The cross-driver training
# parity in both profiles (tests/trainer/test_driver_parity.py, marked swiftshader) runs in the main suite.
SWIFTSHADER_ICD := /usr/lib/chromium/vk_swiftshader_icd.json

test-swiftshader: $(VENV)/.installed
	VK_DRIVER_FILES=$(SWIFTSHADER_ICD) $(PY) -m pytest -q $(XDIST) tests/kernels tests/autograd tests/runtime \
	  -k "not spirv_valid" $(PYTEST_ARGS)
	VK_DRIVER_FILES=$(SWIFTSHADER_ICD) $(PY) -m pytest -q $(XDIST) --profile=gpu tests/autograd $(PYTEST_ARGS)

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
	@$(MAKE) --no-print-directory mesa

# Newer lavapipe on Debian 12 (bookworm): enable bookworm-backports from the mirror apt already uses,
# then install mesa-vulkan-drivers (and the libdrm it needs) from it. A no-op when Mesa is new enough,
# on Debian 13+ (whose default suite has it), or with MESA_BACKPORTS=0.
mesa:
	@ver=$$(dpkg-query -W -f='$${Version}' mesa-vulkan-drivers 2>/dev/null); major=$${ver%%.*}; major=$${major#*:}; \
	codename=$$(. /etc/os-release && echo $$VERSION_CODENAME); \
	if [ "$(MESA_BACKPORTS)" != 1 ] || [ "$$codename" != bookworm ] || [ "$${major:-0}" -ge $(MESA_MIN_MAJOR) ]; then exit 0; fi; \
	if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then \
	  uri=$$(grep -rhs "^URIs:" /etc/apt/sources.list.d/*.sources | grep -v security | head -n1 | awk '{print $$2}'); \
	  [ -n "$$uri" ] || uri=$$(grep -hs "^deb .*bookworm main" /etc/apt/sources.list | head -n1 | awk '{print $$2}'); \
	  [ -n "$$uri" ] || { echo "no Debian mirror found in /etc/apt to add bookworm-backports from; use MESA_BACKPORTS=0" >&2; exit 2; }; \
	  echo "adding bookworm-backports ($$uri) as $(BACKPORTS_SOURCES) for Mesa >= $(MESA_MIN_MAJOR)"; \
	  printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$$uri" \
	    | $(SUDO) tee $(BACKPORTS_SOURCES) >/dev/null; \
	fi; \
	echo "installing mesa-vulkan-drivers from bookworm-backports (installed: $${ver:-none})"; \
	$(SUDO) apt-get update -qq && \
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends -t bookworm-backports \
	  mesa-vulkan-drivers libdrm2

# --no-compile: pip would byte-compile every file of every package (torch's thousands: ~20 of a fresh set-up's ~45 s);
# Python compiles the modules a run imports on first use instead, and keeps them (see PYTHONDONTWRITEBYTECODE above).
$(VENV)/.installed: pyproject.toml | system
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e '.[test]'
	@touch $@

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
