"""STAPO (arXiv 2602.15620): the softmax gradient-norm identity, its entropy bounds, and what its
spurious-token mask does to the paper's shared-token cancellation.

For logits z and sampled token y, d(w log softmax(z)_y)/dz = w (e_y - pi), so
    |.|^2 = w^2 (1 - 2 pi_y + sum_n pi_n^2)                                  (identity)
    w^2 (1 - 2 pi_y + e^-H) <= |.|^2 <= w^2 (2 - 2 pi_y - C_V H^2),  C_V = (V-1)/(V (ln V)^2)   (bounds)
The lower bound is sum pi^2 >= e^-H (Jensen: log E_pi[pi] >= E_pi[log pi]); the upper bound
is 1 - sum pi^2 >= C_V H^2, with equality at the uniform distribution.
"""

from __future__ import annotations

import math

import numpy as np
import sympy as sp
import torch

from ..core.loss import stapo_spurious_mask
from .claim import FAILS, HOLDS, Claim
from .tabular import ZERO_TOL, equals, fmt, shared_gradient, tabular_group


def check_stapo_grad_norm() -> Claim:
    z = sp.symbols("z1:4", real=True)
    w = sp.Symbol("w", real=True)
    Z = sum(sp.exp(x) for x in z)
    p = [sp.exp(x) / Z for x in z]
    logp0 = sp.log(p[0])
    grad = [sp.diff(w * logp0, x) for x in z]
    lhs = sum(g**2 for g in grad)
    rhs = w**2 * (1 - 2 * p[0] + sum(q**2 for q in p))
    residual = sp.simplify(lhs - rhs)
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for V in (2, 10, 1000):
        for _ in range(20):
            logits = (torch.randn(V, generator=gen, dtype=torch.float64) * 3).requires_grad_()
            y = int(torch.randint(V, (1,), generator=gen))
            wv = float(torch.randn(1, generator=gen))
            (g,) = torch.autograd.grad(wv * torch.log_softmax(logits, -1)[y], logits)
            pr = torch.softmax(logits.detach(), -1)
            pred = wv**2 * (1 - 2 * pr[y] + (pr**2).sum())
            worst = max(worst, float(((g**2).sum() - pred).abs() / pred.clamp(min=1e-300)))
    ok = residual == 0 and worst < 1e-10
    return Claim(
        id="stapo-grad-norm",
        source="STAPO (arXiv 2602.15620), token-wise gradient norm",
        statement="|d(w log pi(y))/dz|^2 = w^2 (1 - 2 pi(y) + sum_n pi_n^2) for a softmax output with logits z.",
        conditions="Symbolic V=3; autograd on random logits, V in {2, 10, 1000}, 60 draws.",
        method="symbolic+numeric",
        verdict=HOLDS if ok else FAILS,
        evidence=f"sympy residual {residual}; max relative error over 60 autograd draws {equals(worst)}",
        notes="Gradient with respect to the output logits only (the last layer), as STAPO states it.",
    )


def check_stapo_bounds() -> Claim:
    gen = torch.Generator().manual_seed(1)
    rng = np.random.default_rng(1)
    worst_low, worst_high, n = -1.0, -1.0, 0
    for V in (2, 3, 4, 10, 100, 1000):
        C = (V - 1) / (V * math.log(V) ** 2)
        # Random draws over many temperatures, plus adversarial ascent on the upper-bound gap.
        for _ in range(40):
            p = torch.softmax(torch.randn(V, generator=gen, dtype=torch.float64) * float(torch.rand(1, generator=gen) * 12), -1)
            H = -(p * p.clamp_min(1e-300).log()).sum()
            c = (p * p).sum()
            worst_low = max(worst_low, float(math.exp(-H) - c))
            worst_high = max(worst_high, float(c + C * H * H - 1))
            n += 1
        # Adversarial: gradient ascent on the gap from eight restarts at once (numpy, closed-form gradient:
        # d gap/d p_k = 2 p_k - 2 C H (log p_k + 1), chained through the softmax Jacobian diag(p) - p p^T).
        z = rng.normal(size=(8, V)) * np.arange(1, 9)[:, None]
        for _ in range(300):
            p = np.exp(z - z.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            logp = np.log(np.clip(p, 1e-300, None))
            H = -(p * logp).sum(-1, keepdims=True)
            u = 2 * p - 2 * C * H * (logp + 1)
            z += 0.5 * p * (u - (p * u).sum(-1, keepdims=True))
        gap = (p * p).sum(-1) + C * H[:, 0] ** 2 - 1
        worst_high = max(worst_high, float(gap.max()))
        n += 8
    # Equality at the uniform distribution: sum p^2 = 1/V, H = ln V.
    Vs = sp.Symbol("V", positive=True)
    eq_uniform = sp.simplify(1 / Vs + (Vs - 1) / (Vs * sp.log(Vs) ** 2) * sp.log(Vs) ** 2 - 1)
    ok = worst_low <= 1e-12 and worst_high <= 1e-12 and eq_uniform == 0
    return Claim(
        id="stapo-bounds",
        source="STAPO (arXiv 2602.15620), entropy bounds on the token gradient norm",
        statement="w^2 (1 - 2 pi + e^-H) <= |grad|^2 <= w^2 (2 - 2 pi - C_V H^2), C_V = (|V|-1)/(|V| (ln|V|)^2).",
        conditions="V in {2,3,4,10,100,1000}; random softmax draws over temperatures plus adversarial gradient ascent on the upper-bound gap.",
        method="numeric+symbolic",
        verdict=HOLDS if ok else FAILS,
        evidence=f"max (e^-H - sum p^2) {equals(worst_low)}; max (sum p^2 + C_V H^2 - 1) {equals(worst_high)} over {n} distributions (ascent included); equality at uniform: residual {eq_uniform}",
        notes="The lower bound is Jensen's inequality (Renyi-2 entropy <= Shannon entropy). The upper bound is checked numerically, not proven here: no distribution beat it, the worst case is the uniform one where it is tight.",
    )


def check_stapo_cancel() -> Claim:
    adv = (-2 / 3, 1 / 3, 1 / 3)
    V = 8

    def build():
        g = tabular_group([[0.0, 0.0, 0.0]] * 3, vocab=V, seed=2)
        with torch.no_grad():
            g.table.zero_()
            g.table[0, 0] = -9.0  # shared token a* improbable (pi ~ 2e-5 < tau_p)
            g.table[0, 1] = 2.0  # its context has low entropy
            for i in (1, 2):  # other improbable tokens in the positive sequences, at high-entropy contexts
                for t in (1, 2):
                    g.table[int(g.states[i, t]), int(g.tokens[i, t])] = -9.0
        return g

    g = build()
    masked = stapo_spurious_mask(g.logp().detach(), g.entropy(), torch.tensor(adv, dtype=torch.float64), g.mask, tau_p=0.002, q=0.75)
    stapo = shared_gradient("stapo", build(), adv, with_entropy=True).coef
    dapo = shared_gradient("dapo", build(), adv).coef
    p_shared = float(torch.softmax(g.table.detach()[0], -1)[0])
    ok_fail = bool(masked[1, 0]) and bool(masked[2, 0]) and not bool(masked[0, 0]) and abs(stapo) > 1e-6 and abs(dapo) < ZERO_TOL
    return Claim(
        id="stapo-cancel",
        source="STAPO mask (arXiv 2602.15620) against the paper's eq 2",
        statement="STAPO's spurious-token mask keeps the shared-token cancellation of the token-level objective it modifies (DAPO).",
        conditions="G=3, A=(-2/3,1/3,1/3), equal lengths, on-policy (no clipping), the shared token improbable (pi < tau_p=0.002) at a low-entropy context; STAPO defaults tau_p=0.002, q=0.75.",
        method="numeric",
        verdict=FAILS if ok_fail else HOLDS,
        evidence=(
            f"pi(a*|h*) {equals(p_shared)}; mask on the shared position (A<0, A>0, A>0) = {[bool(masked[i, 0]) for i in range(3)]}; "
            f"shared coefficient: dapo {fmt(dapo)}, stapo {fmt(stapo)}"
        ),
        notes=(
            "The mask applies only to A > 0, so a masked token that the group shares keeps its negative-advantage copies: the group "
            "pushes it down with nothing to cancel. STAPO reports < 0.01% of tokens masked, so the size of the effect is small, but "
            "the mask is by construction sign-asymmetric (the same kind of break as eq 10)."
        ),
    )


CHECKS = (check_stapo_grad_norm, check_stapo_bounds, check_stapo_cancel)
