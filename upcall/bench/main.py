"""Command line of the benchmark: pick sections, run them, write JSON / PNG.

Each section is a module of this package with ``add_arguments(parser)``
(optional) and ``run(opts) -> list[dict]``: it prints its own table and
returns one record per row for ``--json`` and ``--plot``.
"""
import argparse
import importlib
import json
import platform
import sys

SECTIONS = ["codec", "upcalls", "contention", "bus"]
DEFAULT = ["codec", "upcalls", "bus"]   # contention is long: ask for it


def _load(name):
    try:
        return importlib.import_module(f"upcall.bench.{name}")
    except ImportError as exc:
        if exc.name != f"upcall.bench.{name}":
            raise
        return None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="bench_upcalls.py", description=__doc__)
    for name in SECTIONS:
        parser.add_argument(f"--{name}", action="store_true", help=f"run the {name} section")
    parser.add_argument("--quick", action="store_true",
                        help="small counts: checks that every mode runs, figures mean little")
    parser.add_argument("--json", metavar="FILE", help="write one record per row")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the tables (needs matplotlib)")
    modules = {name: _load(name) for name in SECTIONS}
    for mod in modules.values():
        if mod is not None and hasattr(mod, "add_arguments"):
            mod.add_arguments(parser)
    opts = parser.parse_args(argv)

    chosen = [n for n in SECTIONS if getattr(opts, n)] or DEFAULT
    print(f"# upcall benchmark: Python {platform.python_version()}, {platform.machine()}, "
          f"{sys.platform}, quick={opts.quick}")
    records = []
    for name in chosen:
        mod = modules[name]
        if mod is None:
            print(f"\n## {name}: not available in this build")
            continue
        for rec in mod.run(opts):
            records.append({"section": name, **rec})
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(records, f, indent=1)
        print(f"\nwrote {len(records)} records to {opts.json}")
    if opts.plot:
        from upcall.bench.plot import plot
        plot(records, opts.plot)
        print(f"wrote {opts.plot}")
    return 0
