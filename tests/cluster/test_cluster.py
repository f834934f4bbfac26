"""Five hosts on one switch, with link faults (bench/cluster.py): two stamped
publishers, a proxy and two subscribers (one asyncio), each an upcall
process in a network namespace of its own, the switch a bridge in a sixth.

For every scenario, every subscriber and every stream the account is exact:
the subscriber saw the stream from its first message to its last,
delivered + lost == published, no duplicates, no reordering, and upcall's
own count of what was lost (``sub.streams()``) is the subscriber's.

Scenarios: a clean run; 1% random packet loss on one subscriber's link
(TCP retransmits: nothing lost), both at a rate whose whole flood fits the
proxy's queue, so that no load on the machine can make them lose; a 3 s partition of one subscriber (an
nftables drop-all rule) and, separately, its link down for 3 s, while the
publishers send past the proxy's high-water mark; the proxy SIGKILLed and
restarted on the same endpoints (everyone reconnects within
RECONNECT_BOUND, what was lost meanwhile is counted); a publisher restarted
(a new stream, not a gap).

Needs root, ip and nft; skipped otherwise.  Every namespace, and every rule
in them, is removed at the end, on failure too.
"""
import subprocess
import time

import pytest

from bench.cluster import RECONNECT_BOUND, Cluster, Scenario, accounting, unavailable

FAULT_SECONDS = 3.0      # the outage asked for (its length, not a threshold)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def net():
    why = unavailable()
    if why:
        pytest.skip(why)
    with Cluster() as net:
        yield net
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in net.names()), "namespaces left behind"


@pytest.fixture(scope="module")
def scenario(net):
    sc = Scenario(net)
    try:
        yield sc
    finally:
        sc.close()


@pytest.fixture(autouse=True)
def healed(net):
    yield
    net.clear_all()


def check_exact(result, lossless=()):
    """The account of every subscriber and stream; lossless: subscribers
    that must have lost nothing."""
    rows = accounting(result)
    assert len(rows) == 2 * len(result["published"])
    for row in rows:
        where = f"{row['sub']} stream {row['sid']:#x}: {row}"
        assert row["first"] == 0, where             # seen from the stream's start
        assert row["last"] == row["published"] - 1, where
        assert row["delivered"] + row["lost"] == row["published"], where
        assert row["duplicates"] == 0 and row["reordered"] == 0, where
        if row["detected"] is not None:             # upcall's own account
            assert row["detected"] == row["lost"], where
            assert row["upcall_received"] == row["delivered"], where
        if row["sub"] in lossless:
            assert row["lost"] == 0, where
    # Every subscriber's totals (the asyncio one has them, not per stream):
    # upcall's lost is the sum of the gaps its own account saw, since it
    # started.
    for name, rep in result["reports"].items():
        stats = rep["stats"]
        if "lost" in stats:
            own = rep["account"].values()
            assert stats["lost"] == sum(a["lost"] for a in own), (name, stats)
            assert stats["gaps"] == sum(a["gaps"] for a in own), (name, stats)
            assert stats["duplicates"] == 0 and stats["reordered"] == 0, (name, stats)
    return rows


def summary(name, rows, result):
    print(f"{name}: " + "; ".join(
        f"{r['sub']} {r['sid'] & 0xffff:04x} published {r['published']} delivered "
        f"{r['delivered']} lost {r['lost']} detected {r['detected']}" for r in rows)
        + f" (fault {result['fault_seconds']:.1f} s)")


def test_clean_run_loses_nothing(scenario):
    # At the scenario's flood rate a subscriber starved of CPU for half a
    # second (two cores at a load of 20) overflowed the proxy's queue:
    # 50 of 3,053 lost, every one counted.  A clean run must lose nothing
    # whatever the load, so its flood fits the queues.
    result = scenario.stream(before=1.0, rate=scenario.lossless_rate(1.0 + 0.5))
    summary("clean", check_exact(result, lossless=("sub1", "sub2")), result)


def test_one_percent_packet_loss_is_repaired_by_tcp(net, scenario):
    result = scenario.stream(before=0.3, fault=lambda: net.loss("sub1", 1), hold=2.0,
                             heal=lambda: net.heal("sub1"),
                             rate=scenario.lossless_rate(0.3 + 2.0 + 0.5))
    summary("1% loss", check_exact(result, lossless=("sub1", "sub2")), result)


def test_partition_of_a_subscriber_is_counted_exactly(net, scenario):
    result = scenario.stream(before=0.3, fault=lambda: net.partition("sub1"),
                             hold=FAULT_SECONDS, heal=lambda: net.heal("sub1"))
    summary("partition", check_exact(result, lossless=("sub2",)), result)


def test_link_down_is_counted_exactly(net, scenario):
    result = scenario.stream(before=0.3, fault=lambda: net.link_down("sub1"),
                             hold=FAULT_SECONDS, heal=lambda: net.link_up("sub1"))
    summary("link down", check_exact(result, lossless=("sub2",)), result)


def test_proxy_killed_and_restarted(scenario):
    restarted = {}

    def kill():
        scenario.proxy.proc.kill()             # SIGKILL: no goodbye to anyone
        scenario.proxy.proc.wait()

    def restart():
        scenario.proxy = scenario.start_proxy()
        restarted["at"] = time.monotonic()

    # The reconnection is watched from the restart until both subscribers
    # receive messages of both streams again.
    pubs = [scenario.start_pub("pub1", "p1."), scenario.start_pub("pub2", "p2.")]
    sids = [int(p.expect("ready")) for p in pubs]
    scenario.wait_until_subscribed(pubs)
    for p in pubs:
        p.ask("start")
    time.sleep(0.5)
    kill()
    time.sleep(1.0)
    restart()
    seen = {name: {sid: -1 for sid in sids} for name in scenario.subs}

    def everyone_receives():
        reps = scenario.reports()
        done = True
        for name, rep in reps.items():
            for sid in sids:
                last = rep["account"].get(str(sid), {}).get("last", -1)
                if seen[name][sid] < 0:
                    seen[name][sid] = last          # what had arrived by the restart
                elif last <= seen[name][sid]:
                    done = False
        return done and all(v >= 0 for s in seen.values() for v in s.values())

    deadline = restarted["at"] + RECONNECT_BOUND
    everyone_receives()
    while not everyone_receives():
        assert time.monotonic() < deadline, \
            f"not everyone reconnected within {RECONNECT_BOUND} s of the restart"
        time.sleep(0.05)
    reconnected = time.monotonic() - restarted["at"]
    published, reports, ended = scenario.finish(pubs)
    assert set(published) == set(sids)
    result = {"published": published, "reports": reports, "pubs": ended,
              "fault_seconds": 1.0}
    rows = check_exact(result)
    summary(f"proxy restart (everyone receiving again {reconnected:.2f} s after it)", rows, result)


def test_publisher_restart_is_a_new_stream_not_a_gap(scenario):
    first = scenario.stream(before=0.5)
    second = scenario.stream(before=0.5)
    # New streams: no id in common, each complete from its own seq 0.
    assert not set(first["published"]) & set(second["published"])
    check_exact(first, lossless=("sub1", "sub2"))
    rows = check_exact(second, lossless=("sub1", "sub2"))
    for name, rep in second["reports"].items():
        stats = rep["stats"]
        if "gaps" in stats:
            before = first["reports"][name]["stats"]
            assert stats["gaps"] == before["gaps"], (name, before, stats)
            assert stats["streams"] >= before["streams"] + 2
    summary("publisher restart", rows, second)
