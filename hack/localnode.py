#!/usr/bin/env python3
"""``python3 hack/localnode.py ...``: the tool in pko/devtools/localnode.py, whose docstring says what it
does (hack/devtool.py runs it)."""

import devtool

devtool.run("pko.devtools.localnode")
