"""The distribution files, built once for this module by `make wheel` in a
clone of the tree (tools/build-wheel.sh): the sdist carries every source the build
needs and nothing the build generates; the wheel built from that sdist
installs into a clean virtual environment, does a round trip, and a user's
Cython extension compiles against it; the self-contained wheel does a round
trip where the only libzmq the loader can find is the one it bundles.  A
build with a source missing fails instead of leaving a module out.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import zipfile

import pytest

import upcall

from test_cimport import RUN as CIMPORT_RUN

pytest.importorskip("build", reason="needs the dist extra (make test installs it)")
pytest.importorskip("auditwheel", reason="needs the dist extra (make test installs it)")

# Past the subprocesses' own limits: the first test sets up `dist` (900 s), and
# the longest test runs up to 1260 s of its own.
pytestmark = [pytest.mark.build, pytest.mark.timeout(900 + 1260 + 60)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "tests")
EXTENSIONS = ("_codec", "_bus", "handler", "native")

ROUND_TRIP = textwrap.dedent("""
    import ctypes
    import json
    import sys
    import time

    # argv: sonames of the system libzmq that must not be loadable here.
    for soname in sys.argv[1:]:
        try:
            ctypes.CDLL(soname)
        except OSError:
            continue
        raise AssertionError(soname + " is visible to the loader")

    import upcall

    def wait_for(pred, timeout=30.0):
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.005)

    msgs = [{"i": i, "px": i / 4, "name": "n" * (i % 7), "raw": bytes([i])} for i in range(200)]
    got = []
    with upcall.Bus() as bus:
        sub = bus.subscribe("tcp://127.0.0.1:*", got.append, kind="pull", bind=True)
        pub = bus.publisher(sub.last_endpoint, kind="push", bind=False)
        for m in msgs:
            pub.send(b"t", m)
        wait_for(lambda: len(got) == len(msgs))
    assert got == msgs
    assert upcall.unpackb(upcall.packb(msgs)) == msgs
    # CURVE keys come from libzmq's crypto library (libsodium): bundled too.
    public, secret = upcall.curve_keypair()
    assert len(public) == len(secret) == 40
    with open("/proc/self/maps") as f:
        libzmq = sorted({line.split()[-1] for line in f
                         if line.split()[-1].rsplit("/", 1)[-1].startswith("libzmq")})
    print(json.dumps({"upcall": upcall.__file__, "libzmq": libzmq}))
""")


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert p.returncode == 0, "%s exited %d\n%s\n%s" % (cmd, p.returncode, p.stdout, p.stderr)
    return p


def clone_of_the_tree(dst):
    """What a fresh clone has: the files git knows (as they are in the work
    tree), none of what a build or a venv left, committed in a repository of
    its own (the sdist is `meson dist`: `git archive` of HEAD)."""
    p = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others",
                        "--exclude-standard"], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip("the source tree is not a git checkout: %s" % p.stderr.strip())
    for rel in p.stdout.split("\0"):
        src = os.path.join(ROOT, rel)
        if rel and os.path.isfile(src):
            os.makedirs(os.path.join(dst, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dst, rel))
    git = ["git", "-C", str(dst), "-c", "user.name=test", "-c", "user.email=test@localhost"]
    run(git + ["init", "-q"])
    run(git + ["add", "-A"])
    run(git + ["commit", "-q", "--no-verify", "-m", "the work tree"])


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    # The README's command, `make wheel`, in a clone of the tree: the Makefile
    # passes the relative PY=.venv/bin/python, as on a fresh clone.  The
    # clone's .venv is this interpreter's environment (it has the dist extra);
    # -o keeps make from creating it again (a fresh clone would, first).
    clone = tmp_path_factory.mktemp("clone")
    clone_of_the_tree(clone)
    os.symlink(sys.prefix, clone / ".venv")
    # Nothing from an enclosing make (`make test`): no PY=... from its command line.
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES", "MAKELEVEL")}
    run(["make", "--no-print-directory", "-o", ".venv/.installed", "wheel"],
        cwd=clone, env=env, timeout=900)
    out = clone / "dist"

    def one(pattern):
        found = glob.glob(str(out / pattern))
        assert len(found) == 1, (pattern, found)
        return found[0]

    return {"sdist": one("upcall-*.tar.gz"),
            "wheel": one("system-libzmq/upcall-*-linux_*.whl"),
            "bundled": one("upcall-*-manylinux_*.whl")}


def clean_venv(path, wheel):
    """A new virtual environment with nothing but the wheel installed; its python and site-packages."""
    run([sys.executable, "-m", "venv", "--without-pip", str(path)], timeout=120)
    py = str(path / "bin" / "python")
    run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", "--no-index",
         wheel], timeout=300)
    site = run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    return py, site


def round_trip(py, tmp_path, wrap=(), hidden_sonames=()):
    """Runs ROUND_TRIP with py -I (no PYTHONPATH, no source tree); what it reports."""
    script = tmp_path / "round_trip.py"
    script.write_text(ROUND_TRIP)
    p = run([*wrap, py, "-I", str(script), *hidden_sonames], cwd=tmp_path, timeout=120)
    return json.loads(p.stdout.strip().splitlines()[-1])


def tree(*patterns):
    return {os.path.relpath(p, ROOT) for pat in patterns for p in glob.glob(os.path.join(ROOT, pat))}


def test_sdist_carries_every_source_and_nothing_generated(dist):
    with tarfile.open(dist["sdist"]) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    sources = tree("LICENSE", "README.md", "pyproject.toml", "meson.build", "meson.options",
                   "csrc/*.c", "csrc/*.h", "csrc/meson.build", "upcall/meson.build",
                   "upcall/*.py", "upcall/*.pyi", "upcall/py.typed",
                   "upcall/*.pyx", "upcall/*.pxi", "upcall/*.pxd", "upcall/*.h",
                   "upcall/includes/*.py", "upcall/includes/*.pxd")
    assert sources - names == set()
    generated = [n for n in names if n.endswith((".so", ".o", ".html"))
                 or (n.startswith("upcall/") and n.endswith(".c"))
                 or (n.startswith("upcall/includes/") and n.endswith(".h"))]
    assert generated == []
    assert [n for n in names if n == "bench_upcalls.py"
            or n.startswith(("bench/", "tests/", "csrc/tests/", "csrc/fuzz/"))] == []


@pytest.mark.parametrize("which", ["wheel", "bundled"])
def test_wheel_carries_the_package_and_what_cimport_needs_only(dist, which):
    names = zipfile.ZipFile(dist[which]).namelist()
    for mod in EXTENSIONS:
        assert [n for n in names if n.startswith("upcall/%s.cpython-" % mod) and n.endswith(".so")], mod
    # The public headers and .pxd files (csrc/bus.h names them), and no other.
    headers = {"upcall/includes/" + h for h in ("bus.h", "msgpack.h", "split.h", "wire.h")}
    pxds = tree("upcall/*.pxd") | {"upcall/includes/bus.pxd", "upcall/includes/msgpack.pxd"}
    assert {n for n in names if n.endswith((".h", ".pxd"))} == headers | pxds
    assert f"upcall-{upcall.__version__}.dist-info/licenses/LICENSE" in names
    assert [n for n in names if n.endswith((".c", ".pyx", ".pxi", ".html"))] == []
    assert [n for n in names if any(part.startswith("bench") for part in n.split("/"))] == []


def test_wheel_from_sdist_round_trip_in_clean_venv_and_cimport(dist, tmp_path):
    py, site = clean_venv(tmp_path / "venv", dist["wheel"])
    got = round_trip(py, tmp_path)
    assert got["upcall"].startswith(site + os.sep)
    # Built on this machine from the sdist: it loads the system's libzmq.
    assert got["libzmq"] and not [lib for lib in got["libzmq"] if lib.startswith(site)]

    # A user's extension compiled against the installed wheel: its .pxd files
    # found on sys.path, the headers they name in upcall.get_include().  Every
    # upcall/includes/*.pxd the wheel ships is cimported.
    user = tmp_path / "user"
    user.mkdir()
    shutil.copy(os.path.join(HERE, "cimport_example", "my_handlers.pyx"), user)
    pxds = sorted(f[:-4] for f in os.listdir(os.path.join(site, "upcall", "includes"))
                  if f.endswith(".pxd"))
    assert pxds == ["bus", "msgpack"]
    (user / "uses_includes.pyx").write_text(
        "".join("from upcall.includes.%s cimport *\n" % m for m in pxds)
        + "def codes():\n    return UC_OK, UC_SPLIT_ERR_VERSION\n")
    (user / "setup.py").write_text(textwrap.dedent("""
        import os
        import upcall
        from setuptools import Extension, setup
        from Cython.Build import cythonize

        assert upcall.__file__.startswith(os.environ["PYTHONPATH"].split(os.pathsep)[0]), upcall.__file__
        exts = [Extension(n, [n + ".pyx"], include_dirs=upcall.get_include())
                for n in ("my_handlers", "uses_includes")]
        setup(name="user_handlers", ext_modules=cythonize(exts, language_level=3))
    """))
    # This interpreter has Cython and setuptools; PYTHONPATH puts the clean
    # environment's upcall first, and -S keeps an editable install's import
    # hook (a site start-up file) from coming before PYTHONPATH.
    paths = sysconfig.get_paths()
    run([sys.executable, "-S", "setup.py", "-q", "build_ext", "--inplace"], cwd=user,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([site, paths["purelib"], paths["platlib"]])},
        timeout=600)
    (user / "run.py").write_text(CIMPORT_RUN + "import uses_includes\nassert uses_includes.codes()[0] == 0 < uses_includes.codes()[1]\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = run([py, "run.py"], cwd=user, env=env, timeout=120)
    assert p.stdout.strip().endswith("ok")


def system_libzmq():
    """The system libzmq: its sonames in the loader's cache, and the files they resolve to."""
    sonames, files = set(), set()
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    for line in run([ldconfig, "-p"]).stdout.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.startswith("libzmq.so"):
            sonames.add(name.split()[0])
            files.add(os.path.realpath(path))
    libdir = subprocess.run(["pkg-config", "--variable=libdir", "libzmq"],
                            capture_output=True, text=True).stdout.strip()
    if libdir:
        files.update(os.path.realpath(p) for p in glob.glob(os.path.join(libdir, "libzmq.so*")))
    return sorted(sonames), sorted(files)


def test_self_contained_wheel_round_trip_without_system_libzmq(dist, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("hiding the system libzmq needs a mount namespace: root (CI runs as root)")
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("unshare --mount is unavailable: %s" % probe.stderr.strip())
    sonames, files = system_libzmq()
    assert sonames and files, "no system libzmq to hide: the test would prove nothing"

    py, site = clean_venv(tmp_path / "venv", dist["bundled"])
    # In a private mount namespace, /dev/null is bind-mounted over every system
    # libzmq file (the arguments before --), then the command after -- runs.
    hide = 'while [ "$1" != -- ]; do mount --bind /dev/null "$1"; shift; done; shift; exec "$@"'
    got = round_trip(py, tmp_path, wrap=["unshare", "--mount", "sh", "-ec", hide, "hide", *files, "--"],
                     hidden_sonames=sonames)
    assert got["upcall"].startswith(site + os.sep)
    # The one libzmq in the process is the wheel's own copy, in upcall.libs/.
    assert len(got["libzmq"]) == 1, got["libzmq"]
    assert os.path.dirname(got["libzmq"][0]) == os.path.join(site, "upcall.libs")


@pytest.mark.parametrize("missing, module", [("upcall/native.pyx", "native"),
                                             ("upcall/_trampoline.pxi", "_bus"),
                                             ("csrc/msgpack.c", "_codec"),
                                             ("upcall/_compat.h", "_codec")])
def test_build_fails_when_a_source_is_missing(dist, tmp_path, missing, module):
    # The sdist's build (meson setup, then the module's target) with one
    # source gone: it fails, naming the file, and leaves no module behind.
    with tarfile.open(dist["sdist"]) as t:
        # filter="data" (no links or paths out of the folder) where tarfile has
        # it: CPython 3.11.4 and 3.10.12 on; Debian 12's python3 is 3.11.2.
        t.extractall(tmp_path, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    src = next(tmp_path.glob("upcall-*"))
    os.remove(src / missing)
    bindir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ["PATH"]}
    out = tmp_path / "out"
    p = subprocess.run(["meson", "setup", str(out), str(src)], env=env,
                       capture_output=True, text=True, timeout=300)
    if p.returncode == 0:
        so = "upcall/%s%s" % (module, sysconfig.get_config_var("EXT_SUFFIX"))
        p = subprocess.run(["meson", "compile", "-C", str(out), so], env=env,
                           capture_output=True, text=True, timeout=600)
    assert p.returncode != 0
    assert os.path.basename(missing) in p.stdout + p.stderr
    assert not glob.glob(str(out / "upcall" / "*.so"))


def test_meson_build_lists_every_core_source():
    # meson.build lists sources by name (no globs): a C file or header added
    # to csrc/ and not listed would be left out of the modules or the wheel.
    with open(os.path.join(ROOT, "csrc", "meson.build")) as f:
        listed = set(re.findall(r"'([\w.]+\.[ch])'", f.read()))
    # The codecs' files: one per codec line of meson.options, which
    # csrc/meson.build compiles as codec_<name>.c.
    with open(os.path.join(ROOT, "meson.options")) as f:
        listed |= {"codec_%s.c" % name for name in
                   re.findall(r"^option\('(\w+)'.*compression codec:", f.read(), re.M)}
    assert {os.path.basename(p) for p in tree("csrc/*.c", "csrc/*.h")} - listed == set()
