"""pko's version, and the one place that builds the ``User-Agent`` pko sends.

The version is the project's (``pyproject.toml``; test/machinery/test_field_managers.py checks they agree).
It is a constant, not ``importlib.metadata``: the self-contained agent (hack/build-agent.sh) carries
no distribution metadata of pko.

Why a user agent of our own matters: the apiserver records every create, update or non-apply patch
that names no ``fieldManager`` in ``managedFields`` under a manager derived from the request's
``User-Agent``, its part before the first ``/``; kubernetes-asyncio's default
(``OpenAPI-Generator/<ver>/python``) then files pko's writes under ``OpenAPI-Generator``, which
names nobody. Our product tokens therefore start with a name that is recognisably pko's and differs
from the Go operator's field manager (``pulumi-kubernetes-operator``): every write of pko names that
field manager explicitly, so an entry under :data:`OPERATOR_PRODUCT` in ``managedFields`` is a write
that forgot to, and an apiserver audit log tells pko's requests from the Go operator's.
"""

from __future__ import annotations

import platform
from typing import Final

__all__ = ["AGENT_PRODUCT", "OPERATOR_PRODUCT", "VERSION", "user_agent"]

VERSION: Final = "0.1.0"

# The product names (the part of a User-Agent before its first "/"; the apiserver's derived manager).
OPERATOR_PRODUCT: Final = "pulumi-kubernetes-operator-pko"
AGENT_PRODUCT: Final = "pko-agent"


def user_agent(product: str, *components: str) -> str:
    """``<product>/<VERSION> (python/<x.y.z>; <components>...)``, e.g.
    ``pulumi-kubernetes-operator-pko/0.1.0 (python/3.11.9; kubernetes-asyncio/36.1.0)``.

    ``components`` name the libraries that shape the requests (``name/version``); they sit in the
    comment, so the product, and with it the apiserver's derived manager, stays ``product``.
    """
    if not product or "/" in product or any(c.isspace() for c in product):
        raise ValueError(f"a product name is one token without '/': {product!r}")
    comment = "; ".join([f"python/{platform.python_version()}", *components])
    return f"{product}/{VERSION} ({comment})"
