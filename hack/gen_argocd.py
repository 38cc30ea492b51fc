#!/usr/bin/env python3
"""``python hack/gen_argocd.py ...``: the tool in pko/devtools/gen_argocd.py, whose docstring says what
it does (hack/devtool.py runs it)."""

import devtool

devtool.run("pko.devtools.gen_argocd")
