#!/usr/bin/env python3
"""The upcall benchmark: codec, upcall rates, the bus end to end.

    python bench_upcalls.py                 # every section
    python bench_upcalls.py --codec --bus   # some sections
    python bench_upcalls.py --quick --json out.json --plot out.png

Also available as ``python -m upcall bench``.  Every compared figure is a
ratio measured within one run; see PERF.md for how to read the tables.
"""
import sys

from upcall.bench.main import main

if __name__ == "__main__":
    sys.exit(main())
