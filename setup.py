"""Build the upcall extension modules: Cython bridges over the C core in csrc/.

libzmq is found with pkg-config.  UPCALL_ONLY=upcall._codec (comma separated)
builds a subset, so parallel work on one module does not rebuild the others.
"""
import glob
import os
import shlex
import subprocess
import sys

from setuptools import Extension, setup


def pkg_config(*args):
    try:
        out = subprocess.run(["pkg-config", *args, "libzmq"], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        sys.exit("upcall: libzmq not found by pkg-config; install it with: "
                 "sudo apt-get install libzmq3-dev pkg-config")
    return shlex.split(out)


zmq_cflags = pkg_config("--cflags")
zmq_libs = pkg_config("--libs")

CFLAGS = ["-O3", "-std=gnu11", "-fno-strict-aliasing", "-Wno-unused-function"]

# The codec modules need the msgpack reader/writer only; the bus module the
# whole C core (one file per concern: every csrc/*.c).
CODEC_C = ["csrc/msgpack.c"]
CORE_C = sorted(glob.glob("csrc/*.c"))
_missing = [c for c in CODEC_C if not os.path.isfile(c)] + ([] if CORE_C else ["csrc/*.c"])
if _missing:
    sys.exit(f"upcall: C sources missing: {', '.join(_missing)}; is this a complete source tree?")

MODULES = {
    # name: (pyx, C sources, needs zmq)
    "upcall._codec": ("upcall/_codec.pyx", CODEC_C, False),
    "upcall.handler": ("upcall/handler.pyx", CODEC_C, False),
    "upcall.native": ("upcall/native.pyx", CODEC_C, False),
    "upcall._bus": ("upcall/_bus.pyx", CORE_C, True),
}


def extension(name, pyx, csources, zmq):
    return Extension(
        name,
        sources=[pyx, *csources],
        include_dirs=["csrc"],
        extra_compile_args=CFLAGS + (zmq_cflags if zmq else []),
        extra_link_args=(zmq_libs if zmq else []) + ["-lpthread"],
    )


only = {n.strip() for n in os.environ.get("UPCALL_ONLY", "").split(",") if n.strip()}
extensions = [extension(n, *spec) for n, spec in MODULES.items()
              if (not only or n in only) and os.path.exists(spec[0])]

# The C headers the installed .pxd files name (upcall/includes/bus.pxd ->
# "bus.h"): shipped as package data so that users' Cython code can cimport
# upcall with include_dirs=upcall.get_include().
for _h in ("bus.h", "synth.h", "msgpack.h"):
    _src, _dst = os.path.join("csrc", _h), os.path.join("upcall", "includes", _h)
    if os.path.exists(_src) and (not os.path.exists(_dst) or open(_src).read() != open(_dst).read()):
        with open(_src) as _f, open(_dst, "w") as _g:
            _g.write(_f.read())

from Cython.Build import cythonize  # noqa: E402  (after the libzmq check)

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={"embedsignature": True, "freethreading_compatible": False},
        annotate=bool(os.environ.get("UPCALL_ANNOTATE")),
    ),
)
