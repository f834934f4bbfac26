"""A thread factory that never runs the loop is said and counted: a
subscription whose factory has not called run() after LOOP_START_WARNING
seconds logs one warning and shows stats["loop_start_late"] == 1."""
import concurrent.futures
import logging
import threading

import pytest

import upcall
import upcall._bus
from helpers import Collector, wait_for

pytestmark = pytest.mark.threads


def late_warnings(caplog):
    return [r for r in caplog.records if "has not started the delivery loop" in r.getMessage()]


def test_a_thread_made_but_not_started_is_said_once(endpoints, monkeypatch, caplog):
    monkeypatch.setattr(upcall._bus, "LOOP_START_WARNING", 0.05)
    caplog.set_level(logging.WARNING, logger="upcall")
    made = []

    def forgot_start(run):
        made.append(threading.Thread(target=run))     # no .start()

    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("tcp"), lambda m: None, thread_factory=forgot_start)
        wait_for(lambda: sub.stats["loop_start_late"] == 1, what="the late loop counted")
        wait_for(lambda: late_warnings(caplog), what="the warning")
        assert len(late_warnings(caplog)) == 1
        assert "forgot_start" in late_warnings(caplog)[0].getMessage()
        sub.close()
    assert len(made) == 1


def test_a_pool_with_too_few_workers(endpoints, monkeypatch, caplog):
    monkeypatch.setattr(upcall._bus, "LOOP_START_WARNING", 0.05)
    caplog.set_level(logging.WARNING, logger="upcall")
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        with upcall.Bus() as bus:
            first = bus.subscribe(endpoints("tcp"), Collector(), thread_factory=pool.submit,
                                  bind=True)
            second = bus.subscribe(endpoints("tcp"), Collector(), thread_factory=pool.submit,
                                   bind=True)
            wait_for(lambda: second.stats["loop_start_late"] == 1, what="the second counted")
            # The first has the pool's one worker: it started in time.
            assert first.stats["loop_start_late"] == 0
            assert len(late_warnings(caplog)) == 1
            second.close()
            first.close()
    finally:
        pool.shutdown(wait=True)


def test_a_factory_that_starts_the_loop_is_not_said(endpoints, monkeypatch, caplog):
    monkeypatch.setattr(upcall._bus, "LOOP_START_WARNING", 0.05)
    caplog.set_level(logging.WARNING, logger="upcall")
    col = Collector()
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("tcp"), kind="push", bind=True)
        sub = bus.subscribe(pub.last_endpoint, col, kind="pull",
                            thread_factory=upcall.python_threads)
        pub.send(b"t", 1)
        col.wait(1)
        # Past the watch's time: it has looked and found the loop running.
        wait_for(lambda: upcall._bus._later_thread is None, what="the watch done")
        assert sub.stats["loop_start_late"] == 0
        assert late_warnings(caplog) == []
        sub.close()
