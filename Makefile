# upcall: the two commands are `make test` and `make bench`.
# Each one installs what it needs: the system packages tools/install-deps.sh
# lists (compiler, Python headers and venv, libzmq, liblz4 and libzstd
# headers, iproute2, nftables) when missing, a virtual environment .venv,
# the package in editable mode with its test, dist and bench dependency
# groups.

PYTHON      ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
MESON       := $(VENV)/bin/meson
# The editable install's build directory (meson-python rebuilds it when
# upcall is imported); the sanitizer and fuzzing builds have their own.
BUILD_DIR   := build/py
# pyproject.toml's [build-system] requires: the editable install builds
# without isolation, with these in .venv.
BUILD_REQUIRES := "meson-python>=0.16" "meson>=1.2" "ninja" "Cython>=3.0.10,<3.4"
# Other CPython versions whose threaded behaviour is tested too (pyenv).
PYENV_ROOT  ?= $(HOME)/.pyenv
OTHER_PYTHONS := $(wildcard $(PYENV_ROOT)/versions/3.10.*/bin/python3 \
                            $(PYENV_ROOT)/versions/3.12.*/bin/python3 \
                            $(PYENV_ROOT)/versions/3.13.*/bin/python3)
OTHER_VERSIONS := $(foreach py,$(OTHER_PYTHONS),$(basename $(patsubst $(PYENV_ROOT)/versions/%/bin/python3,%,$(py))))
# Their environments, one per minor version: .venv-3.13/.installed.
THREAD_ENVS := $(OTHER_VERSIONS:%=.venv-%/.installed)
# What they are installed from: remade when one of these changes.
THREAD_ENV_DEPS := pyproject.toml $(wildcard meson.build meson.options csrc/meson.build csrc/*.[ch] \
                   upcall/meson.build upcall/*.pyx upcall/*.pxi upcall/*.pxd upcall/*.py upcall/*.h \
                   upcall/includes/*.pxd)
# pytest-xdist workers for `make test`: most tests wait on sockets, threads and
# child processes rather than compute, so more workers than cores pay off on
# this 2-core machine; every test makes its own endpoints, ports and folders.
# The main run has more: three of its workers spend their first minutes
# waiting on the builds of tests/packaging/ (tests marked build go first).
TEST_WORKERS ?= 6
THREAD_WORKERS ?= 3
# The threaded matrix (soak, huge and portable run only when -m names them:
# tests/conftest.py).
THREADS_MARK := threads

.PHONY: all deps build test test-threads-all test-huge bench wheel wheels test-wheels ctest sanitize fuzz fuzz-build fuzz-merge soak stress-sigint clean

all: build

# --- system packages -------------------------------------------------------
# tools/install-deps.sh: what is missing, in one apt-get run.  Once, before
# anything runs in parallel: `test` makes the stamp before its -j3 sub-make,
# where .venv and the matrix environments would otherwise both start it and
# the second apt-get would fail on dpkg's lock.
deps: .deps.stamp
# Again when the list changes: a machine that ran it before gets what was added since.
.deps.stamp: tools/install-deps.sh meson.options
	tools/install-deps.sh $(PYTHON)
	@touch $@

# --- the Python package ----------------------------------------------------
# pip compiles every installed module to bytecode up front (mypy, numpy,
# matplotlib: half of an install's CPU); Python compiles what is imported,
# once, when it is imported.
PIP_NO_COMPILE := --no-compile
# The package in editable mode (meson-python): `import upcall` rebuilds what
# changed in build/py first, so no build output lands in the source tree.
$(VENV)/.installed: pyproject.toml meson.build meson.options | .deps.stamp
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PIP_NO_COMPILE) $(BUILD_REQUIRES)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH CYTHON=$(CURDIR)/$(VENV)/bin/cython $(PY) -m pip install -q $(PIP_NO_COMPILE) --no-build-isolation -Cbuild-dir=$(BUILD_DIR) -e . --group test --group dist --group bench
	@touch $@

# Always up to date after this: the extension modules, and the benchmark's C
# floors in build/py/bench/ (what an import would rebuild, built now).
# With the ninja `import upcall` rebuilds with (meson-python's editable
# loader: .venv's, from BUILD_REQUIRES), not the first on PATH: two ninja
# versions log their commands differently, each took the other's build for
# stale, and every `make build` after an import (and the import after it)
# rebuilt everything.
# Under `make -j`, MAKEFLAGS names make's jobserver and ninja (1.13) joins
# it: `+` keeps the jobserver open for this recipe (without it ninja found
# the jobserver named but not its descriptors: "Could not initialize
# jobserver").  GNU make 4.4's jobserver is a fifo, which ninja joins
# silently; make 4.3's (Debian 12) is a pipe, which ninja accepts with a
# warning that it is less reliable: there ninja is not told of it and runs
# with its own job count, as it does outside make.
build: $(VENV)/.installed
	+@case " $$MAKEFLAGS" in *--jobserver-auth=fifo:*) ;; *) unset MAKEFLAGS MFLAGS;; esac; \
	echo "$(VENV)/bin/ninja -C $(BUILD_DIR)"; \
	$(VENV)/bin/ninja -C $(BUILD_DIR)

# The threaded matrix runs beside the main run, its environments built from
# the start, while .venv is set up: most tests wait on sockets, threads and
# child processes, so the two cores have room for both.  -j3: the C tests,
# the main run and the matrix; `-n`: pytest-xdist, workers as
# above; --dist loadgroup keeps a module that builds its files once
# (tests/packaging/, tests/conftest.py) on one worker.
test: .deps.stamp
	@$(MAKE) --no-print-directory -j3 ctest test-main test-threads-all

.PHONY: test-main
test-main: build
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# Thread-state and finalization behaviour differ between CPython versions: the
# tests marked `threads` (pyproject.toml says which) also run on every other
# CPython found here.  A pytest marker and this loop rather than nox or tox:
# the versions are the pyenv ones this Makefile already finds, each
# environment is made once and kept while the sources do not change (nox and
# tox would add a tool and remake or re-check their environments on every
# run), and a new threaded test joins the matrix by its marker, not by a list
# kept here.  The environments are built one after the other (two builds at
# once would only compete for the cores); each version's tests start as soon
# as its environment is there, beside the next build, and print when they
# end.  Run from outside the tree: pytest-xdist puts a worker's working
# directory first on sys.path, and the source tree's upcall/ is built for
# this .venv only.
test-threads-all:
	@pids=""; \
	for v in $(OTHER_VERSIONS); do \
	  $(MAKE) --no-print-directory .venv-$$v/.installed || exit 1; \
	  ( cd /tmp && $(CURDIR)/.venv-$$v/bin/pytest -q -p no:cacheprovider -n $(THREAD_WORKERS) \
	      --dist loadgroup -m "$(THREADS_MARK)" $(CURDIR)/tests > $(CURDIR)/.threads-$$v.log 2>&1; \
	    rc=$$?; echo "== threaded tests on CPython $$v"; cat $(CURDIR)/.threads-$$v.log; exit $$rc ) & \
	  pids="$$pids $$!"; \
	done; \
	rc=0; for p in $$pids; do wait $$p || rc=1; done; exit $$rc

# One environment per other CPython, with upcall installed (not editable: the
# source tree's extensions are built for this .venv's CPython only).  Built
# for what the matrix checks, the interpreter's behaviour: without the C
# tests and floors (dev_targets), at -O1 (half the compile time of the
# release build's -O3, which the main run tests).
MATRIX_BUILD := -Csetup-args=-Ddev_targets=false -Csetup-args=-Doptimization=1
.venv-%/.installed: $(THREAD_ENV_DEPS) | .deps.stamp
	@py=$$(ls -d $(PYENV_ROOT)/versions/$*.*/bin/python3 | head -n1); \
	[ -x .venv-$*/bin/python ] || $$py -m venv .venv-$* || exit 1; \
	echo "== installing upcall for CPython $* ($$py)"; \
	.venv-$*/bin/python -m pip install -q --disable-pip-version-check "pip>=25.1" && \
	.venv-$*/bin/python -m pip install -q --disable-pip-version-check $(PIP_NO_COMPILE) $(MATRIX_BUILD) . --group test
	@touch $@

# Ctrl-C while delivery runs, STRESS_RUNS times in a row (default 200) per
# CPython (this .venv and every other one test-threads-all uses) and delivery
# mode, under CPU load: tools/stress_sigint.py starts two CPU-bound processes
# for the whole run and stops them. Not part of `make test` (minutes).
STRESS_RUNS ?= 200
stress-sigint: build $(THREAD_ENVS)
	@pys="--python $(abspath $(PY))"; \
	for v in $(OTHER_VERSIONS); do \
	  pys="$$pys --python $(CURDIR)/.venv-$$v/bin/python"; \
	done; \
	$(PY) tools/stress_sigint.py --runs $(STRESS_RUNS) $$pys

# bench: codec, upcalls and bus in a few minutes (the default profile), its
# plots in build/bench/; bench-full: the same with PERF.md's counts, repeats
# and idle waits (about 45 minutes here).  More: make bench
# BENCH_ARGS="--quick --plot out.png" (python bench_upcalls.py --help).
.PHONY: bench-full
bench: build
	$(PY) bench_upcalls.py $(BENCH_ARGS)

bench-full: build
	$(PY) bench_upcalls.py --full $(BENCH_ARGS)

# The two commands on a machine that has never seen upcall: a fresh Debian
# 12 root (debootstrap, cached in ~/.cache/upcall-fresh-root) with only
# README.md's prerequisites, this checkout's HEAD cloned into it, `make test`
# and `make bench BENCH_ARGS=--quick` run there (no pyenv inside: the
# matrix of other CPythons runs nothing).  Not part of `make test` (half an
# hour, and root for debootstrap and the chroot).
.PHONY: test-fresh-root
test-fresh-root:
	tools/test-fresh-root.sh

# --- distribution files ----------------------------------------------------
# dist/: the sdist and the self-contained Linux wheel built from it (auditwheel
# repair bundles libzmq and the libraries it needs, as pyzmq's wheels do);
# dist/system-libzmq/: the same wheel before repair, loading the system libzmq.
wheel: $(VENV)/.installed
	PY=$(PY) tools/build-wheel.sh dist

# dist/portable/: one wheel per supported CPython found here (pyenv), tagged
# manylinux_2_28, with a lean libzmq built from Debian's source package (CURVE
# through libsodium, nothing else); zig cc targets glibc 2.28.  Sources and
# toolchain are cached in ~/.cache/upcall-portable.  Minutes the first time.
wheels:
	tools/build-portable-wheels.sh dist/portable

# Builds the portable wheels, checks their tag and bundled libraries, and
# round-trips messages with one of them in a Debian 11 root (debootstrap;
# cached too).  Not part of `make test` (minutes, and root for the chroot).
test-wheels: $(VENV)/.installed
	$(PY) -m pytest -q -p no:cacheprovider -m portable tests/packaging/test_portable_wheels.py

# --- the C core on its own -------------------------------------------------
# The C tests (csrc/tests/meson.build), built with the package's flags.
# --no-rebuild: `build` compiled the C tests (built by default), and `make
# test` runs this beside pytest, whose imports rebuild build/py through the
# editable install: two ninjas in one build directory break each other's
# archives ("error opening thin archive member").
ctest: build
	$(MESON) test -C $(BUILD_DIR) --suite core --print-errorlogs --no-rebuild

# The same build under ASan+UBSan (build/asan) and TSan (build/tsan), set up
# by tools/build-ext.sh: the C tests, then the Python suite against the
# sanitized extension modules (tools/sanitize-python.sh).
sanitize: build
	tools/build-ext.sh asan >/dev/null
	tools/build-ext.sh tsan >/dev/null
	$(MESON) test -C build/asan --suite core --print-errorlogs
	$(MESON) test -C build/tsan --suite core --print-errorlogs --wrapper "setarch $$(uname -m) -R"
	./tools/sanitize-python.sh

# libFuzzer on the C reader (new inputs in build/corpus), then atheris on
# the decode-to-Python and subscription paths (new inputs in build/corpus, logs
# in build/fuzz-*.log); each starts from the committed seeds and corpora.
# FUZZ_SECONDS each (default 60), one at a time, niced.
# build/fuzz (tools/build-ext.sh fuzz): clang, ASan+UBSan, libFuzzer's
# coverage on the core and the extension modules, the harnesses of csrc/fuzz.
FUZZ_SECONDS ?= 60
FUZZERS := fuzz_msgpack fuzz_split
fuzz-build: build .clang.stamp
	nice -n 19 tools/build-ext.sh fuzz >/dev/null

fuzz: fuzz-build
	@set -e; for n in $(FUZZERS); do mkdir -p build/corpus/$$n; \
	  echo "== $$n for $(FUZZ_SECONDS)s"; \
	  nice -n 19 build/fuzz/csrc/fuzz/$$n -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -print_final_stats=1 \
	    build/corpus/$$n csrc/fuzz/corpus/$$n csrc/fuzz/seeds/$$n 2>&1 | tail -5; done
	nice -n 19 ./fuzz/run.sh $(FUZZ_SECONDS)

# Fold what fuzz runs found into the committed, minimized corpora
# (csrc/fuzz/corpus, fuzz/corpus): commit them so every run starts there.
fuzz-merge: fuzz-build
	@set -e; for n in $(FUZZERS); do mkdir -p csrc/fuzz/corpus/$$n build/corpus/$$n; \
	  build/fuzz/csrc/fuzz/$$n -merge=1 csrc/fuzz/corpus/$$n build/corpus/$$n 2>&1 | tail -1; done
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
# they map several GiB of address space (tests/wire/test_oob.py, marker huge).
test-huge: build
	$(PY) -m pytest -q -p no:cacheprovider -m huge tests/wire/test_oob.py

soak: build
	$(PY) -m pytest -q -s -m soak -p no:cacheprovider

# (The editable install points at build/py: `make build` sets it up again.)
clean:
	rm -rf build dist $(VENV)/.installed
