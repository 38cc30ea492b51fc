#!/usr/bin/env python3
"""``python hack/gen_rbac.py ...``: the tool in pko/devtools/gen_rbac.py, whose docstring says what
it does (hack/devtool.py runs it)."""

import devtool

devtool.run("pko.devtools.gen_rbac")
