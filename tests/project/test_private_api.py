"""No private CPython API in upcall's own sources, checked by reading them.

Private names (_Py*, e.g. _PyLong_IsCompact, _Py_IsFinalizing) change or
disappear between CPython versions without notice; a wheel for a new CPython
must build from public or unstable-public (PyUnstable_*) API only.  The
version shims for older Pythons live in one header, upcall/_compat.h.  What
Cython generates (upcall/*.c) is Cython's business, not read here.
"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]

# A name that starts with _Py (not __Pyx, Cython's own prefix).
PRIVATE = re.compile(r"(?<![A-Za-z0-9_])_Py[A-Za-z0-9_]+")
OWN_SUFFIXES = {".c", ".h", ".pyx", ".pxi", ".pxd", ".py", ".pyi"}


def own_sources():
    files = [p for p in (ROOT / "csrc").rglob("*") if p.suffix in (".c", ".h")]
    for p in (ROOT / "upcall").rglob("*"):
        if p.suffix not in OWN_SUFFIXES or "__pycache__" in p.parts:
            continue
        # Generated: the Cython output next to its .pyx, and the copies of
        # csrc/*.h and _compat.h that the build puts in upcall/includes/.
        if p.suffix == ".c" and p.with_suffix(".pyx").exists():
            continue
        if p.parent.name == "includes" and p.suffix == ".h":
            continue
        files.append(p)
    return sorted(files)


def test_sources_are_read():
    names = {p.relative_to(ROOT).as_posix() for p in own_sources()}
    # The files that call into CPython beyond Cython's declarations.
    assert {"upcall/_compat.h", "upcall/_codec_c.h", "upcall/_trampoline.pxi",
            "upcall/includes/python.pxd", "upcall/_codec.pyx", "csrc/bus.c"} <= names


def test_the_pattern_finds_private_names():
    text = "x = _PyLong_IsCompact(o); _Py_IsFinalizing(); __Pyx_GOTREF(o); PyUnstable_Long_IsCompact(o)"
    assert PRIVATE.findall(text) == ["_PyLong_IsCompact", "_Py_IsFinalizing"]


def test_no_private_cpython_api_in_the_sources():
    found = {}
    for p in own_sources():
        names = sorted(set(PRIVATE.findall(p.read_text(errors="replace"))))
        if names:
            found[p.relative_to(ROOT).as_posix()] = names
    assert found == {}
