"""The C programs of the benchmark's physical floors, built by the build.

``c_program(name)`` is the path of bench/NAME.c as bench/meson.build builds
it (with the libzmq pkg-config finds and the core's -Wall -Wextra -Werror)
into build/py/bench/:

* ``floor_pull``: a plain C libzmq PULL loop draining a flood (the ``c-floor`` row);
* ``floor_pingpong``: two C peers answering each other (``c-pingpong``);
* ``floor_push``: a plain C ``zmq_send`` loop (``c-send``, publishing);
* ``count_pull``: the publishing rows' receiver, which counts messages,
  coalesced ones split with the core's ``mp_skip`` (csrc/msgpack.c);
* ``floor_proxy``: libzmq's ``zmq_proxy`` between an XSUB and an XPUB (the
  ``c-zmq_proxy`` row of the proxy section);
* ``proxy_ends``: the C publisher and subscriber on either side of a
  forwarder (the proxy rows);
* ``floor_stamp``: a C PUSH and PULL in one process over tcp, messages
  plain, with a stamp frame, or with the stamp in the topic (the stamping
  rows' floors).

The runners are in :mod:`bench.harness`.
"""
from __future__ import annotations

import os

#: Where `make build` builds (Makefile BUILD_DIR), from the repository's root.
BUILD_DIR = os.path.join("build", "py")

#: The C programs of the floors (bench/NAME.c; bench/meson.build builds them).
C_PROGRAMS = ("floor_pull", "floor_pingpong", "floor_push", "count_pull", "floor_proxy",
              "proxy_ends", "floor_stamp")

_PROGRAMS: dict[str, tuple[str | None, str]] = {}   # name -> (path or None, why not)


def c_program(name: str) -> tuple[str | None, str]:
    """(path of bench/NAME.c compiled, or None, why not): the build compiles
    the floors (bench/meson.build) into build/py/bench/NAME, with the core's
    flags; `import upcall` in the editable install rebuilds them first."""
    if name not in C_PROGRAMS:
        raise ValueError(f"no C program {name!r} (the floors: {', '.join(C_PROGRAMS)})")
    if name not in _PROGRAMS:
        import upcall  # noqa: F401  (the editable install rebuilds what changed)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = os.path.join(root, BUILD_DIR, "bench", name)
        _PROGRAMS[name] = ((path, "") if os.access(path, os.X_OK)
                           else (None, f"{name} is not built ({path}): make build builds it"))
    return _PROGRAMS[name]
