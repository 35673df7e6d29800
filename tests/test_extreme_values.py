"""The loss core under extreme but finite inputs: a clear ValueError, or a finite loss with finite gradients."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfpo import OBJECTIVES, policy_loss

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


@st.composite
def extreme_batches(draw):
    B = draw(st.integers(0, 6))
    T = draw(st.integers(0, 5))
    dtype = DTYPES[draw(st.sampled_from(sorted(DTYPES)))]
    logp_values = st.one_of(st.floats(-1e30, 0.0), st.sampled_from([0.0, -1e-8, -100.0, -1e4, -1e30]))
    adv_values = st.one_of(st.floats(-1e20, 1e20), st.sampled_from([0.0, 1e20, -1e20, 1e-30]))
    logp = torch.tensor(draw(st.lists(logp_values, min_size=B * T, max_size=B * T)), dtype=torch.float64).reshape(B, T)
    old = torch.tensor(draw(st.lists(logp_values, min_size=B * T, max_size=B * T)), dtype=torch.float64).reshape(B, T)
    mask = torch.tensor(draw(st.lists(st.booleans(), min_size=B * T, max_size=B * T)), dtype=torch.bool).reshape(B, T)
    adv = torch.tensor(draw(st.lists(adv_values, min_size=B, max_size=B)), dtype=torch.float64)
    groups = torch.tensor(draw(st.lists(st.integers(0, 2), min_size=B, max_size=B)), dtype=torch.long)
    return logp.to(dtype), old.to(dtype), mask, adv.to(dtype), groups


@settings(deadline=None)  # the number of examples comes from the profile (ci, fresh, thorough)
@given(batch=extreme_batches(), objective=st.sampled_from(sorted(OBJECTIVES)))
def test_extreme_inputs_give_a_named_error_or_a_finite_loss_and_gradient(batch, objective):
    """No finite input makes the loss or its gradient non-finite: every objective either refuses
    the input with a ValueError that names an argument, or returns finite values."""
    logp, old, mask, adv, groups = batch
    logp = logp.clone().requires_grad_()
    entropy = torch.ones_like(logp)
    ref = old.clone()
    try:
        loss, metrics = policy_loss(
            objective, logp=logp, old_logp=old, advantages=adv, mask=mask, group_ids=groups, entropy=entropy, ref_logp=ref, beta=0.04
        )
    except ValueError as err:
        assert any(name in str(err) for name in ("logp", "old_logp", "advantages", "mask", "group_ids", "entropy", "ref_logp")), str(err)
        return
    assert torch.isfinite(loss).all(), (objective, loss)
    assert all(torch.isfinite(v).all() for v in metrics.values()), {k: v for k, v in metrics.items() if not torch.isfinite(v).all()}
    (grad,) = torch.autograd.grad(loss, logp, allow_unused=True)
    assert grad is None or torch.isfinite(grad).all()


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_an_empty_batch_gives_a_zero_loss(objective):
    logp = torch.zeros(0, 4, requires_grad=True)
    loss, metrics = policy_loss(
        objective,
        logp=logp,
        old_logp=torch.zeros(0, 4),
        advantages=torch.zeros(0),
        mask=torch.zeros(0, 4, dtype=torch.bool),
        group_ids=torch.zeros(0, dtype=torch.long),
        entropy=torch.zeros(0, 4),
    )
    assert float(loss) == 0.0 and all(torch.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_a_far_off_policy_token_is_clamped_and_counted(objective):
    """old_logp = -100 at a real token (ratio e^~100): the log-ratio is bounded at 20 and the token counted."""
    logp = torch.tensor([[-0.5, -1.0], [-0.7, -0.2]], requires_grad=True)
    old = torch.tensor([[-100.0, -1.0], [-0.7, -0.3]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    loss, metrics = policy_loss(
        objective,
        logp=logp,
        old_logp=old,
        advantages=torch.tensor([1.0, -1.0]),
        mask=mask,
        group_ids=torch.zeros(2, dtype=torch.long),
        entropy=torch.ones(2, 2),
    )
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert float(metrics["ratio/clamped_frac"]) == pytest.approx(0.25)


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean", "constant", "seq_mean_token_sum"])
@pytest.mark.parametrize("shape", [(0, 0), (0, 5), (3, 0)])
def test_an_empty_batch_has_a_zero_loss_in_every_aggregation(aggregation, shape):
    """B = 0 or T = 0: nothing to average, the loss is 0 (the constant mode's B * T_max divisor is 0 there)."""
    logp = torch.zeros(shape, dtype=torch.bfloat16, requires_grad=True)
    kw = dict(
        old_logp=torch.zeros(shape, dtype=torch.bfloat16),
        advantages=torch.zeros(shape[0], dtype=torch.bfloat16),
        mask=torch.zeros(shape, dtype=torch.bool),
        group_ids=torch.zeros(shape[0], dtype=torch.long),
    )
    loss, _ = policy_loss("grpo", logp=logp, **kw, aggregation=aggregation)
    assert float(loss) == 0.0
