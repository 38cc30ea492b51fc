#!/usr/bin/env python3
"""``python3 hack/registry.py ...``: the tool in pko/devtools/registry.py, whose docstring says what
it does (hack/devtool.py runs it)."""

import devtool

devtool.run("pko.devtools.registry")
