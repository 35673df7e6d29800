"""The paper's toy problem (App. A): "What is 10+10?" with three completions.

    tau_1 = The answer is 25 .   (R = 0)
    tau_2 = The answer is 20 .   (R = 1)
    tau_3 = 10 + 10 = 20 .       (R = 1)

Here the completions live on a softmax table whose contexts are their prefixes
(``theory.tabular.trie_group``): tau_1 and tau_2 share the contexts of "The answer is", as
real text would. Checks: the advantages (eq 30), the shared-prefix coefficient (eq 38) and
the drift between the two correct answers (eqs 40-41).
"""

from __future__ import annotations

import math
from fractions import Fraction as F

import sympy as sp
import torch

from ..core.loss import group_advantages, policy_loss
from .claim import FAILS, HOLDS, Claim
from .tabular import equals, fmt, row_coefficient, trie_group

TAU = (
    ("The", "answer", "is", "25", "."),
    ("The", "answer", "is", "20", "."),
    ("10", "+", "10", "=", "20", "."),
)


def check_eq_30() -> Claim:
    R = [F(0), F(1), F(1)]
    exact = [r - sum(R) / 3 for r in R]
    core = group_advantages(torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64), torch.zeros(3, dtype=torch.long), scale="none").tolist()
    std = group_advantages(torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64), torch.zeros(3, dtype=torch.long), scale="group").tolist()
    ok = exact == [F(-2, 3), F(1, 3), F(1, 3)] and max(abs(a - float(b)) for a, b in zip(core, exact)) < 1e-15
    return Claim(
        id="eq-30",
        source="App. A.1, eqs 28-30",
        statement="With R = (0, 1, 1) and A_i = R_i - mean R (eq 29): A = (-2/3, 1/3, 1/3).",
        conditions="Mean-centred advantages as eq 29 defines them (no std scaling).",
        method="symbolic+numeric",
        verdict=HOLDS if ok else FAILS,
        evidence=f"exact: {[str(a) for a in exact]}; loss core group_advantages(scale='none'): {[round(a, 15) for a in core]}",
        notes=f"Eq 43 (std-normalised, torch's unbiased std, eps=1e-4) gives {[round(a, 4) for a in std]} instead; signs and sum 0 are the same.",
    )


def check_eq_38() -> Claim:
    A, r1, r2, l1, l2 = sp.symbols("A rho1 rho2 lambda1 lambda2", positive=True)
    s1, s2 = r1 * r2 * l1, r2 * r1 * l2  # eq 37, product ratio
    residual = sp.simplify((-A) * s1 + A * s2 - A * r1 * r2 * (l2 - l1))
    # eq 44 geometric mean, T = 3: coefficient sum_i A_i s_i / 3.
    geo = sp.simplify((-A) * (r1 * r2 * l1) ** sp.Rational(1, 3) / 3 + A * (r1 * r2 * l2) ** sp.Rational(1, 3) / 3)
    # Softmax table: tau_1, tau_2 first three words; ratios rho1, rho2 on the shared steps, lambda_i on the last.
    seqs = (("answer", "is", "25"), ("answer", "is", "20"))
    vals = {"rho1": 1.1, "rho2": 0.9, "lambda1": 1.3, "lambda2": 0.7}
    lr = [
        [math.log(vals["rho1"]), math.log(vals["rho2"]), math.log(vals["lambda1"])],
        [math.log(vals["rho1"]), math.log(vals["rho2"]), math.log(vals["lambda2"])],
    ]
    group, states, vocab = trie_group(seqs, token_log_ratios=lr)
    logp = group.logp()
    prod = torch.exp(torch.where(group.mask, group.log_ratio + logp - logp.detach(), torch.zeros_like(logp)).sum(-1))  # (B,) eq 37
    J = (-1.0 * prod[0] + 1.0 * prod[1]) / 2  # eq 11 with A = 1, G = 2
    (grad,) = torch.autograd.grad(J, group.table)
    c1 = row_coefficient(grad, group.table, states[()], vocab.index("answer"))
    c2 = row_coefficient(grad, group.table, states[("answer",)], vocab.index("is"))
    paper = vals["rho1"] * vals["rho2"] * (vals["lambda2"] - vals["lambda1"]) / 2
    group2, _, _ = trie_group(seqs, token_log_ratios=lr)
    loss, _ = policy_loss(
        "gspo",
        logp=group2.logp(),
        old_logp=group2.old_logp(),
        advantages=torch.tensor([-1.0, 1.0], dtype=torch.float64),
        mask=group2.mask,
        group_ids=torch.zeros(2, dtype=torch.long),
        clip="none",
    )
    (g2,) = torch.autograd.grad(loss, group2.table)
    c_geo = -row_coefficient(g2, group2.table, states[()], vocab.index("answer"))
    geo_val = float(geo.subs({A: 1, r1: vals["rho1"], r2: vals["rho2"], l1: vals["lambda1"], l2: vals["lambda2"]})) / 2
    ok = residual == 0 and abs(c1 - paper) < 1e-12 and abs(c2 - paper) < 1e-12 and abs(c_geo - geo_val) < 1e-12
    return Claim(
        id="eq-38",
        source="App. A.2, eqs 32-38 (minimal case G=2, T=3)",
        statement="For the shared prefix 'answer is', the coefficient is A1 s1 + A2 s2 = A rho1 rho2 (lambda2 - lambda1), non-zero when lambda1 != lambda2.",
        conditions="Product ratio eq 37 as stated; also GSPO's geometric mean (eq 44) through the loss core; softmax table with prefix contexts.",
        method="symbolic+numeric",
        verdict=HOLDS if ok else FAILS,
        evidence=(
            f"sympy residual {residual}; softmax table (rho=(1.1,0.9), lambda=(1.3,0.7)): coefficient on 'answer' {fmt(c1)}, on 'is' {fmt(c2)}, "
            f"eq 38 / G {equals(paper)}; eq 44 version: sympy {geo} (/G {equals(geo_val)}), loss core gspo {fmt(c_geo)}"
        ),
        notes="Under eq 44 the coefficient is (A/3)(rho1 rho2)^(1/3)(lambda2^(1/3) - lambda1^(1/3)): still non-zero iff lambda1 != lambda2 (equal lengths here).",
    )


def _drift(objective: str, seqs, adv, **overrides) -> float:
    """First-order change of log pi(tau_2) - log pi(tau_3) per unit step along -grad loss."""
    group, _, _ = trie_group(seqs)
    logp = group.logp()
    loss, _ = policy_loss(
        objective,
        logp=logp,
        old_logp=group.old_logp(),
        advantages=torch.tensor(adv, dtype=torch.float64),
        mask=group.mask,
        group_ids=torch.zeros(len(seqs), dtype=torch.long),
        **overrides,
    )
    (g,) = torch.autograd.grad(loss, group.table)
    seq_logp = torch.where(group.mask, group.logp(), torch.zeros_like(logp)).sum(-1)  # (B,)
    (d,) = torch.autograd.grad(seq_logp[1] - seq_logp[2], group.table)
    return float((d * -g).sum())


def _eq_40_drift(s2, s3, a2, a3):
    """Eq 40's model: each trajectory's log-prob moves only with its own coefficient, c A_i s_i (c = 1)."""
    return a2 * s2 - a3 * s3


def check_eq_41() -> Claim:
    adv = [-2 / 3, 1 / 3, 1 / 3]
    # Eq 40's independence model, exactly: no drift at equal weights, drift at unequal ones.
    s2, s3 = sp.symbols("s_2 s_3", positive=True)
    third = sp.Rational(1, 3)
    model_equal = sp.simplify(_eq_40_drift(s2, s2, third, third))
    model_unequal = sp.simplify(_eq_40_drift(s2, s3, third, third))
    model_ok = model_equal == 0 and model_unequal != 0
    # A real softmax on the same three trajectories, on-policy (every s_i = 1, equal weights for tau_2, tau_3).
    drifts = {obj: _drift(obj, TAU, adv) for obj in ("grpo", "dr_grpo", "gspo", "dfpo_min", "grpo_fix")}
    alt = (("Answer", ":", "25", "."),) + TAU[1:]  # tau_1 rephrased: no template shared with tau_2
    drift_alt = _drift("dr_grpo", alt, adv)
    softmax_drifts = any(abs(v) > 1e-6 for v in drifts.values())
    if not model_ok:
        verdict = FAILS
    else:  # eq 40's consequence; its independence model is never met by completions of one prompt on a softmax
        verdict = FAILS if softmax_drifts else HOLDS
    return Claim(
        id="eq-41",
        source="App. A.3, eqs 39-41",
        statement="Delta log(pi(tau_2)/pi(tau_3)) ~ eta c (A_2 s_2 - A_3 s_3): two equally correct answers drift apart only when their weights s_2, s_3 differ.",
        conditions=(
            "Eq 40's independence model: each trajectory's log-prob moves only with its own coefficient, with one common c "
            "(no context or normaliser shared between trajectories). On a softmax whose contexts are the completions' "
            "prefixes the claim fails: the drift is non-zero on-policy, with s_2 = s_3 = 1 and A_2 = A_3."
        ),
        method="symbolic+numeric",
        verdict=verdict,
        evidence=(
            f"sympy, eq 40 model with A_2 = A_3 = 1/3: drift/eta at s_2 = s_3: {model_equal}; at s_2 != s_3: {model_unequal}. "
            "Softmax table, on-policy, first-order drift of log pi(tau_2) - log pi(tau_3) per unit step: "
            + ", ".join(f"{k}: {fmt(v)}" for k, v in drifts.items())
            + f"; with tau_1 rephrased so it shares no template with tau_2 (dr_grpo): {fmt(drift_alt)}"
        ),
        notes=(
            "Eq 41 follows from eq 40's model. On a real softmax that model fails: tau_1 (wrong) shares 'The answer is' with tau_2, "
            "so tau_2's template is pushed down by tau_1's negative advantage -- a shared event that covers only part of the group "
            "never cancels, whatever the weights -- and outputs sharing a context also share its normaliser. Equal weights do not "
            "prevent the drift; unequal weights are not needed for it. Eq 40's independence is never met in the paper's own "
            "setting: the completions of one prompt always share the softmax at the prompt (their first token's normaliser), "
            "so the verdict is 'fails', not 'holds-under-conditions'."
        ),
    )


CHECKS = (check_eq_30, check_eq_38, check_eq_41)
