"""The C core's layering, checked by reading its sources as text.

csrc/ builds and tests without Python, and the synthetic benchmark source is
kept apart from the subscription life cycle and the zmq source: the core
reaches it only through the ops table (csrc/sub_impl.h).  That csrc/*.c
compiles with -Wall -Wextra -Werror is `make -C csrc test`'s job.
"""
import pathlib
import re

CSRC = pathlib.Path(__file__).resolve().parent.parent / "csrc"
SYNTH_FILES = {"sub_synth.c", "synth.h"}


def core_sources():
    return sorted(p for p in CSRC.rglob("*") if p.suffix in (".c", ".h"))


def test_the_c_core_does_not_include_python():
    assert core_sources()
    offenders = [str(p.relative_to(CSRC)) for p in core_sources()
                 if re.search(r'Python\.h|#\s*include\s*[<"]Python', p.read_text())]
    assert offenders == []


def test_the_synthetic_source_stays_in_its_own_files():
    for name in ("sub.c", "sub_zmq.c", "bus.h", "pub.c"):
        assert (CSRC / name).is_file(), name
    offenders = [p.name for p in CSRC.glob("*.[ch]")
                 if p.name not in SYNTH_FILES and "synth" in p.read_text().lower()]
    assert offenders == []
