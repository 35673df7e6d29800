"""The KL term's estimators (k3, k2, k1) and TRL's ratio-weighted (bias-corrected) KL: values by hand, and what each
adds at a shared token (the loop reference and the TRL cross-check cover loss and gradient on ragged masks)."""

from __future__ import annotations

import math

import pytest
import torch

from dfpo import policy_loss
from dfpo.core.loss.cancellation import make_shared_prefix_group
from dfpo.core.loss.kl import kl_estimate


def test_estimators_by_hand():
    """d = log pi - log pi_ref = 0.5: k3 = e^-0.5 + 0.5 - 1, k2 = 0.125, k1 = 0.5."""
    logp, ref = torch.tensor([[-1.0]], dtype=torch.float64), torch.tensor([[-1.5]], dtype=torch.float64)
    assert float(kl_estimate(logp, ref, "k3")) == pytest.approx(math.exp(-0.5) - 0.5)
    assert float(kl_estimate(logp, ref, "k2")) == pytest.approx(0.125)
    assert float(kl_estimate(logp, ref, "k1")) == pytest.approx(0.5)


def _shared_kl_gradient(estimator: str, at_reference: bool, weight: str = "none") -> float:
    """The shared token's gradient under dapo (whose policy term cancels it, r* = 1) plus beta = 0.1 times the KL, with
    pi_ref equal to pi at the shared token (``at_reference``) or 0.3 below it, and 0.3 off at the own tokens."""
    group = make_shared_prefix_group(torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64), [5, 9, 12, 7], seed=3)
    logp = group.logp()
    prefix = group.shared_logp.numel()
    ref = logp.detach() - 0.3
    if at_reference:
        ref[:, :prefix] = logp.detach()[:, :prefix]
    loss, _ = policy_loss(
        "dapo", logp=logp, old_logp=group.old_logp, advantages=group.advantages, mask=group.mask, group_ids=group.group_ids,
        ref_logp=ref, beta=0.1, kl_estimator=estimator, kl_ratio_weight=weight,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, group.shared_logp)
    return float(grad.abs().max())


@pytest.mark.parametrize("weight", ["none", "token"])
@pytest.mark.parametrize("estimator", ["k3", "k2"])
def test_k3_and_k2_add_nothing_at_a_shared_token_where_pi_is_pi_ref(estimator, weight):
    """dk/dd = 0 at d = 0 for k3 and k2: the KL term leaves a cancelled shared token cancelled there (a token ratio
    weight's own gradient multiplies that token's k = 0), and does not elsewhere."""
    assert _shared_kl_gradient(estimator, True, weight) < 1e-12
    assert _shared_kl_gradient(estimator, False, weight) > 1e-4


@pytest.mark.parametrize("estimator", ["k3", "k2"])
def test_a_sequence_ratio_weight_carries_the_completion_kl_into_the_shared_token(estimator):
    """TRL's bias correction at sequence level: the weight exp(mean_t log r_t) depends on the shared token's log-prob,
    so its gradient there is (1 / L_i) times the weight times the completion's whole KL, one value per copy: the
    shared token gets a gradient even where pi = pi_ref at it."""
    assert _shared_kl_gradient(estimator, True, "sequence") > 1e-4


def test_k1_adds_a_gradient_at_every_shared_token():
    """dk1/dd = 1: the k1 term pushes every copy of the shared token down by beta times its aggregation weight, even
    where pi = pi_ref."""
    assert _shared_kl_gradient("k1", True) > 1e-3
