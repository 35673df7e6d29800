"""The NLL on positive samples: VAPO's positive-example LM loss (arXiv 2504.05118 sec. 4.3, eq 9), mu times the
negative log-likelihood of the completions the batch rewards, added to the policy loss.

VAPO adds L_NLL = -(1 / sum_{o_i in T} |o_i|) sum_{o_i in T} sum_t log pi(o_it), T the correct answers of the batch,
with weight mu = 0.1. NVIDIA cosmos-rl ships it as ``positive_nll_coef`` (GRPO trainer: ``-logp[positive tokens].mean()``
times the coefficient, positive meaning reward > 0; off by default). Here the term is the token mean of -log pi over
the kept tokens of the completions whose advantage is positive, times ``nll_coef``.

Which completions count (where this departs from the peers): ``policy_loss`` has no reward input, so a completion is
positive when its advantage is > 0. With verifiable 0/1 rewards and a group baseline this is exactly reward > 0 in
every group that has both outcomes; a group whose completions are all correct has A = 0 and is left out here, while
VAPO and cosmos-rl imitate it too (the two agree on batches DAPO's dynamic sampling has filtered). Reading the rewards
would need a ``rewards`` input to ``policy_loss`` and to the fused LM head (``dfpo.core.fused``).

The term is a mean over the positive tokens of the whole batch, so it couples the micro-batches of an accumulated batch
(``batch_coupling``), like the entropy bonus.

Cancellation: only positive copies of a shared token get the NLL's gradient, -mu / N_+ each (N_+ the batch's positive
tokens), and no negative copy pushes back, so a token shared by a correct and an incorrect completion no longer cancels:
the residual is -mu * (its positive copies) / N_+ whatever the policy term does (ledger claim ``positive-nll-cancel``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .fields import NONNEG, Component, component_field

if TYPE_CHECKING:  # spec imports this module
    from .spec import ObjectiveSpec


def positive_tokens(ctx) -> Tensor:
    """(B, T) bool: the kept tokens with a positive advantage (those of the completions with one, when given per completion)."""
    return ctx.kept & (ctx.x.token_adv > 0)


def nll_term(spec: ObjectiveSpec, ctx) -> tuple[Tensor | None, dict[str, Tensor]]:
    """mu * (token mean of -log pi over the positive completions' kept tokens) and ``nll/positive`` (that mean, detached),
    ``nll/positive_frac`` (the positive share of kept tokens); nothing when mu = 0, 0 when no completion is positive."""
    if spec.nll_coef <= 0:
        return None, {}
    positive = positive_tokens(ctx)  # (B, T)
    n_positive = positive.sum()
    nll = -torch.where(positive, ctx.x.logp, 0.0).sum() / n_positive.clamp(min=1)  # 0-d
    share = n_positive / ctx.kept.sum().clamp(min=1)
    return spec.nll_coef * nll, {"nll/positive": nll.detach(), "nll/positive_frac": share.to(nll.dtype)}


# ----------------------------------------------------------------------------- the imitation component's settings

NLL_COEF = component_field(
    0.0,
    "imitation",
    "number",
    "0: no NLL term (VAPO's mu = 0.1 applies with its positive-example LM loss; cosmos-rl positive_nll_coef=None)",
    trust_region=True,
    bounds=NONNEG,
    doc="VAPO's positive-example LM loss: the loss plus nll_coef times the token mean of -log pi over the kept tokens of "
    "the completions with a positive advantage (arXiv 2504.05118 eq 9).",
)


def _nll_coupling(spec: ObjectiveSpec) -> list[str]:
    if spec.nll_coef > 0:
        return ["the NLL on positive samples is a mean over the batch's positive tokens, not a sum of micro-batch terms"]
    return []


IMITATION_COMPONENT = Component("imitation", batch_coupling=_nll_coupling, loss_term=nll_term)
