#!/usr/bin/env python3
"""``python3 hack/chaos.py ...``: the tool in pko/devtools/chaos.py, whose docstring says what it
does (hack/devtool.py runs it)."""

import devtool

devtool.run("pko.devtools.chaos")
