"""Clipping claims: the sign-aware rewrite (eq 47-49), GRPO clipping breaking cancellation
(Cor. F.1, eqs 75-76), GRPO-fix's gradient (eq 81) and "symmetric clipping is more
conservative" (App. H.3).

Exact parts use ``fractions.Fraction`` over grids of rationals (the clip maps are piecewise
linear, so a grid that covers every branch and every boundary is exhaustive up to the
branch structure); loss-core parts take gradients of ``dfpo.policy_loss`` with respect to
``logp`` directly: d loss / d logp_it is the coefficient of grad log pi(y_it).
"""

from __future__ import annotations

import itertools
from fractions import Fraction as F

import sympy as sp
import torch

from ..core.loss import policy_loss, sequence_log_ratio
from .claim import FAILS, HOLDS, Claim
from .tabular import ZERO_TOL, equals, fmt, shared_gradient, tabular_group

A3 = (-2.0 / 3, 1.0 / 3, 1.0 / 3)


def _clip(x, lo, hi):
    return min(max(x, lo), hi)


def _ppo(r, A, el, eh):
    """Eq (48)/(77): min(r A, clip(r) A) -- the paper's form, the reference for eq 49."""
    return min(r * A, _clip(r, 1 - el, 1 + eh) * A)


def _sbar(r, A, el, eh):
    """Eq (47): sign-aware post-clip weight."""
    c = _clip(r, 1 - el, 1 + eh)
    return min(r, c) if A >= 0 else max(r, c)


def token_coefficients(objective: str, ratios, advantages, **overrides) -> list[float]:
    """d loss / d logp for one-token completions with the given ratios: the per-token gradient coefficient."""
    r = torch.tensor([[float(x)] for x in ratios], dtype=torch.float64)  # (B, 1)
    logp = torch.full_like(r, -1.0, requires_grad=True)  # (B, 1)
    old = (logp - torch.log(r)).detach()
    B = r.shape[0]
    loss, _ = policy_loss(
        objective,
        logp=logp,
        old_logp=old,
        advantages=torch.tensor([float(a) for a in advantages], dtype=torch.float64),
        mask=torch.ones(B, 1, dtype=torch.bool),
        group_ids=torch.arange(B),
        **overrides,
    )
    (g,) = torch.autograd.grad(loss, logp)
    return [float(x) for x in g[:, 0]]


def check_eq_49() -> Claim:
    eps_pairs = [(F(1, 5), F(1, 5)), (F(1, 5), F(7, 25)), (F(3, 10000), F(4, 10000)), (F(1), F(1, 5))]
    ratios = [F(k, 20) for k in range(0, 61)] + [F(1) - e for e, _ in eps_pairs] + [F(1) + e for _, e in eps_pairs]
    advs = [F(-2), F(-1), F(-1, 3), F(0), F(1, 3), F(1), F(2)]
    worst = F(0)
    n = 0
    for (el, eh), r, A in itertools.product(eps_pairs, ratios, advs):
        worst = max(worst, abs(_ppo(r, A, el, eh) - A * _sbar(r, A, el, eh)))
        n += 1
    # The naive rewrite A*min(s, clip(s)) that the paper warns against (App. B.2) is wrong for A < 0:
    naive = _ppo(F(3, 2), F(-1), F(1, 5), F(1, 5)) - F(-1) * min(F(3, 2), F(6, 5))
    # Loss core: gspo's loss and gradient equal those of eq 48 written with torch.minimum.
    gen = torch.Generator().manual_seed(0)
    max_val, max_grad = 0.0, 0.0
    for _trial in range(20):
        B, T = 6, 5
        logp = (-torch.rand(B, T, generator=gen, dtype=torch.float64) * 3).requires_grad_()
        old = (logp + 0.4 * torch.randn(B, T, generator=gen, dtype=torch.float64)).detach()
        mask = torch.rand(B, T, generator=gen) < 0.8
        mask[:, 0] = True
        adv = torch.randn(B, generator=gen, dtype=torch.float64)
        gids = torch.tensor([0, 0, 0, 1, 1, 1])
        for el, eh in ((0.2, 0.2), (3e-4, 4e-4)):
            loss, _ = policy_loss("gspo", logp=logp, old_logp=old, advantages=adv, mask=mask, group_ids=gids, eps_low=el, eps_high=eh)
            s = torch.exp(sequence_log_ratio(logp, old, mask))  # (B,)
            ref = -torch.minimum(s * adv, s.clamp(1 - el, 1 + eh) * adv).mean()  # eq 48, mean over completions
            (g1,) = torch.autograd.grad(loss, logp)
            (g2,) = torch.autograd.grad(ref, logp)
            max_val = max(max_val, float((loss - ref).detach().abs()))
            max_grad = max(max_grad, float((g1 - g2).abs().max()))
    ok = worst == 0 and naive != 0 and max_val < 1e-12 and max_grad < 1e-12
    return Claim(
        id="eq-49",
        source="App. B.3, eqs 46-49 (sign-aware post-clip weight)",
        statement="min(s_i A_i, clip(s_i) A_i) = A_i * sbar_i with sbar = min(s, c) for A >= 0 and max(s, c) for A < 0, so GSPO = (1/G) sum A_i sbar_i exactly.",
        conditions="Every branch: s from 0 to 3 (step 1/20) plus the four clip boundaries, A in {-2,-1,-1/3,0,1/3,1,2}, four (eps_low, eps_high) pairs incl. GSPO's and GRPO-fix's; loss core with random groups, masks, clipping active on both sides.",
        method="exhaustive+numeric",
        verdict=HOLDS if ok else FAILS,
        evidence=(
            f"exact: max |min(sA,cA) - A*sbar| over {n} rational cases = {worst}; naive A*min(s,c) at s=3/2, A=-1 is off by {naive}; "
            f"loss core gspo vs eq 48 on 40 random batches: max |loss diff| {equals(max_val)}, max |grad diff| {equals(max_grad)}"
        ),
        notes="The rewrite is exact in value and in gradient (off the measure-zero branch boundaries).",
    )


def check_cor_f_1() -> Claim:
    rows = []
    ok = True
    for adv in ((-1.0, 1.0), A3, (-0.75, -0.25, 0.25, 0.75)):
        G = len(adv)
        for w in (0.5, 0.79, 0.81, 1.0, 1.19, 1.21, 1.5, 3.0):
            import math

            c = shared_gradient("grpo", tabular_group([[math.log(w), 0.1, -0.1]] * G), adv, aggregation="token_mean").coef
            inside = 0.8 <= w <= 1.2
            ok &= (abs(c) < ZERO_TOL) if inside else (abs(c) > 1e-6)
            if G == 3:
                rows.append(f"w={w}: c {equals(c)}")
    return Claim(
        id="cor-F.1",
        source="App. F, Cor. F.1 (GRPO clipping breaks cancellation outside the clip range)",
        statement="A shared token with ratio w keeps its cancellation iff w lies in [1-eps, 1+eps]; outside, members of opposite advantage sign take different branches and the group leaves a non-zero drift.",
        conditions="G=2,3,4, both advantage signs, eps=0.2, w on both sides of and just inside/outside the range, length-independent aggregation (token_mean) so that only clipping matters.",
        method="numeric",
        verdict=HOLDS if ok else FAILS,
        evidence="loss core grpo, G=3, A=(-2/3,1/3,1/3): "
        + ", ".join(rows)
        + "; G=2 and G=4 agree (zero exactly inside, non-zero outside)",
        notes="The conclusion holds; the coefficients printed in eqs 75-76 are checked separately (eq-75-76). Unequal lengths under GRPO's 1/|y_i| break it even inside the range (see eq-9).",
    )


def check_eq_75_76() -> Claim:
    A, w, eps = sp.symbols("A w epsilon", positive=True)
    # Surrogate values: A1 = -A takes max(w, wbar) = w; A2 = +A takes min(w, wbar) = wbar = 1+eps.
    value_high = sp.simplify((-A) * w + A * (1 + eps) - A * ((1 + eps) - w))
    value_low = sp.simplify((-A) * (1 - eps) + A * w - A * (w - (1 - eps)))
    # Gradient coefficients (d/d log w): the clipped branch is constant in theta.
    grad_high = (-A) * w + A * 0  # w > 1+eps: A2 clipped
    (-A) * 0 + A * w  # w < 1-eps: A1 clipped
    # Just above the boundary the paper's coefficient vanishes, the real one does not.
    at = {A: 1, eps: sp.Rational(1, 5), w: sp.Rational(6, 5) + sp.Rational(1, 10**6)}
    paper = (A * ((1 + eps) - w)).subs(at)
    real = grad_high.subs(at)
    # Loss core: G=2, A=(-1, 1), one-token completions sharing w = 1.2000012.
    coefs = token_coefficients("grpo", [1.2000012, 1.2000012], [-1.0, 1.0], aggregation="token_mean")
    core_sum = sum(coefs)
    ok_values = value_high == 0 and value_low == 0
    fails = ok_values and paper != 0 and abs(float(real)) > 100 * abs(float(paper)) and abs(core_sum) > 0.5
    return Claim(
        id="eq-75-76",
        source="App. F, eqs 75-76 (the aggregate coefficient of a clipped shared token)",
        statement="Outside the clip range the group's aggregate coefficient on the shared token is A((1+eps)-w) (w > 1+eps) and A(w-(1-eps)) (w < 1-eps).",
        conditions="G=2, A1=-A2=-A as in the paper; read as the coefficient of grad log pi (the paper: 'in this direction').",
        method="symbolic+numeric",
        verdict=FAILS if fails else HOLDS,
        evidence=(
            f"as surrogate VALUES eqs 75-76 are right (sympy residuals {value_high}, {value_low}); as GRADIENT coefficients they are not: "
            f"the clipped branch is constant in theta, so the coefficient is -A*w (w>1+eps) and +A*w (w<1-eps). Exact counterexample "
            f"A=1, eps=1/5, w=6/5+10^-6: eq 75 gives {paper}, the gradient coefficient is {real}; loss core grpo (G=2, token_mean) "
            f"sum of per-token coefficients {equals(core_sum)}"
        ),
        notes="The drift is discontinuous at the clip boundary: it jumps to about A(1+eps) as soon as w leaves the range, instead of growing from 0. Cor. F.1's conclusion is unaffected (and stronger).",
    )


def check_eq_81() -> Claim:
    r, A, eps = sp.symbols("r A epsilon", positive=True)
    # d/d log r of A*clip(r, 0, 1+eps) on each branch vs eq 81's A*phi(r).
    inside = sp.simplify(sp.diff(A * r, r) * r - A * r)  # r < 1+eps: d/dlog r (A r) = A r = A phi(r)
    above_true = sp.diff(A * (1 + eps), r) * r  # r > 1+eps: 0
    above_eq81 = A * (1 + eps)
    coefs = token_coefficients("grpo_fix", [1.5, 0.5], [1.0, -1.0], aggregation="token_mean")
    ok = inside == 0 and above_true == 0 and coefs[0] == 0.0 and coefs[1] != 0.0
    return Claim(
        id="eq-81",
        source="App. H, eq 81 (gradient of the symmetric-clip objective)",
        statement="The gradient of eq 80 is (1/G) sum_i sum_t A_i phi(r_it) grad log pi(y_it).",
        conditions="Single tokens on each branch of phi(r) = clip(r, 0, 1+eps).",
        method="symbolic+numeric",
        verdict=FAILS if ok else HOLDS,
        evidence=(
            f"inside the range the true coefficient equals A*phi(r) (residual {inside}); above it the true coefficient is {above_true} "
            f"while eq 81 gives {above_eq81}; loss core grpo_fix: d loss/d logp at (r=1.5, A=1) = {coefs[0]}, at (r=0.5, A=-1) {equals(coefs[1])}"
        ),
        notes=(
            "Eq 81 is the gradient of the score-form surrogate sg(phi(r)) A log pi (a CISPO-like weight), not of eq 80: "
            "clipped tokens get zero gradient in eq 80 but weight A(1+eps) in eq 81. Cancellation (eq 82) holds under "
            "either reading because both coefficients are the same for every member."
        ),
    )


def check_sec_h_3() -> Claim:
    eps = F(1, 5)
    ratios = [F(k, 20) for k in range(0, 81)]
    advs = [F(-2), F(-1), F(-1, 2), F(0), F(1, 2), F(1), F(2)]
    # Surrogate ordering: symmetric >= PPO everywhere (the symmetric one is the less pessimistic bound).
    gap = min(A * _clip(r, F(0), 1 + eps) - _ppo(r, A, eps, eps) for r in ratios for A in advs)
    strict = max(A * _clip(r, F(0), 1 + eps) - _ppo(r, A, eps, eps) for r in ratios for A in advs)
    # Where the gradient is zero: PPO vs symmetric (loss core, one-token completions).
    cases = [(0.5, -1.0), (1.5, -1.0), (1.5, 1.0), (0.5, 1.0)]
    grpo = token_coefficients("grpo", [r for r, _ in cases], [a for _, a in cases], aggregation="token_mean")
    fix = token_coefficients("grpo_fix", [r for r, _ in cases], [a for _, a in cases], aggregation="token_mean")
    less = grpo[0] == 0.0 and fix[0] != 0.0  # A<0, r<1-eps: PPO stops, symmetric keeps pushing r down
    more = grpo[1] != 0.0 and fix[1] == 0.0  # A<0, r>1+eps: PPO pulls back, symmetric stops
    ok_fail = gap >= 0 and strict > 0 and less and more
    return Claim(
        id="sec-H.3",
        source="App. H.3 ('symmetric clipping adopts a more conservative update')",
        statement="GRPO-fix's symmetric clipping (eq 79) is more conservative than PPO/GRPO clipping.",
        conditions="eps=1/5; r from 0 to 4 (step 1/20); both advantage signs; loss core grpo vs grpo_fix on one-token completions.",
        method="exhaustive+numeric",
        verdict=FAILS if ok_fail else HOLDS,
        evidence=(
            f"exact: A*clip(r,0,1+eps) - min(rA, clip(r)A) ranges over [{gap}, {strict}] on the grid (never below 0: the symmetric surrogate "
            f"is the LESS pessimistic one); loss core d loss/d logp: A=-1, r=0.5: grpo {fmt(grpo[0])} vs grpo_fix {fmt(fix[0])}; "
            f"A=-1, r=1.5: grpo {fmt(grpo[1])} vs grpo_fix {fmt(fix[1])}; A=+1: identical ({fmt(grpo[2])}={fmt(fix[2])}, {fmt(grpo[3])}={fmt(fix[3])})"
        ),
        notes=(
            "For A >= 0 the two are identical. For A < 0 neither contains the other: with r < 1-eps PPO stops the update and "
            "symmetric clipping keeps pushing r toward 0 (less conservative, no lower trust-region bound); with r > 1+eps PPO keeps "
            "pulling r back and symmetric clipping stops (more conservative there). 'More conservative' holds only on that branch."
        ),
    )


CHECKS = (check_eq_49, check_cor_f_1, check_eq_75_76, check_eq_81, check_sec_h_3)
