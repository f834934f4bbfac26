"""The C programs of the benchmark's physical floors, compiled on first use.

``c_program(name)`` compiles bench/NAME.c (with the core sources it names in
C_PROGRAMS, from csrc/) once per run, with the C compiler (``$CC`` or
``cc``) and the libzmq pkg-config finds, ``-O2 -Wall -Wextra -Werror``,
into a temporary folder removed at exit:

* ``floor_pull``: a plain C libzmq PULL loop draining a flood (the ``c-floor`` row);
* ``floor_pingpong``: two C peers answering each other (``c-pingpong``);
* ``floor_push``: a plain C ``zmq_send`` loop (``c-send``, publishing);
* ``count_pull``: the publishing rows' receiver, which counts messages,
  coalesced ones split with the core's ``mp_skip`` (csrc/msgpack.c).
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile

_PROGRAMS: dict[str, tuple[str | None, str]] = {}   # name -> (path or None, why not)
_PROGRAM_DIR: list[str] = []

#: The C programs of the floors (bench/NAME.c) and the core sources each one needs.
C_PROGRAMS = {"floor_pull": (), "floor_pingpong": (), "floor_push": (),
              "count_pull": ("msgpack.c",)}


def c_program(name: str) -> tuple[str | None, str]:
    """(path of bench/NAME.c compiled, or None, why not), compiled once per
    run with the C compiler and libzmq found by pkg-config, -Wall -Wextra
    -Werror, beside the core sources it names in C_PROGRAMS (csrc/)."""
    if name not in _PROGRAMS:
        here = os.path.dirname(os.path.abspath(__file__))
        csrc = os.path.join(os.path.dirname(here), "csrc")
        cc = shutil.which(os.environ.get("CC", "cc"))
        try:
            flags = subprocess.run(["pkg-config", "--cflags", "--libs", "libzmq"],
                                   capture_output=True, text=True, check=True).stdout.split()
        except (OSError, subprocess.CalledProcessError):
            flags = None
        if cc is None or flags is None:
            _PROGRAMS[name] = (None, "no C compiler" if cc is None else "pkg-config has no libzmq")
        else:
            if not _PROGRAM_DIR:
                d = tempfile.mkdtemp(prefix="upcall-floor-")
                atexit.register(shutil.rmtree, d, True)
                _PROGRAM_DIR.append(d)
            out = os.path.join(_PROGRAM_DIR[0], name)
            srcs = [os.path.join(here, name + ".c")] + [os.path.join(csrc, f)
                                                          for f in C_PROGRAMS[name]]
            r = subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-I", csrc, "-o", out,
                                *srcs, *flags, "-lpthread"], capture_output=True, text=True)
            _PROGRAMS[name] = ((out, "") if r.returncode == 0
                               else (None, f"{name}.c did not compile: {r.stderr.strip()}"))
    return _PROGRAMS[name]


def floor_binary() -> tuple[str | None, str]:
    """(path of the compiled bench/floor_pull.c or None, why not)."""
    return c_program("floor_pull")
