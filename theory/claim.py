"""The record every ledger check returns: one claim of the paper and our verdict on it.

A verdict is one of three words:

- ``holds``: checked under the paper's conditions, including those the paper states itself
  (e.g. "consider the linear segment"), AND under every attempt to break it within them
  (groups larger than two, unequal lengths, clipping on either side, both advantage signs,
  product ratio eq 11 and geometric-mean ratio eq 44, real softmax tables); nothing broke.
  What happens outside a condition the paper states goes in ``notes``.
- ``holds-under-conditions``: true only under a condition the paper does not state;
  ``conditions`` names it and ``evidence`` shows what happens without it.
- ``fails``: false as stated; ``evidence`` holds an exact counterexample.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

HOLDS = "holds"
HOLDS_UNDER_CONDITIONS = "holds-under-conditions"
FAILS = "fails"
VERDICTS = (HOLDS, HOLDS_UNDER_CONDITIONS, FAILS)

METHODS = ("symbolic", "numeric", "exhaustive", "property")


@dataclass(frozen=True)
class Claim:
    """One row of the claims ledger."""

    id: str
    """Stable identifier, e.g. ``"eq-55"`` or ``"cor-H.1"``."""
    source: str
    """Where the claim is in the paper (section / equation)."""
    statement: str
    """The claim, in our words."""
    conditions: str
    """Exactly what the check assumed."""
    method: str
    """How it was checked: one or more of symbolic / numeric / exhaustive / property, joined by '+'."""
    verdict: str
    """``holds`` / ``holds-under-conditions`` / ``fails``."""
    evidence: str
    """The sympy residual, the sampled maximum error, or an exact counterexample."""
    notes: str = ""
    """Anything a reader should know besides the verdict (peer conventions, loss-core ties)."""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got verdict={self.verdict!r} (claim {self.id})")
        for part in self.method.split("+"):
            if part not in METHODS:
                raise ValueError(f"method parts must be in {METHODS}, got method={self.method!r} (claim {self.id})")

    def to_dict(self) -> dict[str, str]:
        return asdict(self)
