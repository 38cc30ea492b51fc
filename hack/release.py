#!/usr/bin/env python3
"""``python hack/release.py ...``: the tool in pko/devtools/release.py, whose docstring says what it
does (hack/devtool.py runs it)."""

import devtool

devtool.run("pko.devtools.release")
