"""The wire format's numbers are defined once: in csrc/wire.h (and declared
for Cython in upcall/includes/wire.pxd, by name only).

This test reads the sources of the C core (csrc/), the package (upcall/) and
the benchmark (bench/), as msgspec's tests read its C source, and fails when
one of the wire format's numbers is written as a literal in code anywhere
else: the ext codes (126, 127), the coalesced batch's ext 32 marker, the
frame maximum (16) and the out-of-band maximum (14), the reference's size
(16), and the fault codes.  Comments, docstrings and strings may name them
(they say which numbers the code means); bytes literals may not.

Not read: the msgpack library itself (csrc/msgpack.[ch]: its numbers are
msgpack's, one layer below the wire), the generated Cython output and the
header copies under upcall/includes/, and the C tests and fuzzers (test
vectors spell the bytes out on purpose: written with the definitions, they
could not catch a definition that changed).

The few uses of the same numbers that are not the wire format are listed
in ALLOWED with the reason; an entry that no longer matches fails too, so
that the list stays exact.
"""
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

DEFINITIONS = {"csrc/wire.h", "upcall/includes/wire.pxd"}
NOT_READ = {"csrc/msgpack.h", "csrc/msgpack.c"}

# (name, values, context): a literal of one of these values in code is a
# wire number; with a context, only on a line (comments removed) that
# matches it, for values too common to ban everywhere.
RULES = [
    ("ext code", {126, 127}, None),
    ("batch marker (ext 32)", {0xc9}, None),
    ("out-of-band maximum", {14}, None),
    ("frame maximum / reference size", {16}, re.compile(r"ref|frame|len|ext", re.I)),
    ("fault code", {64, 65, 66, *range(110, 118), 120, 121, 122},
     re.compile(r"ERR_|\b(err|fault|reason)\b")),
]

# (path, a piece of the code line, why it is not a wire number)
ALLOWED = [
    ("csrc/split.c", "[0x00 ... 0x7f] = 1,",
     "msgpack's positive fixint range, in the splitter's table of fixed sizes"),
    ("csrc/split.c", "case 0xc9:",
     "msgpack's ext 32 marker, one form among the ext forms the splitter reads"),
    ("upcall/_codec_c.h", "if (b <= 0x7f)", "msgpack's positive fixint range"),
    ("upcall/_codec_c.h", "PyUnicode_New(n, 127)", "the largest ASCII code point"),
    ("upcall/_codec.pyx", '"ExtType: code", -128, 127',
     "msgpack's range of ext codes (a signed byte)"),
    ("upcall/_codec.pyx", "-128 <= code <= 127", "msgpack's range of ext codes (a signed byte)"),
    ("upcall/_sockopts.pxi", '"tcp_keepalive_cnt": (ZMQ_TCP_KEEPALIVE_CNT, 1, 127',
     "the kernel's bound on keepalive probes"),
]


def _sources():
    for pattern in ("csrc/*.c", "csrc/*.h", "upcall/*.pyx", "upcall/*.pxi", "upcall/*.pxd",
                    "upcall/*.py", "upcall/*.h", "upcall/includes/*.pxd", "bench/*.py",
                    "bench/*.c"):
        for path in sorted(ROOT.glob(pattern)):
            rel = path.relative_to(ROOT).as_posix()
            if rel in DEFINITIONS or rel in NOT_READ:
                continue
            if path.suffix == ".c" and rel.startswith("upcall/"):
                continue      # Cython's output
            yield rel, path.read_text()


_C_TOKEN = re.compile(r"""
    (?P<comment>/\*.*?\*/|//[^\n]*)
  | (?P<string>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
  | (?P<number>\b(?:0[xX][0-9a-fA-F]+|\d+)[uUlL]*\b)
""", re.S | re.X)


def _c_literals(text):
    """(line number, code line without comments, value) of each integer literal."""
    code = _C_TOKEN.sub(lambda m: re.sub(r"[^\n]", " ", m.group()) if m.group("comment")
                        else m.group(), text)
    lines = code.split("\n")
    for m in _C_TOKEN.finditer(code):
        if m.group("number"):
            line = code.count("\n", 0, m.start())
            yield line + 1, lines[line], int(m.group("number").rstrip("uUlL"), 0)
        elif m.group("string"):
            line = code.count("\n", 0, m.start())
            for esc in re.findall(r"\\x([0-9a-fA-F]{2})", m.group()):
                yield line + 1, lines[line], int(esc, 16)


def _py_literals(text):
    """The same for Python and Cython: numbers, and the bytes of bytes literals."""
    lines = text.split("\n")
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    comments = {}
    found = []
    for tok in tokens:
        row = tok.start[0]
        if tok.type == tokenize.COMMENT:
            comments[row] = tok.start[1]
        elif tok.type == tokenize.NUMBER:
            try:
                found.append((row, int(tok.string.replace("_", ""), 0)))
            except ValueError:
                pass          # a float
        elif tok.type == tokenize.STRING and re.match(r"[rR]?[bB]", tok.string):
            for esc in re.findall(r"\\x([0-9a-fA-F]{2})", tok.string):
                found.append((row, int(esc, 16)))
    for row, value in found:
        line = lines[row - 1]
        if row in comments:
            line = line[:comments[row]]
        yield row, line, value


def _violations():
    out = []
    used = set()
    for rel, text in _sources():
        literals = _c_literals(text) if rel.endswith((".c", ".h")) else _py_literals(text)
        for row, line, value in literals:
            for name, values, context in RULES:
                if value not in values or (context and not context.search(line)):
                    continue
                allowed = [a for a in ALLOWED if a[0] == rel and a[1] in line]
                if allowed:
                    used.update((a[0], a[1]) for a in allowed)
                    continue
                out.append(f"{rel}:{row}: {name} {value} written as a literal "
                           f"(use csrc/wire.h / upcall/includes/wire.pxd): {line.strip()}")
    return out, used


def test_every_wire_number_is_defined_once():
    violations, _ = _violations()
    assert not violations, "\n".join(violations)


def test_the_exceptions_are_current():
    _, used = _violations()
    stale = [f"{p}: {s!r}" for p, s, _ in ALLOWED if (p, s) not in used]
    assert not stale, "ALLOWED entries that match nothing any more:\n" + "\n".join(stale)


def test_wire_h_defines_them():
    """The numbers the rules look for are the ones wire.h defines."""
    text = (ROOT / "csrc/wire.h").read_text()
    defines = dict(re.findall(r"^#define (UC_\w+) (\S+)", text, re.M))
    enums = dict(re.findall(r"^\s+(UC_WIRE_ERR_\w+) = (\d+),", text, re.M))
    assert int(defines["UC_EXT_OOB"]) == 126 and int(defines["UC_EXT_COALESCED"]) == 127
    assert int(defines["UC_BATCH_MARKER"], 0) == 0xc9
    assert int(defines["UC_WIRE_MAX_FRAMES"]) == 16 and int(defines["UC_OOB_REF_SIZE"]) == 16
    assert {int(v) for v in enums.values()} == RULES[-1][1]
    # The .pxd declares names only: no number of its own.
    pxd = (ROOT / "upcall/includes/wire.pxd").read_text()
    code = "\n".join(line.split("#")[0] for line in pxd.splitlines())
    assert not re.search(r"\b\d+\b", code.replace("uint32_t", "").replace("uint64_t", ""))


@pytest.mark.parametrize("rel", sorted(DEFINITIONS))
def test_definitions_exist(rel):
    assert (ROOT / rel).is_file()
