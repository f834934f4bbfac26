"""The C core's layering, checked by reading its sources as text.

csrc/ builds and tests without Python, and the synthetic benchmark source is
kept apart from the subscription life cycle and the zmq source: the core
reaches it only through the ops table (csrc/sub_impl.h).  The object model:
the shared code asks a source's optional ops, never which kind it is; the
publisher's files see a subscription only through csrc/sub_caller.h; the
wheel ships the public headers and .pxd files only.  That csrc/*.c compiles
with -Wall -Wextra -Werror is `make -C csrc test`'s job.  And one rule of the
tests themselves, read the same way.
"""
import ast
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
SYNTH_FILES = {"sub_synth.c", "synth.h"}


def core_sources():
    return sorted(p for p in CSRC.rglob("*") if p.suffix in (".c", ".h"))


def test_the_c_core_does_not_include_python():
    assert core_sources()
    offenders = [str(p.relative_to(CSRC)) for p in core_sources()
                 if re.search(r'Python\.h|#\s*include\s*[<"]Python', p.read_text())]
    assert offenders == []


# A C verbatim block in Cython: `cdef extern from *:` and a string of C.
VERBATIM_C = re.compile(r'^\s*cdef extern from \*[^:]*:\s*\n\s*("""|\'\'\')(.*?)\1', re.M | re.S)
# What only code that needs Python.h says: a CPython name.
USES_THE_C_API = re.compile(r"\bPy[A-Za-z_]+|\bPYGEN_")


def test_verbatim_c_in_cython_is_found():
    text = 'cdef extern from *:\n    """\n    static int f(void) { return 1; }\n    """\n    int f()\n'
    assert [m.group(2) for m in VERBATIM_C.finditer(text)] == ["\n    static int f(void) { return 1; }\n    "]


def test_no_python_free_c_in_cython_strings():
    # C that does not need Python.h belongs to the C core (csrc/, held to
    # -Wall -Wextra -Werror, with a C test and the sanitizers); C that does
    # goes in a named header of upcall/ (_compat.h, _codec_c.h, _aiter_c.h).
    sources = sorted((ROOT / "upcall").glob("*.p[xy][xid]"))
    assert any(p.name == "_aiter.pxi" for p in sources)
    offenders = [f"{p.name}: {m.group(2).strip()[:60]!r}"
                 for p in sources for m in VERBATIM_C.finditer(p.read_text())
                 if not USES_THE_C_API.search(m.group(2))]
    assert offenders == []


# `cdef extern from "name.h"`: the header a Cython declaration block names.
EXTERN_FROM = re.compile(r'^\s*cdef extern from "([^"<>]+)"', re.M)


def test_extern_blocks_are_found():
    assert EXTERN_FROM.findall('cdef extern from "zap.h" nogil:\n    pass\n'
                               'cdef extern from "<pthread.h>":\n') == ["zap.h"]


def test_core_headers_are_declared_to_cython_in_includes_only():
    # One rule for every C core header: its declarations live once, in
    # upcall/includes/<name>.pxd, which the modules cimport; never inline in
    # a .pyx/.pxi (where a second copy could drift from the header).
    core_headers = {p.name for p in CSRC.glob("*.h")}
    sources = sorted(p for p in (ROOT / "upcall").rglob("*.p[xy][xid]")
                     if p.parent.name != "includes")
    assert any(p.name == "_shared.pxi" for p in sources)
    offenders = [f"{p.name}: {h}" for p in sources for h in EXTERN_FROM.findall(p.read_text())
                 if h in core_headers]
    assert offenders == []
    # And each core header is declared by one includes/*.pxd only.
    declared = {}
    for pxd in sorted((ROOT / "upcall" / "includes").glob("*.pxd")):
        for h in EXTERN_FROM.findall(pxd.read_text()):
            declared.setdefault(h, []).append(pxd.name)
    assert {h: names for h, names in declared.items() if len(names) > 1} == {}


def test_the_synthetic_source_stays_in_its_own_files():
    for name in ("sub.c", "sub_zmq.c", "bus.h", "pub.c"):
        assert (CSRC / name).is_file(), name
    offenders = [p.name for p in CSRC.glob("*.[ch]")
                 if p.name not in SYNTH_FILES and "synth" in p.read_text().lower()]
    assert offenders == []


def _runs_python_c(call: ast.Call) -> bool:
    """subprocess.run/Popen([sys.executable, "-c", ...], ...)"""
    if not call.args or not isinstance(call.args[0], ast.List):
        return False
    elts = call.args[0].elts
    return (len(elts) >= 2 and ast.unparse(elts[0]) == "sys.executable"
            and isinstance(elts[1], ast.Constant) and elts[1].value == "-c")


def test_child_interpreters_started_with_dash_c_run_outside_the_source_tree():
    # `python -c` puts the working directory first on sys.path: run from the
    # source tree, the child imports its upcall/ (built for one CPython
    # only) instead of the one under test, and fails on every other CPython
    # (test_coalesce_tx's exit test did, in `make test-threads-all`).
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and _runs_python_c(node)
                    and not any(k.arg == "cwd" for k in node.keywords)):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, "python -c without cwd=: " + ", ".join(bad)


def _includes(path):
    return re.findall(r'^\s*#\s*include\s*"([^"]+)"', path.read_text(), re.M)


def test_the_publisher_sees_no_subscription_internals():
    # A send made inside a deliver needs two things of that subscription
    # (its eventfd, whether it is stopping): sub_caller.h, not the struct.
    files = sorted(CSRC.glob("pub*.[ch]"))
    assert CSRC / "pub.c" in files
    seen = {}
    for path in files:
        stack = list(_includes(path))
        while stack:   # the headers it includes, and theirs
            h = stack.pop()
            if h not in seen.setdefault(path.name, set()) and (CSRC / h).is_file():
                seen[path.name].add(h)
                stack.extend(_includes(CSRC / h))
    offenders = {name: sorted(hs & {"sub_impl.h"}) for name, hs in seen.items() if "sub_impl.h" in hs}
    assert offenders == {}
    fields = [p.name for p in files if re.search(r"caller_sub->|struct uc_sub\b", p.read_text())]
    assert fields == []


def test_the_shared_code_asks_the_op_never_the_kind():
    # An optional op left NULL says "this kind does not do that"; comparing
    # an ops table is asking which kind.  (A kind's own file may check that a
    # uc_sub handed to its own API is one of its own: sub_synth.c does.)
    offenders = []
    for path in sorted(CSRC.glob("*.[ch]")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"&zmq_ops\b|\bops\s*!=", line):
                offenders.append(f"{path.name}:{n}")
            if (path.name in ("sub.c", "bus.c") or path.name.startswith("pub")) \
                    and re.search(r"\bops\s*==", line):
                offenders.append(f"{path.name}:{n}")
    assert offenders == []


def _meson_calls(path, func):
    """The argument texts of every ``func(...)`` call in a meson.build (comments dropped)."""
    text = re.sub(r"#[^\n]*", "", path.read_text())
    return re.findall(re.escape(func) + r"\((.*?)\)", text, re.S)


def _installed():
    """What upcall/meson.build installs: (the .pxd files, the header lists' names,
    the headers named one by one)."""
    pxd, lists, headers = set(), [], []
    for args in _meson_calls(ROOT / "upcall" / "meson.build", "py.install_sources"):
        sub = re.search(r"subdir:\s*'([^']+)'", args).group(1)
        names = re.findall(r"'([^']+)'", re.sub(r"subdir:\s*'[^']+'", "", args))
        pxd |= {ROOT / sub / pathlib.Path(n).name if "/" not in n else ROOT / "upcall" / n
                for n in names if n.endswith(".pxd")}
        headers += [n for n in names if n.endswith(".h")]
        lists += re.findall(r"^\s*([a-z_]+_headers)\b", args, re.M)
    return pxd, lists, headers


def _cimports(text):
    return re.findall(r"^\s*from\s+(upcall(?:\.\w+)+)\s+cimport", text, re.M)


def test_the_wheel_ships_exactly_the_public_headers():
    shipped_pxd, lists, headers = _installed()
    # Headers are installed as csrc/meson.build's public list, never one by one
    # (the bridge's own _compat.h, a core header) or as another list.
    assert headers == [] and lists == ["public_headers"], (headers, lists)
    (public_list,) = [re.findall(r"'([^']+)'", args) for args in
                      re.findall(r"public_headers\s*=\s*files\((.*?)\)",
                                 re.sub(r"#[^\n]*", "", (CSRC / "meson.build").read_text()), re.S)]
    shipped_h = set(public_list)
    assert ROOT / "upcall" / "includes" / "bus.pxd" in shipped_pxd
    # The public set: what the shipped .pxd files name, and what those headers include.
    public, stack = set(), []
    for pxd in shipped_pxd:
        text = pxd.read_text()
        for mod in _cimports(text):   # a shipped .pxd cimports shipped ones only
            assert ROOT.joinpath(*mod.split(".")).with_suffix(".pxd") in shipped_pxd, (pxd.name, mod)
        stack += re.findall(r'^\s*cdef extern from "([^"]+)"', text, re.M)
    while stack:
        h = stack.pop()
        if h not in public and (CSRC / h).is_file():
            public.add(h)
            stack.extend(_includes(CSRC / h))
    assert {"bus.h", "msgpack.h"} <= public
    assert shipped_h == public
    # bus.h names them.
    bus_h = (CSRC / "bus.h").read_text()
    section = bus_h[bus_h.index("Public and internal headers"):bus_h.index("#ifndef")]
    assert sorted(h for h in public if h != "bus.h" and h not in section) == []


# A tracker's number ("issue" and a number after it) means nothing to a
# reader of this tree: no tracker comes with it.  Code, tests and docs name
# the feature instead.
TRACKER_NUMBER = re.compile(r"\bissues?[\s#_-]*[0-9]", re.IGNORECASE)


def tree_files():
    """Every file of the tree: git's list when this is a checkout (what is
    committed or about to be), else every file outside build products."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", "build", "dist", "__pycache__"}
        return [p for p in ROOT.rglob("*") if p.is_file()
                and not any(part in skip or part.startswith(".venv") for part in p.relative_to(ROOT).parts)]
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_no_tracker_numbers_in_the_tree():
    found = []
    for path in tree_files():
        if TRACKER_NUMBER.search(path.name):
            found.append(f"{path.relative_to(ROOT)}: the file's name")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):     # binary (corpora, images) or gone
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            if TRACKER_NUMBER.search(line):
                found.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()[:80]}")
    assert not found, "name the feature, not a tracker number:\n" + "\n".join(found)


def test_the_version_is_written_once():
    # meson.build's project version is the one definition: the wheel's
    # metadata carries it and upcall.__version__ reads it from there.
    import upcall
    (version,) = re.findall(r"^\s*version:\s*'([^']+)'", (ROOT / "meson.build").read_text(), re.M)
    assert upcall.__version__ == version
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert not re.search(r"^version\s*=", pyproject, re.M)
    assert re.search(r'^dynamic\s*=\s*\[[^]]*"version"', pyproject, re.M)
    literal = [p.name for p in (ROOT / "upcall").glob("*.py")
               if re.search(r"^__version__\s*=\s*['\"]", p.read_text(), re.M)]
    assert literal == []


# Sources tested through another source's C test: what covers them.
COVERED_BY = {
    "codec.c": "test_compress.c",
    "codec_lz4.c": "test_compress.c",
    "codec_zstd.c": "test_compress.c",
    "held.c": "test_oob.c",
    "relq.c": "test_oob.c",
    "pub_coalesce.c": "test_coalesce.c",
    "pub_send.c": "test_pub.c",
    "pub_watch.c": "test_bus.c",
    "thread.c": "test_sub.c",
}


def test_every_c_source_has_a_c_test_that_meson_runs():
    meson = (CSRC / "tests" / "meson.build").read_text()
    listed = set(re.findall(r"'(test_\w+)'", meson))
    for src in sorted(CSRC.glob("*.c")):
        test = COVERED_BY.get(src.name, f"test_{src.stem}.c")
        assert (CSRC / "tests" / test).is_file(), f"{src.name} has no C test ({test})"
        assert test[:-2] in listed, f"{test} is not built and run by csrc/tests/meson.build"
    for name, test in COVERED_BY.items():
        assert (CSRC / name).is_file(), f"COVERED_BY names {name}, which is gone"


def _c_enumerators(header, first, count):
    """The enumerators of the C enum that starts with ``first``, up to (not
    including) ``count``, in order."""
    text = (CSRC / header).read_text()
    body = text[text.index(first):text.index(count, text.index(first))]
    return re.findall(r"^\s*(UC_\w+)", body, re.M)


@pytest.mark.parametrize("source, table, header, first, count", [
    ("_events.pxi", "_EVENT_NAMES", "bus.h", "UC_EV_CONNECTED", "UC_EV_COUNT"),
    ("_auth.pxi", "_ZAP_STAT_NAMES", "zap.h", "UC_ZAP_ALLOWED", "UC_ZAP_STAT_COUNT"),
])
def test_name_tables_are_keyed_by_the_c_enum(source, table, header, first, count):
    # A table of names for a C enum's values is a dict keyed by the
    # enumerators themselves, one entry each: reordering the enum (or adding
    # a value in the middle) then cannot give a counter another's name, as a
    # tuple indexed by position would.
    text = (ROOT / "upcall" / source).read_text()
    start = text.index(f"\n{table} = ")
    body = text[start:text.index("\n}", start)]
    keys = re.findall(r"^\s*(UC_\w+)\s*:", body, re.M)
    assert sorted(keys) == sorted(_c_enumerators(header, first, count))


def test_every_c_source_is_in_the_layout():
    # CONTRIBUTING.md's map of the tree names every C source of the core.
    text = (ROOT / "CONTRIBUTING.md").read_text()
    layout = text[text.index("## Layout"):]
    missing = [p.name for p in sorted(CSRC.glob("*.c"))
               if not re.search(rf"\b{re.escape(p.name)}\b", layout)]
    assert missing == []


def test_the_bus_module_docstring_lists_its_includes_in_order():
    # _bus.pyx is one module of many .pxi files: its docstring is the map a
    # reader starts from, so it names every one, in the order included.
    text = (ROOT / "upcall" / "_bus.pyx").read_text()
    docstring = ast.get_docstring(ast.parse(_python_header(text)))
    listed = re.findall(r"^  (_\w+\.pxi) ", docstring, re.M)
    included = re.findall(r'^include "(\w+\.pxi)"', text, re.M)
    assert listed == included
    assert set(included) == {p.name for p in (ROOT / "upcall").glob("*.pxi")}


def _python_header(text):
    """The module's leading comment lines and docstring, as Python."""
    end = text.index('"""', text.index('"""') + 3) + 3
    return text[:end]
