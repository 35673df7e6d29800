"""Every metric the loss core logs, pinned against a hand computation on a small batch with
unequal lengths and an empty row (not just 'exists' or 'is finite')."""

from __future__ import annotations

import math

import pytest
import torch

from dfpo import policy_loss

# Three completions in one group: lengths 2, 3, 0 (an empty row). Token log-ratios by hand.
LOGP = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -1.5, -1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
LOG_RATIO = torch.tensor([[0.3, -0.1, 0.0], [0.0, 0.5, -0.4], [0.0, 0.0, 0.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.bool)
ADV = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
GID = torch.zeros(3, dtype=torch.long)


def _metrics(objective, **kw):
    old = LOGP - LOG_RATIO
    _, m = policy_loss(objective, logp=LOGP.clone().requires_grad_(), old_logp=old, advantages=ADV, mask=MASK, group_ids=GID, **kw)
    return {k: float(v) for k, v in m.items()}


def test_token_level_ratio_clip_and_asym_by_hand():
    m = _metrics(
        "grpo"
    )  # eps 0.2: r = e^0.3 = 1.35 (A > 0: clipped high), e^0.5 = 1.65 (A < 0: not clipped), e^-0.4 = 0.67 (A < 0: clipped low)
    real = [0.3, -0.1, 0.0, 0.5, -0.4]  # the five real tokens
    assert m["ratio/mean"] == pytest.approx(sum(math.exp(x) for x in real) / 5)  # token-weighted over real tokens
    assert m["ratio/max"] == pytest.approx(math.exp(0.5))
    assert m["clip/frac_high"] == pytest.approx(1 / 5) and m["clip/frac_low"] == pytest.approx(1 / 5)
    # Asym: w_i = mean over real tokens of the post-clip token weight; population variance of w_i A_i over
    # the two non-empty rows.
    w1 = (1.2 + math.exp(-0.1)) / 2  # A > 0: min(r, 1.2)
    w2 = (1.0 + math.exp(0.5) + 0.8) / 3  # A < 0: max(r, clip(r))
    c = [w1 * 1.0, w2 * -1.0]
    mean = sum(c) / 2
    assert m["weights/asym"] == pytest.approx(sum((x - mean) ** 2 for x in c) / 2)
    assert m["mask/frac"] == 0.0 and m["ratio/clamped_frac"] == 0.0


def test_sequence_level_ratio_and_clip_fractions_count_non_empty_sequences():
    m = _metrics("gspo_noclip")
    s1, s2 = math.exp((0.3 - 0.1) / 2), math.exp((0.0 + 0.5 - 0.4) / 3)
    assert m["ratio/mean"] == pytest.approx((2 * s1 + 3 * s2) / 5)  # each s_i weighted by its length
    assert m["ratio/max"] == pytest.approx(max(s1, s2))
    assert m["clip/frac_high"] == 0.0 and m["clip/frac_low"] == 0.0
    gspo = _metrics("gspo")  # s1 = 1.105 > 1 + 4e-4 with A > 0: clipped; s2 = 1.034 with A < 0: not clipped
    assert gspo["clip/frac_high"] == pytest.approx(1 / 2) and gspo["clip/frac_low"] == 0.0


def test_kl_to_the_reference_is_the_token_mean_of_k3_over_real_tokens():
    ref = LOGP - 0.1 * torch.arange(9, dtype=torch.float64).reshape(3, 3)
    old = LOGP - LOG_RATIO
    _, m = policy_loss("grpo", logp=LOGP, old_logp=old, advantages=ADV, mask=MASK, group_ids=GID, ref_logp=ref, beta=0.1)
    gaps = [-0.0, -0.1, -0.3, -0.4, -0.5]  # ref - logp at the five real tokens
    assert float(m["kl/ref"]) == pytest.approx(sum(math.exp(g) - g - 1 for g in gaps) / 5)


def test_mask_fraction_counts_dropped_real_tokens():
    entropy = torch.tensor([[0.1, 2.0, 9.0], [3.0, 0.5, 1.0], [9.0, 9.0, 9.0]], dtype=torch.float64)
    old = LOGP - LOG_RATIO
    _, m = policy_loss(
        "grpo",
        logp=LOGP,
        old_logp=old,
        advantages=ADV,
        mask=MASK,
        group_ids=GID,
        entropy=entropy,
        token_mask="top_entropy",
        top_entropy_frac=0.4,
    )
    assert float(m["mask/frac"]) == pytest.approx(3 / 5)  # the top 40% of the 5 real tokens by entropy are kept: 2 kept, 3 dropped
