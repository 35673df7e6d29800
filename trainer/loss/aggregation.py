"""Aggregation of per-token losses into one scalar (verl ``agg_loss``; TRL ``loss_type``).

All modes read the loss only where ``mask`` is True (``torch.where``, so padding never
reaches the result). Rows with no real token are ignored: they add nothing and are not
counted in the sequence means.
"""

from __future__ import annotations

import torch
from torch import Tensor

AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "constant", "seq_mean_token_sum")


def aggregate(
    per_token: Tensor, mask: Tensor, mode: str, max_completion_length: int | None = None, lengths: Tensor | None = None
) -> Tensor:
    """Reduce per-token losses (B, T) to a scalar.

    - seq_mean_token_mean: mean_i (1/L_i) sum_t loss_it  (TRL grpo, GSPO, verl seq-mean-token-mean)
    - token_mean:          sum loss / sum mask           (TRL dapo/bnpo, verl token-mean)
    - constant:            sum loss / (B * T_max)        (TRL dr_grpo; T_max = max_completion_length or T)
    - seq_mean_token_sum:  mean_i sum_t loss_it          (verl seq-mean-token-sum)

    ``lengths`` (B,), the row sums of ``mask``, saves a pass when known.
    """
    masked = torch.where(mask, per_token, 0.0)  # (B, T)
    row_sum = masked.sum(-1)  # (B,)
    lengths = mask.sum(-1) if lengths is None else lengths  # (B,)
    n_rows = (lengths > 0).sum().clamp(min=1)
    if mode == "seq_mean_token_mean":
        return (row_sum / lengths.clamp(min=1)).sum() / n_rows
    if mode == "token_mean":
        return row_sum.sum() / lengths.sum().clamp(min=1)
    if mode == "constant":
        t_max = per_token.shape[-1] if max_completion_length is None else max_completion_length
        return row_sum.sum() / max(per_token.shape[0] * t_max, 1)
    if mode == "seq_mean_token_sum":
        return row_sum.sum() / n_rows
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got aggregation={mode!r}")
