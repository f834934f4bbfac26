#!/usr/bin/env python3
"""The upcall benchmark: codec, upcall rates, contention, the bus end to end.

    python bench_upcalls.py                 # codec, upcalls and bus: 2 to 5 minutes
    python bench_upcalls.py --full          # the same, PERF.md's counts: about 45 minutes
    python bench_upcalls.py --codec --bus   # some sections
    python bench_upcalls.py --contention    # the long one, only when asked
    python bench_upcalls.py --shared        # many subscriptions on one shared socket
    python bench_upcalls.py --proxy         # upcall proxy against C zmq_proxy
    python bench_upcalls.py --stamping      # stamp=True against unstamped and the C floors
    python bench_upcalls.py --cluster       # five netns hosts with link faults (root)
    python bench_upcalls.py --quick --json out.json --plot out.png   # under a minute

Plots are drawn by default, one per section, into build/bench/bench-<section>.png
under the current directory (``--plot FILE.png`` elsewhere, ``--no-plot`` none);
without matplotlib the run says so and draws none.

The default profile runs fewer messages and repeats, the bus over inproc and
tcp only, and waits at most 2 s per run (60 s in all) for an idle machine;
``--full`` runs what PERF.md's figures come from: every transport, three
repeats, up to 30 s of waiting before each run.

Each section is a module of bench/ with ``add_arguments(parser)`` and
``run(opts) -> list[dict]``: it prints its own table and returns one record
per row for ``--json`` and ``--plot``; the sections share the harness
(bench/harness.py and its neighbours), drawn in bench/README.md.  Every compared figure is a ratio
measured within one run; see PERF.md for how to read the tables.
"""
import argparse
import json
import os
import platform
import sys
import time

from bench import (bus, cluster, codec, contention, large, measure, proxy, report, shared,
                   stamping, upcalls)
from bench.progress import fmt_duration

SECTIONS = {"codec": codec, "upcalls": upcalls, "contention": contention, "bus": bus,
            "large": large, "shared": shared, "proxy": proxy, "stamping": stamping,
            "cluster": cluster}
DEFAULT = ["codec", "upcalls", "bus"]   # contention and large are long: ask for them
#: The default profile's total wait for an idle machine, over all runs (s).
IDLE_BUDGET = 60.0
#: How long the default sections take on the 2-vCPU development machine.
EXPECTED = {"quick": "under a minute", "default": "2 to 5 minutes", "full": "about 45 minutes"}
#: Where the plots go unless --plot says otherwise (relative to the current
#: directory; `make bench` runs in the tree, whose build/ git ignores).
DEFAULT_PLOT = os.path.join("build", "bench", "bench.png")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="bench_upcalls.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in SECTIONS:
        parser.add_argument(f"--{name}", action="store_true", help=f"run the {name} section")
    parser.add_argument("--quick", action="store_true",
                        help="small counts: checks that every mode runs, figures mean little")
    parser.add_argument("--full", action="store_true",
                        help="the counts, repeats, transports and idle waits PERF.md's figures "
                             "come from (about 45 minutes for the default sections)")
    parser.add_argument("--wide", action="store_true",
                        help="tables with whole (min-max) ranges, wider than 120 columns")
    parser.add_argument("--json", metavar="FILE", help="write one record per row")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="draw one figure per section as FILE-<section>.png (needs matplotlib; "
                             f"default {DEFAULT_PLOT})")
    parser.add_argument("--no-plot", action="store_true", help="draw no figures")
    for mod in SECTIONS.values():
        mod.add_arguments(parser)
    opts = parser.parse_args(argv)
    if opts.full and opts.quick:
        parser.error("--full and --quick exclude each other")
    if opts.plot and opts.no_plot:
        parser.error("--plot and --no-plot exclude each other")
    report.WIDE = opts.wide
    # --quick's counts are too small for its figures to mean much: it shows
    # them beside their targets without saying met or missed.
    report.JUDGE = not opts.quick
    profile = "quick" if opts.quick else "full" if opts.full else "default"
    if profile == "default":
        measure.set_idle_budget(IDLE_BUDGET)

    chosen = [n for n in SECTIONS if getattr(opts, n)] or DEFAULT
    print(f"# upcall benchmark: Python {platform.python_version()}, {platform.machine()}, "
          f"{sys.platform}, profile={profile}")
    if chosen == DEFAULT:
        print(f"# {', '.join(chosen)}: {EXPECTED[profile]} on a quiet 2-vCPU machine"
              + ("; --full for PERF.md's counts" if profile == "default" else ""), flush=True)
    t0 = time.monotonic()
    records = []
    for name in chosen:
        for rec in SECTIONS[name].run(opts):
            records.append({"section": name, **rec})
    print(f"\n# {fmt_duration(time.monotonic() - t0)} in all; waited "
          f"{measure.idle_waited:.0f} s for an idle machine"
          + (f", {measure.idle_gave_up} run(s) started on a busy machine"
             if measure.idle_gave_up else ""), flush=True)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(records, f, indent=1)
        print(f"\nwrote {len(records)} records to {opts.json}")
    if not opts.no_plot:
        _plot(records, opts.plot)
    return 0


def _plot(records, asked):
    """One figure per section, at ``asked`` or the default place; without
    matplotlib, an error when asked for, a note otherwise."""
    from bench.plot import plot
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if asked:
            raise
        print("\nno plots: matplotlib is not installed (in a clone: pip install --group bench)")
        return
    path = asked or DEFAULT_PLOT
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    for written in plot(records, path):
        print(f"wrote {written}")


if __name__ == "__main__":
    sys.exit(main())
