"""Issue 30's peer losses: TOPR (``topr``), Kimi k1.5 (``kimi15``), Tinker's DRO (``dro``) and VAPO's NLL on positive
samples (``vapo_nll``).

Each is checked against a loop written from the peer's own code (tests/core/reference.py: ROLL's
``_compute_topr_loss`` / ``_compute_kimi15_loss`` and ``agg_loss``, Tinker's ``dro`` loss, cosmos-rl's positive NLL) on ragged masks with
holes and empty rows, value and gradient; with a property where an invariant exists; and for its shared-token
cancellation verdict (docs/cancellation.md; ledger claims ``proximal-penalty-cancel``, ``positive-nll-cancel``).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import (
    cosmos_positive_nll,
    roll_agg_seq_mean_token_mean,
    roll_kimi15_token_loss,
    roll_topr_token_loss,
    tinker_dro_datum_loss,
)

from dfpo import OBJECTIVES, group_advantages, policy_loss
from dfpo.core.loss.cancellation import make_shared_prefix_group, shared_token_gradient

TOL = dict(rtol=1e-10, atol=1e-12)


def ragged_batch(seed: int, *, n_groups: int = 3, group_size: int = 4, T: int = 7, all_correct_group: bool = False):
    """float64 log-probs with ratios on both sides of 1, a mask with holes (a multi-turn completion) and one empty row,
    0/1 rewards with both outcomes in every group (all correct in the last one when ``all_correct_group``)."""
    gen = torch.Generator().manual_seed(seed)
    B = n_groups * group_size
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    mask[1, 0] = False  # a hole in a row
    mask[2] = False  # an empty row
    logp = -0.05 - 3.0 * torch.rand(B, T, generator=gen, dtype=torch.float64)
    old_logp = logp + 0.4 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    group_ids = torch.arange(n_groups).repeat_interleave(group_size)
    rewards = torch.randint(0, 2, (B,), generator=gen).to(torch.float64)
    rewards[::group_size], rewards[1::group_size] = 1.0, 0.0
    if all_correct_group:
        rewards[-group_size:] = 1.0
    advantages = group_advantages(rewards, group_ids)
    return logp.requires_grad_(), old_logp, mask, group_ids, rewards, advantages


def core_loss(objective: str, logp, old_logp, mask, group_ids, advantages, **overrides):
    loss, metrics = policy_loss(objective, logp=logp, old_logp=old_logp, advantages=advantages, mask=mask, group_ids=group_ids, **overrides)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss, grad, metrics


def roll_loss(token_loss, logp, mask) -> torch.Tensor:
    """ROLL's seq-mean-token-mean of a per-token loss given as a function of (i, t)."""
    rows = [[t for t in range(mask.shape[1]) if bool(mask[i, t])] for i in range(mask.shape[0])]
    per_token = {(i, t): token_loss(i, t) for i, ts in enumerate(rows) for t in ts}
    return roll_agg_seq_mean_token_mean(per_token, rows)


@pytest.mark.parametrize("all_correct_group", [False, True], ids=["both-outcomes", "an-all-correct-group"])
@pytest.mark.parametrize("seed", range(4))
def test_topr_equals_rolls_loop_on_ragged_masks(seed, all_correct_group):
    """topr == ROLL's _compute_topr_loss (split by score > 0) + seq-mean-token-mean, value and gradient. With 0/1 rewards
    the A > 0 split and ROLL's score > 0 split differ only on A = 0 rows, which add nothing: an all-correct group too."""
    logp, old_logp, mask, group_ids, rewards, adv = ragged_batch(seed, all_correct_group=all_correct_group)
    loss, grad, _ = core_loss("topr", logp, old_logp, mask, group_ids, adv)
    lp = logp.detach().clone().requires_grad_()
    ratio = torch.exp(logp.detach() - old_logp)
    ref = roll_loss(lambda i, t: roll_topr_token_loss(float(ratio[i, t]), float(adv[i]), lp[i, t], float(rewards[i])), lp, mask)
    (grad_ref,) = torch.autograd.grad(ref, lp)
    torch.testing.assert_close(loss, ref, **TOL)
    torch.testing.assert_close(grad, grad_ref, **TOL)


@pytest.mark.parametrize("seed", range(4))
def test_kimi15_equals_rolls_loop_on_ragged_masks(seed):
    """kimi15 == ROLL's _compute_kimi15_loss (tau = 0.1) + seq-mean-token-mean, value and gradient."""
    logp, old_logp, mask, group_ids, _, adv = ragged_batch(seed)
    loss, grad, metrics = core_loss("kimi15", logp, old_logp, mask, group_ids, adv)
    lp = logp.detach().clone().requires_grad_()
    ref = roll_loss(lambda i, t: roll_kimi15_token_loss(float(adv[i]), lp[i, t], float(old_logp[i, t])), lp, mask)
    (grad_ref,) = torch.autograd.grad(ref, lp)
    torch.testing.assert_close(loss, ref, **TOL)
    torch.testing.assert_close(grad, grad_ref, **TOL)
    assert float(metrics["proximal/penalty"]) > 0


@pytest.mark.parametrize("seed", range(4))
def test_dro_equals_tinkers_summed_loss_over_the_completions(seed):
    """dro == (Tinker's loss_fn='dro' summed over the data, one datum a completion, beta = 0.05) / non-empty completions."""
    logp, old_logp, mask, group_ids, _, adv = ragged_batch(seed)
    loss, grad, _ = core_loss("dro", logp, old_logp, mask, group_ids, adv)
    lp = logp.detach().clone().requires_grad_()
    data = [[t for t in range(mask.shape[1]) if bool(mask[i, t])] for i in range(mask.shape[0])]
    total = sum(
        tinker_dro_datum_loss([lp[i, t] for t in ts], [float(old_logp[i, t]) for t in ts], [float(adv[i])] * len(ts), beta=0.05)
        for i, ts in enumerate(data)
        if ts
    )
    ref = total / sum(1 for ts in data if ts)
    (grad_ref,) = torch.autograd.grad(ref, lp)
    torch.testing.assert_close(loss, ref, **TOL)
    torch.testing.assert_close(grad, grad_ref, **TOL)


@pytest.mark.parametrize("seed", range(4))
def test_vapo_nll_is_dapo_plus_mu_times_cosmos_positive_nll(seed):
    """vapo_nll == dapo + 0.1 * (cosmos-rl's -logp[positive tokens].mean(), positive = reward > 0), value and gradient."""
    logp, old_logp, mask, group_ids, rewards, adv = ragged_batch(seed)
    loss, grad, metrics = core_loss("vapo_nll", logp, old_logp, mask, group_ids, adv)
    lp = logp.detach().clone().requires_grad_()
    dapo, _ = policy_loss("dapo", logp=lp, old_logp=old_logp, advantages=adv, mask=mask, group_ids=group_ids)
    positive = [lp[i, t] for i in range(mask.shape[0]) for t in range(mask.shape[1]) if bool(mask[i, t]) and rewards[i] > 0]
    ref = dapo + 0.1 * cosmos_positive_nll(positive, lp)
    (grad_ref,) = torch.autograd.grad(ref, lp)
    torch.testing.assert_close(loss, ref, **TOL)
    torch.testing.assert_close(grad, grad_ref, **TOL)
    torch.testing.assert_close(metrics["nll/positive"], -sum(positive).detach() / len(positive), **TOL)


def test_vapo_nll_leaves_out_an_all_correct_group_that_cosmos_imitates():
    """The stated departure: a group whose completions are all correct has A = 0 and gets no NLL here."""
    logp, old_logp, mask, group_ids, rewards, adv = ragged_batch(0, all_correct_group=True)
    loss, _, _ = core_loss("vapo_nll", logp, old_logp, mask, group_ids, adv)
    dapo, _ = policy_loss("dapo", logp=logp, old_logp=old_logp, advantages=adv, mask=mask, group_ids=group_ids)
    real = [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if bool(mask[i, t])]
    by_advantage = cosmos_positive_nll([logp[i, t] for i, t in real if adv[i] > 0], logp)
    by_reward = cosmos_positive_nll([logp[i, t] for i, t in real if rewards[i] > 0], logp)
    torch.testing.assert_close(loss, dapo + 0.1 * by_advantage, **TOL)
    assert abs(float((by_reward - by_advantage).detach())) > 1e-3


def test_nll_with_no_positive_sample_adds_nothing():
    """A batch with no positive advantage: the NLL is 0 (cosmos-rl skips it), never NaN."""
    logp, old_logp, mask, group_ids, _, adv = ragged_batch(1)
    loss, grad, metrics = core_loss("vapo_nll", logp, old_logp, mask, group_ids, -adv.abs())
    dapo, _ = policy_loss("dapo", logp=logp, old_logp=old_logp, advantages=-adv.abs(), mask=mask, group_ids=group_ids)
    torch.testing.assert_close(loss, dapo, **TOL)
    assert float(metrics["nll/positive"]) == 0.0 and torch.isfinite(grad).all()


# --- properties ------------------------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), aggregation=st.sampled_from(["seq_mean_token_mean", "token_mean", "seq_mean_token_sum"]))
def test_topr_kimi15_and_dro_are_gpg_on_policy(seed, aggregation):
    """On the first inner step (pi = pi_old) TOPR's taper and the quadratic penalty vanish: each is GPG's gradient."""
    logp, _, mask, group_ids, _, adv = ragged_batch(seed)
    on_policy = logp.detach().clone()
    _, grad_gpg, _ = core_loss("gpg", logp, on_policy, mask, group_ids, adv, aggregation=aggregation)
    for objective in ("topr", "kimi15", "dro"):
        _, grad, _ = core_loss(objective, logp, on_policy, mask, group_ids, adv, aggregation=aggregation)
        torch.testing.assert_close(grad, grad_gpg, **TOL)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_topr_gradient_never_exceeds_gpgs_token_by_token(seed):
    """TOPR's weight is 1 or a ratio truncated to [0, 1]: each token's gradient is GPG's times a factor in [0, 1]."""
    logp, old_logp, mask, group_ids, _, adv = ragged_batch(seed)
    _, grad_gpg, _ = core_loss("gpg", logp, old_logp, mask, group_ids, adv, aggregation="seq_mean_token_mean")
    _, grad, _ = core_loss("topr", logp, old_logp, mask, group_ids, adv)
    assert bool((grad.abs() <= grad_gpg.abs() + 1e-15).all())
    assert bool((grad * grad_gpg >= 0).all())


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), tau=st.floats(0.0, 2.0))
def test_kimi15_penalty_is_nonnegative_and_quadratic_in_tau(seed, tau):
    """The proximal penalty adds tau times one non-negative number: loss(tau) - loss(0) = tau * (loss(1) - loss(0)) >= 0."""
    logp, old_logp, mask, group_ids, _, adv = ragged_batch(seed)
    at = {c: core_loss("kimi15", logp, old_logp, mask, group_ids, adv, proximal_coef=c)[0] for c in (0.0, 1.0, tau)}
    torch.testing.assert_close(at[tau] - at[0.0], tau * (at[1.0] - at[0.0]), rtol=1e-9, atol=1e-12)
    assert float((at[1.0] - at[0.0]).detach()) >= 0


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), mu=st.floats(0.0, 2.0))
def test_the_nll_adds_mu_times_a_nonnegative_mean_whatever_the_base(seed, mu):
    """VAPO's NLL adds mu times one non-negative number (the positive tokens' mean -log pi) to any preset's loss."""
    logp, old_logp, mask, group_ids, _, adv = ragged_batch(seed)
    for base in ("grpo", "gspo"):
        at = {c: core_loss(base, logp, old_logp, mask, group_ids, adv, nll_coef=c)[0].detach() for c in (0.0, 1.0, mu)}
        torch.testing.assert_close(at[mu] - at[0.0], mu * (at[1.0] - at[0.0]), rtol=1e-9, atol=1e-12)
        assert float(at[1.0] - at[0.0]) >= 0


def test_topr_flags_the_taper_on_negative_tokens_above_ratio_one():
    """clip/frac_high is the share of kept tokens with A <= 0 and r > 1 (ROLL's topr_negative_upper_clipfrac's event)."""
    logp, old_logp, mask, group_ids, _, adv = ragged_batch(2)
    _, _, metrics = core_loss("topr", logp, old_logp, mask, group_ids, adv)
    ratio = torch.exp(logp.detach() - old_logp)
    tapered = mask & (adv <= 0)[:, None] & (ratio > 1)
    torch.testing.assert_close(metrics["clip/frac_high"], (tapered.sum() / mask.sum()).to(metrics["clip/frac_high"].dtype), **TOL)
    assert float(metrics["clip/frac_low"]) == 0.0 and bool(tapered.any())


# --- cancellation verdicts -------------------------------------------------------------------------------------------

REWARDS = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0])


def shared_group(shared_log_ratio: float, lengths=(6, 6, 6, 6, 6)):
    return make_shared_prefix_group(REWARDS, list(lengths), shared_log_ratio=shared_log_ratio, seed=3)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_sum"])
def test_topr_cancels_above_ratio_one_and_fails_below(aggregation):
    """At r* >= 1 every copy's weight is 1 (as GPG); at r* < 1 the negative copies are tapered to r* and the positive
    ones are not: residual (1 - r*) times the negative copies' share."""
    assert shared_token_gradient("topr", shared_group(0.5), aggregation=aggregation).abs().max() < 1e-12
    assert shared_token_gradient("topr", shared_group(0.0), aggregation=aggregation).abs().max() < 1e-12
    below = shared_token_gradient("topr", shared_group(-0.5), aggregation=aggregation)
    group = shared_group(-0.5)
    n = float(group.mask.sum()) if aggregation == "token_mean" else float(group.mask.shape[0])
    negative = group.advantages[group.advantages < 0].sum()
    expected = (1 - math.exp(-0.5)) * float(negative) / n  # d loss / d log pi*: -(sum_i w_i A_i) / n with w = 1 or r*
    torch.testing.assert_close(below, torch.full_like(below, expected), rtol=1e-9, atol=1e-12)


def test_kimi15_residual_is_tau_log_r_times_the_copies_weights():
    """Kimi's penalty at a shared token: tau * log r* * (sum of the copies' aggregation weights), zero only at r* = 1."""
    tau, lengths = OBJECTIVES["kimi15"].proximal_coef, (5, 6, 7, 8, 9)
    for log_r in (0.0, 0.5, -0.3):
        grad = shared_token_gradient("kimi15", shared_group(log_r, lengths), aggregation="token_mean")
        expected = tau * log_r * len(lengths) / sum(lengths)  # the policy term cancels under token_mean
        torch.testing.assert_close(grad, torch.full_like(grad, expected), rtol=1e-9, atol=1e-12)


def test_dro_cancels_at_any_lengths_on_policy_and_fails_once_the_policy_moves():
    """DRO sums each completion's tokens (length-free): at r* = 1 the shared token cancels whatever the lengths; at
    r* != 1 its penalty leaves beta * log r* * G / G_nonempty (each copy weighs 1 / (number of completions))."""
    lengths = (5, 6, 7, 8, 9)
    beta = OBJECTIVES["dro"].proximal_coef
    assert shared_token_gradient("dro", shared_group(0.0, lengths)).abs().max() < 1e-12
    grad = shared_token_gradient("dro", shared_group(0.5, lengths))
    torch.testing.assert_close(grad, torch.full_like(grad, beta * 0.5), rtol=1e-9, atol=1e-12)


def test_vapo_nll_residual_is_minus_mu_times_positive_copies_over_positive_tokens():
    """VAPO's NLL at a shared token: -mu * G_+ / N_+ on top of DAPO's zero (r* = 1), whatever the lengths."""
    lengths = (5, 6, 7, 8, 9)
    grad = shared_token_gradient("vapo_nll", shared_group(0.0, lengths))
    positive = [L for L, r in zip(lengths, REWARDS) if r > 0]
    expected = -OBJECTIVES["vapo_nll"].nll_coef * len(positive) / sum(positive)
    torch.testing.assert_close(grad, torch.full_like(grad, expected), rtol=1e-9, atol=1e-12)


def test_the_peer_losses_state_their_components():
    """The presets are built from their components (and nothing else changes): a guard on the presets' data."""
    assert (OBJECTIVES["topr"].clip, OBJECTIVES["topr"].ratio_level) == ("topr", "token")
    assert (OBJECTIVES["kimi15"].clip, OBJECTIVES["kimi15"].proximal_coef) == ("pg", 0.1)
    assert (OBJECTIVES["dro"].clip, OBJECTIVES["dro"].proximal_coef, OBJECTIVES["dro"].aggregation) == ("pg", 0.05, "seq_mean_token_sum")
    assert (OBJECTIVES["vapo_nll"].nll_coef, OBJECTIVES["vapo_nll"].eps_high, OBJECTIVES["vapo_nll"].aggregation) == (
        0.1,
        0.28,
        "token_mean",
    )
    assert OBJECTIVES["vapo_nll"].batch_coupled and not OBJECTIVES["topr"].batch_coupled and not OBJECTIVES["kimi15"].batch_coupled
    with pytest.raises(ValueError, match="token-level objective"):
        OBJECTIVES["topr"].__class__(**{**OBJECTIVES["topr"].components(), "name": "x", "description": "x", "ratio_level": "sequence"})
