#!/usr/bin/env python3
"""``python hack/shuffle.py ...``: the tool in pko/devtools/shuffle.py, whose docstring says what it
does (hack/devtool.py runs it)."""

import devtool

devtool.run("pko.devtools.shuffle")
