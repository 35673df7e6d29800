"""The coefficient solve: d loss / d logp and d loss / d entropy of the whole (B, T) batch, by autograd through
``policy_loss`` itself at the values known so far (package doc: the coefficients c and e), so no objective's formula
is written in the fused path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..loss import ObjectiveSpec, policy_loss

if TYPE_CHECKING:
    from .state import FusedCall


@dataclass
class _Inputs:
    """The (B, T) loss inputs, checked and on the head's device."""

    spec: ObjectiveSpec
    old_logp: Tensor | None
    advantages: Tensor
    mask: Tensor  # bool
    group_ids: Tensor
    ref_logp: Tensor | None
    rollout_logp: Tensor | None
    token_ids: Tensor | None = None  # the targets, where the spec reads them (the exact-cancellation arm)

    def loss(self, logp: Tensor, entropy: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
        """``policy_loss`` of the spec on these inputs with ``logp`` (and ``entropy``); old_logp None: ``logp`` itself, detached."""
        return policy_loss(
            self.spec,
            logp=logp,
            old_logp=logp.detach() if self.old_logp is None else self.old_logp,
            advantages=self.advantages,
            mask=self.mask,
            group_ids=self.group_ids,
            entropy=entropy,
            ref_logp=self.ref_logp,
            rollout_logp=self.rollout_logp,
            token_ids=self.token_ids,
        )

    def coefficients(self, logp: Tensor, entropy: Tensor | None) -> tuple[Tensor, Tensor | None, Tensor, dict[str, Tensor]]:
        """(d loss / d logp (B, T), d loss / d entropy (B, T) or None, loss, metrics) at the values ``logp``, ``entropy``."""
        with torch.enable_grad():
            lp = logp.detach().clone().requires_grad_()  # (B, T) leaf
            ent = None if entropy is None else entropy.detach().clone().requires_grad_()
            loss, metrics = self.loss(lp, ent)
            leaves = [lp] if ent is None else [lp, ent]
            grads = torch.autograd.grad(loss, leaves, allow_unused=True) if loss.requires_grad else [None] * len(leaves)
        grads = [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves)]
        return grads[0], (grads[1] if ent is not None else None), loss.detach(), metrics


def solve(call: FusedCall) -> None:
    """The coefficients at the values known now, into ``call`` (the last call's loss and metrics are the batch's)."""
    call.c_buf, call.e_buf, call.loss, call.metrics = call.x.coefficients(call.logp_buf, call.entropy_buf if call.needs_entropy else None)
