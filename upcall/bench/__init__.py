"""Benchmark sections of bench_upcalls.py, one module per section."""
