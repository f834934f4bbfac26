"""The benchmark behind bench_upcalls.py (source tree only, not installed).

Sections (codec, upcalls, contention, bus with its publishing part, large
with its compression part) import the harness (harness, measure, report,
progress, peer, workload, floors, coalescing, netns, plot), never each
other; bench/README.md draws the layout.
"""
