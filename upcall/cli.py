"""The ``upcall`` command line (``python -m upcall`` runs it too).

    upcall listen ENDPOINT [--topic T ...] [--bind] [--kind sub|pull] [--count N]
                  [--max-message-size BYTES]
    upcall publish ENDPOINT [--topic T] [--bind] [--kind pub|push] [JSON ...]
    upcall proxy FRONTEND BACKEND [--connect-frontend] [--connect-backend] [--hwm N]
                 [--frontend-curve CERT] [--frontend-allow CERTS] (and --backend-...)
    upcall --version

``listen`` prints one JSON line per message, ``{"topic": ..., "payload": ...}``;
``publish`` sends each JSON argument (or each line of stdin) as one message.
msgpack types that JSON lacks use the ``$`` forms of :mod:`upcall._jsonmap`
(docs/cli.md).  A failure prints one line on stderr, never a
traceback: status 2 for a command line that cannot be used (argparse's
errors, a JSON argument that does not parse), 1 for a failure while running
(an endpoint libzmq refuses, an address in use, a bad JSON line on stdin, a
wait that timed out), 130 after Ctrl-C.  ``proxy`` runs until Ctrl-C (130)
or SIGTERM (0, a service's normal stop), closing its sockets either way.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Iterator, Optional, Sequence

import upcall
from upcall._bus import PublisherOptions, SubscribeOptions
from upcall._codec import DEFAULT_MAX_DEPTH
from upcall._jsonmap import dumps, from_json, to_json, topic_to_json

PROG = "upcall"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130    # what a shell reports for a command ended by SIGINT


class Failure(Exception):
    """A failure reported as one line on stderr and an exit status."""

    def __init__(self, message: str, status: int = EXIT_FAILED):
        super().__init__(message)
        self.status = status


def _describe(exc: BaseException) -> str:
    """One line for an exception from upcall: OSError's "[Errno N]" prefix
    dropped (its text names the call and the reason)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


# ---- listen -------------------------------------------------------------------

def _listen(opts: argparse.Namespace) -> int:
    printed = 0
    out = sys.stdout
    showing = b""

    def show(topic: bytes, msg: Any) -> None:
        nonlocal printed, showing
        showing = topic
        # Converted and written without recursion: every message upcall
        # decodes shows, however deep.
        line = dumps({"topic": topic_to_json(topic), "payload": to_json(msg)})
        out.write(line + "\n")
        out.flush()
        printed += 1

    def on_error(exc: BaseException, msg: Any) -> None:
        if isinstance(exc, BrokenPipeError):
            # stdout's reader went away (`upcall listen ... | head`): end quietly.
            _silence_stdout()
            raise upcall.StopDelivery
        # A DecodeError names its topic; anything else came from show(),
        # which was showing the message of topic `showing`.
        where = "" if isinstance(exc, upcall.DecodeError) else f" (topic {bytes(showing)!r})"
        print(f"{PROG} listen: message skipped: {_describe(exc)}{where}", file=sys.stderr,
              flush=True)

    kwargs: dict[str, Any] = dict(kind=opts.kind, bind=opts.bind, delivery="caller",
                                  with_topic=True, on_error=on_error)
    if opts.kind == "sub":
        kwargs["topics"] = [_topic(t) for t in opts.topic] if opts.topic else [b""]
    elif opts.topic:
        raise Failure("--topic is for --kind sub (a pull socket has no topics)", EXIT_USAGE)
    if opts.curve_serverkey:
        kwargs["curve_serverkey"] = opts.curve_serverkey
    if opts.max_message_size is not None:
        kwargs["max_message_size"] = opts.max_message_size
    # Each event as the socket's monitor reports it, on this thread (poll()
    # reads the monitor beside the messages): all of them with --verbose,
    # else what went wrong.  The printer says it: the events' own log
    # records would say it twice.
    kwargs["on_event"] = _EventPrinter("listen", opts.verbose)
    logging.getLogger("upcall.events").addHandler(logging.NullHandler())
    with upcall.Bus() as bus:
        try:
            sub = bus.subscribe(opts.endpoint, show, **kwargs)
        except (ValueError, OSError, TypeError) as e:
            raise Failure(_describe(e)) from None
        if opts.verbose:
            print(f"{PROG} listen: {'bound to' if opts.bind else 'connecting to'} "
                  f"{sub.last_endpoint}", file=sys.stderr, flush=True)
        # poll() counts skipped messages too: ask it for at most the lines
        # still wanted, so that it never delivers more than --count.
        while not sub.closed and (opts.count is None or printed < opts.count):
            sub.poll(timeout=None,
                     max_messages=None if opts.count is None else opts.count - printed)
        if not sub.closed:
            sub.close()
    return EXIT_OK


class _EventPrinter:
    """on_event for the command line: one line on stderr per connection
    event (``verbose``), or only for what went wrong (a connect that failed,
    said once until the next change, with why: the event's cause; a failed
    handshake)."""

    def __init__(self, command: str, verbose: bool = True):
        self.command = command
        self.verbose = verbose
        self.retrying: set[str] = set()     # said once until the next change

    def __call__(self, ev: Any) -> None:
        if ev.kind == "connect_retried":
            if ev.endpoint in self.retrying:
                return
            self.retrying.add(ev.endpoint)
            why = {"unresolved": f"cannot resolve {_host_of(ev.endpoint)}",
                   "refused": "connection refused"}.get(ev.cause, "no reason given")
            text = f"connect retried: {why} ({ev.endpoint}); libzmq keeps retrying"
        elif ev.kind == "handshake_failed":
            text = f"handshake failed ({ev.cause}) with a peer of {ev.endpoint}"
        else:
            self.retrying.discard(ev.endpoint)
            if not self.verbose:
                return
            text = f"{ev.kind.replace('_', ' ')} ({ev.endpoint})"
        print(f"{PROG} {self.command}: {text}", file=sys.stderr, flush=True)


def _not_connect_retried(record: logging.LogRecord) -> bool:
    return getattr(record, "event", None) != "connect_retried"


def _host_of(endpoint: str) -> str:
    """The host of a tcp:// endpoint (tcp://[source;]host:port)."""
    host = endpoint.partition("://")[2].rpartition(":")[0]
    return host.rpartition(";")[2].strip("[]")


# ---- proxy --------------------------------------------------------------------

class _Terminated(Exception):
    """SIGTERM, raised on the main thread by its handler (as Ctrl-C raises
    KeyboardInterrupt), so that the bus closes on the way out."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated


def _proxy_side_kwargs(opts: argparse.Namespace, side: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {f"{side}_bind": not getattr(opts, f"connect_{side}")}
    cert = getattr(opts, f"{side}_curve")
    allow = getattr(opts, f"{side}_allow")
    try:
        if cert is not None:
            kwargs[f"{side}_curve_server"] = upcall.load_certificate(cert)
        if allow is not None:
            kwargs[f"{side}_allow"] = [upcall.load_certificate(p) for p in allow]
    except (OSError, ValueError) as exc:
        raise Failure(f"--{side}-curve/--{side}-allow: {_describe(exc)}") from None
    if opts.hwm is not None:
        kwargs[f"{side}_hwm"] = opts.hwm
    return kwargs


def _proxy(opts: argparse.Namespace) -> int:
    kwargs = {**_proxy_side_kwargs(opts, "frontend"), **_proxy_side_kwargs(opts, "backend")}
    if opts.verbose:
        kwargs["on_event"] = _EventPrinter("proxy")
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    status = EXIT_OK
    proxy = None
    # A signal is a clean stop wherever it lands once the proxy runs: while
    # the line below is written too (a script that reads it may signal at
    # once), so the bus closes on the way out of its block and the counts
    # are said.
    try:
        with upcall.Bus() as bus:
            try:
                proxy = bus.proxy(opts.frontend, opts.backend, **kwargs)
            except (ValueError, OSError, TypeError) as e:
                raise Failure(_describe(e)) from None
            # One line on stderr once both sides are bound or connecting: the
            # ports of tcp://...:* binds, and the sign that it runs.
            print(f"{PROG} proxy: frontend {proxy.frontend}, backend {proxy.backend}",
                  file=sys.stderr, flush=True)
            bus.wait()
    except KeyboardInterrupt:
        status = EXIT_INTERRUPTED
    except _Terminated:
        status = EXIT_OK
    finally:
        signal.signal(signal.SIGTERM, previous)
    if proxy is not None:
        st = proxy.stats
        print(f"{PROG} proxy: stopped; forwarded {st['messages']} messages "
              f"({st['bytes']} bytes), {st['subscription_messages']} subscription messages",
              file=sys.stderr, flush=True)
    return status


# ---- publish ------------------------------------------------------------------

def _topic(arg: str) -> bytes:
    """A --topic as the bytes given on the command line: a topic is bytes on
    the wire, and one that is not UTF-8 reaches Python as surrogate escapes
    (os.fsencode gives its bytes back)."""
    return os.fsencode(arg)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON: non-finite floats are written "
                     '{"$float": "nan"}, "inf" or "-inf"')


def _parse(data: bytes, where: str) -> Any:
    """One JSON text (UTF-8, as JSON is) as the value to send."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Failure(f"{where}: bad JSON: not UTF-8: {e}") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        # json.loads recurses in C and stops near Python's recursion limit:
        # past what upcall encodes, except for $map forms (three JSON levels
        # per msgpack level) nested some hundreds deep.
        raise Failure(f"{where}: bad JSON: nested too deeply to parse (upcall takes at most "
                      f"{DEFAULT_MAX_DEPTH} levels)") from None
    except ValueError as e:     # json.JSONDecodeError is one
        raise Failure(f"{where}: bad JSON: {e}") from None
    try:
        return from_json(value)
    except ValueError as e:
        raise Failure(f"{where}: bad JSON: {e}") from None


def _messages(opts: argparse.Namespace) -> Iterator[Any]:
    if opts.json:
        # Every argument is checked before anything is sent.
        parsed = []
        for i, text in enumerate(opts.json, 1):
            try:
                parsed.append(_parse(os.fsencode(text), f"argument {i}"))
            except Failure as f:
                f.status = EXIT_USAGE
                raise
        yield from parsed
        return
    # Bytes: a line that is not UTF-8 is reported as such, whatever the locale.
    for lineno, line in enumerate(sys.stdin.buffer, 1):
        if line.strip():
            yield _parse(line, f"stdin line {lineno}")


def _publish(opts: argparse.Namespace) -> int:
    messages = _messages(opts)
    if opts.json:
        messages = iter(list(messages))      # bad arguments fail before any socket opens
    topic = _topic(opts.topic)
    kwargs: dict[str, Any] = dict(kind=opts.kind, bind=opts.bind, linger=opts.linger)
    # A connect that fails is what "waiting for a peer" says here: not
    # again as a log record.
    logging.getLogger("upcall.events").addFilter(_not_connect_retried)
    if opts.curve_serverkey:
        kwargs["curve_serverkey"] = opts.curve_serverkey
    ready = threading.Event()
    if opts.kind == "push":
        def on_event(ev: Any) -> None:
            if ev.kind == "handshake_succeeded":
                ready.set()
        kwargs["on_event"] = on_event
    with upcall.Bus() as bus:
        try:
            pub = bus.publisher(opts.endpoint, **kwargs)
        except (ValueError, OSError, TypeError) as e:
            raise Failure(_describe(e)) from None
        if opts.kind == "push" and opts.wait > 0:
            # A PUSH with no peer would queue the messages and then drop
            # them when its linger ends, saying nothing: wait for a peer,
            # and say so.
            _wait_for_peer(pub, ready, opts.bind, opts.wait_timeout)
        if opts.kind == "pub" and opts.wait > 0:
            # The slow joiner: a PUB drops what it sends before a subscriber
            # has subscribed; wait for the subscriptions first.  (A PUSH
            # needs no wait: its send waits for a peer by itself.)
            try:
                pub.wait_subscriptions(opts.wait, timeout=opts.wait_timeout)
            except TimeoutError:
                raise Failure(f"no subscriber on {pub.last_endpoint} within "
                              f"{opts.wait_timeout} s (--wait-timeout)") from None
        sent = 0
        for obj in messages:
            try:
                pub.send(topic, obj)
            except (TypeError, ValueError, OverflowError) as e:
                raise Failure(f"message {sent + 1}: cannot send: {_describe(e)}") from None
            sent += 1
        try:
            pub.close()          # lingers until sent, at most --linger seconds
        except (ValueError, OSError) as e:
            raise Failure(_describe(e)) from None
    return EXIT_OK


#: Seconds a push waits for its peer before saying so on stderr.
WAIT_NOTICE = 1.0


def _wait_for_peer(pub: Any, ready: threading.Event, bound: bool,
                   timeout: Optional[float]) -> None:
    """Until a peer's handshake succeeded (ready), --wait-timeout or Ctrl-C.
    Said on stderr once the wait is longer than a connection on a working
    network takes (WAIT_NOTICE seconds), or when it ends in failure."""
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    said = False
    while not ready.is_set():
        now = time.monotonic()
        expired = deadline is not None and now >= deadline
        if not said and (expired or now - start >= WAIT_NOTICE):
            where = "to connect to" if bound else "at"
            print(f"{PROG} publish: waiting for a peer {where} {pub.last_endpoint} "
                  "(--wait 0: do not wait; Ctrl-C ends it)", file=sys.stderr, flush=True)
            said = True
        if expired:
            raise Failure(f"no peer on {pub.last_endpoint} within {timeout} s "
                          "(--wait-timeout)")
        # Slices, so that Ctrl-C is seen; ready wakes it at once.
        left = [0.2, WAIT_NOTICE - (now - start) if not said else 0.2]
        if deadline is not None:
            left.append(deadline - now)
        ready.wait(max(0.0, min(left)))


# ---- the parser -----------------------------------------------------------------

def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def _add_option(parser: argparse.ArgumentParser, options: type[Any], name: str,
                parse: Any = None, **overrides: Any) -> None:
    """``--NAME`` for the option ``name`` of ``options`` (SubscribeOptions or
    PublisherOptions): its default, help and choices, and its value checked
    by the option's own check (one message for the API and the command line);
    ``parse`` turns the text into the value first; ``overrides``: argparse's
    keywords where the command line differs."""
    row = options.fields[name]
    kwargs: dict[str, Any] = dict(default=row.default, help=row.help)
    choices = getattr(row.check, "choices", None)
    if choices is not None:
        kwargs["choices"] = list(choices)
        kwargs["help"] = f"{row.help} (default: {row.default})"
    elif parse is not None:
        check = row.check

        def convert(text: str) -> Any:
            value = parse(text)
            try:
                return value if check is None else check(value)
            except (TypeError, ValueError) as e:
                raise argparse.ArgumentTypeError(str(e)) from None
        kwargs["type"] = convert
    kwargs.update(overrides)
    parser.add_argument("--" + name.replace("_", "-"), **kwargs)


def _count(text: str) -> int:
    n = _positive(text) if text != "0" else 0
    return n


def _seconds(text: str) -> Optional[float]:
    if text.lower() in ("none", "inf"):
        return None
    try:
        s = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not s >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {text}")
    return s


JSON_HELP = """\
JSON mapping (both directions): null, true/false, numbers, strings, arrays
and objects as themselves (a float keeps its fraction: 1.0); what JSON lacks
is a one-key object:
  {"$bytes": "<base64>"}                     msgpack bin
  {"$float": "nan" | "inf" | "-inf"}         non-finite floats (the only
                                             way: NaN, Infinity, 1e400 are
                                             refused)
  {"$map": [[key, value], ...]}              a map with non-string keys (or
                                             keys starting with $); a key is
                                             never an array or a map
  {"$timestamp": "2023-11-14T22:13:20.000000005Z"}   msgpack Timestamp (UTC;
                                             [seconds, nanoseconds] outside
                                             years 1..9999)
  {"$ext": [code, "<base64>"]}               any other msgpack ext
A topic prints as a string when it is UTF-8, else as {"$bytes": ...};
--topic is the bytes of its argument, UTF-8 or not.  At most 512 levels
of nesting (upcall's max_depth).

Exit status: 0 done, 1 failed while running (endpoint refused, address in
use, bad JSON on stdin, wait timed out), 2 unusable command line (including
a JSON argument that does not parse), 130 interrupted (Ctrl-C)."""


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=fmt,
        description="Listen to and publish on a ZeroMQ bus of msgpack messages\n"
                    "([topic, payload] multipart, as upcall and pyzmq + msgpack send them).",
        epilog=JSON_HELP)
    parser.add_argument("--version", action="version",
                        version=f"{PROG} {upcall.__version__} (Python {sys.version.split()[0]})")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    lp = commands.add_parser(
        "listen", formatter_class=fmt, epilog=JSON_HELP,
        help="print one JSON line per message received",
        description='Receive messages and print each as one JSON line:\n'
                    '  {"topic": ..., "payload": ...}\n'
                    "Ctrl-C ends it (status 130).")
    lp.add_argument("endpoint", metavar="ENDPOINT",
                    help="tcp://host:port or ipc://path")
    lp.add_argument("--topic", "-t", action="append", default=[], metavar="T",
                    help="a topic prefix to subscribe to (repeatable; default: everything)")
    lp.add_argument("--bind", action="store_true",
                    help="bind ENDPOINT (default: connect to it)")
    _add_option(lp, SubscribeOptions, "kind")
    lp.add_argument("--count", "-n", type=_positive, default=None, metavar="N",
                    help="exit after N messages (default: run until Ctrl-C)")
    _add_option(lp, SubscribeOptions, "curve_serverkey", metavar="K")
    _add_option(lp, SubscribeOptions, "max_message_size", parse=_positive, metavar="BYTES",
                help="skip messages larger than BYTES once decompressed (and drop a "
                     "peer sending a larger frame); default: no limit on frames, "
                     f"{upcall.DEFAULT_MAX_DECOMPRESSED // (1 << 20)} MiB of decompressed "
                     "values per message")
    lp.add_argument("--verbose", "-v", action="store_true",
                    help="say on stderr where it listens (the port of a tcp://...:* bind) "
                         "and each connection event as it happens")
    lp.set_defaults(run=_listen)

    pp = commands.add_parser(
        "publish", formatter_class=fmt, epilog=JSON_HELP,
        help="send JSON values as msgpack messages",
        description="Send each JSON argument as one message, or, with none, each\n"
                    "non-blank line of stdin.  A pub publisher first waits until a\n"
                    "subscriber has subscribed, so the first message is not lost.")
    pp.add_argument("endpoint", metavar="ENDPOINT",
                    help="tcp://host:port or ipc://path")
    pp.add_argument("json", nargs="*", metavar="JSON",
                    help="messages to send (default: JSON lines from stdin)")
    pp.add_argument("--topic", "-t", default="", metavar="T",
                    help="the topic of every message (default: empty)")
    pp.add_argument("--bind", action="store_true",
                    help="bind ENDPOINT (default: connect to it)")
    _add_option(pp, PublisherOptions, "kind")
    pp.add_argument("--wait", type=_count, default=1, metavar="N",
                    help="pub: subscriptions to wait for before sending "
                         "(Publisher.wait_subscriptions; default 1, 0: do not wait); "
                         "push: wait for a peer first (0: do not wait)")
    pp.add_argument("--wait-timeout", type=_seconds, default=None, metavar="S",
                    help="give up (status 1) if they (or a push's peer) are not there after S seconds "
                         "(default: wait until Ctrl-C)")
    _add_option(pp, PublisherOptions, "linger", parse=_seconds, default=5.0, metavar="S",
                help="at exit, wait at most S seconds for unsent messages (default 5)")
    _add_option(pp, PublisherOptions, "curve_serverkey", metavar="K")
    pp.set_defaults(run=_publish)

    xp = commands.add_parser(
        "proxy", formatter_class=fmt,
        help="forward from publishers to subscribers (XSUB/XPUB)",
        description="Forward messages from publishers (which connect to FRONTEND)\n"
                    "to subscribers (which connect to BACKEND), and subscriptions\n"
                    "the other way, with libzmq's own proxy; until Ctrl-C (status\n"
                    "130) or SIGTERM (status 0).  Says on stderr where it listens,\n"
                    "and at the end what it forwarded.")
    xp.add_argument("frontend", metavar="FRONTEND",
                    help="where publishers send: tcp://host:port or ipc://path (bound)")
    xp.add_argument("backend", metavar="BACKEND",
                    help="where subscribers subscribe: tcp://host:port or ipc://path (bound)")
    for side in ("frontend", "backend"):
        xp.add_argument(f"--connect-{side}", action="store_true",
                        help=f"connect {side.upper()} instead of binding it")
        xp.add_argument(f"--{side}-curve", metavar="CERT", default=None,
                        help=f"make {side.upper()} a CURVE server with this secret "
                             "certificate (upcall keygen's NAME.key_secret)")
        xp.add_argument(f"--{side}-allow", metavar="CERT", action="append", default=None,
                        help=f"admit only the CURVE clients of these public certificates "
                             f"at {side.upper()} (repeatable; needs --{side}-curve)")
    xp.add_argument("--hwm", type=_count, default=None, metavar="N",
                    help="high-water mark of both sides, per peer (default: libzmq's 1000)")
    xp.add_argument("--verbose", "-v", action="store_true",
                    help="each connection event of either side on stderr")
    xp.set_defaults(run=_proxy)

    kp = commands.add_parser(
        "keygen", formatter_class=fmt,
        help="write a CURVE key pair as certificate files",
        description="Write a new CURVE key pair as NAME.key (the public certificate,\n"
                    "to give to peers) and NAME.key_secret (readable by the owner\n"
                    "only), in the format of CZMQ's zcert and pyzmq's zmq.auth.\n"
                    "Prints the two paths and the public key; never the secret key.")
    kp.add_argument("name", metavar="NAME", help="the files' name, without a directory")
    kp.add_argument("--dir", "-d", default=".", metavar="D",
                    help="the directory to write them in (default: the current one)")
    kp.add_argument("--force", action="store_true",
                    help="replace files of that name (default: refuse, status 1)")
    kp.set_defaults(run=_keygen)

    parser.set_defaults(publish_parser=pp)
    return parser


def _keygen(opts: argparse.Namespace) -> int:
    name = opts.name
    if not name or "/" in name or os.sep in name or name in (".", ".."):
        raise Failure(f"NAME must be a file name without a directory, not {name!r}",
                      EXIT_USAGE)
    if not os.path.isdir(opts.dir):
        raise Failure(f"--dir {opts.dir!r} is not a directory", EXIT_FAILED)
    try:
        # Never through a link; an existing path (a link included) is
        # replaced only with --force, and then the path, not a link's target.
        public_path, secret_path = upcall.create_certificates(opts.dir, name,
                                                              overwrite=opts.force)
    except FileExistsError as exc:
        raise Failure(f"{exc.filename or exc} exists (--force replaces it)",
                      EXIT_FAILED) from None
    except OSError as exc:
        raise Failure(f"cannot write the certificates: {exc}", EXIT_FAILED) from None
    cert = upcall.load_certificate(public_path)
    print(f"public key {cert.public}")
    print(f"public certificate {public_path}")
    print(f"secret certificate {secret_path} (mode 0600)")
    return EXIT_OK


#: Options whose value is a Z85 key.
_KEY_OPTIONS = ("--curve-serverkey",)


def _join_key_values(argv: list[str]) -> list[str]:
    """``--curve-serverkey KEY`` as ``--curve-serverkey=KEY``: `-` is in the
    Z85 alphabet, so about one key in 85 starts with it, and argparse takes
    a separate value that starts with `-` for an option ("expected one
    argument")."""
    out: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg in _KEY_OPTIONS:
            value = next(it, None)
            out.append(arg if value is None else f"{arg}={value}")
        else:
            out.append(arg)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; return the exit status."""
    parser = build_parser()
    argv = _join_key_values(list(sys.argv[1:] if argv is None else argv))
    if argv[:1] == ["publish"]:
        # JSON arguments may come after options (`publish EP -t a '{...}'`):
        # intermixed parsing, which argparse offers for a parser without
        # subcommands only.
        opts = parser.get_default("publish_parser").parse_intermixed_args(argv[1:])
        opts.command = "publish"
    else:
        opts = parser.parse_args(argv)
    command = f"{PROG} {opts.command}"
    try:
        if any(str(getattr(opts, name, "")).startswith("inproc://")
               for name in ("endpoint", "frontend", "backend")):
            # libzmq would accept it and wait forever for a peer that cannot come.
            raise Failure("an inproc:// endpoint exists only inside one process: "
                          "use ipc:// or tcp:// to reach another", EXIT_USAGE)
        return opts.run(opts)
    except Failure as f:
        print(f"{command}: {f}", file=sys.stderr, flush=True)
        return f.status
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of stdout went away (`upcall listen ... | head`).
        _silence_stdout()
        return EXIT_OK


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the flush at exit does not complain
    about the broken pipe once more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
