#!/usr/bin/env python3
"""``python3 hack/localcluster.py ...``: the tool in pko/devtools/localcluster.py, whose docstring says
what it does (hack/devtool.py runs it)."""

import devtool

devtool.run("pko.devtools.localcluster")
