"""Importance ratios at token and sequence level (paper eqs 7, 11, 44)."""

from __future__ import annotations

import torch
from torch import Tensor

LOG_RATIO_BOUND = 20.0
"""|log pi_theta - log pi_old| is clamped here before any exp (as verl and OpenRLHF do): e^20 ~ 5e8
is far past every clip range, and no finite input can then overflow a ratio. A clamped token gets
no gradient through its ratio; ``policy_loss`` counts such tokens in ``ratio/clamped_frac``."""


def token_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """Eq (7) in log space: l_it = log pi_theta - log pi_old on real tokens, 0 elsewhere (B, T),
    clamped to +-LOG_RATIO_BOUND.

    ``torch.where`` (never a multiply) keeps NaN/inf padding out of values and gradients.
    """
    return torch.where(mask, (logp - old_logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND), 0.0)  # (B, T)


def clamped_share(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """Share of real tokens whose log-ratio was clamped by ``token_log_ratio`` (0-d)."""
    outside = ((logp - old_logp).detach().abs() > LOG_RATIO_BOUND) & mask  # (B, T)
    return (outside.sum() / mask.sum().clamp(min=1)).to(logp.dtype)


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, lengths: Tensor | None = None) -> Tensor:
    """Eq (44) in log space: log s_i = (1/L_i) sum_t l_it, the length-normalised geometric mean (B,).

    Rows with no real token get 0 (ratio 1). ``lengths`` (B,) saves a pass when known.
    """
    lengths = mask.sum(-1) if lengths is None else lengths  # (B,)
    return token_log_ratio(logp, old_logp, mask).sum(-1) / lengths.clamp(min=1)  # (B,)


def sequence_product_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """Eq (11) in log space: log prod_t r_it, the un-normalised sequence ratio (B,)."""
    return token_log_ratio(logp, old_logp, mask).sum(-1)  # (B,)


def sequence_token_ratio(logp: Tensor, seq_ratio: Tensor) -> Tensor:
    """GSPO-token: s_it = sg(s_i) * pi_theta(y_it) / sg(pi_theta(y_it)) (B, T).

    Its value is s_i at every token; its gradient is s_i * grad log pi(y_it), token by token.
    """
    return seq_ratio.detach()[:, None] * torch.exp(logp - logp.detach())  # (B, T)


def segment_ids(mask: Tensor) -> Tensor:
    """Each real token's run of consecutive real tokens, numbered from 1 along its row; 0 on padding (B, T)."""
    prev = torch.cat([torch.zeros_like(mask[:, :1]), mask[:, :-1]], dim=1)  # (B, T)
    starts = mask & ~prev
    return torch.where(mask, starts.long().cumsum(-1), 0)  # (B, T)


def level_log_ratio(log_rho: Tensor, mask: Tensor, level: str) -> Tensor:
    """log of the level's ratio at every real token (B, T) from the token log-ratios log rho_t (B, T), padding 0:
    token: log rho_t; sequence: sum_t; geometric: mean_t over the row; segment: mean over the token's run."""
    x = torch.where(mask, log_rho, 0.0)  # (B, T)
    if level == "token":
        return x
    if level in ("sequence", "geometric"):
        total = x.sum(-1, keepdim=True)  # (B, 1)
        if level == "geometric":
            total = total / mask.sum(-1, keepdim=True).clamp(min=1)
        return torch.where(mask, total.expand_as(x), 0.0)
    B, T = mask.shape
    seg = segment_ids(mask)  # (B, T)
    key = (torch.arange(B, device=mask.device)[:, None] * (T + 1) + seg).flatten()  # (B*T,) one key per row's run
    sums = torch.zeros(B * (T + 1), dtype=x.dtype, device=x.device).index_add(0, key, x.flatten())
    counts = torch.zeros(B * (T + 1), dtype=x.dtype, device=x.device).index_add(0, key, mask.flatten().to(x.dtype))
    mean = (sums / counts.clamp(min=1))[key].view(B, T)  # (B, T)
    return torch.where(mask, mean, 0.0)
