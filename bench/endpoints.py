"""Fresh endpoint strings, one definition for the benchmark and the tests
(tests/conftest.py's ``endpoints`` fixture loads this module): a new
inproc name, ipc path or tcp port on each call, so that no run sees
another's leftovers.  Plain Python, nothing of upcall's."""
from __future__ import annotations

import itertools
import os
import shutil
import socket
import tempfile
from typing import Callable


def kernel_free_port() -> int:
    """A tcp port on 127.0.0.1 the kernel says is free now (ephemeral)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Endpoints:
    """``endpoints.new(transport)`` or ``endpoints(transport)``, transport
    "inproc", "ipc" or "tcp".

    ipc_dir: where ipc paths go (default: a temporary folder made on first
    use, removed by cleanup()).  tcp_port: what picks a tcp port; a concrete
    port, since the side that binds may come after the one that connects
    (default: one the kernel says is free)."""

    def __init__(self, ipc_dir: str | None = None,
                 tcp_port: Callable[[], int] = kernel_free_port):
        self.ipc_dir = ipc_dir
        self._own_dir = False
        self._tcp_port = tcp_port
        self._k = itertools.count()

    def new(self, transport: str) -> str:
        k = next(self._k)
        if transport == "inproc":
            return f"inproc://upcall-{os.getpid()}-{id(self):x}-{k}"
        if transport == "ipc":
            if self.ipc_dir is None:
                self.ipc_dir = tempfile.mkdtemp(prefix="upcall-endpoints-")
                self._own_dir = True
            return f"ipc://{self.ipc_dir}/s{k}.sock"
        if transport == "tcp":
            return f"tcp://127.0.0.1:{self._tcp_port()}"
        raise ValueError(f"unknown transport {transport!r}")

    __call__ = new

    def cleanup(self) -> None:
        """Remove the ipc folder this object made (one it was given stays)."""
        if self._own_dir and self.ipc_dir is not None:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
            self.ipc_dir = None
            self._own_dir = False
