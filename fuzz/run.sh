#!/bin/sh
# Run the Python-side fuzzers (atheris) for a bounded time each:
#
#   fuzz/run.sh [SECONDS] [HARNESS...]     default: 60 s, every fuzz/fuzz_*.py
#   fuzz/run.sh merge [HARNESS...]         fold build/corpus/<name> into the
#                                          committed fuzz/corpus/<name>, minimized
#
# The extension modules are built with clang, ASan+UBSan and libFuzzer's
# coverage instrumentation (-fsanitize=fuzzer-no-link) in build/fuzz and laid
# out as a package in build/fuzz-py (tools/build-ext.sh fuzz), so
# atheris is guided by coverage of the C decoder and the C core, and a memory
# error aborts the run with a report.  Corpora grow under build/corpus/<name>
# (not committed); each run also starts from the committed seeds
# (fuzz/seeds/<name>, hand-written) and corpus (fuzz/corpus/<name>, what
# earlier runs found, minimized by `fuzz/run.sh merge`).  A crash
# leaves its input as build/fuzz-artifacts/<name>/crash-*; turn it into a
# regression test (tests/wire/test_bad_input.py or tests/codec/test_codec*.py).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
secs=${1:-60}
[ $# -gt 0 ] && shift
merge=""
if [ "$secs" = merge ]; then merge=1; secs=0; fi
harnesses=${*:-$(ls fuzz/fuzz_*.py)}
py=$root/.venv/bin/python
if ! "$py" -c "import atheris" 2>/dev/null; then
    echo "fuzz/run.sh: installing atheris into .venv"
    "$py" -m pip install -q atheris
fi
out=build/fuzz-py
# MESONPY_EDITABLE_SKIP=...: the editable install's import hook stays out of
# the way of PYTHONPATH.
skip=$(tools/build-ext.sh fuzz)
export "$skip"
atheris_dir=$("$py" -c "import atheris, os; print(atheris.path())")
status=0
for h in $harnesses; do
    name=$(basename "$h" .py)
    mkdir -p "build/corpus/$name" "build/fuzz-artifacts/$name" "fuzz/corpus/$name"
    if [ -n "$merge" ]; then
        # libFuzzer's merge keeps the inputs of the second directory that add
        # coverage to the first: the committed corpus grows by what matters.
        # It runs the harness again as a program of its own (argv[0]): the
        # harnesses are executable, and `python3` on PATH is the venv's.
        args="-merge=1 $root/fuzz/corpus/$name $root/build/corpus/$name"
        echo "== merging build/corpus/$name into fuzz/corpus/$name"
    else
        args="-max_total_time=$secs $root/build/corpus/$name $root/fuzz/corpus/$name"
        [ -d "fuzz/seeds/$name" ] && args="$args $root/fuzz/seeds/$name"
        echo "== $name for ${secs}s"
    fi
    # detect_leaks=0: CPython keeps much of its memory until exit (interned
    # strings, type caches): leak reports would be the interpreter's, not ours.
    # PYTHONMALLOC=malloc: objects come from malloc, so ASan sees their bounds.
    # Run from build/ so that PYTHONPATH, not the source tree, provides upcall.
    ( cd build && \
      ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1" \
      UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$root/tools/ubsan.supp" \
      PYTHONMALLOC=malloc PYTHONPATH="$root/$out" PATH="$root/.venv/bin:$PATH" \
      LD_PRELOAD="$atheris_dir/asan_with_fuzzer.so" \
      "$py" "$root/$h" -max_len=4096 -timeout=30 -rss_limit_mb=4096 \
        -print_final_stats=1 -artifact_prefix="$root/build/fuzz-artifacts/$name/" $args ) \
      > "build/fuzz-$name.log" 2>&1 || status=$?
    grep -E "INITED|DONE|stat::number_of_executed|stat::average|ERROR|Traceback|Error:|crash-" "build/fuzz-$name.log" | tail -12
    [ $status -eq 0 ] || { echo "== $name FAILED (status $status): build/fuzz-$name.log"; exit $status; }
done
