"""Group-relative advantages (eq 43): zero-sum per group, order-free, the std TRL uses."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from dfpo import group_advantages

rewards_lists = st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=1, max_size=24)


@given(rewards_lists, st.integers(1, 5), st.sampled_from(["group", "batch", "none", "rloo"]), st.randoms())
def test_advantages_sum_to_zero_in_every_group(rewards, n_groups, scale, rnd):
    """sum_{i in group} A_i = 0 for every group, wherever its completions sit in the batch."""
    ids = torch.tensor([rnd.randrange(n_groups) * 11 for _ in rewards])
    adv = group_advantages(torch.tensor(rewards, dtype=torch.float64), ids, scale=scale)
    for g in ids.unique():
        assert abs(float(adv[ids == g].sum())) < 1e-12
    assert bool(torch.isfinite(adv).all())


@given(rewards_lists, st.integers(1, 4))
def test_group_scale_is_mean_centred_over_unbiased_std_plus_eps(rewards, n_groups):
    ids = torch.arange(len(rewards)) % n_groups
    r = torch.tensor(rewards, dtype=torch.float64)
    adv = group_advantages(r, ids, eps=1e-4)
    for g in ids.unique():
        x = r[ids == g]
        expected = torch.zeros_like(x) if len(x) < 2 or bool((x == x[0]).all()) else (x - x.mean()) / (x.std() + 1e-4)
        torch.testing.assert_close(adv[ids == g], expected, rtol=1e-12, atol=1e-12)


@given(rewards_lists, st.randoms())
def test_permuting_the_batch_permutes_the_advantages(rewards, rnd):
    ids = torch.arange(len(rewards)) % 3
    r = torch.tensor(rewards, dtype=torch.float64)
    perm = list(range(len(rewards)))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    torch.testing.assert_close(group_advantages(r[perm], ids[perm]), group_advantages(r, ids)[perm], rtol=0, atol=1e-15)


def test_rloo_is_the_leave_one_out_baseline_by_hand():
    """RLOO: A_i = R_i - mean of the other completions of the group (TRL RLOOTrainer's baseline)."""
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    grouped = r.view(2, 4)
    trl_baseline = ((grouped.sum(1, keepdim=True) - grouped) / 3).view(-1)  # TRL rloo_trainer's lines
    expected = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 4 / 3, 0.0, 0.0, -4 / 3], dtype=torch.float64)
    torch.testing.assert_close(group_advantages(r, ids, scale="rloo"), expected)
    torch.testing.assert_close(r - trl_baseline, expected)


def test_reinforce_pp_whitens_over_the_batch_by_hand():
    """REINFORCE++ (batch baseline): (R - mean_batch) / (std_batch + eps), torch's unbiased std."""
    r = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    ids = torch.tensor([0, 0, 1, 1])
    std = (sum((x - 0.25) ** 2 for x in [1.0, 0.0, 0.0, 0.0]) / 3) ** 0.5
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25], dtype=torch.float64) / (std + 1e-4)
    torch.testing.assert_close(group_advantages(r, ids, scale="reinforce_pp"), expected)
    assert float(group_advantages(r, ids, scale="reinforce_pp")[2:].sum()) < 0  # group 1 does not sum to zero


@given(st.lists(st.sampled_from([0.0, 1.0]), min_size=4, max_size=4), st.lists(st.sampled_from([0.0, 1.0]), min_size=4, max_size=4))
def test_reinforce_pp_breaks_zero_sum_exactly_when_group_means_differ(first, second):
    """With a batch baseline, sum_{i in g} A_i = 0 iff the group's mean reward equals the batch's."""
    r = torch.tensor(first + second, dtype=torch.float64)
    ids = torch.tensor([0] * 4 + [1] * 4)
    adv = group_advantages(r, ids, scale="reinforce_pp")
    same_mean = sum(first) == sum(second)
    assert (abs(float(adv[:4].sum())) < 1e-12) == (same_mean or len(set(first + second)) == 1)


def test_a_shared_token_keeps_a_gradient_under_reinforce_pp_but_not_rloo():
    """Cancellation (eq 2) needs sum_i A_i = 0 in the group: RLOO keeps it, REINFORCE++'s batch baseline does not."""
    import dataclasses

    from dfpo.core.loss.cancellation import make_shared_prefix_group, shared_token_gradient

    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)  # group mean 0.25
    group = make_shared_prefix_group(rewards, [6, 6, 6, 6], seed=3)
    batch_rewards = torch.cat([rewards, torch.ones(4, dtype=torch.float64)])  # a second group of all-correct answers
    ids = torch.tensor([0] * 4 + [1] * 4)
    for scale, cancels in (("rloo", True), ("reinforce_pp", False)):
        adv = group_advantages(batch_rewards, ids, scale=scale)[:4]
        residual = shared_token_gradient("grpo", dataclasses.replace(group, advantages=adv)).abs().max()
        assert (float(residual) < 1e-12) == cancels, scale


# --- the length-weighted estimators: OPO and REINFORCE++ with a group baseline (verl) ----------------------------------

lengths_lists = st.lists(st.integers(1, 12), min_size=24, max_size=24)


@given(rewards_lists, lengths_lists, st.integers(1, 4), st.sampled_from(["opo", "reinforce_pp_baseline"]))
def test_length_weighted_estimators_equal_the_loop_reference(rewards, lengths, n_groups, scale):
    """Against loops written from verl's compute_opo_outcome_advantage and compute_reinforce_plus_plus_baseline_outcome_advantage."""
    from reference import reference_opo, reference_reinforce_pp_baseline

    ids = [i % n_groups for i in range(len(rewards))]
    L = lengths[: len(rewards)]
    adv = group_advantages(torch.tensor(rewards, dtype=torch.float64), torch.tensor(ids), scale=scale, lengths=torch.tensor(L))
    ref = (reference_opo if scale == "opo" else reference_reinforce_pp_baseline)(rewards, ids, L)
    torch.testing.assert_close(adv, torch.tensor(ref, dtype=torch.float64), rtol=1e-9, atol=1e-9)


@given(rewards_lists, lengths_lists, st.integers(1, 4))
def test_opo_advantages_sum_to_zero_weighted_by_length(rewards, lengths, n_groups):
    """OPO's baseline makes sum_i L_i A_i = 0 in every group (not sum_i A_i)."""
    ids = torch.arange(len(rewards)) % n_groups
    L = torch.tensor(lengths[: len(rewards)], dtype=torch.float64)
    adv = group_advantages(torch.tensor(rewards, dtype=torch.float64), ids, scale="opo", lengths=L)
    for g in ids.unique():
        assert abs(float((L * adv)[ids == g].sum())) < 1e-12


@given(rewards_lists, st.integers(1, 12), st.integers(1, 4), st.sampled_from(["opo", "reinforce_pp_baseline"]))
def test_length_weighted_estimators_sum_to_zero_at_equal_lengths(rewards, length, n_groups, scale):
    """At one length for every completion both are zero-sum in every group again (OPO's baseline is the mean; the token
    mean of group-centred rewards is 0)."""
    ids = torch.arange(len(rewards)) % n_groups
    L = torch.full((len(rewards),), length)
    adv = group_advantages(torch.tensor(rewards, dtype=torch.float64), ids, scale=scale, lengths=L)
    for g in ids.unique():
        assert abs(float(adv[ids == g].sum())) < 1e-9


def test_length_weighted_estimators_need_lengths():
    import pytest

    with pytest.raises(ValueError, match="scale='opo' weighs completions by their lengths: pass lengths of shape \\(4,\\), got none"):
        group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.zeros(4, dtype=torch.long), scale="opo")


def _shared_residual_under(scale: str, lengths: list[int]) -> float:
    from dfpo import policy_loss
    from dfpo.core.loss.cancellation import make_shared_prefix_group

    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    group = make_shared_prefix_group(rewards, lengths, seed=1)
    adv = group_advantages(rewards, group.group_ids, scale=scale, lengths=torch.tensor(lengths))
    loss, _ = policy_loss("dapo", logp=group.logp(), old_logp=group.old_logp, advantages=adv, mask=group.mask, group_ids=group.group_ids)
    (grad,) = torch.autograd.grad(loss, group.shared_logp)
    return float(grad.abs().max())


def test_length_weighted_estimators_keep_cancellation_only_at_equal_lengths():
    """dapo cancels a shared token whenever sum_i A_i = 0: both estimators keep that at equal lengths and break it at
    unequal ones (the cancellation verdict of the new advantages)."""
    for scale in ("opo", "reinforce_pp_baseline"):
        assert _shared_residual_under(scale, [8, 8, 8, 8]) < 1e-12
        assert _shared_residual_under(scale, [5, 9, 12, 7]) > 1e-4


@given(rewards_lists, st.integers(1, 4))
def test_grpo_passk_equals_the_loop_reference(rewards, n_groups):
    """Against a loop written from verl's compute_grpo_passk_outcome_advantage (topk of 2 per group)."""
    from reference import reference_grpo_passk

    ids = [i % n_groups for i in range(len(rewards))]
    adv = group_advantages(torch.tensor(rewards, dtype=torch.float64), torch.tensor(ids), scale="grpo_passk", eps=1e-6)
    torch.testing.assert_close(adv, torch.tensor(reference_grpo_passk(rewards, ids, 1e-6), dtype=torch.float64), rtol=1e-9, atol=1e-12)


def test_grpo_passk_breaks_cancellation_where_the_best_is_unique():
    """The group's advantages sum to the best completion's: a shared token keeps a gradient under dapo (at any lengths)."""
    from dfpo import policy_loss
    from dfpo.core.loss.cancellation import make_shared_prefix_group

    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0], dtype=torch.float64)
    group = make_shared_prefix_group(rewards, [8, 8, 8, 8], seed=1)
    adv = group_advantages(rewards, group.group_ids, scale="grpo_passk")
    assert float(adv.sum()) == float(adv[0]) > 0
    loss, _ = policy_loss("dapo", logp=group.logp(), old_logp=group.old_logp, advantages=adv, mask=group.mask, group_ids=group.group_ids)
    (grad,) = torch.autograd.grad(loss, group.shared_logp)
    assert float(grad.abs().max()) > 1e-4


# --- issue 30: GDPO's decoupled normalisation (TRL) and ReMax's greedy baseline (verl) --------------------------------

reward_rows = st.lists(
    st.tuples(st.sampled_from([0.0, 0.5, 1.0]), st.sampled_from([0.0, 1.0]), st.sampled_from([-1.0, 0.0, 2.0])), min_size=1, max_size=24
)


@given(reward_rows, st.integers(1, 4), st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=3, max_size=3))
def test_gdpo_equals_the_loop_reference(rows, n_groups, weights):
    """Against a loop written from TRL 1.16's normalize_then_sum block (per function per group, weighted sum, batch)."""
    from reference import reference_gdpo

    ids = [i % n_groups for i in range(len(rows))]
    r = torch.tensor(rows, dtype=torch.float64)  # (B, 3)
    adv = group_advantages(r, torch.tensor(ids), scale="gdpo", reward_weights=torch.tensor(weights, dtype=torch.float64))
    ref = reference_gdpo([list(x) for x in rows], ids, weights, 1e-4)
    torch.testing.assert_close(adv, torch.tensor(ref, dtype=torch.float64), rtol=1e-9, atol=1e-9)


@given(reward_rows, st.integers(1, 5), st.randoms())
def test_gdpo_advantages_sum_to_zero_in_every_group(rows, n_groups, rnd):
    """Every reward function's group-normalised values sum to zero in each group, so GDPO's advantages do."""
    ids = torch.tensor([rnd.randrange(n_groups) * 7 for _ in rows])
    adv = group_advantages(torch.tensor(rows, dtype=torch.float64), ids, scale="gdpo")
    for g in ids.unique():
        assert abs(float(adv[ids == g].sum())) < 1e-9
    assert bool(torch.isfinite(adv).all())


def test_gdpo_keeps_each_reward_functions_signal_apart_by_hand():
    """GDPO by hand on (correct, format) columns weighted (1, 0.5): each column (r - mean) / (std + eps) in the group,
    the weighted sum, then (s - mean s) / (std s + eps) over the batch."""
    r = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    ids = torch.zeros(4, dtype=torch.long)
    summed = group_advantages(r @ torch.tensor([1.0, 0.5], dtype=torch.float64), ids)
    gdpo = group_advantages(r, ids, scale="gdpo", reward_weights=torch.tensor([1.0, 0.5]))
    z = 0.5 / (torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64).std() + 1e-4)  # each column's (r - mean) / (std + eps)
    s = torch.tensor([z - 0.5 * z, -z + 0.5 * z, z + 0.5 * z, -z - 0.5 * z], dtype=torch.float64)  # weighted sums
    torch.testing.assert_close(gdpo, (s - s.mean()) / (s.std() + 1e-4))
    assert float(gdpo[0]) > 0 > float(gdpo[1]) and float(summed[0]) > 0 > float(summed[1])


def test_gdpo_and_the_one_reward_estimators_refuse_the_other_shape():
    import pytest

    ids = torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"scale='gdpo' normalises each reward function separately: pass a \(B, K\) matrix"):
        group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), ids, scale="gdpo")
    with pytest.raises(ValueError, match=r"scale='group' takes one reward per completion, shape \(B,\), got \(4, 2\)"):
        group_advantages(torch.ones(4, 2), ids)
    with pytest.raises(ValueError, match=r"reward_weights must be 2 finite numbers"):
        group_advantages(torch.ones(4, 2), ids, scale="gdpo", reward_weights=torch.tensor([1.0, float("nan")]))


@given(st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0]), st.sampled_from([0.0, 1.0]), st.integers(1, 9)), min_size=1, max_size=16))
def test_remax_equals_the_loop_reference_at_every_token(rows):
    """Against a loop written from verl's compute_remax_outcome_advantage: with an outcome reward the reward-to-go is R at
    every token, so verl's per-token advantage is dfpo's per-completion R - R_greedy at each of its tokens."""
    from reference import reference_remax

    rewards, greedy, lengths = ([row[j] for row in rows] for j in range(3))
    adv = group_advantages(
        torch.tensor(rewards, dtype=torch.float64), torch.arange(len(rows)) // 2, scale="remax", baselines=torch.tensor(greedy)
    )
    for a, tokens in zip(adv.tolist(), reference_remax(rewards, greedy, lengths)):
        assert all(abs(a - t) < 1e-12 for t in tokens)


def test_remax_needs_the_greedy_rewards():
    import pytest

    with pytest.raises(ValueError, match=r"scale='remax' subtracts the reward of each prompt's greedy completion: pass baselines"):
        group_advantages(torch.tensor([1.0, 0.0]), torch.zeros(2, dtype=torch.long), scale="remax")


@given(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=2, max_size=8), st.sampled_from([0.0, 0.5, 1.0]))
def test_remax_sums_to_zero_exactly_when_the_greedy_reward_is_the_group_mean(rewards, greedy):
    """sum_i (R_i - b) = G (mean R - b): ReMax's group is zero-sum iff the greedy completion scores the group's mean."""
    r = torch.tensor(rewards, dtype=torch.float64)
    adv = group_advantages(r, torch.zeros(len(rewards), dtype=torch.long), scale="remax", baselines=torch.full_like(r, greedy))
    assert (abs(float(adv.sum())) < 1e-12) == (abs(float(r.mean()) - greedy) < 1e-12)


def test_gdpo_keeps_cancellation_and_remax_breaks_it():
    """The cancellation verdicts: dapo cancels a shared token under GDPO (zero-sum groups, any lengths); under ReMax it
    keeps a gradient when the greedy completion does not score the group's mean."""
    from dfpo import policy_loss
    from dfpo.core.loss.cancellation import make_shared_prefix_group

    correct = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    group = make_shared_prefix_group(correct, [5, 9, 12, 7], seed=1)
    columns = torch.stack([correct, torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)], -1)  # (4, 2) correct, format
    residual = {}
    for scale, kw in (("gdpo", {}), ("remax", {"baselines": torch.zeros(4, dtype=torch.float64)})):
        adv = group_advantages(columns if scale == "gdpo" else correct, group.group_ids, scale=scale, **kw)
        loss, _ = policy_loss(
            "dapo", logp=group.logp(), old_logp=group.old_logp, advantages=adv, mask=group.mask, group_ids=group.group_ids
        )
        (grad,) = torch.autograd.grad(loss, group.shared_logp)
        residual[scale] = float(grad.abs().max())
    assert residual["gdpo"] < 1e-12 and residual["remax"] > 1e-4


def test_the_estimator_table_states_each_verdict_the_tests_above_prove():
    """docs/loss.md's generated table (estimator_rows) says what the tests of this file show, estimator by estimator:
    zero-sum at equal lengths for all but reinforce_pp, grpo_passk and remax; at unequal lengths also not for the two
    length-weighted ones."""
    from dfpo.core.loss.advantages import ESTIMATOR_SOURCES, estimator_rows

    rows = {row["adv_scale"]: row for row in estimator_rows()}
    never = {"reinforce_pp", "grpo_passk", "remax"}
    assert set(rows) == set(ESTIMATOR_SOURCES)
    otb = rows.pop("otb")  # per position: zero-sum on a shared prefix only (test_otb_cancels_on_a_shared_prefix_and_not_past_it)
    assert otb["zero-sum, equal lengths"] == otb["zero-sum, unequal lengths"] == "at shared-prefix positions"
    for scale, row in rows.items():
        assert row["zero-sum, equal lengths"] == ("no" if scale in never else "yes"), scale
        assert row["zero-sum, unequal lengths"] == ("no" if scale in never | {"opo", "reinforce_pp_baseline"} else "yes"), scale


# --- issue 30: the optimal token baseline (verl), one advantage per token ---------------------------------------------


@given(
    st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0]), st.integers(1, 7)), min_size=1, max_size=10),
    st.integers(1, 3),
    st.booleans(),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_otb_equals_the_loop_reference(rows, n_groups, with_is_weights, zero_tail, seed):
    """Against a loop written from verl's compute_optimal_token_baseline_advantage (ragged lengths, groups of any size,
    with and without rollout IS weights and handle_zero_tail)."""
    from reference import reference_otb

    from dfpo.core.loss.advantages import optimal_token_baseline

    gen = torch.Generator().manual_seed(seed)
    rewards, lengths = [r for r, _ in rows], [L for _, L in rows]
    B, T = len(rows), max(lengths)
    ids = [i % n_groups for i in range(B)]
    old = -3 * torch.rand(B, T, generator=gen, dtype=torch.float64)  # (B, T)
    pi_sq = torch.rand(B, T, generator=gen, dtype=torch.float64)  # (B, T)
    isw = 0.5 + torch.rand(B, T, generator=gen, dtype=torch.float64) if with_is_weights else None
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]  # (B, T)
    got = optimal_token_baseline(
        torch.tensor(rewards, dtype=torch.float64), torch.tensor(ids), mask, old, pi_sq, is_weights=isw, handle_zero_tail=zero_tail
    )
    ref = reference_otb(rewards, ids, lengths, old.tolist(), pi_sq.tolist(), None if isw is None else isw.tolist(), 1e-8, zero_tail)
    torch.testing.assert_close(got, torch.tensor(ref, dtype=torch.float64), rtol=1e-9, atol=1e-9)


def test_sum_pi_squared_is_the_softmaxs_squared_mass_by_hand():
    from dfpo.core.loss.advantages import sum_pi_squared

    logits = torch.tensor([[[0.0, 1.0, -2.0], [30.0, 30.0, -50.0]]], dtype=torch.float64)  # (1, 2, 3)
    expected = (torch.softmax(logits, -1) ** 2).sum(-1)  # (1, 2)
    torch.testing.assert_close(sum_pi_squared(logits), expected)
    assert abs(float(sum_pi_squared(logits)[0, 1]) - 0.5) < 1e-12  # two equal logits far above the third


def test_otb_is_refused_where_one_advantage_per_completion_is_taken():
    import pytest

    with pytest.raises(ValueError, match=r"scale='otb' gives one advantage per token .*call optimal_token_baseline"):
        group_advantages(torch.tensor([1.0, 0.0]), torch.zeros(2, dtype=torch.long), scale="otb")


def test_otb_cancels_on_a_shared_prefix_and_not_past_it():
    """The cancellation verdict: on a shared prefix every completion has the same pi_old and sum pi^2, so the same
    realized energy W_t and B_t is the group's mean: the advantages at a shared position sum to zero (to eps = 1e-8 in
    the denominator), and a token-level loss's gradient at the shared token (token mean, ratio 1: -sum_i A_t^i / N)
    vanishes; past the prefix the energies differ and the sums do not vanish."""
    from dfpo.core.loss.advantages import optimal_token_baseline

    gen = torch.Generator().manual_seed(3)
    lengths, prefix = [5, 9, 12, 7], 3
    mask = torch.arange(12)[None, :] < torch.tensor(lengths)[:, None]  # (4, 12)
    old = -0.1 - torch.rand(4, 12, generator=gen, dtype=torch.float64)  # (4, 12)
    pi_sq = 0.2 + 0.5 * torch.rand(4, 12, generator=gen, dtype=torch.float64)
    old[:, :prefix], pi_sq[:, :prefix] = old[:1, :prefix], pi_sq[:1, :prefix]  # one shared prefix
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    adv = optimal_token_baseline(rewards, torch.zeros(4, dtype=torch.long), mask, old, pi_sq)  # (4, 12)
    shared_grad = -adv[:, :prefix].sum(0) / mask.sum()  # (prefix,) d loss / d log pi(shared token), token mean at ratio 1
    assert float(shared_grad.abs().max()) < 1e-9
    assert float(adv[:, prefix:5].sum(0).abs().max()) > 1e-3  # every completion alive, different energies
