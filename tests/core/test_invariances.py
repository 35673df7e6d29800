"""Invariances of the loss core: batch order, padding content, where groups sit."""

from __future__ import annotations

import pytest
import torch
from batches import random_batch
from hypothesis import given
from hypothesis import strategies as st

from dfpo import OBJECTIVES, policy_loss

NAMES = list(OBJECTIVES)
ORDER_FREE = [n for n in NAMES if OBJECTIVES[n].ipo_beta == 0]
"""Online IPO picks the first of a group's tied best completions as y_w (TRL's tie rule, ``core/loss/preference.py``),
so among ties its loss depends on the rows' order; every other objective is a function of the set of rows."""


def _loss_and_grad(name, batch, logp=None, **kw):
    logp = batch.logp if logp is None else logp
    loss, metrics = policy_loss(name, **batch.kwargs(logp), **kw)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss, grad, metrics


@given(st.sampled_from(ORDER_FREE), st.integers(0, 10_000), st.randoms())
def test_permuting_completions_with_their_group_ids_changes_nothing(name, seed, rnd):
    """The loss is a function of the set of (completion, group) pairs, not of their order."""
    batch = random_batch(seed)
    loss, grad, metrics = _loss_and_grad(name, batch)
    perm = list(range(batch.mask.shape[0]))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    logp = batch.logp.detach()[perm].clone().requires_grad_()
    kw = dict(
        old_logp=batch.old_logp[perm],
        advantages=batch.advantages[perm],
        mask=batch.mask[perm],
        group_ids=batch.group_ids[perm],
        entropy=batch.entropy[perm],
        ref_logp=batch.ref_logp[perm],
    )
    loss_p, metrics_p = policy_loss(name, logp=logp, **kw)
    (grad_p,) = torch.autograd.grad(loss_p, logp)
    torch.testing.assert_close(loss_p, loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad_p, grad[perm], rtol=1e-12, atol=1e-14)
    for key in metrics:
        torch.testing.assert_close(metrics_p[key], metrics[key], rtol=1e-12, atol=1e-14)


@given(st.sampled_from(NAMES), st.integers(0, 10_000), st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e30, -7.0]))
def test_garbage_in_padding_changes_nothing(name, seed, garbage):
    """Padding may hold NaN or inf (samplers produce them): values and gradients ignore it; padding gets zero gradient."""
    batch = random_batch(seed)
    loss, grad, metrics = _loss_and_grad(name, batch)
    pad = ~batch.mask
    dirty = batch.logp.detach().masked_fill(pad, garbage).requires_grad_()
    batch.old_logp = batch.old_logp.masked_fill(pad, garbage)
    batch.entropy = batch.entropy.masked_fill(pad, garbage)
    batch.ref_logp = batch.ref_logp.masked_fill(pad, garbage)
    loss_d, grad_d, metrics_d = _loss_and_grad(name, batch, logp=dirty, beta=0.05)
    loss_c, grad_c, _ = _loss_and_grad(name, random_batch(seed), beta=0.05)
    torch.testing.assert_close(loss_d, loss_c, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad_d, grad_c, rtol=1e-12, atol=1e-14)
    assert bool((grad_d[pad] == 0).all())
    assert all(bool(torch.isfinite(v)) for v in metrics_d.values())


# Token masks, covariance controls, VAPO's NLL and M2PO's bound read statistics of the whole batch (quantiles,
# covariances, the positive tokens' count, the harmful tokens' second moment): left out, as is every objective that
# declares a batch coupling.
GROUP_LOCAL = [
    n
    for n in NAMES
    if OBJECTIVES[n].token_mask in ("none", "opsm") and OBJECTIVES[n].cov_control == "none" and not OBJECTIVES[n].batch_coupled
]


@given(st.sampled_from(GROUP_LOCAL), st.integers(0, 10_000))
def test_one_batch_equals_its_groups_computed_apart(name, seed):
    """The batch loss is the weighted mean of its groups' losses (rows or tokens), wherever groups sit.

    Token masks are left out: their batch-level quantile thresholds couple groups by design.
    """
    batch = random_batch(seed, n_groups=3, group_size=4, shuffle=True)
    spec = OBJECTIVES[name]
    loss, grad, _ = _loss_and_grad(name, batch)
    parts, grads = [], torch.zeros_like(grad)
    weights = []
    for g in batch.group_ids.unique():
        rows = batch.group_ids == g
        logp = batch.logp.detach()[rows].clone().requires_grad_()
        part, _ = policy_loss(
            name,
            logp=logp,
            old_logp=batch.old_logp[rows],
            advantages=batch.advantages[rows],
            mask=batch.mask[rows],
            group_ids=batch.group_ids[rows],
            entropy=batch.entropy[rows],
        )
        w = batch.mask[rows].sum() if spec.aggregation == "token_mean" else rows.sum()  # tokens or rows
        (g_part,) = torch.autograd.grad(part, logp)
        parts.append(part * w)
        grads[rows] = g_part * w
        weights.append(w)
    total = sum(weights)
    torch.testing.assert_close(sum(parts) / total, loss, rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(grads / total, grad, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("name", NAMES)
def test_all_masked_rows_are_ignored_and_never_nan(name):
    """An all-masked row adds nothing: the loss equals the loss without it, gradients finite."""
    batch = random_batch(3, empty_row=True)
    loss, grad, metrics = _loss_and_grad(name, batch)
    keep = batch.mask.sum(-1) > 0
    logp = batch.logp.detach()[keep].clone().requires_grad_()
    kw = dict(
        old_logp=batch.old_logp[keep],
        advantages=batch.advantages[keep],
        mask=batch.mask[keep],
        group_ids=batch.group_ids[keep],
        entropy=batch.entropy[keep],
        ref_logp=batch.ref_logp[keep],
    )
    loss_k, _ = policy_loss(name, logp=logp, **kw)
    if OBJECTIVES[name].aggregation != "constant":  # constant divides by B, a batch constant
        torch.testing.assert_close(loss, loss_k, rtol=1e-12, atol=1e-14)
    assert bool(torch.isfinite(grad).all()) and all(bool(torch.isfinite(v)) for v in metrics.values())


@pytest.mark.parametrize("name", NAMES)
def test_a_batch_with_no_real_token_gives_a_zero_finite_loss(name):
    batch = random_batch(0)
    batch.mask = torch.zeros_like(batch.mask)
    loss, grad, metrics = _loss_and_grad(name, batch)
    assert float(loss) == 0.0 and bool((grad == 0).all())
    assert all(bool(torch.isfinite(v)) for v in metrics.values())
