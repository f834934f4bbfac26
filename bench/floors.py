"""The C programs of the benchmark's physical floors (bench/NAME.c).

* ``floor_pull``: a plain C libzmq PULL loop draining a flood (the ``c-floor`` row);
* ``floor_pingpong``: two C peers answering each other (``c-pingpong``);
* ``floor_push``: a plain C ``zmq_send`` loop (``c-send``, publishing);
* ``count_pull``: the publishing rows' receiver, which counts messages,
  coalesced ones split with the core's ``mp_skip`` (csrc/msgpack.c).

``c_program(name)`` gives the path of one, built once per run by
:func:`build`: the one place that knows how they are built (today with the C
compiler, ``$CC`` or ``cc``, and the libzmq pkg-config finds, ``-O2 -Wall
-Wextra -Werror``, into a temporary folder removed at exit).  The runners
are in :mod:`bench.harness`.
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(os.path.dirname(HERE), "csrc")

#: The C programs of the floors (bench/NAME.c) and the core sources each one needs.
C_PROGRAMS = {"floor_pull": (), "floor_pingpong": (), "floor_push": (),
              "count_pull": ("msgpack.c",)}

_PROGRAMS: dict[str, tuple[str | None, str]] = {}   # name -> (path or None, why not)
_PROGRAM_DIR: list[str] = []


def build(name: str) -> tuple[str | None, str]:
    """Build bench/NAME.c with the core sources C_PROGRAMS names:
    (path of the program, "") or (None, why not)."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    try:
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "libzmq"],
                               capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        flags = None
    if cc is None or flags is None:
        return None, "no C compiler" if cc is None else "pkg-config has no libzmq"
    if not _PROGRAM_DIR:
        d = tempfile.mkdtemp(prefix="upcall-floor-")
        atexit.register(shutil.rmtree, d, True)
        _PROGRAM_DIR.append(d)
    out = os.path.join(_PROGRAM_DIR[0], name)
    srcs = [os.path.join(HERE, name + ".c")] + [os.path.join(CSRC, f) for f in C_PROGRAMS[name]]
    r = subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-I", CSRC, "-o", out,
                        *srcs, *flags, "-lpthread"], capture_output=True, text=True)
    return (out, "") if r.returncode == 0 else (None, f"{name}.c did not compile: "
                                                      f"{r.stderr.strip()}")


def c_program(name: str) -> tuple[str | None, str]:
    """(path of bench/NAME.c built, or None, why not), built once per run."""
    if name not in C_PROGRAMS:
        raise ValueError(f"unknown floor program {name!r}")
    if name not in _PROGRAMS:
        _PROGRAMS[name] = build(name)
    return _PROGRAMS[name]
