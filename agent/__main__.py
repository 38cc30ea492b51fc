"""``python -m pko.agent`` / the ``pko-agent`` script / the self-contained ``agent`` executable."""

from __future__ import annotations

import sys

from pko.agent.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
