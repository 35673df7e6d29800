"""Gradient accumulation over micro-batches of whole groups: exact exactly when the spec is not ``batch_coupled``.

A trainer that cannot fit a batch splits it into micro-batches (whole groups, the batch's padded width) and
weighs each micro-batch's loss by its ``aggregation_count`` over the batch's, the only count it knows before
the loss. ``ObjectiveSpec.batch_coupled`` says when that is not the loss of the whole batch.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dfpo import group_advantages, policy_loss
from dfpo.core.loss import OBJECTIVES, aggregation_count, objective_from_label

VARIANTS = (
    "dapo:entropy_coef=0.01",  # a token-mean bonus under a token-mean aggregation: not coupled
    "gspo:beta=0.04",
    "dapo:rollout_correction=sequence_mask",
    "dfpo_orth_pos:length_aware=true",
    "opsm:mask_renormalise=true:aggregation=constant",  # kept rows counted like real rows by constant
    "grpo:entropy_coef=0.01",  # coupled: token-mean bonus, per-sequence aggregation
    "grpo:token_mask=top_entropy",  # coupled: batch quantile
    "opsm:mask_renormalise=true",  # coupled: kept-token normaliser
)
LABELS = tuple(sorted(OBJECTIVES)) + VARIANTS


def make_batch(seed: int, n_groups: int, group_size: int, T: int, p_real: float):
    """Ragged masks (empty rows possible), log-probs down to -10 (STAPO candidates), varied entropies, float64."""
    g = torch.Generator().manual_seed(seed)
    B = n_groups * group_size
    mask = torch.rand(B, T, generator=g) < p_real  # (B, T)
    logp = -0.01 - 10.0 * torch.rand(B, T, generator=g, dtype=torch.float64) ** 2  # (B, T)
    old = logp + 0.6 * torch.randn(B, T, generator=g, dtype=torch.float64)  # (B, T)
    rollout = old + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)  # (B, T)
    ref = logp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)  # (B, T)
    entropy = 4.0 * torch.rand(B, T, generator=g, dtype=torch.float64)  # (B, T)
    group_ids = torch.randperm(B, generator=g) % n_groups  # (B,) interleaved groups
    rewards = torch.rand(B, generator=g, dtype=torch.float64)
    advantages = 2.0 * group_advantages(rewards, group_ids)  # (B,)
    return dict(
        logp=logp,
        old_logp=old,
        advantages=advantages,
        mask=mask,
        group_ids=group_ids,
        entropy=entropy,
        ref_logp=ref,
        rollout_logp=rollout,
    )


def whole_and_accumulated(spec, batch: dict, first_groups: set[int]):
    """(loss, grad) of one call on the batch, and of the count-weighted sum over two micro-batches of whole groups."""
    rows = torch.tensor([int(g) in first_groups for g in batch["group_ids"]])  # (B,) bool
    logp = batch["logp"].clone().requires_grad_()
    whole, _ = policy_loss(spec, **{**batch, "logp": logp})
    (whole_grad,) = torch.autograd.grad(whole, logp)
    total_count = aggregation_count(batch["mask"], spec.aggregation)
    logp = batch["logp"].clone().requires_grad_()
    accumulated = 0.0
    for part in (rows, ~rows):
        micro = {k: v[part] for k, v in batch.items()}
        loss, _ = policy_loss(spec, **{**micro, "logp": logp[part]})
        accumulated = accumulated + loss * aggregation_count(micro["mask"], spec.aggregation) / total_count
    (accumulated_grad,) = torch.autograd.grad(accumulated, logp)
    return (whole.detach(), whole_grad), (accumulated.detach(), accumulated_grad)


@st.composite
def split_batches(draw):
    n_groups = draw(st.integers(2, 5))
    batch = make_batch(draw(st.integers(0, 2**16)), n_groups, draw(st.integers(2, 4)), draw(st.integers(1, 6)), draw(st.floats(0.3, 1.0)))
    first = draw(st.sets(st.integers(0, n_groups - 1), min_size=1, max_size=n_groups - 1))
    return batch, first


@settings(deadline=None)
@given(data=split_batches(), label=st.sampled_from([lbl for lbl in LABELS if not objective_from_label(lbl).batch_coupled]))
def test_accumulation_is_exact_when_the_spec_is_not_batch_coupled(data, label):
    """For a spec that is not batch_coupled, the count-weighted micro-batch losses (whole groups) sum to the
    batch's loss, and their gradients to its gradient."""
    batch, first = data
    spec = objective_from_label(label)
    assume(int(aggregation_count(batch["mask"], spec.aggregation)) > 0)
    (whole, whole_grad), (acc, acc_grad) = whole_and_accumulated(spec, batch, first)
    torch.testing.assert_close(acc, whole, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(acc_grad, whole_grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("label", [lbl for lbl in LABELS if objective_from_label(lbl).batch_coupled])
def test_accumulation_is_inexact_for_a_batch_coupled_spec(label):
    """Each batch_coupled spec has a batch whose count-weighted micro-batch sum differs from the whole batch's loss:
    the flag is not set on a spec that would accumulate exactly."""
    spec = objective_from_label(label)
    gaps = []
    for seed in range(10):
        batch = make_batch(seed, n_groups=4, group_size=4, T=8, p_real=0.7)
        if seed % 2:  # group 0's advantages all equal: online IPO has a pair in 3 groups of 4, the sequence mean counts all rows
            batch["advantages"] = torch.where(batch["group_ids"] == 0, 0.0, batch["advantages"])
        (whole, whole_grad), (acc, acc_grad) = whole_and_accumulated(spec, batch, {0, 1})
        gaps.append(max(float((whole - acc).abs()), float((whole_grad - acc_grad).abs().max())))
    assert max(gaps) > 1e-6, (label, spec.batch_coupling(), gaps)


def test_the_coupled_presets_and_their_reasons():
    """Among the presets, STAPO (batch quantile, kept-token normaliser), Clip-Cov and KL-Cov (batch covariance), VAPO's
    NLL (a mean over the batch's positive tokens), M2PO (the batch's second moment) and online IPO (a mean over the
    batch's pairs) couple."""
    coupled = {name: spec.batch_coupling() for name, spec in OBJECTIVES.items() if spec.batch_coupled}
    assert set(coupled) == {"stapo", "clip_cov", "kl_cov", "vapo_nll", "m2po", "online_ipo"}
    assert coupled["vapo_nll"] == ["the NLL on positive samples is a mean over the batch's positive tokens, not a sum of micro-batch terms"]
    assert coupled["m2po"] == ["clip='m2po' chooses its clip range from the second moment of the log-ratio over the whole batch"]
    assert len(coupled["stapo"]) == 2 and "quantile" in coupled["stapo"][0]
    assert not objective_from_label("opsm").batch_coupled  # a per-sequence mask, normalised over real tokens
