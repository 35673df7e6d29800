"""Per-token advantages (B, T) through the loss core: the optimal token baseline (verl's ``optimal_token_baseline``)
trains every objective whose components read advantages token by token, and a spec that reads one advantage per
completion refuses them in one sentence.

Every preset of ``OBJECTIVES`` is covered by iterating the registry (presets added later included).
"""

from __future__ import annotations

import pytest
import torch
from batches import random_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfpo.core.fused import fused_policy_loss
from dfpo.core.logprobs import naive_token_logprobs
from dfpo.core.loss import OBJECTIVES, policy_loss, resolve_objective
from dfpo.core.loss.advantages import optimal_token_baseline
from dfpo.core.loss.cancellation import make_shared_prefix_group

TOKEN_PRESETS = [name for name, spec in OBJECTIVES.items() if spec.takes_token_advantages]
COMPLETION_PRESETS = [name for name, spec in OBJECTIVES.items() if not spec.takes_token_advantages]


def _loss_and_grad(name: str, batch, advantages: torch.Tensor):
    loss, metrics = policy_loss(name, **(batch.kwargs() | {"advantages": advantages}))
    (grad,) = torch.autograd.grad(loss, batch.logp)
    return loss.detach(), grad, metrics


def test_the_presets_that_need_one_advantage_per_completion_are_the_sequence_ratios_opsm_and_online_ipo():
    """Which presets refuse per-token advantages, and why, is read off their components, not listed by hand."""
    for name in COMPLETION_PRESETS:
        spec = OBJECTIVES[name]
        assert spec.ratio_level in ("sequence", "sequence_product", "geometric") or spec.token_mask == "opsm" or spec.ipo_beta > 0
    for name in TOKEN_PRESETS:
        assert OBJECTIVES[name].ratio_level in ("token", "sequence_token")
    assert {"grpo", "dapo", "dr_grpo", "cispo", "gspo_token"} <= set(TOKEN_PRESETS)
    assert {"gspo", "dfpo_min", "online_ipo"} <= set(COMPLETION_PRESETS)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), name=st.sampled_from(TOKEN_PRESETS))
def test_one_advantage_per_completion_broadcast_along_its_row_is_the_same_loss_bit_for_bit(seed, name):
    """A (B,) advantage and the same advantage repeated at each of its tokens (B, T) give the identical loss and gradient
    (the metrics that read a completion's advantage read the row mean, equal up to its round-off)."""
    batch = random_batch(seed, empty_row=seed % 2 == 0)
    per_row = _loss_and_grad(name, batch, batch.advantages)
    per_token = _loss_and_grad(name, batch, batch.advantages[:, None].expand_as(batch.logp).clone())
    assert torch.equal(per_row[0], per_token[0]) and torch.equal(per_row[1], per_token[1])
    for key, value in per_row[2].items():
        torch.testing.assert_close(value, per_token[2][key], rtol=1e-12, atol=1e-14, msg=key)


@pytest.mark.parametrize("name", ["grpo", "dapo", "dr_grpo", "cispo", "gspo_token"])
def test_at_ratio_one_each_tokens_coefficient_is_its_own_advantage_times_the_aggregation_weight(name):
    """d loss / d log pi_t = -A_t * (the token's aggregation weight) at pi = pi_old: each token reads its own advantage."""
    batch = random_batch(3)
    batch.old_logp = batch.logp.detach().clone()
    adv = torch.randn(batch.logp.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)  # (B, T)
    _, grad, _ = _loss_and_grad(name, batch, adv)
    _, unit_grad, _ = _loss_and_grad(name, batch, torch.ones_like(adv))  # -(aggregation weight) at each token
    torch.testing.assert_close(grad, torch.where(batch.mask, adv, 0.0) * unit_grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", COMPLETION_PRESETS)
def test_a_preset_that_reads_one_advantage_per_completion_refuses_per_token_advantages_in_one_sentence(name):
    batch = random_batch(0)
    adv = batch.advantages[:, None].expand_as(batch.logp)
    with pytest.raises(ValueError, match=rf"objective '{name}' needs one advantage per completion, shape \(B,\): .*got per-token"):
        policy_loss(name, **(batch.kwargs() | {"advantages": adv}))


@pytest.mark.parametrize("name", COMPLETION_PRESETS)
def test_the_optimal_token_baseline_is_refused_when_a_preset_reading_one_advantage_per_completion_is_built(name):
    with pytest.raises(ValueError, match=r"adv_scale='otb' gives one advantage per token, but .*use a token-level ratio"):
        resolve_objective(name, adv_scale="otb")


def test_per_token_advantages_may_hold_anything_at_padding_but_not_at_a_real_token():
    batch = random_batch(5)
    adv = batch.advantages[:, None].expand_as(batch.logp).clone()
    clean, _, _ = _loss_and_grad("grpo", batch, adv)
    adv[~batch.mask] = float("nan")
    padded, _, _ = _loss_and_grad("grpo", batch, adv)
    assert torch.equal(clean, padded)
    adv[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"advantages must be finite .*at indices \[\(0, 0\)\]"):
        policy_loss("grpo", **(batch.kwargs() | {"advantages": adv}))
    with pytest.raises(ValueError, match=r"advantages must have shape \(B,\) = \(12,\), one per completion, or \(B, T\)"):
        policy_loss("grpo", **(batch.kwargs() | {"advantages": adv[:, :3]}))


def _otb_group(lengths: list[int], seed: int):
    """A shared-prefix group (``make_shared_prefix_group``: the first 3 tokens are one event) and its OTB advantages,
    pi_old and sum pi^2 equal across the group at the shared positions, as one context gives them."""
    group = make_shared_prefix_group(torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64), lengths, prefix_len=3, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    pi_sq = 0.2 + 0.5 * torch.rand(group.mask.shape, generator=gen, dtype=torch.float64)  # (G, T)
    pi_sq[:, :3] = pi_sq[:1, :3]
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    adv = optimal_token_baseline(rewards, group.group_ids, group.mask, group.old_logp, pi_sq, eps=0.0)  # (G, T)
    return group, adv


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_otb_under_a_token_mean_cancels_a_shared_token_whatever_the_lengths(seed):
    """Under DAPO's token mean the optimal token baseline's shared-prefix coefficients sum to zero over the group (eq 2)."""
    group, adv = _otb_group([5, 9, 12, 7], seed)
    logp = group.logp()
    loss, _ = policy_loss("dapo", logp=logp, old_logp=group.old_logp, advantages=adv, mask=group.mask, group_ids=group.group_ids)
    (grad,) = torch.autograd.grad(loss, logp)
    assert float(grad[:, :3].sum(0).abs().max()) < 1e-12
    assert float(grad[:, 3:].abs().max()) > 1e-3  # the rest of the group still learns


def test_otb_under_grpos_sequence_mean_does_not_cancel_at_unequal_lengths():
    """GRPO weighs a token by 1 / L_i, so a zero-sum advantage at a shared position leaves a residual when lengths differ."""
    group, adv = _otb_group([5, 9, 12, 7], 0)
    logp = group.logp()
    loss, _ = policy_loss("grpo", logp=logp, old_logp=group.old_logp, advantages=adv, mask=group.mask, group_ids=group.group_ids)
    (grad,) = torch.autograd.grad(loss, logp)
    assert float(grad[:, :3].sum(0).abs().max()) > 1e-4


@pytest.mark.parametrize("name", ["grpo", "dapo", "cispo", "gspo_token", "clip_cov", "stapo"])
def test_the_fused_head_takes_per_token_advantages_as_policy_loss_does(name):
    """The fused LM head passes per-token advantages to the loss core: loss and d hidden equal the reference's."""
    g = torch.Generator().manual_seed(4)
    B, T, H, V = 8, 6, 8, 40
    h = torch.randn(B, T, H, generator=g, dtype=torch.float64)
    w = 0.7 * torch.randn(V, H, generator=g, dtype=torch.float64)
    y = torch.randint(0, V, (B, T), generator=g)
    mask = torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,), generator=g)[:, None]
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    gid = torch.arange(B) // 4
    spec = resolve_objective(name)
    hh = h.clone().requires_grad_()
    lp, ent = naive_token_logprobs(hh, w, y)
    kw = dict(old_logp=lp.detach() + 0.05, advantages=adv, mask=mask, group_ids=gid)
    ref, _ = policy_loss(spec, logp=lp, entropy=ent if spec.needs_entropy else None, **kw)
    (ref_grad,) = torch.autograd.grad(ref, hh)
    hf = h.clone().requires_grad_()
    fused, _ = fused_policy_loss(spec, hidden=hf, lm_head_weight=w, targets=y, chunk_size=5, **kw)
    (fused_grad,) = torch.autograd.grad(fused, hf)
    torch.testing.assert_close(fused, ref.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(fused_grad, ref_grad, rtol=1e-10, atol=1e-12)
