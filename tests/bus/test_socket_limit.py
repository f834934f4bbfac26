"""The socket limit: opening sockets can never make the
process abort.

libzmq aborts in zmq_ctx_term when it cannot make the socket it needs for
each inproc connect still waiting for a bind (csrc/bus.c says why).  The bus
keeps one slot of ZMQ_MAX_SOCKETS free for closing and refuses, with
OSError(EMFILE) naming max_sockets, the socket that would take it.  Each
scenario that could abort runs in a child interpreter: an abort there fails
the test instead of killing the run.
"""
import errno
import signal
import subprocess
import sys
import textwrap

import pytest

import upcall
from helpers import DEADLINE, script_env, wait_for

pytestmark = pytest.mark.threads

MODES = ["native", "python", "caller"]


def run_script(body, *args):
    script = textwrap.dedent("""
        import errno, sys
        import upcall
        from helpers import mode_kwargs, wait_for

        def fill(open_one):
            # Open sockets until the bus refuses; return how many, and the error.
            n = 0
            while True:
                try:
                    open_one(n)
                except OSError as exc:
                    return n, exc
                n += 1

        def refused(exc, max_sockets):
            assert exc.errno == errno.EMFILE, exc
            assert f"max_sockets={max_sockets}" in str(exc), exc
            assert "Bus(max_sockets=" in str(exc), exc
    """) + textwrap.dedent(body)
    try:
        proc = subprocess.run([sys.executable, "-c", script, *args], env=script_env(),
                              cwd="/tmp", capture_output=True, text=True, timeout=4 * DEADLINE)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"script hung: stdout={e.stdout!r} stderr={e.stderr!r}")
    report = f"status {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode != -signal.SIGABRT, "the process aborted:\n" + report
    assert proc.returncode == 0, report
    assert "closed" in proc.stdout, report
    return proc


def test_inproc_connects_waiting_for_a_bind_at_the_default_limit():
    # The reproduction: publishers connecting to inproc names nobody
    # binds, until the limit; then close.  (Raises the descriptor limit so
    # that the socket limit, not the process's, is what is reached.)
    run_script("""
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
        bus = upcall.Bus()
        pubs = []
        n, exc = fill(lambda i: pubs.append(
            bus.publisher(f"inproc://s{i}", kind="push", bind=False)))
        if exc.errno == errno.EMFILE and "too many open sockets or files" in str(exc):
            sys.exit(f"the process ran out of descriptors first: {exc}")
        refused(exc, 1023)
        assert bus.max_sockets == 1023
        assert n == 1022, n          # one slot kept for closing
        bus.close()
        print("closed")
    """)


@pytest.mark.parametrize("close_first", [False, True])
def test_inproc_connects_waiting_at_a_small_limit(close_first):
    # Closed or not, a socket whose connect waits keeps its slot: libzmq
    # frees it only once the name is bound.
    run_script("""
        close_first = sys.argv[1] == "True"
        bus = upcall.Bus(max_sockets=16)
        pubs = []
        n, exc = fill(lambda i: pubs.append(
            bus.publisher(f"inproc://w{i % 3}", kind="push", bind=False)))
        refused(exc, 16)
        assert n == 15, n
        if close_first:
            for p in pubs:
                p.close()
            try:
                bus.publisher("inproc://more", kind="pub", bind=True)
            except OSError as exc:
                refused(exc, 16)   # still held: nothing bound their names
            else:
                sys.exit("a closed socket whose connect waits gave its slot back")
        bus.close()
        print("closed")
    """, str(close_first))


def test_a_bind_gives_back_the_slots_of_closed_waiting_connects():
    run_script("""
        bus = upcall.Bus(max_sockets=16)
        waiting = [bus.publisher("inproc://late", kind="push", bind=False) for _ in range(5)]
        others = [bus.publisher(f"inproc://b{i}", kind="pub", bind=True) for i in range(10)]
        for p in waiting:
            p.close()                     # kept by libzmq: still counted
        n, exc = fill(lambda i: bus.publisher(f"inproc://x{i}", kind="pub", bind=True))
        refused(exc, 16)
        assert n == 0, n
        others.pop().close()              # one free slot: bind the waited-for name
        sub = bus.subscribe("inproc://late", print, kind="pull", bind=True)
        # The five closed connects go once libzmq destroys their sockets (it
        # needs the binding socket's loop to take the pipes in and let go).
        more = []
        def room_for_five():
            try:
                more.append(bus.publisher(f"inproc://y{len(more)}", kind="pub", bind=True))
            except OSError as exc:
                assert exc.errno == errno.EMFILE, exc   # libzmq has not destroyed them yet
            return len(more) == 5
        wait_for(room_for_five, what="the slots of the released connects")
        bus.close()
        print("closed")
    """)


def test_binds_at_the_limit():
    run_script("""
        bus = upcall.Bus(max_sockets=32)
        pubs = []
        n, exc = fill(lambda i: pubs.append(bus.publisher(f"inproc://b{i}", kind="push", bind=True)))
        refused(exc, 32)
        assert n == 31, n
        pubs.pop().close()
        pubs.append(bus.publisher("inproc://again", kind="push", bind=True))    # the limit is not sticky
        bus.close()
        print("closed")
    """)


@pytest.mark.parametrize("mode", MODES)
def test_subscriptions_at_the_limit(mode):
    # Subscriptions (half bound, half connecting to names nobody binds) and
    # their publishers, in every delivery mode.
    run_script("""
        KW = mode_kwargs(sys.argv[1])
        bus = upcall.Bus(max_sockets=40)
        subs = []
        def one(i):
            if i % 2:
                subs.append(bus.subscribe(f"inproc://s{i}", print, kind="pull", bind=True, **KW))
                subs.append(bus.publisher(f"inproc://s{i}", kind="push", bind=False))
            else:
                subs.append(bus.subscribe(f"inproc://nobody{i}", print, **KW))
        n, exc = fill(one)
        refused(exc, 40)
        assert len(subs) == 39, len(subs)     # sockets: one slot kept
        bus.close()
        print("closed")
    """, mode)


def test_max_sockets_is_checked():
    with pytest.raises(TypeError, match="max_sockets"):
        upcall.Bus(max_sockets="many")
    with pytest.raises(TypeError, match="max_sockets"):
        upcall.Bus(max_sockets=True)
    for bad in (-1, 0, 1, 65536):
        with pytest.raises(ValueError, match="max_sockets"):
            upcall.Bus(max_sockets=bad)
    with upcall.Bus(max_sockets=2) as bus:
        assert bus.max_sockets == 2
        pub = bus.publisher("inproc://only", kind="pub", bind=True)
        with pytest.raises(OSError) as info:
            bus.publisher("inproc://second", kind="pub", bind=True)
        assert info.value.errno == errno.EMFILE and "max_sockets=2" in str(info.value)
        pub.close()
        # The slot comes back (once libzmq has destroyed the socket).
        wait_for(lambda: _opens(bus, "inproc://second"), what="the slot to come back")
    with upcall.Bus() as bus:
        assert bus.max_sockets == 1023        # libzmq's default


def _opens(bus, endpoint):
    try:
        bus.publisher(endpoint, kind="pub", bind=True).close()
    except OSError:
        return False
    return True
