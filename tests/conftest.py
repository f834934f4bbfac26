import contextlib
import faulthandler
import os
import shutil
import signal
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from helpers import Endpoints  # noqa: E402

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

# A test that hangs (e.g. a deadlock inside the C core with the GIL held,
# which no Python-level timeout can interrupt) dumps every thread's stack and
# ends the run instead of hanging `make test` forever.
HANG_TIMEOUT = 120


_watchdog_file = None


def pytest_configure(config):
    # A run started as a background job by a shell without job control
    # (`make test &`, nohup, some CI runners) inherits SIGINT ignored, and
    # Python then leaves it ignored: every Ctrl-C test would wait for a
    # KeyboardInterrupt that never comes, here and in the scripts the tests
    # start (an ignored signal stays ignored across exec; a handled one is
    # reset to the default, which Python turns into KeyboardInterrupt).
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # The dump must reach the real stderr, not pytest's capture of fd 2
    # (which is lost when the process exits).
    global _watchdog_file
    capman = config.pluginmanager.getplugin("capturemanager")
    ctx = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
    with ctx:
        _watchdog_file = os.fdopen(os.dup(2), "w")


@pytest.fixture(autouse=True)
def _hang_watchdog(request):
    f = _watchdog_file or sys.stderr
    f.write("")
    faulthandler.dump_traceback_later(HANG_TIMEOUT, exit=True, file=f)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


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
def endpoints(ipc_dir):
    """Factory of fresh endpoints: endpoints("inproc" | "ipc" | "tcp")."""
    return Endpoints(ipc_dir)
