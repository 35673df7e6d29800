"""The record every ledger check returns: one claim of the paper and our verdict on it.

A verdict is one of three words:

- ``holds``: checked under the paper's conditions, including those the paper states itself
  (e.g. "consider the linear segment"), AND under every attempt to break it within them
  (groups larger than two, unequal lengths, clipping on either side, both advantage signs,
  product ratio eq 11 and geometric-mean ratio eq 44, real softmax tables); nothing broke.
  What happens outside a condition the paper states goes in ``notes``.
- ``holds-under-conditions``: true only under a condition the paper does not state;
  ``conditions`` names it, ``evidence`` shows what happens without it, and ``met_by`` names an
  instance of the paper's own setting (softmax policies -- tabular or an LLM -- trained with
  group-relative advantages) in which the condition is met.
- ``fails``: false as stated; ``evidence`` holds an exact counterexample. A claim that would hold only
  under a condition the paper's own model class can never meet (e.g. score vectors orthogonal with one
  norm, which no softmax has) fails too: within the paper's setting no instance satisfies it, and
  "holds-under-conditions" would suggest one does. ``notes`` names the condition.
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
    met_by: str = ""
    """For ``holds-under-conditions``: where in the paper's own setting the condition is met (the audit that
    keeps a condition no softmax policy can meet from earning that verdict); empty otherwise."""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got verdict={self.verdict!r} (claim {self.id})")
        for part in self.method.split("+"):
            if part not in METHODS:
                raise ValueError(f"method parts must be in {METHODS}, got method={self.method!r} (claim {self.id})")

    def to_dict(self) -> dict[str, str]:
        return asdict(self)
