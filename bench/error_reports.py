"""What a flood of malformed messages costs with and without on_error.

    python bench/error_reports.py [N] [REPEATS]

N (default 20,000) messages that do not decode (the reserved byte 0xc1),
from the synthetic source (no zmq: only decoding and reporting are timed),
delivered on a native thread three ways:
  on_error   a no-op on_error(exc, msg)
  logged     no on_error: rate-limited records on the "upcall" logger, with a
             StreamHandler (threadName, traceback formatting) writing to /dev/null
  no-logging no on_error, and no handler anywhere: logging's last resort
             (stderr, sent to /dev/null here)
Each is run REPEATS times (default 7); the best time is kept, as the one
least disturbed by other work on the machine.  Prints seconds, ns per
message, and each case's ratio to on_error.
"""
import contextlib
import logging
import os
import sys
import time

import upcall
from upcall._bus import _synthetic_subscribe

BAD = b"\xc1"


def run(n, on_error):
    with upcall.Bus() as bus:
        kw = {} if on_error is None else {"on_error": on_error}
        t0 = time.perf_counter()
        sub = _synthetic_subscribe(bus, print, count=n, payload=BAD, batch=1024, **kw)
        assert sub.wait(timeout=600)
        seconds = time.perf_counter() - t0
        assert sub.stats["decode_errors"] == n, sub.stats
        sub.close()
    return seconds


def best(n, repeats, on_error):
    return min(run(n, on_error) for _ in range(repeats))


def main(n=20_000, repeats=7):
    results = {"on_error": best(n, repeats, lambda exc, msg: None)}
    logger = logging.getLogger("upcall")
    with open(os.devnull, "w") as null:
        handler = logging.StreamHandler(null)
        handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        try:
            results["logged"] = best(n, repeats, None)
        finally:
            logger.removeHandler(handler)
        with contextlib.redirect_stderr(null):
            results["no-logging"] = best(n, repeats, None)
    base = results["on_error"]
    print(f"{n} malformed messages, best of {repeats}, Python {sys.version.split()[0]}")
    for name, seconds in results.items():
        print(f"  {name:11s} {seconds * 1e3:8.1f} ms  {seconds / n * 1e9:7.0f} ns/msg  "
              f"x{seconds / base:.2f}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
