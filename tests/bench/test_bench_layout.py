"""The benchmark's layout: every bench module imports, and the import graph
between them, read from the sources, has no cycle; the harness layer never
imports a section (a section may import the harness and its own parts).

Imports are read with ``ast`` wherever they are written (module level, in a
function, under ``if TYPE_CHECKING:``): a cycle hidden in a function or in a
type-checking block is still a cycle for the reader.
"""
import ast
import os

import pytest

from bench_package import BENCH_DIR, bench_module

#: The harness layer: what the sections share.  None of these may import a section.
HARNESS = {"harness", "endpoints", "measure", "report", "progress", "peer", "floors", "workload", "netns",
           "coalescing", "plot"}
#: The sections (one per bench_upcalls.py flag) and their parts.
SECTIONS = {"codec", "upcalls", "contention", "bus", "publish", "large", "compression", "shared",
            "proxy", "stamping", "cluster"}
#: A section's parts: imported by that section only.
PARTS = {"bus": {"publish"}, "large": {"compression"}}
#: Programs run on their own (callgrind, profiling), importing the harness or a section.
SCRIPTS = {"hotpath", "drain_cost", "error_reports", "cluster_peer"}


def _modules():
    return sorted(f[:-3] for f in os.listdir(BENCH_DIR)
                  if f.endswith(".py") and f != "__init__.py")


def _bench_imports(name):
    """The bench modules that bench/NAME.py imports, anywhere in its source."""
    with open(os.path.join(BENCH_DIR, name + ".py")) as f:
        tree = ast.parse(f.read(), name + ".py")
    known = set(_modules())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "bench" and len(parts) > 1:
                    found.add(parts[1])
                elif parts[0] in known:           # a bare sibling import (sys.path trick)
                    found.add(parts[0])
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            parts = mod.split(".")
            if node.level == 0 and parts[0] == "bench":
                if len(parts) > 1:
                    found.add(parts[1])
                else:                              # from bench import x, y
                    found.update(a.name for a in node.names if a.name in known)
            elif node.level == 0 and parts[0] in known:
                found.add(parts[0])
            elif node.level == 1:
                found.update([parts[0]] if mod else [a.name for a in node.names])
    found.discard(name)
    return found & known


def _cycle(graph):
    """One import cycle as a list of module names, or None."""
    state = {}

    def visit(n, path):
        state[n] = "open"
        for m in sorted(graph[n]):
            if state.get(m) == "open":
                return path[path.index(m):] + [m]
            if m not in state:
                got = visit(m, path + [m])
                if got:
                    return got
        state[n] = "done"
        return None

    for n in sorted(graph):
        if n not in state:
            got = visit(n, [n])
            if got:
                return got
    return None


def test_every_bench_module_is_placed_in_the_layout():
    assert set(_modules()) == HARNESS | SECTIONS | SCRIPTS


@pytest.mark.parametrize("name", sorted(HARNESS | SECTIONS))
def test_bench_module_imports(name):
    pytest.importorskip("psutil")
    assert bench_module(name).__name__ == f"bench.{name}"


def test_bench_import_graph_has_no_cycle():
    graph = {n: _bench_imports(n) for n in _modules()}
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph))}"


def test_the_harness_imports_no_section():
    wrong = {n: sorted(_bench_imports(n) - HARNESS) for n in HARNESS & set(_modules())}
    assert {n: s for n, s in wrong.items() if s} == {}


def test_a_section_imports_the_harness_and_its_own_parts_only():
    wrong = {n: sorted(_bench_imports(n) - HARNESS - PARTS.get(n, set()))
             for n in SECTIONS & set(_modules())}
    assert {n: s for n, s in wrong.items() if s} == {}


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
