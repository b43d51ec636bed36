"""How a score is shown, by the command lines and by the generated docs alike: one rounding rule.

A record keeps a figure to four decimals (``round(x, 4)``); a table shows two. Rounding the full value to two
places and rounding the record's four-decimal value to two places disagree at a tie: an STS average of
78.87498 prints 78.87, while its record holds 78.875, which the docs printed as 78.88. The rule, everywhere:
the value as a record keeps it (four decimals), then two decimals with a tie to the even digit, on the decimal
digits themselves (not on the binary float, where 78.865 is just below or above its tie).
"""
from __future__ import annotations

import math
from decimal import ROUND_HALF_EVEN, Decimal

RECORD_PLACES = 4  # the decimals a record keeps of a score


def figure(value: float, places: int = 2, sign: bool = False) -> str:
    """``value`` rounded as a record keeps it, then to ``places`` decimals, ties to even (``+`` with ``sign``)."""
    if not math.isfinite(value):
        return f"{value:+}" if sign else f"{value}"
    kept = Decimal(repr(round(float(value), RECORD_PLACES)))
    shown = kept.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_EVEN)
    if shown == 0:
        shown = abs(shown)  # no "-0.00"
    return f"{shown:+}" if sign else f"{shown}"
