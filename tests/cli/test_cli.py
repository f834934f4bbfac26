"""The command line (upcall/cli.py): ``python -m upcall`` and the ``upcall``
script in subprocesses, against real pyzmq peers (their own zmq context, in
this process), in both directions, and each of its error cases.

The pyzmq peer that publishes is an XPUB socket: it reads the subscription
`upcall listen` sends, so it knows when to send without losing the first
message (the slow joiner), with no sleeping.
"""
import argparse
import base64
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import msgpack
import pytest
import zmq

import upcall
from upcall import cli
import upcall._jsonmap as jsonmap
from upcall._codec import DEFAULT_MAX_DEPTH
from upcall._jsonmap import from_json, to_json, topic_to_json
from helpers import DEADLINE, TESTS_DIR, free_tcp_port, script_env

TIMEOUT = 60


def upcall_cmd(*args):
    return [sys.executable, "-m", "upcall", *args]


def run(*args, input=None, cwd=None):
    return subprocess.run(upcall_cmd(*args), input=input, capture_output=True, text=True,
                          env=script_env(), cwd=cwd, timeout=TIMEOUT)


def start(*args, tmp_path, env=None):
    return subprocess.Popen(upcall_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=script_env(**(env or {})), cwd=tmp_path)


def finish(proc):
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"still running after {TIMEOUT} s; stdout={out!r} stderr={err!r}")
    return proc.returncode, out, err


def run_serving(sock, *args, input=None, cwd=None, env=None):
    """Run the command while this process keeps ``sock`` serviced.

    libzmq attaches a connection to a bound socket, and a SUB sends its
    subscriptions to it, only when the application calls into the socket: a
    pyzmq SUB left alone would never let the command see a subscriber.  A
    real subscriber receives; here a poll does it, leaving the messages
    queued for the test to read afterwards.  ``input``: str, or bytes as
    they are, read from a file (a pipe would fill up while the command
    waits for its subscriber before reading)."""
    with tempfile.TemporaryFile() as stdin:
        stdin.write(b"" if input is None else input.encode() if isinstance(input, str) else input)
        stdin.seek(0)
        proc = subprocess.Popen(upcall_cmd(*args), stdin=stdin, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=script_env(**(env or {})), cwd=cwd)
    try:
        deadline = time.monotonic() + TIMEOUT
        while proc.poll() is None and time.monotonic() < deadline:
            sock.poll(20)
        status, out, err = finish(proc)
    finally:
        proc.kill()
        proc.wait()
    return subprocess.CompletedProcess(proc.args, status, out.decode(), err.decode())


def one_error_line(err, command):
    """A failure says one line on stderr, naming the command, no traceback."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"upcall {command}: "), err
    return lines[0]


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def peer(ctx, kind, subscribe=None):
    s = ctx.socket(kind)
    s.linger = 0
    s.rcvtimeo = int(DEADLINE * 1000)
    s.sndtimeo = int(DEADLINE * 1000)
    if subscribe is not None:
        s.setsockopt(zmq.SUBSCRIBE, subscribe)
    return s


def tcp():
    return f"tcp://127.0.0.1:{free_tcp_port()}"


def wait_subscription(xpub, prefix):
    """Read subscription messages until ``prefix`` is subscribed."""
    while True:
        msg = xpub.recv()
        if msg == b"\x01" + prefix:
            return


def unpack(payload):
    return msgpack.unpackb(payload, strict_map_key=False, timestamp=0)


def nested(depth, leaf=0):
    """``depth`` arrays, one inside the other, around ``leaf``."""
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def nested_json(depth, leaf="0"):
    return "[" * depth + leaf + "]" * depth


def nested_msgpack(depth):
    """nested(depth) packed by hand: msgpack.packb stops at 511 levels."""
    return b"\x91" * depth + b"\x00"


# A topic that is not UTF-8, as a command line argument: subprocess passes
# os.fsencode() of it, these very bytes.
NOT_UTF8_TOPIC = b"t\xff"


# ---- the command itself ---------------------------------------------------------

def test_version(tmp_path):
    proc = run("--version", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"upcall {upcall.__version__} ")


def test_console_script(tmp_path):
    script = os.path.join(os.path.dirname(sys.executable), "upcall")
    if not os.path.exists(script):
        pytest.skip("the upcall console script is not installed next to this interpreter")
    proc = subprocess.run([script, "--version"], capture_output=True, text=True,
                          env=script_env(), cwd=tmp_path, timeout=TIMEOUT)
    assert proc.returncode == 0 and proc.stdout.startswith("upcall "), proc


@pytest.mark.parametrize("command", [[], ["listen"], ["publish"], ["bench"]],
                         ids=["top", "listen", "publish", "bench"])
def test_help_everywhere(tmp_path, command):
    proc = run(*command, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: "), proc.stdout
    if command in ([], ["listen"], ["publish"]):
        assert '"$bytes"' in proc.stdout      # the JSON mapping is documented there


def test_no_command_is_a_usage_error(tmp_path):
    proc = run(cwd=tmp_path)
    assert proc.returncode == 2
    assert "usage: upcall" in proc.stderr and "Traceback" not in proc.stderr


# ---- listen ---------------------------------------------------------------------

def test_listen_to_a_pyzmq_publisher(ctx, tmp_path):
    """--topic filters (two prefixes), --count ends it, every type shows."""
    xpub = peer(ctx, zmq.XPUB)
    ep = tcp()
    xpub.bind(ep)
    proc = start("listen", ep, "--topic", "a.", "--topic", "c.", "--count", "3",
                 tmp_path=tmp_path)
    try:
        wait_subscription(xpub, b"a.")
        wait_subscription(xpub, b"c.")
        ts = msgpack.Timestamp(1700000000, 5)
        payloads = [
            {"px": 187.25, "qty": 100, "ok": True, "none": None, "s": "é"},
            [b"\x00\xff", 1.0, math.inf, msgpack.ExtType(5, b"hi"), ts, {1: "one"}],
            "third",
            "not wanted",
        ]
        xpub.send_multipart([b"b.skipped", msgpack.packb("filtered out")])
        xpub.send_multipart([b"a.1", msgpack.packb(payloads[0])])
        xpub.send_multipart([b"c.\xff", msgpack.packb(payloads[1], datetime=False)])
        xpub.send_multipart([b"a.3", msgpack.packb(payloads[2])])
        xpub.send_multipart([b"a.4", msgpack.packb(payloads[3])])
        status, out, err = finish(proc)
    finally:
        proc.kill()
        proc.wait()
    assert (status, err) == (0, ""), err
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines == [
        {"topic": "a.1", "payload": {"px": 187.25, "qty": 100, "ok": True, "none": None,
                                     "s": "é"}},
        {"topic": {"$bytes": "Yy7/"},
         "payload": [{"$bytes": "AP8="}, 1.0, {"$float": "inf"}, {"$ext": [5, "aGk="]},
                     {"$timestamp": "2023-11-14T22:13:20.000000005Z"},
                     {"$map": [[1, "one"]]}]},
        {"topic": "a.3", "payload": "third"},
    ]
    assert out.splitlines()[1].split('"payload": ')[1].startswith('[{"$bytes": "AP8="}, 1.0,')


def dash_keypair():
    """A CURVE key pair whose public key starts with '-' (Z85 allows it:
    about one in 85 does)."""
    while True:
        public, secret = zmq.curve_keypair()
        if public.startswith(b"-"):
            return public, secret


@pytest.mark.parametrize("keys", [zmq.curve_keypair, dash_keypair], ids=["any", "dash"])
def test_listen_curve(ctx, tmp_path, keys):
    public, secret = keys()
    xpub = peer(ctx, zmq.XPUB)
    xpub.curve_server = True
    xpub.curve_publickey, xpub.curve_secretkey = public, secret
    ep = tcp()
    xpub.bind(ep)
    proc = start("listen", ep, "--curve-serverkey", public.decode(), "--count", "1",
                 tmp_path=tmp_path)
    try:
        wait_subscription(xpub, b"")      # only after the CURVE handshake
        xpub.send_multipart([b"s", msgpack.packb("secret")])
        status, out, err = finish(proc)
    finally:
        proc.kill()
        proc.wait()
    assert (status, err) == (0, "")
    assert json.loads(out) == {"topic": "s", "payload": "secret"}


@pytest.mark.parametrize("command", ["listen", "publish"])
def test_bad_curve_key(tmp_path, command):
    proc = run(command, tcp(), "--curve-serverkey", "short",
               *(["1"] if command == "publish" else []), cwd=tmp_path)
    assert proc.returncode == 1
    assert "curve_serverkey" in one_error_line(proc.stderr, command)


def test_listen_pull_bound(ctx, tmp_path):
    ep = tcp()
    proc = start("listen", ep, "--bind", "--kind", "pull", "--count", "2", tmp_path=tmp_path)
    try:
        push = peer(ctx, zmq.PUSH)
        push.connect(ep)          # a PUSH queues until connected: nothing lost
        push.send(msgpack.packb({"i": 1}))                        # one frame: empty topic
        push.send_multipart([b"t", msgpack.packb({"i": 2})])
        status, out, err = finish(proc)
    finally:
        proc.kill()
        proc.wait()
    assert (status, err) == (0, ""), err
    assert [json.loads(line) for line in out.splitlines()] == [
        {"topic": "", "payload": {"i": 1}}, {"topic": "t", "payload": {"i": 2}}]


def test_listen_reports_an_undecodable_message_and_goes_on(ctx, tmp_path):
    xpub = peer(ctx, zmq.XPUB)
    ep = tcp()
    xpub.bind(ep)
    proc = start("listen", ep, "--count", "1", tmp_path=tmp_path)
    try:
        wait_subscription(xpub, b"")
        xpub.send_multipart([b"bad", b"\xc1"])          # 0xc1: never valid msgpack
        xpub.send_multipart([b"good", msgpack.packb(1)])
        status, out, err = finish(proc)
    finally:
        proc.kill()
        proc.wait()
    assert status == 0
    assert json.loads(out) == {"topic": "good", "payload": 1}
    line = one_error_line(err, "listen")
    assert "skipped" in line and "bad" in line


@pytest.mark.parametrize("depth", [500, DEFAULT_MAX_DEPTH])
def test_listen_shows_every_depth_upcall_decodes(ctx, tmp_path, depth):
    """A message nested as deep as upcall's decoder takes (max_depth) prints
    like any other: the JSON is written without recursion."""
    xpub = peer(ctx, zmq.XPUB)
    ep = tcp()
    xpub.bind(ep)
    proc = start("listen", ep, "--count", "1", tmp_path=tmp_path)
    try:
        wait_subscription(xpub, b"")
        xpub.send_multipart([b"deep", nested_msgpack(depth)])
        status, out, err = finish(proc)
    finally:
        proc.kill()
        proc.wait()
    assert (status, err) == (0, ""), err
    assert out == '{"topic": "deep", "payload": ' + nested_json(depth) + "}\n"


def test_listen_names_the_topic_of_a_message_it_cannot_show(ctx, tmp_path):
    """A stdout that cannot write the payload (ASCII here): that message is
    skipped with one line naming its topic, and the next one shows."""
    xpub = peer(ctx, zmq.XPUB)
    ep = tcp()
    xpub.bind(ep)
    proc = start("listen", ep, "--count", "1", tmp_path=tmp_path,
                 env={"PYTHONIOENCODING": "ascii"})
    try:
        wait_subscription(xpub, b"")
        xpub.send_multipart([b"t.1", msgpack.packb("\u00e9")])
        xpub.send_multipart([b"t.2", msgpack.packb("e")])
        status, out, err = finish(proc)
    finally:
        proc.kill()
        proc.wait()
    assert status == 0
    assert json.loads(out) == {"topic": "t.2", "payload": "e"}
    line = one_error_line(err, "listen")
    assert "skipped" in line and "(topic b't.1')" in line, line


def test_listen_topic_that_is_not_utf8(ctx, tmp_path):
    """--topic is bytes on the wire: the argument's bytes as given."""
    xpub = peer(ctx, zmq.XPUB)
    ep = tcp()
    xpub.bind(ep)
    proc = start("listen", ep, "--topic", os.fsdecode(NOT_UTF8_TOPIC), "--count", "1",
                 tmp_path=tmp_path)
    try:
        wait_subscription(xpub, NOT_UTF8_TOPIC)
        xpub.send_multipart([b"t\xfe", msgpack.packb("filtered out")])
        xpub.send_multipart([NOT_UTF8_TOPIC + b"!", msgpack.packb(2)])
        status, out, err = finish(proc)
    finally:
        proc.kill()
        proc.wait()
    assert (status, err) == (0, ""), err
    assert json.loads(out) == {"topic": {"$bytes": "dP8h"}, "payload": 2}


def test_ctrl_c_ends_listen_quietly_with_130(ctx, tmp_path):
    xpub = peer(ctx, zmq.XPUB)
    ep = tcp()
    xpub.bind(ep)
    proc = start("listen", ep, tmp_path=tmp_path)
    try:
        wait_subscription(xpub, b"")       # it is up and listening
        proc.send_signal(signal.SIGINT)
        status, out, err = finish(proc)
    finally:
        proc.kill()
        proc.wait()
    assert (status, out, err) == (130, "", "")


def test_listen_ends_quietly_when_its_reader_goes_away(ctx, tmp_path):
    """`upcall listen ... | head -1`: status 0, no BrokenPipeError report."""
    ep = tcp()
    proc = start("listen", ep, "--bind", "--kind", "pull", tmp_path=tmp_path)
    try:
        push = peer(ctx, zmq.PUSH)
        push.connect(ep)
        push.send_multipart([b"", msgpack.packb(0)])
        assert json.loads(proc.stdout.readline()) == {"topic": "", "payload": 0}
        proc.stdout.close()
        for i in range(1, 100_000):    # until a write finds the pipe gone
            if proc.poll() is not None:
                break
            push.send_multipart([b"", msgpack.packb(i)])
            time.sleep(0.001)
        proc.stdout = None
        status, _, err = finish(proc)
    finally:
        proc.kill()
        proc.wait()
    assert (status, err) == (0, "")


# ---- publish --------------------------------------------------------------------

def test_publish_arguments_to_a_pyzmq_subscriber(ctx, tmp_path):
    """The first message is not lost: publish waits for the subscription."""
    sub = peer(ctx, zmq.SUB, subscribe=b"")
    ep = tcp()
    sub.bind(ep)
    proc = run_serving(sub, "publish", ep, "--topic", "trades.AAPL",
               '{"px": 187.25, "qty": 100}',
               '[{"$bytes": "AP8="}, 2.0, {"$timestamp": "2023-11-14T22:13:20.000000005Z"}, '
               '{"$ext": [5, "aGk="]}, {"$map": [[1, "one"]]}, {"$float": "-inf"}]',
               cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    got = [sub.recv_multipart(), sub.recv_multipart()]
    assert got[0] == [b"trades.AAPL", msgpack.packb({"px": 187.25, "qty": 100})]
    assert got[1][0] == b"trades.AAPL"
    assert unpack(got[1][1]) == [b"\x00\xff", 2.0, msgpack.Timestamp(1700000000, 5),
                                 msgpack.ExtType(5, b"hi"), {1: "one"}, -math.inf]
    assert isinstance(unpack(got[1][1])[1], float)


def test_publish_json_lines_from_stdin(ctx, tmp_path):
    sub = peer(ctx, zmq.SUB, subscribe=b"t")
    ep = tcp()
    sub.bind(ep)
    proc = run_serving(sub, "publish", ep, "-t", "t", input='{"i": 1}\n\n  \n"two"\n[3]\n', cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    got = [unpack(sub.recv_multipart()[1]) for _ in range(3)]
    assert got == [{"i": 1}, "two", [3]]


def test_publish_push_to_a_pyzmq_pull(ctx, tmp_path):
    pull = peer(ctx, zmq.PULL)
    ep = tcp()
    pull.bind(ep)
    proc = run("publish", ep, "--kind", "push", "1", "2", cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    assert [pull.recv_multipart() for _ in range(2)] == [[b"", msgpack.packb(1)],
                                                         [b"", msgpack.packb(2)]]


def test_publish_sends_large_values_as_plain_msgpack(ctx, tmp_path):
    """The command publishes what any msgpack reader decodes: a large value
    inside the payload, two frames, no out-of-band ones."""
    value = bytes(range(256)) * 80                 # 20,480 bytes
    pull = peer(ctx, zmq.PULL)
    ep = tcp()
    pull.bind(ep)
    arg = json.dumps({"blob": {"$bytes": base64.b64encode(value).decode()}})
    proc = run("publish", ep, "--kind", "push", "--topic", "big", arg, cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    frames = pull.recv_multipart()
    assert len(frames) == 2 and frames[0] == b"big"
    assert msgpack.unpackb(frames[1]) == {"blob": value}


def test_publish_bound_to_a_pyzmq_subscriber_that_connects(ctx, tmp_path):
    ep = tcp()
    sub = peer(ctx, zmq.SUB, subscribe=b"")
    proc = start("publish", ep, "--bind", '"hello"', tmp_path=tmp_path)
    try:
        # It binds, then waits for a subscriber: connect until it is there.
        sub.connect(ep)
        assert unpack(sub.recv_multipart()[1]) == "hello"
        status, out, err = finish(proc)
    finally:
        proc.kill()
        proc.wait()
    assert (status, out, err) == (0, "", "")


def test_ctrl_c_while_publish_waits_for_a_subscriber(tmp_path):
    port = free_tcp_port()
    proc = start("publish", f"tcp://127.0.0.1:{port}", "--bind", "1", tmp_path=tmp_path)
    try:
        # Once it accepts connections it is bound, past its imports, waiting.
        deadline = time.monotonic() + DEADLINE
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, proc.poll()
                time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        status, out, err = finish(proc)
    finally:
        proc.kill()
        proc.wait()
    assert (status, out, err) == (130, "", "")


def test_publish_then_listen_round_trip(tmp_path):
    ep = f"ipc://{tmp_path}/rt.sock"
    listener = start("listen", ep, "--bind", "--count", "2", "--topic", "x", tmp_path=tmp_path)
    try:
        values = '{"$map": [[1, {"$bytes": ""}]]}\n{"a": {"$float": "nan"}}\n'
        pub = run("publish", ep, "--topic", "x.y", input=values, cwd=tmp_path)
        assert (pub.returncode, pub.stderr) == (0, ""), pub.stderr
        status, out, err = finish(listener)
    finally:
        listener.kill()
        listener.wait()
    assert (status, err) == (0, "")
    assert [json.loads(line) for line in out.splitlines()] == [
        {"topic": "x.y", "payload": {"$map": [[1, {"$bytes": ""}]]}},
        {"topic": "x.y", "payload": {"a": {"$float": "nan"}}}]


def test_publish_as_deep_as_upcall_encodes_to_a_pyzmq_subscriber(ctx, tmp_path):
    """max_depth levels of JSON, and a $map at the deepest level."""
    sub = peer(ctx, zmq.SUB, subscribe=b"")
    ep = tcp()
    sub.bind(ep)
    proc = run_serving(sub, "publish", ep, nested_json(DEFAULT_MAX_DEPTH),
                       nested_json(DEFAULT_MAX_DEPTH - 1, '{"$map": [[1, {"$float": "inf"}]]}'),
                       cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    assert sub.recv_multipart() == [b"", nested_msgpack(DEFAULT_MAX_DEPTH)]
    assert sub.recv_multipart() == [b"", upcall.packb(nested(DEFAULT_MAX_DEPTH - 1,
                                                             {1: math.inf}))]


def test_publish_topic_that_is_not_utf8(ctx, tmp_path):
    sub = peer(ctx, zmq.SUB, subscribe=NOT_UTF8_TOPIC)
    ep = tcp()
    sub.bind(ep)
    proc = run_serving(sub, "publish", ep, "--topic", os.fsdecode(NOT_UTF8_TOPIC + b"\x01"),
                       "1", cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    assert sub.recv_multipart() == [NOT_UTF8_TOPIC + b"\x01", msgpack.packb(1)]


def test_publish_then_listen_round_trip_of_map_keys_floats_and_depth(tmp_path):
    """Every kind of map key upcall decodes, non-finite floats (only as
    $float), the deepest value, a topic that is not UTF-8: listen prints
    what publish read."""
    ep = f"ipc://{tmp_path}/rt.sock"
    lines = [
        nested_json(DEFAULT_MAX_DEPTH),
        '{"$map": [[null, 1], [true, 2], [-3, 3], [1.5, 4], ["s", 5], [{"$bytes": "AP8="}, 6], '
        '[{"$float": "-inf"}, 7], [{"$timestamp": "2023-11-14T22:13:20.000000005Z"}, 8], '
        '[{"$ext": [5, "aGk="]}, 9]]}',
        '[{"$float": "inf"}, {"$float": "-inf"}, 1e+308, -0.0, 5e-324]',
    ]
    listener = start("listen", ep, "--bind", "--count", str(len(lines)),
                     "--topic", os.fsdecode(NOT_UTF8_TOPIC), tmp_path=tmp_path)
    try:
        pub = run("publish", ep, "--topic", os.fsdecode(NOT_UTF8_TOPIC + b".y"),
                  input="\n".join(lines) + "\n", cwd=tmp_path)
        assert (pub.returncode, pub.stderr) == (0, ""), pub.stderr
        status, out, err = finish(listener)
    finally:
        listener.kill()
        listener.wait()
    assert (status, err) == (0, "")
    assert out.splitlines() == [f'{{"topic": {{"$bytes": "dP8ueQ=="}}, "payload": {line}}}'
                                for line in lines]


# ---- errors: one line, a status, no traceback -------------------------------------

@pytest.mark.parametrize("command", ["listen", "publish"])
@pytest.mark.parametrize("endpoint", ["nonsense", "tcp://127.0.0.1", "udp://127.0.0.1:5"])
def test_bad_endpoint(tmp_path, command, endpoint):
    proc = run(command, endpoint, *(["1"] if command == "publish" else []), cwd=tmp_path)
    assert proc.returncode == 1
    one_error_line(proc.stderr, command)
    assert proc.stdout == ""


@pytest.mark.parametrize("command", ["listen", "publish"])
def test_address_in_use(ctx, tmp_path, command):
    ep = tcp()
    holder = peer(ctx, zmq.PULL)
    holder.bind(ep)
    proc = run(command, ep, "--bind", *(["1"] if command == "publish" else []), cwd=tmp_path)
    assert proc.returncode == 1
    assert "Address already in use" in one_error_line(proc.stderr, command)


@pytest.mark.parametrize("bad", ["{oops", '{"$bytes": "not base64!"}', '{"$nope": 1}',
                                 '{"$timestamp": "yesterday"}', "NaN-ish"])
def test_bad_json_argument_is_a_usage_error(tmp_path, bad):
    ep = tcp()    # nothing listens: the argument is refused before anything opens
    proc = run("publish", ep, "1", bad, cwd=tmp_path)
    assert proc.returncode == 2
    assert "argument 2: bad JSON" in one_error_line(proc.stderr, "publish")


# What publish cannot send as written: refused before anything is sent,
# with a line that names the problem.
NOT_SENDABLE = [
    ("600-deep", nested_json(600), f"nested deeper than {DEFAULT_MAX_DEPTH} levels"),
    ("timestamp-int64", '{"$timestamp": [100000000000000000000000, 0]}', "int64"),
    ("1e400", "1e400", '{"$float": "inf"}'),
    ("-1e400", '{"x": -1e400}', '{"$float": "inf"}'),
    ("NaN", "NaN", 'NaN is not JSON: non-finite floats are written {"$float": "nan"}'),
    ("-Infinity", "[-Infinity]", "-Infinity is not JSON"),
    ("array-key", '{"$map": [[[1, 2], "v"]]}', "a key is an array or a map"),
    ("map-key", '{"$map": [[{"$map": [[1, 2]]}, "v"]]}', "a key is an array or a map"),
    ("not-utf8", os.fsdecode(b'"\xff"'), "not UTF-8"),
]


@pytest.mark.parametrize("bad,reason", [c[1:] for c in NOT_SENDABLE],
                         ids=[c[0] for c in NOT_SENDABLE])
def test_publish_refuses_an_argument_it_cannot_send_as_written(tmp_path, bad, reason):
    # Nothing listens: refused before anything opens (before the fix some
    # were sent, and waited for a subscriber: --wait-timeout ends that).
    proc = run("publish", tcp(), "--wait-timeout", "2", "1", bad, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    line = one_error_line(proc.stderr, "publish")
    assert "argument 2: bad JSON: " in line and reason in line, line


@pytest.mark.parametrize("bad,reason,env", [
    (c[1], c[2], {}) for c in NOT_SENDABLE] + [
    (nested_json(100_000), f"nested too deeply to parse (upcall takes at most "
                           f"{DEFAULT_MAX_DEPTH} levels)", {}),
    (os.fsdecode(b'"\xff"'), "not UTF-8", {"PYTHONIOENCODING": "utf-8"}),
], ids=[c[0] for c in NOT_SENDABLE] + ["100k-deep", "not-utf8-strict-stdin"])
def test_publish_refuses_a_stdin_line_it_cannot_send_as_written(ctx, tmp_path, bad, reason,
                                                                env):
    sub = peer(ctx, zmq.SUB, subscribe=b"")
    ep = tcp()
    sub.bind(ep)
    proc = run_serving(sub, "publish", ep, input=b'"first"\n' + os.fsencode(bad) + b'\n"never"\n',
                       cwd=tmp_path, env=env)
    assert proc.returncode == 1, proc.stderr
    line = one_error_line(proc.stderr, "publish")
    assert "stdin line 2: bad JSON: " in line and reason in line, line
    assert unpack(sub.recv_multipart()[1]) == "first"     # what came before it was sent


def test_bad_json_line_on_stdin(ctx, tmp_path):
    sub = peer(ctx, zmq.SUB, subscribe=b"")
    ep = tcp()
    sub.bind(ep)
    proc = run_serving(sub, "publish", ep, input='"first"\n{oops\n"never"\n', cwd=tmp_path)
    assert proc.returncode == 1
    assert "stdin line 2: bad JSON" in one_error_line(proc.stderr, "publish")
    assert unpack(sub.recv_multipart()[1]) == "first"     # what came before it was sent


def test_unpackable_value(ctx, tmp_path):
    sub = peer(ctx, zmq.SUB, subscribe=b"")
    ep = tcp()
    sub.bind(ep)
    proc = run_serving(sub, "publish", ep, str(2 ** 70), cwd=tmp_path)
    assert proc.returncode == 1
    assert "message 1: cannot send" in one_error_line(proc.stderr, "publish")


def test_wait_timeout(tmp_path):
    proc = run("publish", tcp(), "--wait-timeout", "0.2", "1", cwd=tmp_path)
    assert proc.returncode == 1
    assert "no subscriber" in one_error_line(proc.stderr, "publish")


@pytest.mark.parametrize("args", [["listen", "tcp://127.0.0.1:5", "--count", "0"],
                                  ["listen", "tcp://127.0.0.1:5", "--kind", "pub"],
                                  ["listen", "tcp://127.0.0.1:5", "--kind", "pull", "-t", "a"],
                                  ["publish", "tcp://127.0.0.1:5", "--wait-timeout", "-1"],
                                  ["listen", "inproc://elsewhere"],
                                  ["publish", "inproc://elsewhere", "1"],
                                  ["frobnicate"]])
def test_usage_errors(tmp_path, args):
    proc = run(*args, cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.strip(), proc.stderr


# ---- bench ----------------------------------------------------------------------

def test_bench_says_where_the_benchmark_lives(tmp_path):
    # The package never looks for the benchmark (neither the wheel nor the
    # sdist ships it): from anywhere, even a folder laid out as a checkout,
    # it runs nothing and names the repository and `make bench`, status 2.
    checkout = tmp_path / "checkout"
    (checkout / "bench").mkdir(parents=True)
    (checkout / "bench_upcalls.py").write_text("raise SystemExit('ran')\n")
    for cwd in (tmp_path, checkout):
        proc = run("bench", "--quick", cwd=cwd)
        assert proc.returncode == 2
        line = one_error_line(proc.stderr, "bench")
        assert "source repository" in line and "`make bench`" in line
        assert "neither the wheel nor the sdist" in line


def test_bench_help_says_where_the_benchmark_lives(tmp_path):
    proc = run("bench", "--help", cwd=tmp_path)
    assert proc.returncode == 0
    assert "make bench" in proc.stdout and "source" in proc.stdout


def test_bench_message_is_true_of_the_sdist():
    # What the message claims: the sdist (`git archive`, .gitattributes'
    # export-ignore lines) leaves the benchmark out.
    attributes = os.path.join(os.path.dirname(TESTS_DIR), ".gitattributes")
    if not os.path.exists(attributes):
        pytest.skip("needs the source tree")
    with open(attributes) as f:
        ignored = {words[0] for words in (line.split() for line in f)
                   if len(words) == 2 and words[1] == "export-ignore"}
    assert {"/bench", "/bench_upcalls.py"} <= ignored
    assert "make bench" in cli.BENCH_WHERE


# ---- the JSON mapping on its own ---------------------------------------------------

MAPPED = [
    (None, None), (True, True), (-5, -5), (2 ** 64 - 1, 2 ** 64 - 1), (1.0, 1.0), ("é", "é"),
    (b"\x00", {"$bytes": "AA=="}), (bytearray(b"ab"), {"$bytes": "YWI="}),
    (float("-inf"), {"$float": "-inf"}),
    ([1, [2]], [1, [2]]), ({"k": b""}, {"k": {"$bytes": ""}}),
    ({"$k": 1}, {"$map": [["$k", 1]]}),
    ({None: [{1.5: b""}], -1: {"k": [[]]}},
     {"$map": [[None, [{"$map": [[1.5, {"$bytes": ""}]]}]], [-1, {"k": [[]]}]]}),
    (upcall.Timestamp(0, 1), {"$timestamp": "1970-01-01T00:00:00.000000001Z"}),
    (upcall.Timestamp(-1, 0), {"$timestamp": "1969-12-31T23:59:59.000000000Z"}),
    (upcall.Timestamp(2 ** 40, 7), {"$timestamp": [2 ** 40, 7]}),
    (upcall.ExtType(-128, b"x"), {"$ext": [-128, "eA=="]}),
]


@pytest.mark.parametrize("value,expected", MAPPED)
def test_json_mapping_round_trips(value, expected):
    got = to_json(value)
    assert got == expected
    text = json.dumps(got, allow_nan=False)      # strict JSON
    assert jsonmap.dumps(got) == json.dumps(got, ensure_ascii=False, allow_nan=False)
    back = from_json(json.loads(text))
    assert upcall.packb(back) == upcall.packb(bytes(value) if isinstance(value, bytearray)
                                              else value)


def test_json_mapping_nan_and_topics():
    assert to_json(math.nan) == {"$float": "nan"} and math.isnan(from_json({"$float": "nan"}))
    assert topic_to_json(b"trades.AAPL") == "trades.AAPL"
    assert topic_to_json(b"\xff") == {"$bytes": "/w=="}
    assert from_json({"$timestamp": "2024-01-01T01:00:00.5+01:00"}) == upcall.Timestamp(
        1704067200, 500000000)


@pytest.mark.parametrize("bad", [{"$bytes": 1}, {"$float": "big"}, {"$map": [1]},
                                 {"$ext": ["x", ""]}, {"$timestamp": "2024-13-01T00:00:00Z"},
                                 {"$other": 1}, {"a": 1, "$b": 2},
                                 # what upcall's decoder would refuse
                                 {"$map": [[[1, 2], 3]]}, {"$map": [[{"a": 1}, 3]]},
                                 {"$map": [[{"$map": []}, 3]]},
                                 nested(DEFAULT_MAX_DEPTH + 1),
                                 nested(DEFAULT_MAX_DEPTH, {"$map": [[1, 2]]}),
                                 # json.loads reads 1e400 as infinity
                                 math.inf, [-math.inf], {"k": math.nan},
                                 {"$timestamp": [2 ** 70, 0]}])
def test_json_mapping_refuses_malformed_forms(bad):
    with pytest.raises(ValueError):
        from_json(bad)


def test_json_mapping_takes_what_upcall_encodes_at_its_depth_limit():
    deepest = nested(DEFAULT_MAX_DEPTH - 1, {"$map": [[1, 2]]})
    assert upcall.packb(from_json(deepest)) == upcall.packb(nested(DEFAULT_MAX_DEPTH - 1,
                                                                    {1: 2}))


def test_json_mapping_has_no_recursion_limit():
    """listen converts and writes any depth a decoder may give (max_depth
    up to 4096 and beyond Python's recursion limit)."""
    deep = nested(100_000, b"")
    text = jsonmap.dumps(to_json(deep))
    assert text == nested_json(100_000, '{"$bytes": ""}')
    deep_map = nested(100_000, {2: "x"})
    assert jsonmap.dumps(to_json(deep_map)) == nested_json(100_000, '{"$map": [[2, "x"]]}')
