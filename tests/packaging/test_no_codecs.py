"""An upcall built without its codecs' libraries (setup.py's UPCALL_NO_LZ4=1
and UPCALL_NO_ZSTD=1, as on a machine where pkg-config finds neither liblz4
nor libzstd): compression="lz4" and compression="zstd" are refused with a
ValueError naming the option and what the build lacks, a compressed frame
from a peer is a counted decode error (oob_codec), and nothing else
changes.

The bus module is rebuilt in a copy of the sources (about a minute); the
check runs in a child interpreter that imports that copy."""
import glob
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import upcall

pytestmark = pytest.mark.build

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytest.importorskip("lz4.block")
pytest.importorskip("zstandard")
pytest.importorskip("Cython")

CHECK = textwrap.dedent("""
    import struct, threading
    import lz4.block, msgpack, zmq, zstandard
    import upcall
    assert upcall.__file__.startswith(sys.argv[1]), upcall.__file__
    assert upcall.COMPRESSION == ()
    errors, got, ev = [], [], threading.Event()
    with upcall.Bus() as bus:
        for name, lib in (("lz4", "liblz4"), ("zstd", "libzstd")):
            try:
                bus.publisher("inproc://p", compression=name)
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
        blob = b"abc" * 10000
        for codec, frame in ((1, lz4.block.compress(blob, store_size=False)),
                             (2, zstandard.ZstdCompressor().compress(blob))):
            ref = msgpack.ExtType(126, struct.pack(">BBHIQ", 1, codec, 0, 2, len(blob)))
            push.send_multipart([b"t", msgpack.packb([ref]), frame])
        push.send_multipart([b"t", msgpack.packb("ok")])
        assert ev.wait(30)
        assert got == ["ok"], got
        assert [(e.reason, e.offset) for e in errors] == [("oob_codec", 1)] * 2, errors
        assert sub.stats["decode_errors"] == 2
        # Out-of-band values without compression, as before.
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
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy(os.path.join(ROOT, name), src)
    shutil.copytree(os.path.join(ROOT, "csrc"), src / "csrc",
                    ignore=shutil.ignore_patterns("build", "fuzz", "tests"))
    shutil.copytree(os.path.join(ROOT, "upcall"), src / "upcall",
                    ignore=shutil.ignore_patterns("*.so", "*.c", "*.html", "__pycache__"))
    # The other modules do not link the C core: this build's own, as they are.
    pkg = os.path.dirname(upcall.__file__)
    for mod in ("_codec", "handler", "native"):
        for so in glob.glob(os.path.join(pkg, mod + ".*.so")):
            shutil.copy(so, src / "upcall")
    env = {**os.environ, "UPCALL_NO_LZ4": "1", "UPCALL_NO_ZSTD": "1", "UPCALL_ONLY": "upcall._bus"}
    build = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                           cwd=src, env=env, capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr[-4000:]
    script = tmp_path / "check.py"
    script.write_text("import sys\n" + CHECK)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "UPCALL_NO_LZ4", "UPCALL_NO_ZSTD")}
    env["PYTHONPATH"] = str(src)
    run = subprocess.run([sys.executable, str(script), str(src)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), (run.stdout, run.stderr)
