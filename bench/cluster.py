"""A five-host cluster on one switch, made of network namespaces, with link
faults: the harness of tests/cluster/test_cluster.py and the cluster
section of bench_upcalls.py (``--cluster``).

    with Cluster() as net:                  # needs root, ip (iproute2) and nft
        net.loss("sub1", 1)                 # 1% of sub1's incoming packets dropped
        net.heal("sub1")

Hosts ``pub1``, ``pub2``, ``proxy``, ``sub1``, ``sub2``: a namespace each,
named ``upcall-cl-<pid>-<host>`` (the pid of the process that made them:
namespaces left by a process that died are removed by the next one), each
with one veth link ``eth0`` (10.231.0.1 to .5/24) whose other end is a port
of a bridge in a sixth namespace, the switch.  The addresses exist only
inside these namespaces: no traffic leaves them, nothing is added to the
namespace of the process that makes them.  Faults are what this kernel
has (it has no netem): nftables rules inside a host's namespace (random
drops, ``numgen random mod 100 < N drop``; a partition, every packet but
loopback dropped both ways, which the link does not notice), a switch port
taken down (``ip link set ... down``: the cable pulled), ``tc tbf`` rate
limits.  Everything is removed on leaving the ``with``, on an exception,
Ctrl-C or SIGTERM alike.

Each host runs an upcall process (bench/cluster_peer.py): two stamped
publishers, one proxy (``Bus.proxy``), two subscribers (one of them
asyncio); :class:`Scenario` runs a stream through a fault and collects
every account.
"""
from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

HOSTS = ("pub1", "pub2", "proxy", "sub1", "sub2")
SUBNET = "10.231.0"
FRONTEND_PORT, BACKEND_PORT = 5700, 5701
#: Deadline of anything that normally takes a moment (a command, a process start).
WAIT = 30.0
#: How long everyone may take to reconnect to a proxy restarted on the same
#: endpoints: libzmq retries a lost connection every reconnect_ivl (100 ms
#: by default), so a few hundred ms on a quiet machine; this is the
#: documented bound (docs/proxy.md), not a measurement.
RECONNECT_BOUND = 10.0
NFT_TABLE = "upcall_fault"
#: Messages a second per publisher while a link drops packets at random: TCP
#: repairs each loss, but a lost segment's retransmission waits for its
#: timeout (200 ms at least, doubled if lost again), and what is sent
#: meanwhile must fit in the proxy's high-water mark and the kernel's buffers
#: for nothing to be dropped.
LOSSY_RATE = 500.0
HERE = os.path.dirname(os.path.abspath(__file__))


def unavailable() -> str | None:
    """Why the cluster cannot be made here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables"), ("tc", "iproute2")):
        if shutil.which(tool) is None:
            return f"`{tool}` ({package}) is not installed"
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip netns` is unavailable: {r.stderr.strip()}"
    return None


def _run(*args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=WAIT, input=input)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")
    return r


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Delete the namespaces of cluster makers that died without cleaning up."""
    removed = []
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        m = re.match(r"(upcall-cl-(\d+)-\w+)", line)
        if m and not _alive(int(m.group(2))):
            _run("ip", "netns", "del", m.group(1), check=False)
            removed.append(m.group(1))
    return removed


class Cluster:
    """The five hosts and their switch (see the module's text)."""

    def __init__(self) -> None:
        prefix = f"upcall-cl-{os.getpid()}"
        self.switch = f"{prefix}-sw"
        self.ns = {h: f"{prefix}-{h}" for h in HOSTS}
        self.addr = {h: f"{SUBNET}.{i + 1}" for i, h in enumerate(HOSTS)}
        self._made: list[str] = []
        self._old_term = None

    # ---- life cycle ----

    def __enter__(self) -> "Cluster":
        try:
            self._old_term = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        except ValueError:      # not the main thread: Ctrl-C and exceptions only
            self._old_term = None
        try:
            remove_stale()
            self._add_ns(self.switch)
            _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.switch, "link", "set", "br0", "up")
            for host in HOSTS:
                ns = self.ns[host]
                self._add_ns(ns)
                # Both ends are made inside the namespaces, never in ours.
                _run("ip", "-n", ns, "link", "add", "eth0", "type", "veth",
                     "peer", "name", self.port(host), "netns", self.switch)
                _run("ip", "-n", self.switch, "link", "set", self.port(host), "master", "br0")
                _run("ip", "-n", self.switch, "link", "set", self.port(host), "up")
                _run("ip", "-n", ns, "addr", "add", self.addr[host] + "/24", "dev", "eth0")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
                _run("ip", "-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _add_ns(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self._made.append(name)

    def __exit__(self, *exc) -> None:
        for ns in reversed(self._made):
            _run("ip", "netns", "del", ns, check=False)   # links and rules go with it
        self._made = []
        if self._old_term is not None:
            signal.signal(signal.SIGTERM, self._old_term)
            self._old_term = None

    def names(self) -> list[str]:
        return [self.switch, *self.ns.values()]

    # ---- where ----

    @staticmethod
    def port(host: str) -> str:
        return f"p-{host}"

    def exec_in(self, host: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns[host]]

    def frontend(self) -> str:
        return f"tcp://{self.addr['proxy']}:{FRONTEND_PORT}"

    def backend(self) -> str:
        return f"tcp://{self.addr['proxy']}:{BACKEND_PORT}"

    # ---- faults ----

    def nft(self, host: str, ruleset: str) -> None:
        """Load an nftables ruleset inside the host's namespace."""
        _run(*self.exec_in(host), "nft", "-f", "-", input=ruleset)

    def loss(self, host: str, percent: int) -> None:
        """Drop ``percent``% of the packets reaching the host, at random."""
        self.heal(host)
        self.nft(host, f"table inet {NFT_TABLE} {{\n chain input {{\n"
                       "  type filter hook input priority 0; policy accept;\n"
                       f"  numgen random mod 100 < {int(percent)} drop\n }}\n}}\n")

    def partition(self, host: str) -> None:
        """Drop every packet to and from the host but its loopback's: its
        link stays up, its connections open, nothing passes."""
        self.heal(host)
        self.nft(host, f"table inet {NFT_TABLE} {{\n"
                       " chain input { type filter hook input priority 0; policy drop;"
                       " iifname \"lo\" accept; }\n"
                       " chain output { type filter hook output priority 0; policy drop;"
                       " oifname \"lo\" accept; }\n}\n")

    def heal(self, host: str) -> None:
        """Remove the host's fault rules (none: nothing to do)."""
        _run(*self.exec_in(host), "nft", "delete", "table", "inet", NFT_TABLE, check=False)

    def link_down(self, host: str) -> None:
        _run("ip", "-n", self.switch, "link", "set", self.port(host), "down")

    def link_up(self, host: str) -> None:
        _run("ip", "-n", self.switch, "link", "set", self.port(host), "up")

    def rate_limit(self, host: str, rate: str) -> None:
        """Limit what the switch sends to the host to ``rate`` (tc syntax)."""
        _run("ip", "netns", "exec", self.switch, "tc", "qdisc", "replace", "dev",
             self.port(host), "root", "tbf", "rate", rate, "burst", "64kb", "latency", "50ms")

    def clear_all(self) -> None:
        """Every fault removed (after a failed scenario)."""
        for host in HOSTS:
            self.heal(host)
            self.link_up(host)
            _run("ip", "netns", "exec", self.switch, "tc", "qdisc", "del", "dev",
                 self.port(host), "root", check=False)


# ---- the processes ----------------------------------------------------------

class Peer:
    """A bench/cluster_peer.py process inside a host, and its conversation."""

    def __init__(self, net: Cluster, host: str, *argv: str) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        root = os.path.dirname(HERE)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (root, env.get("PYTHONPATH", "")) if p)
        self.host = host
        self.proc = subprocess.Popen(
            [*net.exec_in(host), sys.executable, os.path.join(HERE, "cluster_peer.py"), *argv],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1, env=env)
        self._lines: queue.Queue = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self._lines.put),
                         daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self._stderr.append),
                         daemon=True).start()

    @staticmethod
    def _pump(stream, put) -> None:
        for line in stream:
            put(line.rstrip("\n"))
        put(None)

    def describe(self) -> str:
        return (f"{self.host} (exit status {self.proc.poll()}); stderr:\n"
                + "\n".join(x for x in self._stderr if x is not None)[-3000:])

    def expect(self, word: str, timeout: float = WAIT) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                raise AssertionError(f"no {word!r} from {self.describe()}") from None
            if line is None:
                self._lines.put(None)
                raise AssertionError(f"ended before {word!r}: {self.describe()}")
            head, _, rest = line.partition(" ")
            if head == word:
                return rest

    REPLIES = {"start": "started", "stop": "stopped", "end": "ended", "quit": "bye"}

    def ask(self, command: str, timeout: float = WAIT) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.expect(self.REPLIES.get(command, command), timeout)

    def quit(self) -> None:
        if self.proc.poll() is None:
            try:
                self.ask("quit")
                self.proc.wait(WAIT)
            except (AssertionError, OSError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        try:
            self.proc.stdin.close()
        except OSError:
            pass


class Scenario:
    """The proxy and the two subscribers, running; publishers started per
    run.  ``stream(fault)`` runs both publishers through a fault and returns
    every subscriber's account of their streams."""

    def __init__(self, net: Cluster, rate: float = 2000.0, pad: int = 1024,
                 proxy_hwm: int = 1000) -> None:
        self.net = net
        self.rate, self.pad, self.proxy_hwm = rate, pad, proxy_hwm
        self.peers: list[Peer] = []
        self.proxy = self.start_proxy()
        self.subs = {
            "sub1": self._start(net, "sub1", "sub", "--endpoint", net.backend(),
                                "--topic", "p1.", "--topic", "p2."),
            "sub2": self._start(net, "sub2", "sub", "--endpoint", net.backend(),
                                "--topic", "p1.", "--topic", "p2.", "--asyncio"),
        }
        for sub in self.subs.values():
            sub.expect("ready")
        self.wait_proxy_subscribed()

    def lossless_rate(self, seconds: float) -> float:
        """Messages a second per publisher for a run of ``seconds`` that must
        lose nothing however busy the machine is: both publishers' whole
        flood fits in 40% of the proxy's high-water mark (the rest is room
        for the trickle at the end), so no process starved of CPU, however
        long, can overflow a queue.  What the links carry at full rate is the
        benchmark's to measure, not a test's."""
        return 0.4 * self.proxy_hwm / (2 * seconds)

    def wait_proxy_subscribed(self, timeout: float = WAIT) -> None:
        """Until both subscribers' two prefixes have reached the proxy (a
        publisher connecting later gets them from it)."""
        deadline = time.monotonic() + timeout
        while json.loads(self.proxy.ask("stats"))["stats"]["subscription_messages"] < 4:
            if time.monotonic() >= deadline:
                raise AssertionError("the subscriptions did not reach the proxy")
            time.sleep(0.05)

    def _start(self, net: Cluster, host: str, *argv: str) -> Peer:
        peer = Peer(net, host, *argv)
        self.peers.append(peer)
        return peer

    def start_proxy(self) -> Peer:
        # libzmq's default high-water mark per subscriber (1,000 messages):
        # enough for TCP to repair a lost packet unseen, while a subscriber
        # cut off for seconds overflows it and the kernel's buffers (2 x
        # 2,000 messages a second of 1 KiB: the proxy drops).
        proxy = self._start(self.net, "proxy", "proxy", "--frontend",
                            f"tcp://{self.net.addr['proxy']}:{FRONTEND_PORT}", "--backend",
                            f"tcp://{self.net.addr['proxy']}:{BACKEND_PORT}",
                            "--hwm", str(self.proxy_hwm))
        proxy.expect("ready")
        return proxy

    def start_pub(self, host: str, topic: str, rate: float | None = None) -> Peer:
        return self._start(self.net, host, "pub", "--endpoint", self.net.frontend(),
                           "--topic", topic, "--rate", str(rate or self.rate),
                           "--pad", str(self.pad))

    def close(self) -> None:
        for peer in reversed(self.peers):
            peer.quit()

    def reports(self) -> dict[str, dict]:
        return {name: json.loads(sub.ask("report")) for name, sub in self.subs.items()}

    def wait_for_streams(self, want: dict[int, int], timeout: float = WAIT) -> dict[str, dict]:
        """Until every subscriber has seen the last message of every stream
        (sid -> published); the reports then."""
        deadline = time.monotonic() + timeout
        while True:
            reps = self.reports()
            if all(reps[s]["account"].get(str(sid), {}).get("last", -1) >= n - 1
                   for s in reps for sid, n in want.items()):
                return reps
            if time.monotonic() >= deadline:
                raise AssertionError(f"streams {want} not complete within {timeout} s: "
                                     f"{ {s: r['account'] for s, r in reps.items()} }")
            time.sleep(0.1)

    def stream(self, before: float, fault=None, hold: float = 0.0, heal=None,
               after: float = 0.5, pubs=None, rate: float | None = None) -> dict:
        """Publish from pub1 and pub2 (new streams; ``rate`` messages a
        second each, None: the scenario's) for ``before`` seconds,
        apply ``fault()``, keep publishing ``hold`` seconds, ``heal()``,
        publish ``after`` seconds more, stop; wait for every stream's last
        message at both subscribers.  Returns {"published": {sid: n},
        "reports": ..., "pubs": [stopped json], "fault_seconds": ...}."""
        pubs = pubs or [self.start_pub("pub1", "p1.", rate), self.start_pub("pub2", "p2.", rate)]
        sids = [int(p.expect("ready")) for p in pubs]
        # Both prefixes have reached each publisher through the proxy
        # before its first message.
        self.wait_until_subscribed(pubs)
        for p in pubs:
            p.ask("start")
        time.sleep(before)
        t_fault = time.monotonic()
        if fault is not None:
            fault()
        time.sleep(hold)
        if heal is not None:
            heal()
        fault_seconds = time.monotonic() - t_fault
        time.sleep(after)
        published, reports, ended = self.finish(pubs)
        assert set(published) == set(sids)
        return {"published": published, "reports": reports, "pubs": ended,
                "fault_seconds": fault_seconds}

    def finish(self, pubs: list[Peer]) -> tuple[dict[int, int], dict, list[dict]]:
        """End the publishers' streams: the flood stops, a trickle goes on
        until every subscriber has what was sent by then, then the streams
        end and their last messages are waited for (a gap shows only when a
        later message arrives: the last ones must come through).  Returns
        (sid -> published, the reports, what each publisher said)."""
        stopped = [json.loads(p.ask("stop")) for p in pubs]
        self.wait_for_streams({s["sid"]: s["published"] for s in stopped})
        ended = [json.loads(p.ask("end")) for p in pubs]
        published = {s["sid"]: s["published"] for s in ended}
        reports = self.wait_for_streams(published)
        for p in pubs:
            p.quit()
        return published, reports, ended

    def wait_until_subscribed(self, pubs: list[Peer]) -> None:
        for p in pubs:
            p.ask("subscribed")


def accounting(result: dict) -> list[dict]:
    """One row per subscriber and stream: published, delivered, lost (the
    subscriber's own account from the payloads), what upcall detected
    (its streams() entry, when this upcall stamps), duplicates, reordered."""
    rows = []
    for sub, rep in sorted(result["reports"].items()):
        ups = rep.get("streams", {})
        for sid, published in result["published"].items():
            acc = rep["account"].get(str(sid), {})
            up = ups.get(str(sid), {})
            rows.append({"sub": sub, "sid": sid, "published": published,
                         "first": acc.get("first"), "last": acc.get("last"),
                         "delivered": acc.get("received", 0), "lost": acc.get("lost", 0),
                         "duplicates": acc.get("duplicates", 0),
                         "reordered": acc.get("reordered", 0),
                         "detected": up.get("lost"), "upcall_received": up.get("received")})
    return rows


# ---- the benchmark section --------------------------------------------------

def add_arguments(parser) -> None:
    parser.add_argument("--cluster-hold", type=float, default=None, metavar="S",
                        help="cluster: seconds each fault lasts (default 3; --full 10)")


def _throughput(net: Cluster, direct: bool, seconds: float) -> dict:
    """What one subscriber (in sub1) receives of one publisher sending as
    fast as it can (in pub1), directly or through the proxy: messages a
    second delivered, from the first send until the subscriber has
    everything sent during the flood (delivered or counted lost: a message
    of the trickle after it has arrived), and how many the way dropped."""
    endpoint = f"tcp://{net.addr['pub1']}:5702"
    pub = Peer(net, "pub1", "pub", "--endpoint", endpoint if direct else net.frontend(),
               "--topic", "t.", "--rate", "1e9", "--pad", "64", "--sndhwm", "0",
               "--subscriptions", "1", *(["--bind"] if direct else []))
    sub = Peer(net, "sub1", "sub", "--endpoint", endpoint if direct else net.backend(),
               "--topic", "t.")
    try:
        sid = int(pub.expect("ready"))
        sub.expect("ready")
        pub.ask("subscribed")
        t0 = time.monotonic()
        pub.ask("start")
        time.sleep(seconds)
        flooded = json.loads(pub.ask("stop"))["published"]
        deadline = time.monotonic() + WAIT * 4
        while True:
            acc = json.loads(sub.ask("report"))["account"].get(str(sid), {})
            if acc.get("last", -1) >= flooded or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        elapsed = time.monotonic() - t0
        pub.ask("end")
        return {"rate": acc.get("received", 0) / elapsed, "sent": acc.get("last", 0) + 1,
                "lost": acc.get("lost", 0)}
    finally:
        pub.quit()
        sub.quit()


def run(opts) -> list[dict]:
    from bench import report
    why = unavailable()
    if why:
        print(f"\n# cluster: skipped: {why}")
        return []
    hold = opts.cluster_hold or (10.0 if opts.full else 1.0 if opts.quick else 3.0)
    rows = []
    with Cluster() as net:
        sc = Scenario(net, rate=5000.0)
        try:
            plan = [
                ("clean", dict(before=hold)),
                ("1% loss at sub1", dict(before=0.5, fault=lambda: net.loss("sub1", 1),
                                         hold=hold, heal=lambda: net.heal("sub1"),
                                         rate=LOSSY_RATE)),
                (f"sub1 partitioned {hold:g} s", dict(before=0.5,
                                                      fault=lambda: net.partition("sub1"),
                                                      hold=hold,
                                                      heal=lambda: net.heal("sub1"))),
                (f"sub1 link down {hold:g} s", dict(before=0.5,
                                                    fault=lambda: net.link_down("sub1"),
                                                    hold=hold,
                                                    heal=lambda: net.link_up("sub1"))),
                ("sub1 link at 20 Mbit/s", dict(before=0.5,
                                                fault=lambda: net.rate_limit("sub1", "20mbit"),
                                                hold=hold, heal=net.clear_all)),
            ]
            seen_lost = {"sub1": 0, "sub2": 0}     # upcall's lost totals so far
            for name, kwargs in plan:
                result = sc.stream(**kwargs)
                acc = accounting(result)
                for sub in ("sub1", "sub2"):
                    mine = [r for r in acc if r["sub"] == sub]
                    total = result["reports"][sub]["stats"].get("lost")
                    detected = None if total is None else total - seen_lost[sub]
                    seen_lost[sub] = total or 0
                    rows.append({
                        "scenario": name, "sub": sub + (" (asyncio)" if sub == "sub2" else ""),
                        "published": sum(r["published"] for r in mine),
                        "delivered": sum(r["delivered"] for r in mine),
                        "lost": sum(r["lost"] for r in mine),
                        "detected": detected,
                        "exact": all(r["delivered"] + r["lost"] == r["published"]
                                     and r["first"] == 0 and r["duplicates"] == 0
                                     and r["reordered"] == 0 for r in mine)})
            seconds = 1.0 if opts.quick else 3.0
            direct = _throughput(net, True, seconds)
            through = _throughput(net, False, seconds)
        finally:
            sc.close()
    report.print_table(rows, [
        report.Column("scenario"), report.Column("sub"),
        report.Column("published"), report.Column("delivered"), report.Column("lost"),
        report.Column("detected", fmt=lambda v: "-" if v is None else str(v)),
        report.Column("exact", "delivered+lost==published", fmt=lambda v: "yes" if v else "NO"),
    ], title=f"cluster: 2 stamped publishers ({sc.rate:,.0f} msgs/s each, {LOSSY_RATE:,.0f} "
             f"under random loss; {sc.pad}-byte pad) -> proxy -> 2 subscribers, five network "
             "namespaces on one bridge; detected: upcall's own count (sub.stats['lost'])")
    tp = [{"path": "direct (pub1 -> sub1)", **direct},
          {"path": "through the proxy", **through, "ratio": through["rate"] / direct["rate"]}]
    report.print_table(tp, [report.Column("path"),
                            report.Column("rate", "delivered msgs/s", fmt=report.fmt_rate),
                            report.Column("sent"), report.Column("lost"),
                            report.Column("ratio", "x direct",
                                          fmt=lambda v: "" if v is None else f"{v:.2f}x")],
                       title=f"cluster: one stamped publisher flooding one subscriber for "
                             f"{seconds:g} s, 64-byte pad (the proxy drops at its high-water "
                             "mark what the subscriber cannot take; direct, the publisher "
                             "queues it)")
    return rows + tp
