"""Group-relative advantages (eq 43): zero-sum per group, order-free, the std TRL uses."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from dfpo import group_advantages

rewards_lists = st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=1, max_size=24)


@given(rewards_lists, st.integers(1, 5), st.sampled_from(["group", "batch", "none"]), st.randoms())
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
