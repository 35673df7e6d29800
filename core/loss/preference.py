"""Online IPO on each group: the pairwise preference loss of Azar et al. (arXiv 2310.12036, eq 17) between the best
and the worst completion of every group, as TRL's online DPO applies it (``loss_type='ipo'``).

TRL's ``OnlineDPOTrainer.training_step`` (trl/experimental/online_dpo/online_dpo_trainer.py, TRL 1.16) samples two
completions per prompt, makes the one with the higher reward y_w (the first one on a tie: ``first_half >=
second_half``), sums each completion's token log-probs over its real tokens, and takes

    h = (log pi(y_w) - log pi(y_l)) - (log pi_ref(y_w) - log pi_ref(y_l))     (sequence sums)
    loss = mean over pairs of (h - 1 / (2 beta))^2                              (beta: OnlineDPOConfig.beta = 0.1)

Here every group gives one pair: y_w is the first row (in batch order) with the group's highest advantage, y_l the
last row with its lowest, among the completions with at least one real token. A group whose advantages are all equal
(or that has fewer than two such completions) gives no pair and no loss, where TRL keeps a tied pair (first as y_w);
on a two-completion group with unequal rewards the pair is TRL's. The loss is the mean over the batch's pairs. The
pairwise loss replaces the policy-gradient term (online DPO has none): ``token_step`` zeroes the per-token policy loss,
so the ratio and clip settings only shape the metrics; the components that act on that term (a DFPO transform, a token
mask, a covariance control, a rollout correction or rejection) are refused beside it. Only the order of the
advantages within a group is read, so any advantage estimator that keeps the order of the rewards gives TRL's pairs.

Cancellation: h's gradient is +1 at every real token of y_w and -1 at every real token of y_l, times 2 (h - 1/(2 beta))
/ (number of pairs); every other completion gets nothing. A token shared by y_w and y_l therefore gets +c and -c and
cancels exactly, at any lengths, ratios and aggregation; its copies in the group's other completions get no gradient
(``tests/core/test_preference.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .fields import NONNEG, Component, component_field

if TYPE_CHECKING:  # spec imports this module
    from .spec import ObjectiveSpec

REFUSED_BESIDE_IPO = (
    ("transform", "none"),
    ("token_mask", "none"),
    ("cov_control", "none"),
    ("rollout_correction", "none"),
    ("rollout_rejection", "none"),
)
"""The components that act on the per-token policy term, which the IPO loss replaces: each must keep this value."""


def preference_pairs(adv: Tensor, valid: Tensor, index: Tensor, n_groups: int) -> tuple[Tensor, Tensor, Tensor]:
    """Each group's y_w row, y_l row and whether it has a pair, all (n_groups,).

    adv, valid, index: (B,). y_w: the first valid row with the group's largest advantage; y_l: the last valid row with
    its smallest; a group has a pair when those advantages differ (the rows of a group without one are 0)."""
    B = adv.shape[0]
    rows = torch.arange(B, device=adv.device)  # (B,)
    high = torch.full((n_groups,), float("-inf"), dtype=adv.dtype, device=adv.device)
    high = high.scatter_reduce(0, index, torch.where(valid, adv, float("-inf")), "amax")  # (n,)
    low = torch.full((n_groups,), float("inf"), dtype=adv.dtype, device=adv.device)
    low = low.scatter_reduce(0, index, torch.where(valid, adv, float("inf")), "amin")  # (n,)
    has_pair = high > low  # (n,) False for a group with no valid row (-inf > inf is False) or equal advantages
    is_w = valid & (adv == high[index])  # (B,)
    is_l = valid & (adv == low[index])  # (B,)
    w_row = torch.full((n_groups,), B, dtype=torch.long, device=adv.device).scatter_reduce(0, index, torch.where(is_w, rows, B), "amin")
    l_row = torch.full((n_groups,), -1, dtype=torch.long, device=adv.device).scatter_reduce(0, index, torch.where(is_l, rows, -1), "amax")
    return torch.where(has_pair, w_row, 0), torch.where(has_pair, l_row, 0), has_pair


def ipo_margin(seq_log_ratio: Tensor, w_row: Tensor, l_row: Tensor) -> Tensor:
    """IPO's h per pair (n,): the chosen completion's log(pi / pi_ref) minus the rejected one's (sequence sums, (B,))."""
    return seq_log_ratio[w_row] - seq_log_ratio[l_row]


def ipo_loss(h: Tensor, has_pair: Tensor, beta: float) -> Tensor:
    """Azar et al. eq 17 as TRL writes it: the mean over the pairs of (h - 1/(2 beta))^2 (0-d; 0 with no pair)."""
    losses = (h - 1.0 / (2.0 * beta)) ** 2  # (n,)
    return torch.where(has_pair, losses, 0.0).sum() / has_pair.sum().clamp(min=1)


def zero_policy_term(spec: ObjectiveSpec, ctx, per_token: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """The per-token policy loss (B, T), zeroed when the IPO loss replaces it (ipo_beta > 0)."""
    if spec.ipo_beta <= 0:
        return per_token, {}
    return torch.zeros_like(per_token), {}


def ipo_term(spec: ObjectiveSpec, ctx) -> tuple[Tensor | None, dict[str, Tensor]]:
    """The online IPO loss on each group's (y_w, y_l) and ``ipo/margin`` (the mean h over pairs), ``ipo/pair_frac``
    (the share of groups with a pair); nothing when ipo_beta = 0."""
    if spec.ipo_beta <= 0:
        return None, {}
    x = ctx.x
    seq_log_ratio = torch.where(x.mask, x.logp - ctx.ref_logp, 0.0).sum(-1)  # (B,) log pi(y) - log pi_ref(y)
    w_row, l_row, has_pair = preference_pairs(x.adv, x.lengths > 0, x.groups.index, x.groups.n)  # (n,) each
    h = ipo_margin(seq_log_ratio, w_row, l_row)  # (n,)
    loss = ipo_loss(h, has_pair, spec.ipo_beta)
    n_pairs = has_pair.sum()
    margin = torch.where(has_pair, h.detach(), 0.0).sum() / n_pairs.clamp(min=1)
    return loss, {"ipo/margin": margin, "ipo/pair_frac": (n_pairs / max(x.groups.n, 1)).to(loss.dtype)}


# ----------------------------------------------------------------------------- the preference component's settings

IPO_BETA = component_field(
    0.0,
    "preference",
    "number",
    "0: no IPO loss (TRL OnlineDPOConfig.beta = 0.1 applies with loss_type='ipo')",
    trust_region=True,
    bounds=NONNEG,
    doc="Online IPO's beta (Azar et al.'s tau; TRL OnlineDPOConfig.beta with loss_type='ipo'): > 0 replaces the policy "
    "term by the mean over groups of (h - 1/(2 beta))^2, h the log-ratio to ref_logp of each group's best completion "
    "minus its worst's.",
)


def _validate(spec: ObjectiveSpec) -> None:
    if spec.ipo_beta <= 0:
        return
    for name, neutral in REFUSED_BESIDE_IPO:
        if getattr(spec, name) != neutral:
            raise ValueError(
                f"ipo_beta={spec.ipo_beta!r} replaces the per-token policy term by the pairwise IPO loss, which "
                f"{name}={getattr(spec, name)!r} cannot act on: set {name}={neutral!r} or ipo_beta=0"
            )


def _inputs(spec: ObjectiveSpec) -> dict[str, str]:
    return {"ref_logp": f"ipo_beta={spec.ipo_beta!r} (online IPO's log-ratio to the reference policy)"} if spec.ipo_beta > 0 else {}


def _coupling(spec: ObjectiveSpec) -> list[str]:
    if spec.ipo_beta > 0:
        return [
            "the IPO loss is a mean over the batch's preference pairs (one per group with unequal advantages), not a sum of micro-batch terms"
        ]
    return []


def _pair_advantage(spec: ObjectiveSpec) -> str | None:
    if spec.ipo_beta > 0:
        return f"ipo_beta={spec.ipo_beta!r} pairs each group's best and worst completion by their advantages"
    return None


PREFERENCE_COMPONENT = Component(
    "preference",
    completion_advantage=_pair_advantage,
    validate=_validate,
    required_inputs=_inputs,
    batch_coupling=_coupling,
    token_step=zero_policy_term,
    loss_term=ipo_term,
)
