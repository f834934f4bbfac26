"""Build the upcall extension modules: Cython bridges over the C core in csrc/.

Linux only (the C core waits on eventfd).  libzmq is found with pkg-config.
UPCALL_ONLY=upcall._codec (comma separated) builds a subset, so parallel work
on one module does not rebuild the others.

A missing source stops the build: a wheel without its extension modules
installs without complaint and only fails at `import upcall`.
"""
import filecmp
import glob
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup

if not sys.platform.startswith("linux"):
    sys.exit("upcall: builds and runs on Linux only (this is %s)" % sys.platform)

LIBZMQ_MISSING = """\
upcall: libzmq not found by pkg-config.  Install libzmq's development files
and pkg-config (upcall builds and runs on Linux only):
  Debian, Ubuntu:     sudo apt-get install libzmq3-dev pkg-config
  Fedora, RHEL:       sudo dnf install zeromq-devel pkgconf-pkg-config
  Arch:               sudo pacman -S zeromq pkgconf
  Alpine:             sudo apk add zeromq-dev pkgconf
  openSUSE:           sudo zypper install zeromq-devel pkg-config
  Homebrew on Linux:  brew install zeromq pkgconf
A libzmq installed elsewhere: set PKG_CONFIG_PATH to the directory of its libzmq.pc."""


def pkg_config(*args):
    try:
        out = subprocess.run(["pkg-config", *args, "libzmq"], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        sys.exit(LIBZMQ_MISSING)
    return shlex.split(out)


def require(paths, what):
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        sys.exit("upcall: %s missing: %s (an incomplete checkout or sdist)"
                 % (what, ", ".join(missing)))


CFLAGS = ["-O3", "-std=gnu11", "-fno-strict-aliasing", "-Wno-unused-function"]

# The codec modules need only the msgpack reader/writer; the bus module links
# the whole C core, every csrc/*.c (the sdist carries the same glob).
CODEC_C = ["csrc/msgpack.c"]
CORE_C = sorted(glob.glob("csrc/*.c"))

MODULES = {
    # name: (pyx, C sources, needs zmq)
    "upcall._codec": ("upcall/_codec.pyx", CODEC_C, False),
    "upcall.handler": ("upcall/handler.pyx", CODEC_C, False),
    "upcall.native": ("upcall/native.pyx", CODEC_C, False),
    "upcall._bus": ("upcall/_bus.pyx", CORE_C, True),
}

only = {n.strip() for n in os.environ.get("UPCALL_ONLY", "").split(",") if n.strip()}
if only - MODULES.keys():
    sys.exit("upcall: UPCALL_ONLY names no such module: %s (the modules: %s)"
             % (", ".join(sorted(only - MODULES.keys())), ", ".join(MODULES)))
selected = {n: spec for n, spec in MODULES.items() if not only or n in only}

require(CODEC_C, "C sources")
require([pyx for pyx, _, _ in selected.values()], "Cython sources")

# The public headers: those that the installed .pxd files (includes/bus.pxd,
# includes/msgpack.pxd) name, and that bus.h lists as public.  Copied next to
# them so that upcall.get_include() is the one directory a user's extension
# needs; the internal headers (the rest of csrc/, upcall/_compat.h) stay in
# the source tree.  Copies of any other header are removed, so that no wheel
# ships them ([tool.setuptools.package-data] lists the same three).
PUBLIC_HEADERS = ["csrc/bus.h", "csrc/msgpack.h", "csrc/split.h", "csrc/wire.h"]
require(PUBLIC_HEADERS + ["upcall/_compat.h"], "headers")
_copies = {os.path.join("upcall", "includes", os.path.basename(h)): h for h in PUBLIC_HEADERS}
for _dst in set(glob.glob("upcall/includes/*.h")) - _copies.keys():
    os.remove(_dst)
for _dst, _src in _copies.items():
    if not os.path.exists(_dst) or not filecmp.cmp(_src, _dst, shallow=False):
        shutil.copyfile(_src, _dst)

zmq_cflags = pkg_config("--cflags")
zmq_libs = pkg_config("--libs")


# --- optional compression codecs (csrc/codec.h) ---------------------------
# One line per codec: name, pkg-config package, the define its row is built
# with, Debian's package.  A library pkg-config does not find leaves its row
# out (publisher(compression=name) is refused); UPCALL_NO_<NAME>=1 leaves it
# out on purpose (the tests of that case).
CODECS = [
    ("lz4", "liblz4", "UC_HAVE_LZ4", "liblz4-dev"),
    ("zstd", "libzstd", "UC_HAVE_ZSTD", "libzstd-dev"),
]


def codec_flags(name, package, define, debian):
    """The compile and link flags of one codec's library, or none."""
    if os.environ.get("UPCALL_NO_" + name.upper()):
        return [], []
    try:
        cflags = subprocess.run(["pkg-config", "--cflags", package], check=True,
                                capture_output=True, text=True).stdout
        libs = subprocess.run(["pkg-config", "--libs", package], check=True,
                              capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        print(f"upcall: {package} not found by pkg-config: building without "
              f"compression={name!r} (Debian, Ubuntu: sudo apt-get install {debian})",
              file=sys.stderr)
        return [], []
    return ["-D" + define, *shlex.split(cflags)], shlex.split(libs)


for _codec in CODECS:
    _cflags, _libs = codec_flags(*_codec)
    zmq_cflags += _cflags
    zmq_libs += _libs


def extension(name, pyx, csources, zmq):
    return Extension(
        name,
        sources=[pyx, *csources],
        include_dirs=["csrc"],
        extra_compile_args=CFLAGS + (zmq_cflags if zmq else []),
        extra_link_args=(zmq_libs if zmq else []) + ["-lpthread"],
    )


from Cython.Build import cythonize  # noqa: E402  (after the libzmq check)

# The compiler directives are set here, so this file is a dependency of every
# generated .c: cythonize() compares a .c only with its .pyx/.pxi/.pxd files,
# and would keep a module generated under other directives.
_setup_mtime = os.path.getmtime(os.path.abspath(__file__))
_directives_changed = any(
    not os.path.exists(pyx[:-len(".pyx")] + ".c")
    or os.path.getmtime(pyx[:-len(".pyx")] + ".c") < _setup_mtime
    for pyx, _, _ in selected.values())

setup(
    ext_modules=cythonize(
        [extension(n, *spec) for n, spec in selected.items()],
        language_level=3,
        force=_directives_changed,
        # binding=False: the def methods of the cdef classes are C method
        # descriptors, which CPython type-checks: upcall.Bus.close(object())
        # is a TypeError.  Cython 3's default (binding=True) makes them
        # cyfunctions, which do not check self on an unbound call and read
        # the C fields of whatever object they are given (Cython issue
        # #6127): a crash.  The signatures are then embedded in the form
        # CPython turns into __text_signature__ (clinic), so inspect.signature
        # still works; the classes' own docstrings carry theirs by hand.
        compiler_directives={"binding": False, "embedsignature": True,
                             "embedsignature.format": "clinic",
                             "freethreading_compatible": False},
        annotate=bool(os.environ.get("UPCALL_ANNOTATE")),
    ),
    # Only the files [tool.setuptools.package-data] lists go into a wheel, not
    # every file of the sdist that sits in the package (the Cython-generated
    # .c files, the .pyx and .pxi sources).
    include_package_data=False,
)
