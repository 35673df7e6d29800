"""The loss core under extreme but finite inputs: a clear ValueError, or a finite loss with finite gradients.

Half-precision inputs (float16, bfloat16) are computed in float32 inside ``policy_loss`` (as TRL and verl upcast
log-probs): the loss and metrics come back in float32 and the gradient flows back to the half-precision input
through autograd, rounded to its dtype.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfpo import OBJECTIVES, policy_loss
from dfpo.core.loss.core import ADVANTAGE_BOUND

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
ARGUMENTS = ("logp", "old_logp", "advantages", "mask", "group_ids", "entropy", "ref_logp")


@st.composite
def extreme_batches(draw):
    """Two regimes: wide (log-probs anywhere in [-1e30, 0], advantages up to +-1e20 and past it, inf once cast to float16,
    which must be refused) and moderate (log-probs down to -100, advantages up to +-6e4); old_logp drawn on its
    own or as logp minus log-ratios up to +-90."""
    B = draw(st.integers(0, 6))
    T = draw(st.integers(0, 5))
    dtype = DTYPES[draw(st.sampled_from(sorted(DTYPES)))]
    moderate = st.one_of(st.floats(-100.0, 0.0), st.sampled_from([0.0, -1e-8, -5.0, -90.0, -95.0, -100.0]))
    if draw(st.booleans()):  # wide: log-probs anywhere a float64 holds (most such batches are refused)
        logp_values = st.one_of(st.floats(-1e30, 0.0), moderate, st.sampled_from([-1e4, -1e30]))
        adv_values = st.one_of(st.floats(-1e20, 1e20), st.sampled_from([0.0, 1e20, -1e20, 1e-30, 3e38, -1e30]))
    else:  # moderate: real log-probs down to -100, advantages up to float16's range
        logp_values = moderate
        adv_values = st.one_of(st.floats(-10.0, 10.0), st.sampled_from([0.0, 1e-30, 6e4, -6e4]))
    n = B * T
    logp = torch.tensor(draw(st.lists(logp_values, min_size=n, max_size=n)), dtype=torch.float64).reshape(B, T)
    if draw(st.booleans()):  # old_logp drawn on its own
        old = torch.tensor(draw(st.lists(logp_values, min_size=n, max_size=n)), dtype=torch.float64).reshape(B, T)
    else:  # old_logp = logp - log-ratio, log-ratios up to +-90
        log_ratio = st.one_of(st.floats(-90.0, 90.0), st.sampled_from([-90.0, 90.0, -20.5, 20.5, 11.2, -11.2]))
        old = logp - torch.tensor(draw(st.lists(log_ratio, min_size=n, max_size=n)), dtype=torch.float64).reshape(B, T)
    mask = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=torch.bool).reshape(B, T)
    adv = torch.tensor(draw(st.lists(adv_values, min_size=B, max_size=B)), dtype=torch.float64)
    groups = torch.tensor(draw(st.lists(st.integers(0, 2), min_size=B, max_size=B)), dtype=torch.long)
    return logp.to(dtype), old.to(dtype), mask, adv.to(dtype), groups


def _loss_and_grad(objective, logp, old, mask, adv, groups):
    logp = logp.detach().clone().requires_grad_()
    loss, metrics = policy_loss(
        objective,
        logp=logp,
        old_logp=old,
        advantages=adv,
        mask=mask,
        group_ids=groups,
        entropy=torch.ones_like(old),
        ref_logp=old.clone(),
        beta=0.04,
    )
    (grad,) = torch.autograd.grad(loss, logp, allow_unused=True)
    return loss, metrics, torch.zeros_like(logp) if grad is None else grad


@settings(deadline=None)  # the number of examples comes from the profile (ci, fresh, thorough)
@given(batch=extreme_batches(), objective=st.sampled_from(sorted(OBJECTIVES)))
def test_extreme_inputs_give_a_named_error_or_a_finite_loss_and_gradient(batch, objective):
    """No finite input, in any float dtype, makes the loss, a metric or a gradient non-finite: every objective
    refuses the input with a ValueError naming an argument (a float16 gradient too large for float16 is refused in
    backward), or returns finite values in at least float32, the gradient being the float32 gradient rounded."""
    logp, old, mask, adv, groups = batch
    try:
        loss, metrics, grad = _loss_and_grad(objective, logp, old, mask, adv, groups)
    except ValueError as err:
        assert any(name in str(err) for name in ARGUMENTS), str(err)
        return
    compute = torch.promote_types(logp.dtype, torch.float32)
    assert loss.dtype == compute and all(v.dtype == compute for v in metrics.values()), (loss.dtype, logp.dtype)
    assert torch.isfinite(loss).all(), (objective, loss)
    assert all(torch.isfinite(v).all() for v in metrics.values()), {k: v for k, v in metrics.items() if not torch.isfinite(v).all()}
    assert torch.isfinite(grad).all(), (objective, grad)
    if logp.dtype in (torch.float16, torch.bfloat16):  # the same values in float32: the same loss, the gradient rounded
        loss32, _, grad32 = _loss_and_grad(objective, logp.float(), old.float(), mask, adv.float(), groups)
        assert torch.equal(loss, loss32), (loss, loss32)
        assert torch.equal(grad, grad32.to(logp.dtype))


def test_a_float16_gradient_float16_cannot_hold_is_refused_naming_logp():
    """A = -1 on a token ratio of e^15 (inside the +-20 bound) under PPO clipping: d loss / d logp is about 1.6e6,
    past float16's 65504. The loss itself is finite (float32); backward refuses instead of returning inf."""
    logp = torch.tensor([[-0.5, -1.0]], dtype=torch.float16, requires_grad=True)
    loss, _ = policy_loss(
        "grpo",
        logp=logp,
        old_logp=torch.tensor([[-15.5, -1.0]], dtype=torch.float16),
        advantages=torch.tensor([-1.0], dtype=torch.float16),
        mask=torch.ones(1, 2, dtype=torch.bool),
        group_ids=torch.zeros(1, dtype=torch.long),
    )
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    with pytest.raises(ValueError, match="gradient with respect to logp does not fit"):
        torch.autograd.grad(loss, logp)
    logp32 = logp.detach().float().requires_grad_()  # the same call in float32 is fine
    loss32, _ = policy_loss(
        "grpo",
        logp=logp32,
        old_logp=torch.tensor([[-15.5, -1.0]]),
        advantages=torch.tensor([-1.0]),
        mask=torch.ones(1, 2, dtype=torch.bool),
        group_ids=torch.zeros(1, dtype=torch.long),
    )
    (grad,) = torch.autograd.grad(loss32, logp32)
    assert float(grad.abs().max()) > 65504 and torch.isfinite(grad).all()


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
        ref_logp=torch.zeros(0, 4),
    )
    assert float(loss.detach()) == 0.0 and all(torch.isfinite(v) for v in metrics.values())


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
        ref_logp=old,
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
    assert float(loss.detach()) == 0.0


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
@pytest.mark.parametrize("big", [3e38, -1e30, 1.5e20, float("inf"), float("nan")])
def test_advantages_past_the_bound_are_refused_naming_them(objective, big):
    """|A| > 1e20 overflows a float32 loss within a few tokens (3e38 gave inf or NaN for every objective): refused
    before any work with a ValueError that names the advantages, the value and the bound."""
    logp = torch.tensor([[-0.5, -1.0], [-0.7, -0.2], [-0.3, -0.4], [-0.9, -0.1]], requires_grad=True)
    with pytest.raises(ValueError, match=r"advantages must be finite and at most 1e\+20.*indices \[0\]"):
        policy_loss(
            objective,
            logp=logp,
            old_logp=logp.detach() - 0.01,
            advantages=torch.tensor([big, -1.0, 0.5, 0.5]),
            mask=torch.ones(4, 2, dtype=torch.bool),
            group_ids=torch.tensor([0, 0, 1, 1]),
            entropy=torch.ones(4, 2),
            ref_logp=logp.detach() - 0.02,
        )


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_advantages_at_the_bound_give_a_finite_loss_metrics_and_gradient(objective, dtype):
    """One advantage of 1e20 beside -1 (dfpo_orth_pos gave -inf there), and a group at +-1e20: all finite."""
    logp = torch.tensor([[-0.5, -1.0], [-0.7, -0.2], [-0.3, -0.4], [-0.9, -0.1]], dtype=dtype)
    adv = torch.tensor([ADVANTAGE_BOUND, -1.0, ADVANTAGE_BOUND, -ADVANTAGE_BOUND], dtype=dtype)
    old = logp + torch.tensor([[1e-4, -2e-4], [3e-4, 0.0], [-1e-4, 2e-4], [0.0, 1e-4]], dtype=dtype)
    loss, metrics, grad = _loss_and_grad(objective, logp, old, torch.ones(4, 2, dtype=torch.bool), adv, torch.tensor([0, 0, 1, 1]))
    assert torch.isfinite(loss), (objective, loss)
    assert all(torch.isfinite(v).all() for v in metrics.values()), {k: v for k, v in metrics.items() if not torch.isfinite(v).all()}
    assert torch.isfinite(grad).all(), (objective, grad)


def test_an_infinite_float16_advantage_is_refused_though_the_bound_is_past_float16s_range():
    """1e20 is inf in float16: the bound check must not let inf <= inf pass."""
    logp = torch.zeros(2, 2, dtype=torch.float16, requires_grad=True)
    with pytest.raises(ValueError, match="advantages must be finite"):
        policy_loss(
            "grpo",
            logp=logp,
            old_logp=torch.zeros(2, 2, dtype=torch.float16),
            advantages=torch.tensor([float("inf"), -1.0], dtype=torch.float16),
            mask=torch.ones(2, 2, dtype=torch.bool),
            group_ids=torch.zeros(2, dtype=torch.long),
        )
