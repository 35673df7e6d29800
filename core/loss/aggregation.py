"""Aggregation of per-token losses into one scalar (verl ``agg_loss``; TRL ``loss_type``).

All modes read the loss only where ``mask`` is True (``torch.where``, so padding never
reaches the result). Rows with no real token are ignored: they add nothing and are not
counted in the sequence means.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .fields import Component, When, component_field

AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "constant", "seq_mean_token_sum")


def aggregation_count(mask: Tensor, mode: str) -> Tensor:
    """What an aggregation mode counts in its denominator, per batch: mask (..., B, T) -> (...).

    token_mean: real tokens; constant: rows (the divisor is rows * T_max); the sequence means:
    rows with at least one real token. A batch's loss is the sum of its parts weighted by their
    counts over the batch's count (gradient accumulation, several seeds in one call).
    """
    if mode == "token_mean":
        return mask.sum((-1, -2))
    if mode == "constant":
        return torch.full(mask.shape[:-2], mask.shape[-2], dtype=torch.long, device=mask.device)
    if mode in ("seq_mean_token_mean", "seq_mean_token_sum"):
        return (mask.sum(-1) > 0).sum(-1)
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got aggregation={mode!r}")


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
    if mode not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got aggregation={mode!r}")
    row_sum = torch.where(mask, per_token, 0.0).sum(-1)  # (B,)
    if mode == "seq_mean_token_mean":
        lengths = mask.sum(-1) if lengths is None else lengths  # (B,)
        row_sum = row_sum / lengths.clamp(min=1)
    count = aggregation_count(mask, mode)  # 0-d
    if mode == "constant":
        count = count * (per_token.shape[-1] if max_completion_length is None else max_completion_length)
    count = count.clamp(min=1)  # an empty batch (or T = 0) sums to 0: its loss is 0, never 0/0
    return row_sum.sum() / count


# ----------------------------------------------------------------------------- the aggregation component's settings

AGGREGATION = component_field(
    "seq_mean_token_mean",
    "aggregation",
    "choice",
    "per-sequence token mean (DeepSeekMath GRPO; TRL loss_type='grpo')",
    trust_region=True,
    choices=AGGREGATIONS,
    doc="seq_mean_token_mean / token_mean / constant / seq_mean_token_sum.",
)
MAX_COMPLETION_LENGTH = component_field(
    None,
    "aggregation",
    "count",
    "None: the batch's T (TRL: max_completion_length)",
    trust_region=True,
    active_when=When("aggregation", ("constant",)),
    doc="T_max of the ``constant`` aggregation (None: the batch's T).",
)

AGGREGATION_COMPONENT = Component("aggregation")
