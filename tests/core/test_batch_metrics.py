"""policy_loss(batch_metrics=False): the same loss and gradient, without the whole-batch metrics it does not read."""

from __future__ import annotations

import pytest
import torch
from batches import random_batch

from dfpo import OBJECTIVES, policy_loss

BATCH_KEYS = {
    "loss/policy",
    "clip/frac_low",
    "clip/frac_high",
    "ratio/mean",
    "ratio/max",
    "weights/asym",
    "weights/spread",
    "ratio/clamped_frac",
}


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_leaving_out_the_batch_metrics_changes_no_bit_of_the_loss_or_its_gradient(objective):
    """For every preset: loss and d loss / d logp are bit-identical; only the whole-batch metric keys are gone."""
    batch = random_batch(3)
    full_loss, full_metrics = policy_loss(objective, **batch.kwargs())
    (full_grad,) = torch.autograd.grad(full_loss, batch.logp)
    lean_loss, lean_metrics = policy_loss(objective, **batch.kwargs(), batch_metrics=False)
    (lean_grad,) = torch.autograd.grad(lean_loss, batch.logp)
    assert torch.equal(full_loss, lean_loss) and torch.equal(full_grad, lean_grad)
    assert set(full_metrics) - set(lean_metrics) == BATCH_KEYS
    assert all(torch.equal(full_metrics[k], v) for k, v in lean_metrics.items())
