# upcall: the two commands are `make test` and `make bench`.
# Each one installs what it needs: libzmq and liblz4 headers (Debian libzmq3-dev,
# liblz4-dev) when pkg-config cannot find them, iproute2 when `ip` is missing (network-namespace
# tests), a virtual environment .venv, the package in editable mode with its
# test/bench extras.

PYTHON      ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
SOURCES     := $(wildcard csrc/*.c csrc/*.h upcall/*.pyx upcall/*.pxi upcall/*.pxd upcall/includes/*.pxd) setup.py
# Other CPython versions whose threaded behaviour is tested too (pyenv).
PYENV_ROOT  ?= $(HOME)/.pyenv
OTHER_PYTHONS := $(wildcard $(PYENV_ROOT)/versions/3.10.*/bin/python3 \
                            $(PYENV_ROOT)/versions/3.12.*/bin/python3 \
                            $(PYENV_ROOT)/versions/3.13.*/bin/python3)
THREAD_TESTS := tests/test_bus.py tests/test_threads.py tests/test_shutdown.py tests/test_exit.py \
                tests/test_reentrancy.py tests/test_backpressure.py tests/test_lifecycle.py \
                tests/test_fork.py tests/test_socket_limit.py tests/test_faults_sub.py \
                tests/test_sigint_sub.py tests/test_stats_invariant.py \
                tests/test_publisher_threads.py tests/test_publisher_interrupt.py tests/test_aio.py \
                tests/test_endpoints.py tests/test_logging.py tests/test_thread_names.py \
                tests/test_readiness.py tests/test_oob.py tests/test_decoder.py \
                tests/test_compression.py tests/test_coalesce_rx.py tests/test_coalesce_tx.py \
                tests/test_coalesce_close.py tests/test_signals.py \
                tests/test_many_topics.py tests/test_aio_batches.py tests/test_gc_tracking.py

.PHONY: all deps build test test-threads-all test-huge bench wheel ctest sanitize fuzz fuzz-merge soak stress-sigint clean

all: build

# --- system packages -------------------------------------------------------
deps: .deps.stamp
# Again when this file changes: a machine that ran it before gets what was added since.
.deps.stamp: Makefile
	@if ! pkg-config --exists libzmq 2>/dev/null; then \
	  echo "libzmq not found by pkg-config: installing libzmq3-dev with apt-get"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq libzmq3-dev pkg-config >/dev/null; \
	fi
	@pkg-config --exists libzmq || { echo "libzmq still missing"; exit 1; }
	@if ! pkg-config --exists liblz4 2>/dev/null; then \
	  echo "liblz4 not found by pkg-config: installing liblz4-dev with apt-get (compression)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq liblz4-dev >/dev/null; \
	fi
	@pkg-config --exists liblz4 || { echo "liblz4 still missing"; exit 1; }
	@if ! command -v ip >/dev/null 2>&1; then \
	  echo "ip not found: installing iproute2 with apt-get (tests/test_netns.py)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq iproute2 >/dev/null; \
	fi
	@touch $@

# --- the Python package ----------------------------------------------------
$(VENV)/.installed: pyproject.toml | .deps.stamp
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel "Cython>=3.0.10"
	$(PY) -m pip install -q --no-build-isolation -e ".[test,bench,plot,dist]"
	@touch $@

build: $(VENV)/.built
$(VENV)/.built: $(VENV)/.installed $(SOURCES)
	$(PY) setup.py -q build_ext --inplace
	@touch $@

test: build ctest
	$(PY) -m pytest -q
	$(MAKE) --no-print-directory test-threads-all

# Thread-state and finalization behaviour differ between CPython versions:
# the threaded tests also run on every other supported CPython found here.
test-threads-all: build
	@for py in $(OTHER_PYTHONS); do \
	  v=$$($$py -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	  env=.venv-$$v; \
	  echo "== threaded tests on CPython $$v"; \
	  [ -x $$env/bin/python ] || $$py -m venv $$env || exit 1; \
	  $$env/bin/python -m pip install -q --upgrade pip || exit 1; \
	  $$env/bin/python -m pip install -q ".[test]" || exit 1; \
	  $$env/bin/pytest -q -p no:cacheprovider $(wildcard $(THREAD_TESTS)) || exit 1; \
	done

# Ctrl-C while delivery runs, STRESS_RUNS times in a row (default 200) per
# CPython (this .venv and every other one test-threads-all uses) and delivery
# mode, under CPU load: tools/stress_sigint.py starts two CPU-bound processes
# for the whole run and stops them. Not part of `make test` (minutes).
STRESS_RUNS ?= 200
stress-sigint: build
	@pys="--python $(abspath $(PY))"; \
	for py in $(OTHER_PYTHONS); do \
	  v=$$($$py -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	  env=.venv-$$v; \
	  [ -x $$env/bin/python ] || $$py -m venv $$env || exit 1; \
	  $$env/bin/python -m pip install -q --upgrade pip || exit 1; \
	  $$env/bin/python -m pip install -q ".[test]" || exit 1; \
	  pys="$$pys --python $(CURDIR)/$$env/bin/python"; \
	done; \
	$(PY) tools/stress_sigint.py --runs $(STRESS_RUNS) $$pys

# bench: codec, upcalls and bus in a few minutes (the default profile);
# bench-full: the same with PERF.md's counts, repeats and idle waits (about
# 45 minutes here).  More: make bench BENCH_ARGS="--quick --plot out.png".
.PHONY: bench-full
bench: build
	$(PY) bench_upcalls.py $(BENCH_ARGS)

bench-full: build
	$(PY) bench_upcalls.py --full $(BENCH_ARGS)

# --- distribution files ----------------------------------------------------
# dist/: the sdist and the self-contained Linux wheel built from it (auditwheel
# repair bundles libzmq and the libraries it needs, as pyzmq's wheels do);
# dist/system-libzmq/: the same wheel before repair, loading the system libzmq.
wheel: $(VENV)/.installed
	PY=$(PY) tools/build-wheel.sh dist

# --- the C core on its own -------------------------------------------------
ctest: .deps.stamp
	$(MAKE) --no-print-directory -C csrc test

sanitize: build
	$(MAKE) --no-print-directory -C csrc sanitize
	./tools/sanitize-python.sh

# libFuzzer on the C reader (new inputs in csrc/build/corpus), then atheris on
# the decode-to-Python and subscription paths (new inputs in build/corpus, logs
# in build/fuzz-*.log); each starts from the committed seeds and corpora.
# FUZZ_SECONDS each (default 60), one at a time, niced.
fuzz: build .clang.stamp
	nice -n 19 $(MAKE) --no-print-directory -C csrc fuzz FUZZ_SECONDS=$(or $(FUZZ_SECONDS),60)
	nice -n 19 ./fuzz/run.sh $(or $(FUZZ_SECONDS),60)

# Fold what fuzz runs found into the committed, minimized corpora
# (csrc/fuzz/corpus, fuzz/corpus): commit them so every run starts there.
fuzz-merge: build .clang.stamp
	$(MAKE) --no-print-directory -C csrc fuzz-merge
	./fuzz/run.sh merge

# libFuzzer needs clang; Debian's clang brings its runtime (libclang-rt-14-dev).
.clang.stamp:
	@if ! command -v clang >/dev/null 2>&1; then \
	  echo "clang not found: installing clang with apt-get"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq clang >/dev/null; \
	fi
	@touch $@

# Out-of-band values over 4 GiB (msgpack's bin limit does not apply): opt-in,
# they map several GiB of address space (tests/test_oob.py, marker huge).
test-huge: build
	$(PY) -m pytest -q -p no:cacheprovider -m huge tests/test_oob.py

soak: build
	$(PY) -m pytest -q -s -m soak -p no:cacheprovider

clean:
	$(MAKE) --no-print-directory -C csrc clean
	rm -rf build dist upcall/*.c upcall/*.so upcall/*.html $(VENV)/.built
