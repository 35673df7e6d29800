"""Rollout/trainer mismatch correction: each mode against a per-token loop, the identity when the sampler is
pi_old, and what the weight does to shared-token cancellation (token modes keep it, sequence modes break it)."""

from __future__ import annotations

import math

import pytest
import torch

from dfpo import policy_loss
from dfpo.core.loss.cancellation import make_shared_prefix_group
from dfpo.core.loss.correction import CORRECTIONS

MODES = [m for m in CORRECTIONS if m != "none"]


def _batch(seed=0, B=6, T=5):
    g = torch.Generator().manual_seed(seed)
    logp = (-0.2 - torch.rand(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    old = logp.detach() + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)
    rollout = old + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)  # some rho far from 1
    lengths = torch.tensor([5, 3, 4, 5, 1, 2])[:B]
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0], dtype=torch.float64)[:B]
    return logp, old, rollout, mask, adv, torch.tensor([0, 0, 0, 1, 1, 1])[:B]


def _loop_weight(mode, old, rollout, mask, i, t, low=0.5, cap=2.0):
    L = int(mask[i].sum())
    if mode.startswith("token"):
        rho = math.exp(float(old[i, t] - rollout[i, t]))
    else:
        rho = math.exp(sum(float(old[i, s] - rollout[i, s]) for s in range(L)))
    if mode.endswith("truncate"):
        return min(rho, cap)
    return rho if low <= rho <= cap else 0.0


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_equals_a_per_token_loop(mode):
    """GRPO with the correction == (1/B') sum_i (1/L_i) sum_t -w_t A_i clip(r_t) A_i-form, w_t by hand."""
    logp, old, rollout, mask, adv, gid = _batch()
    loss, metrics = policy_loss(
        "grpo", logp=logp, old_logp=old, advantages=adv, mask=mask, group_ids=gid, rollout_logp=rollout, rollout_correction=mode
    )
    ref = 0.0
    weights = []
    for i in range(logp.shape[0]):
        L = int(mask[i].sum())
        row = 0.0
        for t in range(L):
            r = math.exp(float(logp[i, t] - old[i, t]))
            c = min(max(r, 0.8), 1.2)
            surrogate = min(r * float(adv[i]), c * float(adv[i]))
            w = _loop_weight(mode, old, rollout, mask, i, t)
            weights.append(w)
            row += -w * surrogate
        ref += row / L
    assert float(loss) == pytest.approx(ref / logp.shape[0], rel=1e-12)
    assert float(metrics["rollout/weight_mean"]) == pytest.approx(sum(weights) / len(weights), rel=1e-12)
    assert 0 < min(weights) or mode.endswith("mask")


@pytest.mark.parametrize("mode", MODES)
def test_no_mismatch_means_no_correction(mode):
    """pi_rollout == pi_old: every weight is 1 and the loss and gradient are the uncorrected ones."""
    logp, old, _, mask, adv, gid = _batch(1)
    kw = dict(logp=logp, old_logp=old, advantages=adv, mask=mask, group_ids=gid)
    plain, _ = policy_loss("dfpo_min", **kw)
    corrected, m = policy_loss("dfpo_min", **kw, rollout_logp=old, rollout_correction=mode)
    assert float(corrected) == float(plain) and float(m["rollout/weight_mean"]) == 1.0


def test_correction_needs_the_sampler_log_probs():
    logp, old, _, mask, adv, gid = _batch()
    with pytest.raises(ValueError, match="rollout_logp is required for rollout_correction='token_mask'"):
        policy_loss("grpo", logp=logp, old_logp=old, advantages=adv, mask=mask, group_ids=gid, rollout_correction="token_mask")


@pytest.mark.parametrize(
    "mode, cancels",
    [("none", True), ("token_truncate", True), ("token_mask", True), ("sequence_truncate", False), ("sequence_mask", False)],
)
def test_token_weights_keep_cancellation_sequence_weights_break_it(mode, cancels):
    """A shared token is the same event in every completion, so its token weight rho_t is shared: the token
    modes keep GRPO's cancellation. A sequence weight prod_t rho_t differs across the group and breaks it."""
    group = make_shared_prefix_group(torch.tensor([1.0, 0.0, 1.0, 0.0]), [7, 7, 7, 7], seed=2)
    g = torch.Generator().manual_seed(9)
    G, T = group.old_logp.shape
    prefix = group.shared_logp.numel()
    noise = 0.2 * torch.randn(G, T, generator=g, dtype=group.old_logp.dtype)
    noise[:, :prefix] = noise[0, :prefix]  # the shared event has one pi_rollout, like one pi_old
    rollout = group.old_logp + noise
    loss, _ = policy_loss(
        "grpo", logp=group.logp(), old_logp=group.old_logp, advantages=group.advantages, mask=group.mask, group_ids=group.group_ids,
        rollout_logp=rollout, rollout_correction=mode, rollout_low=0.01, rollout_cap=100.0,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, group.shared_logp)
    residual = float(grad.abs().max())
    assert (residual < 1e-12) == cancels, residual


def test_correction_is_a_separate_factor_after_the_group_transform():
    """DFPO's transform acts on pi/pi_old; the correction multiplies the transformed surrogate: with a weight
    shared by the whole batch (a constant rho) the loss is the uncorrected one times that constant."""
    logp, old, _, mask, adv, gid = _batch(2)
    rollout = old - math.log(1.5)  # rho = 1.5 at every token, below the cap
    kw = dict(logp=logp, old_logp=old, advantages=adv, mask=mask, group_ids=gid)
    plain, _ = policy_loss("dfpo_orth_pos", **kw)
    corrected, _ = policy_loss("dfpo_orth_pos", **kw, rollout_logp=rollout, rollout_correction="token_truncate")
    assert float(corrected) == pytest.approx(1.5 * float(plain), rel=1e-12)


def test_correction_metrics_by_hand():
    """Two completions, rho = (2, 0.5 | 4): token shares above the cap 2 and the sequence ratios' min/mean/max."""
    import torch

    from dfpo.core.loss.correction import correction_metrics

    old = torch.log(torch.tensor([[2.0, 0.5], [4.0, 1.0]], dtype=torch.float64))
    rollout = torch.zeros(2, 2, dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False]])
    weight = torch.tensor([[2.0, 0.5], [2.0, 1.0]], dtype=torch.float64)  # token_truncate at cap 2
    m = correction_metrics(old, rollout, mask, weight, cap=2.0)
    assert float(m["rollout/weight_mean"]) == pytest.approx(4.5 / 3)
    assert float(m["rollout/token_truncated_frac"]) == pytest.approx(1 / 3)  # only rho = 4 is above 2
    assert float(m["rollout/weight_zero_frac"]) == 0.0
    assert (float(m["rollout/seq_ratio_min"]), float(m["rollout/seq_ratio_mean"]), float(m["rollout/seq_ratio_max"])) == pytest.approx(
        (1.0, 2.5, 4.0)
    )
