"""Metrics of the toy lab: exact policy quantities, mechanism metrics and run summaries.

Pure functions, batched over seeds (leading dimension S). Equation numbers are the paper's.

Where this departs from the paper:
1. Asym (eq 23) is the loss core's ``group_variance`` of the *effective* sequence coefficient
   kappa_i = w_i A_i read off the gradient of the loss (zero for a sequence whose gradient is
   clipped away), because cancellation (eq 2) is a statement about gradient coefficients. The
   loss core's ``weights/asym`` uses the post-clip value instead; the two agree when nothing is clipped.
2. Energy (eq 24), Jitter2 (eq 20), Steps (eq 19) and the shared residual (eq 2) are
   ``dfpo.core.metrics``'s, the definitions the LLM trainer uses too.
3. Learning tax (Prop. 3.1) is measured as KL(pi_new || pi_old) at the task's template rows,
   the contexts whose every token leads to the same next state, so their true policy
   gradient is zero and any drift there is reward-irrelevant.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.loss import aggregation_count
from .policy import sequence_logprob
from .tasks import WRONG, Enumeration


def kl_rows(logp_new: Tensor, logp_old: Tensor, rows: Tensor) -> Tensor:
    """Mean over ``rows`` (R,) bool of KL(pi_new(.|r) || pi_old(.|r)): (S, R, V) x2 -> (S,). 0 if no row."""
    if not bool(rows.any()):
        return torch.zeros(logp_new.shape[0])
    p = logp_new.exp()  # (S, R, V)
    kl = torch.where(p > 0, p * (logp_new - logp_old), torch.zeros_like(p)).sum(-1).clamp(min=0)  # (S, R); >= 0 up to float rounding
    return kl[:, rows].mean(-1)


def exact_policy_metrics(logpi: Tensor, enum: Enumeration, n_prompts: int, n_forms: int) -> dict[str, Tensor]:
    """Expected reward, sequence entropy and equivalent-set metrics (Cor. 3.2) by enumeration.

    logpi (S, R, V). Returns per-seed (S,) tensors averaged over prompts:
    ``reward`` E[R]; ``entropy/sequence`` H(pi(y|x)); ``equiv/entropy`` entropy of the
    normalised distribution over correct answer forms; ``equiv/logodds`` log P(form 0) - log P(form 1).
    """

    S = logpi.shape[0]
    ex = lambda x: x[None].expand(S, *x.shape)  # noqa: E731
    lp = sequence_logprob(logpi, ex(enum.rows), ex(enum.tokens), ex(enum.mask))  # (S, C)
    p = lp.exp()  # (S, C)
    by_prompt = torch.zeros(S, n_prompts)
    reward = by_prompt.index_add(1, enum.prompt, p * enum.reward)  # (S, P)
    ent = torch.zeros(S, n_prompts).index_add(1, enum.prompt, -torch.where(p > 0, p * lp, torch.zeros_like(p)))  # (S, P)
    out = {"reward": reward.mean(-1), "entropy/sequence": ent.mean(-1)}
    if n_forms >= 2:
        correct = enum.form != WRONG
        key = enum.prompt[correct] * n_forms + enum.form[correct]
        mass = torch.zeros(S, n_prompts * n_forms).index_add(1, key, p[:, correct]).reshape(S, n_prompts, n_forms)
        mass = mass.clamp(min=1e-30)
        q = mass / mass.sum(-1, keepdim=True)  # (S, P, F)
        out["equiv/entropy"] = (-(q * q.log()).sum(-1)).mean(-1)
        out["equiv/logodds"] = (mass[..., 0].log() - mass[..., 1].log()).mean(-1)
    return out


def sequence_coefficients(coef: Tensor, mask: Tensor, aggregation: str, max_len: int) -> Tensor:
    """Effective sequence coefficient kappa_i = w_i A_i from the loss gradient d loss / d logp.

    coef (S, B, T) holds each seed's own d loss_s / d logp_it. kappa_i = -norm_i * sum_t coef_it,
    with norm_i the aggregation's divisor (``aggregation_count``, times T_max for ``constant``)
    over L_i when the mode sums tokens, so that GRPO at ratio 1 gives kappa_i = A_i. (S, B).
    """
    maskf = mask.to(coef.dtype)
    total = (coef * maskf).sum(-1)  # (S, B)
    count = aggregation_count(mask, aggregation).to(coef.dtype)[:, None]  # (S, 1)
    if aggregation == "constant":
        count = count * max_len
    per_length = aggregation != "seq_mean_token_mean"  # every other mode adds the tokens of a row up
    norm = count / maskf.sum(-1).clamp(min=1) if per_length else count.expand_as(total)  # (S, B)
    return -norm * total
