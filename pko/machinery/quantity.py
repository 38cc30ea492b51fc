"""Kubernetes resource quantities (``64Mi``, ``100m``, ``1e3``, ``1.5Gi``) as numbers: what the
workspace defaults compare with a user's own figures, and what the test suite's kubelet reads limits
and ``resourceFieldRef`` values with."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Final

__all__ = ["parse_quantity"]

_QUANTITY: Final = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?)$"
)
_SUFFIXES: Final[dict[str, Decimal]] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    **{s: Decimal(2 ** (10 * (i + 1))) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
}


def parse_quantity(text: str | int | float) -> Decimal:
    """The quantity's value; ValueError when ``text`` is not a quantity."""
    m = _QUANTITY.match(str(text).strip())
    if m is None:
        raise ValueError(f"invalid quantity {text!r}")
    try:
        value = Decimal(m.group(1))
    except InvalidOperation:
        raise ValueError(f"invalid quantity {text!r}") from None
    if m.group(2):
        return value * Decimal(10) ** int(m.group(2)[1:])
    return value * _SUFFIXES[m.group(3) or ""]
