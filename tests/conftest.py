import contextlib
import faulthandler
import os
import re
import shutil
import signal
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from helpers import free_tcp_port  # noqa: E402

try:
    from hypothesis import HealthCheck, settings
except ImportError:
    pass
else:
    # too_slow is a timing threshold: on a loaded CI machine it fails runs
    # whose examples are fine.  The examples stay random; a failure prints
    # the blob that reproduces it.
    settings.register_profile("upcall", suppress_health_check=[HealthCheck.too_slow],
                              print_blob=True)
    settings.load_profile("upcall")

# Per-test time limits (pyproject.toml [tool.pytest.ini_options]: timeout, a
# marker `@pytest.mark.timeout(N)` on the tests that build): pytest-timeout
# with method=signal, so a test past its limit fails alone, with the stacks of
# every thread, and the run goes on.  Its method=thread would end the whole
# run (os._exit) and needs the GIL to fire.  A signal cannot end a hang where
# the main thread never returns to Python (a deadlock inside the C core with
# the GIL held): for that, faulthandler's watchdog (a C thread, no GIL) dumps
# every thread's stack and ends the run, `hang_watchdog_grace` seconds after
# the test's own limit, so it never cuts a build test short.
HANG_GRACE = 60
# The deadline without pytest-timeout installed (its limit, then the grace).
HANG_TIMEOUT = 120


_watchdog_file = None


def pytest_addoption(parser):
    parser.addini("hang_watchdog_grace", "seconds past a test's timeout before the hang "
                  "watchdog ends the whole run (default %d)" % HANG_GRACE, default=str(HANG_GRACE))


def pytest_configure(config):
    # A run started as a background job by a shell without job control
    # (`make test &`, nohup, some CI runners) inherits SIGINT ignored, and
    # Python then leaves it ignored: every Ctrl-C test would wait for a
    # KeyboardInterrupt that never comes, here and in the scripts the tests
    # start (an ignored signal stays ignored across exec; a handled one is
    # reset to the default, which Python turns into KeyboardInterrupt).
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if not config.pluginmanager.hasplugin("timeout"):
        config.addinivalue_line("markers", "timeout(seconds): the test's limit (pytest-timeout)")
    # The dump must reach the real stderr, not pytest's capture of fd 2
    # (which is lost when the process exits).
    global _watchdog_file
    capman = config.pluginmanager.getplugin("capturemanager")
    ctx = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
    with ctx:
        _watchdog_file = os.fdopen(os.dup(2), "w")


def _arm_hang_watchdog(config, timeout):
    grace = float(config.getini("hang_watchdog_grace"))
    faulthandler.dump_traceback_later(timeout + grace, exit=True, file=_watchdog_file or sys.stderr)


# pytest-timeout's hooks, called with the test's limit (marker, --timeout or
# ini) when there is one, around setup, call and teardown; returning None
# lets the plugin set its own SIGALRM timer too.
@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    _arm_hang_watchdog(item.config, settings.timeout)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_timeout_cancel_timer(item):
    faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    if not item.config.pluginmanager.hasplugin("timeout"):
        _arm_hang_watchdog(item.config, HANG_TIMEOUT)
    try:
        yield
    finally:
        # Also what a test armed itself (test_soak re-arms it per cycle).
        faulthandler.cancel_dump_traceback_later()


# Tests that run only when asked for by name in -m (`-m soak`, `make soak`):
# hours, over 4 GiB, or the portable wheels.  Deselected here rather than by
# an `-m` in addopts, which any `-m` of the user's own (`-m "not build"`)
# would replace, running them all.
ON_REQUEST = ("soak", "huge", "portable")


def pytest_collection_modifyitems(config, items):
    asked = config.getoption("markexpr") or ""
    skipped = [m for m in ON_REQUEST if not re.search(r"\b%s\b" % m, asked)]
    if skipped:
        keep = [i for i in items if not any(i.get_closest_marker(m) for m in skipped)]
        if len(keep) != len(items):
            config.hook.pytest_deselected(items=[i for i in items if i not in keep])
            items[:] = keep
    # The tests that build (marker build) take minutes each: first, so that
    # with pytest-xdist (make test) they start at once on their own workers
    # while the other workers share the rest, instead of starting last and
    # running alone at the end.  A stable sort: every worker collects the
    # same order, as xdist requires.
    items.sort(key=lambda item: item.get_closest_marker("build") is None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    # --dist loadgroup (make test), and each module of tests/packaging/ and
    # tests/cluster/ on one worker: their tests share what the module builds
    # once (a module-scoped fixture: a build, the cluster's five hosts and
    # their processes), which every worker running one of them would build
    # again.
    # xdist_group marks cannot say it: pytest-xdist 3.8 loses them under
    # pytest 9.2 (it renames the node ids the workers report, which 9.2 no
    # longer lets it do).  Every other test goes to the next free worker.
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class Scheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid):
            path = nodeid.split("::", 1)[0]
            parts = path.split("/")
            if len(parts) >= 2 and parts[-2] in ("packaging", "cluster"):
                return path
            return super()._split_scope(nodeid)

    return Scheduling(config, log)


@pytest.fixture
def ipc_dir():
    # Short path: ipc:// paths are limited to ~107 bytes (sun_path), and
    # pytest's tmp_path for a parametrized test can be longer than that.
    d = tempfile.mkdtemp(prefix="uc-", dir="/tmp")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def zctx():
    """A pyzmq context for the other end of a test's sockets, destroyed after it."""
    import zmq
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def endpoints(ipc_dir):
    """Factory of fresh endpoints: endpoints("inproc" | "ipc" | "tcp"); tcp
    ports from free_tcp_port (never ephemeral, never handed out twice)."""
    # Imported here, not at the top: tests/process/test_hang_watchdog.py runs
    # a copy of this file where bench/ is not beside it.
    from bench_package import bench_module
    return bench_module("endpoints").Endpoints(ipc_dir, tcp_port=free_tcp_port)
