"""``python -m upcall bench [...]``: the benchmark, as bench_upcalls.py."""
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m upcall bench [bench options]  (see: python -m upcall bench --help)")
        return 0 if argv else 2
    if argv[0] == "bench":
        from upcall.bench.main import main as bench
        return bench(argv[1:])
    print(f"upcall: unknown command {argv[0]!r}; try: python -m upcall bench", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
