#!/bin/sh
# The threaded Python tests under ASan+UBSan (part of `make sanitize`).
#
# The extension modules are rebuilt with gcc -fsanitize=address,undefined
# into build/asan-py (tools/build-ext.sh), and pytest runs them in the normal
# interpreter with libasan/libubsan preloaded.  PYTHONMALLOC=malloc sends
# Python's object allocations through malloc too, so ASan sees their bounds.
#
# Leaks: the in-process tests run with LeakSanitizer on (detect_leaks=1): at
# exit nothing allocated by the C core, the bridge or libzmq may be left
# unreachable.  The tests that run interpreters which exit on purpose while
# delivery threads are still running or stuck (test_exit.py,
# test_shutdown.py) run with detect_leaks=0: those children end with Python
# objects and thread bootstate owned by threads that never finished, which
# LeakSanitizer reports (stacks entirely inside CPython: _threadmodule.c
# start_new_thread, gcmodule.c gc_alloc, typeobject.c, longobject.c; checked
# with UPCALL_DETECT_LEAKS=1, no frame of upcall, csrc or libzmq).
#
# UBSan: halt on the first report; tools/ubsan.supp suppresses only one
# pattern of Cython's generated code (see the comment there).
#
#   tools/sanitize-python.sh [pytest args...]   default: the threaded tests
#   UPCALL_DETECT_LEAKS=1 tools/sanitize-python.sh   LSan on for the exit tests too
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=$root/.venv/bin/python
out=build/asan-py
tools/build-ext.sh "$out" "${CC:-gcc}" "-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined"

libasan=$(${CC:-gcc} -print-file-name=libasan.so)
libubsan=$(${CC:-gcc} -print-file-name=libubsan.so)
[ -f "$libasan" ] || { echo "sanitize-python: libasan.so not found ($libasan)"; exit 1; }

export ASAN_OPTIONS_BASE="abort_on_error=1:detect_stack_use_after_return=0:strict_init_order=1"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1:suppressions=$root/tools/ubsan.supp"
export PYTHONMALLOC=malloc
export PYTHONPATH="$root/$out"
export LD_PRELOAD="$libasan $libubsan"
# Prove that the instrumented modules are the ones imported.
(cd /tmp && "$py" -c "import upcall._bus as b, upcall._codec as c; print(b.__file__, c.__file__)") \
    | grep -q "$out/upcall/_bus" || { echo "sanitize-python: the instrumented build is not the one imported"; exit 1; }

# pytest through its script, not `python -m` (which would put the source
# tree, with its uninstrumented in-place build, first on sys.path).
run() {   # run DETECT_LEAKS test files...
    leaks=$1; shift
    [ $# -gt 0 ] || return 0
    echo "== ASan+UBSan (detect_leaks=$leaks): $*"
    ASAN_OPTIONS="detect_leaks=$leaks:$ASAN_OPTIONS_BASE" "$root/.venv/bin/pytest" -q -p no:cacheprovider "$@"
}

if [ $# -gt 0 ]; then
    run "${UPCALL_DETECT_LEAKS:-1}" "$@"
    exit
fi
inproc=""; exiting=""
for t in tests/test_bus.py tests/test_threads.py tests/test_reentrancy.py \
         tests/test_backpressure.py tests/test_bad_input.py; do
    [ -f "$t" ] && inproc="$inproc $t"
done
for t in tests/test_shutdown.py tests/test_exit.py; do
    [ -f "$t" ] && exiting="$exiting $t"
done
run 1 $inproc
run "${UPCALL_DETECT_LEAKS:-0}" $exiting
