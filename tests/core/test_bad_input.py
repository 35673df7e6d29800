"""Bad input fails before any work with a ValueError naming the argument; degenerate groups stay finite."""

from __future__ import annotations

import pytest
import torch
from batches import random_batch

from dfpo import group_advantages, policy_loss, resolve_objective


def _kw(batch, **changes):
    kw = batch.kwargs()
    kw.update(changes)
    return kw


@pytest.mark.parametrize(
    "field,value",
    [
        ("old_logp", torch.zeros(3, 3)),
        ("mask", torch.ones(12, 6, dtype=torch.bool)),
        ("entropy", torch.zeros(12)),
        ("ref_logp", torch.zeros(12, 8)),
        ("advantages", torch.zeros(11)),
        ("group_ids", torch.zeros(12, 1, dtype=torch.long)),
    ],
)
def test_mismatched_shapes_name_the_argument(field, value):
    with pytest.raises(ValueError, match=field):
        policy_loss("grpo", **_kw(random_batch(0), **{field: value}))


@pytest.mark.parametrize("field", ["logp", "old_logp", "entropy", "ref_logp"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_values_at_real_positions_are_refused(field, bad):
    batch = random_batch(0)
    kw = batch.kwargs()
    x = kw[field].detach().clone()
    x[batch.mask.nonzero()[0].tolist()[0], 0] = bad
    kw[field] = x
    with pytest.raises(ValueError, match=field):
        policy_loss("grpo", **kw)


def test_non_finite_advantages_are_refused():
    batch = random_batch(0)
    adv = batch.advantages.clone()
    adv[2] = float("nan")
    with pytest.raises(ValueError, match="advantages"):
        policy_loss("grpo", **_kw(batch, advantages=adv))


def test_float_group_ids_are_refused():
    batch = random_batch(0)
    with pytest.raises(ValueError, match="group_ids"):
        policy_loss("grpo", **_kw(batch, group_ids=batch.group_ids.double()))


def test_mask_with_other_values_is_refused():
    batch = random_batch(0)
    with pytest.raises(ValueError, match="mask"):
        policy_loss("grpo", **_kw(batch, mask=batch.mask.double() * 2))


def test_unknown_objective_names_the_value():
    with pytest.raises(ValueError, match="'ppo2'"):
        policy_loss("ppo2", **random_batch(0).kwargs())


def test_unknown_override_names_the_key():
    with pytest.raises(ValueError, match="epsilon"):
        policy_loss("grpo", **random_batch(0).kwargs(), epsilon=0.2)


@pytest.mark.parametrize(
    "override,value",
    [
        ("eps_low", -0.1),
        ("eps_high", -0.2),
        ("eps_low", 1.5),
        ("eps_high", float("nan")),
        ("beta", -1.0),
        ("tr_floor", 0.0),
        ("stapo_tau_p", 0.0),
        ("stapo_q", 1.5),
        ("top_entropy_frac", 0.0),
        ("aggregation", "mean"),
        ("transform", "max"),
        ("clip", "dual"),
        ("stopgrad", "all"),
        ("ratio_level", "tok"),
        ("length_aware", "yes"),
        ("max_completion_length", 0),
    ],
)
def test_bad_override_values_name_the_override(override, value):
    with pytest.raises(ValueError, match=override):
        resolve_objective("dfpo_min", **{override: value})


def test_transform_on_token_level_is_refused():
    with pytest.raises(ValueError, match="ratio_level"):
        resolve_objective("grpo", transform="min")


def test_token_mask_without_entropy_is_refused():
    kw = random_batch(0).kwargs()
    kw["entropy"] = None
    with pytest.raises(ValueError, match="entropy"):
        policy_loss("stapo", **kw)


def test_beta_without_reference_is_refused():
    kw = random_batch(0).kwargs()
    kw["ref_logp"] = None
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss("grpo", **kw, beta=0.1)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_equal_rewards_and_singleton_groups_get_zero_advantage(scale):
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.3, 0.7, 0.5])
    ids = torch.tensor([0, 0, 0, 1, 2, 2])
    adv = group_advantages(rewards, ids, scale=scale, eps=0.0)
    assert torch.equal(adv[:4], torch.zeros(4))  # equal-reward group and the group of one
    assert bool(torch.isfinite(adv).all()) and float(adv[4]) > 0 > float(adv[5])


def test_degenerate_groups_give_finite_zero_loss():
    batch = random_batch(1)
    zero_adv = group_advantages(torch.ones(batch.advantages.shape[0], dtype=torch.float64), batch.group_ids)
    for name in ("grpo", "gspo", "dfpo_min", "dfpo_orth_pos", "dfpo_orth_tr", "stapo"):
        loss, metrics = policy_loss(name, **_kw(batch, advantages=zero_adv))
        (grad,) = torch.autograd.grad(loss, batch.logp)
        assert float(loss) == 0.0 and bool((grad == 0).all())
        assert all(bool(torch.isfinite(v)) for v in metrics.values())


@pytest.mark.parametrize("kw,match", [({"scale": "std"}, "scale"), ({"eps": -1e-4}, "eps"), ({"eps": float("nan")}, "eps")])
def test_group_advantages_bad_options(kw, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(torch.ones(4), torch.zeros(4, dtype=torch.long), **kw)


def test_group_advantages_bad_rewards():
    with pytest.raises(ValueError, match="rewards"):
        group_advantages(torch.tensor([1.0, float("nan")]), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="group_ids"):
        group_advantages(torch.ones(3), torch.zeros(2, dtype=torch.long))
