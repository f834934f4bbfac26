"""The bus benchmark section runs in quick mode and reports what it documents.

No timing assertions: only that every row is produced, with its fields, and
that nothing was lost.
"""
import argparse
import json
import math
import shutil
import tempfile

import pytest

from bench_package import bench_module

bus = bench_module("bus")
coalescing = bench_module("coalescing")
floors = bench_module("floors")
harness = bench_module("harness")
publish = bench_module("publish")
measure = bench_module("measure")
report = bench_module("report")

FIELDS = {"transport", "mode", "n", "rate", "cpu_us_per_msg", "lost", "p50_us", "p99_us",
          "seconds", "rate_ratio", "cpu_ratio", "p50_ratio"}


def _opts(**kw):
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    bus.add_arguments(parser)
    opts = parser.parse_args(["--quick"])
    for k, v in kw.items():
        setattr(opts, k, v)
    return opts


def _modes():
    modes, _ = bus.available_modes(bus.MODES)
    return modes


# Every mode over every transport, in this process: minutes on a busy machine.
@pytest.mark.timeout(600)
def test_quick_run_produces_records(capsys):
    modes = _modes()
    if not any(m in bus.UPCALL_MODES for m in modes):
        pytest.skip("upcall._bus is not built")
    records = bus.run(_opts())
    out = capsys.readouterr().out
    flood = [r for r in records if r.get("part") != "publish"]
    # The C floor needs a peer process: not over inproc.
    want = {(t, m) for t in bus.TRANSPORTS for m in modes
            if not ((m == bus.FLOOR or m in bus.CURVE_MODES) and t == "inproc")}
    assert len(flood) == len(want)
    seen = {(r["transport"], r["mode"]) for r in flood}
    assert seen == want
    for r in flood:
        assert FIELDS <= r.keys(), FIELDS - r.keys()
        # Every build has coalescing: every row has its figures.
        assert r["na"] is None, r
        if r["mode"] == bus.PINGPONG:         # round trips only
            assert math.isnan(r["rate"]) and r["lost"] is None
            if r["transport"] != "inproc" and bus.COALESCED in modes:
                # and the floor of a held reply: each answer held COALESCE_DELAY
                assert r["held_p99_us"] >= bus.COALESCE_DELAY * 1e6, r
        else:
            assert r["n"] >= bus.QUICK_N
            assert r["lost"] == 0, r
            assert r["rate"] > 0 and r["cpu_us_per_msg"] > 0 and r["seconds"] > 0
        if r["mode"] in bus.NO_RTT_MODES:     # no round trips for the asyncio rows, the floors
            assert math.isnan(r["p50_us"])
        else:
            assert r["p50_us"] > 0 and r["p99_us"] >= r["p50_us"]
        if bus.REFERENCE in modes and not math.isnan(r["rate"]):
            assert not math.isnan(r["rate_ratio"])
        # The floors of the same run beside every row.
        if bus.SYNTHETIC in modes and not math.isnan(r["rate"]):
            assert not math.isnan(r["rate_synth_ratio"])
        if bus.FLOOR in modes and r["transport"] != "inproc" and not math.isnan(r["rate"]):
            assert not math.isnan(r["rate_floor_ratio"]) and not math.isnan(r["cpu_floor_ratio"])
        if bus.PINGPONG in modes and not math.isnan(r["p50_us"]):
            assert not math.isnan(r["p50_pingpong_ratio"])
    for t in bus.TRANSPORTS:
        assert f"bus over {t}" in out
    for a, b in bus.PAIRS:
        if a in modes and b in modes:
            assert f"{a} / {b}: rate " in out
    assert f"native / {bus.PINGPONG}: p50 " in out

    # The sending side, over every transport but inproc.
    sent = [r for r in records if r.get("part") == "publish"]
    pmodes, _ = publish.available_modes(harness.upcall_bus())
    assert {(r["transport"], r["mode"]) for r in sent} == {
        (t, m) for t in bus.TRANSPORTS if t != "inproc" for m in pmodes}
    for r in sent:
        assert r["na"] is None, r
        assert r["lost"] == 0, r
        assert r["rate"] > 0 and r["cpu_us_per_msg"] > 0
        assert r["zmq_messages"] >= 1
        if r["mode"] in (publish.PUB_FLOOR, publish.PUB_REFERENCE, "send", "send_packed"):
            assert r["zmq_messages"] == r["n"]          # one zmq message per message
    assert "publishing over tcp" in out
    assert f"send / {publish.PUB_REFERENCE}: rate " in out

    # Narrow tables (the default): every line fits 120 columns.
    too_wide = [line for line in out.splitlines() if len(line) > report.WIDTH]
    assert not too_wide, too_wide
    # Every target line says whether the target was met.
    targets = [line for line in out.splitlines() if "(target " in line]
    assert any(f"native / {bus.PINGPONG}: p50 " in line for line in targets)
    assert any(f"send / {publish.PUB_REFERENCE}: rate " in line for line in targets)
    for line in targets:
        assert line.lstrip().startswith((report.MET, report.MISSED, report.NO_FIGURE)), line
    # The words of the tables are explained under them.
    assert "Terms:" in out and f"  {bus.FLOOR} " in out and "[met] [MISSED]" in out

    # One figure for the flood and round trips, one for the publishing rows,
    # their legends naming the rows.
    if _have_matplotlib():
        figs = dict(bench_module("plot").figures([{"section": "bus", **r} if "section" not in r
                                                  else r for r in records]))
        assert set(figs) == {"bus", "bus publishing"}
        if len(_ordered_modes(flood)) > bench_module("plot").MAX_COLOURED_ROWS:
            # Many modes: each named on the axis, the legend names the transports.
            rate_ax = figs["bus"].axes[0]
            assert [t.get_text() for t in rate_ax.get_yticklabels()] == _ordered_modes(flood)
        else:
            assert _legend(figs["bus"]) == [m for m in _ordered_modes(flood)]
        assert _legend(figs["bus publishing"]) == pmodes
        import matplotlib.pyplot as plt
        for fig in figs.values():
            plt.close(fig)


def _have_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def _legend(fig):
    (legend,) = fig.legends
    return [t.get_text() for t in legend.get_texts()]


def _ordered_modes(rows):
    """The modes in the tables' order (MODES), as the legend lists them."""
    present = {r["mode"] for r in rows}
    return [m for m in bus.MODES if m in present]


def test_c_pinger_round_trips_every_responder_kind(capsys):
    """--bus-pinger c: bench/floor_pingpong.c pings the row's responder.  In
    caller mode this thread polls the responder while the pinger runs, so
    the pinger's ~100 KB of samples must not go through a pipe nobody reads
    (it did: the pinger blocked in write and the run hung)."""
    modes = [m for m in ("caller", "native", bus.REFERENCE) if m in _modes()]
    if "caller" not in modes:
        pytest.skip("upcall._bus is not built")
    records = bus.run(_opts(bus_transports="tcp", bus_modes=",".join(modes), bus_rtt=10000,
                            bus_no_publish=True, bus_pinger="c"))
    assert "pinged by bench/floor_pingpong.c" in capsys.readouterr().out
    rows = {r["mode"]: r for r in records if r.get("part") != "publish"}
    assert set(rows) == set(modes)
    for r in rows.values():
        assert r["lost"] == 0, r
        assert r["p50_us"] > 0 and r["p99_us"] >= r["p50_us"], r


def test_coalesced_flood_payload_is_the_wire_format():
    """The hand-built coalesced payload reads back with the pyzmq + msgpack
    snippet of docs/wire.md, and bench/count_pull.c counts its messages."""
    msgpack = pytest.importorskip("msgpack")
    zmq = pytest.importorskip("zmq")
    one = bench_module("workload").small_payload()
    payload = coalescing.coalesced_payload(one, 5)

    def ext_hook(code, data):
        if code == 127:
            assert data[0] == 1                      # version
            unpacker = msgpack.Unpacker(raw=False)
            unpacker.feed(data[1:])
            return list(unpacker)                    # the messages, in order
        return msgpack.ExtType(code, data)
    msgs = msgpack.unpackb(payload, ext_hook=ext_hook)
    assert msgs == [msgpack.unpackb(one)] * 5

    prog, why = floors.c_program("count_pull")
    if prog is None:
        pytest.skip(why)
    import subprocess
    sock_dir = tempfile.mkdtemp(prefix="upcall-count-")
    ep = f"ipc://{sock_dir}/c.sock"
    # 5 + 1 + 3 (nil x 3) + 1 (single frame) + the 2 before a cut = 12; one bad.
    cut = coalescing.coalesced_payload(b"\xc0", 3)[:-1] + b"\x92"      # 2 nils, a truncated array
    cut = cut[:1] + (len(cut) - 6).to_bytes(4, "big") + cut[5:]
    proc = subprocess.Popen([prog, ep, "12"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        ctx = zmq.Context()
        s = ctx.socket(zmq.PUSH)
        s.connect(ep)
        s.send_multipart([b"t", payload])
        s.send_multipart([b"t", one])
        s.send_multipart([b"t", coalescing.coalesced_payload(b"\xc0", 3)])
        s.send(one)
        s.send_multipart([b"t", cut])
        out = json.loads(proc.stdout.readline())
        proc.wait(30)
        s.close(0)
        ctx.term()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(sock_dir, ignore_errors=True)
    assert out == {"delivered": 12, "zmq_messages": 5, "bad": 1}


def test_c_pingpong_floor_over_inproc():
    prog, why = floors.c_program("floor_pingpong")
    if prog is None:
        pytest.skip(why)
    import subprocess
    r = subprocess.run([prog, "inproc", "50", "5", "c0"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    samples = json.loads(r.stdout)["samples_ns"]
    assert len(samples) == 50 and all(x > 0 for x in samples)


def test_helpers():
    assert measure.percentile([1, 2, 3, 4, 5], 50) == 3
    assert measure.percentile([10], 99) == 10
    assert math.isnan(measure.percentile([], 50))
    assert measure.percentile(list(range(101)), 99) == 99
    s = measure.summarize([3.0, 1.0, 2.0, float("nan")])
    assert (s.median, s.min, s.max, s.n) == (2.0, 1.0, 3.0, 3)
    assert list(measure.interleave("AB", 2)) == [(0, "A"), (0, "B"), (1, "B"), (1, "A")]
    busy = measure.busy_fraction(0.05)
    assert 0.0 <= busy <= 1.0
    text = report.render([{"mode": "a", "rate": 1.5e6}, {"mode": "bb", "rate": None}],
                         [report.Column("mode"), report.Column("rate", fmt=report.fmt_rate)])
    lines = text.splitlines()
    assert lines[2].split() == ["a", "1.50M"] and lines[3].split() == ["bb", "-"]
    assert report.fmt_ratio(report.ratio(3, 1)) == "3.00x"


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    plot = bench_module("plot").plot
    recs = [{"section": "bus", "transport": t, "mode": m, "rate": 1e5 * (i + 1),
             "rate_min": 9e4, "rate_max": 2e6, "cpu_us_per_msg": 1.0, "p50_us": 20.0,
             "p99_us": 40.0}
            for t in ("ipc", "tcp") for i, m in enumerate(("native", "pyzmq+msgspec"))]
    out = tmp_path / "bench.png"
    assert plot(recs, str(out)) == [str(tmp_path / "bench-bus.png")]
    assert (tmp_path / "bench-bus.png").stat().st_size > 1000


def test_plot_of_many_modes_names_them_on_the_axis_and_cuts_no_bar():
    # The bus section's 21 modes in 21 colours could not be told apart, and a
    # linear axis cut the floors' tall bars: past MAX_COLOURED_ROWS names, each
    # mode is a band named on the axis, the colours tell the transports, and
    # values spanning decades get a log scale.
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    plot = bench_module("plot")
    modes = [f"mode-{i:02d}" for i in range(21)]
    recs = [{"section": "bus", "transport": t, "mode": m, "rate": 1e4 * (i + 1) ** 2,
             "cpu_us_per_msg": 1.0 + i, "p50_us": 20.0, "p99_us": 40.0}
            for t in ("ipc", "tcp") for i, m in enumerate(modes)]
    ((name, fig),) = plot.figures(recs)
    try:
        assert _legend(fig) == ["ipc", "tcp"]
        rate_ax = fig.axes[0]
        assert [t.get_text() for t in rate_ax.get_yticklabels()] == modes
        assert rate_ax.get_xscale() == "log"
        assert not [t for ax in fig.axes for t in ax.texts]      # no cut bar's value written
    finally:
        plt.close(fig)


def _profile_opts(*argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--full", action="store_true")
    bus.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_profiles():
    """--full runs what PERF.md's figures come from; the default profile is
    smaller; --quick smaller still."""
    full = bus.BusBench(_profile_opts("--full"))
    assert (full.n, full.rtt, full.repeats, full.transports) == (200_000, 20_000, 3, bus.TRANSPORTS)
    assert full.stable_kw == {"retries": 3, "idle_timeout": 30.0}
    default = bus.BusBench(_profile_opts())
    assert (default.n, default.rtt, default.repeats) == (bus.DEFAULT_N, bus.DEFAULT_RTT,
                                                         bus.DEFAULT_REPEATS)
    assert default.n < full.n and default.rtt < full.rtt and default.repeats < full.repeats
    assert default.transports == bus.DEFAULT_TRANSPORTS == ["inproc", "tcp"]
    quick = bus.BusBench(_profile_opts("--quick", "--full"))     # quick wins in a section
    assert (quick.n, quick.transports) == (bus.QUICK_N, bus.TRANSPORTS)
    chosen = bus.BusBench(_profile_opts("--bus-transports", "ipc", "--bus-n", "7"))
    assert (chosen.transports, chosen.n) == (["ipc"], 7)
