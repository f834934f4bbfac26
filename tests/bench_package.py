"""Import the benchmark's modules (bench/ beside tests/, not installed).

The package is loaded from its path: the source tree itself never goes on
sys.path, where its upcall/ would shadow the upcall under test (a
non-editable install for another CPython).
"""
import importlib
import importlib.util
import os
import sys

BENCH_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")


def bench_module(name):
    """The module ``bench.<name>``."""
    if "bench" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "bench", os.path.join(BENCH_DIR, "__init__.py"),
            submodule_search_locations=[BENCH_DIR])
        package = importlib.util.module_from_spec(spec)
        sys.modules["bench"] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"bench.{name}")
