"""One definition of the options: SubscribeOptions and PublisherOptions.

Each keyword argument of subscribe(), subscribe_async(), the synthetic
source and publisher() is one row of upcall/_options.pxi, checked once when
an options object is made; the signatures, the command line's options and
(by this test) the stubs follow the rows.  An options object is frozen,
reusable, and opens subscriptions and publishers with
``options=``; keywords given beside it replace its values.  The asyncio
adapter uses the bus's public hooks only, and every fork check is one
helper.
"""
import ast
import inspect
import os
import pickle
import re

import pytest

import upcall
from upcall import cli
from upcall._bus import _synthetic_subscribe
from helpers import Collector, TESTS_DIR, wait_for

SOURCE = os.path.dirname(TESTS_DIR)
PACKAGE = os.path.join(SOURCE, "upcall")
needs_source = pytest.mark.skipif(not os.path.exists(os.path.join(PACKAGE, "_options.pxi")),
                                  reason="reads the source tree")


def keywords(fn):
    return {p.name: p.default for p in inspect.signature(fn).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


# ---- the rows make the signatures ---------------------------------------------------

def test_subscribe_signature_is_the_rows():
    rows = upcall.SubscribeOptions.fields
    assert keywords(upcall.Bus.subscribe) == {
        **{name: row.default for name, row in rows.items()}, "options": None}


def test_subscribe_async_signature_is_the_rows_without_delivery():
    # with_sender calls target(msg, sender): the async bridge is a Handler.
    rows = upcall.SubscribeOptions.fields
    assert keywords(upcall.Bus.subscribe_async) == {
        **{name: row.default for name, row in rows.items()
           if name not in ("delivery", "with_sender")},
        "queue_size": None, "options": None}


def test_publisher_signature_is_the_rows():
    rows = upcall.PublisherOptions.fields
    assert keywords(upcall.Bus.publisher) == {
        **{name: row.default for name, row in rows.items()}, "options": None}


@needs_source
def test_the_stubs_name_every_row_once():
    # A new option is a row in _options.pxi and a line in _bus.pyi: this
    # fails when the two disagree.
    with open(os.path.join(PACKAGE, "_bus.pyi")) as f:
        tree = ast.parse(f.read())
    typed = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.endswith("Kwargs"):
            typed[node.name] = [n.target.id for n in node.body if isinstance(n, ast.AnnAssign)]
    subscribe = typed["SubscribeAsyncKwargs"] + typed["SubscribeKwargs"]
    assert sorted(subscribe) == sorted(upcall.SubscribeOptions.fields)
    assert typed["SubscribeKwargs"] == ["delivery", "with_sender"]
    assert sorted(typed["PublisherKwargs"]) == sorted(upcall.PublisherOptions.fields)


@needs_source
def test_the_keyword_list_is_written_nowhere_else():
    # The list of subscribe()'s keywords once appeared in six places; a
    # signature spelling several of them in a row is a copy.
    copy = re.compile(r"rcvhwm\s*=.*max_message_size\s*=|curve_serverkey\s*=\s*None,\s*"
                      r"curve_client\s*=", re.S)
    for name in os.listdir(PACKAGE):
        if name.endswith((".pyx", ".pxi", ".py")):
            with open(os.path.join(PACKAGE, name)) as f:
                text = f.read()
            for m in re.finditer(r"def \w+\((?:[^()]|\([^()]*\))*\)", text):
                assert not copy.search(m.group(0)), f"{name}: {m.group(0)[:80]}"


# ---- checked once, frozen ---------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, message", [
    (dict(kind="push"), ValueError, "kind must be 'sub' or 'pull', not 'push'"),
    (dict(batch=0), ValueError, "batch must be between 1 and 1000000"),
    (dict(copy=1), TypeError, "copy must be True or False, not int"),
    (dict(raw=True, decoder=bytes), ValueError, "decoder= and raw=True exclude each other"),
    (dict(topics=b"a"), TypeError, "topics must be an iterable"),
    (dict(kind="pull", topics=[b"a"]), ValueError, "topics apply to kind='sub' only"),
    (dict(topics=[b"a", b"b"], max_topics=1), ValueError, "more than the limit"),
    (dict(curve_client=("a", "b")), ValueError, "curve_client needs curve_serverkey"),
    (dict(socket_options={"nope": 1}), ValueError, "unknown option 'nope'"),
    (dict(on_error=5), TypeError, "on_error must be callable or None, not int"),
    (dict(topic=[b""]), TypeError, "subscribe() got an unexpected keyword argument 'topic'"),
])
def test_subscribe_options_are_checked_when_made(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        upcall.SubscribeOptions(**kwargs)
    with upcall.Bus() as bus:   # and subscribe() says the same, through them
        with pytest.raises(error, match=re.escape(message)):
            bus.subscribe("inproc://checked", print, **kwargs)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(kind="sub"), ValueError, "kind must be 'pub' or 'push', not 'sub'"),
    (dict(linger=-1), ValueError, "linger must be a number of seconds"),
    (dict(max_bytes=10), ValueError, "max_bytes must be between 64 and"),
    (dict(default=print, encoder=bytes), TypeError, "give default= "),
    (dict(coalesce="yes"), TypeError, "coalesce must be True or False, not str"),
    (dict(lingr=1), TypeError, "publisher() got an unexpected keyword argument 'lingr'"),
])
def test_publisher_options_are_checked_when_made(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        upcall.PublisherOptions(**kwargs)
    with upcall.Bus() as bus:
        with pytest.raises(error, match=re.escape(message)):
            bus.publisher("inproc://checked", **kwargs)


def test_options_are_frozen_and_replace_makes_a_checked_copy():
    opts = upcall.SubscribeOptions(kind="pull", batch=7)
    with pytest.raises(AttributeError, match="frozen"):
        opts.batch = 8
    with pytest.raises(AttributeError):
        opts.no_such_option
    other = opts.replace(batch=8)
    assert (opts.batch, other.batch, other.kind) == (7, 8, "pull")
    with pytest.raises(ValueError, match="batch must be between"):
        opts.replace(batch=0)
    assert opts == upcall.SubscribeOptions(kind="pull", batch=7) != other
    assert pickle.loads(pickle.dumps(opts)) == opts
    assert repr(opts) == "upcall.SubscribeOptions(kind='pull', batch=7)"
    # Kept as checked: prefixes as bytes, once each.
    assert upcall.SubscribeOptions(topics=["a", b"a", "b"]).topics == (b"a", b"b")


def test_one_options_object_opens_many_subscriptions(endpoints):
    opts = upcall.SubscribeOptions(kind="pull", bind=True, with_topic=True)
    got_a, got_b = Collector(), Collector()
    with upcall.Bus() as bus:
        ep_a, ep_b = endpoints("ipc"), endpoints("ipc")
        sub_a = bus.subscribe(ep_a, got_a, options=opts)
        sub_b = bus.subscribe(ep_b, got_b, options=opts, with_topic=False)   # replaced
        for ep in (ep_a, ep_b):
            bus.publisher(ep, kind="push", bind=False).send(b"t", {"x": 1})
        wait_for(lambda: len(got_a.items) == 1 and len(got_b.items) == 1)
        assert got_a.items == [(b"t", {"x": 1})]
        assert got_b.items == [{"x": 1}]
        assert opts.with_topic is True          # the object was only read
        sub_a.close()
        sub_b.close()


def test_options_of_the_other_kind_are_refused():
    with upcall.Bus() as bus:
        with pytest.raises(TypeError, match="options must be an upcall.SubscribeOptions"):
            bus.subscribe("inproc://x", print, options=upcall.PublisherOptions())
        with pytest.raises(TypeError, match="options must be an upcall.PublisherOptions"):
            bus.publisher("inproc://x", options=upcall.SubscribeOptions())


def test_publisher_options_object(endpoints):
    got = Collector()
    opts = upcall.PublisherOptions(kind="push", bind=False, coalesce=True, max_delay=None)
    with upcall.Bus() as bus:
        ep = endpoints("ipc")
        bus.subscribe(ep, got, kind="pull", bind=True)
        pub = bus.publisher(ep, options=opts)
        pub.send(b"t", 1)
        pub.send(b"t", 2)
        assert pub.pending == 2                 # coalesce=True came from the object
        pub.flush()
        wait_for(lambda: got.items == [1, 2])


async def _subscribe_async_with_delivery(bus):
    bus.subscribe_async("inproc://a", delivery="caller")


def test_subscribe_async_takes_no_delivery():
    import asyncio
    with upcall.Bus() as bus:
        with pytest.raises(TypeError,
                           match="subscribe_async\\(\\) got an unexpected keyword argument "
                                 "'delivery'"):
            asyncio.run(_subscribe_async_with_delivery(bus))


def test_the_synthetic_source_takes_the_rows_marked_for_it():
    with upcall.Bus() as bus:
        with pytest.raises(TypeError, match="a synthetic source takes only batch, delivery"):
            _synthetic_subscribe(bus, print, count=1, rcvhwm=5)
        got = Collector()
        sub = _synthetic_subscribe(bus, got, count=3, batch=2, with_topic=True)
        assert sub.wait(10)
        assert got.items == [(b"", None)] * 3


# ---- the command line reads the rows --------------------------------------------------

def test_cli_options_come_from_the_rows():
    parser = cli.build_parser()
    listen = parser._subparsers._group_actions[0].choices["listen"]
    publish = parser.get_default("publish_parser")
    kind = {a.dest: a for a in listen._actions}["kind"]
    assert tuple(kind.choices) == upcall.SubscribeOptions.fields["kind"].check.choices
    kind = {a.dest: a for a in publish._actions}["kind"]
    assert tuple(kind.choices) == upcall.PublisherOptions.fields["kind"].check.choices
    mms = {a.dest: a for a in listen._actions}["max_message_size"]
    # The option's own check, and its message, on the command line.
    with pytest.raises(Exception, match="max_message_size must be between 1 and"):
        mms.type(str(2 ** 63))


# ---- one fork check; the asyncio adapter over public hooks ---------------------------

@needs_source
def test_the_fork_check_is_written_once():
    pasted = 0
    for name in ("_bus.pyx", "_subscription.pxi", "_publisher.pxi"):
        with open(os.path.join(PACKAGE, name)) as f:
            text = f.read()
        pasted += len(re.findall(r"[!=]=\s*_fork_generation", text))
        pasted += text.count("_inherited_error(")
    assert pasted == 1          # the comparison in _inherited(), in _bus.pyx


@needs_source
def test_aio_uses_public_hooks_only():
    with open(os.path.join(PACKAGE, "aio.py")) as f:
        text = f.read()
    # Attributes of the bus's objects that aio reaches: none private.
    private = re.findall(r"\b(?:pub|bus|self\._sub|sub)\._\w+", text)
    assert private == []
    # The bus names the adapter in one place.
    names = 0
    for name in os.listdir(PACKAGE):
        if name.endswith((".pyx", ".pxi")):
            with open(os.path.join(PACKAGE, name)) as f:
                names += len(re.findall(r"import upcall\.aio|from upcall\.aio", f.read()))
    assert names == 1
