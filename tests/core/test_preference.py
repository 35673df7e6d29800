"""Online IPO on each group (``online_ipo``, dfpo.core.loss.preference): TRL's online DPO ipo loss between each group's
best and worst completion.

Checked against a loop written from TRL's ``OnlineDPOTrainer.training_step`` (tests/core/reference.py
``trl_online_ipo_loss``) on ragged masks with holes, an empty row, tied rewards and an all-equal group, value and
gradient to 1e-10 in float64 (TRL's loss is inline in the training step, so it cannot be called on tensors); with
Hypothesis properties of the pair rule; and for its shared-token cancellation verdict.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import trl_online_ipo_loss

from dfpo import OBJECTIVES, group_advantages, policy_loss
from dfpo.core.loss import resolve_objective
from dfpo.core.loss.cancellation import group_breakdown, make_shared_prefix_group, shared_token_gradient

TOL = dict(rtol=1e-10, atol=1e-12)


def ragged_batch(seed: int, *, n_groups: int = 4, group_size: int = 4, T: int = 7):
    """float64 log-probs, a mask with a hole and an empty row, graded rewards with a tie at the top of group 0 and at the
    bottom of group 1, and an all-equal last group."""
    gen = torch.Generator().manual_seed(seed)
    B = n_groups * group_size
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    mask[1, 0] = False  # a hole in a row
    mask[6] = False  # an empty row
    logp = -0.05 - 3.0 * torch.rand(B, T, generator=gen, dtype=torch.float64)
    old_logp = logp + 0.4 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    ref_logp = logp + 0.3 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    group_ids = torch.arange(n_groups).repeat_interleave(group_size)
    rewards = torch.randint(0, 4, (B,), generator=gen).to(torch.float64)
    rewards[0], rewards[2], rewards[1], rewards[3] = 5.0, 5.0, 0.0, 1.0  # tie at the top of group 0
    rewards[4], rewards[7], rewards[5] = -1.0, -1.0, 2.0  # tie at the bottom of group 1
    rewards[-group_size:] = 2.0  # all equal: no pair
    return logp.requires_grad_(), old_logp, ref_logp, mask, group_ids, rewards


def core(objective, logp, old_logp, ref_logp, mask, group_ids, advantages, **overrides):
    loss, metrics = policy_loss(
        objective, logp=logp, old_logp=old_logp, advantages=advantages, mask=mask, group_ids=group_ids, ref_logp=ref_logp, **overrides
    )
    (grad,) = torch.autograd.grad(loss, logp)
    return loss, grad, metrics


@pytest.mark.parametrize("seed", range(6))
def test_online_ipo_equals_trls_loop_on_ragged_masks(seed):
    """online_ipo == TRL's ipo branch on each group's (first best, last worst) pair, value and gradient."""
    logp, old_logp, ref_logp, mask, group_ids, rewards = ragged_batch(seed)
    loss, grad, metrics = core("online_ipo", logp, old_logp, ref_logp, mask, group_ids, group_advantages(rewards, group_ids))
    expected = trl_online_ipo_loss(logp, ref_logp, mask, rewards.tolist(), group_ids.tolist(), beta=0.1)
    (expected_grad,) = torch.autograd.grad(expected, logp)
    torch.testing.assert_close(loss, expected.detach(), **TOL)
    torch.testing.assert_close(grad, expected_grad, **TOL)
    assert float(metrics["ipo/pair_frac"]) == 0.75  # the all-equal group gives no pair
    assert float(metrics["loss/policy"]) == 0.0  # the pairwise loss replaces the policy term


def test_ties_pick_the_first_best_and_the_last_worst_row():
    """Group 0's best rows are 0 and 2 (y_w = 0), group 1's worst are 4 and 7 (y_l = 7): only those rows and each group's
    other end get a gradient, +c on y_w's tokens and -c on y_l's."""
    logp, old_logp, ref_logp, mask, group_ids, rewards = ragged_batch(0)
    _, grad, _ = core("online_ipo", logp, old_logp, ref_logp, mask, group_ids, group_advantages(rewards, group_ids))
    moved = sorted({int(i) for i in torch.nonzero(grad.abs().sum(-1)).flatten()})
    assert moved[:2] == [0, 1] and 2 not in moved
    assert 7 in moved and 4 not in moved and 5 in moved
    for w, lose in ((0, 1), (5, 7)):
        c = grad[w][mask[w]]
        assert torch.allclose(c, c[0].expand_as(c)) and torch.allclose(grad[lose][mask[lose]], -c[0].expand_as(grad[lose][mask[lose]]))


def test_the_policy_term_settings_leave_the_ipo_loss_unchanged():
    """The IPO loss reads log pi and log pi_ref only: another clip, ratio level, aggregation or pi_old changes nothing."""
    logp, old_logp, ref_logp, mask, group_ids, rewards = ragged_batch(1)
    adv = group_advantages(rewards, group_ids)
    base, base_grad, _ = core("online_ipo", logp, old_logp, ref_logp, mask, group_ids, adv)
    for overrides in ({"clip": "ppo"}, {"aggregation": "token_mean"}, {"ratio_level": "sequence", "clip": "ppo"}):
        loss, grad, _ = core("online_ipo", logp, old_logp + 0.7, ref_logp, mask, group_ids, adv, **overrides)
        torch.testing.assert_close(loss, base, **TOL)
        torch.testing.assert_close(grad, base_grad, **TOL)


@given(seed=st.integers(0, 2**16), group_size=st.integers(2, 6), n_groups=st.integers(1, 4), levels=st.integers(1, 3))
@settings(max_examples=40, deadline=None)
def test_only_y_w_and_y_l_of_a_group_get_a_gradient_and_theirs_sum_to_zero(seed, group_size, n_groups, levels):
    """In every group, the gradient is nonzero at most on two rows (none when its advantages are all equal) and their
    token gradients sum to zero: +c at each of y_w's tokens, -c at each of y_l's."""
    gen = torch.Generator().manual_seed(seed)
    B, T = n_groups * group_size, 5
    mask = torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,), generator=gen)[:, None]
    logp = (-0.1 - 2.0 * torch.rand(B, T, generator=gen, dtype=torch.float64)).requires_grad_()
    ref_logp = logp.detach() + 0.2 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    group_ids = torch.arange(n_groups).repeat_interleave(group_size)
    rewards = torch.randint(0, levels, (B,), generator=gen).to(torch.float64)
    adv = group_advantages(rewards, group_ids)
    _, grad, _ = core("online_ipo", logp, logp.detach(), ref_logp, mask, group_ids, adv)
    for g in range(n_groups):
        rows = grad[g * group_size : (g + 1) * group_size]
        moved = int((rows.abs().sum(-1) > 0).sum())
        if bool((rewards[g * group_size : (g + 1) * group_size] == rewards[g * group_size]).all()):
            assert moved == 0
        else:
            assert moved <= 2
            real = mask[g * group_size : (g + 1) * group_size]
            per_token = rows[real]
            assert len({round(float(v), 9) for v in per_token[per_token != 0].abs()}) <= 1  # one |c|
            signs = [set(torch.sign(row[m]).tolist()) for row, m in zip(rows, real) if bool((row != 0).any())]
            assert all(len(s) == 1 for s in signs) and sorted(s.pop() for s in signs) in ([], [-1.0, 1.0])


@given(
    seed=st.integers(0, 2**16), lengths=st.lists(st.integers(4, 9), min_size=2, max_size=6), shared_log_ratio=st.sampled_from([0.0, 0.5])
)
@settings(max_examples=30, deadline=None)
def test_a_token_shared_by_the_pair_cancels_and_the_other_copies_get_nothing(seed, lengths, shared_log_ratio):
    """A token shared by the whole group: y_w's copy gets +c, y_l's -c, every other copy 0, so the residual is 0 at any
    lengths and ratios."""
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (len(lengths),), generator=gen).to(torch.float64)
    group = make_shared_prefix_group(rewards, lengths, shared_log_ratio=shared_log_ratio, seed=seed)
    assert float(shared_token_gradient("online_ipo", group).abs().max()) == 0.0
    coef = group_breakdown("online_ipo", group).coefficient  # (G,) each copy's gradient
    if bool((rewards == rewards[0]).all()):
        assert bool((coef == 0).all())
        return
    w = int(torch.nonzero(rewards == rewards.max())[0])
    l_ = int(torch.nonzero(rewards == rewards.min())[-1])
    assert float(coef[w]) == -float(coef[l_]) != 0.0
    assert all(float(coef[i]) == 0.0 for i in range(len(lengths)) if i not in (w, l_))


def test_online_ipo_needs_the_reference_and_refuses_what_acts_on_the_policy_term():
    logp, old_logp, ref_logp, mask, group_ids, rewards = ragged_batch(2)
    with pytest.raises(ValueError, match=r"ref_logp is required for ipo_beta=0.1"):
        policy_loss("online_ipo", logp=logp, old_logp=old_logp, advantages=rewards, mask=mask, group_ids=group_ids)
    for overrides in ({"token_mask": "stapo"}, {"rollout_correction": "token_truncate"}, {"cov_control": "clip_cov"}):
        (name,) = overrides
        with pytest.raises(ValueError, match=rf"ipo_beta=0.1 replaces the per-token policy term .* set {name}='none' or ipo_beta=0"):
            resolve_objective("online_ipo", **overrides)


def test_online_ipo_states_its_components():
    spec = OBJECTIVES["online_ipo"]
    assert (spec.ipo_beta, spec.clip) == (0.1, "none")
    assert spec.needs_ref_logp and spec.batch_coupled
    assert "OnlineDPOConfig.beta = 0.1" in spec.source("ipo_beta")
    assert all(OBJECTIVES[name].ipo_beta == 0.0 for name in OBJECTIVES if name != "online_ipo")
