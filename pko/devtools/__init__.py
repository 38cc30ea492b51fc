"""Support for the tests and the tools: what ``test/``, ``e2e/`` and ``hack/`` share (waiting, kubectl,
the loopback servers, the examples' overlays, ...), imported as ``pko.devtools.*`` like the rest of pko.

Importable from a checkout (the development virtualenv installs the repository editable, and
``python3 -m pko.devtools.<module>`` works from the repository root), but not part of the distribution:
pyproject.toml does not list this package, so the wheel and the images (``pip install .``) leave it out
(test/test_packaging.py says so). Modules a tool runs before the virtualenv exists use the standard
library only, and this package's ``__init__`` imports nothing.
"""
