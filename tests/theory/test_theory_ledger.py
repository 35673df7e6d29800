"""The claims ledger: every claim's verdict is pinned, so a change in the maths or in the loss core
that flips a verdict fails here, loudly, with the claim's evidence in the message."""

from __future__ import annotations

import json

import pytest

from dfpo.theory.claim import FAILS, HOLDS, HOLDS_UNDER_CONDITIONS, METHODS, VERDICTS, Claim
from dfpo.theory.ledger import (
    REGISTRY,
    count_line,
    render_json,
    render_markdown,
    render_table,
    run_ledger,
    summary_counts,
    validate_ids,
)

H, C, F = HOLDS, HOLDS_UNDER_CONDITIONS, FAILS

# The verdict we obtained for each claim, written out by hand. Changing one is a finding: say why in the commit.
EXPECTED = {
    "prop-3.1": H,
    "cor-3.2": F,  # needs orthogonal equal-norm scores, which no softmax has: p=(0.6,0.3,0.1), kappa=(1/2,1/2,0) drifts -0.3 eta
    "cor-3.2-params": C,  # equal coefficients drift when outputs share parameters (G_aa - G_bb != 2 (G_ac - G_bc))
    "cor-3.3": C,  # 'requires u_1 = ... = u_G' only for G = 2; for G >= 3 the set is the hyperplane A.u = 0
    "cor-3.4": H,  # under the corollary's own construction (stilde a constant coefficient, App. D's length condition); the ratio form is outside it
    "eq-9": C,  # GRPO cancels only with a length-independent normalisation or equal lengths
    "eq-10": H,
    "eq-13": H,
    "eq-66-67": H,
    "sec-4.4.1": H,  # the paper states its conditions: whole-group event (Prop. 3.1), constant coefficient (D.2), equal lengths (D.3)
    "eq-18": H,
    "eq-23": C,  # Min-Replace lowers Asym; Orth-Proj can raise it
    "tab-3-no-stopgrad": F,  # without stop-grad the DFPO objective is identically 0: no gradient at all
    "stopgrad-forms": H,  # eq 68, eq 85 and eqs 59-62 are all derived on the linear segment (App. C, D.1, K.2), where they agree
    "tab-3-scale": C,  # a global factor 0.5 shrinks the step only for SGD-like optimisers, not Adam
    "eq-30": H,
    "eq-38": H,
    "eq-41": F,  # eq 40's independence is never met by completions of one prompt on a softmax; equal weights drift
    "eq-49": H,
    "eq-51": H,
    "eq-55": F,  # beta printed with the wrong sign; 'stilde >= eps' is false
    "thm-C.1": H,
    "eq-74": H,
    "cor-F.1": H,
    "eq-75-76": F,  # value coefficients, not gradient coefficients
    "cor-G.1": C,  # needs E[A | C] = 0 exactly
    "eq-81": F,  # not the gradient of eq 80 when clipping is active
    "cor-H.1": H,
    "sec-H.3": F,  # symmetric clipping is the less pessimistic surrogate; neither is uniformly more conservative
    "eq-92": H,  # an identity on the linear segment, which the paper states itself (K.2 'Consider the linear segment')
    "eq-93": H,
    "sec-K.4": F,  # the summed Min-Replace update can be larger than the baseline's
    "eq-96": H,
    "thm-K.1": H,
    "stapo-grad-norm": H,
    "stapo-bounds": H,
    "stapo-cancel": F,  # the A > 0-only mask breaks shared-token cancellation
    "soft-gate-cancel": C,  # SAPO's tau differs by the sign of A: cancels only at r* = 1 or with equal taus
    "advantage-zero-sum": C,  # RLOO keeps sum_i A_i = 0; REINFORCE++'s batch baseline does not
    "rollout-correction-cancel": C,  # token-level corrections and rejections keep it, completion-level ones break it
    "peer-estimators-zero-sum": C,  # OPO and REINFORCE++-baseline only at equal lengths; grpo_passk never; remax at b = mean R; gdpo always
    "proximal-penalty-cancel": C,  # Kimi k1.5's / DRO's tau/2 (log r)^2 is not advantage-weighted: cancels only at r* = 1
    "positive-nll-cancel": F,  # VAPO's NLL raises every positive copy of a shared token by mu / N_+, no negative copy pushes back
    "peer-trust-terms-cancel": C,  # prime-rl's penalty only at r* = 1; M2PO only while its batch cap tau >= log r*
}

PAPER_IDS = (
    "prop-3.1 cor-3.2 cor-3.3 cor-3.4 eq-9 eq-10 eq-13 eq-30 eq-38 eq-41 eq-49 sec-4.4.1 eq-51 eq-55 thm-C.1 "
    "eq-74 cor-F.1 cor-G.1 cor-H.1 sec-H.3 eq-92 eq-93 eq-96 thm-K.1 stapo-grad-norm stapo-bounds"
).split()


@pytest.fixture(scope="module")
def ledger() -> dict[str, Claim]:
    return {c.id: c for c in run_ledger()}


def test_every_claim_of_the_paper_is_in_the_registry():
    assert set(PAPER_IDS) <= set(REGISTRY)


def test_every_registered_claim_has_a_pinned_verdict():
    assert set(EXPECTED) == set(REGISTRY)


@pytest.mark.parametrize("claim_id", list(EXPECTED))
def test_verdict_is_pinned(ledger, claim_id):
    claim = ledger[claim_id]
    assert claim.verdict == EXPECTED[claim_id], f"{claim_id} flipped to {claim.verdict}: {claim.evidence}"


@pytest.mark.parametrize("claim_id", list(EXPECTED))
def test_every_record_is_complete(ledger, claim_id):
    claim = ledger[claim_id]
    for field in ("source", "statement", "conditions", "evidence"):
        assert getattr(claim, field).strip(), f"{claim_id}: empty {field}"
    assert all(part in METHODS for part in claim.method.split("+"))
    assert "nan" not in claim.evidence.lower().replace("nanogpt", ""), f"{claim_id}: NaN in evidence"
    if claim.verdict != HOLDS:
        assert claim.notes.strip(), f"{claim_id}: a conditional or failed claim must say why in notes"


@pytest.mark.parametrize("claim_id", [k for k, v in EXPECTED.items() if v == HOLDS_UNDER_CONDITIONS])
def test_a_condition_earns_holds_under_conditions_only_where_the_papers_setting_meets_it(ledger, claim_id):
    """A holds-under-conditions record names where the paper's own setting (softmax policies) meets its condition."""
    claim = ledger[claim_id]
    assert claim.met_by.strip(), (
        f"{claim_id} holds under conditions but names no instance of the paper's setting that meets them: set Claim.met_by, "
        "or make the verdict 'fails' if no softmax policy can meet the condition"
    )


def test_met_by_is_only_for_conditional_claims(ledger):
    assert not [c.id for c in ledger.values() if c.met_by and c.verdict != HOLDS_UNDER_CONDITIONS]


def test_cor_3_2_gives_the_exact_softmax_drift_and_the_three_answer_example(ledger):
    from fractions import Fraction

    import sympy as sp

    from dfpo.theory.drift import softmax_logodds_drift

    claim = ledger["cor-3.2"]
    assert "kappa_a - kappa_b - (p_a - p_b) sum_j kappa_j" in claim.evidence
    assert "p=(0.6,0.3,0.1), kappa=(1/2,1/2,0): drift/eta = -3/10 where eq 5 says 0" in claim.evidence
    assert softmax_logodds_drift((Fraction(3, 5), Fraction(3, 10), Fraction(1, 10)), (Fraction(1, 2), Fraction(1, 2), 0)) == Fraction(
        -3, 10
    )
    # the formula against the derivative of log(softmax_a / softmax_b) along dz = eta sum_y kappa_y (e_y - p), V = 3
    z, k, eta = sp.symbols("z1:4"), sp.symbols("k1:4"), sp.Symbol("eta")
    p = [sp.exp(zi) / sum(sp.exp(zj) for zj in z) for zi in z]
    dz = [sum(k[y] * ((1 if j == y else 0) - p[j]) for y in range(3)) for j in range(3)]
    moved = [zj + eta * d for zj, d in zip(z, dz)]
    logodds = moved[0] - moved[1]  # log(pi_a / pi_b) = z_a - z_b on a softmax
    first_order = sp.diff(logodds, eta)
    assert sp.simplify(first_order - softmax_logodds_drift(p, k)) == 0


def test_json_round_trips(ledger):
    claims = list(ledger.values())
    doc = json.loads(render_json(claims))
    assert doc["summary"] == {v: sum(c.verdict == v for c in claims) for v in VERDICTS}
    assert [c["id"] for c in doc["claims"]] == list(REGISTRY)
    assert [Claim(**record) for record in doc["claims"]] == claims  # every field, losslessly


def test_markdown_and_table_name_every_claim(ledger):
    claims = list(ledger.values())
    md, table = render_markdown(claims), render_table(claims, verbose=True)
    for claim_id in REGISTRY:
        assert f"`{claim_id}`" in md and claim_id in table
    assert "dfpo theory --markdown docs/ledger.md" in md
    assert md.count("\n| `") == len(REGISTRY)
    counts = summary_counts(claims)
    assert (
        count_line(claims)
        == f"{len(REGISTRY)} claims: {counts['holds']} holds, {counts['holds-under-conditions']} holds-under-conditions, {counts['fails']} fails."
    )


def test_only_runs_a_subset_in_paper_order():
    claims = run_ledger(["eq-55", "eq-30"])
    assert [c.id for c in claims] == ["eq-30", "eq-55"]


def test_unknown_id_is_refused_with_its_name():
    with pytest.raises(ValueError, match="eq-999"):
        validate_ids(["eq-30", "eq-999"])


def test_claim_refuses_an_unknown_verdict_or_method():
    with pytest.raises(ValueError, match="verdict"):
        Claim("x", "s", "st", "c", "numeric", "true", "e")
    with pytest.raises(ValueError, match="method"):
        Claim("x", "s", "st", "c", "vibes", HOLDS, "e")
