#!/bin/sh
# The threaded Python tests under ASan+UBSan, then some under TSan (part of
# `make sanitize`).
#
# The extension modules are built with gcc and meson's
# b_sanitize=address,undefined in build/asan (tools/build-ext.sh asan: the
# build dir `make sanitize` runs the C tests in too), laid out as a package in
# build/asan-py, and pytest runs them in the normal interpreter with
# libasan/libubsan preloaded.  PYTHONMALLOC=malloc sends
# Python's object allocations through malloc too, so ASan sees their bounds.
#
# TSan: the modules built with b_sanitize=thread (build/tsan, build/tsan-py), libtsan
# preloaded into the normal interpreter (ASLR off: setarch -R, as for the C
# tests).  CPython itself is not instrumented, but its GIL is a pthread mutex
# that TSan sees, so what the bridge does under the GIL is ordered, and what
# it does without the GIL (the C core, the send path) is checked.  The
# suppressions are csrc/tsan.supp (libzmq's lock-free queues) plus
# tools/tsan-python.supp.  TSAN_FILES are the tests run so far: those known
# clean (the others have not been checked under TSan yet).
#
# Leaks: the in-process tests run with LeakSanitizer on (detect_leaks=1): at
# exit nothing allocated by the C core, the bridge or libzmq may be left
# unreachable.  The tests that run interpreters which exit on purpose while
# delivery threads are still running or stuck (test_exit.py,
# test_shutdown.py), and forked children that leave what they inherited
# alone on purpose (test_fork.py: it is the parent's), run with
# detect_leaks=0: those children end with Python
# objects and thread bootstate owned by threads that never finished, which
# LeakSanitizer reports (stacks entirely inside CPython: _threadmodule.c
# start_new_thread, gcmodule.c gc_alloc, typeobject.c, longobject.c; checked
# with UPCALL_DETECT_LEAKS=1, no frame of upcall, csrc or libzmq).
# test_logging.py's exit scripts end with a stuck target, like test_shutdown's.
# test_oob.py: its in-process leak check is the outstanding-buffer counters
# (oob_outstanding), which ASan runs too; at exit LeakSanitizer reports
# CPython objects only (gc_alloc, PyFloat_FromDouble; no upcall frame).
# test_socket_limit.py checks everything inside child interpreters too, and
# runs with detect_leaks=0 for another reason: at the exit of its caller-mode
# script LeakSanitizer's own tracer faults on a bogus dynamic-TLS range
# ("DTLS 5 at 0x000000001004-0x000800002106", "Tracer caught signal 11",
# "LeakSanitizer has encountered a fatal error": a sanitizer failure, not a
# leak report; seen with GCC 12's libasan and glibc 2.36, 2026-11-25).
#
# UBSan: halt on the first report; tools/ubsan.supp suppresses only one
# pattern of Cython's generated code (see the comment there).
#
#   tools/sanitize-python.sh [pytest args...]   default: the threaded tests
#   UPCALL_DETECT_LEAKS=1 tools/sanitize-python.sh   LSan on for the exit tests too
#   UPCALL_SANITIZER=thread tools/sanitize-python.sh [pytest args...]   TSan only
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=$root/.venv/bin/python
cc=${CC:-gcc}
export CC="$cc"
asan_out=build/asan-py
tsan_out=build/tsan-py
sanitizer=${UPCALL_SANITIZER:-all}
case "$sanitizer" in all|address|thread) ;; *)
    echo "sanitize-python: UPCALL_SANITIZER must be address or thread, not $sanitizer"; exit 1 ;;
esac
if [ $# -gt 0 ] && [ "$sanitizer" = all ]; then
    sanitizer=address
fi
# Both builds first: the runs below preload a sanitizer runtime.
# Each prints MESONPY_EDITABLE_SKIP=...: the editable install's import hook
# stays out of the way of PYTHONPATH, in the children the tests start too.
if [ "$sanitizer" != thread ]; then
    skip=$(tools/build-ext.sh asan)
    export "$skip"
fi
if [ "$sanitizer" != address ]; then
    skip=$(tools/build-ext.sh tsan)
    export "$skip"
    cat csrc/tsan.supp tools/tsan-python.supp > "$tsan_out/tsan.supp"
fi

runtime() {   # runtime NAME: the path of libNAME.so, or exit
    lib=$($cc -print-file-name="lib$1.so")
    [ -f "$lib" ] || { echo "sanitize-python: lib$1.so not found ($lib)" >&2; exit 1; }
    echo "$lib"
}

# pytest through its script, not `python -m` (which would put the source
# tree, with its uninstrumented in-place build, first on sys.path).  Each run
# first proves that the instrumented modules are the ones imported.
pytest_in() {   # pytest_in OUT WRAP test files...   (WRAP: a command prefix, or "")
    out=$1; wrap=$2; shift 2
    (cd /tmp && $wrap "$py" -c "import upcall._bus as b, upcall._codec as c; print(b.__file__, c.__file__)") \
        | grep -q "$out/upcall/_bus" \
        || { echo "sanitize-python: the instrumented build in $out is not the one imported"; exit 1; }
    $wrap "$root/.venv/bin/pytest" -q -p no:cacheprovider "$@"
}

asan() {   # asan DETECT_LEAKS test files...
    leaks=$1; shift
    [ $# -gt 0 ] || return 0
    echo "== ASan+UBSan (detect_leaks=$leaks): $*"
    libasan=$(runtime asan)
    libubsan=$(runtime ubsan)
    (
        export ASAN_OPTIONS="detect_leaks=$leaks:abort_on_error=1:detect_stack_use_after_return=0:strict_init_order=1"
        export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1:suppressions=$root/tools/ubsan.supp"
        export LSAN_OPTIONS="suppressions=$root/tools/lsan.supp"
        export PYTHONMALLOC=malloc PYTHONPATH="$root/$asan_out" LD_PRELOAD="$libasan $libubsan"
        pytest_in "$asan_out" "" "$@"
    )
}

tsan() {   # tsan test files...
    [ $# -gt 0 ] || return 0
    echo "== TSan: $*"
    libtsan=$(runtime tsan)
    # Reports go to files: pytest's capture of stderr dies with the process.
    rm -f "$tsan_out"/report.*
    (
        export TSAN_OPTIONS="halt_on_error=1:suppressions=$root/$tsan_out/tsan.supp:log_path=$root/$tsan_out/report"
        export PYTHONMALLOC=malloc PYTHONPATH="$root/$tsan_out" LD_PRELOAD="$libtsan"
        pytest_in "$tsan_out" "setarch $(uname -m) -R" "$@"
    ) || { cat "$tsan_out"/report.* 2>/dev/null; return 1; }
}

if [ $# -gt 0 ]; then
    if [ "$sanitizer" = thread ]; then tsan "$@"; else asan "${UPCALL_DETECT_LEAKS:-1}" "$@"; fi
    exit
fi
existing() { for t in "$@"; do [ -f "$t" ] && printf ' %s' "$t"; done; return 0; }
inproc=$(existing tests/bus/test_bus.py tests/publisher/test_publisher.py tests/bus/test_threads.py tests/bus/test_reentrancy.py \
         tests/bus/test_backpressure.py tests/wire/test_bad_input.py tests/bus/test_lifecycle.py \
         tests/bus/test_faults_sub.py tests/process/test_sigint_sub.py \
         tests/bus/test_stats_invariant.py \
         tests/publisher/test_publisher_threads.py tests/publisher/test_publisher_interrupt.py \
         tests/codec/test_decoder.py tests/publisher/test_readiness.py tests/bus/test_endpoints.py \
         tests/bus/test_thread_names.py tests/codec/test_compression.py tests/wire/test_coalesce_rx.py)
exiting=$(existing tests/process/test_shutdown.py tests/process/test_exit.py tests/process/test_fork.py \
         tests/bus/test_socket_limit.py tests/bus/test_logging.py tests/wire/test_oob.py \
         tests/publisher/test_coalesce_tx.py)
TSAN_FILES=$(existing tests/bus/test_bus.py tests/publisher/test_publisher.py tests/bus/test_threads.py \
             tests/publisher/test_publisher_threads.py tests/publisher/test_publisher_interrupt.py \
             tests/publisher/test_coalesce_tx.py tests/shared/test_shared_sockets.py tests/asyncio/test_aio.py \
             tests/asyncio/test_aio_batches.py)
if [ "$sanitizer" != thread ]; then
    asan 1 $inproc
    asan "${UPCALL_DETECT_LEAKS:-0}" $exiting
fi
if [ "$sanitizer" != address ]; then
    tsan $TSAN_FILES
fi
