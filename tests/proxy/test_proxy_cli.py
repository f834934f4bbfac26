"""`upcall proxy FRONTEND BACKEND` in a subprocess, between an upcall
publisher and subscriber of this process: it forwards, says where it
listens, and stops cleanly (sockets closed, counts printed) on Ctrl-C
(status 130) and on SIGTERM (status 0)."""
import re
import signal
import subprocess
import sys

import pytest

import upcall
from helpers import DEADLINE, Collector, script_env

TIMEOUT = 60


def start_proxy(tmp_path, *args):
    return subprocess.Popen([sys.executable, "-m", "upcall", "proxy", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=script_env(), cwd=tmp_path)


def endpoints_of(proc):
    line = proc.stderr.readline()
    m = re.match(r"upcall proxy: frontend (\S+), backend (\S+)$", line.strip())
    assert m, f"unexpected first line {line!r}"
    return m.group(1), m.group(2)


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_proxy_command_forwards_and_stops_cleanly(tmp_path, sig, status):
    proc = start_proxy(tmp_path, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    try:
        front, back = endpoints_of(proc)
        with upcall.Bus() as bus:
            got = Collector()
            bus.subscribe(back, got, topics=[b"a"])
            pub = bus.publisher(front, bind=False)
            pub.wait_subscriptions(1, timeout=DEADLINE)
            pub.send(b"a", {"n": 1})
            got.wait(1)
            assert got.items == [{"n": 1}]
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == status, err
        assert out == ""
        assert err.strip() == ("upcall proxy: stopped; forwarded 1 messages "
                               f"({len(b'a') + len(upcall.packb({'n': 1}))} bytes), "
                               "1 subscription messages")
    finally:
        proc.kill()
        proc.wait()


def test_proxy_command_refuses_inproc(tmp_path):
    r = subprocess.run([sys.executable, "-m", "upcall", "proxy", "inproc://a", "tcp://127.0.0.1:*"],
                       capture_output=True, text=True, env=script_env(), cwd=tmp_path,
                       timeout=TIMEOUT)
    assert r.returncode == 2
    assert "inproc://" in r.stderr


def test_proxy_command_address_in_use_is_one_line(tmp_path):
    with upcall.Bus() as bus:
        pub = bus.publisher("tcp://127.0.0.1:*", bind=True)
        r = subprocess.run([sys.executable, "-m", "upcall", "proxy", pub.last_endpoint,
                            "tcp://127.0.0.1:*"], capture_output=True, text=True,
                           env=script_env(), cwd=tmp_path, timeout=TIMEOUT)
    assert r.returncode == 1
    assert r.stderr.startswith("upcall proxy: ") and r.stderr.count("\n") == 1, r.stderr


def test_proxy_command_curve_certificates(tmp_path):
    upcall.create_certificates(tmp_path, "server")
    upcall.create_certificates(tmp_path, "client")
    server = upcall.load_certificate(tmp_path / "server.key_secret")
    client = upcall.load_certificate(tmp_path / "client.key_secret")
    proc = start_proxy(tmp_path, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*",
                       "--backend-curve", str(tmp_path / "server.key_secret"),
                       "--backend-allow", str(tmp_path / "client.key"))
    try:
        front, back = endpoints_of(proc)
        with upcall.Bus() as bus:
            got = Collector()
            bus.subscribe(back, got, curve_serverkey=server.public, curve_client=client)
            pub = bus.publisher(front, bind=False)
            pub.wait_subscriptions(1, timeout=DEADLINE)
            pub.send(b"", "ok")
            got.wait(1)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_proxy_command_stops_cleanly_on_a_signal_right_after_it_starts(tmp_path, sig, status):
    """The signal sent the moment the command says where it listens (a
    script's first chance): still a clean stop with its counts, every time
    (the announcement once ran outside the part that turns a signal into
    a clean stop, so a signal during it escaped as a traceback)."""
    for _ in range(20):
        proc = start_proxy(tmp_path, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
        try:
            endpoints_of(proc)
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=TIMEOUT)
            assert proc.returncode == status, err
            assert (out, err.strip()) == ("", "upcall proxy: stopped; forwarded 0 messages "
                                              "(0 bytes), 0 subscription messages")
        finally:
            proc.kill()
            proc.wait()
