#!/usr/bin/env python3
"""``python hack/build_plugin.py ...``: the tool in pko/devtools/build_plugin.py, whose docstring says what it
does (hack/devtool.py runs it)."""

import devtool

devtool.run("pko.devtools.build_plugin")
