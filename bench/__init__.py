"""The benchmark behind bench_upcalls.py (source tree only, not installed).

One module per section (codec, upcalls, contention, bus), the workload they
share, the peer process, and the measuring, table and plot helpers.
"""
