"""A user's Cython extension cimports upcall.Handler / NativeHandler, is built
the way a downstream user builds it, and receives real messages over tcp."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import upcall

pytest.importorskip("Cython")

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # tests/

SETUP = textwrap.dedent("""
    import os
    import upcall
    from setuptools import Extension, setup
    from Cython.Build import cythonize

    ext = Extension("my_handlers", ["my_handlers.pyx"], include_dirs=upcall.get_include())
    setup(name="my_handlers", ext_modules=cythonize(
        [ext], language_level=3,
        # upcall's .pxd files: found on sys.path for an installed upcall; an
        # editable install may not put the package's parent on sys.path.
        include_path=[os.path.dirname(os.path.dirname(upcall.__file__))]))
""")

RUN = textwrap.dedent("""
    import time
    import upcall
    from my_handlers import Above, Collect

    def wait_for(pred, timeout=30.0):
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.005)

    with upcall.Bus() as bus:
        c = Collect()
        assert isinstance(c, upcall.Handler)
        sub = bus.subscribe("tcp://127.0.0.1:*", c, kind="pull", bind=True)
        pub = bus.publisher(sub.last_endpoint, kind="push", bind=False)
        for i in range(100):
            pub.send(b"t", {"i": i})
        wait_for(lambda: len(c.got) == 100)
        assert c.got == [{"i": i} for i in range(100)]

        picked = []
        a = Above(150.0, target=picked.append)
        sub2 = bus.subscribe("tcp://127.0.0.1:*", a, kind="pull", bind=True)
        pub2 = bus.publisher(sub2.last_endpoint, kind="push", bind=False)
        for i in range(300):
            pub2.send(b"t", {"px": float(i), "i": i})
        wait_for(lambda: a.seen == 300)
        wait_for(lambda: len(picked) == 149)
        assert [m["i"] for m in picked] == list(range(151, 300))
        # what reached the target is delivered, what select() passed over filtered
        wait_for(lambda: sub2.stats["delivered"] == 149)
        assert sub2.stats["filtered"] == 151
    print("ok")
""")


# Past its subprocesses' own limits (600 s build, 120 s run).
@pytest.mark.build
@pytest.mark.timeout(600 + 120 + 60)
def test_cimport_handler_builds_and_receives(tmp_path):
    shutil.copy(os.path.join(HERE, "cimport_example", "my_handlers.pyx"), tmp_path)
    (tmp_path / "setup.py").write_text(SETUP)
    (tmp_path / "run.py").write_text(RUN)
    env = dict(os.environ)
    pkg_parent = os.path.dirname(os.path.dirname(upcall.__file__))
    env["PYTHONPATH"] = os.pathsep.join([pkg_parent, env.get("PYTHONPATH", "")])
    build = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout + build.stderr
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    run = subprocess.run([sys.executable, "run.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().endswith("ok")


def test_headers_and_pxd_are_shipped():
    # An installed wheel: one directory, upcall/includes; the editable install
    # (a source checkout): upcall/includes and where the headers are kept.
    dirs = upcall.get_include()
    for name in ("bus.h", "msgpack.h", "split.h", "wire.h", "bus.pxd", "msgpack.pxd"):
        assert [d for d in dirs if os.path.exists(os.path.join(d, name))], (name, dirs)
    pkg = os.path.dirname(upcall.__file__)
    for name in ("handler.pxd", "native.pxd"):
        assert os.path.exists(os.path.join(pkg, name)), name
