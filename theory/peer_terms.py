"""Two claims about terms the peers add to a group-relative policy loss (issue 30): does each keep the cancellation of a
token shared by a correct and an incorrect completion (paper eq 2)?

- The proximal penalty tau/2 (log pi - log pi_old)^2 of Kimi k1.5 (ROLL ``kimi15``) and Tinker's DRO is not
  advantage-weighted: at a shared token every copy adds tau * d * w_i (d = log r*, w_i the copy's aggregation weight),
  so the residual is tau d sum_i w_i, zero exactly where the shared token's ratio is 1.
- VAPO's NLL on positive samples adds -mu / N_+ at each positive copy and nothing at a negative one, so the residual is
  -mu G_+ / N_+, never zero in a group with a positive completion.

Each is checked symbolically (sympy, a group of G copies) and on the loss core (``policy_loss`` at a shared prefix).
"""

from __future__ import annotations

import sympy as sp
import torch

from ..core.loss.cancellation import make_shared_prefix_group, shared_token_gradient
from ..core.loss.objectives import OBJECTIVES
from .claim import FAILS, HOLDS, HOLDS_UNDER_CONDITIONS, Claim
from .tabular import equals, fmt

REWARDS = (1.0, 0.0, 1.0, 0.0, 0.0)
LENGTHS = (5, 6, 7, 8, 9)


def _residual(objective: str, log_r: float, lengths: tuple[int, ...] = LENGTHS, **overrides: object) -> float:
    """The signed gradient left on the first shared token of one group (rewards REWARDS), through ``policy_loss``."""
    group = make_shared_prefix_group(torch.tensor(REWARDS), list(lengths), shared_log_ratio=log_r, seed=3)
    return float(shared_token_gradient(objective, group, **overrides)[0])


def _penalty_residual_symbolic() -> tuple[sp.Expr, sp.Expr]:
    """(d/dl of sum_i w_i tau/2 (l - o)^2 at a shared log-prob l, its value at l = o) for G = 4 copies."""
    ell, old, tau = sp.symbols("l o tau", real=True)
    w = sp.symbols("w1:5", positive=True)
    penalty = sum(w_i * tau / 2 * (ell - old) ** 2 for w_i in w)
    grad = sp.factor(sp.diff(penalty, ell))
    return grad, sp.simplify(grad.subs(ell, old))


def check_proximal_penalty_cancel() -> Claim:
    """Does a quadratic log-ratio penalty to pi_old (Kimi k1.5, DRO) keep shared-token cancellation?"""
    grad, at_one = _penalty_residual_symbolic()
    tau_kimi, beta_dro = OBJECTIVES["kimi15"].proximal_coef, OBJECTIVES["dro"].proximal_coef
    kimi = {d: _residual("kimi15", d, aggregation="token_mean") for d in (0.0, 0.5, -0.3)}
    dro = {d: _residual("dro", d) for d in (0.0, 0.5)}
    n_tokens, G = sum(LENGTHS), len(LENGTHS)
    kimi_expected = {d: tau_kimi * d * G / n_tokens for d in kimi}
    ok = at_one == 0 and grad != 0
    ok &= all(abs(kimi[d] - kimi_expected[d]) < 1e-12 for d in kimi) and abs(dro[0.0]) < 1e-12 and abs(dro[0.5] - beta_dro * 0.5) < 1e-12
    ok &= abs(kimi[0.5]) > 1e-6 and abs(dro[0.5]) > 1e-6
    return Claim(
        id="proximal-penalty-cancel",
        source="premise of eq 2 (shared-token cancellation), for the quadratic log-ratio penalty of Kimi k1.5 (arXiv 2501.12599 eq 3; ROLL 'kimi15') and DRO (Tinker 'dro')",
        statement="Adding tau/2 (log pi - log pi_old)^2 to each token's loss keeps the cancellation of a token shared by a whole group.",
        conditions=(
            "only where the shared token's ratio pi / pi_old is 1: the penalty's gradient at a shared token is tau log r* "
            "times the sum of its copies' aggregation weights, whatever their advantages"
        ),
        method="symbolic+numeric",
        met_by="the first optimiser step on each rollout batch (pi = pi_old at every token), so on-policy training with K = 1 inner step throughout",
        verdict=HOLDS_UNDER_CONDITIONS if ok else FAILS,
        evidence=(
            f"sympy, G = 4: d/dl sum_i w_i tau/2 (l - o)^2 = {grad}; at l = o: {at_one}. Loss core, rewards 1,0,1,0,0, "
            f"lengths {LENGTHS}: kimi15 (token_mean, tau {fmt(tau_kimi)}) residual at log r* = "
            + ", ".join(f"{fmt(d)}: {fmt(v)} (tau log r* G / N {equals(kimi_expected[d])})" for d, v in kimi.items())
            + f"; dro (token sums, beta {fmt(beta_dro)}) at log r* = 0: {fmt(dro[0.0])}, at 0.5: {fmt(dro[0.5])} (beta log r* {equals(beta_dro * 0.5)})"
        ),
        notes=(
            "The penalty is a trust region, not a signal: it pulls every copy of the shared token back towards pi_old by the "
            "same amount whatever the advantage, so with K > 1 inner steps the shared tokens move back once they have "
            "moved. Its policy term (plain A log pi) cancels wherever its aggregation allows (length-free, or equal lengths)."
        ),
    )


def check_positive_nll_cancel() -> Claim:
    """Does VAPO's NLL on positive samples keep shared-token cancellation?"""
    mu, n_plus, g_plus = sp.symbols("mu N_+ G_+", positive=True)
    ell = sp.Symbol("l", real=True)
    nll = -mu / n_plus * g_plus * ell  # the G_+ positive copies of one shared log-prob l among N_+ positive tokens
    grad = sp.diff(nll, ell)
    mu_vapo = OBJECTIVES["vapo_nll"].nll_coef
    positive = [L for L, r in zip(LENGTHS, REWARDS) if r > 0]
    expected = -mu_vapo * len(positive) / sum(positive)
    got = _residual("vapo_nll", 0.0)
    without = _residual("vapo_nll", 0.0, nll_coef=0.0)
    ok = sp.simplify(grad + mu * g_plus / n_plus) == 0 and abs(got - expected) < 1e-12 and abs(without) < 1e-12 and abs(got) > 1e-6
    return Claim(
        id="positive-nll-cancel",
        source="premise of eq 2 (shared-token cancellation), for VAPO's positive-example LM loss (arXiv 2504.05118 eq 9)",
        statement="Adding mu times the NLL of the positive samples keeps the cancellation of a token shared by a correct and an incorrect completion.",
        conditions="mu > 0 and a group with both outcomes (a positive completion holds the shared token); token-mean NLL over the batch's positive tokens",
        method="symbolic+numeric",
        verdict=FAILS if ok else HOLDS,
        evidence=(
            f"sympy: d/dl of -mu/N_+ * G_+ l = {grad}. Loss core, vapo_nll (mu {fmt(mu_vapo)}), rewards 1,0,1,0,0, lengths "
            f"{LENGTHS}, r* = 1: residual {fmt(got)} (-mu G_+ / N_+ {equals(expected)}); the same batch with nll_coef = 0 "
            f"(dapo): {fmt(without)}"
        ),
        notes=(
            "The NLL is an imitation term by design: it raises every token of the rewarded completions, shared ones "
            "included, with no negative copy to push back. In dfpo 'positive' is A > 0 (policy_loss has no reward input), "
            "so a group whose completions are all correct gets no NLL here; VAPO and cosmos-rl imitate it too."
        ),
    )


CHECKS = (check_proximal_penalty_cancel, check_positive_nll_cancel)
