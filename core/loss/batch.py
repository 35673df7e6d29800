"""The data the loss core passes between its steps: the checked inputs (``LossBatch``), what a ratio shape returns
(``PolicyTerms``), what the components' pipeline steps read (``LossContext``) and what a position's (context, token)
event is made of (``TokenEvents``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .groups import Groups


@dataclass(frozen=True)
class LossBatch:
    """The checked inputs of one loss call; padded positions of logp/old_logp are already zero."""

    logp: Tensor  # (B, T) with the graph
    old_logp: Tensor  # (B, T) detached
    adv: Tensor
    """(B,) detached, logp's dtype: each completion's advantage (with per-token advantages, their mean over its real tokens)."""
    token_adv: Tensor
    """(B, T) detached: the advantage at each token (one per completion: ``adv`` broadcast along its row, a view);
    0 at padding when given per token."""
    mask: Tensor  # (B, T) bool, real tokens
    lengths: Tensor  # (B,) real tokens per row
    groups: Groups
    per_token_adv: bool = False
    """The caller gave one advantage per token (B, T) (the optimal token baseline), not one per completion."""

    @classmethod
    def of(cls, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, group_ids: Tensor | Groups) -> LossBatch:
        """The batch of checked inputs: logp, old_logp, mask (B, T) (padding already zeroed), advantages (B,) or (B, T)
        in logp's dtype or castable to it, detached here; the row lengths and groups computed once."""
        lengths = mask.sum(-1)  # (B,)
        adv = advantages.detach().to(logp.dtype)
        if adv.ndim == 2:  # one per token: zero the padding, keep the row mean for the per-completion metrics
            token_adv = torch.where(mask, adv, 0.0)  # (B, T)
            row_adv = token_adv.sum(-1) / lengths.clamp(min=1)  # (B,)
        else:
            row_adv, token_adv = adv, adv[:, None].expand(mask.shape)  # (B,), (B, T) view
        return cls(logp, old_logp, row_adv, token_adv, mask, lengths, Groups.of(group_ids), per_token_adv=adv.ndim == 2)


@dataclass(frozen=True)
class TokenEvents:
    """What names each position's (context, token) event (eq 2's (h*, v)): read by the exact-cancellation arm only."""

    token_ids: Tensor | None
    """(B, T) integer: the token at each position (None: not passed)."""
    context_ids: Tensor | None
    """(B, T) integer: the context each token was drawn in, where the caller names it (the toy's parameter row); None:
    the context is the prompt and the completion's tokens before t, a group sharing its prompt."""
    mask: Tensor
    """(B, T) bool: real tokens."""
    group_ids: Tensor
    """(B,) integer group labels."""


@dataclass(frozen=True)
class PolicyTerms:
    """What a ratio shape returns; every field means the same at every ratio level."""

    surrogate: Tensor
    """(B, T) per-token surrogate to maximise (read only where the mask holds)."""
    ratio: Tensor
    """(B, T) detached: the ratio the clip acts on, at each token (a sequence ratio repeats along its row)."""
    post_clip: Tensor
    """(B,) detached post-clip weight sbar_i (eq 47) before any group transform; a row's mean token weight at token level."""
    weight: Tensor
    """(B,) detached per-sequence weight w_i of Asym (eq 23): stilde_i after the group transform (sbar_i without one)."""
    clip_low: Tensor
    """(B, T) bool: where clipping zeroes the gradient from below (constant along a row for a sequence clip)."""
    clip_high: Tensor
    """(B, T) bool: the same from above."""
    clip_per_sequence: bool
    """True: ``clip/frac_*`` counts sequences (as TRL logs GSPO); False: it counts kept tokens."""


@dataclass(frozen=True)
class LossContext:
    """What the loss pipeline's component steps read (``Component.token_step``, ``Component.loss_term``)."""

    x: LossBatch
    terms: PolicyTerms
    kept: Tensor
    """(B, T) bool: real tokens the token mask keeps."""
    agg_mask: Tensor
    """(B, T) bool: the tokens the aggregation counts (the kept ones when a renormalised mask drops some)."""
    agg_lengths: Tensor | None
    """(B,) the row sums of ``agg_mask`` when known (None: the aggregation counts them)."""
    entropy: Tensor | None
    """(B, T) the policy's token entropy, with its gradient, in the compute dtype (None when not passed)."""
    ref_logp: Tensor | None
    """(B, T) detached reference log-probs, padding zeroed (None when not passed)."""
    rollout_logp: Tensor | None
    """(B, T) detached sampler log-probs, padding zeroed (None when not passed)."""
