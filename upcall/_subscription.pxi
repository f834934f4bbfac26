# Subscription: one receive loop delivering decoded messages to one target.

# Most messages delivered per GIL crossing when batch=None.  A busy main
# thread hands the GIL over only once per switch interval (5 ms by default),
# so one crossing must drain what arrived meanwhile: 256 capped a contended
# subscription at 256 per 5 ms (49k of 100k msgs/s offered over tcp), 1024
# took them all (PERF.md, Contention).  A batch only takes what is already
# queued, so a larger one adds no latency; it costs ~220 KB of frame pool.
DEFAULT_BATCH = 1024

# Most topic prefixes a SUB subscription holds when max_topics=None.  Every
# prefix is kept by upcall (sub.topics), by the SUB socket (a trie: up to a
# node per byte), by each publisher it reaches, and is sent again, all at
# once, on every connection and reconnection: 100,000 distinct prefixes of
# 16 bytes took about 27 MiB in the subscribing process, 26 MiB in the
# publishing one, and 0.3 s to go out on each connection (1,000,000: 265 MiB,
# 220 MiB, 2.4-5 s; docs/security.md).  More is one argument away:
# subscribe(max_topics=N).
DEFAULT_MAX_TOPICS = 100_000

# Stamped publisher streams a subscription's socket tracks when
# max_streams=None (docs/wire.md, "Stamps"): 40 bytes of counters each, plus
# two index slots; a new stream past it forgets the oldest.
DEFAULT_MAX_STREAMS = UC_STREAMS_DEFAULT_MAX


cdef struct _poll_progress:
    size_t limit                  # max_messages (0: no limit)
    size_t done                   # messages taken in so far (delivered or decode errors)
    bint started                  # a step has run


cdef int _poll_step(object owner, int slice_ms, void *arg) except -1:
    cdef Subscription sub = <Subscription>owner
    cdef _poll_progress *p = <_poll_progress *>arg
    cdef size_t got = 0
    cdef int rc
    with nogil:
        rc = uc_sub_poll_some(sub._c, slice_ms, p.limit - p.done if p.limit else 0, &got)
    p.done += got
    if sub._pending is not None:
        # From the target or on_error; the rest of its batch waits in the
        # core for the next poll.
        exc, sub._pending = sub._pending, None
        raise exc
    if rc == UC_ERR_CLOSED:
        if not p.started:      # closed (by another thread) since poll() checked
            raise ValueError("poll() on a closed subscription")
        return 1
    p.started = True
    _check_rc(rc, "poll")
    # Something taken: poll() returns it now rather than wait for more.
    return p.done > 0 or sub._closed or uc_sub_finished(sub._c) != 0


@cython.final
cdef class _Inbox:
    """The target of a subscription opened without one (recv()): holds the
    one message the last poll of a single message delivered, until recv()
    returns it."""
    cdef object msg
    cdef bint full

    def __call__(self, *args):
        # target(msg), or target(topic, msg) with with_topic: (topic, msg).
        self.msg = args[0] if len(args) == 1 else args
        self.full = True


cdef int _recv_step(object owner, int slice_ms, void *arg) except -1:
    """A slice of recv(): poll for one message; done once the inbox holds
    it, or the subscription has ended."""
    cdef Subscription sub = <Subscription>owner
    cdef _Inbox inbox = sub._inbox
    cdef size_t got = 0
    cdef int rc
    with nogil:
        rc = uc_sub_poll(sub._c, slice_ms, 1, &got)
    if sub._pending is not None:
        exc, sub._pending = sub._pending, None
        raise exc
    if rc != UC_ERR_CLOSED:
        _check_rc(rc, "recv")
    # A decode error is taken too (reported as for a target): the wait goes on.
    return inbox.full or rc == UC_ERR_CLOSED or sub._closed or uc_sub_finished(sub._c) != 0


cdef int _close_step(object owner, int slice_ms, void *arg) except -1:
    cdef Subscription sub = <Subscription>owner
    cdef int rc
    with nogil:
        rc = uc_sub_close(sub._c, slice_ms)
    if rc == UC_ERR_TIMEOUT:
        return 0
    _check_rc(rc, "close")
    if sub._shared:
        # Ended on this thread (a subscription on a shared socket has no loop of its
        # own): its end hook and the loop's reference go here, once.
        uc_shared_sub_exit(sub._c)
    return 1


cdef int _wait_step(object owner, int slice_ms, void *arg) except -1:
    cdef Subscription sub = <Subscription>owner
    cdef int rc
    with nogil:
        if sub._shared:
            rc = uc_shared_sub_wait(sub._c, slice_ms)
        else:
            rc = uc_sub_wait(sub._c, slice_ms)
    if rc == UC_ERR_TIMEOUT:
        return 0
    _check_rc(rc, "wait")
    if sub._shared:
        uc_shared_sub_exit(sub._c)     # its end hook, if the shared socket has not run it
    return 1


cdef int _topics_step(object owner, int slice_ms, void *arg) except -1:
    cdef Subscription sub = <Subscription>owner
    cdef uint64_t ticket = (<uint64_t *>arg)[0]
    cdef int rc
    with nogil:
        rc = uc_sub_wait_topics(sub._c, ticket, slice_ms)
    if rc == UC_ERR_TIMEOUT:
        return 0
    _check_rc(rc, "waiting for a topic change")
    return 1


cdef class _Source:
    """Where a subscription's messages come from, when not from a zmq socket:
    ``open`` makes the C subscription from the options subscribe() prepared
    (delivery, thread, batch), or returns NULL with ``err[0]`` set."""

    cdef uc_sub *open(self, uc_bus *bus, const uc_sub_opts *o, int *err) noexcept:
        err[0] = UC_ERR_ARG
        return NULL


@cython.final
cdef class Subscription:
    """One receive loop delivering decoded messages to one target.

    Made by :meth:`Bus.subscribe`.  A context manager: leaving it closes.
    """
    cdef uc_sub *_c
    cdef loop_state _st
    cdef Bus _bus
    cdef readonly str endpoint
    cdef readonly tuple endpoints
    cdef object _target
    cdef object _on_error
    cdef object _factory
    cdef object _start_error
    cdef object _pending          # caller mode: a BaseException to re-raise from poll
    cdef Decoder _decoder
    cdef bint _with_topic
    cdef bint _with_sender    # with_sender: target(msg, sender) / target(topic, msg, sender)
    cdef bytes _split_topic   # with_topic: the topic of a split message that ended a batch (_msg_topic)
    cdef bint _copy          # subscribe(copy=True): out-of-band values as bytes
    cdef uint64_t _max_message_size   # max_message_size, if _max_size_given (_oob_size_limit)
    cdef bint _max_size_given
    cdef uint64_t _max_batch_inflated  # max_batch_decompressed (_deliver_as_list)
    cdef _inflate_budget *_budget      # the list being decoded, while one is (_decode_oob)
    cdef bint _caller
    cdef bint _closed
    cdef str _thread_name
    cdef str _run_name
    cdef bytes _run_name_b        # NUL-terminated name for the native thread
    # SUB prefixes as changed so far (made or queued), in order: the keys of
    # a dict, so that adding or removing one costs the same with 100,000 as
    # with 10; `topics` builds the tuple once per change.
    cdef dict _topic_set
    cdef tuple _topics            # the tuple of _topic_set's keys; None: not built yet
    cdef Py_ssize_t _max_topics   # subscribe(max_topics=): most prefixes in _topic_set
    cdef uint64_t _topic_ticket   # the last topic change queued (0: none)
    cdef bint _pull
    cdef bint _shared             # shares a socket (_shared.pxi): its source is a shared socket
    cdef _Source _source          # None: a zmq socket
    cdef born_in _born            # where it was made (the fork check)
    # Errors logged without on_error, rate-limited: made at the first error
    # (None until then: two objects fewer for each of thousands of shared
    # subscriptions that never fail).
    cdef _ErrorLog _decode_log
    cdef _ErrorLog _target_log
    cdef object _end_hook         # set_end_hook(): called once when the loop ends
    cdef object _end_exc          # what ended the loop (KeyboardInterrupt...), for _end_hook
    cdef bint _loop_ended         # thread mode: on_exit has run (_loop_ended_with_gil)
    cdef bint _loop_started       # a Python thread factory called run() (_Run.__call__)
    cdef bint _start_late         # ... not within LOOP_START_WARNING (_check_loop_started)
    # The statement that called subscribe(), until the first batch waits for
    # it to take the handle (_wait_for_opener): id() of its frame (0: none),
    # the call's instruction there, its thread.
    cdef size_t _opener_frame
    cdef int _opener_lasti
    cdef unsigned long _opener_thread
    cdef object __weakref__       # the bus keeps a weak reference
    cdef _EventSink _events       # connection events: on_event and their log
    cdef _Inbox _inbox            # opened without a target: recv()'s one message, else None

    def __cinit__(self, token=None, *args, **kwargs):   # any arguments: the TypeError below
        _made_here(token, "upcall.Subscription", "Bus.subscribe() returns one")
        self._c = NULL
        self._born = _born_here()

    def __del__(self):
        # A thread-mode loop holds a reference to us while it runs: only a
        # caller-mode subscription can go unclosed.
        if self._c != NULL and not self.closed:
            warnings.warn(f"unclosed {self!r}: close it, or use it as a context manager",
                          ResourceWarning, source=self)
            try:
                self.close()
            except Exception:
                pass                # no poll runs (it would hold a reference): cannot fail

    def __dealloc__(self):
        # The loop holds a reference to us while it runs, so it has ended.  In
        # a forked child the C state is the parent's: left alone.
        if self._c != NULL and not _inherited(self._born):
            uc_sub_free(self._c)
        self._c = NULL
        if self._st.ops != NULL and self._st.ops.release != NULL:
            self._st.ops.release(self._st.flavour)
        self._st.flavour = NULL

    def __repr__(self):
        if _inherited(self._born):
            state = f"inherited from process {self._born.pid}"
        else:
            state = "closed" if self.closed else ("caller" if self._caller else self._thread_name)
        # As bound or connected: a port picked at bind (tcp://...:*) shows its number.
        eps = self.last_endpoints if self._c != NULL else self.endpoints
        return f"<upcall.Subscription {','.join(eps)} topics={list(self.topics)!r} {state}>"

    cdef int _check_process(self) except -1:
        _check_not_inherited(self._born, "Subscription")
        return 0

    cdef _request_stop(self):
        """Ask the loop to stop without waiting for it (Bus.close asks every
        loop first, so that no wait depends on a loop not asked yet)."""
        if self._c == NULL:
            return
        self._closed = True
        with nogil:
            uc_sub_close(self._c, 0)

    @property
    def closed(self):
        """True once close() was called or delivery ended (StopDelivery), and
        for a Subscription inherited across fork."""
        if _inherited(self._born):
            return True
        return bool(self._closed or (self._c != NULL and uc_sub_finished(self._c)))

    @property
    def stats(self):
        """Counters: received, delivered, filtered, batches, decode_errors,
        callback_errors, dropped (docs/wire.md, "What is counted where"), and
        zmq_received: zmq messages, each holding one message or, coalesced,
        many (received counts those).  Loss of stamped messages (docs/wire.md,
        "Stamps"): lost, gaps, streams, unstamped, reordered, duplicates,
        streams_forgotten (a shared socket's subscription has its socket's).
        What the socket's send queues may hold of its prefixes (a SUB; 0 for
        a PULL; a shared socket's subscription has its socket's;
        docs/security.md, "Where prefixes are copied"): prefix_copies, the
        full copies of its prefixes they may hold (one per peer connected,
        two per connecting endpoint down), and prefix_copy_bytes, an upper
        bound of their memory.
        Connection events (upcall.EVENT_STATS, docs/events.md): connected,
        connect_retried, accepted, disconnected, handshakes,
        handshake_failed_protocol, handshake_failed_auth,
        handshake_failed_no_detail; they count no message.  loop_start_late
        (only with a Python ``thread_factory``, the one kind that can start
        late): 1 once it had not started the delivery loop
        LOOP_START_WARNING seconds after subscribe() (docs/threads.md)."""
        cdef uc_stats s
        cdef uc_stream_counts lc
        cdef uc_prefix_copies pc
        self._check_process()
        uc_sub_stats(self._c, &s)
        uc_sub_stream_counts(self._c, &lc)
        uc_sub_prefix_copies(self._c, &pc)
        stats = {"received": s.received, "delivered": s.delivered, "filtered": s.filtered,
                 "batches": s.batches, "decode_errors": s.decode_errors,
                 "callback_errors": s.callback_errors, "dropped": s.dropped,
                 "zmq_received": s.zmq_received,
                 **_loss_stats(&lc, s.received),
                 "prefix_copies": pc.copies, "prefix_copy_bytes": pc.copy_bytes}
        if self._factory is not None:
            stats["loop_start_late"] = int(self._start_late)
        stats.update(self._event_counts())
        return stats

    cdef void _check_loop_started(self, double waited) noexcept:
        """The start watch (_threads.pxi), ``waited`` seconds after
        subscribe(): a loop its thread factory has not started yet is
        counted (stats["loop_start_late"]) and said once."""
        if self._loop_started or self._closed or self._c == NULL:
            return
        self._start_late = True
        try:
            _log.warning("upcall: subscription %s: its thread factory %r has not started the "
                         "delivery loop %g s after subscribe(): nothing is delivered until it "
                         "calls run() on a thread (a thread made but not started? a pool with "
                         "fewer free workers than subscriptions? each holds one for its whole "
                         "life: docs/threads.md)", self.endpoint, self._factory, waited,
                         extra={"subscription": self.endpoint})
        except BaseException as exc:
            _write_unraisable(exc, None)

    def streams(self):
        """What arrived of each stamped stream tracked now (docs/wire.md,
        "Stamps"): ``{stream_id: {"received": n, "lost": n, "gaps": n,
        "next_seq": n}}``, oldest first; at most ``max_streams`` of them.  A
        subscription on a shared socket reads its socket's (every topic it carries)."""
        self._check_process()
        return _streams_dict(self._c)

    cdef dict _event_counts(self):
        cdef uint64_t counts[UC_EV_COUNT]
        uc_sub_events(self._c, counts, NULL)
        return _event_stats(counts)

    @property
    def peers(self):
        """Connections up now (transport connections made or accepted and
        not yet ended; a connection whose handshake then fails ends too).
        Read from the socket's monitor by the receive loop; in caller mode,
        by poll()/recv(): between them, what the last one saw.  None when
        unknown: inproc:// endpoints only (libzmq reports no connections
        there), a synthetic source, or a socket libzmq could not monitor."""
        cdef int peers = -1
        self._check_process()
        if self._c == NULL:
            return 0
        uc_sub_events(self._c, NULL, &peers)
        return None if peers < 0 else peers

    @property
    def connected(self):
        """True while at least one connection is up (``peers > 0``; None
        when that is unknown, see ``peers``)."""
        peers = self.peers
        return None if peers is None else peers > 0

    @property
    def last_endpoint(self):
        """The endpoint as bound or connected (a tcp port 0 or * resolved);
        the first one of a subscription on several (see last_endpoints)."""
        cdef const char *ep = uc_sub_last_endpoint(self._c)
        return ep.decode("utf-8", "replace") if ep != NULL and ep[0] else self.endpoint

    @property
    def last_endpoints(self):
        """Every endpoint as bound or connected, in the order of ``endpoints``."""
        cdef const char *ep
        cdef Py_ssize_t i
        if self._source is not None and not self._shared:
            return (self.last_endpoint,)
        resolved = []
        for i in range(len(self.endpoints)):
            ep = uc_sub_endpoint(self._c, <size_t>i)
            resolved.append(ep.decode("utf-8", "replace") if ep != NULL else self.endpoints[i])
        return tuple(resolved)

    @property
    def topics(self):
        """The SUB socket's topic prefixes (bytes), in the order they were
        added, with every subscribe()/unsubscribe() so far; () for PULL,
        which has no prefixes and receives every message."""
        if self._topics is None:
            self._topics = tuple(self._topic_set) if self._topic_set else ()
        return self._topics

    def subscribe(self, topic, timeout=None):
        """Add the topic prefix ``topic`` (bytes, or str as UTF-8) while
        delivery runs.  SUB only.

        The change is made on the socket's own thread: at once when called
        from a target, or in caller mode while no poll() runs; otherwise the
        loop is woken and makes it before its next batch.  Returns once it is
        made.  As with any SUB socket, the publisher learns of the new prefix
        asynchronously: its messages start arriving shortly after.  Adding a
        prefix that is already there changes nothing.  ``timeout`` (seconds,
        None: no limit): TimeoutError if a target is still running then; the
        change stays queued, is made before the next batch, and ``topics``
        shows it already.  ValueError for PULL, once closed, or for a new
        prefix when the subscription holds ``max_topics`` already.
        """
        self._change_topic(topic, True, timeout, "subscribe")

    def unsubscribe(self, topic, timeout=None):
        """Remove the topic prefix ``topic`` while delivery runs.  SUB only.

        Made like subscribe()'s changes; once it returns, the socket itself
        drops messages that only this prefix matched (called from a target,
        the rest of the batch being delivered was taken before and still
        comes).  Removing a prefix that is not there changes nothing.
        """
        self._change_topic(topic, False, timeout, "unsubscribe")

    cdef _change_topic(self, object topic, bint add, object timeout, str what):
        cdef int total_ms = _timeout_ms(timeout, "timeout")
        cdef uint64_t ticket = 0
        cdef int rc
        t = _topic_bytes(topic)
        if self._pull or (self._source is not None and not self._shared):
            raise ValueError(f"{what}() is for kind='sub' subscriptions; a pull socket has no "
                             "topics: it receives every message")
        if self.closed:
            raise ValueError(f"{what}() on a closed subscription")
        if add != (t in self._topic_set):
            if add and len(self._topic_set) >= self._max_topics:
                raise ValueError(
                    f"subscribe({topic!r}): the subscription already holds {len(self._topic_set)} "
                    f"prefixes, its limit (max_topics={self._max_topics}); unsubscribe one "
                    "first, or open it with a larger subscribe(max_topics=...)")
            # Queued with the GIL held, so that the order of the changes
            # queued is the order of the updates to _topic_set.
            if add:
                rc = uc_sub_subscribe(self._c, <const char *>t, len(t), &ticket)
            else:
                rc = uc_sub_unsubscribe(self._c, <const char *>t, len(t), &ticket)
            _check_rc(rc, f"{what}({topic!r})")
            self._topic_ticket = ticket
            if add:
                self._topic_set[t] = None
            else:
                del self._topic_set[t]
            self._topics = None
        # Nothing to change: still return only once what topics shows is made.
        ticket = self._topic_ticket
        if ticket and not _in_signal_slices(self, _topics_step, &ticket, total_ms):
            raise TimeoutError(
                f"{what}({topic!r}) was not made within {timeout} s: a target is still "
                "running; the change stays queued and is made before the next batch")

    @property
    def thread_name(self):
        """Name of the delivery thread; None in caller mode."""
        return None if self._caller else self._thread_name

    def poll(self, timeout=None, max_messages=None):
        """Caller mode: receive and deliver on this thread.

        Waits up to ``timeout`` seconds (not milliseconds, as pyzmq's
        poll(timeout) takes; None or math.inf: no limit; 0: only what is
        queued) for messages, and returns as soon as it has delivered some:
        one batch, the messages already queued up to ``batch``
        (subscribe(batch=)) or ``max_messages``.  Also returns when a target
        raised StopDelivery, or when the subscription is closed.  Returns
        the number of messages taken in: handed to the target, or counted
        as decode errors (a malformed message counts too, so that a flood
        of them cannot hold poll() for ever); 0 after the timeout.  Wakes at
        least every 200 ms for signals, so Ctrl-C raises KeyboardInterrupt
        here.

        It does not wait on to fill the timeout once something came (as
        pyzmq's and Kafka's poll() do not): the caller gets control back
        with every batch.  To deliver for a whole period, call it in a
        loop: ``while time.monotonic() < end: sub.poll(end - time.monotonic())``.

        A KeyboardInterrupt, SystemExit or GeneratorExit raised by the target
        or by ``on_error`` propagates out of poll(); the subscription stays
        open and the messages after the interrupted one are delivered first
        by the next poll() (the interrupted one counts as a callback error).
        On a subscription that is closed or has ended (StopDelivery, the end
        of its source) poll() raises ValueError.
        """
        cdef int total_ms = _timeout_ms(timeout, "timeout")
        cdef _poll_progress progress
        self._check_process()
        if not self._caller:
            raise ValueError("poll() is for delivery='caller' subscriptions; "
                             "this one delivers on its own thread")
        if self._inbox is not None:
            raise ValueError("poll() delivers to a target, and this subscription was "
                             "opened without one: take its messages with recv() or "
                             "`for msg in sub`")
        if self.closed:
            raise ValueError("poll() on a closed subscription")
        max_messages = int_arg(max_messages, "max_messages", 1, 2 ** 63 - 1, "None: no limit",
                               or_none=True)
        progress.limit = max_messages or 0
        progress.done = 0
        progress.started = False
        _in_signal_slices(self, _poll_step, &progress, total_ms)
        return progress.done

    def recv(self, timeout=None):
        """Receive one message on this thread: a subscription opened without a
        target, ``bus.subscribe(endpoint, delivery="caller")``.

        Returns the message as a target would get it: decoded (``decoder``,
        ``raw``, ``copy`` apply), as ``(topic, msg)`` with
        ``with_topic=True``.  Raises TimeoutError if none came within
        ``timeout`` seconds (None or math.inf: no limit; 0: only one already
        queued); the subscription stays open and nothing is lost: a message
        is taken from the socket only when it is returned.  A message that
        does not decode is reported as it would be with a target (to
        ``on_error``, else logged) and recv() waits for the next one.  Wakes
        at least every 200 ms for signals, so Ctrl-C raises
        KeyboardInterrupt here.  ValueError on a subscription that is closed
        or has ended (its bus closed), or closed while recv() waits;
        ``for msg in sub`` ends there instead.
        """
        cdef int total_ms = _timeout_ms(timeout, "timeout")
        got, msg = self._recv(total_ms, "recv()")
        if got:
            return msg
        if self.closed:
            raise ValueError("recv() on a closed subscription")
        raise TimeoutError(f"recv(): no message within {timeout} s; the subscription "
                           "stays open")

    def __iter__(self):
        """``for msg in sub``: recv() with no timeout, until the subscription
        (or its bus) is closed.  Only for a subscription opened without a
        target."""
        self._receiving_check("iteration")
        return self

    def __next__(self):
        got, msg = self._recv(-1, "iteration")
        if got:
            return msg
        raise StopIteration

    cdef _receiving_check(self, str what):
        self._check_process()
        if self._inbox is None:
            if not self._caller:
                raise ValueError(f"{what} is for subscriptions opened without a target, "
                                 "bus.subscribe(endpoint, delivery='caller'); this one "
                                 "delivers to its target on its own thread")
            raise ValueError(f"{what} is for subscriptions opened without a target, "
                             "bus.subscribe(endpoint, delivery='caller'); this one delivers "
                             "to its target: call poll()")

    cdef tuple _recv(self, int total_ms, str what):
        """(True, the message), or (False, None) once closed or after total_ms."""
        cdef _Inbox inbox
        self._receiving_check(what)
        inbox = self._inbox
        # A message held from a recv() an exception interrupted comes first.
        if not inbox.full and not self.closed:
            _in_signal_slices(self, _recv_step, NULL, total_ms)
        if not inbox.full:
            return False, None
        msg, inbox.msg, inbox.full = inbox.msg, None, False
        return True, msg

    def wait(self, timeout=None):
        """Wait for the loop to end by itself (StopDelivery, the end of its
        source) without stopping it; True if it has ended.  Thread mode only."""
        cdef int total_ms = _timeout_ms(timeout, "timeout")
        self._check_process()
        if self._c == NULL:
            return True
        if self._caller:
            raise ValueError("wait() is for thread-mode subscriptions; in caller mode poll() "
                             "returns once delivery has ended")
        return _in_signal_slices(self, _wait_step, NULL, total_ms) == 1

    def close(self, timeout=None):
        """Stop delivery and wait for the loop to end.

        Safe from inside this subscription's own target (it then only asks the
        loop to stop after the current message).  Raises TimeoutError if the
        loop did not end within ``timeout`` seconds (not pyzmq's
        milliseconds), e.g. because a target is stuck; calling close() again
        waits again.
        """
        cdef int total_ms = _timeout_ms(timeout, "timeout")
        self._check_process()
        if self._c == NULL:
            return
        self._closed = True
        if not _in_signal_slices(self, _close_step, NULL, total_ms):
            raise TimeoutError(
                f"{self!r} did not stop within {timeout} s: a target is still "
                "running; close() again to wait longer")
        self._flush_error_logs()
        if self._bus is not None:
            self._bus._forget(self)

    def set_end_hook(self, hook):
        """For async adapters (upcall.aio): ``hook(exc)`` is called once when the
        delivery loop ends, whatever ended it (close, the bus closing,
        StopDelivery, the end of its source, a KeyboardInterrupt or
        SystemExit from the target, decoder or on_error), on the loop's
        thread with the GIL after its last delivery; at once if it has ended
        already.  ``exc``: that KeyboardInterrupt, SystemExit..., which is
        then the hook's to report (not written as unraisable), else None.
        Thread mode only."""
        if self._caller:
            raise ValueError("set_end_hook() is for thread-mode subscriptions")
        if self._loop_ended:
            exc, self._end_exc = self._end_exc, None
            hook(exc)
        else:
            self._end_hook = hook

    def __enter__(self):
        self._check_process()
        return self

    def __exit__(self, *exc_info):
        self.close()

    cdef int _report(self, BaseException exc, object msg, object topic,
                     bint decoding) noexcept:
        """Route an exception from decoding (``decoding``) or from the target
        on a message of ``topic`` (None: a batch): to on_error, else to the
        "upcall" logger (_errlog.pxi); returns the verdict for the core
        (UC_DELIVER_MORE: delivery goes on)."""
        if not isinstance(exc, Exception):
            return self._interrupted(exc)
        if self._on_error is not None:
            try:
                self._on_error(exc, msg)
                return UC_DELIVER_MORE
            except StopDelivery:
                return UC_DELIVER_STOP
            except BaseException as handler_exc:
                if not isinstance(handler_exc, Exception):
                    return self._interrupted(handler_exc)
                _write_unraisable(handler_exc, self._on_error)
                return UC_DELIVER_MORE
        if decoding and self._decode_log is None:
            self._decode_log = _ErrorLog("decode errors")
        elif not decoding and self._target_log is None:
            self._target_log = _ErrorLog("target errors")
        _log_error(self, self._decode_log if decoding else self._target_log, exc, topic,
                   decoding)
        return UC_DELIVER_MORE

    cdef _flush_error_logs(self):
        """The summary records of errors left out of the log (at close)."""
        cdef double now = _now()
        if self._decode_log is not None:
            self._decode_log.flush(self, now)
        if self._target_log is not None:
            self._target_log.flush(self, now)

    cdef int _interrupted(self, BaseException exc) noexcept:
        """KeyboardInterrupt, SystemExit, GeneratorExit... from the target or
        from on_error.  In caller mode they belong to the caller: poll()
        raises it, and the messages after this one stay for the next poll()
        (UC_DELIVER_PAUSE).  On a delivery thread they end this subscription
        after being reported; the rest of the batch is counted as dropped."""
        if self._caller:
            self._pending = exc
            return UC_DELIVER_PAUSE
        if self._end_exc is None:
            self._end_exc = exc          # for the end hook (_loop_ended_with_gil)
        if self._end_hook is None:
            _write_unraisable(exc, self)
        return UC_DELIVER_STOP


cdef dict _loss_stats(const uc_stream_counts *lc, uint64_t received):
    # unstamped: what was received without a stamp (the stamped count is
    # the stamps' own, so no per-message counter is needed).
    cdef uint64_t stamped = lc.stamped
    return {"lost": lc.lost, "gaps": lc.gaps, "streams": lc.streams,
            "unstamped": received - stamped if received > stamped else 0,
            "reordered": lc.reordered, "duplicates": lc.duplicates,
            "streams_forgotten": lc.forgotten}


cdef dict _streams_dict(uc_sub *c):
    cdef size_t cap = 64, n
    cdef uc_stream_info *buf
    while True:
        buf = <uc_stream_info *>malloc(cap * sizeof(uc_stream_info))
        if buf == NULL:
            raise MemoryError()
        try:
            n = uc_sub_streams(c, buf, cap)
            if n < cap:
                return {buf[i].id: {"received": buf[i].received, "lost": buf[i].lost,
                                    "gaps": buf[i].gaps, "next_seq": buf[i].next_seq}
                        for i in range(n)}
        finally:
            free(buf)
        cap *= 4
