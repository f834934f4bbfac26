"""The portable wheels (`make wheels`): one per supported CPython found here,
tagged manylinux_2_28, bundling one lean libzmq, and working in an older
distribution root.

Build-heavy (minutes the first time: libsodium, libzmq, a CPython for the
root; cached in ~/.cache/upcall-portable after that), so marked `portable`
and left out of the default run: `make test-wheels` runs it.
UPCALL_PORTABLE_WHEELS=DIR takes the wheels already built there instead of
building them.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest

import upcall
from codecs_reference import REFERENCE

pytestmark = [pytest.mark.portable, pytest.mark.timeout(3600)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAT = "manylinux_2_28_x86_64"
MAX_GLIBC = (2, 28)
# What a manylinux wheel may take from the system (PEP 600's list for x86_64).
# The codecs' libraries by their file names' start (liblz4, libzstd).
CODEC_LIBRARIES = tuple(r.library for r in REFERENCE.values())
SYSTEM_LIBS = {"libc.so.6", "libm.so.6", "libpthread.so.0", "librt.so.1", "libdl.so.2",
               "ld-linux-x86-64.so.2", "libgcc_s.so.1", "libstdc++.so.6"}


def run(cmd, **kw):
    kw.setdefault("timeout", 3000)
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert p.returncode == 0, "%s\n--- stdout\n%s\n--- stderr\n%s" % (cmd, p.stdout[-4000:], p.stderr[-4000:])
    return p


def supported_cpythons():
    """The minor versions the build script finds: pyenv's CPython >= 3.10."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = set()
    for d in glob.glob(os.path.join(root, "versions", "3.*")):
        m = re.fullmatch(r"3\.(\d+)\.\d+", os.path.basename(d))
        if m and int(m.group(1)) >= 10 and os.access(os.path.join(d, "bin", "python3"), os.X_OK):
            found.add("cp3%s" % m.group(1))
    return found


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    given = os.environ.get("UPCALL_PORTABLE_WHEELS")
    if given:
        out = given
    else:
        out = str(tmp_path_factory.mktemp("portable"))
        run([os.path.join(ROOT, "tools", "build-portable-wheels.sh"), out], cwd=ROOT)
    found = sorted(glob.glob(os.path.join(out, "upcall-*.whl")))
    assert found, "no wheels in %s" % out
    return found


def unpack(whl, dest):
    with zipfile.ZipFile(whl) as z:
        z.extractall(dest)
    return dest


def needed_and_glibc(path):
    """(DT_NEEDED sonames, highest GLIBC_x.y symbol version) of an ELF file."""
    dyn = run(["readelf", "-d", "-W", path]).stdout
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn))
    syms = run(["readelf", "-V", "-W", path]).stdout
    versions = {tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_(\d+\.\d+(?:\.\d+)?)", syms)}
    return needed, max(versions, default=(0,))


def test_one_wheel_per_supported_cpython(wheels):
    tags = {os.path.basename(w).split("-")[2] for w in wheels}
    assert supported_cpythons(), "no CPython >= 3.10 under pyenv: nothing to check"
    assert tags == supported_cpythons()


def test_tag_and_bundled_libraries(wheels, tmp_path):
    tools_py = os.path.join(os.environ.get("UPCALL_PORTABLE_CACHE", os.path.expanduser("~/.cache/upcall-portable")),
                            "tools", "bin", "python")
    for whl in wheels:
        # auditwheel names every policy the binaries meet: manylinux_2_28 and,
        # where no symbol needs more, older ones too (2_26 today); none newer.
        plats = os.path.basename(whl)[:-len(".whl")].split("-")[-1].split(".")
        assert PLAT in plats, whl
        for p in plats:
            m = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", p)
            assert m and (int(m.group(1)), int(m.group(2))) <= MAX_GLIBC, whl
        if os.access(tools_py, os.X_OK):
            show = run([tools_py, "-m", "auditwheel", "show", whl]).stdout
            m = re.search(r'platform tag:\s+"manylinux_(\d+)_(\d+)_x86_64"', show)
            assert m and (int(m.group(1)), int(m.group(2))) <= MAX_GLIBC, show
        d = unpack(whl, tmp_path / os.path.basename(whl))
        libs = sorted(os.listdir(d / "upcall.libs"))
        # One library: libzmq (libsodium for CURVE is linked into it, the
        # codecs' libraries into the extension module).
        assert len(libs) == 1 and libs[0].startswith("libzmq-"), libs
        for so in [d / "upcall.libs" / libs[0], *sorted((d / "upcall").glob("*.so"))]:
            needed, glibc = needed_and_glibc(str(so))
            assert glibc <= MAX_GLIBC, (so.name, glibc)
            assert needed - SYSTEM_LIBS <= {libs[0]}, (so.name, needed)
            # No krb5/gssapi, pgm, norm, libbsd, libsodium or a codec's library
            # as a separate one.
            assert not [n for n in needed if re.match(r"lib(gssapi|krb5|pgm|norm|bsd|sodium)", n)
                        or n.startswith(CODEC_LIBRARIES)]


ROUND_TRIP = textwrap.dedent("""
    import json, os, sys, time
    import upcall

    def wait_for(pred, timeout=30.0):
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.005)

    msgs = [{"i": i, "name": "n" * (i % 7), "raw": bytes([i]) * 300} for i in range(100)]
    # Compressible values over the threshold, so that the codec is used.
    msgs += [{"i": i, "text": b"the quick brown fox " * 2000} for i in range(100, 110)]
    report = {"glibc": os.confstr("CS_GNU_LIBC_VERSION"), "upcall": upcall.__file__,
              "compression": list(upcall.COMPRESSION)}
    public, secret = upcall.curve_keypair()
    for case in ["plain"] + ["curve+" + c for c in upcall.COMPRESSION]:
        got = []
        with upcall.Bus() as bus:
            sub = bus.subscribe("tcp://127.0.0.1:*", got.append, kind="pull", bind=True,
                                **({} if case == "plain" else {"curve_server": (public, secret)}))
            pkw = ({} if case == "plain" else
                   {"curve_serverkey": public, "compression": case.split("+")[1]})
            pub = bus.publisher(sub.last_endpoint, kind="push", bind=False, **pkw)
            for m in msgs:
                pub.send(b"t", m)
            wait_for(lambda: len(got) == len(msgs))
        assert got == msgs, case
        report[case] = len(got)
    with open("/proc/self/maps") as f:
        report["libzmq"] = sorted({l.split()[-1] for l in f if "libzmq" in l})
    print(json.dumps(report))
""")


def test_round_trip_in_an_older_distribution_root(wheels, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("debootstrap and chroot need root")
    rootfs = run([os.path.join(ROOT, "tools", "older-root.sh")], cwd=ROOT).stdout.strip().splitlines()[-1]
    # The root's Python is 3.11: its wheel, unpacked by this machine's pip
    # (the root's Python has no zlib).
    whl = [w for w in wheels if "-cp311-" in os.path.basename(w)]
    assert whl, "no cp311 wheel"
    site = os.path.join(rootfs, "opt", "upcall-site")
    shutil.rmtree(site, ignore_errors=True)
    run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
         "--target", site, whl[0]], cwd=str(tmp_path))
    with open(os.path.join(rootfs, "opt", "round_trip.py"), "w") as f:
        f.write(ROUND_TRIP)
    # In a private mount namespace: /proc for the root, then chroot.
    inner = ('mount -t proc proc "$1/proc" && exec chroot "$1" env -i PYTHONPATH=/opt/upcall-site '
             '/opt/python3.11/bin/python3.11 /opt/round_trip.py')
    p = run(["unshare", "--mount", "--fork", "sh", "-ec", inner, "sh", rootfs], cwd=str(tmp_path), timeout=300)
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["glibc"] == "glibc 2.31", got
    # Every codec of the source build, in the wheel too.
    assert got["compression"] == list(upcall.COMPRESSION), got
    assert [got[k] for k in ["plain"] + ["curve+" + c for c in upcall.COMPRESSION]] == \
        [110] * (1 + len(upcall.COMPRESSION)), got
    assert got["upcall"].startswith("/opt/upcall-site/upcall/")
    assert len(got["libzmq"]) == 1 and got["libzmq"][0].startswith("/opt/upcall-site/upcall.libs/libzmq-"), got
