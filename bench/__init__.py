"""The benchmark behind bench_upcalls.py (source tree only, not installed).

One module per section (codec, upcalls, contention, bus, large) and per part
of one (publish: the --bus publishing rows; compression: the --large lz4 and zstd
rows), the workload they share, the peer process, the physical floors' C
programs (floors, *.c), what the build has for coalescing (coalescing), a
rate-limited link between network namespaces (netns), and the measuring,
table and plot helpers.
"""
