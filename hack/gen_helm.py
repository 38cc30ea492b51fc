#!/usr/bin/env python3
"""``python hack/gen_helm.py ...``: the tool in pko/devtools/gen_helm.py, whose docstring says what
it does (hack/devtool.py runs it)."""

import devtool

devtool.run("pko.devtools.gen_helm")
