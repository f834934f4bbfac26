#!/usr/bin/env python3
"""The upcall benchmark: codec, upcall rates, contention, the bus end to end.

    python bench_upcalls.py                 # codec, upcalls and bus
    python bench_upcalls.py --codec --bus   # some sections
    python bench_upcalls.py --contention    # the long one, only when asked
    python bench_upcalls.py --quick --json out.json --plot out.png

Each section is a module of bench/ with ``add_arguments(parser)`` and
``run(opts) -> list[dict]``: it prints its own table and returns one record
per row for ``--json`` and ``--plot``.  Every compared figure is a ratio
measured within one run; see PERF.md for how to read the tables.
"""
import argparse
import json
import platform
import sys

from bench import bus, codec, contention, large, upcalls

SECTIONS = {"codec": codec, "upcalls": upcalls, "contention": contention, "bus": bus,
            "large": large}
DEFAULT = ["codec", "upcalls", "bus"]   # contention and large are long: ask for them


def main(argv=None):
    parser = argparse.ArgumentParser(prog="bench_upcalls.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in SECTIONS:
        parser.add_argument(f"--{name}", action="store_true", help=f"run the {name} section")
    parser.add_argument("--quick", action="store_true",
                        help="small counts: checks that every mode runs, figures mean little")
    parser.add_argument("--json", metavar="FILE", help="write one record per row")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the tables (needs matplotlib)")
    for mod in SECTIONS.values():
        mod.add_arguments(parser)
    opts = parser.parse_args(argv)

    chosen = [n for n in SECTIONS if getattr(opts, n)] or DEFAULT
    print(f"# upcall benchmark: Python {platform.python_version()}, {platform.machine()}, "
          f"{sys.platform}, quick={opts.quick}")
    records = []
    for name in chosen:
        for rec in SECTIONS[name].run(opts):
            records.append({"section": name, **rec})
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(records, f, indent=1)
        print(f"\nwrote {len(records)} records to {opts.json}")
    if opts.plot:
        from bench.plot import plot
        plot(records, opts.plot)
        print(f"wrote {opts.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
