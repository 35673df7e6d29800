"""Vectorised loss core == slow per-sequence loop reference, for every objective, value and gradient."""

from __future__ import annotations

import pytest
import torch

from batches import random_batch
from dfpo import OBJECTIVES, policy_loss, resolve_objective
from reference import reference_loss

VARIANTS = [(name, {}) for name in OBJECTIVES] + [
    ("dfpo_min", {"length_aware": True}),
    ("dfpo_orth", {"length_aware": True}),
    ("dfpo_orth_pos", {"length_aware": True}),
    ("dfpo_orth_tr", {"length_aware": True}),
    ("dfpo_min", {"stopgrad": "ratio"}),
    ("dfpo_orth_pos", {"stopgrad": "ratio", "eps_low": 0.2, "eps_high": 0.2}),
    ("dfpo_orth_tr", {"aggregation": "token_mean"}),
    ("gspo", {"aggregation": "token_mean"}),
    ("grpo", {"aggregation": "seq_mean_token_sum"}),
    ("grpo", {"beta": 0.04}),
    ("dapo", {"token_mask": "top_entropy", "mask_renormalise": False}),
    ("stapo", {"stapo_tau_p": 0.5, "stapo_q": 0.5}),  # thresholds that mask real tokens here
    ("grpo", {"clip": "none"}),
    ("dr_grpo", {"max_completion_length": 16}),
]


@pytest.mark.parametrize("name,overrides", VARIANTS, ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for n, o in VARIANTS])
@pytest.mark.parametrize("seed", [0, 1])
def test_vectorised_equals_loop_reference(name, overrides, seed):
    batch = random_batch(seed, empty_row=(seed == 1))
    loss, metrics = policy_loss(name, **batch.kwargs(), **overrides)
    (grad,) = torch.autograd.grad(loss, batch.logp)

    logp_ref = batch.logp.detach().clone().requires_grad_()
    ref = reference_loss(resolve_objective(name, **overrides), **batch.kwargs(logp_ref))
    (grad_ref,) = torch.autograd.grad(ref, logp_ref)

    torch.testing.assert_close(loss, ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-9, atol=1e-12)
    assert all(torch.isfinite(v) for v in metrics.values())


def test_stapo_thresholds_in_variants_really_mask_tokens():
    """The STAPO variant above must exercise the mask, or its reference check proves nothing."""
    batch = random_batch(0)
    _, metrics = policy_loss("stapo", **batch.kwargs(), stapo_tau_p=0.5, stapo_q=0.5)
    assert 0 < metrics["mask/frac"] < 1
