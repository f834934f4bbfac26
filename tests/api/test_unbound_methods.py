"""Calling an extension type's method unbound with the wrong ``self`` is a TypeError.

``upcall.Bus.close(object())`` must not read the C fields of an arbitrary
object: Cython 3 compiles the ``def`` methods of a ``cdef class`` as
cyfunctions (``binding=True``), and an unbound cyfunction call does not check
``self``'s type (a Cython bug, cython/cython#6127), so such a call read garbage, raised
nonsense, or crashed the process.  The rule: nothing a user does aborts the
process; misuse gets a clear TypeError.

Every extension type reachable from upcall's modules (private ones too: a
thread factory is handed a ``_Run``) and every callable or property in its
``__dict__`` is called with wrong ``self`` values: ``object()``, ``1``,
``None``, ``b"x"`` and instances of the other upcall extension types, with a
few argument lists.  Each type runs in its own subprocess that announces each
call before making it, so a crash is a failure naming the call, not a dead
pytest.
"""
import json
import subprocess
import sys
import textwrap

import pytest

import upcall
import upcall.aio
import upcall.handler
import upcall.native
import upcall._bus
import upcall._codec

from helpers import script_env

MODULES = ["upcall", "upcall._bus", "upcall._codec", "upcall.handler", "upcall.native",
           "upcall.aio"]
Py_TPFLAGS_HEAPTYPE = 1 << 9


def extension_types():
    """(module, name) of every extension type (a static type: not a Python
    class, not an exception) defined by upcall and named in MODULES."""
    found = {}
    for modname in MODULES:
        mod = sys.modules[modname]
        for name, obj in vars(mod).items():
            if (isinstance(obj, type) and not obj.__flags__ & Py_TPFLAGS_HEAPTYPE
                    and getattr(obj, "__module__", "").startswith("upcall")
                    and obj not in found):
                found[obj] = (modname, name)
    return sorted(found.values())


TYPES = extension_types()


def test_the_walk_finds_the_public_extension_types():
    names = {name for _, name in TYPES}
    assert {"Bus", "Subscription", "Publisher", "Encoder", "Decoder", "Timestamp", "ExtType",
            "Handler", "Counter", "NativeHandler", "Count", "FieldFilter"} <= names


# The child: for one type, every wrong call, each announced ("call") before it
# is made and its outcome ("done") after, one JSON object a line.
CHILD = textwrap.dedent("""
    import importlib, json, sys
    import upcall, upcall.native

    modname, typename = sys.argv[1], sys.argv[2]
    owner = getattr(importlib.import_module(modname), typename)

    def say(**kw):
        sys.stdout.write(json.dumps(kw) + "\\n")
        sys.stdout.flush()

    bus = upcall.Bus()
    bus.close()
    others = [upcall.Encoder(), upcall.Decoder(), upcall.Timestamp(0), upcall.ExtType(1, b""),
              upcall.Counter(), upcall.native.Count(), upcall.native.FieldFilter("k", eq=1),
              bus]
    wrong = [("object()", object()), ("1", 1), ("None", None), ("b'x'", b"x")]
    wrong += [(type(o).__qualname__ + "()", o) for o in others if not isinstance(o, owner)]
    argsets = [(), (None,), (1,), (b"t", 1), (b"\\x90",), ("inproc://x", print)]

    def attempt(desc, fn):
        say(call=desc)
        try:
            fn()
        except TypeError as e:
            say(done=desc, outcome="TypeError", message=str(e))
        except BaseException as e:
            say(done=desc, outcome=type(e).__name__, message=str(e))
        else:
            say(done=desc, outcome="returned", message="")

    for name, attr in list(vars(owner).items()):
        if name == "__new__" or isinstance(attr, (staticmethod, classmethod)):
            continue            # no self
        if hasattr(type(attr), "__set__") or type(attr).__name__ in ("getset_descriptor",
                                                                     "member_descriptor"):
            for wname, w in wrong:
                if w is not None:    # __get__(None, owner) is the class's access: the descriptor
                    attempt(f"{typename}.__dict__[{name!r}].__get__({wname})",
                            lambda: attr.__get__(w, owner))
                attempt(f"{typename}.__dict__[{name!r}].__set__({wname}, 0)",
                        lambda: attr.__set__(w, 0))
                attempt(f"{typename}.__dict__[{name!r}].__delete__({wname})",
                        lambda: attr.__delete__(w))
        elif callable(attr):
            for wname, w in wrong:
                for args in argsets:
                    shown = ", ".join([wname] + [repr(a) for a in args])
                    attempt(f"{typename}.{name}({shown})", lambda: attr(w, *args))
    say(end=True)
""")


@pytest.mark.parametrize("modname, typename", TYPES, ids=[f"{m}.{n}" for m, n in TYPES])
def test_a_wrong_self_is_a_type_error(modname, typename, tmp_path):
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, modname, typename], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60, env=script_env())
        out, err, code = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err, code = "timed out", None
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    pending = {d["call"] for d in lines if "call" in d} - {d["done"] for d in lines if "done" in d}
    assert not pending and code == 0 and lines and lines[-1] == {"end": True}, (
        f"the process died (exit {code}) in {sorted(pending) or 'setup'}: {err[-2000:]}")
    calls = [d for d in lines if "done" in d]
    assert calls, "no calls made"
    wrong = [f"{d['done']}: {d['outcome']} {d['message']}"
             for d in calls if d["outcome"] != "TypeError"]
    assert not wrong, f"{len(wrong)} of {len(calls)} calls not a TypeError:\n" + "\n".join(wrong)
