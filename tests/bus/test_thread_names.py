"""Delivery threads carry the names promised, for Python as for the OS.

The core's own thread (the default factory) is ``upcall-<n>`` to
threading.current_thread(), to logging's %(threadName)s, in
threading.enumerate() while it delivers (and gone from it once its loop
ended), and to the kernel (/proc/self/task/<tid>/comm).  python_threads'
thread is ``upcall-<n>`` too; an executor's thread keeps the executor's
name; caller mode delivers on the polling thread.
"""
import concurrent.futures
import logging
import re
import threading
import time

import pytest

import upcall
from helpers import DEADLINE, make_pump, wait_for

pytestmark = pytest.mark.threads


class Seen:
    """A target recording, from the delivery thread, what Python and the OS
    call that thread."""

    def __init__(self):
        self.names = []
        self.log_lines = []
        self.enumerated = []
        self.comm = []
        self.handler = logging.Handler()
        self.handler.setFormatter(logging.Formatter("%(threadName)s"))
        self.handler.emit = lambda record: self.log_lines.append(self.handler.format(record))
        self.log = logging.getLogger("test_thread_names")
        self.log.addHandler(self.handler)
        self.log.setLevel(logging.INFO)
        self.log.propagate = False

    def __call__(self, msg):
        self.log.info("delivering %s", msg)
        self.names.append(threading.current_thread().name)
        self.enumerated.append([t.name for t in threading.enumerate()])
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
            self.comm.append(f.read().strip())

    def close(self):
        self.log.removeHandler(self.handler)


@pytest.fixture
def seen():
    s = Seen()
    yield s
    s.close()


def deliver(endpoints, seen, n=3, **kw):
    """n messages to ``seen``; returns the subscription's thread_name (None
    in caller mode)."""
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        sub = bus.subscribe(ep, seen, kind="pull", bind=True, **kw)
        with bus.publisher(ep, kind="push", bind=False) as pub:
            for i in range(n):
                pub.send(b"t", i)
            if kw.get("delivery") == "caller":
                pump = make_pump(sub)
                deadline = time.monotonic() + DEADLINE
                while len(seen.names) < n and time.monotonic() < deadline:
                    pump()
            wait_for(lambda: len(seen.names) == n, what=lambda: repr(seen.names))
        name = sub.thread_name
        sub.close()
        return name


def test_a_native_thread_is_upcall_n_to_python(endpoints, seen):
    name = deliver(endpoints, seen)
    assert re.fullmatch(r"upcall-\d+", name), name
    assert seen.names == [name] * 3                 # not Dummy-<n>
    assert seen.log_lines == [name] * 3             # logging's %(threadName)s
    assert all(name in names for names in seen.enumerated)
    assert seen.comm == [name] * 3                  # the same name for the kernel
    # The loop has ended: threading no longer lists a thread that is gone.
    wait_for(lambda: name not in [t.name for t in threading.enumerate()],
             what=lambda: f"{name} to leave threading.enumerate()")


def test_native_threads_one_after_the_other_each_have_their_own_name(endpoints):
    # The second thread may reuse the first one's ident: it must not find the
    # first one's name.
    names = []
    for _ in range(3):
        s = Seen()
        try:
            names.append(deliver(endpoints, s, n=1))
            assert s.names == names[-1:] and s.comm == names[-1:]
        finally:
            s.close()
    assert len(set(names)) == 3
    wait_for(lambda: not set(names) & {t.name for t in threading.enumerate()},
             what="the ended threads to leave threading.enumerate()")


def test_an_explicit_native_threads_factory_names_the_same_way(endpoints, seen):
    name = deliver(endpoints, seen, thread_factory=upcall.native_threads)
    assert re.fullmatch(r"upcall-\d+", name) and seen.names == [name] * 3


def test_python_threads_are_upcall_n(endpoints, seen):
    name = deliver(endpoints, seen, thread_factory=upcall.python_threads)
    assert re.fullmatch(r"upcall-\d+", name), name
    assert seen.names == seen.log_lines == [name] * 3
    assert all(name in names for names in seen.enumerated)


def test_an_executors_thread_keeps_its_name(endpoints, seen):
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="feeds") as pool:
        name = deliver(endpoints, seen, thread_factory=pool.submit)
    assert name.startswith("feeds"), name
    assert seen.names == seen.log_lines == [name] * 3
    assert not any(n.startswith("upcall-") for n in seen.names)


def test_caller_mode_delivers_on_the_polling_thread(endpoints, seen):
    assert deliver(endpoints, seen, delivery="caller") is None
    me = threading.current_thread().name
    assert seen.names == seen.log_lines == [me] * 3
