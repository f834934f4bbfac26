"""An upcall built without its codecs' libraries (the build option
-D<codec>=disabled of every codec, as on a machine where pkg-config finds
none of their libraries): compression=<codec> is refused with a ValueError
naming the option and what the build lacks, a compressed frame from a peer
(tests/codecs_reference.py writes one of each codec) is a counted decode
error (oob_codec), and nothing else changes.

The bus module is built again from the same sources in a build directory of
its own (about a minute); the check runs in a child interpreter that imports
it, without site's start-up files (-S), so that no installed upcall (the
editable install's import hook) comes before it."""
import importlib
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import msgpack
import pytest

import upcall
from codecs_reference import REFERENCE

pytestmark = pytest.mark.build

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytest.importorskip("Cython")
BLOB = b"abc" * 10000

CHECK = textwrap.dedent("""
    import struct, threading
    import msgpack, zmq
    import upcall
    assert upcall.__file__.startswith(sys.argv[1]), upcall.__file__
    assert upcall.COMPRESSION == ()
    with open(sys.argv[2], "rb") as f:
        codecs, size = msgpack.unpackb(f.read())    # [name, library, wire id, frame]
    errors, got, ev = [], [], threading.Event()
    with upcall.Bus() as bus:
        for name, lib, _, _ in codecs:
            try:
                bus.publisher("inproc://p", compression=name, bind=True)
            except ValueError as exc:
                msg = str(exc)
                assert msg.startswith(f"compression={name!r} needs {lib}"), msg
                assert "built without" in msg and "this build has: none" in msg, msg
            else:
                raise AssertionError(f"compression={name!r} was accepted")
        sub = bus.subscribe("tcp://127.0.0.1:*", lambda m: (got.append(m), ev.set()),
                            kind="pull", bind=True, on_error=lambda e, raw: errors.append(e))
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.linger = 0
        push.connect(sub.last_endpoint)
        for _, _, codec, frame in codecs:
            ref = msgpack.ExtType(126, struct.pack(">BBHIQ", 1, codec, 0, 2, size))
            push.send_multipart([b"t", msgpack.packb([ref]), frame, upcall.WIRE_MARKER])
        push.send_multipart([b"t", msgpack.packb("ok")])
        assert ev.wait(30)
        assert got == ["ok"], got
        assert [(e.reason, e.offset) for e in errors] == [("oob_codec", 1)] * len(codecs), errors
        assert sub.stats["decode_errors"] == len(codecs)
        # Out-of-band values without compression still arrive.
        pub = bus.publisher(sub.last_endpoint, kind="push", bind=False, oob_threshold=4096)
        ev.clear()
        got.clear()
        pub.send(b"t", {"z": bytes(100_000)})
        assert ev.wait(30)
        assert got[0]["z"] == bytes(100_000)
        ctx.destroy(0)
    print("ok")
""")


# Past its subprocesses' own limits (900 s build, 120 s run).
@pytest.mark.timeout(900 + 120 + 60)
def test_built_without_the_codec_libraries(tmp_path):
    meson = shutil.which("meson", path=os.path.dirname(sys.executable)) or shutil.which("meson")
    if meson is None:
        pytest.skip("needs meson (make build installs it into .venv)")
    out = tmp_path / "build"
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    # -O1: what is checked is the behaviour without the codecs, not the
    # optimizer's output (the release build is the main run's); half the
    # compile time of -O3.
    codecs = [REFERENCE[name].load() for name in upcall.COMPRESSION]
    assert codecs, "this build has no codec to build without"
    setup = subprocess.run([meson, "setup", str(out), ROOT,
                            *("-D%s=disabled" % c.name for c in codecs), "-Doptimization=1",
                            "-Dpython.install_env=auto", "--native-file", str(_native_file(tmp_path))],
                           env=env, capture_output=True, text=True, timeout=300)
    assert setup.returncode == 0, setup.stdout[-4000:] + setup.stderr[-4000:]
    ext = sysconfig.get_config_var("EXT_SUFFIX")
    build = subprocess.run([meson, "compile", "-C", str(out), "upcall/_bus" + ext],
                           env=env, capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    # The package: its Python files, this build's bus module, and the other
    # modules (which do not link the C core) as the running build has them.
    pkg = tmp_path / "pkg" / "upcall"
    shutil.copytree(os.path.dirname(upcall.__file__), pkg,
                    ignore=shutil.ignore_patterns("*.so", "*.c", "*.html", "__pycache__", "meson.build"))
    shutil.copy(out / "upcall" / ("_bus" + ext), pkg)
    for mod in ("_codec", "handler", "native"):
        shutil.copy(importlib.import_module("upcall." + mod).__file__, pkg)
    script = tmp_path / "check.py"
    script.write_text("import sys\n" + CHECK)
    frames = tmp_path / "frames.msgpack"
    frames.write_bytes(msgpack.packb([[[c.name, c.library, c.wire_id, c.compress(BLOB)]
                                       for c in codecs], len(BLOB)]))
    paths = sysconfig.get_paths()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(pkg.parent), paths["purelib"], paths["platlib"]])
    run = subprocess.run([sys.executable, "-S", str(script), str(pkg), str(frames)], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), (run.stdout, run.stderr)


def _native_file(tmp_path):
    """Meson's native file naming this interpreter's Cython (the one the
    editable build uses), whatever PATH the test runs with."""
    cython = shutil.which("cython", path=os.path.dirname(sys.executable)) or shutil.which("cython")
    if cython is None:
        pytest.skip("needs Cython's command (make build installs it into .venv)")
    f = tmp_path / "native.ini"
    f.write_text("[binaries]\npython = %r\ncython = %r\n" % (sys.executable, cython))
    return f
