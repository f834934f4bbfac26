"""The --large benchmark section runs in quick mode and reports what it documents.

No timing assertions: the rows are produced, nothing is lost, a row this
build cannot run says why instead of showing a figure, --huge is skipped
with its reason when memory is short, and the shaped link's namespaces are
gone afterwards, even when a row fails.
"""
import argparse
import os
import subprocess

import pytest

from bench_package import bench_module

large = bench_module("large")
compression = bench_module("compression")
netns = bench_module("netns")

MB = 1_000_000


def _opts(*argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    large.add_arguments(parser)
    return parser.parse_args(["--quick", "--large-sizes", "1", *argv])


def _namespaces():
    # This process's benchmark links (bench/netns.py names them so): other
    # tests running beside this one (pytest-xdist workers, tests/bus's netns
    # tests) make and remove namespaces of their own.
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return {line.split()[0] for line in r.stdout.splitlines()
            if line.strip().startswith(f"upcall-bench-{os.getpid()}-")}


def test_bandwidth_and_compression_rows(capsys):
    pytest.importorskip("zmq")
    pytest.importorskip("numpy")
    before = _namespaces() if netns.unavailable() is None else set()
    records = large.run(_opts("--large-transports", "inproc,ipc",
                              "--large-impls", "upcall zero-copy,pyzmq copy=False"))
    out = capsys.readouterr().out
    bandwidth = [r for r in records if r.get("part") != "compression"]
    assert {(r["transport"], r["impl"]) for r in bandwidth} == {
        (t, i) for t in ("inproc", "ipc") for i in ("upcall zero-copy", "pyzmq copy=False")} | {
        ("-", "memcpy touched"), ("-", "memcpy fresh")}
    assert all(r["gbps"] > 0 for r in bandwidth)

    rows = [r for r in records if r.get("part") == "compression"]
    links = ["loopback"] + (["1gbit"] if netns.unavailable() is None else [])
    assert {(r["link"], r["data"], r["impl"]) for r in rows} == {
        (lk, d, i) for lk in links for d in compression.DATA for i in compression.IMPLS}
    whys = {f"upcall {c}": compression.unavailable(c) for c in compression.CODECS}
    for r in rows:
        if r.get("na"):
            assert whys.get(r["impl"]) and r["na"] == whys[r["impl"]]
        else:
            assert r["lost"] == 0 and r["gbps"] > 0, r
            assert r["x_raw"] > 0
    if netns.unavailable() is not None:
        assert "skipped the 1gbit link" in out
    else:
        assert _namespaces() == before
        for codec in compression.CODECS:   # its targets over the 1gbit link: met or missed
            if whys[f"upcall {codec}"] is not None:
                continue
            targets = [line for line in out.splitlines() if f"{codec} / raw" in line]
            assert len(targets) == len(compression.DATA) * len(
                {r["size"] for r in rows if r["link"] == "1gbit"}), out
            for line in targets:
                assert line.lstrip().startswith(("[met] ", "[MISSED] ")), line
                assert "(target >= " in line


def test_huge_is_skipped_with_its_reason_when_memory_is_short(monkeypatch, capsys):
    monkeypatch.setattr(large, "MEMORY_FACTOR", 10 ** 9)
    records = large.run(_opts("--huge", "--large-transports", "inproc", "--large-impls", "upcall zero-copy",
                              "--large-compression", "no"))
    out = capsys.readouterr().out
    assert "skipped the 1000 MB rows (--huge): needs about" in out
    assert {r["size"] for r in records} == {1 * MB}


@pytest.mark.parametrize("impl", ["upcall zero-copy", "upcall inline"])
def test_upcall_rows_send_in_the_mode_they_name(impl):
    """The rows ask for their mode explicitly, whatever the publisher's
    defaults: over inproc the zero-copy row delivers a view of the sender's
    own bytes, the inline row a copy as bytes (plain msgpack)."""
    np = pytest.importorskip("numpy")
    import threading
    import time

    import upcall
    payload = bytes(range(256)) * 4096
    got = []
    acked = threading.Semaphore(0)

    def on(msg):
        v = msg["blob"]
        got.append((type(v), np.frombuffer(v, dtype=np.uint8).__array_interface__["data"][0]))
        del v
        acked.release()

    def wait_ack():
        assert acked.acquire(timeout=30), "no delivery"
    with upcall.Bus() as bus:
        ep = f"inproc://bench-mode-{time.monotonic_ns()}"
        sub = bus.subscribe(ep, on, kind="pull", bind=True)
        sender, _ = large._send(impl, ep, payload, 2, wait_ack, bus=bus)
        sub.close()
        sender.close()
    ours = np.frombuffer(payload, dtype=np.uint8).__array_interface__["data"][0]
    assert len(got) == 3
    if impl == "upcall zero-copy":
        assert got == [(memoryview, ours)] * 3
    else:
        assert all(t is bytes and addr != ours for t, addr in got)


def test_compressible_data_compresses_and_random_does_not():
    import zlib
    c, r = compression.make_data("compressible", MB), compression.make_data("random", MB)
    assert len(c) == len(r) == MB
    assert len(zlib.compress(c, 1)) < 0.3 * MB < 0.99 * MB < len(zlib.compress(r, 1))
    assert compression.make_data("compressible", 1000) == compression.make_data("compressible", 1000)
    with pytest.raises(ValueError, match="data must be one of"):
        compression.make_data("text", 10)


def test_the_link_is_removed_even_when_a_row_fails():
    why = netns.unavailable()
    if why:
        pytest.skip(why)
    before = _namespaces()
    with pytest.raises(RuntimeError, match="a row failed"):
        with netns.RateLimitedLink("1gbit") as link:
            assert {link.a, link.b} <= _namespaces()
            for ns, dev in ((link.a, link.dev_a), (link.b, link.dev_b)):
                shown = subprocess.run(link.exec_in(ns) + ["tc", "qdisc", "show", "dev", dev],
                                       capture_output=True, text=True, check=True).stdout
                assert "tbf" in shown and "rate 1Gbit" in shown, shown
            raise RuntimeError("a row failed")
    assert _namespaces() == before
