"""``python -m upcall``: no commands yet.

The benchmark is not part of the installed package: it lives in the source
tree (``python bench_upcalls.py`` or ``make bench`` there).
"""
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        print("upcall: the benchmark lives in the source tree: run `python bench_upcalls.py` "
              "or `make bench` there", file=sys.stderr)
    else:
        print("upcall: no commands yet (the benchmark: `python bench_upcalls.py` in the "
              "source tree)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
