"""Certificate files in the format of CZMQ's zcert and pyzmq's zmq.auth:
written by one, read by the other, used across processes; secret keys never
in reprs, logs or exception texts; `upcall keygen`."""
import logging
import os
import stat
import subprocess
import sys
import textwrap

import pytest

import upcall
from helpers import script_env, wait_for

zmq = pytest.importorskip("zmq")
zauth = pytest.importorskip("zmq.auth")

if not zmq.has("curve"):
    pytest.skip("libzmq without CURVE support", allow_module_level=True)


def test_pyzmq_certificates_read_by_upcall(tmp_path):
    pub_path, sec_path = zauth.create_certificates(str(tmp_path), "server",
                                                   metadata={"role": "collector"})
    public, secret = zauth.load_certificate(sec_path)
    cert = upcall.load_certificate(sec_path)
    assert cert.public == public.decode() and cert.secret == secret.decode()
    assert cert.metadata == {"role": "collector"}
    only_public = upcall.load_certificate(pub_path)
    assert only_public.public == public.decode() and only_public.secret is None
    # pyzmq writes a directory's public certificates; upcall reads them as a list.
    for name in ("a", "b"):
        zauth.create_certificates(str(tmp_path), name)
    assert {c.public for c in upcall.load_certificates(tmp_path)} == {
        k.decode() for k in zauth.load_certificates(str(tmp_path))}


def test_upcall_certificates_read_by_pyzmq(tmp_path):
    pub_path, sec_path = upcall.create_certificates(tmp_path, "client", {"host": "h1"})
    assert pub_path.endswith("client.key") and sec_path.endswith("client.key_secret")
    assert stat.S_IMODE(os.stat(sec_path).st_mode) == 0o600
    public, secret = zauth.load_certificate(sec_path)
    assert zmq.curve_public(secret) == public
    assert zauth.load_certificate(pub_path) == (public, None)
    assert list(zauth.load_certificates(str(tmp_path))) == [public]


def test_secret_file_is_owner_only_even_when_replaced(tmp_path):
    path = tmp_path / "x.key_secret"
    path.write_text("old")
    os.chmod(path, 0o644)
    cert = upcall.Certificate(*upcall.curve_keypair())
    cert.save(tmp_path, "x", overwrite=True)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


SERVER_SCRIPT = textwrap.dedent("""
    import sys, upcall
    from helpers import wait_for
    certs, server_secret_file = sys.argv[1], sys.argv[2]
    server = upcall.load_certificate(server_secret_file)
    got = []
    with upcall.Bus() as bus:
        sub = bus.subscribe("tcp://127.0.0.1:*", lambda m, s: got.append((m, s)), kind="pull",
                            bind=True, curve_server=server, allow=upcall.load_certificates(certs),
                            with_sender=True)
        print(sub.last_endpoint, flush=True)
        wait_for(lambda: len(got) == 1)
    print(got[0][0], got[0][1], flush=True)
""")


def test_certificates_across_ecosystems(tmp_path):
    """An upcall collector whose key pair and allow-list are pyzmq-written
    certificate files; a pyzmq client whose key pair is an upcall-written
    one, allowed because its public certificate sits in the directory."""
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    _, server_secret = zauth.create_certificates(str(tmp_path), "server")
    _, client_secret = upcall.create_certificates(tmp_path, "client")
    upcall.load_certificate(client_secret).save(allowed, "client")   # public only
    zauth.create_certificates(str(allowed), "other")
    proc = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT, str(allowed), server_secret],
                            stdout=subprocess.PIPE, text=True, env=script_env(),
                            cwd=str(tmp_path))
    try:
        endpoint = proc.stdout.readline().strip()
        ctx = zmq.Context()
        s = ctx.socket(zmq.PUSH)
        s.linger = 0
        s.curve_publickey, s.curve_secretkey = zauth.load_certificate(client_secret)
        s.curve_serverkey = zauth.load_certificate(server_secret)[0]
        s.connect(endpoint)
        import msgpack
        s.send_multipart([b"", msgpack.packb("hello")])
        out = proc.stdout.readline().split()
        assert proc.wait(30) == 0
        ctx.destroy()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out == ["hello", zauth.load_certificate(client_secret)[0].decode()]


# ---- secret keys stay secret ---------------------------------------------------

def test_no_secret_in_reprs():
    public, secret = upcall.curve_keypair()
    cert = upcall.Certificate(public, secret)
    for text in (repr(cert), str(cert), repr([cert]), f"{cert}"):
        assert secret not in text and public in text
    with upcall.Bus() as bus:
        auth = bus.authenticator()
        pub = bus.publisher("tcp://127.0.0.1:*", curve_server=cert, allow=[public], bind=True)
        for text in (repr(bus), repr(auth), repr(pub)):
            assert secret not in text


def test_no_secret_in_exceptions(tmp_path):
    public, secret = upcall.curve_keypair()
    # A character outside Z85 in a secret key: the error names its position only.
    bad = secret[:7] + "~" + secret[8:]
    with pytest.raises(ValueError) as info:
        upcall.Certificate(public, bad)
    assert "position 7" in str(info.value)
    assert bad not in str(info.value) and "'~'" not in str(info.value)
    with upcall.Bus() as bus, pytest.raises(ValueError) as info:
        bus.publisher("tcp://127.0.0.1:*", curve_server=(public, bad), bind=True)
    assert "'~'" not in str(info.value) and bad not in str(info.value)
    # A secret key that is not the public key's: no key in the text.
    other = upcall.curve_keypair()[1]
    with pytest.raises(ValueError) as info:
        upcall.Certificate(public, other)
    assert other not in str(info.value)
    # A certificate file with a broken secret key: the file is named, not the key.
    path = tmp_path / "broken.key_secret"
    path.write_text(f'curve\n    public-key = "{public}"\n    secret-key = "{bad}"\n')
    with pytest.raises(ValueError) as info:
        upcall.load_certificate(path)
    assert "broken.key_secret" in str(info.value) and bad not in str(info.value)
    assert "'~'" not in str(info.value)
    with pytest.raises(ValueError, match="no public-key"):
        (tmp_path / "empty.key").write_text("# nothing\n")
        upcall.load_certificate(tmp_path / "empty.key")
    with pytest.raises(ValueError, match="holds no secret key"):
        upcall.Certificate(public).pair


def test_no_secret_in_logs(caplog):
    """Refusals are logged with the refused client's public key; neither the
    server's nor any client's secret key appears in any record."""
    caplog.set_level(logging.DEBUG)
    server = upcall.curve_keypair()
    client = zmq.curve_keypair()
    with upcall.Bus() as bus:
        sub = bus.subscribe("tcp://127.0.0.1:*", print, kind="pull", bind=True,
                            curve_server=server, allow=[upcall.curve_keypair()[0]])
        auth = bus.authenticator()
        ctx = zmq.Context()
        s = ctx.socket(zmq.PUSH)
        s.linger = 0
        s.curve_publickey, s.curve_secretkey = client
        s.curve_serverkey = server[0].encode()
        s.connect(sub.last_endpoint)
        wait_for(lambda: auth.stats["refused_key"] >= 1)
        wait_for(lambda: any(hasattr(r, "auth_cause") for r in caplog.records))
        ctx.destroy()
    text = "\n".join(r.getMessage() + repr(r.__dict__) for r in caplog.records)
    assert client[0].decode() in text
    assert server[1] not in text and client[1].decode() not in text


# ---- upcall keygen --------------------------------------------------------------

def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "upcall", *args], capture_output=True,
                          text=True, env=script_env(), cwd=cwd, timeout=60)


def test_keygen(tmp_path):
    r = run_cli("keygen", "node1", "--dir", str(tmp_path), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    pub, sec = tmp_path / "node1.key", tmp_path / "node1.key_secret"
    assert stat.S_IMODE(os.stat(sec).st_mode) == 0o600
    public, secret = zauth.load_certificate(str(sec))
    assert zauth.load_certificate(str(pub)) == (public, None)
    assert zmq.curve_public(secret) == public
    assert public.decode() in r.stdout
    assert secret.decode() not in r.stdout + r.stderr
    # Never over an existing pair, unless asked.
    again = run_cli("keygen", "node1", "--dir", str(tmp_path), cwd=str(tmp_path))
    assert again.returncode == 1 and "exists" in again.stderr
    assert zauth.load_certificate(str(sec)) == (public, secret)
    forced = run_cli("keygen", "node1", "--dir", str(tmp_path), "--force", cwd=str(tmp_path))
    assert forced.returncode == 0
    assert zauth.load_certificate(str(sec)) != (public, secret)
    bad = run_cli("keygen", "a/b", cwd=str(tmp_path))
    assert bad.returncode == 2 and "NAME" in bad.stderr


# ---- a module of their own --------------------------------------------------

STANDALONE_SCRIPT = textwrap.dedent("""
    import importlib.abc, importlib.util, sys
    class NoExtension(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.startswith("upcall") or name == "zmq":
                raise ImportError(f"{name} is blocked")
    sys.meta_path.insert(0, NoExtension())
    spec = importlib.util.spec_from_file_location("certs", sys.argv[1])
    certs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(certs)
    cert = certs.load_certificate(sys.argv[2])
    print(cert.public, len(certs.load_certificates(sys.argv[3])))
""")


def test_certificate_files_need_no_extension(tmp_path):
    """upcall/certs.py loads and reads public certificates with upcall's
    extension (and every other upcall module) unimportable."""
    public_path, _ = upcall.create_certificates(tmp_path, "node")
    r = subprocess.run([sys.executable, "-c", STANDALONE_SCRIPT, upcall.certs.__file__,
                        public_path, str(tmp_path)],
                       capture_output=True, text=True, env=script_env(), timeout=60,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [upcall.load_certificate(public_path).public, "1"]


# ---- links, existing files and special files -------------------------------

def test_keygen_never_writes_through_a_link(tmp_path):
    """A dangling link at NAME.key_secret (pointing where an attacker wants
    the secret key): refused without --force, replaced itself (never its
    target written) with it."""
    target = tmp_path / "elsewhere" / "stolen"
    target.parent.mkdir()
    (tmp_path / "node.key_secret").symlink_to(target)
    r = run_cli("keygen", "node", "--dir", str(tmp_path), cwd=str(tmp_path))
    assert r.returncode == 1 and "exists" in r.stderr, r.stderr
    assert not target.exists() and not (tmp_path / "node.key").exists()
    forced = run_cli("keygen", "node", "--dir", str(tmp_path), "--force", cwd=str(tmp_path))
    assert forced.returncode == 0, forced.stderr
    assert not target.exists()
    sec = tmp_path / "node.key_secret"
    assert not sec.is_symlink() and stat.S_IMODE(os.lstat(sec).st_mode) == 0o600
    public, secret = zauth.load_certificate(str(sec))
    assert zmq.curve_public(secret) == public
    assert sorted(os.listdir(tmp_path)) == ["elsewhere", "node.key", "node.key_secret"]


def test_keygen_refuses_an_existing_public_file(tmp_path):
    (tmp_path / "node.key").write_text("mine")
    r = run_cli("keygen", "node", "--dir", str(tmp_path), cwd=str(tmp_path))
    assert r.returncode == 1 and "node.key exists" in r.stderr
    assert (tmp_path / "node.key").read_text() == "mine"
    assert not (tmp_path / "node.key_secret").exists()


def test_save_refuses_to_overwrite_unless_asked(tmp_path):
    cert = upcall.Certificate(*upcall.curve_keypair())
    cert.save(tmp_path, "x")
    other = upcall.Certificate(*upcall.curve_keypair())
    with pytest.raises(FileExistsError, match="x.key"):
        other.save(tmp_path, "x")
    assert upcall.load_certificate(tmp_path / "x.key_secret") == cert
    with pytest.raises(FileExistsError):
        upcall.create_certificates(tmp_path, "x")
    other.save(tmp_path, "x", overwrite=True)
    assert upcall.load_certificate(tmp_path / "x.key_secret") == other
    assert sorted(os.listdir(tmp_path)) == ["x.key", "x.key_secret"]


LOAD_SCRIPT = textwrap.dedent("""
    import pathlib, sys, upcall
    d = pathlib.Path(sys.argv[1])
    for load in (lambda: upcall.load_certificates(d), lambda: upcall.load_certificate(d / "x.key"),
                 lambda: upcall.Bus().subscribe("tcp://127.0.0.1:*", print, kind="pull",
                                                bind=True, curve_server=upcall.curve_keypair(),
                                                allow=d)):
        try:
            load()
            print("loaded")
        except ValueError as exc:
            print("refused", "x.key" in str(exc) and "regular file" in str(exc))
""")


@pytest.mark.parametrize("special", ["fifo", "directory"])
def test_certificate_loading_reads_regular_files_only(tmp_path, special):
    """A FIFO (or a directory) named x.key: a ValueError naming it, from
    load_certificates(), load_certificate() and allow=Path(dir), never a
    read that waits for a writer (run in a process of its own, so that a
    block fails this test instead of hanging the run)."""
    upcall.create_certificates(tmp_path, "good")
    if special == "fifo":
        os.mkfifo(tmp_path / "x.key")
    else:
        (tmp_path / "x.key").mkdir()
    try:
        r = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(tmp_path)],
                           capture_output=True, text=True, env=script_env(), timeout=60,
                           cwd=str(tmp_path))
    except subprocess.TimeoutExpired:
        pytest.fail("loading a certificate directory with a FIFO in it blocked")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == ["refused True"] * 3, r.stdout + r.stderr
