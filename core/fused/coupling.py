"""Which positions a position's loss coefficient reads, and which completions' coefficients are one factor times
fixed weights: what decides how the fused pass may cut a batch into blocks (package doc: "Coupling units", "Completions
scaled once")."""

from __future__ import annotations

import torch
from torch import Tensor

from ..loss import ObjectiveSpec

COUPLING_UNITS = ("token", "row", "group", "batch")

_TOKEN_LOCAL = {
    "ratio_level": ("token",),
    "transform": ("none",),
    "token_mask": ("none",),
    "cov_control": ("none",),
    "rollout_correction": ("none", "token_truncate", "token_mask"),
    "clip": ("ppo", "symmetric", "cispo", "sapo", "vespo", "pg", "dppo_tv", "dppo_kl", "none"),
}
"""Choice fields and the values at which a position's coefficient reads its own log-prob only."""
_ROW_LOCAL = {
    **_TOKEN_LOCAL,
    "ratio_level": ("token", "sequence_token", "sequence", "sequence_product", "geometric"),
    "token_mask": ("none", "opsm"),
    "rollout_correction": ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
}
"""The same for a position's own completion (row)."""
_LOCAL_ANY_VALUE = frozenset(
    {
        "eps_low", "eps_high", "dual_clip_c", "sapo_tau_pos", "sapo_tau_neg", "vespo_k_pos", "vespo_lambda_pos",
        "vespo_k_neg", "vespo_lambda_neg", "tr_floor", "stopgrad", "length_aware", "mask_renormalise", "stapo_tau_p",
        "stapo_q", "top_entropy_frac", "opsm_delta", "cov_ratio", "cov_clip_low", "cov_clip_high", "kl_cov_coef",
        "aggregation", "max_completion_length", "beta", "rollout_low", "rollout_cap", "entropy_coef", "adv_scale",
        "adv_eps",
    }
)  # fmt: skip
"""Fields that never couple positions beyond what the choice fields above decide (a coupling they add, e.g. an
entropy bonus outside token_mean, is a batch coupling the spec reports itself)."""


def coupling_unit(spec: ObjectiveSpec) -> str:
    """The smallest set of positions whose log-probs a position's loss coefficient depends on (``COUPLING_UNITS``).

    ``batch`` for a batch-coupled spec; ``token`` / ``row`` when every choice field holds a value known to be
    local to a position / a completion; ``group`` otherwise (DFPO's transforms, and any field or value this
    module does not know, such as a preset added later: a group is exact for every spec that is not batch-coupled).
    """
    return "batch" if spec.batch_coupled else _unit_of_fields(spec.components())


def _unit_of_fields(fields: dict[str, object]) -> str:
    """``coupling_unit`` of a spec that is not batch-coupled, from its component fields."""
    defaults = ObjectiveSpec.__dataclass_fields__
    for name, value in fields.items():  # a field added after this module: local only at its default
        if name not in _TOKEN_LOCAL and name not in _LOCAL_ANY_VALUE and value != defaults[name].default:
            return "group"
    for unit, local in (("token", _TOKEN_LOCAL), ("row", _ROW_LOCAL)):
        if all(fields[name] in values for name, values in local.items()):
            return unit
    return "group"


_ONE_WEIGHT_PER_ROW = ("sequence", "sequence_token", "sequence_product")
"""Ratio levels whose ratio, clip and weight take one value per completion (GMPO's geometric mean clips per token)."""


def row_scaled(spec: ObjectiveSpec) -> bool:
    """Whether each completion's loss coefficients are one factor times weights fixed before the log-probs.

    d loss / d logp_t = k_i w_t for t in completion i, with w_t read from the mask, the advantages and the old and
    rollout log-probs only, and k_i from the sequence ratios: a sequence-level ratio, clip and weight
    (``_ONE_WEIGHT_PER_ROW``), no entropy read, no per-token KL term, and nothing beyond the completion but DFPO's
    in-group transform (which maps the group's sequence weights to new ones, so k_i reads the group). Then a
    completion's gradient can be accumulated at placeholder log-probs and scaled once by k_i when its unit's last block
    is done: three matmuls and a (possibly halved) block of logits beside its (V, H) buffer, whatever its length
    (package doc).
    ``fused_head_loss`` checks the proportionality on each completion and runs a completion again, at its own
    coefficients, where it breaks.
    """
    if spec.batch_coupled or spec.needs_entropy or spec.ratio_level not in _ONE_WEIGHT_PER_ROW or spec.beta != 0:
        return False
    return _unit_of_fields({**spec.components(), "transform": "none"}) == "row"


def group_folded(spec: ObjectiveSpec) -> bool:
    """Whether a group's completion factors are k_i = u_i v: u_i read from completion i's own log-probs, v one factor
    of the whole group.

    DFPO's Min-Replace (eq 50) in the ``ratio`` and ``score`` forms: stilde_i = min_j sbar_j (L_i min_j sbar_j / L_j
    length-aware), so c_it = -stilde_i A_i / L_i on a sequence inside its clip range (0 outside it in the ratio form):
    u_i reads A_i, L_i and sequence i's own clip, v is the group's minimum. Then a group's d W is summed in one (V, H)
    buffer as its completions come: when a completion is done every earlier factor changes by the same r (the new
    minimum over the old), so the sum is scaled by r and the new completion added at its k (package doc). The
    projections (eqs 18, 51-55) mix the group's weights, and the ``none`` form differentiates the minimum itself, so
    neither is one factor. ``fused_head_loss`` checks the common r after every completion and runs the group again at
    its coefficients where it breaks.
    """
    return row_scaled(spec) and spec.transform == "min" and spec.stopgrad in ("ratio", "score")


def positions(mask: Tensor, group_ids: Tensor, unit: str) -> tuple[Tensor, Tensor, list[int]]:
    """The real positions laid out unit after unit: rows (N,), columns (N,) and the size of each unit."""
    B = mask.shape[0]
    if unit == "group":
        _, inverse = torch.unique(group_ids, return_inverse=True)  # (B,)
        order = torch.argsort(inverse, stable=True)  # rows of a group next to each other
    else:
        order = torch.arange(B, device=mask.device)
    r, cols = mask[order].nonzero(as_tuple=True)  # (N,) row-major
    rows = order[r]
    n = int(rows.numel())
    if unit == "token" or n == 0:
        return rows, cols, []  # token units: no list of N ones (chunks of chunk_size are cut directly)
    if unit == "batch":
        return rows, cols, [n]
    lengths = mask[order].sum(-1)  # (B,) in layout order
    if unit == "row":
        sizes = lengths[lengths > 0]
    else:
        sizes = torch.zeros(int(inverse.max()) + 1, dtype=lengths.dtype, device=lengths.device).index_add_(0, inverse[order], lengths)
        sizes = sizes[sizes > 0]
    return rows, cols, sizes.tolist()
