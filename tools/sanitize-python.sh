#!/bin/sh
# The threaded Python tests under ASan+UBSan (part of `make sanitize`).
#
# The extension modules are rebuilt with gcc -fsanitize=address,undefined
# into build/asan-py (tools/build-ext.sh), and pytest runs them in the normal
# interpreter with libasan/libubsan preloaded.  PYTHONMALLOC=malloc sends
# Python's object allocations through malloc too, so ASan sees their bounds.
#
# Leaks: detect_leaks=0.  CPython does not free everything at exit (interned
# strings, static types, module state, thread states of daemon threads), so
# LeakSanitizer's report for a plain `python -c pass` is already full of the
# interpreter's own blocks; the C core's leaks are checked where they can be
# told apart, in the C tests under ASan with detect_leaks=1 (csrc/Makefile:
# asan), and the soak test checks RSS, threads and fds.
#
# UBSan: halt on the first report; tools/ubsan.supp suppresses only one
# pattern of Cython's generated code (see the comment there).
#
#   tools/sanitize-python.sh [pytest args...]   default: the threaded tests
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=$root/.venv/bin/python
out=build/asan-py
tools/build-ext.sh "$out" "${CC:-gcc}" "-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined"

libasan=$(${CC:-gcc} -print-file-name=libasan.so)
libubsan=$(${CC:-gcc} -print-file-name=libubsan.so)
[ -f "$libasan" ] || { echo "sanitize-python: libasan.so not found ($libasan)"; exit 1; }

if [ $# -eq 0 ]; then
    set --
    for t in tests/test_bus.py tests/test_threads.py tests/test_shutdown.py tests/test_exit.py \
             tests/test_reentrancy.py tests/test_backpressure.py tests/test_bad_input.py; do
        [ -f "$t" ] && set -- "$@" "$t"
    done
fi

export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:detect_stack_use_after_return=0:strict_init_order=1"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1:suppressions=$root/tools/ubsan.supp"
export PYTHONMALLOC=malloc
export PYTHONPATH="$root/$out"
export LD_PRELOAD="$libasan $libubsan"
# Prove that the instrumented modules are the ones imported.
(cd /tmp && "$py" -c "import upcall._bus as b, upcall._codec as c; print('== ASan+UBSan build:', b.__file__, c.__file__)") \
    | grep -q "$out/upcall/_bus" || { echo "sanitize-python: the instrumented build is not the one imported"; exit 1; }
echo "== threaded Python tests under ASan+UBSan: $*"
# pytest through its script, not `python -m` (which would put the source
# tree, with its uninstrumented in-place build, first on sys.path).
exec "$root/.venv/bin/pytest" -q -p no:cacheprovider "$@"
