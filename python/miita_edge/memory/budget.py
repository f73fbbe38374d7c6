"""Memory byte budgets: ``C_mem`` of the paper, as the user writes it.

The paper's default budget is "1% of the full training stream" measured in
bytes (section 4); users of a device also think in absolute sizes. A
:class:`Budget` is therefore either an absolute byte count, a fraction of the
stream (resolved once the stream size is known, see
``streams.stream_bytes``), or unlimited.

Accepted text (case-insensitive, optional space before the unit):

* ``4096`` or ``4096B``           -> 4096 bytes
* ``64KiB`` / ``1.5MiB`` / ``2GiB`` -> binary units (2^10, 2^20, 2^30)
* ``64KB`` / ``1.5MB`` / ``2GB``    -> decimal units (10^3, 10^6, 10^9)
* ``1%`` / ``0.5%``               -> that share of the stream's bytes
* ``none`` / ``inf`` / ``unlimited`` -> no limit

Choices made here (the paper only says "1%"):

* Bytes are whole: a size that is not a whole number of bytes (``1.1KiB``
  = 1126.4) is rounded *down*, so the budget is never exceeded.
* A fraction resolves to ``floor(fraction * stream_bytes)`` computed with
  exact decimal arithmetic (``0.29 * 100`` is 29, not 28 as in binary floats).
* Which stream: at each ingest call, the stream as it will be after that call
  (everything ingested before plus the whole call), resolved once for the call
  (``method.ingest.call_stream_bytes``). Resolving it at each example against
  the stream so far gave a fresh memory a few bytes for its first row, so
  ``--budget 5%`` failed on line 1. The benchmark runner resolves the fraction
  once against its whole learned stream, which is the same rule applied to the
  stream as one call: the final memory has the same byte limit either way.
* Zero (``0``, ``0%``, ``0.4B``) is refused with :class:`BudgetError`: no memory
  fits in it, and "no memory" is better expressed by not using one.
* Percentages above 100 are allowed (a budget larger than the stream is odd
  but harmless).
"""
from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation, localcontext

from ..errors import BudgetError, InputError

__all__ = ["Budget", "UNITS", "as_budget", "parse_budget"]

UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
}
_UNLIMITED = {"none", "inf", "unlimited"}
_NUMBER = r"(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_PATTERN = re.compile(rf"^{_NUMBER}[ \t]*(?P<unit>[a-z]*|%)$")
_HINT = "use e.g. 4096, 64KiB, 1.5MB, 1% or none"


@dataclass(frozen=True)
class Budget:
    """A memory budget. ``absolute`` in bytes, ``fraction`` of the stream (0.01 = 1%).

    Both None means unlimited. If both are set (only possible when built by
    hand) the smaller resolved value wins.
    """

    absolute: int | None = None
    fraction: float | None = None
    #: the text it was parsed from, kept verbatim: a memory's manifest stores it as written
    text: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.absolute is not None and (isinstance(self.absolute, bool) or not isinstance(self.absolute, int)
                                          or self.absolute < 1):
            raise BudgetError(f"budget of {self.absolute!r} bytes cannot hold any memory; it must be >= 1 byte")
        if self.fraction is not None and not (isinstance(self.fraction, (int, float)) and
                                              math.isfinite(self.fraction) and self.fraction > 0):
            raise BudgetError(f"budget fraction {self.fraction!r} must be a finite number > 0")

    @property
    def spec(self) -> str:
        """The budget as a user writes it: the text it was parsed from, else its canonical form."""
        return self.text if self.text is not None else str(self)

    @property
    def unlimited(self) -> bool:
        return self.absolute is None and self.fraction is None

    def resolve(self, stream_bytes: int) -> int:
        """Bytes allowed for a stream of ``stream_bytes`` bytes (``sys.maxsize`` if unlimited).

        A fractional budget can resolve to 0 bytes on a tiny stream; the
        memory writer is the one that reports that (it knows the smallest
        valid memory).
        """
        if stream_bytes < 0:
            raise ValueError(f"stream_bytes must be >= 0, got {stream_bytes}")
        limits = []
        if self.absolute is not None:
            limits.append(self.absolute)
        if self.fraction is not None:
            # repr() is the shortest decimal that round-trips, i.e. what the user typed.
            with localcontext() as ctx:
                ctx.prec = 60  # exact: ~17 digits of fraction x <= 20 digits of bytes
                limits.append(int(Decimal(repr(float(self.fraction))) * stream_bytes))  # int() floors (>= 0)
        return min(limits) if limits else sys.maxsize

    def __str__(self) -> str:
        parts = []
        if self.absolute is not None:
            parts.append(f"{self.absolute} B")
        if self.fraction is not None:
            pct = Decimal(repr(float(self.fraction))) * 100
            parts.append(f"{pct.normalize():f}%")
        return " and ".join(parts) if parts else "none"


def as_budget(value: "str | Budget") -> Budget:
    """A Budget from a user's text (parsed here, at the edge) or one already parsed."""
    return value if isinstance(value, Budget) else parse_budget(value)


def parse_budget(text: str) -> Budget:
    """Parse a budget flag value (see module docstring); one-line error naming the value."""
    if not isinstance(text, str):
        raise InputError(f"budget {text!r} must be text; {_HINT}")
    shown = text.strip() if text.strip().isprintable() else repr(text)  # keep the message one line
    t = text.strip().lower()
    if t in _UNLIMITED:
        return Budget(None, None, text)
    m = _PATTERN.match(t)
    if not m or m.group("unit") not in UNITS and m.group("unit") != "%":
        raise InputError(f'budget "{shown}" is not understood; {_HINT}')
    try:
        num = Decimal(m.group("num"))
    except InvalidOperation:  # pragma: no cover - the regex only admits decimals
        raise InputError(f'budget "{shown}" is not understood; {_HINT}') from None
    unit = m.group("unit")
    if unit == "%":
        if num == 0:
            raise BudgetError(f'budget "{shown}" is zero; no memory fits in it')
        return Budget(None, float(num / 100), text)
    with localcontext() as ctx:
        ctx.prec = len(m.group("num")) + 20  # exact product, no rounding up
        nbytes = int(num * UNITS[unit])  # int() floors: never exceed what was asked for
    if nbytes < 1:
        raise BudgetError(f'budget "{shown}" is less than one byte; no memory fits in it')
    return Budget(nbytes, None, text)
