"""``python -m upcall``: the command line (upcall/cli.py), as the ``upcall``
console script runs it."""
import sys

from upcall.cli import main

if __name__ == "__main__":
    sys.exit(main())
