#!/usr/bin/env python3
"""``python hack/import_k8s_openapi.py ...``: the tool in pko/devtools/import_k8s_openapi.py, whose docstring
says what it does (hack/devtool.py runs it)."""

import devtool

devtool.run("pko.devtools.import_k8s_openapi")
